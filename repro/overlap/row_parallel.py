"""Row-parallel linear whose all-reduce overlaps its own GEMM, chunk by chunk (T3, forward FC-2 and OP sublayers).

The plain layer (Megatron-LM sec. 3, ``Z = g(sum_i Y_i B_i^T)``) computes the whole partial product and then
all-reduces it, so the link idles during the GEMM and the cores idle during the all-reduce. T3 (Pati et al.,
ASPLOS'24, sec. 3-4) cuts the producer GEMM into stages and starts the collective of each finished stage while the
next one computes. Here the flattened ``[tokens, in/tp]`` input is cut into row blocks (``chunking.row_chunks``);
each block's partial product is written into its rows of one output buffer and all-reduced asynchronously
(``async_op=True``) while the next block multiplies. The sum is the same sum, chunk by chunk, so the result equals
the plain layer's and the bytes sent are the same (only the number of calls grows to ``num_chunks``).

Backward is g's: identity on the gradient, then the local ``dX = dZ B_i`` and ``dB_i = dZ^T Y_i``: no
communication, so nothing to overlap.
"""

from __future__ import annotations

import torch

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.overlap.chunking import check_num_chunks, row_chunks
from repro.overlap.twin import twin_of
from repro.tensor_parallel import RowParallelLinear, scatter_to_tensor_parallel


def wait_all(handles) -> None:
    """Wait for every asynchronous collective (``None`` handles come from groups of one)."""
    for handle in handles:
        if handle is not None:
            handle.wait()


class _ChunkedMatmulAllReduce(torch.autograd.Function):
    """``all_reduce(x @ W^T)`` computed as ``num_chunks`` row blocks, each block's all-reduce in flight while the
    next block is multiplied."""

    @staticmethod
    def forward(ctx, x, weight, group: CommGroup, num_chunks: int):
        ctx.group = group
        ctx.save_for_backward(x, weight)
        rows = x.reshape(-1, x.shape[-1])  # [T, in/tp]
        out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)  # [T, out]
        handles = []
        for block in row_chunks(rows.shape[0], num_chunks):
            torch.matmul(rows[block], weight.t(), out=out[block])  # this chunk's partial product
            handles.append(comm.all_reduce(out[block], group, async_op=True))  # T3: hand it to the link now
        wait_all(handles)
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])  # [T, out]; g's backward is the identity
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_rows @ weight).view_as(x)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_rows.t() @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_weight, None, None


def chunked_matmul_all_reduce(x: torch.Tensor, weight: torch.Tensor, group: CommGroup, num_chunks: int):
    """``sum over the group of x @ weight^T``, with the all-reduce of each row chunk overlapping the next GEMM."""
    if group.size == 1:
        return torch.nn.functional.linear(x, weight)
    return _ChunkedMatmulAllReduce.apply(x, weight, group, check_num_chunks(num_chunks))


class OverlappedRowParallelLinear(RowParallelLinear):
    """:class:`~repro.tensor_parallel.RowParallelLinear` with T3-style chunked GEMM / all-reduce overlap.

    Same parameters, same initialisation, same result; ``num_chunks`` row blocks per forward.
    """

    def __init__(self, in_features: int, out_features: int, *, num_chunks: int = 4, **kwargs) -> None:
        super().__init__(in_features, out_features, **kwargs)
        self.num_chunks = check_num_chunks(num_chunks)

    @classmethod
    def from_plain(cls, plain: RowParallelLinear, *, num_chunks: int = 4) -> "OverlappedRowParallelLinear":
        """The overlapped twin of ``plain``, sharing its parameter tensors (no new initialisation, no RNG use)."""
        return twin_of(cls, plain, num_chunks=num_chunks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel(x, self.group)
        z = chunked_matmul_all_reduce(x, self.weight, self.group, self.num_chunks)  # [..., out], summed
        return z + self.bias if self.bias is not None else z

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_chunks={self.num_chunks}"
