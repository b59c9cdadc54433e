"""Flex's kernel options for GNA per GPU architecture and tile shape (repro.gna.flex_kernel).

On an H200 (torch 2.11) tiles of 16 tokens failed to compile under inductor's defaults ("Q and KV block size must be
divisible by BLOCK_M and BLOCK_N"). Every sub-tile chosen here must divide the tile, on every architecture, for every
tile the suite can be given; the architecture's defaults are kept where they divide.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from repro.gna.flex_kernel import SMALLEST, choose_flex_kernel, kernel_for

CAPABILITIES = [(7, 0), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]
TILES = [16, 32, 48, 64, 80, 96, 128, 192, 256, 512]


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_sub_tile_divides_its_tile(capability, dtype, head_dim):
    for q_tokens, kv_tokens in itertools.product(TILES, TILES):
        kernel = choose_flex_kernel(q_tokens, kv_tokens, capability=capability, head_dim=head_dim, dtype=dtype)
        assert kernel.backend == "TRITON"  # no flash_attn here
        options = kernel.options
        for key, tokens in (("fwd_BLOCK_M", q_tokens), ("bwd_BLOCK_M1", q_tokens), ("bwd_BLOCK_M2", q_tokens),
                            ("fwd_BLOCK_N", kv_tokens), ("bwd_BLOCK_N1", kv_tokens), ("bwd_BLOCK_N2", kv_tokens)):
            assert tokens % options[key] == 0 and options[key] >= SMALLEST, (q_tokens, kv_tokens, key, options)


def test_the_architecture_defaults_stay_where_they_divide_and_narrow_where_not():
    hopper = dict(capability=(9, 0), head_dim=128, dtype=torch.bfloat16)
    wide = choose_flex_kernel(128, 128, **hopper).options
    assert (wide["fwd_BLOCK_M"], wide["fwd_BLOCK_N"]) == (128, 64)  # inductor's Hopper default
    assert (wide["bwd_BLOCK_M1"], wide["bwd_BLOCK_N1"], wide["bwd_BLOCK_M2"], wide["bwd_BLOCK_N2"]) == (64, 128, 128, 64)
    assert "fwd_num_warps" not in wide and "bwd_num_warps" not in wide
    narrow = choose_flex_kernel(16, 16, **hopper)
    assert {v for k, v in narrow.options.items() if "BLOCK" in k} == {16}
    assert narrow.options["fwd_num_warps"] == narrow.options["bwd_num_warps"] == 4
    assert narrow.describe().startswith("TRITON ") and "fwd_BLOCK_M=16" in narrow.describe()


def test_a_tile_without_a_multiple_of_16_tokens_is_refused_in_one_line():
    with pytest.raises(ValueError, match="query tiles of 8 tokens: Flex's GPU kernels need tiles of a multiple of 16"):
        choose_flex_kernel(8, 16, capability=(9, 0), head_dim=128, dtype=torch.bfloat16)


def test_no_options_on_the_cpu():
    class Mask:
        BLOCK_SIZE = (16, 16)

    assert kernel_for(torch.empty(1, 1, 16, 64), Mask()) is None


def test_options_measured_on_a_gpu_model_apply_there_only_and_say_where_they_came_from(monkeypatch):
    from repro.gna import flex_kernel

    monkeypatch.setattr(flex_kernel, "MEASURED", ((("H200",), {"USE_TMA": True, "fwd_BLOCK_N": 128},
                                                   "probe run 20270101T000000Z-abcdef"),))
    hopper = dict(capability=(9, 0), head_dim=128, dtype=torch.bfloat16)
    default = choose_flex_kernel(256, 256, **hopper, device_name="NVIDIA H100 80GB HBM3")
    assert "USE_TMA" not in default.options and default.source == "inductor's defaults for sm90"
    tuned = choose_flex_kernel(256, 256, **hopper, device_name="NVIDIA H200")
    assert tuned.options["USE_TMA"] is True and tuned.options["fwd_BLOCK_N"] == 128
    assert tuned.source == "probe run 20270101T000000Z-abcdef"
    narrow = choose_flex_kernel(64, 64, **hopper, device_name="NVIDIA H200")
    assert narrow.options["fwd_BLOCK_N"] == 64  # a measured block still divides the tile
