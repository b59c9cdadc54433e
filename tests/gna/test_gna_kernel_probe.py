"""GNA's Flex kernel against its own dense speed (repro.gna.kernel_probe), at toy size on the CPU: the all-full block
mask is dense attention in Flex's tiles, the candidates are guarded by what this torch names, and a probe writes one
result per candidate and a summary."""

from __future__ import annotations

import time

import pytest
import torch

from repro.gna.flex_kernel import FlexKernel
from repro.gna.gpu_config import GpuConfig
from repro.gna.spec import GNASpec
from repro.optional import torch_version

pytestmark = pytest.mark.skipif(torch_version() < (2, 5), reason="FlexAttention needs torch >= 2.5")
TOY = GpuConfig("toy2d", "toy", (16, 32), GNASpec((16, 16), stride=(8, 16)), (8, 16), (8, 16), heads=2, head_dim=16)


def test_the_all_full_mask_attends_everywhere_and_equals_dense_attention():
    from repro.gna.flex import flex_api
    from repro.gna.flex_problem import FlexProblem, flex_attend
    from repro.gna.kernel_probe import all_full_block_mask

    problem = FlexProblem(TOY, torch.device("cpu"), flex_attend(compile=False))
    mask = all_full_block_mask(problem)
    q = torch.randn(1, 2, TOY.tokens, 16)
    out = flex_api().flex_attention(q, q, q, block_mask=mask)
    dense = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)
    assert int(mask.full_kv_num_blocks.sum()) == mask.full_kv_indices.shape[-1] * mask.full_kv_indices.shape[-2]


def test_candidates_are_todays_options_then_one_change_each_and_unknown_options_are_named():
    from repro.gna.kernel_probe import accepted_option, candidate_options

    current = FlexKernel("TRITON", {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64})
    names = candidate_options(current, tile_tokens=256, capability=(9, 0))
    assert list(names)[:2] == ["current", "all_full"] and names["all_full"] is None
    assert names["use_tma"] == {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "USE_TMA": True}
    assert names["fwd_block_n_128"]["fwd_BLOCK_N"] == 128
    assert "fwd_block_n_128" not in candidate_options(current, tile_tokens=64, capability=(9, 0))  # must divide
    assert accepted_option("fwd_BLOCK_M") == accepted_option("PRESCALE_QK") == ""
    assert "names no Flex kernel option 'NOT_AN_OPTION'" in accepted_option("NOT_AN_OPTION")
    assert list(candidate_options(None, tile_tokens=256, capability=None)) == ["current", "all_full"]  # a CPU


def test_a_probe_writes_one_result_per_candidate_and_a_summary():
    from repro.gna.kernel_probe import probe_flex_options

    seen = []
    probe_flex_options(TOY, backward=False, device=torch.device("cpu"), deadline=time.perf_counter() + 300,
                       emit=lambda variant, values, fields: seen.append((variant, values, fields)), iters=1,
                       warmup=1, dtype=torch.float32)
    assert [v for v, _, _ in seen] == ["current", "all_full", "summary"]
    assert all(values["kernel_ms"] > 0 for v, values, _ in seen[:2])
    summary = seen[-1][1]
    assert summary["gna_over_dense_tiles"] > 0 and summary["best_over_current"] == 1.0
    assert all(fields["config"] == "toy2d" and fields["tile_bound"] > 1 for _, _, fields in seen)
