"""The experiment contract: every paper figure or table is one module that declares its points as data.

A module in ``repro.experiments`` exposes ``EXPERIMENT`` (or ``EXPERIMENTS``, a tuple) of type :class:`Experiment`.
Discovery is by walking the package, so adding an experiment never edits a shared list.

Data flows one way (DESIGN.md): ``Experiment.points[scale]`` -> ``run_point`` (on every rank, local processes or
srun) -> result rows (plain dicts, rank 0's are kept) -> provenance added by the runner -> JSONL under ``results/``
-> pandas -> figures and the claims report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from repro.vocabulary import ClaimCheck, Row

#: ``ci``: CPU scale of the CPU experiments (``repro reproduce --scale ci``); ``smoke``: the GPU experiments' toy size,
#: the same code as ``paper`` run on CPU in CI; ``node``: one GPU node (up to 8 GPUs); ``paper``: the paper's scale.
SCALES = ("ci", "smoke", "node", "paper")
#: Every experiment declares ``paper`` and at least one of these CPU-sized scales.
CPU_SCALES = ("ci", "smoke")


@dataclass(frozen=True)
class Resources:
    """What one point asks of a cluster, as Slurm sees it: the sbatch header and ``repro submit`` derive from it.

    ``world_size = nodes x tasks per node``; with GPUs there is one task (rank) per GPU. ``mem_gib`` is host memory
    per node, ``time_min`` the wall-clock limit in minutes.
    """

    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_gib: float = 4.0
    time_min: int = 30

    def __post_init__(self) -> None:
        for name in ("nodes", "cpus_per_task", "time_min"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Resources.{name}={value!r} must be a positive integer")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ValueError(f"Resources.gpus_per_node={self.gpus_per_node!r} must be an integer >= 0")
        if not self.mem_gib > 0:
            raise ValueError(f"Resources.mem_gib={self.mem_gib!r} must be > 0")


@dataclass(frozen=True)
class Point:
    """One configuration of an experiment.

    ``params`` is the configuration (JSON-serialisable); ``world_size`` is how many ranks the point needs;
    ``needs_gpu`` marks points that cannot run on a CPU (their claims get the verdict "needs GPU");
    ``memory_gib`` is the estimated peak host memory per rank, checked before starting; ``resources``, when given,
    is what the point asks of a Slurm cluster (nodes, GPUs, CPUs, memory, time); ``None`` means one node sized from
    ``world_size`` and ``memory_gib``.
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    world_size: int = 1
    needs_gpu: bool = False
    memory_gib: float = 0.5
    resources: Resources | None = None


@dataclass(frozen=True)
class RunContext:
    """What ``run_point`` is handed: where it runs and where it may write scratch files."""

    scale: str
    rank: int
    world_size: int
    device: str  # "cpu" or "cuda"
    scratch_dir: Path
    #: Writes rows to the run now (set by the runner on rank 0; None: only the returned rows are written).
    emit: Callable[[list[dict[str, Any]]], None] | None = None

    def emit_rows(self, rows: list[dict[str, Any]]) -> None:
        """Write ``rows`` to the run now, so that they survive if the point is stopped later (a time limit, a
        crash in a later variant). ``run_point`` still returns every row; the runner writes each row once."""
        if self.emit is not None and self.rank == 0:
            self.emit(rows)


#: Name prefix of the modules loaded from a ``.py`` path (``REPRO_EXTRA_EXPERIMENTS``).
EXTRA_MODULE_PREFIX = "_repro_extra_"


def _experiment_from_file(path: str, name: str) -> "Experiment":
    """The experiment ``name`` declared by the ``.py`` file at ``path`` (how such an experiment is unpickled)."""
    # the registry imports this module: import when called
    from repro.experiments import declared_experiments, load_extra_experiments

    for experiment in declared_experiments(load_extra_experiments(path)):
        if experiment.name == name:
            return experiment
    raise ValueError(f"{path} declares no experiment named {name!r}")


@dataclass(frozen=True)
class Experiment:
    """A paper figure or table, as data.

    ``run_point(point, ctx) -> list[Row]`` is called on every rank with torch.distributed initialised when
    ``point.world_size > 1``; rows are dicts with at least ``metric``, ``value`` and ``unit``.
    ``claims(rows) -> list[ClaimCheck]`` maps the experiment's rows (a pandas DataFrame, possibly empty) onto
    claim ids of ``paper_claims.csv``.
    ``figure(rows, paper_claims, out_dir) -> list[Path]`` draws paper vs reproduced (optional).

    Optional, for the runner and ``repro reproduce``:
    ``budget_s[scale]`` is the wall-clock budget of the whole scale in seconds (the ``ci`` budgets of all
    experiments together must stay under 20 minutes on 2 CPU cores); ``metrics``, when given, lists every
    ``metric`` its rows may carry, and the runner rejects a row with any other metric; ``decided_at`` names the
    claims only one scale can decide; ``data`` names the data sets its points read (``repro data fetch --only``
    names: tokenizers, lambada, wikitext103, race), so ``repro reproduce`` sets it aside, saying so in one line,
    where they are not in the data directory.
    """

    name: str
    paper: str
    title: str
    points: Mapping[str, Sequence[Point]]
    run_point: Callable[[Point, RunContext], list[Row]]
    claims: Callable[[Any], list[ClaimCheck]] | None = None
    figure: Callable[[Any, Any, Path], list[Path]] | None = None
    description: str = ""
    budget_s: Mapping[str, float] = field(default_factory=dict)
    metrics: Sequence[str] = ()
    #: claim id -> the only scale whose rows can decide it (e.g. a model larger than memory needs the paper-scale
    #: point); at any other scale the claim is "not decidable", and the report takes its verdict from that scale's
    #: rows where they exist. Claims not listed are decided at every scale.
    decided_at: Mapping[str, str] = field(default_factory=dict)
    #: the data sets every point reads from the data directory (:data:`repro.text.data_files.DATASETS`' names)
    data: Sequence[str] = ()

    def __reduce_ex__(self, protocol):
        """Ranks started from a forkserver or by spawn receive the experiment pickled. One loaded from a ``.py``
        path (``REPRO_EXTRA_EXPERIMENTS``) lives in a module no other process can import by name, so it travels as
        (file, name) and is loaded from the file again there."""
        module = sys.modules.get(getattr(self.run_point, "__module__", "") or "")
        if module is not None and module.__name__.startswith(EXTRA_MODULE_PREFIX) and getattr(module, "__file__", ""):
            return _experiment_from_file, (module.__file__, self.name)
        return object.__reduce_ex__(self, protocol)

    def points_for(self, scale: str) -> Sequence[Point]:
        if scale not in self.points:
            raise ValueError(
                f"experiment {self.name!r} has no scale {scale!r}; it declares {sorted(self.points)}"
            )
        return self.points[scale]

    def point_named(self, scale: str, name: str) -> Point:
        """The point called ``name`` at ``scale`` (ValueError naming the known points otherwise)."""
        points = self.points_for(scale)
        for point in points:
            if point.name == name:
                return point
        raise ValueError(
            f"experiment {self.name!r} has no point {name!r} at scale {scale!r}; "
            f"it declares {[p.name for p in points]}"
        )
