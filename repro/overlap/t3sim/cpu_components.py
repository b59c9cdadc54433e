"""Calibrate this CPU the way ``t3_overlap`` runs its sublayers: each component alone, one call after a barrier.

``t3_overlap`` times a sublayer's modes as single calls released by a barrier on both ranks at once, one compute
thread per rank, round after round, keeping each mode's fastest round of the slowest rank
(``repro.overlap.timing``). A calibration that repeats a kernel in a tight loop on warm caches
(``repro.perfmodel.cpu``) measures another regime: there the 2048-token GEMMs ran 1.3-2.4x faster than in
``t3_overlap``, and its all-reduce latency came from a GEMM / all-reduce pattern whose cost includes rank skew.
So the components here are measured with the very same timer (:func:`repro.overlap.timing.time_cases`: barrier,
one call, slowest rank, ``rounds`` rounds after ``warmup``, every round kept for ``cpu``'s round-by-round sums),
on ranks run as ``t3_overlap`` runs them (one compute thread each, pinned to a core of its own where there are
enough: ``repro.dist.affinity``), the modes' own tensors and layouts, fresh outputs where the layers allocate them,
and every collective blocking:

* each GEMM of a sublayer, whole and chunk-sized, into a preallocated output (``gemm_full``, ``gemm_chunk``) and
  as the layer runs it with a fresh output (``linear_full``; backward: ``weight_grad``, the dW GEMM);
* its element-wise work: the bias add of a forward sublayer (on the whole output, or this rank's shard of it
  with sequence parallelism), the bias-gradient sum of a backward one;
* its collective alone, whole and chunk-sized (``collective_full``, ``collective_chunk``), and ``num_chunks``
  chunk-sized collectives back to back (``collective_train``), blocking and asynchronous (``collective_async``:
  all launched, then all waited for);
* two probes of how a collective and a GEMM share the cores (``cpu.py``'s mechanism), on one chunk's GEMM and
  a collective of one chunk's size: the GEMM then its blocking collective (``gemm_then_collective``), and the GEMM
  while the collective (on a spare buffer) is in flight, waited for after it (``gemm_with_collective``).

None of these is a mode of ``t3_overlap`` (no sublayer's sequential, chunked or overlapped schedule is timed);
``gemm_full`` and ``collective_full`` are the same calls as its ``gemm`` and ``comm`` modes, measured again here.

``paired=True`` also times ``t3_overlap``'s own modes (``repro.overlap.timing.mode_cases``, the same closures) in
the same rounds, right after each sublayer's components: a measurement to compare the prediction with, taken
under the same load. This machine's timing floor drifts: in one process, the same OP GEMM call's fastest of 20
rounds was 1.85 ms, then 3.0 ms a minute later (2026-11-24), so a prediction compared with a measurement taken at
another time inherits that drift. The modes are never used by the prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from repro.dist import comm
from repro.dist.affinity import one_core_per_rank
from repro.dist.comm import CommGroup
from repro.overlap.chunking import row_chunks, sequence_chunk_shape
from repro.overlap.row_parallel import wait_all
from repro.overlap.sequence_parallel import chunk_rows

Case = tuple[Callable[[], None] | None, Callable[[], None]]
#: where every tensor here lives: this CPU's kernels are what is calibrated, on gloo ranks that
#: :func:`calibrate_components` spawns itself (gloo takes CPU tensors)
CPU = torch.device("cpu")


@dataclass(frozen=True)
class ComponentTimes:
    """Measured seconds of each component of each sublayer, every round kept (each round's time the slowest
    rank's): ``seconds[(sublayer, num_chunks)][component]`` is a tuple of ``rounds`` values, in round order."""

    seconds: tuple[tuple[tuple[str, int], tuple[tuple[str, tuple[float, ...]], ...]], ...]
    rounds: int
    warmup: int

    def of(self, sublayer: str, num_chunks: int) -> dict[str, float]:
        """Each component's fastest round (as ``t3_overlap`` summarises its modes), without the paired modes."""
        return {k: min(v) for k, v in self.rounds_of(sublayer, num_chunks).items()}

    def rounds_of(self, sublayer: str, num_chunks: int) -> dict[str, tuple[float, ...]]:
        """Each component's seconds in every round (what the prediction composes), without the paired modes."""
        return {k: v for k, v in self._all(sublayer, num_chunks).items() if not k.startswith(MODE_PREFIX)}

    def modes_of(self, sublayer: str, num_chunks: int) -> dict[str, float]:
        """``t3_overlap``'s modes timed in the same rounds, fastest round each (``paired``; empty otherwise)."""
        return {k[len(MODE_PREFIX):]: min(v) for k, v in self._all(sublayer, num_chunks).items()
                if k.startswith(MODE_PREFIX)}

    def _all(self, sublayer: str, num_chunks: int) -> dict[str, tuple[float, ...]]:
        return dict(dict(self.seconds)[(sublayer, num_chunks)])


def _collective(parallel: str, group: CommGroup) -> Callable[[torch.Tensor, torch.Tensor], object]:
    """``(output, input, async_op) -> handle``: all-reduce in place, or reduce-scatter (``row_sp``)."""
    if parallel == "row_sp":
        return lambda out, full, async_op=False: comm.reduce_scatter_tensor(out, full, group, async_op=async_op)
    return lambda out, full, async_op=False: comm.all_reduce(full, group, async_op=async_op)


def _collective_cases(parallel: str, group: CommGroup, full: torch.Tensor, chunks: list[torch.Tensor],
                      outs: list[torch.Tensor]) -> dict[str, Case]:
    """The sublayer's collective over ``full`` and over each chunk of it (``outs``: reduce-scatter outputs)."""
    run = _collective(parallel, group)
    whole_out = torch.empty(full.shape[0] // group.size, *full.shape[1:], device=CPU) if parallel == "row_sp" else full

    def train() -> None:
        for chunk, out in zip(chunks, outs):
            run(out, chunk)

    def launched() -> None:
        wait_all([run(out, chunk, async_op=True) for chunk, out in zip(chunks, outs)])

    return {"collective_full": (None, lambda: run(whole_out, full)),
            "collective_chunk": (None, lambda: run(outs[0], chunks[0])),
            "collective_train": (None, train), "collective_async": (None, launched)}


def _probe_cases(parallel: str, group: CommGroup, gemm: Callable[[], None], chunk: torch.Tensor,
                 out: torch.Tensor) -> dict[str, Case]:
    """A chunk's GEMM then its blocking collective, and the GEMM while a collective of the same size (on a
    separate buffer) is in flight."""
    run = _collective(parallel, group)
    spare, spare_out = chunk.clone(), out.clone()

    def then() -> None:
        gemm()
        run(out, chunk)

    def concurrent() -> None:
        handle = run(spare_out, spare, async_op=True)
        gemm()
        wait_all([handle])

    return {"gemm_then_collective": (None, then), "gemm_with_collective": (None, concurrent)}


def row_cases(in_features: int, out_features: int, group: CommGroup, tokens: int, num_chunks: int) -> dict[str, Case]:
    """OP / FC-2: ``[T, in/p] @ [in/p, out]`` (weight stored ``[out, in/p]``), then an all-reduce of ``[T, out]``."""
    tp = group.size
    x = torch.randn(tokens, in_features // tp, device=CPU)
    weight = torch.randn(out_features, in_features // tp, device=CPU)
    bias = torch.randn(out_features, device=CPU)
    out = torch.empty(tokens, out_features, device=CPU)
    blocks = row_chunks(tokens, num_chunks)
    first = blocks[0]
    cases = {
        "gemm_full": (None, lambda: torch.matmul(x, weight.t(), out=out)),
        "gemm_chunk": (None, lambda: torch.matmul(x[first], weight.t(), out=out[first])),
        "linear_full": (None, lambda: F.linear(x, weight)),
        "bias": (None, lambda: out + bias),
    }
    chunks = [out[block] for block in blocks]
    cases.update(_collective_cases("row", group, out, chunks, chunks))
    cases.update(_probe_cases("row", group, cases["gemm_chunk"][1], chunks[0], chunks[0]))
    return cases


def column_cases(in_features: int, out_features: int, group: CommGroup, tokens: int,
                 num_chunks: int) -> dict[str, Case]:
    """IP / FC-1 backward: ``dX = dY [T, out/p] @ W [out/p, in]`` (all-reduced), ``dW = dY^T @ X``, ``db``."""
    tp = group.size
    grad = torch.randn(tokens, out_features // tp, device=CPU)
    weight = torch.randn(out_features // tp, in_features, device=CPU)
    x, grad_x = torch.randn(tokens, in_features, device=CPU), torch.empty(tokens, in_features, device=CPU)
    blocks = row_chunks(tokens, num_chunks)
    first = blocks[0]
    cases = {
        "gemm_full": (None, lambda: torch.matmul(grad, weight, out=grad_x)),
        "gemm_chunk": (None, lambda: torch.matmul(grad[first], weight, out=grad_x[first])),
        "linear_full": (None, lambda: grad @ weight),
        "weight_grad": (None, lambda: grad.t() @ x),
        "bias": (None, lambda: grad.sum(0)),
    }
    chunks = [grad_x[block] for block in blocks]
    cases.update(_collective_cases("column", group, grad_x, chunks, chunks))
    cases.update(_probe_cases("column", group, cases["gemm_chunk"][1], chunks[0], chunks[0]))
    return cases


def row_sp_cases(in_features: int, out_features: int, group: CommGroup, tokens: int,
                 num_chunks: int) -> dict[str, Case]:
    """FC-2/RS: the row GEMM, then a reduce-scatter along the sequence; chunk ``c`` gathers its rows of every
    rank's shard (``chunk_rows``: a copy) before its GEMM."""
    tp = group.size
    x = torch.randn(1, tokens, in_features // tp, device=CPU)
    weight = torch.randn(out_features, in_features // tp, device=CPU)
    bias = torch.randn(out_features, device=CPU)
    full = torch.empty(tokens, out_features, device=CPU)
    _, n, length = sequence_chunk_shape(tokens, tp, num_chunks)
    x5 = x.view(1, tp, n, length, -1)
    partial = chunk_rows(x5, 0) @ weight.t()  # [tp * L, out]
    chunks = [partial.clone() for _ in range(n)]
    outs = [torch.empty(length, out_features, device=CPU) for _ in range(n)]
    shard = torch.empty(tokens // tp, out_features, device=CPU)
    cases = {
        "gemm_full": (None, lambda: torch.matmul(x[0], weight.t(), out=full)),
        "gemm_chunk": (None, lambda: chunk_rows(x5, 0) @ weight.t()),
        "linear_full": (None, lambda: F.linear(x[0], weight)),
        "bias": (None, lambda: shard + bias),  # the layer adds its bias to this rank's whole shard
    }
    cases.update(_collective_cases("row_sp", group, full, chunks, outs))
    cases.update(_probe_cases("row_sp", group, cases["gemm_chunk"][1], chunks[0], outs[0]))
    return cases


CASES = {"row": row_cases, "column": column_cases, "row_sp": row_sp_cases}


#: prefix of ``t3_overlap``'s own modes when they are timed in the same rounds as the components (``paired``)
MODE_PREFIX = "mode:"


def _measure_rank(rank: int, world_size: int, subs: tuple, rounds: int, warmup: int,
                  paired: bool = False) -> ComponentTimes:
    """On every rank: all components of all sublayers, interleaved round by round as ``t3_overlap`` does.
    ``paired``: ``t3_overlap``'s modes of each sublayer (``repro.overlap.timing``'s very closures) are timed in
    the same rounds, right after the sublayer's components, under the keys ``mode:<mode>``."""
    from repro.dist import init_parallel

    group = init_parallel(tp=world_size).tp
    with one_core_per_rank(rank, world_size):  # as t3_overlap's timing point runs its ranks
        return _measure(group, subs, rounds, warmup, paired)


def _measure(group: CommGroup, subs: tuple, rounds: int, warmup: int, paired: bool) -> ComponentTimes:
    from repro.overlap.timing import MODES, SublayerSpec, mode_cases, time_cases

    torch.manual_seed(0)
    cases: dict[str, Case] = {}
    for sub in subs:
        built = CASES[sub.parallel](sub.in_features, sub.out_features, group, sub.tokens, sub.num_chunks)
        cases.update({f"{sub.name}|{sub.num_chunks}|{name}": case for name, case in built.items()})
        if paired:
            spec = SublayerSpec(sub.name, sub.parallel, sub.in_features, sub.out_features)
            modes = mode_cases(spec, group, sub.tokens, sub.num_chunks, seed=0)
            cases.update({f"{sub.name}|{sub.num_chunks}|{MODE_PREFIX}{mode}": modes[mode] for mode in MODES})
    per_round = time_cases(cases, group, rounds=rounds, warmup=warmup).tolist()  # [cases, rounds]
    seconds: dict[tuple[str, int], dict[str, tuple[float, ...]]] = {}
    for key, values in zip(cases, per_round):
        name, chunks, component = key.split("|")
        seconds.setdefault((name, int(chunks)), {})[component] = tuple(values)
    return ComponentTimes(tuple((k, tuple(v.items())) for k, v in seconds.items()), rounds, warmup)


def calibrate_components(subs, *, world_size: int, rounds: int = 9, warmup: int = 2,
                         paired: bool = False) -> ComponentTimes:
    """Measure every component of ``subs`` (``cpu.CpuSublayer``) on ``world_size`` local gloo ranks, one compute
    thread each (as ``repro run`` spawns ``t3_overlap``'s ranks); ``paired`` also times ``t3_overlap``'s modes in
    the same rounds (``mode:*`` keys)."""
    from repro.dist.spawn import spawn

    return spawn(_measure_rank, world_size, tuple(subs), rounds, warmup, paired, backend="gloo",
                 timeout_s=600)[0]
