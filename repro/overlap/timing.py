"""Time one tensor-parallel sublayer four ways: GEMM alone, collective alone, sequential, overlapped.

T3 (Pati et al., ASPLOS'24, sec. 2) motivates overlap by the share of a sublayer's time spent in its collective and
measures the overlapped sublayer against the sequential one. The same four quantities are measured here on the
ranks of a real process group, plus a diagnostic fifth, ``chunked``: the overlapped layer's chunks run one after
the other with blocking collectives, which separates the cost of cutting the GEMM from the gain of overlapping it.
The modes are interleaved round by round (so drift in a shared machine's load hits
all of them alike). The device and dtype are chosen by the caller: on CPU (gloo) each mode is timed with
``time.perf_counter``, on CUDA (nccl) with CUDA events on the current stream after a device synchronisation and a
barrier, so the time is the GPU's (asynchronous collectives are waited for on that stream before the end event).
A round's time is the slowest rank's (it sets the step time); each mode is then summarised by its fastest round,
the usual estimator on a machine shared with other processes (their interference only ever adds time), and by its
median round, kept beside it.

Sublayers (T3's names; ``h`` hidden, ``f`` FFN size, ``T`` tokens):

* ``OP`` (row, h -> h) and ``FC-2`` (row, f -> h): forward, GEMM ``[T, in/tp] x [in/tp, h]`` then all-reduce of
  ``[T, h]``; sequential = :class:`~repro.tensor_parallel.RowParallelLinear`.
* ``IP`` (column, h -> 3h) and ``FC-1`` (column, h -> f): backward, GEMMs for dX and dW then all-reduce of dX
  ``[T, h]``; sequential = Megatron's f followed by a linear layer (``copy_to_tensor_parallel`` then
  ``F.linear``, i.e. :class:`~repro.tensor_parallel.ColumnParallelLinear`). Megatron's asynchronous all-reduce,
  which starts dX's all-reduce before the dW GEMM, is the overlapped layer with one chunk.
* ``FC-2/RS``: ``FC-2`` with sequence parallelism, GEMM then reduce-scatter along the sequence; sequential = the
  same layer with one chunk.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.dist.ledger import CollectiveLedger
from repro.overlap.chunking import row_chunks, sequence_chunk_shape
from repro.overlap.column_parallel import OverlappedColumnParallelLinear
from repro.overlap.row_parallel import OverlappedRowParallelLinear
from repro.overlap.schedule import equal_chunks_time, ideal_overlap_time, share_of_ideal_saving, speedup_percent
from repro.overlap.sequence_parallel import SequenceParallelRowLinear, chunk_rows
from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear, copy_to_tensor_parallel
from repro.timing import synchronize

MODES = ("gemm", "comm", "sequential", "chunked", "overlapped")


@dataclass(frozen=True)
class SublayerSpec:
    """A T3 sublayer: its name, how it is split (``row``, ``column`` or ``row_sp``) and its full shape."""

    name: str
    parallel: str
    in_features: int
    out_features: int

    def __post_init__(self) -> None:
        if self.parallel not in ("row", "column", "row_sp"):
            raise ValueError(f"parallel={self.parallel!r} must be 'row', 'column' or 'row_sp'")

    @property
    def timed_pass(self) -> str:
        return "backward" if self.parallel == "column" else "forward"


def transformer_sublayers(hidden_size: int, ffn_size: int | None = None) -> dict[str, SublayerSpec]:
    """T3's four communication-heavy sublayers of a transformer layer (plus FC-2 with sequence parallelism)."""
    ffn = 4 * hidden_size if ffn_size is None else ffn_size
    return {
        "OP": SublayerSpec("OP", "row", hidden_size, hidden_size),
        "FC-2": SublayerSpec("FC-2", "row", ffn, hidden_size),
        "IP": SublayerSpec("IP", "column", hidden_size, 3 * hidden_size),
        "FC-1": SublayerSpec("FC-1", "column", hidden_size, ffn),
        "FC-2/RS": SublayerSpec("FC-2/RS", "row_sp", ffn, hidden_size),
    }


@dataclass(frozen=True)
class SublayerTiming:
    """Measured seconds (fastest round, each round's time the slowest rank's) and what follows from them.
    ``median_s`` holds the median round of every mode, in :data:`MODES` order; ``paired_speedup_pct`` is the
    median over rounds of each round's sequential / overlapped ratio (the two run back to back in a round, so load
    that drifts over seconds cancels in the ratio)."""

    sublayer: str
    timed_pass: str
    tokens: int
    in_features: int
    out_features: int
    tp_size: int
    num_chunks: int
    rounds: int
    gemm_s: float
    comm_s: float
    sequential_s: float
    chunked_s: float
    overlapped_s: float
    median_s: tuple[float, ...] = ()
    paired_speedup_pct: float = float("nan")

    @property
    def comm_share(self) -> float:
        """Share of the isolated GEMM + collective time spent communicating (T3 sec. 2's motivation figure)."""
        return self.comm_s / (self.gemm_s + self.comm_s)

    @property
    def speedup_pct(self) -> float:
        """Overlapped against sequential, T3's sublayer-speedup convention."""
        return speedup_percent(self.sequential_s, self.overlapped_s)

    @property
    def ideal_s(self) -> float:
        return ideal_overlap_time(self.gemm_s, self.comm_s)

    @property
    def ideal_speedup_pct(self) -> float:
        """T3's Ideal-GEMM-RS-Overlap bound on these measured GEMM and collective times."""
        return speedup_percent(self.gemm_s + self.comm_s, self.ideal_s)

    @property
    def predicted_s(self) -> float:
        """The two-resource schedule (``schedule.equal_chunks_time``) on the measured times: what the chunking
        would give if compute and communication did not compete. Backward: dX chunks pipelined, dW trailing
        (the two GEMMs have equal FLOPs)."""
        if self.timed_pass == "backward":
            return equal_chunks_time(self.gemm_s / 2, self.comm_s, self.num_chunks, trailing=self.gemm_s / 2)
        return equal_chunks_time(self.gemm_s, self.comm_s, self.num_chunks)

    @property
    def realised_fraction(self) -> float:
        """Share of the ideal saving (sequential -> ideal) that overlapping realised; NaN when the measured
        sequential time is already at or below the ideal (noise, or a collective that costs nothing)."""
        if self.sequential_s <= self.ideal_s:
            return float("nan")
        return share_of_ideal_saving(self.sequential_s, self.overlapped_s, self.ideal_s)

    def as_dict(self) -> dict:
        plain = dataclasses.asdict(self)
        medians = plain.pop("median_s")
        for mode, value in zip(MODES, medians):
            plain[f"{mode}_median_s"] = value
        for name in ("comm_share", "speedup_pct", "ideal_s", "ideal_speedup_pct", "predicted_s", "realised_fraction"):
            plain[name] = getattr(self, name)
        return plain


def _timed(fn: Callable[[], None], group: CommGroup, prepare: Callable[[], None] | None,
           device: torch.device = torch.device("cpu")) -> float:
    if prepare is not None:
        prepare()
    if device.type == "cuda":  # the GPU's time: events on the current stream, all ranks released together
        synchronize(device)
        comm.barrier(group)
        synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    comm.barrier(group)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


Cases = dict[str, tuple[Callable[[], None] | None, Callable[[], None]]]


def mode_cases(spec: SublayerSpec, group: CommGroup, tokens: int, num_chunks: int, seed: int,
               device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32) -> Cases:
    """``{mode: (prepare, run)}`` closures for one sublayer on this rank. Layers are built on the CPU from ``seed``
    (the same weights whatever the device) and moved to ``device`` and ``dtype`` before their twins share them."""
    torch.manual_seed(seed)
    like = {"device": device, "dtype": dtype}

    def randn(*shape: int, requires_grad: bool = False) -> torch.Tensor:  # drawn on the CPU: same on any device
        return torch.randn(*shape, dtype=dtype).to(device).requires_grad_(requires_grad)

    build = {"column": _column_cases, "row": _row_cases}.get(spec.parallel, _sequence_cases)
    return build(spec, group, tokens, num_chunks, randn, like)


def _column_cases(spec: SublayerSpec, group: CommGroup, tokens: int, num_chunks: int, randn, like: dict) -> Cases:
    """A column-parallel linear (Megatron's f then the GEMM): its backward's dX all-reduce is what T3 overlaps."""
    tp = group.size
    plain = ColumnParallelLinear(spec.in_features, spec.out_features, group=group).to(**like)
    overlapped = OverlappedColumnParallelLinear.from_plain(plain, num_chunks=num_chunks)

    def sequential(inputs):  # f, then the GEMM: dX's all-reduce waits for both backward GEMMs
        return F.linear(copy_to_tensor_parallel(inputs, group), plain.weight, plain.bias)

    x = randn(tokens, spec.in_features, requires_grad=True)
    grad = randn(tokens, spec.out_features // tp)
    grad_x = torch.empty(tokens, spec.in_features, **like)
    state = {}

    def forward(layer):
        def prepare():
            x.grad = None
            plain.zero_grad(set_to_none=True)
            state["y"] = layer(x)
        return prepare

    def gemm():
        torch.matmul(grad, plain.weight.detach(), out=grad_x)
        grad.t() @ x.detach()

    def chunked():
        for block in row_chunks(tokens, num_chunks):
            torch.matmul(grad[block], plain.weight.detach(), out=grad_x[block])
            comm.all_reduce(grad_x[block], group)
        grad.t() @ x.detach()

    return {
        "gemm": (None, gemm),
        "comm": (None, lambda: comm.all_reduce(grad_x, group)),
        "sequential": (forward(sequential), lambda: state["y"].backward(grad)),
        "chunked": (None, chunked),
        "overlapped": (forward(overlapped), lambda: state["y"].backward(grad)),
    }


def _row_cases(spec: SublayerSpec, group: CommGroup, tokens: int, num_chunks: int, randn, like: dict) -> Cases:
    """A row-parallel linear: its forward's output all-reduce is what T3 overlaps."""
    plain = RowParallelLinear(spec.in_features, spec.out_features, group=group).to(**like)
    overlapped = OverlappedRowParallelLinear.from_plain(plain, num_chunks=num_chunks)
    x = randn(tokens, spec.in_features // group.size)
    out = torch.empty(tokens, spec.out_features, **like)

    def chunked():
        for block in row_chunks(tokens, num_chunks):
            torch.matmul(x[block], plain.weight.detach().t(), out=out[block])
            comm.all_reduce(out[block], group)

    return {
        "gemm": (None, lambda: torch.matmul(x, plain.weight.detach().t(), out=out)),
        "comm": (None, lambda: comm.all_reduce(out, group)),
        "sequential": (None, lambda: plain(x)),
        "chunked": (None, chunked),
        "overlapped": (None, lambda: overlapped(x)),
    }


def _sequence_cases(spec: SublayerSpec, group: CommGroup, tokens: int, num_chunks: int, randn,
                    like: dict) -> Cases:
    """A sequence-parallel row linear: its forward's reduce-scatter is what T3 overlaps."""
    tp = group.size
    sequential = SequenceParallelRowLinear(spec.in_features, spec.out_features, group=group, num_chunks=1)
    sequential = sequential.to(**like)
    overlapped = SequenceParallelRowLinear.from_plain(sequential, num_chunks=num_chunks)
    x = randn(1, tokens, spec.in_features // tp)
    full = torch.empty(tokens, spec.out_features, **like)
    shard = torch.empty(tokens // tp, spec.out_features, **like)
    _, n, length = sequence_chunk_shape(tokens, tp, num_chunks)
    x5 = x.view(1, tp, n, length, -1)
    shards = torch.empty(n, length, spec.out_features, **like)

    def chunked():  # the overlapped layer's chunks, each reduce-scatter waited for at once
        for chunk in range(n):
            partial = chunk_rows(x5, chunk) @ sequential.weight.detach().t()  # [tp * L, out]
            comm.reduce_scatter_tensor(shards[chunk], partial, group)

    return {
        "gemm": (None, lambda: torch.matmul(x[0], sequential.weight.detach().t(), out=full)),
        "comm": (None, lambda: comm.reduce_scatter_tensor(shard, full, group)),
        "sequential": (None, lambda: sequential(x)),
        "chunked": (None, chunked),
        "overlapped": (None, lambda: overlapped(x)),
    }


def time_cases(cases: Cases, group: CommGroup, *, rounds: int, warmup: int,
               device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """Seconds of each case's ``run`` per round, ``[cases, rounds]`` in the order of ``cases``, each the slowest
    rank's (all ranks must call it with the same cases). A round runs every case once, in order, each after its
    ``prepare`` and a barrier (so drift in a shared machine's load hits all cases alike); ``warmup`` rounds are
    run first and dropped. :func:`time_sublayer` times its modes with it, and so does the calibration that
    measures the modes' components the same way (``repro.overlap.t3sim.cpu_components``)."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    with torch.enable_grad():
        for round_index in range(warmup + rounds):
            for name, (prepare, run) in cases.items():
                elapsed = _timed(run, group, prepare, device)
                if round_index >= warmup:
                    samples[name].append(elapsed)
    per_round = torch.tensor([samples[name] for name in cases], dtype=torch.float64).to(device)  # nccl: on device
    comm.all_reduce(per_round, group, op=torch.distributed.ReduceOp.MAX)  # each round: the slowest rank
    return per_round.cpu()


def time_sublayer(
    spec: SublayerSpec, group: CommGroup, *, tokens: int, num_chunks: int, rounds: int = 10, warmup: int = 2,
    seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
) -> SublayerTiming:
    """Measure ``spec`` on every rank of ``group`` (all ranks must call it); returns the same timing on every rank.

    ``device``/``dtype``: where and in what precision the sublayer runs (``cuda:N`` with an nccl group, ``cpu``
    with gloo). The timing collectives go through a scratch ledger: the group's own ledger is left as it was.
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds={rounds} must be >= 1 and warmup={warmup} >= 0")
    if tokens < 1:
        raise ValueError(f"tokens={tokens} must be >= 1")
    group = dataclasses.replace(group, ledger=CollectiveLedger())
    device = torch.device(device)
    modes = mode_cases(spec, group, tokens, num_chunks, seed, device, dtype)
    per_round = time_cases({mode: modes[mode] for mode in MODES}, group, rounds=rounds, warmup=warmup,
                           device=device)  # [modes, rounds]
    fastest = per_round.min(dim=1).values.tolist()
    medians = tuple(statistics.median(row) for row in per_round.tolist())
    paired = statistics.median((per_round[MODES.index("sequential")] / per_round[MODES.index("overlapped")]).tolist())
    gemm_s, comm_s, sequential_s, chunked_s, overlapped_s = fastest
    return SublayerTiming(
        sublayer=spec.name, timed_pass=spec.timed_pass, tokens=tokens, in_features=spec.in_features,
        out_features=spec.out_features, tp_size=group.size, num_chunks=num_chunks, rounds=rounds,
        gemm_s=gemm_s, comm_s=comm_s, sequential_s=sequential_s, chunked_s=chunked_s,
        overlapped_s=overlapped_s, median_s=medians, paired_speedup_pct=(paired - 1.0) * 100.0,
    )
