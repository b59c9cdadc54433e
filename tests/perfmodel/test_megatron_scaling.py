"""Megatron-LM Fig. 5 weak scaling, 15.1 PFLOP/s, Table 7 and Table 8 from the op-level model.

Fitted on three paper numbers (39 TFLOP/s, 64-GPU 96 %, 4-way MP 82 %); everything else is held out."""

import pytest

from repro.perfmodel.megatron import (
    LINK_FIT_MP, TABLE1, TABLE2, aggregate_flops, calibrate_v100, days_per_epoch, heads_efficiency,
    strong_scaling_speedup, weak_scaling_efficiency,
)

from perfmodel_claims import paper

M = "megatron_lm_2019"
GPUS = {1: 1, 2: 2, 4: 4, 8: 8}
#: The one Fig. 5 bar the model does not reach: 2.5B on 128 GPUs is 83 % in the paper, 12 points below its own
#: 2-way MP bar (95 %), while the other MP+DP bars sit 3 points below theirs. No bandwidth, overlap or
#: straggler term that keeps those also produces it; the model predicts ~94 % there.
KNOWN_OUTLIER = "fig5_eff_mpdp_128gpu"


@pytest.fixture(scope="module")
def eff():
    return calibrate_v100(baseline_flops=paper(M, "baseline_tflops_1gpu") * 1e12,
                          pure_dp_efficiency=paper(M, "fig5_eff_mpdp_64gpu") / 100,
                          mp_efficiency=paper(M, f"fig5_eff_mp_{LINK_FIT_MP}gpu") / 100)


def test_table1_configs_match_the_paper():
    for config in TABLE1:
        assert config.hidden_size == paper(M, f"t1_{config.label}_hidden")
        assert config.num_heads == paper(M, f"t1_{config.label}_heads")
        assert config.num_layers == paper(M, f"t1_{config.label}_layers")
        assert config.mp_size == paper(M, f"t1_{config.label}_mp_gpus")


def test_table2_configs_match_the_paper():
    for run in TABLE2:
        assert run.num_layers == paper(M, f"t2_{run.label}_layers")
        assert run.hidden_size == paper(M, f"t2_{run.label}_hidden")
        assert run.num_heads == paper(M, f"t2_{run.label}_heads")
        assert run.gpus == paper(M, f"t2_{run.label}_gpus")
        assert run.hidden_size // run.num_heads == paper(M, f"t2_{run.label}_hidden_per_head")


def test_calibration_hits_its_three_fitting_points(eff):
    assert 0.3 < eff.gemm < 0.9 and 0 < eff.intra_link <= 1 and 0 < eff.straggler_sigma < 0.1
    assert LINK_FIT_MP == 4 and "intra_link: 4-way MP 82%" in eff.fitted_on
    assert weak_scaling_efficiency(TABLE1[0], data_parallel=True, eff=eff) == pytest.approx(0.96, abs=1e-3)
    assert weak_scaling_efficiency(TABLE1[2], data_parallel=False, eff=eff) == pytest.approx(0.82, abs=1e-3)


@pytest.mark.parametrize("mp_size", [1, 3, 16])
def test_the_link_constant_is_fitted_on_a_model_parallel_bar_only(mp_size):
    with pytest.raises(ValueError, match="model-parallel degree of a Table 1 bar"):
        calibrate_v100(baseline_flops=39e12, pure_dp_efficiency=0.96, mp_efficiency=0.8, mp_size=mp_size)


def test_table2_days_per_epoch_from_the_model(eff):
    """Table 2's epochs, predicted (the fit saw none of them): 355M and 8.3B within 10 %, 2.5B too short: its run
    is Fig. 5's 128-GPU configuration, the documented outlier."""
    days = {run.label: days_per_epoch(run, eff=eff, iterations_per_epoch=68_507) for run in TABLE2}
    assert days["355M"] == pytest.approx(paper(M, "t2_355M_days_per_epoch"), rel=0.10)
    assert days["8p3B"] == pytest.approx(paper(M, "t2_8p3B_days_per_epoch"), rel=0.10)
    assert 0.75 < days["2p5B"] / paper(M, "t2_2p5B_days_per_epoch") < 0.9
    with pytest.raises(ValueError, match="iterations_per_epoch"):
        days_per_epoch(TABLE2[0], eff=eff, iterations_per_epoch=0)


@pytest.mark.parametrize("index", range(4))
@pytest.mark.parametrize("data_parallel", [False, True])
def test_fig5_weak_scaling_within_3_points(eff, index, data_parallel):
    config = TABLE1[index]
    claim_id = (f"fig5_eff_mpdp_{64 * config.mp_size}gpu" if data_parallel
                else f"fig5_eff_mp_{GPUS[config.mp_size]}gpu")
    ours = 100 * weak_scaling_efficiency(config, data_parallel=data_parallel, eff=eff)
    if claim_id == KNOWN_OUTLIER:
        assert 8 < ours - paper(M, claim_id) < 14  # documented miss: the model stays far above 83 %
    else:
        assert ours == pytest.approx(paper(M, claim_id), abs=3.0)


def test_sustained_15_1_petaflops_within_3_percent(eff):
    assert aggregate_flops(TABLE1[3], eff=eff) / 1e15 == pytest.approx(paper(M, "sustained_pflops_512"), rel=0.03)


@pytest.mark.parametrize("heads", [16, 24, 32])
def test_table7_heads_within_3_points(eff, heads):
    assert 100 * heads_efficiency(heads, eff=eff) == pytest.approx(paper(M, f"t7_heads{heads}_eff"), abs=3.0)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_table8_strong_scaling_is_overestimated_but_bounded(eff, gpus):
    """Held out and honestly missed: the model's strong scaling of the 1.2B model is too optimistic
    (1.71/2.73/3.64 vs 1.64/2.34/2.98): the paper's 4- and 8-GPU iterations are ~0.13 s longer than the model's at
    both counts, a cost that does not shrink with the GPUs, which the model lacks."""
    ours, theirs = strong_scaling_speedup(gpus, eff=eff), paper(M, f"t8_strong_{gpus}gpu")
    assert theirs <= ours <= 1.3 * theirs
