"""The same schedules on this machine: predict ``t3_overlap``'s CPU measurement of the overlapped sublayers.

This CPU is described by its calibration (``repro.perfmodel.cpu.calibrate_cpu``: measured FLOP/s of every GEMM
shape the sublayers run, memory bandwidth, per-op overhead, and the gloo all-reduce's latency ``alpha`` and
bandwidth ``beta`` measured while ranks compute). Nothing is fitted to the sublayer measurements.

A CPU has no DMA engine and no near-memory reduction: gloo's threads move and reduce the data on the same cores
the GEMMs use (two ranks, one compute thread each, on two cores). In T3's terms every CU is shared, so:

The calibration is the fastest of three (:func:`best_calibration`), as the measurement keeps fastest rounds.

* ``gemm``: the sublayer's GEMMs (backward: input and weight gradients) at their measured rates;
* ``comm``: ``2 (p-1) alpha + 2 (p-1)/p n / beta`` for an all-reduce, half of each term for a reduce-scatter;
* ``sequential``: GEMM + collective + the element-wise work around them (bias add: one read and one write of the
  output) + a per-op overhead for each framework op;
* ``overlapped``: the chunked pipeline on shared cores. gloo's copies and reductions (the ``n / beta`` part) are
  work on the same cores as the GEMMs and add to them; its latency (``alpha``: waiting for the peer) is hidden
  behind the next chunk's GEMM, except the last chunk's, which only the weight-gradient GEMM of a backward
  sublayer can hide: ``sum(chunk GEMM + chunk copy work + ops) + max(trailing, last latency) + element-wise``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from repro.perfmodel.cpu import CPUCalibration, calibrate_cpu

GemmShape = tuple[int, int, int, int]
FP32 = 4
#: framework ops of the sequential sublayer (linear, collective, bias add / autograd bookkeeping) and per chunk
SEQUENTIAL_OPS, CHUNK_OPS = 4, 3


@dataclass(frozen=True)
class CpuSublayer:
    """A ``t3_overlap`` sublayer: ``parallel`` is "row" (OP, FC-2), "column" (IP, FC-1, backward) or "row_sp"."""

    name: str
    parallel: str
    in_features: int
    out_features: int
    tokens: int
    tp: int
    num_chunks: int

    def gemm_shapes(self, rows: int) -> list[GemmShape]:
        """(m, n, k, 1) of the GEMMs over ``rows`` tokens on one rank."""
        if self.parallel == "column":  # dX = dY [T x out/p] @ W [out/p x in]; dW = dY^T @ X (all rows at once)
            return [(rows, self.in_features, self.out_features // self.tp, 1)]
        return [(rows, self.out_features, self.in_features // self.tp, 1)]

    def weight_grad_shape(self) -> GemmShape:
        return (self.out_features // self.tp, self.in_features, self.tokens, 1)

    def all_shapes(self) -> list[GemmShape]:
        shapes = self.gemm_shapes(self.tokens) + self.gemm_shapes(self.tokens // self.num_chunks)
        return shapes + ([self.weight_grad_shape()] if self.parallel == "column" else [])

    @property
    def message_bytes(self) -> float:
        features = self.in_features if self.parallel == "column" else self.out_features
        return float(self.tokens * features * FP32)


def _gemm_s(shape: GemmShape, calibration: CPUCalibration) -> float:
    m, n, k, batch = shape
    rate = dict(calibration.measured_gemm_flops).get(shape, calibration.gemm_flops)
    return 2.0 * m * n * k * batch / rate


def _collective_parts(sub: CpuSublayer, message: float, calibration: CPUCalibration) -> tuple[float, float]:
    """(latency seconds, bandwidth seconds) of the sublayer's collective of ``message`` bytes."""
    p = sub.tp
    steps, volume = (p - 1, (p - 1) / p) if sub.parallel == "row_sp" else (2 * (p - 1), 2 * (p - 1) / p)
    return steps * calibration.allreduce_latency_s, volume * message / calibration.allreduce_bandwidth


def predict(sub: CpuSublayer, calibration: CPUCalibration) -> dict[str, float]:
    """Predicted seconds of ``gemm``, ``comm``, ``sequential`` and ``overlapped`` (module docstring)."""
    trailing = _gemm_s(sub.weight_grad_shape(), calibration) if sub.parallel == "column" else 0.0
    gemm = sum(_gemm_s(s, calibration) for s in sub.gemm_shapes(sub.tokens)) + trailing
    comm = sum(_collective_parts(sub, sub.message_bytes, calibration))
    elementwise = 2 * sub.message_bytes / calibration.memory_bandwidth
    chunk_gemm = sum(_gemm_s(s, calibration) for s in sub.gemm_shapes(sub.tokens // sub.num_chunks))
    chunk_latency, chunk_copy = _collective_parts(sub, sub.message_bytes / sub.num_chunks, calibration)
    overhead = calibration.op_overhead_s
    overlapped = (sub.num_chunks * (chunk_gemm + chunk_copy + CHUNK_OPS * overhead) + max(trailing, chunk_latency)
                  + elementwise)
    return {"gemm": gemm, "comm": comm, "sequential": gemm + comm + elementwise + SEQUENTIAL_OPS * overhead,
            "overlapped": overlapped}


def best_calibration(*, shapes, world_size: int, repeats: int = 3) -> CPUCalibration:
    """The fastest of ``repeats`` calibrations, field by field (highest rates, lowest costs): ``t3_overlap`` keeps
    each mode's fastest round, the usual estimator on a machine shared with other processes, whose interference
    only ever adds time; the description it is predicted from is estimated the same way. The all-reduce's latency
    and bandwidth stay a pair (one fit), from the run with the cheapest finite all-reduce."""
    runs = [calibrate_cpu(threads=1, world_size=world_size, gemm_shapes=shapes) for _ in range(repeats)]
    # alpha and beta come from one line fit each: keep the pair of the run whose all-reduce of a 1 MiB message is
    # cheapest, among runs with a finite bandwidth (a noisy fit can give a flat or falling line: beta = inf)
    finite = [r for r in runs if math.isfinite(r.allreduce_bandwidth) and r.allreduce_bandwidth > 0] or runs
    comm = min(finite, key=lambda r: r.allreduce_latency_s + (1 << 20) / r.allreduce_bandwidth)
    rates = {shape: max(dict(r.measured_gemm_flops)[shape] for r in runs) for shape in dict(runs[0].measured_gemm_flops)}
    return CPUCalibration(
        gemm_flops=max(r.gemm_flops for r in runs), memory_bandwidth=max(r.memory_bandwidth for r in runs),
        rng_seconds_per_element=min(r.rng_seconds_per_element for r in runs),
        math_seconds_per_element=min(r.math_seconds_per_element for r in runs),
        op_overhead_s=min(r.op_overhead_s for r in runs), allreduce_latency_s=comm.allreduce_latency_s,
        allreduce_bandwidth=comm.allreduce_bandwidth, threads=1,
        measured_gemm_flops=tuple(rates.items()), concurrent_ranks=world_size)
