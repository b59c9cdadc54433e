"""The same schedules on this machine: predict ``t3_overlap``'s CPU measurement of the overlapped sublayers.

This CPU is described by components measured the way ``t3_overlap`` runs them (``cpu_components``: one call
after a barrier on both ranks, one compute thread each, fastest round of the slowest rank): the sublayer's GEMMs
whole and chunk-sized, its element-wise work, its collective whole and chunk-sized, and two probes of one chunk:
its GEMM followed by its blocking collective, and its GEMM while a collective of its size is in flight. No
sequential, chunked or overlapped schedule of a sublayer is measured or fitted; the schedules are composed here.

A CPU has no DMA engine and no near-memory reduction: gloo's threads (a worker that runs the collective's
algorithm and reduction, a loop that reads the sockets) copy and reduce the data on the cores the GEMMs use (two
ranks, one compute thread each, on two cores). A collective is a ping-pong with the peer rank, so each of its steps
waits until both ranks' gloo threads are running. Two things follow that T3's GPU does not have:

* a collective that starts behind a GEMM costs more than one released by a barrier (the ranks leave the GEMM
  apart, and the early one's threads sleep and are woken again): ``gemm_then_collective - gemm_chunk`` per chunk,
  not ``collective_chunk``;
* a collective in flight during a GEMM does not run beside it: its threads take turns with the GEMM's thread on a
  busy core, and the scheduler lets the running GEMM finish its time slice before a woken gloo thread runs, so the
  collective's steps progress one slice at a time and its copies add to the GEMM: ``gemm_with_collective``, not
  ``max(gemm, collective)``.

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


def predict_all(subs, *, world_size: int, rounds: int = 9) -> tuple[dict[str, dict[str, float]], ComponentTimes]:
    """Calibrate the components of every sublayer at once (interleaved round by round), then predict each."""
    times = calibrate_components(subs, world_size=world_size, rounds=rounds)
    return {sub.name: predict_components(sub, times.of(sub.name, sub.num_chunks)) for sub in subs}, times
