"""Closed forms against the papers: FLOPs, parameter counts, collective and ZeRO volumes, pipeline bubble."""

import pytest

from repro.perfmodel.collectives import allgather_bytes_per_rank, allreduce_bytes_per_rank, allreduce_time
from repro.perfmodel.flops import achieved_flops_per_device, gpt_flops_per_iteration, gpt_param_count
from repro.perfmodel.hardware import DGX2H, DGX_A100, Accelerator, Link
from repro.perfmodel.megatron import TrainingRun, nodes_for, percent_of_peak, tflops_from_epoch_time, tokens_per_epoch
from repro.perfmodel.mtnlg import (
    MTNLG_530B, mixed_precision_adam_bytes_per_param, tflops_from_iteration_time, tokens_per_parameter,
    tokens_per_step, total_gpus,
)
from repro.perfmodel.step_time import GPTConfig
from repro.perfmodel.parallel_comm import (
    pipeline_bubble_fraction, pipeline_idle_fraction, tp_allreduces_per_layer, tp_bytes_per_layer,
    zero_communication_volume,
)

from perfmodel_claims import paper


def test_mtnlg_param_count_is_529_6_billion():
    assert MTNLG_530B.num_params / 1e9 == pytest.approx(paper("mt_nlg_2022", "params_repro"), abs=0.05)
    assert MTNLG_530B.num_params / 1e9 == pytest.approx(paper("mt_nlg_2022", "params"), rel=0.001)


@pytest.mark.parametrize("nodes", [280, 350, 420])
def test_flops_formula_turns_mtnlg_iteration_times_into_reported_tflops(nodes):
    time_s = paper("mt_nlg_2022", f"iter_time_{nodes}n")
    tflops = tflops_from_iteration_time(nodes, time_s)
    assert tflops == pytest.approx(paper("mt_nlg_2022", f"tflops_{nodes}n_repro"), abs=0.06)
    assert tflops == pytest.approx(paper("mt_nlg_2022", f"tflops_{nodes}n"), rel=0.01)


@pytest.mark.parametrize("label,layers,hidden,gpus", [("355M", 24, 1024, 64), ("2p5B", 54, 1920, 128),
                                                      ("8p3B", 72, 3072, 512)])
def test_megatron_table2_epoch_times_imply_the_derived_tflops(label, layers, hidden, gpus):
    days = paper("megatron_lm_2019", f"t2_{label}_days_per_epoch")
    iterations = paper("megatron_lm_2019", "epoch_iterations")
    flops = gpt_flops_per_iteration(batch_size=512, seq_length=1024, num_layers=layers, hidden_size=hidden,
                                    vocab_size=51200)
    tflops = achieved_flops_per_device(flops_per_iteration=flops, iteration_time_s=days * 86400 / iterations,
                                       num_devices=gpus) / 1e12
    assert tflops == pytest.approx(paper("megatron_lm_2019", f"t2_{label}_implied_tflops_per_gpu"), abs=0.1)


def test_param_count_formula_matches_megatron_table1_rounding():
    for label, layers, hidden in (("1p2B", 40, 1536), ("2p5B", 54, 1920), ("4p2B", 64, 2304), ("8p3B", 72, 3072)):
        count = gpt_param_count(num_layers=layers, hidden_size=hidden, vocab_size=51200, seq_length=1024) / 1e9
        assert count == pytest.approx(paper("megatron_lm_2019", f"t1_{label}_params"), abs=0.05)


def test_flops_without_recompute_is_three_quarters_of_the_layer_part():
    kwargs = dict(batch_size=8, seq_length=1024, num_layers=4, hidden_size=512, vocab_size=1)
    layers_96 = gpt_flops_per_iteration(**kwargs) - 6 * 8 * 1024 * 512
    layers_72 = gpt_flops_per_iteration(**kwargs, activation_recompute=False) - 6 * 8 * 1024 * 512
    assert layers_72 / layers_96 == pytest.approx(0.75)


def test_ring_volumes():
    assert allreduce_bytes_per_rank(8, 800) == pytest.approx(2 * 7 / 8 * 800)
    assert allgather_bytes_per_rank(4, 400) == pytest.approx(300)
    assert allreduce_bytes_per_rank(1, 123) == 0
    link = Link("test", bandwidth=100.0, latency=1.0)
    assert allreduce_time(num_ranks=2, message_bytes=100, link=link) == pytest.approx(2 * 1.0 + 100 / 100)


def test_tensor_parallel_allreduces_per_layer():
    assert tp_allreduces_per_layer(activation_recompute=False) == paper("megatron_lm_2019", "comm_allreduce_per_layer")
    # ZeRO sec 8: with recompute, ~12 x batch x seq x hidden elements per block for large t
    per_block = tp_bytes_per_layer(tp_size=1024, micro_batch_size=1, seq_length=1, hidden_size=1, bytes_per_element=1)
    assert per_block == pytest.approx(paper("zero_2019", "mp_comm_per_block"), rel=0.01)


def test_zero_communication_volumes():
    psi = 1e9
    assert zero_communication_volume(stage=0, num_params=psi) / psi == paper("zero_2019", "comm_dp")
    assert zero_communication_volume(stage=2, num_params=psi) / psi == paper("zero_2019", "comm_posg")
    assert zero_communication_volume(stage=3, num_params=psi) / psi == paper("zero_2019", "comm_posgp")
    ratio = zero_communication_volume(stage=3, num_params=psi) / zero_communication_volume(stage=0, num_params=psi)
    assert ratio == paper("zero_2019", "comm_posgp_ratio")


def test_pipeline_bubble_and_idle_fraction():
    assert pipeline_bubble_fraction(pp_size=35, num_micro_batches=240) == pytest.approx(34 / 240)
    assert pipeline_idle_fraction(pp_size=35, num_micro_batches=240) == pytest.approx(34 / 274)
    assert pipeline_idle_fraction(pp_size=1, num_micro_batches=1) == 0


def test_nodes_for_rounds_up_to_whole_nodes():
    assert [nodes_for(n, DGX2H) for n in (1, 16, 17, 64, 512)] == [1, 1, 2, 4, 32]
    assert [nodes_for(n, DGX_A100) for n in (8, 9, 2240)] == [1, 2, 280]


def test_percent_of_peak():
    device = Accelerator("toy", peak_flops=200e12, memory_bandwidth=1.0, memory_bytes=1.0)
    assert percent_of_peak(50e12, device) == pytest.approx(25.0)
    assert percent_of_peak(0.0, device) == 0.0


def test_tokens_per_epoch_is_iterations_times_batch_times_sequence():
    assert tokens_per_epoch(10, global_batch=4, seq_length=8) == 320
    assert tokens_per_epoch(1) == 512 * 1024  # the GPT-2 defaults: batch 512 x seq 1024


def test_tflops_from_epoch_time_on_a_hand_computed_run():
    # 1 layer, h = 1024, batch 512, s = 1024, V = 51200: 96 B s l h^2 (1 + s/6h + V/16lh)
    # = 96 * 512 * 1024 * 1024^2 * (1 + 1/6 + 3.125) = 2.2636e14 FLOPs; 1000 iterations in 0.01 day = 864 s, 4 GPUs
    run = TrainingRun("toy", num_layers=1, hidden_size=1024, num_heads=16, gpus=4)
    flops = 96 * 512 * 1024 * 1024**2 * (1 + 1 / 6 + 51200 / (16 * 1024))
    expected = flops * 1000 / (864 * 4) / 1e12
    assert tflops_from_epoch_time(run, days_per_epoch=0.01, iterations_per_epoch=1000) == pytest.approx(expected)


def test_mixed_precision_adam_bytes_per_param():
    assert mixed_precision_adam_bytes_per_param(fp32_grad_copy=False) == 2 + 2 + 4 + 4 + 4
    assert mixed_precision_adam_bytes_per_param() == 2 + 2 + 4 + 4 + 4 + 4


def test_mtnlg_token_and_gpu_arithmetic():
    toy = GPTConfig(num_layers=1, hidden_size=8, num_heads=2, vocab_size=16, seq_length=4)
    assert tokens_per_step(toy, global_batch=3) == 12
    assert tokens_per_parameter(2 * toy.num_params, toy) == pytest.approx(2.0)
    assert total_gpus(280) == 8 * 35 * 8  # tp x pp x dp on 280 DGX A100 nodes
    assert total_gpus(420) == 8 * 35 * 12


@pytest.mark.parametrize("call", [
    lambda: nodes_for(0),
    lambda: percent_of_peak(-1.0, DGX2H.device),
    lambda: tokens_per_epoch(0),
    lambda: tflops_from_epoch_time(TrainingRun("x", 1, 8, 1, 1), days_per_epoch=0, iterations_per_epoch=1),
    lambda: tokens_per_step(MTNLG_530B, global_batch=0),
    lambda: tokens_per_parameter(0.0),
    lambda: total_gpus(100),
    lambda: gpt_flops_per_iteration(batch_size=0, seq_length=1, num_layers=1, hidden_size=1, vocab_size=1),
    lambda: zero_communication_volume(stage=4, num_params=1),
    lambda: pipeline_bubble_fraction(pp_size=0, num_micro_batches=1),
    lambda: allreduce_bytes_per_rank(0, 1),
    lambda: Link("bad", bandwidth=0, latency=0),
])
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()
