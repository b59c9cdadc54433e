"""The same schedules on this machine: predict ``t3_overlap``'s CPU measurement of the overlapped sublayers.

This CPU is described by components measured the way ``t3_overlap`` runs them (``cpu_components``: one call
after a barrier on both ranks, one compute thread each, fastest round of the slowest rank): the sublayer's GEMMs
whole and chunk-sized, its element-wise work, its collective whole and chunk-sized, and two probes of one chunk:
its GEMM followed by its blocking collective, and its GEMM while a collective of its size is in flight. No
sequential, chunked or overlapped schedule of a sublayer is measured or fitted; the schedules are composed here.

A CPU has no DMA engine and no near-memory reduction: gloo's threads (a worker that runs the collective's
algorithm and reduction, a loop that reads the sockets) copy and reduce the data on the cores the GEMMs use (two
ranks, one compute thread each, on two cores). Probes on generic GEMMs (2026-11-24, quiet machine, fastest of 9
rounds, slowest rank) show what follows, and why ``t3_overlap`` measures overlapped >= sequential here:

* overlap hides nothing: a ~1.5 ms GEMM with a 512 KB all-reduce in flight took 2.05 ms, the GEMM (1.55 ms) plus
  the all-reduce alone (0.51 ms); with 2 MB, 3.99 ms against 3.04 + 1.17 ms. The collective is CPU work (its
  threads' run time is about its wall time) that takes turns with the GEMM on a busy core, so
  ``gemm_with_collective`` is measured, not ``max(gemm, collective)``;
* chunking adds collectives, each with its fixed cost: four 512 KB all-reduces cost more than one of 2 MB (0.51 ms
  each against 1.17 ms), and every one is a ping-pong whose thread hand-offs wait on a run queue (schedstat: ms of
  run delay per collective while six threads share two cores);
* a collective's time is heavy-tailed (four back-to-back 512 KB all-reduces: fastest round 2.6 ms, median 13 ms),
  so the fastest round of a schedule with ``n`` collectives lies further above the sum of its parts' fastest
  rounds than a schedule with one. This model sums fastest rounds and does not model that bias (it under-predicts
  ``chunked`` most);
* starting behind compute costs little in the fastest round (GEMM then a blocking 512 KB all-reduce: 1.91 ms
  against 1.55 + 0.51 ms; after 2 ms of sleep instead of compute: +0.8 ms, the idle core's wake-up), and is taken
  from the chunk probe (``gemm_then_collective``) rather than assumed.

The schedules, from those components (``n`` chunks; ``dW`` the trailing weight-gradient GEMM of a backward
sublayer; ``extra`` what a concurrent collective adds to a GEMM, ``gemm_with_collective - gemm_chunk``):

* ``gemm`` = ``gemm_full`` (+ ``weight_grad``); ``comm`` = ``collective_full`` (the modes' own calls, remeasured);
* ``sequential`` = ``linear_full`` (fresh output) + the collective behind it + the element-wise work (+ ``dW``),
  the collective's start-behind-compute cost taken from the chunk probe;
* ``chunked`` = ``n x gemm_then_collective`` (+ ``dW``): no overlap, each collective blocking behind its GEMM;
* ``overlapped`` = the pipeline: chunk 1's GEMM, then ``n - 1`` GEMMs each with the previous chunk's collective in
  flight, then the last collective behind the last GEMM; a backward sublayer's ``dW`` GEMM runs with the last
  collective in flight (``dW + extra``) instead. Plus the element-wise work.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cpu_components import ComponentTimes, calibrate_components

FP32 = 4


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

    @property
    def message_bytes(self) -> float:
        """Bytes of the collective's input on one rank: ``[T, h]`` fp32 (dX of a column sublayer)."""
        features = self.in_features if self.parallel == "column" else self.out_features
        return float(self.tokens * features * FP32)


def _after_compute(c: dict[str, float]) -> float:
    """Seconds a chunk's collective takes when it starts behind the chunk's GEMM (probe minus the GEMM alone)."""
    return c["gemm_then_collective"] - c["gemm_chunk"]


def _start_penalty(c: dict[str, float]) -> float:
    """What starting behind compute adds to a collective, over one released by a barrier (may be ~0)."""
    return _after_compute(c) - c["collective_chunk"]


def _concurrent_extra(c: dict[str, float]) -> float:
    """What a collective in flight adds to the GEMM it overlaps (its copies, wake-ups and slice-bound steps)."""
    return c["gemm_with_collective"] - c["gemm_chunk"]


def predict_components(sub: CpuSublayer, c: dict[str, float]) -> dict[str, float]:
    """Predicted seconds of ``gemm``, ``comm``, ``sequential``, ``chunked`` and ``overlapped`` from the measured
    components ``c`` of ``sub`` (module docstring)."""
    n = sub.num_chunks
    trailing = c.get("weight_grad", 0.0)  # backward sublayers: dW, no communication
    elementwise = c["bias"]
    sequential = c["linear_full"] + trailing + c["collective_full"] + _start_penalty(c) + elementwise
    chunked = n * c["gemm_then_collective"] + trailing
    pipeline = c["gemm_chunk"] + (n - 1) * c["gemm_with_collective"]
    tail = trailing + _concurrent_extra(c) if sub.parallel == "column" else _after_compute(c)
    return {"gemm": c["gemm_full"] + trailing, "comm": c["collective_full"], "sequential": sequential,
            "chunked": chunked, "overlapped": pipeline + tail + elementwise}


def predict_all(subs, *, world_size: int, rounds: int = 9, warmup: int = 2,
                paired: bool = False) -> tuple[dict[str, dict[str, float]], ComponentTimes]:
    """Calibrate the components of every sublayer at once (interleaved round by round), then predict each;
    ``paired`` also times ``t3_overlap``'s modes in the same rounds (``ComponentTimes.modes_of``)."""
    times = calibrate_components(subs, world_size=world_size, rounds=rounds, warmup=warmup, paired=paired)
    return {sub.name: predict_components(sub, times.of(sub.name, sub.num_chunks)) for sub in subs}, times
