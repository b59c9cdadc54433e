"""A pipeline stage whose forward and backward take a fixed wall-clock time: the bubble, free of CPU contention.

The 1F1B bubble (p-1)/(m+p-1) assumes every stage spends the same time on each micro-batch. On a shared CPU two
real stages rarely do (they compete for cores with each other and with everything else), so measuring the
schedule's idle share on real compute mixes the schedule with the machine's noise. This stage does a small real
computation (a linear layer, so gradients flow and tensors move through the real p2p path) and then *sleeps*
``forward_s`` / ``backward_s``: sleeping needs no core, so the per-micro-batch work is the same on every stage no
matter how loaded the machine is, and what is measured is the schedule itself (time blocked in receives).
"""

from __future__ import annotations

import time

import torch
from torch import nn


class _FixedDuration(torch.autograd.Function):
    """Identity whose forward takes ``forward_s`` seconds and whose backward takes ``backward_s``."""

    @staticmethod
    def forward(ctx, x, forward_s: float, backward_s: float):
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class FixedCostStage(nn.Module):
    """``Linear(hidden, hidden)`` followed by a fixed ``forward_s`` (forward) / ``backward_s`` (backward) wait."""

    def __init__(self, hidden_size: int, *, forward_s: float, backward_s: float) -> None:
        super().__init__()
        if forward_s < 0 or backward_s < 0:
            raise ValueError(f"forward_s={forward_s} and backward_s={backward_s} must be >= 0")
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FixedDuration.apply(self.linear(x), self.forward_s, self.backward_s)
