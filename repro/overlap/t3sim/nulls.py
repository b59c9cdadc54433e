"""Naive models beside the model of T3's GPU: what a reviewer computes first without the model's mechanism, on the
same fitted GPU and the same workloads (a claim the model matches is decided only where these miss it;
``repro.verdicts`` makes an agreement whose null also agrees "not decisive").

* :func:`roofline_ideal_speedup`: ideal overlap of a GEMM at the GPU's peak FLOP rate (the fitted one) and an
  all-reduce at the link bandwidth: no tiles or waves, no L2, no ring latency or DRAM traffic (T3 Fig. 6's
  "potential speedup of ideal overlap");
* :func:`cu_ratio_split`: T3 Fig. 6's CU split by the plain CU ratio: the GEMM on ``CUs - c`` of the CUs takes
  ``CUs / (CUs - c)`` times as long, the all-reduce on ``c`` CUs the fitted 8-CU slowdown scaled by ``8 / c``
  (never faster than on all CUs): no wave quantisation, no step model of the collective;
* :func:`operands_once_reduction`: the data-movement reduction with every GEMM operand read once (dtype bytes x
  shape) beside the design's closed forms for writes and the reduce-scatter (``ring``): no L2 reuse model;
* :func:`flopwise_comm_share`: a layer's share of time in its all-reduces with its FLOPs at the GPU's peak and the
  all-reduces' bytes at the link bandwidth: no element-wise kernels, tiles, latency or DRAM traffic;
* :func:`amdahl_layer_speedup`: Amdahl's law with the share of the layer's time in T3's sublayers and their geomean
  speedup: what T3's end-to-end numbers are if they follow from its sublayer speedups alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.perfmodel.collectives import allgather_bytes_per_rank, reduce_scatter_bytes_per_rank

from .endtoend import layer_flops
from .fit import geomean
from .hardware import T3Gpu
from .schedules import Sublayer, SublayerResult
from .workloads import Model

#: the all-reduce CUs the fit's slowdown is measured at (T3 Fig. 6, ``cu_split_8cu_ar_slowdown``)
FITTED_AR_CUS = 8


def roofline_gemm_s(gpu: T3Gpu, sub: Sublayer) -> float:
    """The sublayer's GEMM at the GPU's peak FLOP rate."""
    return 2.0 * sub.m * sub.n * sub.k / gpu.peak_flops


def roofline_allreduce_s(gpu: T3Gpu, sub: Sublayer) -> float:
    """The sublayer's ring all-reduce (reduce-scatter + all-gather) at the link bandwidth, no latency."""
    message = sub.message_bytes(gpu)
    sent = reduce_scatter_bytes_per_rank(sub.ranks, message) + allgather_bytes_per_rank(sub.ranks, message)
    return sent / gpu.link_bandwidth


def roofline_ideal_speedup(gpu: T3Gpu, sub: Sublayer) -> float:
    """GEMM then all-reduce against both fully overlapped, each at its roofline."""
    gemm, allreduce = roofline_gemm_s(gpu, sub), roofline_allreduce_s(gpu, sub)
    return (gemm + allreduce) / max(gemm, allreduce)


@dataclass(frozen=True)
class CuRatioSplit:
    """T3 Fig. 6 by the plain CU ratio (module docstring): slowdowns as ratios, and the split's speedup."""

    gemm_slowdown: float
    allreduce_slowdown: float
    speedup: float


def cu_ratio_split(gemm_s: float, allreduce_s: float, *, num_cus: int, ar_cus: int,
                   fitted_ar8_slowdown: float) -> CuRatioSplit:
    """The CU split of a GEMM of ``gemm_s`` and an all-reduce of ``allreduce_s`` (each alone on all ``num_cus``)
    with the all-reduce on ``ar_cus`` CUs; ``fitted_ar8_slowdown``: the all-reduce on 8 CUs over all CUs (a ratio,
    the fitted 1.41)."""
    if not 1 <= ar_cus < num_cus:
        raise ValueError(f"ar_cus={ar_cus} must be in [1, {num_cus})")
    gemm = num_cus / (num_cus - ar_cus)
    allreduce = max(1.0, fitted_ar8_slowdown * FITTED_AR_CUS / ar_cus)
    return CuRatioSplit(gemm, allreduce, (gemm_s + allreduce_s) / max(gemm * gemm_s, allreduce * allreduce_s))


def operands_once_reduction(gpu: T3Gpu, sub: Sublayer, result: SublayerResult) -> float:
    """1 - T3's DRAM bytes / the baseline's (GEMM + reduce-scatter), the GEMM reading each operand once."""
    reads = float((sub.m * sub.k + sub.k * sub.n) * gpu.element_bytes)
    baseline = reads + result.gemm_write_bytes + result.rs_read_bytes + result.rs_write_bytes
    t3 = reads + result.t3_gemm_write_bytes + result.t3_rs_read_bytes + result.t3_rs_write_bytes
    return 1.0 - t3 / baseline


def flopwise_comm_share(gpu: T3Gpu, model: Model, tp: int, *, mode: str, allreduces: int) -> float:
    """Share of one layer's time in its ``allreduces`` all-reduces of ``[tokens x h]``: FLOPs at the GPU's peak,
    bytes at the link bandwidth."""
    message = float(model.tokens * model.hidden_size * gpu.element_bytes)
    sent = reduce_scatter_bytes_per_rank(tp, message) + allgather_bytes_per_rank(tp, message)
    comm = allreduces * sent / gpu.link_bandwidth
    return comm / (layer_flops(gpu, model, tp, mode=mode) / gpu.peak_flops + comm)


def amdahl_layer_speedup(sublayer_share: float, speedups) -> float:
    """Amdahl's law: a share ``sublayer_share`` of the layer's time sped up by the geomean of ``speedups``."""
    if not 0 <= sublayer_share <= 1:
        raise ValueError(f"sublayer_share={sublayer_share!r} must be in [0, 1]")
    return 1.0 / (1.0 - sublayer_share + sublayer_share / geomean(speedups))
