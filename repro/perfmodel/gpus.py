"""Peak dense 16-bit tensor throughput of the GPUs the papers and their readers use, as data.

The "share of peak" a run reports divides its model FLOP/s by this number. Values are NVIDIA's datasheet dense
(no structured sparsity) bf16/fp16 tensor-core peaks. A GPU not in the table is measured instead: the best of a few
large bf16 GEMMs, and the result says so (``source="measured"``), since a measured peak is lower than a datasheet one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GpuPeak:
    """A GPU's dense 16-bit peak (FLOP/s) and where that number comes from."""

    name: str
    peak_flops: float
    source: str  # "datasheet: ..." or "measured: ..."


#: (substrings that must all appear in ``torch.cuda.get_device_name()``, peak FLOP/s, datasheet).
#: More specific rows come first (an "H100 PCIe" also contains "H100").
PEAKS: tuple[tuple[tuple[str, ...], float, str], ...] = (
    (("H100", "PCIe"), 756e12, "NVIDIA H100 PCIe datasheet, bf16 dense"),
    (("H100", "NVL"), 835e12, "NVIDIA H100 NVL datasheet, bf16 dense"),
    (("H100",), 989.4e12, "NVIDIA H100 SXM datasheet, bf16 dense"),
    (("H200", "NVL"), 835e12, "NVIDIA H200 NVL datasheet, bf16 dense"),
    (("H200",), 989.4e12, "NVIDIA H200 SXM datasheet, bf16 dense"),
    (("GB200",), 2500e12, "NVIDIA GB200 NVL72 datasheet, bf16 dense per GPU"),
    (("B200",), 2250e12, "NVIDIA HGX B200 datasheet, bf16 dense"),
    (("A100",), 312e12, "NVIDIA A100 datasheet, bf16 dense"),
    (("V100", "PCIE"), 112e12, "NVIDIA V100 PCIe datasheet, fp16 tensor dense"),
    (("V100",), 125e12, "NVIDIA V100 SXM2 datasheet, fp16 tensor dense"),
)


def peak_from_table(device_name: str) -> GpuPeak | None:
    """The datasheet peak of ``device_name`` (as ``torch.cuda.get_device_name`` prints it), or None."""
    for words, flops, source in PEAKS:
        if all(word.lower() in device_name.lower() for word in words):
            return GpuPeak(device_name, flops, f"datasheet: {source}")
    return None


def measure_gemm_peak(device: torch.device | str, *, n: int = 8192, repeats: int = 10) -> float:
    """The best bf16 GEMM rate (FLOP/s) of ``repeats`` n x n x n products on ``device``, after a warm-up."""
    from repro.timing import time_iterations

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    timing = time_iterations(lambda: a @ b, device=device, warmup=3, iters=repeats)
    return 2.0 * n**3 / timing.min_s


def gpu_peak(device: torch.device | str) -> GpuPeak:
    """The peak of the GPU ``device``: from the table, else measured (and labelled so)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"gpu_peak needs a CUDA device, got {device}")
    name = torch.cuda.get_device_name(device)
    known = peak_from_table(name)
    if known is not None:
        return known
    return GpuPeak(name, measure_gemm_peak(device), "measured: best of 10 bf16 8192^3 GEMMs (not in the table)")
