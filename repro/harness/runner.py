"""Run an experiment's points on this machine and write their rows (the embedded default launcher).

A point with ``world_size == 1`` runs in this process; a larger one runs on ``world_size`` local processes with
torch.distributed initialised (``repro.dist.spawn``, gloo on CPU). Under srun or torchrun the worker
(:mod:`repro.harness.worker`) calls :func:`run_rank` directly on the rank it is. Either way rank 0's rows are
kept, stamped with provenance and appended to ``results/runs/<experiment>/<run_id>.jsonl``.

Re-running never overwrites: every run gets a new run id and file, and the newest run of a point wins in figures
and claims. ``force=True`` deletes the earlier runs of the same points once the new run has succeeded.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from repro import provenance as P
from repro import results as R
from repro.experiments.base import Experiment, Point, RunContext
from repro.vocabulary import Row
from repro.harness.machine_fit import NeedsGPU, TooFewGPUs, check_memory, resolve_device
from repro.optional import MissingPackage

Progress = Callable[[str], None]

#: Budget assumed for an experiment that declares none (seconds per scale; the analytic experiments take < 1 s); ``repro reproduce`` reports it.
DEFAULT_BUDGET_S = 10.0


#: the longest error a progress line shows; `repro run EXP --point P` prints a failed point's whole error
SHORT_ERROR_CHARS = 200


def short_error(message: str, run_args: str) -> str:
    """A failed point's error as the progress line shows it once: its first line, cut at
    :data:`SHORT_ERROR_CHARS` with a pointer to the command that prints all of it."""
    first = message.strip().splitlines()[0] if message.strip() else "(no message)"
    if len(first) <= SHORT_ERROR_CHARS:
        return first
    return f"{first[:SHORT_ERROR_CHARS].rstrip()}... (the whole error: repro run {run_args})"


def budget_for(experiment: Experiment, scale: str) -> tuple[float, bool]:
    """(budget in seconds, whether it was declared) of ``experiment`` at ``scale``."""
    declared = experiment.budget_s.get(scale)
    return (float(declared), True) if declared else (DEFAULT_BUDGET_S, False)


@dataclass(frozen=True)
class PointOutcome:
    """What happened to one point: ``ok``, ``failed``, ``needs GPU`` (skipped: no GPU here) or ``skipped`` (it
    needs more GPUs than this machine has; ``message`` says how many)."""

    point: str
    status: str
    rows: int
    elapsed_s: float
    message: str = ""


@dataclass(frozen=True)
class RunReport:
    """One run of (some points of) an experiment at one scale."""

    experiment: str
    scale: str
    run_id: str
    path: Path | None
    outcomes: tuple[PointOutcome, ...]
    elapsed_s: float
    budget_s: float | None
    replaced: tuple[Path, ...] = ()
    earlier: tuple[Path, ...] = ()

    @property
    def ok(self) -> bool:
        return all(o.status != "failed" for o in self.outcomes)

    @property
    def over_budget(self) -> bool:
        return self.budget_s is not None and self.elapsed_s > self.budget_s


@dataclass
class RowWriter:
    """Appends a point's rows to its run as ``run_point`` hands them over (:meth:`RunContext.emit_rows`), each with
    the provenance of that moment, and remembers which rows it wrote so that the runner writes the rest once.
    Built where the rows are made (rank 0 of a point, in whichever process runs it), from picklable values."""

    root: Path
    experiment: Experiment
    scale: str
    point: Point
    run_id: str
    device: str
    launcher: str
    started: float = field(default_factory=time.perf_counter)
    written: int = 0
    _ids: set[int] = field(default_factory=set)
    #: the rows written, kept alive so that no later row can reuse the id of one that was freed
    _kept: list[Row] = field(default_factory=list)

    def provenance(self) -> dict:
        return P.provenance(config=self.point.params, world_size=self.point.world_size, device=self.device,
                            elapsed_s=time.perf_counter() - self.started, launcher=self.launcher)

    def __call__(self, rows: list[Row]) -> None:
        rows = [row for row in rows if id(row) not in self._ids]
        for row in rows:
            R.check_row(row, metrics=self.experiment.metrics, where=f"{self.experiment.name}/{self.point.name}")
        if rows:
            R.append_rows(self.root, experiment=self.experiment.name, scale=self.scale, point=self.point.name,
                          run_id=self.run_id, rows=rows, prov=self.provenance())
        self._ids.update(id(row) for row in rows)
        self._kept.extend(rows)
        self.written += len(rows)

    def unwritten(self, rows: list[Row]) -> list[Row]:
        return [row for row in rows if id(row) not in self._ids]


def run_rank(experiment: Experiment, point: Point, ctx: RunContext) -> list[Row]:
    """Call ``run_point`` on this rank and validate what it returns."""
    rows = experiment.run_point(point, ctx)
    if not isinstance(rows, list):
        raise ValueError(f"{experiment.name}.run_point returned {type(rows).__name__}, expected a list of rows")
    for row in rows:
        R.check_row(row, metrics=experiment.metrics, where=f"{experiment.name}/{point.name}")
    return rows


def _run_with_writer(experiment: Experiment, point: Point, ctx: RunContext,
                     writer: RowWriter | None) -> tuple[list[Row], int]:
    """(rows not yet written, rows written early) of this rank."""
    if writer is None:
        return run_rank(experiment, point, ctx), 0
    rows = run_rank(experiment, point, replace(ctx, emit=writer))
    return writer.unwritten(rows), writer.written


def _spawned(rank: int, world_size: int, experiment: Experiment, point: Point, scale: str, device: str,
             scratch: str, writer: RowWriter | None = None) -> tuple[list[Row], int]:
    ctx = RunContext(scale=scale, rank=rank, world_size=world_size, device=device, scratch_dir=Path(scratch))
    return _run_with_writer(experiment, point, ctx, writer if rank == 0 else None)


def execute_point(experiment: Experiment, point: Point, scale: str, *, device: str, scratch_dir: Path,
                  timeout_s: float = 1800.0, writer: RowWriter | None = None) -> list[Row]:
    """Rank 0's rows of one point, run here (world size 1) or on local processes (world size > 1). With a
    ``writer``, the rows ``run_point`` emitted early are already in the run and left out here; ``writer.written``
    counts them."""
    if point.world_size == 1:
        ctx = RunContext(scale=scale, rank=0, world_size=1, device=device, scratch_dir=scratch_dir)
        return _run_with_writer(experiment, point, ctx, writer)[0]
    from repro.dist import spawn

    backend = "nccl" if device == "cuda" else "gloo"
    per_rank = spawn(_spawned, point.world_size, experiment, point, scale, device, str(scratch_dir), writer,
                     backend=backend, timeout_s=timeout_s)
    rows, early = per_rank[0]
    if writer is not None:
        writer.written = early  # the copy in rank 0's process wrote them
    return rows


def _rows_of(root: Path, experiment: str, run_id: str, point: str) -> int:
    """How many rows of ``point`` run ``run_id`` holds (those a failed point wrote before failing)."""
    path = R.run_path(root, experiment, run_id)
    return sum(r.get("point") == point for r in R.read_run(path)) if path.exists() else 0


def select_points(experiment: Experiment, scale: str, names: Iterable[str] | None = None) -> list[Point]:
    """The points of ``scale`` named in ``names`` (all when None), in declaration order."""
    points = list(experiment.points_for(scale))
    if names is None:
        return points
    names = list(names)
    for name in names:
        experiment.point_named(scale, name)  # raises with the known names
    return [p for p in points if p.name in names]


@dataclass(frozen=True)
class RunPlan:
    """What a run will do with each chosen point, decided before anything runs: its device (None: not run), and
    for the points that need more GPUs than this machine has, why they are skipped."""

    points: tuple[Point, ...]
    devices: dict[str, str | None]
    too_few: dict[str, str]


def plan_run(experiment: Experiment, scale: str, *, points: Sequence[str] | None = None, device: str = "auto",
             skip_needs_gpu: bool = False) -> RunPlan:
    """Every check of a run, for every point, before anything runs: the scale and the point names exist, each point
    has the device it needs (a point that needs a GPU raises :class:`NeedsGPU`, or is set aside with
    ``skip_needs_gpu``; with ``--device cuda`` one needing more GPUs than this machine has is set aside as skipped),
    and each point that will run fits in memory. A point set aside does not run, so its memory is not checked."""
    chosen = select_points(experiment, scale, points)
    devices: dict[str, str | None] = {}
    too_few: dict[str, str] = {}
    for point in chosen:
        try:
            devices[point.name] = resolve_device(device, point, experiment=experiment.name)
        except TooFewGPUs as err:  # --device cuda: the points that fit run, this one is reported as skipped
            devices[point.name], too_few[point.name] = None, str(err)
            continue
        except NeedsGPU:
            if not skip_needs_gpu:
                check_memory(experiment.name, scale, point)  # too little memory is the first thing to say
                raise
            devices[point.name] = None
            continue
        check_memory(experiment.name, scale, point)
    if too_few and len(too_few) == len(chosen):
        raise ValueError(next(iter(too_few.values())) + "; no chosen point fits this machine's GPUs")
    return RunPlan(tuple(chosen), devices, too_few)


def _run_point(experiment: Experiment, point: Point, scale: str, root: Path, run_id: str, point_device: str,
               timeout_s: float, label: str, say: Progress) -> tuple[PointOutcome, Path | None]:
    """Run one point in a scratch directory and append its rows to the run file: its outcome, and the run file
    when the point wrote to it. A point that raises is a ``failed`` outcome (the rows it wrote before are kept),
    except :class:`~repro.optional.MissingPackage`, which stops the run."""
    scratch = Path(tempfile.mkdtemp(prefix=f"repro-{experiment.name}-"))
    launcher = "local" if point.world_size == 1 else "local-spawn"
    writer = RowWriter(root, experiment, scale, point, run_id, point_device, launcher)
    t0 = time.perf_counter()
    try:
        rows = execute_point(experiment, point, scale, device=point_device, scratch_dir=scratch,
                             timeout_s=timeout_s, writer=writer)
    except MissingPackage:  # like a missing GPU: one line from the command (exit 2), not a failed point
        raise
    except Exception as err:  # noqa: BLE001 - a failing point is reported, the others still run
        elapsed = time.perf_counter() - t0
        message = f"{type(err).__name__}: {err}"
        kept = _rows_of(root, experiment.name, run_id, point.name)
        path = None
        if kept:
            path = R.run_path(root, experiment.name, run_id)
            message += f" ({kept} row(s) written before the failure are kept in {path.name})"
        again = f"{experiment.name} --scale {scale} --point {point.name}"
        say(f"  FAIL {label} after {elapsed:.1f} s: {short_error(message, again)}")
        return PointOutcome(point.name, "failed", kept, elapsed, message + "\n" + traceback.format_exc()), path
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    early = writer.written
    if rows or not early:
        prov = P.provenance(config=point.params, world_size=point.world_size, device=point_device,
                            elapsed_s=elapsed, launcher=launcher)
        R.append_rows(root, experiment=experiment.name, scale=scale, point=point.name, run_id=run_id,
                      rows=rows, prov=prov)
    say(f"  done {label}: {len(rows) + early} row(s) in {elapsed:.1f} s")
    return PointOutcome(point.name, "ok", len(rows) + early, elapsed), R.run_path(root, experiment.name, run_id)


def _replace_earlier(root: Path, experiment: str, scale: str, outcomes: list[PointOutcome], path: Path) -> list[Path]:
    """``--force``: the earlier run files of the points that ran ``ok`` this time, deleted (``path``, this run's
    file, kept); returns them."""
    done = {o.point for o in outcomes if o.status == "ok"}
    replaced = []
    for old in R.earlier_runs(root, experiment, scale, done):
        if old != path:
            old.unlink()
            replaced.append(old)
    return replaced


def run_experiment(
    experiment: Experiment,
    scale: str,
    *,
    points: Sequence[str] | None = None,
    results: Path | str | None = None,
    force: bool = False,
    device: str = "auto",
    run_id: str | None = None,
    skip_needs_gpu: bool = False,
    progress: Progress | None = None,
    timeout_s: float = 1800.0,
) -> RunReport:
    """Run the chosen points of ``experiment`` at ``scale`` locally and append their rows to a new run file.

    Checks come first, for every point, before anything runs (:func:`plan_run`). A point that raises is recorded
    as failed and the others still run, except for a point that needs an optional package that is not installed:
    its :class:`~repro.optional.MissingPackage` stops the run.
    """
    say = progress or (lambda message: None)
    root = R.results_dir(results)
    plan = plan_run(experiment, scale, points=points, device=device, skip_needs_gpu=skip_needs_gpu)
    chosen, devices, too_few = plan.points, plan.devices, plan.too_few
    earlier = R.earlier_runs(root, experiment.name, scale, [p.name for p in chosen])
    run_id = run_id or P.new_run_id()
    outcomes: list[PointOutcome] = []
    path: Path | None = None
    start = time.perf_counter()
    for index, point in enumerate(chosen, 1):
        label = f"{experiment.name}/{point.name} ({index}/{len(chosen)}, {point.world_size} rank(s))"
        point_device = devices[point.name]
        if point.name in too_few:
            outcomes.append(PointOutcome(point.name, "skipped", 0, 0.0, too_few[point.name]))
            say(f"  skip {label}: {too_few[point.name]}")
            continue
        if point_device is None:
            outcomes.append(PointOutcome(point.name, "needs GPU", 0, 0.0, "skipped: no GPU here"))
            say(f"  skip {label}: needs a GPU")
            continue
        say(f"  run  {label} on {point_device}")
        outcome, written = _run_point(experiment, point, scale, root, run_id, point_device, timeout_s, label, say)
        outcomes.append(outcome)
        path = written or path
    total = time.perf_counter() - start
    replaced = _replace_earlier(root, experiment.name, scale, outcomes, path) if force and path is not None else []
    kept = tuple(p for p in earlier if p not in replaced)
    budget, _ = budget_for(experiment, scale)
    return RunReport(experiment.name, scale, run_id, path, tuple(outcomes), total, budget, tuple(replaced), kept)
