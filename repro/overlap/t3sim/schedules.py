"""Five schedules of one T3 sublayer (a GEMM whose ``[m x n]`` output is all-reduced over ``p`` ranks).

The all-reduce is a reduce-scatter (RS) then an all-gather (AG). T3 overlaps the GEMM with the RS only (its
"Ideal-GEMM-RS-Overlap" says so by name); the AG follows in every schedule, so every schedule ends with it:

* ``sequential``: GEMM, then RS and AG as kernels: ``G + RS + AG``.
* ``ideal``: GEMM and RS completely overlapped, nothing shared: ``max(G, RS) + AG``.
* ``t3``: the GEMM's tiles are issued in ``p`` stages of ``m / p`` rows; stage ``s``'s output tiles trigger RS step ``s`` on a
  DMA engine with near-memory reduction (``ring.reduce_scatter(mode="dma")``), step ``s`` starts when its stage is
  written and step ``s - 1`` is done (``repro.overlap.schedule.pipelined_time``). GEMM and DMA share the HBM
  without arbitration: their interleaved streams get a fraction ``contention`` of its bandwidth (row-buffer
  conflicts and read/write turnarounds; the one constant fitted on T3 without MCA).
* ``t3_mca``: the same with memory-controller arbitration: the GEMM's requests go first and the DMA's fill the gaps,
  so both streams keep their locality: the two share the full bandwidth.
* ``cu_split``: no DMA; the RS + AG kernels take ``c`` of the CUs and run beside the GEMM on the rest (T3 Fig. 6):
  ``max(G(CUs - c), AR(c))``.

Data movement (GEMM + RS DRAM bytes, the AG unchanged and left out): the baseline counts the GEMM's reads and
writes and the kernel RS's; T3 the same GEMM reads, ``(p - 1) / p`` of its writes (the first stage's go to the
neighbour) and the DMA RS's (``ring``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from repro.overlap.schedule import ideal_overlap_time, pipelined_time

from .gemm import GemmCost, gemm_cost
from .hardware import T3Gpu
from .ring import all_gather, all_reduce_s, reduce_scatter


@dataclass(frozen=True)
class Sublayer:
    """A producer GEMM ``[m x k] @ [k x n]`` whose ``[m x n]`` output is all-reduced over ``ranks`` GPUs."""

    name: str
    m: int
    n: int
    k: int
    ranks: int

    def message_bytes(self, gpu: T3Gpu) -> float:
        return float(self.m * self.n * gpu.element_bytes)


@dataclass(frozen=True)
class SublayerResult:
    """Seconds of each schedule and DRAM bytes of the baseline and of T3 (GEMM + RS)."""

    gemm_s: float
    rs_s: float
    rs_nmc_s: float
    ag_s: float
    sequential_s: float
    ideal_s: float
    t3_s: float
    t3_mca_s: float
    gemm_read_bytes: float
    gemm_write_bytes: float
    rs_read_bytes: float
    rs_write_bytes: float
    t3_gemm_write_bytes: float
    t3_rs_read_bytes: float
    t3_rs_write_bytes: float

    @property
    def baseline_bytes(self) -> float:
        return self.gemm_read_bytes + self.gemm_write_bytes + self.rs_read_bytes + self.rs_write_bytes

    @property
    def t3_bytes(self) -> float:
        return self.gemm_read_bytes + self.t3_gemm_write_bytes + self.t3_rs_read_bytes + self.t3_rs_write_bytes

    def speedup(self, schedule: str) -> float:
        """Sequential time / the schedule's time (``1.3`` = T3's "30 % faster")."""
        return self.sequential_s / getattr(self, f"{schedule}_s")


def _t3_time(gpu: T3Gpu, sub: Sublayer, gemm: GemmCost, *, efficiency: float) -> float:
    """Staged GEMM + DMA RS pipeline sharing the HBM at ``efficiency`` of its bandwidth.

    The GEMM stays one kernel whose tiles are issued chunk by chunk (T3 sec. 4.1), so stage ``s`` is written when
    the wave holding its last tile ends: ``ceil(s tiles / (p CUs))`` tile times, stretched when the HBM, shared
    with the DMA's traffic, cannot keep up."""
    p = sub.ranks
    rs = reduce_scatter(gpu, message_bytes=sub.message_bytes(gpu), ranks=p, mode="dma", hbm_efficiency=efficiency)
    # the GEMM's traffic interleaves with the DMA's while the RS runs (a fraction ``shared`` of the GEMM), and has
    # the HBM to itself afterwards
    shared = min(1.0, rs.time_s / gemm.compute_s)
    memory_s = ((shared * gemm.hbm_bytes + rs.read_bytes + rs.write_bytes) / (efficiency * gpu.hbm_bandwidth)
                + (1 - shared) * gemm.hbm_bytes / gpu.hbm_bandwidth)
    stretch = max(1.0, memory_s / gemm.compute_s)
    tile_s = gemm.compute_s / gemm.waves
    ends = [math.ceil(s * gemm.tiles / (p * gpu.num_cus)) * tile_s * stretch for s in range(1, p + 1)]
    stages = [end - before for end, before in zip(ends, [0.0, *ends[:-1]])]
    return pipelined_time(stages, [rs.step_s] * (p - 1) + [0.0])


def simulate_sublayer(gpu: T3Gpu, sub: Sublayer, *, contention: float) -> SublayerResult:
    """All schedules but CU-split (see :func:`cu_split`) of ``sub`` on ``gpu``; ``contention`` in (0, 1]."""
    if not 0 < contention <= 1:
        raise ValueError(f"contention={contention!r} must be in (0, 1]")
    gemm: GemmCost = gemm_cost(gpu, m=sub.m, n=sub.n, k=sub.k)
    message = sub.message_bytes(gpu)
    rs = reduce_scatter(gpu, message_bytes=message, ranks=sub.ranks, mode="kernel")
    rs_nmc = reduce_scatter(gpu, message_bytes=message, ranks=sub.ranks, mode="dma")
    ag = all_gather(gpu, message_bytes=message, ranks=sub.ranks).time_s
    g = gemm.time_s
    return SublayerResult(
        gemm_s=g, rs_s=rs.time_s, rs_nmc_s=rs_nmc.time_s, ag_s=ag, sequential_s=g + rs.time_s + ag,
        ideal_s=ideal_overlap_time(g, rs.time_s) + ag,
        t3_s=_t3_time(gpu, sub, gemm, efficiency=contention) + ag,
        t3_mca_s=_t3_time(gpu, sub, gemm, efficiency=1.0) + ag,
        gemm_read_bytes=gemm.read_bytes, gemm_write_bytes=gemm.write_bytes, rs_read_bytes=rs.read_bytes,
        rs_write_bytes=rs.write_bytes, t3_gemm_write_bytes=gemm.write_bytes * (sub.ranks - 1) / sub.ranks,
        t3_rs_read_bytes=rs_nmc.read_bytes, t3_rs_write_bytes=rs_nmc.write_bytes)


@dataclass(frozen=True)
class CuSplit:
    """T3 Fig. 6: the all-reduce as a kernel on ``ar_cus`` CUs beside the GEMM on the others."""

    gemm_s: float  # GEMM on all CUs
    allreduce_s: float  # all-reduce on all CUs
    gemm_split_s: float  # GEMM on the CUs left to it
    allreduce_split_s: float  # all-reduce on ``ar_cus`` CUs

    @property
    def ideal_speedup(self) -> float:
        """GEMM then all-reduce against both fully overlapped with all resources each."""
        return (self.gemm_s + self.allreduce_s) / ideal_overlap_time(self.gemm_s, self.allreduce_s)

    @property
    def speedup(self) -> float:
        return (self.gemm_s + self.allreduce_s) / max(self.gemm_split_s, self.allreduce_split_s)


def cu_split(gpu: T3Gpu, sub: Sublayer, *, ar_cus: int, cu_bytes_per_cycle: float) -> CuSplit:
    """``sub`` with its all-reduce on ``ar_cus`` CUs, each moving ``cu_bytes_per_cycle`` (the fitted constant)."""
    if not 1 <= ar_cus < gpu.num_cus:
        raise ValueError(f"ar_cus={ar_cus} must be in [1, {gpu.num_cus})")
    message = sub.message_bytes(gpu)

    def allreduce(cus: int) -> float:
        return all_reduce_s(gpu, message_bytes=message, ranks=sub.ranks, cus=cus, cu_bytes_per_cycle=cu_bytes_per_cycle)

    return CuSplit(gemm_s=gemm_cost(gpu, m=sub.m, n=sub.n, k=sub.k).time_s, allreduce_s=allreduce(gpu.num_cus),
                   gemm_split_s=gemm_cost(gpu, m=sub.m, n=sub.n, k=sub.k, cus=gpu.num_cus - ar_cus).time_s,
                   allreduce_split_s=allreduce(ar_cus))
