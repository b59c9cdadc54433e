"""The FlexAttention backend (eager on CPU, forward) against the reference, and its block mask against the tile
plan: both come from the same spec and tiling."""

from __future__ import annotations

import warnings

import pytest
import torch

from gna_cases import random_cases
from repro.gna import GNASpec, flex_gna, gna_block_mask, reference_attention
from repro.gna.plan import build_plan

pytest.importorskip("torch.nn.attention.flex_attention")

CASES = random_cases(16, seed=11)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Flex warns that it runs eagerly on CPU
        yield


@pytest.mark.parametrize("case", CASES, ids=str)
def test_flex_forward_matches_reference(case):
    generator = torch.Generator().manual_seed(0)
    shape = (case.batch, *case.grid, case.heads, case.head_dim)
    q, k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    ref = reference_attention(q.double(), k.double(), v.double(), case.spec)
    out = flex_gna(q, k, v, case.spec, q_tile=case.q_tile, kv_tile=case.kv_tile)
    assert float((out.double() - ref).abs().max() / ref.abs().max()) <= 1e-5


@pytest.mark.parametrize(
    "grid, spec, q_tile, kv_tile",
    [
        ((16, 16), GNASpec((8, 8), stride=(4, 4)), (4, 4), (4, 4)),
        ((12, 10), GNASpec((5, 4), stride=(2, 1), dilation=(2, 1)), (4, 2), (2, 4)),
        ((40,), GNASpec(9, causal=True), (8,), (8,)),
    ],
)
def test_block_mask_visits_the_plans_tiles(grid, spec, q_tile, kv_tile):
    plan = build_plan(grid, spec, q_tile, kv_tile)
    block_mask = gna_block_mask(grid, spec, q_tile, kv_tile)
    dense = block_mask.to_dense()[0, 0].bool()  # [q tiles, kv tiles]
    expected = torch.zeros(plan.num_q_tiles, plan.num_kv_tiles, dtype=torch.bool)
    for bucket in plan.buckets:
        for q_ids, kv_ids in zip(bucket.q_tiles, bucket.kv_tiles):
            expected[q_ids[:, None], kv_ids[None, :]] = True
    assert torch.equal(dense, expected)
    full = block_mask.full_kv_num_blocks
    full_pairs = 0 if full is None else int(full.sum())
    assert full_pairs == plan.full_pairs
