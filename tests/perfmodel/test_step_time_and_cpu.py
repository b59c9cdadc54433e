"""The composed step-time model (pipeline, layouts, memory) and the CPU calibration / prediction path."""

import pytest

from repro.perfmodel.cpu import CPUCalibration, calibrate_cpu, predict_cpu_step, predict_cpu_step_time
from repro.perfmodel.hardware import DGX_A100, Efficiency
from repro.perfmodel.memory import layer_activation_bytes, memory_per_gpu
from repro.perfmodel.ops import LayerShape, layer_forward_ops
from repro.perfmodel.parallel_comm import pipeline_bubble_fraction
from repro.perfmodel.step_time import GPTConfig, Layout, iteration_time

SMALL = GPTConfig(num_layers=4, hidden_size=256, num_heads=4, vocab_size=1024, seq_length=128)


def test_uniform_pipeline_matches_the_bubble_formula():
    model = GPTConfig(num_layers=8, hidden_size=1024, num_heads=8, vocab_size=8, seq_length=256)
    eff = Efficiency(gemm=0.5)
    layout = Layout(tp_size=1, pp_size=4, dp_size=1, micro_batch_size=1, global_batch_size=16)
    step = iteration_time(model, layout, DGX_A100, eff)
    ideal = 16 * step.stage_max  # m micro-batches on the bottleneck stage
    bubble = (step.pipeline - ideal) / ideal
    assert bubble == pytest.approx(pipeline_bubble_fraction(pp_size=4, num_micro_batches=16), rel=0.05)


def test_layer_forward_flops_match_the_closed_form():
    shape = LayerShape(micro_batch_size=2, seq_length=64, hidden_size=128, num_heads=4)
    flops = sum(op.flops for op in layer_forward_ops(shape))
    assert flops == 24 * 2 * 64 * 128**2 + 4 * 2 * 64**2 * 128


def test_tensor_parallel_splits_gemm_flops_evenly():
    one = sum(op.flops for op in layer_forward_ops(LayerShape(2, 64, 128, 4, tp_size=1)))
    four = sum(op.flops for op in layer_forward_ops(LayerShape(2, 64, 128, 4, tp_size=4)))
    assert four == pytest.approx(one / 4)


def test_memory_recompute_keeps_only_checkpoints():
    layout = Layout(tp_size=1, pp_size=1, dp_size=1, micro_batch_size=1, global_batch_size=1)
    full = Layout(**{**layout.__dict__, "activation_recompute": False})
    with_ckpt, without = memory_per_gpu(SMALL, layout), memory_per_gpu(SMALL, full)
    assert with_ckpt.activation_checkpoints == 4 * 2 * 128 * 256
    assert without.working_activations == 4 * layer_activation_bytes(micro_batch_size=1, seq_length=128,
                                                                     hidden_size=256, num_heads=4)
    assert with_ckpt.model_states == without.model_states == 16 * SMALL.num_params


@pytest.mark.parametrize("kwargs,match", [
    (dict(tp_size=0), "tp_size"),
    (dict(global_batch_size=3), "divisible"),
    (dict(dp_overlap=2.0), "dp_overlap"),
])
def test_layout_validation(kwargs, match):
    base = dict(tp_size=1, pp_size=1, dp_size=2, micro_batch_size=1, global_batch_size=2)
    with pytest.raises(ValueError, match=match):
        Layout(**{**base, **kwargs})


def test_heads_must_split_across_tensor_parallel_ranks():
    with pytest.raises(ValueError, match="divisible by tp_size"):
        LayerShape(1, 8, 96, 6, tp_size=4)


FAKE_CPU = CPUCalibration(gemm_flops=50e9, rng_seconds_per_element=5e-9, memory_bandwidth=10e9,
                          op_overhead_s=5e-6, allreduce_latency_s=50e-6, allreduce_bandwidth=1e9, threads=1)


def test_cpu_prediction_adds_communication_for_tp_and_dp():
    single = predict_cpu_step(SMALL, tp_size=1, dp_size=1, micro_batch_size=4, calibration=FAKE_CPU)
    tp = predict_cpu_step(SMALL, tp_size=2, dp_size=1, micro_batch_size=4, calibration=FAKE_CPU)
    dp = predict_cpu_step(SMALL, tp_size=1, dp_size=2, micro_batch_size=4, calibration=FAKE_CPU)
    assert single.tp_comm == 0 and single.dp_comm_exposed == 0
    assert tp.tp_comm > 0 and tp.layer_compute < single.layer_compute
    assert dp.dp_comm_exposed > 0 and dp.total > single.total
    no_dropout = predict_cpu_step_time(SMALL, tp_size=1, dp_size=1, micro_batch_size=4, calibration=FAKE_CPU,
                                       dropout=False)
    assert no_dropout < single.total


def test_calibrate_cpu_measures_this_machine():
    calibration = calibrate_cpu(threads=1, world_size=2)
    assert calibration.gemm_flops > 1e8 and calibration.memory_bandwidth > 1e8
    assert calibration.allreduce_bandwidth > 1e6 and calibration.allreduce_latency_s >= 0
    assert 0 < calibration.op_overhead_s < 1e-2 and calibration.rng_seconds_per_element > 0
    assert predict_cpu_step_time(SMALL, tp_size=2, dp_size=1, micro_batch_size=2, calibration=calibration) > 0
    with pytest.raises(ValueError, match="threads"):
        calibrate_cpu(threads=0)


def test_measured_gemm_rates_and_math_costs_enter_the_roofline():
    from repro.perfmodel.hardware import Accelerator, Efficiency
    from repro.perfmodel.ops import elementwise, gemm
    from repro.perfmodel.roofline import op_time

    eff = Efficiency(gemm=1.0, memory=1.0, kernel_overhead=0.0)
    op = gemm("g", m=64, n=32, k=16)
    plain = Accelerator("cpu", peak_flops=1e9, memory_bandwidth=1e12, memory_bytes=1)
    measured = Accelerator("cpu", peak_flops=1e9, memory_bandwidth=1e12, memory_bytes=1,
                           measured_gemm_flops=(((64, 32, 16, 1), 1e8),))
    assert op_time(op, plain, eff) == pytest.approx(op.flops / 1e9)
    assert op_time(op, measured, eff) == pytest.approx(op.flops / 1e8)  # the measured rate wins
    gelu = elementwise("gelu", elements=1000, bytes_per_element=8, math=True, backward_math=True)
    costly = Accelerator("cpu", peak_flops=1e9, memory_bandwidth=1e12, memory_bytes=1, math_seconds_per_element=1e-9)
    assert op_time(gelu, costly, eff) == pytest.approx(8000 / 1e12 + 1000 * 1e-9)


def test_fit_overheads_recovers_known_per_layer_and_per_step_time():
    from dataclasses import replace

    from repro.perfmodel.cpu import fit_overheads
    from repro.perfmodel.step_time import GPTConfig

    truth = replace(FAKE_CPU, layer_overhead_s=2e-3, step_overhead_s=3e-3)
    runs = []
    for layers in (1, 3):
        model = GPTConfig(layers, SMALL.hidden_size, SMALL.num_heads, SMALL.vocab_size, SMALL.seq_length)
        runs.append((model, predict_cpu_step_time(model, tp_size=2, dp_size=1, micro_batch_size=4, calibration=truth)))
    fitted = fit_overheads(FAKE_CPU, runs, tp_size=2, micro_batch_size=4)
    assert fitted.layer_overhead_s == pytest.approx(2e-3, rel=1e-6)
    assert fitted.step_overhead_s == pytest.approx(3e-3, rel=1e-6)
    deep = GPTConfig(6, SMALL.hidden_size, SMALL.num_heads, SMALL.vocab_size, SMALL.seq_length)
    step = predict_cpu_step(deep, tp_size=2, dp_size=1, micro_batch_size=4, calibration=fitted)
    assert step.overhead == pytest.approx(3e-3 + 6 * 2e-3)
    with pytest.raises(ValueError, match="two depths"):
        fit_overheads(FAKE_CPU, runs[:1], tp_size=2, micro_batch_size=4)


def test_calibrate_these_ranks_measures_the_model_gemm_shapes():
    from repro.perfmodel.cpu import calibrate_these_ranks, model_gemm_shapes

    shapes = model_gemm_shapes(SMALL, tp_size=1, micro_batch_size=2)
    assert len(shapes) >= 5 and all(len(s) == 4 for s in shapes)
    calibration = calibrate_these_ranks(gemm_shapes=shapes)
    assert {s for s, _ in calibration.measured_gemm_flops} == set(shapes)
    assert all(rate > 1e7 for _, rate in calibration.measured_gemm_flops)
    assert calibration.math_seconds_per_element >= 0 and calibration.concurrent_ranks == 1
    assert calibration.allreduce_latency_s == 0 and calibration.allreduce_bandwidth == float("inf")
