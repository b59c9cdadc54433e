"""The tile-sparse CPU kernel against the dense reference: forward and all three input gradients on a random sweep
(1/2/3-D, odd and even windows, stride, dilation, causal, grids not divisible by the tiles)."""

from __future__ import annotations

import pytest
import torch

from gna_cases import Case, random_cases
from repro.gna import GNASpec, fast_attention, reference_attention
from repro.gna.plan import build_plan

SWEEP = random_cases(240, seed=2025)
BF16_SWEEP = random_cases(30, seed=7)


def _inputs(case: Case, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    shape = (case.batch, *case.grid, case.heads, case.head_dim)
    return tuple(torch.randn(shape, generator=generator) for _ in range(4))  # q, k, v, grad_out


def _relative_errors(case: Case, dtype: torch.dtype, seed: int) -> list[float]:
    """max |fast - reference| / max(max |reference|, 1) for out, dq, dk, dv; the reference runs in float64 on the
    same (rounded) inputs. The floor of 1 (inputs ~N(0, 1), so gradients are O(1)) is for windows of one key, where
    the exact dq and dk are 0 (dS = P * (dP - rowsum(dO * O)) cancels) and fp32 leaves ~1e-7 of rounding noise."""
    q, k, v, grad_out = _inputs(case, seed)
    q, k, v, grad_out = (x.to(dtype) for x in (q, k, v, grad_out))
    ref_inputs = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out = reference_attention(*ref_inputs, case.spec)
    ref_grads = torch.autograd.grad(ref_out, ref_inputs, grad_out.double())
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = fast_attention(*inputs, case.spec, q_tile=case.q_tile, kv_tile=case.kv_tile)
    assert out.dtype == dtype and out.shape == q.shape
    grads = torch.autograd.grad(out, inputs, grad_out)
    return [
        float((mine.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max().clamp(min=1.0))
        for mine, ref in zip((out, *grads), (ref_out, *ref_grads))
    ]


def test_sweep_covers_the_required_variety():
    specs = [c.spec for c in SWEEP]
    assert len(SWEEP) >= 200
    assert {s.ndim for s in specs} == {1, 2, 3}
    assert any(w % 2 == 0 for s in specs for w in s.window) and any(w % 2 for s in specs for w in s.window)
    assert any(st > 1 for s in specs for st in s.stride) and any(d > 1 for s in specs for d in s.dilation)
    assert any(c for s in specs for c in s.causal)
    assert any(n % t for c in SWEEP for n, t in zip(c.grid, c.q_tile + c.kv_tile))


def test_fp32_sweep_matches_reference():
    failures = []
    for index, case in enumerate(SWEEP):
        errors = _relative_errors(case, torch.float32, seed=index)
        if max(errors) > 1e-5:
            failures.append(f"{case}: out/dq/dk/dv relative errors {['%.1e' % e for e in errors]}")
    assert not failures, "\n".join(failures)


def test_bf16_sweep_matches_reference():
    failures = []
    for index, case in enumerate(BF16_SWEEP):
        errors = _relative_errors(case, torch.bfloat16, seed=index)
        if max(errors) > 2e-2:
            failures.append(f"{case}: out/dq/dk/dv relative errors {['%.1e' % e for e in errors]}")
    assert not failures, "\n".join(failures)


def test_float64_is_exact_to_rounding():
    case = Case((9, 10), GNASpec((4, 3), stride=(2, 3), dilation=(2, 1), causal=(False, True)), (4, 4), (3, 2), 2, 2, 8)
    q, k, v, grad_out = (x.double() for x in _inputs(case, 0))
    ref_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = reference_attention(*ref_inputs, case.spec, scale=0.3)
    out = fast_attention(*inputs, case.spec, scale=0.3, q_tile=case.q_tile, kv_tile=case.kv_tile)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(torch.autograd.grad(out, inputs, grad_out), torch.autograd.grad(ref, ref_inputs, grad_out)):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


def test_gradcheck_small():
    spec = GNASpec((3, 2), stride=(2, 1), causal=(True, False))
    q, k, v = (torch.randn(1, 5, 4, 1, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda *x: fast_attention(*x, spec, q_tile=(2, 2), kv_tile=(2, 3)), (q, k, v))


def test_default_tiles_and_value_head_dim_may_differ():
    spec = GNASpec((5, 5), stride=(2, 3))
    q, k = torch.randn(2, 11, 12, 2, 8), torch.randn(2, 11, 12, 2, 8)
    v = torch.randn(2, 11, 12, 2, 6)
    torch.testing.assert_close(
        fast_attention(q, k, v, spec), reference_attention(q.double(), k.double(), v.double(), spec).float(),
        rtol=1e-5, atol=1e-5,
    )


def test_block_sparse_plan_has_no_masks():
    plan = build_plan((64, 64), GNASpec((24, 48), stride=(8, 16)), (8, 16), (8, 16))
    assert plan.partial_pairs == 0 and all(bucket.blocked is None for bucket in plan.buckets)
    assert plan.full_pairs == 32 * 9 and plan.tile_speedup_bound == pytest.approx(4096 / 1152)


def test_tile_shape_errors():
    q = torch.randn(1, 8, 8, 1, 4)
    with pytest.raises(ValueError, match="both q_tile and kv_tile"):
        fast_attention(q, q, q, GNASpec((3, 3)), q_tile=(2, 2))
    with pytest.raises(ValueError, match="must have 2 entries"):
        fast_attention(q, q, q, GNASpec((3, 3)), q_tile=(2,), kv_tile=(2, 2))
    with pytest.raises(ValueError, match=">= 1"):
        fast_attention(q, q, q, GNASpec((3, 3)), q_tile=(0, 2), kv_tile=(2, 2))
