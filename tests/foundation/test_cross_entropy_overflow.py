"""The vocabulary-parallel cross-entropy on logits whose exponentials overflow (e^1000 is inf in every float
format): subtracting the largest logit first (Megatron-LM sec. 3, the all-reduce MAX) keeps the loss and its
gradient finite and exact. Expected values are written out with ``math`` from the softmax's definition."""

from __future__ import annotations

import math

import pytest
import torch

from repro.tensor_parallel import vocab_parallel_cross_entropy


def _by_hand(row: list[float], target: int) -> tuple[float, list[float]]:
    """loss = log sum_v e^(z_v - m) - (z_t - m) and its gradient softmax - onehot, in Python floats."""
    top = max(row)
    weights = [math.exp(z - top) for z in row]
    total = math.fsum(weights)
    return math.log(total) - (row[target] - top), [w / total - (v == target) for v, w in enumerate(weights)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logits_too_large_to_exponentiate(dtype):
    # every value is exact in bf16 and fp16 (bf16 spaces its values 128 apart at 2^14); fp16's largest is 65504
    rows = [[1000.0, 992.0, 984.0, 0.0], [-4.0, 0.0, 28672.0, 28544.0], [88.0, 96.0, 104.0, 112.0]]
    targets = [1, 3, 0]
    logits = torch.tensor(rows, dtype=dtype, requires_grad=True)
    loss = vocab_parallel_cross_entropy(logits, torch.tensor(targets))
    loss.sum().backward()
    expected = [_by_hand(row, t) for row, t in zip(rows, targets)]
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()
    assert loss.tolist() == pytest.approx([e[0] for e in expected], rel=1e-6, abs=1e-6)
    # the gradient comes back in the logits' dtype: compared at that dtype's precision
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    assert logits.grad.float().tolist() == [pytest.approx(e[1], abs=tol) for e in expected]
