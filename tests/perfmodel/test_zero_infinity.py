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


def test_params_per_block_counts_a_real_transformer_layer():
    """12 hd^2 equals the weight matrices of this suite's own GPT layer (biases and layer norms left out)."""
    from repro.dist.comm import CommGroup
    from repro.models.config import GPTConfig
    from repro.models.transformer import TransformerLayer

    for hd in (32, 48):
        config = GPTConfig(vocab_size=64, hidden_size=hd, num_layers=1, num_attention_heads=4,
                           max_position_embeddings=16)
        layer = TransformerLayer(config, group=CommGroup.single(), causal=True)
        weights = sum(p.numel() for p in layer.parameters() if p.dim() == 2)
        assert zi.params_per_block(hd) == weights == 12 * hd * hd


def test_derived_arithmetic_intensities_hand_computed():
    # bsz 2, seq 3, nl 1, hd 1, ci 1: FLOPs 2 x 4 x 12 x 6 = 576; params 12
    flops = zi.flops_per_iteration(bsz=2, seq=3, nl=1, hd=1)
    assert flops == 576
    assert zi.arithmetic_intensity(flops=flops, bytes_moved=zi.bytes_moved_params_grads(12)) == 576 / 96 == 6
    assert zi.arithmetic_intensity(flops=flops, bytes_moved=zi.bytes_moved_optimizer_states(12)) == 576 / 384
    ckpt = zi.bytes_moved_activation_checkpoints(nl=1, hd=1, seq=3, bsz=2, ci=1)
    assert ckpt == 4 * 6  # 4 (nl/ci) hd seq bsz
    assert zi.arithmetic_intensity(flops=flops, bytes_moved=ckpt) == 24 == zi.ait_activation_checkpoints(hd=1)
