"""Parity with NATTEN (the paper's library), when it is installed: our masks equal the masks of NATTEN's flex-fna
backend, and our outputs equal its flex-fna outputs (CPU, eager, forward only). NATTEN is a test-time peer only;
the library never imports it. Install: ``pip install --no-build-isolation natten==0.21.7`` (builds without CUDA)."""

from __future__ import annotations

import warnings

import pytest
import torch

from gna_cases import random_cases
from repro.gna import fast_attention, gna_mask

natten = pytest.importorskip("natten")
natten_flex = pytest.importorskip("natten.backends.flex")

MASK_CASES = random_cases(60, seed=404)
OUTPUT_CASES = [c for c in random_cases(30, seed=405) if min(c.spec.window) >= 2][:9]  # NATTEN's ops want >= 2


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _natten_dense_mask(case) -> torch.Tensor:
    """NATTEN's flex mask_mod (no token permutation) evaluated on every (query, key) pair of the flattened grid."""
    spec = case.spec
    block_mask = natten_flex.get_na_flex_mask(
        "cpu", spec.ndim, case.grid, spec.window, spec.stride, spec.dilation, spec.causal
    )
    tokens = int(torch.tensor(case.grid).prod())
    zero = torch.zeros((), dtype=torch.long)
    mask = block_mask.mask_mod(zero, zero, torch.arange(tokens)[:, None], torch.arange(tokens)[None, :])
    return mask.expand(tokens, tokens)


def test_masks_equal_natten_flex():
    mismatches = [
        str(case) for case in MASK_CASES if not torch.equal(_natten_dense_mask(case), gna_mask(case.grid, case.spec))
    ]
    assert not mismatches, "masks differ from NATTEN for:\n" + "\n".join(mismatches)


@pytest.mark.parametrize("case", OUTPUT_CASES, ids=str)
def test_outputs_equal_natten_flex_fna(case):
    from natten.functional import neighborhood_attention_generic

    generator = torch.Generator().manual_seed(1)
    shape = (case.batch, *case.grid, case.heads, 16)  # NATTEN's eager Flex path wants a power-of-two head_dim >= 8
    q, k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    spec = case.spec
    theirs = neighborhood_attention_generic(
        q, k, v, kernel_size=spec.window, stride=spec.stride, dilation=spec.dilation, is_causal=spec.causal,
        backend="flex-fna",
    )
    ours = fast_attention(q, k, v, spec, q_tile=case.q_tile, kv_tile=case.kv_tile)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
