"""The step's pieces as they were before they moved to the device: slow, obvious references for the fast paths.

* :func:`clip_grad_norm_loop`: the global norm as an fp64 sum over each gradient, read on the host, and a host-side
  clipping factor applied parameter by parameter (what :func:`repro.training.grads.clip_grad_norm_` replaced).
* :func:`saved_softmax_cross_entropy`: the vocab-parallel cross-entropy at tp 1 with an fp32 copy of the logits
  and the fp32 softmax saved for backward (what :mod:`repro.tensor_parallel.cross_entropy` replaced).

Tests hold the fast paths to these (the cross-entropy bit for bit, the norm within 1e-6); ``step_perf`` times them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from repro.dist import comm
from repro.dist.comm import CommGroup


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
