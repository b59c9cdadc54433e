"""Sequence-parallel tensor-parallel linears with chunked collective overlap (T3 with reduce-scatter).

With sequence parallelism (Korthikanti et al. 2022) the all-reduce of a row-parallel output becomes a
reduce-scatter along the sequence dimension (each rank keeps ``s / tp`` positions for LayerNorm and dropout), and
the input of the next column-parallel layer is all-gathered along the sequence. T3 (Pati et al., ASPLOS'24, sec. 3)
overlaps exactly this GEMM -> reduce-scatter pair. Activations are batch-first ``[b, s, h]`` as in ``repro.models``;
the sequence is cut as ``[tp, n, L]`` (``chunking.sequence_chunk_shape``) so chunk ``c`` carries piece ``c`` of
every rank's shard and one reduce-scatter (or all-gather) per chunk lands each piece on its owner.

=======================================  =====================================  =================================
layer                                    forward                                backward
=======================================  =====================================  =================================
``SequenceParallelRowLinear`` (OP, FC-2) GEMM chunk c, reduce-scatter c async   all-gather dZ chunks async; dX, dW
                                                                                GEMMs of chunk c as it arrives
``SequenceParallelColumnLinear``         all-gather X chunks async; GEMM of     dX GEMM chunk c, reduce-scatter c
(IP, FC-1)                               chunk c as it arrives                  async; dW GEMM behind the last ones
=======================================  =====================================  =================================

``num_chunks=1`` is the sequential schedule (one collective before or after one GEMM). The gathered input of the
column layer is kept for its weight gradient (Megatron-SP instead gathers it again in backward to save memory).
The row layer's bias is added to the local shard, so its gradient is this rank's partial sum: like LayerNorm
parameters in sequence-parallel regions it must be all-reduced over the tp group before the optimizer step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.overlap.chunking import check_num_chunks, sequence_chunk_shape
from repro.overlap.row_parallel import wait_all
from repro.overlap.twin import twin_of
from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from repro.tensor_parallel.layers import BiasThrough


def chunk_rows(x5: torch.Tensor, chunk: int) -> torch.Tensor:
    """Chunk ``chunk`` of a ``[b, tp, n, L, f]`` view as ``[tp * b * L, f]`` rows, destination rank first."""
    b, tp, _, length, features = x5.shape
    return x5[:, :, chunk].transpose(0, 1).reshape(tp * b * length, features)


class _MatmulReduceScatter(torch.autograd.Function):
    """``reduce_scatter_seq(x @ W^T)``: full sequence in (``[b, s, in/tp]``), own shard out (``[b, s/tp, out]``)."""

    @staticmethod
    def forward(ctx, x, weight, group: CommGroup, num_chunks: int):
        b, s, k = x.shape
        tp, n, length = sequence_chunk_shape(s, group.size, num_chunks)
        ctx.group, ctx.shape = group, (b, s, k, tp, n, length)
        x = x.contiguous()
        ctx.save_for_backward(x, weight)
        x5 = x.view(b, tp, n, length, k)
        out = torch.empty(n, b, length, weight.shape[0], dtype=x.dtype, device=x.device)  # [n, b, L, out]
        partials, handles = [], []
        for chunk in range(n):
            partial = (chunk_rows(x5, chunk) @ weight.t()).view(tp * b, length, -1)  # [tp*b, L, out]
            partials.append(partial)  # kept alive until its reduce-scatter is done
            handles.append(comm.reduce_scatter_tensor(out[chunk], partial, group, async_op=True))
        wait_all(handles)
        return out.permute(1, 0, 2, 3).reshape(b, n * length, -1)  # [b, s/tp, out]

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        b, s, k, tp, n, length = ctx.shape
        grad_chunks = grad_out.reshape(b, n, length, -1)  # this rank's shard, chunk by chunk
        sends = [grad_chunks[:, chunk].contiguous() for chunk in range(n)]
        gathered = [torch.empty(tp * b, length, grad_out.shape[-1], dtype=grad_out.dtype, device=grad_out.device)
                    for _ in range(n)]
        handles = [comm.all_gather_into_tensor(gathered[c], sends[c], ctx.group, async_op=True) for c in range(n)]
        x5 = x.view(b, tp, n, length, k)
        grad_x = torch.empty_like(x5) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for chunk in range(n):  # compute on chunk c while chunks c+1.. are still being gathered
            handles[chunk].wait()
            grad_rows = gathered[chunk].view(tp * b * length, -1)  # [tp*b*L, out]
            if grad_x is not None:
                grad_x[:, :, chunk] = (grad_rows @ weight).view(tp, b, length, k).transpose(0, 1)
            if grad_weight is not None:
                grad_weight.addmm_(grad_rows.t(), chunk_rows(x5, chunk))
        return (grad_x.view(b, s, k) if grad_x is not None else None), grad_weight, None, None


class _AllGatherMatmul(torch.autograd.Function):
    """``all_gather_seq(x) @ W^T + b``: own shard in (``[b, s/tp, in]``), full sequence out (``[b, s, out/tp]``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group: CommGroup, num_chunks: int):
        b, local, k = x.shape
        tp, n, length = sequence_chunk_shape(local * group.size, group.size, num_chunks)
        ctx.group, ctx.shape, ctx.has_bias = group, (b, local, k, tp, n, length), bias is not None
        x_chunks = x.reshape(b, n, length, k)
        sends = [x_chunks[:, chunk].contiguous() for chunk in range(n)]
        gathered = [torch.empty(tp * b, length, k, dtype=x.dtype, device=x.device) for _ in range(n)]
        handles = [comm.all_gather_into_tensor(gathered[c], sends[c], group, async_op=True) for c in range(n)]
        x_full = torch.empty(b, tp, n, length, k, dtype=x.dtype, device=x.device)
        y = torch.empty(b, tp, n, length, weight.shape[0], dtype=x.dtype, device=x.device)
        for chunk in range(n):  # GEMM of chunk c while chunks c+1.. are still being gathered
            handles[chunk].wait()
            rows = gathered[chunk].view(tp, b, length, k)
            x_full[:, :, chunk] = rows.transpose(0, 1)
            y[:, :, chunk] = F.linear(rows, weight, bias).transpose(0, 1)
        ctx.save_for_backward(x_full, weight)
        return y.view(b, tp * local, -1)

    @staticmethod
    def backward(ctx, grad_out):
        x_full, weight = ctx.saved_tensors
        b, local, k, tp, n, length = ctx.shape
        grad5 = grad_out.reshape(b, tp, n, length, -1)
        grad_x = grad_weight = grad_bias = None
        handles, partials = [], []
        if ctx.needs_input_grad[0]:
            grad_x = torch.empty(n, b, length, k, dtype=grad_out.dtype, device=grad_out.device)
            for chunk in range(n):
                partial = (chunk_rows(grad5, chunk) @ weight).view(tp * b, length, k)  # partial dX, [tp*b, L, k]
                partials.append(partial)
                handles.append(comm.reduce_scatter_tensor(grad_x[chunk], partial, ctx.group, async_op=True))
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])  # dW and db need no communication: overlap them
        if ctx.needs_input_grad[1]:
            grad_weight = grad_rows.t() @ x_full.view(-1, k)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        wait_all(handles)
        if grad_x is not None:
            grad_x = grad_x.permute(1, 0, 2, 3).reshape(b, local, k)
        return grad_x, grad_weight, grad_bias, None, None


def _check_3d(x: torch.Tensor, layer: str) -> None:
    if x.dim() != 3:
        raise ValueError(f"{layer} expects a batch-first [batch, seq, features] input, got shape {tuple(x.shape)}")


class SequenceParallelRowLinear(RowParallelLinear):
    """Row-parallel linear whose output is reduce-scattered along the sequence, chunk by chunk behind the GEMM.

    Input ``[b, s, in/tp]`` (full sequence, features split), output ``[b, s/tp, out]`` (own sequence shard).
    """

    def __init__(self, in_features: int, out_features: int, *, num_chunks: int = 4, **kwargs) -> None:
        super().__init__(in_features, out_features, **kwargs)
        if not self.input_is_parallel:
            raise ValueError("SequenceParallelRowLinear needs input_is_parallel=True (its input is the column "
                             "layer's split output)")
        self.num_chunks = check_num_chunks(num_chunks)

    @classmethod
    def from_plain(cls, plain: RowParallelLinear, *, num_chunks: int = 4) -> "SequenceParallelRowLinear":
        """The sequence-parallel overlapped twin of ``plain``, sharing its parameter tensors."""
        if not plain.input_is_parallel:
            raise ValueError("SequenceParallelRowLinear needs a RowParallelLinear with input_is_parallel=True")
        return twin_of(cls, plain, num_chunks=num_chunks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_3d(x, type(self).__name__)
        if self.group.size == 1:
            z = F.linear(x, self.weight)
        else:
            z = _MatmulReduceScatter.apply(x, self.weight, self.group, self.num_chunks)
        return z + self.bias if self.bias is not None else z

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sequence_parallel, num_chunks={self.num_chunks}"


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """Column-parallel linear whose sequence-sharded input is all-gathered chunk by chunk ahead of the GEMM, and
    whose input gradient is reduce-scattered chunk by chunk behind the backward GEMMs.

    Input ``[b, s/tp, in]`` (own sequence shard), output ``[b, s, out/tp]``.
    """

    def __init__(self, in_features: int, out_features: int, *, num_chunks: int = 4, **kwargs) -> None:
        super().__init__(in_features, out_features, **kwargs)
        if self.gather_output:
            raise ValueError("SequenceParallelColumnLinear does not gather its output (gather_output=True given)")
        self.num_chunks = check_num_chunks(num_chunks)

    @classmethod
    def from_plain(cls, plain: ColumnParallelLinear, *, num_chunks: int = 4) -> "SequenceParallelColumnLinear":
        """The sequence-parallel overlapped twin of ``plain``, sharing its parameter tensors."""
        if plain.gather_output:
            raise ValueError("SequenceParallelColumnLinear needs a ColumnParallelLinear with gather_output=False")
        return twin_of(cls, plain, num_chunks=num_chunks)

    def forward(self, x: torch.Tensor, *, bias_through: BiasThrough | None = None) -> torch.Tensor:
        _check_3d(x, type(self).__name__)
        bias = self.bias_for(bias_through)
        if self.group.size == 1:
            return F.linear(x, self.weight, bias)
        return _AllGatherMatmul.apply(x, self.weight, bias, self.group, self.num_chunks)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sequence_parallel, num_chunks={self.num_chunks}"
