"""repro.perfmodel.gpus (datasheet peaks for names as torch prints them) and repro.timing (warm-up, then timed)."""

from __future__ import annotations

import pytest
import torch

from repro.perfmodel.gpus import PEAKS, GpuPeak, gpu_peak, peak_from_table
from repro.timing import Timing, time_iterations


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H100 80GB HBM3", 989.4e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989.4e12),
    ("NVIDIA H200 NVL", 835e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-SXM4-40GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),  # A100's PCIe and SXM bf16 peaks are the same
    ("Tesla V100-SXM2-32GB", 125e12),
    ("NVIDIA B200", 2250e12),
    ("nvidia h100 pcie", 756e12),  # case does not matter
])
def test_peak_from_table(name, peak):
    found = peak_from_table(name)
    assert isinstance(found, GpuPeak)
    assert found.peak_flops == peak and found.name == name
    assert found.source.startswith("datasheet: ")


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "NVIDIA L4", "NVIDIA A10", "Tesla T4", "", "cpu"])
def test_unknown_gpu_is_not_in_the_table(name):
    assert peak_from_table(name) is None


def test_table_rows_are_positive_and_specific_rows_come_first():
    for words, flops, source in PEAKS:
        assert words and flops > 0 and source
    for i, (words, _, _) in enumerate(PEAKS):  # no row is shadowed by a more general one above it
        for earlier, _, _ in PEAKS[:i]:
            assert not set(earlier) <= set(words), f"{words} is shadowed by {earlier}"


@pytest.mark.parametrize("dev", ["cpu", torch.device("cpu")])
def test_gpu_peak_on_cpu_raises(dev):
    with pytest.raises(ValueError, match="cpu"):
        gpu_peak(dev)


def test_gpu_peak_on_this_device(device):
    if device == "cpu":
        with pytest.raises(ValueError):
            gpu_peak(device)
        return
    peak = gpu_peak(device)
    assert peak.peak_flops > 1e12 and peak.source.split(":")[0] in ("datasheet", "measured")
    assert peak.name == torch.cuda.get_device_name(device)


def test_time_iterations_returns_iters_positive_times(device):
    calls = []
    a = torch.randn(64, 64, device=device)

    def work():
        calls.append(1)
        return a @ a

    timing = time_iterations(work, device=device, warmup=2, iters=5)
    assert isinstance(timing, Timing)
    assert len(timing.times_s) == 5 and all(t > 0 for t in timing.times_s)
    assert len(calls) == 2 + 5  # warm-up calls are made but not timed
    assert timing.min_s <= timing.median_s and timing.min_s <= timing.mean_s
    assert timing.min_s == min(timing.times_s)


def test_time_iterations_without_warmup(device):
    a = torch.randn(32, 32, device=device)
    timing = time_iterations(lambda: a @ a, device=device, warmup=0, iters=1)
    assert len(timing.times_s) == 1 and timing.times_s[0] > 0


@pytest.mark.parametrize("warmup,iters", [(-1, 5), (0, 0), (3, -2)])
def test_bad_warmup_or_iters_raise(warmup, iters):
    calls = []
    with pytest.raises(ValueError, match="warmup|iters"):
        time_iterations(lambda: calls.append(1), device="cpu", warmup=warmup, iters=iters)
    assert not calls  # checked before anything runs
