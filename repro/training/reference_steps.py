"""The step's pieces as they were before they moved to the device: slow, obvious references for the fast paths.

* :func:`clip_grad_norm_loop`: the global norm as an fp64 sum over each gradient, read on the host, and a host-side
  clipping factor applied parameter by parameter (what :func:`repro.training.grads.clip_grad_norm_` replaced).
* :func:`saved_softmax_cross_entropy`: the vocab-parallel cross-entropy at tp 1 with an fp32 copy of the logits
  and the fp32 softmax saved for backward (what :mod:`repro.tensor_parallel.cross_entropy` replaced).
* :class:`PerParameterOptimizer`: the trainer's data-parallel optimizer over the model's parameters one by one
  (foreach norms and clipping, a torch AdamW over every parameter), what the flat buffers of
  :class:`repro.training.optim.DataParallelOptimizer` replaced; its checkpoints are the per-parameter format.

Tests hold the fast paths to these (the cross-entropy bit for bit, the norm within 1e-6, the flat optimizer's losses
bit for bit where its arithmetic is the same); ``step_perf`` and the GPU probe time them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.dist.groups import ParallelGroups
from repro.training.settings import TrainSettings


def clip_grad_norm_loop(model: nn.Module, max_norm: float, *, tp_group: CommGroup, pp_group: CommGroup) -> float:
    """Scale every gradient by ``min(1, max_norm / (norm + 1e-6))``, computed on the host; return the norm."""
    from repro.training.grads import counted_in_norm

    device = next(model.parameters()).device
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for name, p in model.named_parameters():
        if p.grad is not None and counted_in_norm(name, tp_group.rank):
            squares += p.grad.detach().double().pow(2).sum()
    comm.all_reduce(squares, tp_group)
    comm.all_reduce(squares, pp_group)
    norm = math.sqrt(float(squares))
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm


class _SavedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        z = logits.float()
        shifted = z - z.max(dim=-1).values.unsqueeze(-1)
        target_logit = shifted.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), target)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, target = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, target.unsqueeze(-1), -torch.ones_like(grad[..., :1]))
        return grad.mul_(grad_loss.unsqueeze(-1)), None


def saved_softmax_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token loss of ``logits`` [..., V] (one rank holds the whole vocabulary)."""
    return _SavedSoftmax.apply(logits, target)


class PerParameterOptimizer:
    """All-reduce (average) gradients over ``groups.dp``, clip by the global norm, then step, parameter by parameter:
    the trainer's optimizer before its flat buffers (same interface; fp16 loss scaling included)."""

    stage = 0
    FORMAT = "repro-train-dp-optimizer/1"

    def __init__(self, model: nn.Module, settings: TrainSettings, groups: ParallelGroups, *,
                 fused: bool | None = None) -> None:
        from repro.training.optim import make_torch_optimizer
        from repro.zero.precision import DynamicLossScaler

        self.model, self.groups, self.clip_grad = model, groups, settings.clip_grad
        self.dp_group = groups.dp
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_torch_optimizer(self.params, settings, fused=fused)
        self.last_grad_norm: torch.Tensor | None = None
        self.scaler = DynamicLossScaler() if settings.precision == "fp16" else None
        self.skipped_steps = 0

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict:
        return {"format": self.FORMAT, "stage": 0, "dp_rank": self.dp_group.rank, "dp_size": self.dp_group.size,
                "torch": self.optimizer.state_dict(), "skipped_steps": self.skipped_steps,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != self.FORMAT:
            raise ValueError(f"not a per-parameter optimizer state (format {state.get('format')!r})")
        self.optimizer.load_state_dict(state["torch"])
        self.skipped_steps = int(state["skipped_steps"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _unscale_and_check(self) -> bool:
        grads = [p.grad for p in self.params if p.grad is not None]
        found = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        for grad in grads:
            grad.div_(self.scaler.scale)
            found = torch.maximum(found, (~torch.isfinite(grad)).any().float())
        comm.all_reduce(found, self.groups.tp, op=torch.distributed.ReduceOp.MAX)
        comm.all_reduce(found, self.groups.pp, op=torch.distributed.ReduceOp.MAX)
        return bool(found > 0)

    def step(self) -> None:
        from repro.training.grads import allreduce_data_parallel_grads, clip_grad_norm_

        allreduce_data_parallel_grads(self.params, self.groups.dp)
        if self.scaler is not None:
            if self.scaler.update(self._unscale_and_check()):
                self.skipped_steps += 1
                return
        if self.clip_grad is not None:
            self.last_grad_norm = clip_grad_norm_(self.model, self.clip_grad, tp_group=self.groups.tp,
                                                  pp_group=self.groups.pp)
        self.optimizer.step()
