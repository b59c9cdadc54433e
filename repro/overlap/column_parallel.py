"""Column-parallel linear whose backward all-reduce of dX overlaps the gradient GEMMs (T3, backward FC-1 and IP).

In Megatron-LM (sec. 3, ``Y_i = f(X) A_i^T``) the conjugate ``f`` all-reduces the input gradient
``dX = sum_i dY_i A_i`` in backward; the plain :class:`~repro.tensor_parallel.ColumnParallelLinear` runs that
all-reduce after the dX GEMM and before anything else. Megatron's asynchronous tensor-parallel all-reduce
(``num_chunks=1`` here) starts it before the weight-gradient GEMM, once the whole dX GEMM is done. These are the backward sublayers T3 (Pati et al., ASPLOS'24) overlaps at a finer grain:
the input-gradient GEMM is cut into row blocks, each block's all-reduce is launched as soon as the block is
computed, and the weight-gradient GEMM ``dA_i = dY_i^T X`` (which needs no communication) runs while the last
blocks are still on the wire. With ``num_chunks=1`` this is Megatron's asynchronous all-reduce.

Forward is f's: identity, no communication.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.overlap.chunking import check_num_chunks, row_chunks
from repro.overlap.row_parallel import wait_all
from repro.overlap.twin import twin_of
from repro.tensor_parallel import ColumnParallelLinear, gather_from_tensor_parallel
from repro.tensor_parallel.layers import BiasThrough


class _LinearChunkedGradAllReduce(torch.autograd.Function):
    """``f(x) @ W^T + b`` whose backward all-reduces ``dX`` chunk by chunk behind the dX and dW GEMMs."""

    @staticmethod
    def forward(ctx, x, weight, bias, group: CommGroup, num_chunks: int):
        ctx.group, ctx.num_chunks, ctx.has_bias = group, num_chunks, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)  # [..., out/tp]

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])  # [T, out/tp]
        grad_x = grad_weight = grad_bias = None
        handles = []
        if ctx.needs_input_grad[0]:
            grad_x = torch.empty(grad_rows.shape[0], weight.shape[1], dtype=grad_out.dtype, device=grad_out.device)
            for block in row_chunks(grad_rows.shape[0], ctx.num_chunks):
                torch.matmul(grad_rows[block], weight, out=grad_x[block])  # this rank's partial dX of the chunk
                handles.append(comm.all_reduce(grad_x[block], ctx.group, async_op=True))  # f's sum, in flight
        # The weight and bias gradients need no communication: they run while the dX chunks are reduced.
        if ctx.needs_input_grad[1]:
            grad_weight = grad_rows.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        wait_all(handles)
        if grad_x is not None:
            grad_x = grad_x.view_as(x)
        return grad_x, grad_weight, grad_bias, None, None


def linear_chunked_grad_all_reduce(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group: CommGroup, num_chunks: int
) -> torch.Tensor:
    """``f(x) @ weight^T + bias`` with the backward all-reduce of dX chunked and overlapped with the GEMMs."""
    if group.size == 1:
        return F.linear(x, weight, bias)
    return _LinearChunkedGradAllReduce.apply(x, weight, bias, group, check_num_chunks(num_chunks))


class OverlappedColumnParallelLinear(ColumnParallelLinear):
    """:class:`~repro.tensor_parallel.ColumnParallelLinear` whose backward overlaps the dX all-reduce (T3)."""

    def __init__(self, in_features: int, out_features: int, *, num_chunks: int = 4, **kwargs) -> None:
        super().__init__(in_features, out_features, **kwargs)
        self.num_chunks = check_num_chunks(num_chunks)

    @classmethod
    def from_plain(cls, plain: ColumnParallelLinear, *, num_chunks: int = 4) -> "OverlappedColumnParallelLinear":
        """The overlapped twin of ``plain``, sharing its parameter tensors (no new initialisation, no RNG use)."""
        return twin_of(cls, plain, num_chunks=num_chunks)

    def forward(self, x: torch.Tensor, *, bias_through: BiasThrough | None = None) -> torch.Tensor:
        y = linear_chunked_grad_all_reduce(x, self.weight, self.bias_for(bias_through), self.group, self.num_chunks)
        return gather_from_tensor_parallel(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_chunks={self.num_chunks}"
