"""ZeRO Tables 1 and 2 from the closed forms of sec 5 (exactly, once the paper's printing rule is applied)."""

import pytest

from repro.perfmodel.zero_memory import (
    STAGE_NAMES, bytes_per_param, max_params, model_state_bytes, paper_table1_display, paper_table2_theoretical,
)

from perfmodel_claims import paper

MODELS = {"7.5B": 7.5e9, "128B": 128e9, "1T": 1e12}
ND = (1, 4, 16, 64, 256, 1024)
STAGE_KEY = {1: "Pos", 2: "Posg", 3: "Posgp"}


def table1_gb(psi: float, stage: int, nd: int) -> float:
    return model_state_bytes(num_params=psi, stage=stage, dp_size=nd) / 1e9


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stage", (1, 2, 3))
@pytest.mark.parametrize("nd", ND)
def test_table1_cell_is_reproduced_exactly(model, stage, nd):
    printed = paper("zero_2019", f"t1_{model}_{STAGE_KEY[stage]}_nd{nd}")
    assert paper_table1_display(table1_gb(MODELS[model], stage, nd)) == printed


def test_table1_truncated_cells_are_the_eight_large_fractional_ones():
    truncated = []
    for model, psi in MODELS.items():
        for stage in (1, 2, 3):
            for nd in ND:
                exact = table1_gb(psi, stage, nd)
                printed = paper("zero_2019", f"t1_{model}_{STAGE_KEY[stage]}_nd{nd}")
                if exact >= 100 and printed != round(exact):
                    truncated.append((model, STAGE_NAMES[stage], nd))
    assert truncated == [("128B", "Pos", 1024), ("128B", "Pos+g", 1024),
                         ("1T", "Pos", 64), ("1T", "Pos", 256), ("1T", "Pos", 1024),
                         ("1T", "Pos+g", 64), ("1T", "Pos+g", 256), ("1T", "Pos+g", 1024)]


@pytest.mark.parametrize("model", MODELS)
def test_baseline_is_16_bytes_per_parameter(model):
    assert table1_gb(MODELS[model], 0, 64) == paper("zero_2019", f"t1_{model}_baseline")
    assert bytes_per_param(stage=0, dp_size=1) == paper("zero_2019", "mem_formula")


def test_memory_reduction_factors_at_large_nd():
    nd = 10**9
    assert bytes_per_param(stage=0, dp_size=nd) / bytes_per_param(stage=1, dp_size=nd) == pytest.approx(
        paper("zero_2019", "reduction_pos"), rel=1e-6)
    assert bytes_per_param(stage=0, dp_size=nd) / bytes_per_param(stage=2, dp_size=nd) == pytest.approx(
        paper("zero_2019", "reduction_posg"), rel=1e-6)
    assert bytes_per_param(stage=0, dp_size=64) / bytes_per_param(stage=3, dp_size=64) == 64


TABLE2_ROUNDED_BY_PAPER = {(3, 4), (3, 8), (3, 16)}  # 512 -> 500, 1024 -> 1000, 2048 -> 2000 (billions)


@pytest.mark.parametrize("mp", (1, 2, 4, 8, 16))
@pytest.mark.parametrize("stage", (0, 1, 2, 3))
def test_table2_theoretical_max_model_size(mp, stage):
    key = {0: "baseline", 1: "Pos", 2: "Posg", 3: "Posgp"}[stage]
    printed = paper("zero_2019", f"t2_mp{mp}_theo_{key}")
    ours = paper_table2_theoretical(device_gb=32, stage=stage, dp_size=64, mp_size=mp)
    if (stage, mp) in TABLE2_ROUNDED_BY_PAPER:
        assert ours == 128 * mp and printed == pytest.approx(ours, rel=0.03) and printed < ours
    else:
        assert ours == pytest.approx(printed, abs=1e-9)


def test_section_5_4_max_model_sizes_and_trillion_example():
    # sec 5.4 rounds the exact 7.64B and 14.4B down to 7.5B and 14B
    for stage, key, rel in ((1, "Pos", 0.035), (2, "Posg", 0.035), (3, "Posgp", 1e-9)):
        size = max_params(device_bytes=32e9, stage=stage, dp_size=64) / 1e9
        assert size == pytest.approx(paper("zero_2019", f"max_model_nd64_{key}"), rel=rel)
    assert model_state_bytes(num_params=1e12, stage=3, dp_size=1024) / 1e9 == pytest.approx(
        paper("zero_2019", "trillion_per_gpu"), rel=0.03)
    assert model_state_bytes(num_params=1e12, stage=0, dp_size=1) / 1e12 == paper("zero_2019", "trillion_states")


def test_bad_stage_or_dp_size_raise():
    with pytest.raises(ValueError, match="stage"):
        model_state_bytes(num_params=1, stage=5, dp_size=1)
    with pytest.raises(ValueError, match="dp_size"):
        model_state_bytes(num_params=1, stage=1, dp_size=0)
