"""Global gradient norm and overflow check over sharded gradients.

With ZeRO each data-parallel rank holds the reduced gradient of its own shard only, so the norm of the whole
gradient is ``sqrt(sum over dp ranks of the shard's sum of squares)``; with tensor (or pipeline) parallelism the
sum runs over the model-parallel group too, but a parameter replicated across tensor-parallel ranks (layer norms,
row-parallel biases, position embeddings) must be counted once: Megatron counts it on tp rank 0 only.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
from torch import nn

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding


def tensor_parallel_duplicates(model: nn.Module, tp_group: CommGroup) -> list[nn.Parameter]:
    """Parameters this rank holds that a lower tensor-parallel rank already counts (empty on tp rank 0).

    Sharded: column-parallel weight and bias, row-parallel weight, vocab-parallel embedding. Everything else is
    replicated over the tensor-parallel group."""
    if tp_group.size == 1 or tp_group.rank == 0:
        return []
    sharded: set[int] = set()
    for module in model.modules():
        if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
            sharded.update(id(p) for p in module.parameters(recurse=False))
        elif isinstance(module, RowParallelLinear):
            sharded.add(id(module.weight))
    return [p for p in model.parameters() if id(p) not in sharded]


def sum_of_squares(shard: torch.Tensor, ranges: Sequence[tuple[int, int]] | None) -> torch.Tensor:
    """fp32 sum of squares of ``shard`` restricted to [lo, hi) ranges (all of it when ``ranges`` is None)."""
    if ranges is None:
        return shard.float().pow(2).sum()
    total = torch.zeros((), dtype=torch.float32, device=shard.device)
    for lo, hi in ranges:
        total += shard[lo:hi].float().pow(2).sum()
    return total


def global_grad_sums(
    shards: Iterable[tuple[torch.Tensor, Sequence[tuple[int, int]] | None]],
    *,
    dp_group: CommGroup,
    model_parallel_group: CommGroup | Sequence[CommGroup] | None,
    replicated_over_dp: bool = False,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``[sum of squares, any non-finite]`` of the whole gradient (fp32, on the device), agreed by every rank.

    ``shards`` yields (gradient shard, element ranges to count). ``replicated_over_dp``: every dp rank holds the
    whole gradient (stage 0), so the dp sum is skipped. ``model_parallel_group`` may be several groups of a grid
    (e.g. tp then pp): summing over each in turn sums over all the ranks that hold different parameters.
    The sums stay on the gradients' ``device`` (nccl reduces GPU tensors only; nothing waits for them here);
    ``device`` defaults to the first shard's.
    """
    local = None
    for shard, ranges in shards:
        if local is None:
            local = torch.zeros(2, dtype=torch.float32, device=device if device is not None else shard.device)
        local[0] += sum_of_squares(shard, ranges).to(local.device)
    if local is None:
        local = torch.zeros(2, dtype=torch.float32,
                            device=device if device is not None else comm.group_device(dp_group))
    local[1] = (~torch.isfinite(local[0])).float()
    if not replicated_over_dp:
        comm.all_reduce(local, dp_group)
    groups = [model_parallel_group] if isinstance(model_parallel_group, CommGroup) else model_parallel_group or []
    for group in groups:
        comm.all_reduce(local, group)
    return local


def global_grad_stats(shards, **kwargs) -> tuple[float, bool]:
    """(sum of squares, any non-finite) of :func:`global_grad_sums`, read on the host (one sync)."""
    sumsq, flag = global_grad_sums(shards, **kwargs).tolist()
    return sumsq, bool(flag > 0 or not math.isfinite(sumsq))


def clip_coefficient(total_norm: float, max_norm: float | None) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6))."""
    if max_norm is None:
        return 1.0
    return min(1.0, max_norm / (total_norm + 1e-6))


def scale_(grad: torch.Tensor, factor: float | torch.Tensor) -> None:
    """``grad *= factor`` in place: a device tensor factor is applied as it is (no host comparison; moved to a host
    tier's gradient), a float only when it is not 1."""
    if isinstance(factor, torch.Tensor):
        grad.mul_(factor.to(grad.device))
    elif factor != 1.0:
        grad.mul_(factor)
