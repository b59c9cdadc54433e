"""Megatron-LM's conjugate communication operators (paper sec. 3, Fig. 3).

    f: forward identity,   backward all-reduce   (enters a tensor-parallel region)
    g: forward all-reduce, backward identity     (leaves a tensor-parallel region)

plus the split/gather pair used around the vocabulary and for ``gather_output``. Each takes the tensor-parallel
:class:`~repro.dist.comm.CommGroup` explicitly and keeps it on the autograd ``ctx``.
"""

from __future__ import annotations

import torch

from repro.dist import comm
from repro.dist.comm import CommGroup


def split_last_dim(x: torch.Tensor, group: CommGroup) -> torch.Tensor:
    """This rank's contiguous chunk of the last dimension."""
    size = x.shape[-1]
    if size % group.size != 0:
        raise ValueError(f"last dimension {size} is not divisible by the tensor-parallel size {group.size}")
    chunk = size // group.size
    return x[..., group.rank * chunk : (group.rank + 1) * chunk].contiguous()


def gather_last_dim(x: torch.Tensor, group: CommGroup) -> torch.Tensor:
    """Concatenate every rank's chunk along the last dimension (all-gather)."""
    x = x.contiguous()
    out = torch.empty((group.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    comm.all_gather_into_tensor(out, x, group)  # rank chunks stacked along dim 0
    return torch.cat(out.chunk(group.size, dim=0), dim=-1)


class _CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward; all-reduce of the gradient backward (each rank's partial dL/dX is summed)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        comm.all_reduce(grad, ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce forward (summing the row-parallel partial products); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        if not torch.compiler.is_compiling() and x.is_contiguous() and x.grad_fn is not None:
            ctx.mark_dirty(x)  # a fresh matmul output: reduce it in place, as Megatron does
            out = x
        else:
            out = x.contiguous().clone()
        comm.all_reduce(out, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToTensorParallel(torch.autograd.Function):
    """Keep this rank's chunk of the last dim forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return gather_last_dim(grad, ctx.group), None


class _GatherFromTensorParallel(torch.autograd.Function):
    """All-gather the last dim forward; keep this rank's chunk of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return gather_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return split_last_dim(grad, ctx.group), None


def copy_to_tensor_parallel(x: torch.Tensor, group: CommGroup) -> torch.Tensor:
    """Megatron's f."""
    return x if group.size == 1 else _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group: CommGroup) -> torch.Tensor:
    """Megatron's g. The input is reduced in place (it is always a fresh matmul output)."""
    return x if group.size == 1 else _ReduceFromTensorParallel.apply(x, group)


def scatter_to_tensor_parallel(x: torch.Tensor, group: CommGroup) -> torch.Tensor:
    return x if group.size == 1 else _ScatterToTensorParallel.apply(x, group)


def gather_from_tensor_parallel(x: torch.Tensor, group: CommGroup) -> torch.Tensor:
    return x if group.size == 1 else _GatherFromTensorParallel.apply(x, group)
