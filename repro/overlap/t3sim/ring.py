"""Ring reduce-scatter and all-gather between T3's GPUs: link time, DRAM reads and writes, CU throughput.

A buffer of ``n`` bytes on ``p`` ranks is cut into ``p`` chunks of ``c = n / p``. Reduce-scatter takes ``p - 1``
steps; in each, every rank sends one chunk to its ring neighbour and reduces the chunk it receives into its own, so
a rank sends ``(p - 1) / p x n`` bytes (``repro.perfmodel.collectives``). A step lasts the link latency plus the
slowest of: the link (``c / link_bandwidth``), the rank's DRAM traffic of the step, and, when the collective runs
as a kernel on ``cus`` CUs, the CUs' load/store throughput.

DRAM traffic per rank (T3 sec. 3-4; the closed forms of the data-movement claims):

* ``kernel`` (the baseline, an RCCL-style kernel after the GEMM): the first step reads the rank's chunk to send it;
  each of the ``p - 1`` received chunks lands in a receive buffer (a write), and is read back with the rank's own
  chunk to be reduced (two reads); the sum goes on to the next rank, except the last, which is written.
  Reads ``(2p - 1) c``, writes ``(p - 1) c + c = n``. The CUs load two chunks and store one per step.
* ``dma`` (T3): the GEMM's own stores are the rank's chunks; arriving chunks are added in memory by near-memory
  reduction (NMC), one update write each; a DMA engine reads each reduced chunk to send it. The first step's
  chunk is never read back: T3 maps the producer's first-stage stores to the neighbour's memory (as T3 describes its
  schedule, sec. 4), so reads are ``(p - 2) c`` and writes ``(p - 1) c`` of updates; the GEMM, whose first chunk
  went to the neighbour, writes ``(p - 1) c`` locally instead of ``n`` (charged to the GEMM by ``schedules``).

All-gather (``p - 1`` steps, each forwarding one chunk: read it, the neighbour writes it): reads and writes
``(p - 1) c``; it follows the reduce-scatter unchanged in every schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.perfmodel.collectives import allgather_bytes_per_rank, reduce_scatter_bytes_per_rank

from .hardware import T3Gpu

MODES = ("kernel", "dma")


@dataclass(frozen=True)
class RingCost:
    """One ring collective on one rank: steps, seconds per step, bytes sent, DRAM bytes read and written."""

    steps: int
    step_s: float
    sent_bytes: float
    read_bytes: float
    write_bytes: float

    @property
    def time_s(self) -> float:
        return self.steps * self.step_s


def _step_s(gpu: T3Gpu, chunk: float, dram: float, cu_bytes: float, *, cus: int | None,
            cu_bytes_per_cycle: float | None, hbm_efficiency: float) -> float:
    parts = [chunk / gpu.link_bandwidth, dram / (hbm_efficiency * gpu.hbm_bandwidth)]
    if cus is not None and cu_bytes_per_cycle is not None:
        parts.append(cu_bytes / (cus * cu_bytes_per_cycle * gpu.clock_hz))
    return gpu.link_latency + max(parts)


def _check(ranks: int, message_bytes: float, mode: str) -> None:
    if ranks < 2:
        raise ValueError(f"a ring needs ranks >= 2, got {ranks}")
    if message_bytes <= 0:
        raise ValueError(f"message_bytes must be > 0, got {message_bytes}")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")


def reduce_scatter(gpu: T3Gpu, *, message_bytes: float, ranks: int, mode: str = "kernel", cus: int | None = None,
                   cu_bytes_per_cycle: float | None = None, hbm_efficiency: float = 1.0) -> RingCost:
    """Ring reduce-scatter of an ``n = message_bytes`` buffer (module docstring). ``cus`` and
    ``cu_bytes_per_cycle`` bound a ``kernel`` by its CUs' throughput; ``hbm_efficiency`` is the fraction of HBM
    bandwidth the collective's traffic gets."""
    _check(ranks, message_bytes, mode)
    p, c = ranks, message_bytes / ranks
    if mode == "kernel":
        reads, writes = (2 * p - 1) * c, (p - 1) * c + c
    else:
        reads, writes = (p - 2) * c, (p - 1) * c
    dram_per_step = (reads + writes) / (p - 1)
    step = _step_s(gpu, c, dram_per_step, 3 * c, cus=cus, cu_bytes_per_cycle=cu_bytes_per_cycle,
                   hbm_efficiency=hbm_efficiency)
    return RingCost(p - 1, step, reduce_scatter_bytes_per_rank(p, message_bytes), reads, writes)


def all_gather(gpu: T3Gpu, *, message_bytes: float, ranks: int, cus: int | None = None,
               cu_bytes_per_cycle: float | None = None) -> RingCost:
    """Ring all-gather producing an ``n = message_bytes`` buffer on every rank."""
    _check(ranks, message_bytes, "kernel")
    p, c = ranks, message_bytes / ranks
    step = _step_s(gpu, c, 2 * c, 2 * c, cus=cus, cu_bytes_per_cycle=cu_bytes_per_cycle, hbm_efficiency=1.0)
    return RingCost(p - 1, step, allgather_bytes_per_rank(p, message_bytes), (p - 1) * c, (p - 1) * c)


def all_reduce_s(gpu: T3Gpu, *, message_bytes: float, ranks: int, cus: int | None = None,
                 cu_bytes_per_cycle: float | None = None) -> float:
    """Seconds of a ring all-reduce as a kernel: reduce-scatter then all-gather."""
    kwargs = dict(message_bytes=message_bytes, ranks=ranks, cus=cus, cu_bytes_per_cycle=cu_bytes_per_cycle)
    return reduce_scatter(gpu, mode="kernel", **kwargs).time_s + all_gather(gpu, **kwargs).time_s
