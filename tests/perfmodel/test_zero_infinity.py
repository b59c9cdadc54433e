"""ZeRO-Infinity sec 3-4 formulas (secondary transcription) against the CSV's derived and secondary rows."""

import pytest

from repro.perfmodel import zero_infinity as zi

from perfmodel_claims import paper

Z = "zero_infinity_2021"
PEAK = 70e12  # Fig. 3 caption (secondary): 70 TFLOP/s


def test_params_grads_need_68_4_gb_s_for_half_efficiency():
    bw = zi.bandwidth_for_efficiency(target=0.5, ait=zi.ait_params_grads(bsz=1, seq=1024), peak_flops=PEAK)
    assert bw / 1e9 == pytest.approx(paper(Z, "bw_params_50pct_derived"), abs=0.05)
    at_70 = zi.efficiency(ait=zi.ait_params_grads(bsz=1, seq=1024), bandwidth=paper(Z, "bw_params_50pct") * 1e9,
                          peak_flops=PEAK)
    assert at_70 > 0.5


def test_optimizer_states_need_4x_the_bandwidth():
    params = zi.bandwidth_for_efficiency(target=0.5, ait=zi.ait_params_grads(bsz=2, seq=1024), peak_flops=PEAK)
    optim = zi.bandwidth_for_efficiency(target=0.5, ait=zi.ait_optimizer_states(bsz=2, seq=1024), peak_flops=PEAK)
    assert optim / params == pytest.approx(paper(Z, "bw_opt_factor"))


def test_activation_checkpoint_efficiencies():
    at_2 = zi.efficiency(ait=zi.ait_activation_checkpoints(hd=2048), bandwidth=2e9, peak_flops=PEAK)
    assert 100 * at_2 == pytest.approx(paper(Z, "bw_ckpt_2GBs_derived"), abs=0.05)
    at_3 = zi.efficiency(ait=zi.ait_activation_checkpoints(hd=8192), bandwidth=3e9, peak_flops=PEAK)
    assert 100 * at_3 == pytest.approx(paper(Z, "ckpt_eff_8K_derived"), abs=0.05)
    assert 100 * at_3 > paper(Z, "ckpt_eff_8K")


def test_memory_formulas():
    assert zi.model_state_bytes(nl=1, hd=1) == 192  # 16 B/param x 12 hd^2
    assert zi.model_state_bytes(nl=1, hd=1, bytes_per_param=20) == 240
    assert zi.activation_checkpoint_bytes(bsz=2, seq=3, hd=5, nl=8, ci=2) == 2 * 2 * 3 * 5 * 8 / 2
    assert zi.model_state_working_memory(10) == 16 * 100
    assert zi.activation_working_memory(bsz=1, seq=4, hd=2, attn_heads=3) == 4 * (32 + 24)
    # 1T parameters at 16 B/param: 16 TB, i.e. 500 V100-32GB for model states alone (the abstract's 800
    # also counts residual memory the formulas here do not give)
    nl, hd = 128, 25600  # 12 nl hd^2 ~ 1.007e12
    assert zi.model_state_bytes(nl=nl, hd=hd) / 1e12 == pytest.approx(paper(Z, "states_1T_16B"), rel=0.01)


def test_flops_per_iteration_and_efficiency_bounds():
    assert zi.flops_per_iteration(bsz=1, seq=1, nl=1, hd=1) == 96
    assert zi.efficiency(ait=1e6, bandwidth=1e12, peak_flops=1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        zi.bandwidth_for_efficiency(target=1.0, ait=1, peak_flops=1)
