"""ZeRO-R closed forms (repro.perfmodel.zero_residual) on hand-computed cases, and the sec 1 N_d x N_m reduction."""

import math

import pytest

from repro.perfmodel import zero_residual as zr
from repro.perfmodel.zero_memory import memory_reduction

SMALL = dict(num_layers=2, hidden_size=10, batch_size=3, seq_length=5)


def test_activation_memory_hand_computed():
    # 12 x 10 x 3 x 5 x 2 layers = 3600 fp16 elements = 7200 bytes
    assert zr.activation_bytes(**SMALL) == 7200
    assert zr.sqrt_checkpointed_activation_bytes(**SMALL) == pytest.approx(7200 / math.sqrt(2))
    # one fp16 3 x 5 x 10 checkpoint per layer: 2 x 150 x 2 = 600 bytes; replicated under MP, split by P_a
    assert zr.checkpoint_bytes_per_gpu(**SMALL) == 600
    assert zr.checkpoint_bytes_per_gpu(**SMALL, mp_size=4) == 600
    assert zr.checkpoint_bytes_per_gpu(**SMALL, mp_size=4, partitioned=True) == 150
    assert zr.checkpoint_bytes_per_gpu(**SMALL, ckpt_interval=2) == 300
    assert zr.pa_cpu_transfer_bytes(150) == 300
    assert zr.fused_buffer_bytes(7) == 28


def test_recompute_overhead_is_one_forward_in_three():
    assert zr.recompute_overhead(hidden_size=64, batch_size=2, seq_length=16) == pytest.approx(1 / 3)
    assert zr.recompute_overhead(hidden_size=64, batch_size=2, seq_length=16, backward_to_forward=1) == 0.5


def test_model_parallel_and_pa_communication_hand_computed():
    # b s h = 2 x 3 x 4 = 24: 6 all-reduces of 24 elements, each moving 48 -> 288; P_a one all-gather of 24
    sizes = dict(batch_size=2, seq_length=3, hidden_size=4)
    assert zr.mp_allreduce_volume_per_block(**sizes) == 288
    assert zr.pa_allgather_volume_per_block(**sizes) == 24
    assert zr.pa_overhead_fraction(**sizes) == pytest.approx(1 / 12)
    # 5 layers: MP 5 x 288 = 1440; ZeRO-DP 3 psi = 3 x 12 x 16 x 5 = 2880 -> 0.5 = b s / (3 h)
    assert zr.mp_to_zero_dp_comm_ratio(**sizes, num_layers=5) == pytest.approx(0.5)


def test_checkpoint_arithmetic_intensity_hand_computed():
    # forward GEMMs 24 b s h^2 + 4 b s^2 h = 24*1*2*16 + 4*1*4*4 = 832 (h=4, s=2, b=1); x4 passes over 2*1*2*4 bytes
    assert zr.checkpoint_arithmetic_intensity(hidden_size=4, batch_size=1, seq_length=2) == 4 * 832 / 16
    assert zr.checkpoint_arithmetic_intensity(hidden_size=1600, batch_size=1, seq_length=1024) == 48 * 1600 + 8 * 1024


def test_zero_with_model_parallelism_reduces_memory_by_nd_times_nm():
    assert memory_reduction(stage=3, dp_size=4, mp_size=2) == 8
    assert memory_reduction(stage=0, dp_size=4, mp_size=2) == 2
    # P_os at N_d = 2: 16 / (4 + 6) = 1.6
    assert memory_reduction(stage=1, dp_size=2) == pytest.approx(1.6)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="num_layers"):
        zr.activation_bytes(num_layers=0, hidden_size=1, batch_size=1, seq_length=1)
    with pytest.raises(ValueError, match="mp_size"):
        zr.checkpoint_bytes_per_gpu(**SMALL, mp_size=0)
    with pytest.raises(ValueError, match="mp_size"):
        memory_reduction(stage=3, dp_size=4, mp_size=0)
    with pytest.raises(ValueError, match="partition_bytes"):
        zr.pa_cpu_transfer_bytes(-1)
