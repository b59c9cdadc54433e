"""Exactness of an overlapped layer against its plain twin: relative error of outputs and of every gradient.

Used by the tests and by the T3 experiment, which reports the worst relative error as a row (the acceptance rule
is <= 1e-5 in fp32: chunking changes only how the same sums are split into messages).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (the plain difference norm when ``expected`` is 0)."""
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    actual, expected = actual.detach().double(), expected.detach().double()
    denom = expected.norm()
    diff = (actual - expected).norm()
    return float(diff / denom) if denom > 0 else float(diff)


def forward_backward(
    module: nn.Module, inputs: torch.Tensor, grad_out: torch.Tensor, call: Callable | None = None
) -> dict[str, torch.Tensor]:
    """Run ``module`` on a fresh leaf copy of ``inputs``, backpropagate ``grad_out``; return the output, the input
    gradient and every parameter gradient (by name). The module's gradients are cleared first."""
    module.zero_grad(set_to_none=True)
    x = inputs.detach().clone().requires_grad_(True)
    out = call(module, x) if call is not None else module(x)
    out.backward(grad_out)
    result = {"output": out.detach().clone(), "input.grad": x.grad.detach().clone()}
    for name, param in module.named_parameters():
        if param.grad is not None:
            result[f"{name}.grad"] = param.grad.detach().clone()
    return result


def max_rel_err(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The worst relative error over the tensors of two :func:`forward_backward` results, and which tensor."""
    if set(actual) != set(expected):
        raise ValueError(f"different tensors: {sorted(set(actual) ^ set(expected))}")
    worst = max(((rel_err(actual[k], expected[k]), k) for k in expected), key=lambda pair: pair[0])
    return worst


def compare_with_ledger(plain: nn.Module, overlapped: nn.Module, inputs: torch.Tensor, grad_out: torch.Tensor,
                        ledger) -> dict:
    """Run both modules forward and backward; return the worst relative error (and which tensor) and the bytes
    and calls each put on ``ledger`` (a :class:`~repro.dist.ledger.CollectiveLedger`)."""
    before = ledger.snapshot()
    expected = forward_backward(plain, inputs, grad_out)
    plain_moved = ledger.since(before)
    before = ledger.snapshot()
    actual = forward_backward(overlapped, inputs, grad_out)
    overlapped_moved = ledger.since(before)
    err, worst = max_rel_err(actual, expected)
    return {"max_rel_err": err, "worst_tensor": worst, "plain_bytes": plain_moved.bytes(),
            "overlapped_bytes": overlapped_moved.bytes(), "plain_calls": plain_moved.calls(),
            "overlapped_calls": overlapped_moved.calls()}
