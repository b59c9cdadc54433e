"""Gradient reductions of a (tp x pp x dp) training step: data-parallel averaging and the global gradient norm.

* Data parallelism: every dp replica back-propagates its own slice of the batch; their gradients are averaged
  with one all-reduce of a flat buffer per step (DDP; ZeRO-1 replaces this with its own reduction).
* Gradient clipping (MT-NLG sec. 3: clip at 1.0) needs the norm of the *whole* model's gradient: each rank sums
  the squares of the gradients it owns, counting a tensor-replicated parameter once (on tp rank 0) and the last
  stage's copy of the tied embedding not at all, then the sums are added over the tp and pp groups.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.models.sharding import split_rule
from repro.pipeline.stage import OUTPUT_EMBEDDING


def allreduce_data_parallel_grads(params: Iterable[nn.Parameter], dp_group: CommGroup) -> None:
    """Average ``.grad`` over the data-parallel group in one flat all-reduce (a missing grad counts as zero)."""
    if dp_group.size == 1:
        return
    params = list(params)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.all_reduce(flat, dp_group)
    flat.div_(dp_group.size)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def counted_in_norm(name: str, tp_rank: int) -> bool:
    """Whether this rank's copy of parameter ``name`` enters the global norm (each value exactly once)."""
    if name == OUTPUT_EMBEDDING:
        return False  # the first stage counts the tied word embedding
    return split_rule(name) is not None or tp_rank == 0


def global_grad_norm(model: nn.Module, *, tp_group: CommGroup, pp_group: CommGroup) -> float:
    """L2 norm of the gradient of the full (unsharded, unpipelined) model, identical on every rank."""
    device = next((p.device for p in model.parameters()), None)
    device = device if device is not None else comm.group_device(tp_group)  # nccl reduces GPU tensors only
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for name, p in model.named_parameters():
        if p.grad is not None and counted_in_norm(name, tp_group.rank):
            squares += p.grad.detach().double().pow(2).sum()
    comm.all_reduce(squares, tp_group)
    comm.all_reduce(squares, pp_group)
    return math.sqrt(float(squares))


def clip_grad_norm_(model: nn.Module, max_norm: float, *, tp_group: CommGroup, pp_group: CommGroup) -> float:
    """Scale every gradient by ``min(1, max_norm / norm)``; return the norm before clipping."""
    if max_norm <= 0:
        raise ValueError(f"max_norm={max_norm} must be positive")
    norm = global_grad_norm(model, tp_group=tp_group, pp_group=pp_group)
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm
