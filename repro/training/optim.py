"""The optimizer side of a step: reduce gradients over data parallelism, clip by the global norm, update.

``zero_stage=0`` is plain data parallelism (every dp rank holds the full optimizer state and all-reduces
gradients, DDP-style). ``zero_stage=1`` shards the optimizer state over dp with :mod:`repro.zero` stage 1
(ZeRO sec. 5.1, P_os), which MT-NLG uses on top of tensor and pipeline parallelism (sec. 2.4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from repro.dist.groups import ParallelGroups
from repro.training.grads import allreduce_data_parallel_grads, clip_grad_norm_

if TYPE_CHECKING:  # pragma: no cover
    from repro.training.trainer import TrainSettings


def make_torch_optimizer(params, settings: "TrainSettings") -> torch.optim.Optimizer:
    if settings.optimizer == "adam":
        return torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                                 weight_decay=settings.weight_decay)
    if settings.optimizer == "sgd":
        return torch.optim.SGD(params, lr=settings.lr, weight_decay=settings.weight_decay)
    raise ValueError(f"optimizer={settings.optimizer!r} must be 'adam' or 'sgd'")


class DataParallelOptimizer:
    """All-reduce (average) gradients over ``groups.dp``, clip by the global norm, then step."""

    def __init__(self, model: nn.Module, settings: "TrainSettings", groups: ParallelGroups) -> None:
        self.model, self.groups, self.clip_grad = model, groups, settings.clip_grad
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_torch_optimizer(self.params, settings)
        self.last_grad_norm: float | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        allreduce_data_parallel_grads(self.params, self.groups.dp)
        if self.clip_grad is not None:
            self.last_grad_norm = clip_grad_norm_(self.model, self.clip_grad, tp_group=self.groups.tp,
                                                  pp_group=self.groups.pp)
        self.optimizer.step()


def build_optimizer(model: nn.Module, settings: "TrainSettings", groups: ParallelGroups):
    if settings.zero_stage == 0:
        return DataParallelOptimizer(model, settings, groups)
    raise NotImplementedError("zero_stage=1 needs repro.zero's stage-1 optimizer")
