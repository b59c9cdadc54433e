"""The same schedules on this machine: predict ``t3_overlap``'s CPU measurement of the overlapped sublayers.

This CPU is described by components measured the way ``t3_overlap`` runs them (``cpu_components``: one call after a
barrier on both ranks, one compute thread each pinned to its own core, the slowest rank's time, every round kept):
the sublayer's GEMMs whole and chunk-sized, its element-wise work, its collective whole and chunk-sized, and two
probes of one chunk: its GEMM followed by its blocking collective, and its GEMM while a collective of its size is in
flight. No sequential, chunked or overlapped schedule of a sublayer is measured or fitted; the schedules are
composed here.

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
  so the fastest round of a schedule lies above the sum of its parts' fastest rounds: each part's luckiest round
  is a different round. The schedules are therefore summed round by round (below);
* starting behind compute costs little in the fastest round (GEMM then a blocking 512 KB all-reduce: 1.91 ms
  against 1.55 + 0.51 ms; after 2 ms of sleep instead of compute: +0.8 ms, the idle core's wake-up), and is taken
  from the chunk probe (``gemm_then_collective``) rather than assumed.

The schedules, from those components (``n`` chunks; ``dW`` the trailing weight-gradient GEMM of a backward
sublayer), each summed in every round and predicted by its fastest round:

* ``gemm`` = ``gemm_full`` (+ ``weight_grad``); ``comm`` = ``collective_full`` (the modes' own calls, remeasured);
* ``sequential`` = ``linear_full`` (fresh output) + the collective behind it + the element-wise work (+ ``dW``),
  the collective's start-behind-compute cost (a constant from the fastest rounds of the chunk probe, its GEMM and
  its collective) added;
* ``chunked`` = ``n x gemm_then_collective`` (+ ``dW``): no overlap, each collective blocking behind its GEMM;
* ``overlapped`` = the pipeline: chunk 1's GEMM, then ``n - 1`` GEMMs each with the previous chunk's collective in
  flight, then the last collective behind the last GEMM (``(n - 1) x gemm_with_collective +
  gemm_then_collective``); a backward sublayer's ``dW`` GEMM runs with the last collective in flight instead
  (``n x gemm_with_collective + dW``). Plus the element-wise work.

Why round by round: the components run in the same rounds as the modes they stand for (interleaved, each call
after a barrier), so one round's components sum to the schedule under that round's load, and the fastest of those
sums is the statistic ``t3_overlap`` reports. Summing each part's fastest round instead assumes every part had its
luckiest round at once (a lower bound); resampling each part's rounds independently assumes their noise is
unrelated, though load drifts over seconds and hits a round's parts alike (an upper bound). This choice was made on
development runs (2026-11-24, ``t3_overlap``'s ci shapes, 20 rounds, predicted against the paired modes, sequential
and overlapped of five sublayers), before the committed run: unpinned ranks, 5 runs: fastest rounds summed 42 of 50
within 20 % (geomean ratio 0.92), round by round 42 of 50 (0.98), independent resampling 31 of 50 (1.15); with each
rank's compute thread pinned to its own core (``repro.dist.affinity``, as ``t3_overlap`` now runs), 4 runs: 38 of 40
(0.95) and 39 of 40 (0.99). The spread that remains is the measurement's own: the same mode's fastest of 20 rounds
moved by up to +-15 % between runs (OP overlapped 5.64, 4.29, 5.11 ms unpinned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

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


def _start_penalty(fastest: Mapping[str, float]) -> float:
    """What starting behind compute adds to a collective, over one released by a barrier (may be ~0): the chunk
    probe's fastest round minus the fastest rounds of its GEMM and of its collective alone."""
    return fastest["gemm_then_collective"] - fastest["gemm_chunk"] - fastest["collective_chunk"]


def _per_round(c: Mapping[str, float | Sequence[float]]) -> dict[str, torch.Tensor]:
    """Each component's seconds per round as a float64 vector (a single number is one round)."""
    rounds = {k: torch.as_tensor(v, dtype=torch.float64).reshape(-1) for k, v in c.items()}
    if len({len(v) for v in rounds.values()}) != 1:
        raise ValueError(f"components have different round counts: { {k: len(v) for k, v in rounds.items()} }")
    return rounds


def predict_components(sub: CpuSublayer, c: Mapping[str, float | Sequence[float]]) -> dict[str, float]:
    """Predicted seconds of ``gemm``, ``comm``, ``sequential``, ``chunked`` and ``overlapped`` from the measured
    components ``c`` of ``sub``, each a number or its seconds in every round (module docstring): each schedule is
    summed round by round from its components and its fastest round is the prediction."""
    r = _per_round(c)
    n = sub.num_chunks
    trailing = r.get("weight_grad", torch.zeros(1, dtype=torch.float64))  # backward sublayers: dW, no communication
    penalty = _start_penalty({k: float(v.min()) for k, v in r.items()})
    if sub.parallel == "column":  # chunk 1's GEMM, then n - 1 with a collective in flight, then dW with the last
        pipeline = n * r["gemm_with_collective"] + trailing
    else:  # chunk 1's GEMM, n - 1 with a collective in flight, then the last collective behind the last GEMM
        pipeline = (n - 1) * r["gemm_with_collective"] + r["gemm_then_collective"]
    schedules = {
        "gemm": r["gemm_full"] + trailing,
        "comm": r["collective_full"],
        "sequential": r["linear_full"] + trailing + r["collective_full"] + penalty + r["bias"],
        "chunked": n * r["gemm_then_collective"] + trailing,
        "overlapped": pipeline + r["bias"],
    }
    return {name: float(per_round.min()) for name, per_round in schedules.items()}


def median_ratio(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """The median over repeats of ``predicted / measured``, each repeat's pair taken in the same rounds (the
    load of those rounds cancels in the ratio); the lower median for an even count."""
    if len(predicted) != len(measured) or not len(predicted):
        raise ValueError(f"need as many predictions as measurements (>= 1), got {len(predicted)} and {len(measured)}")
    ratios = sorted(p / m for p, m in zip(predicted, measured))
    return ratios[(len(ratios) - 1) // 2]


def predict_all(subs, *, world_size: int, rounds: int = 9, warmup: int = 2,
                paired: bool = False) -> tuple[dict[str, dict[str, float]], ComponentTimes]:
    """Calibrate the components of every sublayer at once (interleaved round by round), then predict each;
    ``paired`` also times ``t3_overlap``'s modes in the same rounds (``ComponentTimes.modes_of``)."""
    times = calibrate_components(subs, world_size=world_size, rounds=rounds, warmup=warmup, paired=paired)
    return {sub.name: predict_components(sub, times.rounds_of(sub.name, sub.num_chunks)) for sub in subs}, times
