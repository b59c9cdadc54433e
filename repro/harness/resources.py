"""What a point needs, checked here and asked of a cluster: memory, device, and its Slurm resources.

* Before a point starts: will it fit in this machine's memory, and does it have the device it needs? That is
  :mod:`repro.harness.machine_fit` (its names are importable from here too).
* On a cluster: :func:`resources_of` is a point's nodes, GPUs per node, CPUs per task, memory per node and time
  (declared on the point, or derived from its world size, memory and the scale's budget); :func:`jobs_for` groups
  a scale's points into the sbatch jobs that run them. The sbatch files and ``repro submit`` both read these, so a
  paper-scale point never runs with CI limits. Command-line overrides are validated by :func:`parse_overrides`
  and :func:`parse_time` (Slurm's time formats).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from repro.experiments.base import CPU_SCALES, Experiment, Point, Resources


# --- What a point asks of a cluster (DESIGN.md: "Resources are data too") ---------------------------------------
#
# ``resources_of(point)`` is the one place that turns a point's declaration into Slurm numbers; the sbatch files
# (repro.harness.sbatch) and ``repro submit`` (repro.harness.submit) both read it, and
# ``job_shapes`` groups the points of a scale into the jobs that run them.

#: Wall-clock budget assumed for a scale that declares none, when sizing a Slurm time limit (seconds).
UNDECLARED_SCALE_BUDGET_S = 600.0
#: A derived time limit is 3x the scale's budget (slow nodes, start-up), never under this many minutes.
MIN_TIME_MIN = 10
#: GPUs per node assumed for a point that needs GPUs but declares no resources (a DGX node).
DEFAULT_GPUS_PER_NODE = 8


def cpu_scale_of(experiment: Experiment) -> str:
    """The experiment's CPU-sized scale: ``ci`` where declared, else ``smoke`` (every experiment has one)."""
    for scale in CPU_SCALES:
        if scale in experiment.points:
            return scale
    raise ValueError(f"experiment {experiment.name!r} declares none of {list(CPU_SCALES)}")


def derived_time_min(experiment: Experiment | None, scale: str | None) -> int:
    """Time limit of a point without declared resources: 3x the budget of its whole scale (600 s when none is
    declared), at least ``MIN_TIME_MIN`` minutes. It covers every derived point of the scale run one after the
    other, so such times count once, not per point, in a job that runs several points (:func:`envelope`)."""
    budget = UNDECLARED_SCALE_BUDGET_S
    if experiment is not None and scale is not None and experiment.budget_s.get(scale):
        budget = float(experiment.budget_s[scale])
    return max(MIN_TIME_MIN, math.ceil(3 * budget / 60))


def _largest_divisor_up_to(number: int, limit: int) -> int:
    return max(d for d in range(1, min(number, limit) + 1) if number % d == 0)


def resources_of(point: Point, *, experiment: Experiment | None = None, scale: str | None = None) -> Resources:
    """``point.resources`` when declared; otherwise the derived default:

    * CPU points: one node, ``world_size`` tasks of 1 CPU, ``ceil(memory_gib x world_size)`` GiB;
    * points that ``needs_gpu``: one rank per GPU, up to ``DEFAULT_GPUS_PER_NODE`` per node (the largest divisor
      of ``world_size`` that fits, so ranks split evenly), ``ceil(memory_gib x ranks per node)`` GiB per node;
    * time: :func:`derived_time_min` of ``experiment`` at ``scale`` (30 minutes when they are not given).
    """
    if point.resources is not None:
        return point.resources
    ranks = point.world_size
    gpus = _largest_divisor_up_to(ranks, DEFAULT_GPUS_PER_NODE) if point.needs_gpu else 0
    nodes = ranks // gpus if gpus else 1
    per_node = ranks // nodes
    return Resources(nodes=nodes, gpus_per_node=gpus, cpus_per_task=1,
                     mem_gib=float(max(1, math.ceil(point.memory_gib * per_node))),
                     time_min=derived_time_min(experiment, scale))


def tasks_per_node(point: Point, resources: Resources) -> int:
    """Ranks per node: ``world_size / nodes`` (ValueError when they do not split evenly)."""
    if point.world_size % resources.nodes:
        raise ValueError(f"point {point.name!r}: {point.world_size} rank(s) do not split evenly over "
                         f"{resources.nodes} node(s); world_size must be a multiple of nodes")
    return point.world_size // resources.nodes


def resource_problems(experiment: Experiment) -> list[str]:
    """Declared resources that contradict the point they belong to (empty when all agree): ranks must split
    evenly over the nodes, at most one rank per GPU, a point that needs GPUs must ask for some, and the memory per
    node must hold its ranks' ``memory_gib``."""
    problems = []
    for scale, points in experiment.points.items():
        for point in points:
            if point.resources is None:
                continue
            where, res = f"{experiment.name}/{scale}/{point.name}", point.resources
            if point.world_size % res.nodes:
                problems.append(f"{where}: world_size {point.world_size} does not split over {res.nodes} nodes")
                continue
            per_node = point.world_size // res.nodes
            if res.gpus_per_node and per_node > res.gpus_per_node:
                problems.append(f"{where}: {per_node} ranks per node but {res.gpus_per_node} GPUs per node "
                                "(one rank per GPU)")
            if point.needs_gpu and not res.gpus_per_node:
                problems.append(f"{where}: needs_gpu but its resources ask for no GPUs")
            if res.mem_gib < point.memory_gib * per_node:
                problems.append(f"{where}: mem_gib {res.mem_gib:g} per node is less than {per_node} rank(s) x "
                                f"memory_gib {point.memory_gib:g}")
    return problems


# --- Slurm time limits --------------------------------------------------------------------------------------------

TIME_RULE = ("a Slurm time limit is MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (whole numbers; minutes and "
             "seconds < 60 after the first field, hours < 24 after a day count) and must be > 0")
_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                   r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")


def parse_time(text: str, *, option: str = "--time") -> int:
    """Minutes in a Slurm time limit (seconds round up to the next minute); ValueError naming the value and the
    rule otherwise (``0``, ``UNLIMITED`` and negative values are refused: a job needs a finite limit)."""
    match = _TIME.match(str(text).strip())
    bad = ValueError(f"{option} {text!r} is not a valid time limit: {TIME_RULE}")
    if match is None:
        raise bad
    fields = {key: int(value) for key, value in match.groupdict().items() if value is not None}
    if "days" in fields:
        hours, minutes, seconds = fields["dh"], fields.get("dm", 0), fields.get("ds", 0)
        if hours >= 24 or minutes >= 60 or seconds >= 60:
            raise bad
        total_s = ((fields["days"] * 24 + hours) * 60 + minutes) * 60 + seconds
    elif "c" in fields:  # HH:MM:SS
        if fields["b"] >= 60 or fields["c"] >= 60:
            raise bad
        total_s = (fields["a"] * 60 + fields["b"]) * 60 + fields["c"]
    elif "b" in fields:  # MM:SS
        if fields["b"] >= 60:
            raise bad
        total_s = fields["a"] * 60 + fields["b"]
    else:  # MM
        total_s = fields["a"] * 60
    if total_s <= 0:
        raise bad
    return math.ceil(total_s / 60)


def format_time(minutes: int) -> str:
    """``HH:MM:SS`` (hours may exceed 24; Slurm accepts it) of a limit in minutes."""
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


# --- Jobs: the points of a scale grouped by the resources they ask for -------------------------------------------


@dataclass(frozen=True)
class Overrides:
    """What the user changed on the command line (None: keep the declaration). ``mem_gib=0`` is Slurm's "all the
    memory of the node"; ``cpu`` asks for no GPUs (GPU points then run on CPU)."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_gib: int | None = None
    time_min: int | None = None
    partition: str | None = None
    cpu: bool = False


_PARTITION = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")


def _whole(option: str, value: object, minimum: int) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    rule = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
    if option == "--mem":
        text = text[:-1] if text[-1:] in ("G", "g") else text
        rule += " of GiB per node (0 = all the node's memory)"
    if not re.fullmatch(r"[+-]?\d+", text) or int(text) < minimum:
        raise ValueError(f"{option} {value!r} is not valid: it must be {rule}")
    return int(text)


def parse_overrides(*, nodes: object = None, gpus_per_node: object = None, cpus_per_task: object = None,
                    mem: object = None, time: object = None, partition: object = None, cpu: bool = False) -> Overrides:
    """Validate command-line overrides (strings or numbers); ValueError names the option, the value and the rule."""
    if partition is not None and not _PARTITION.match(str(partition)):
        raise ValueError(f"--partition {partition!r} is not valid: it must be a partition name (letters, digits, "
                         "'_', '.', '-'), or several separated by commas")
    return Overrides(
        nodes=_whole("--nodes", nodes, 1), gpus_per_node=_whole("--gpus-per-node", gpus_per_node, 0),
        cpus_per_task=_whole("--cpus-per-task", cpus_per_task, 1), mem_gib=_whole("--mem", mem, 0),
        time_min=None if time is None else parse_time(str(time)),
        partition=None if partition is None else str(partition),
        cpu=cpu)


@dataclass(frozen=True)
class Shape:
    """The resources of one Slurm job, as sbatch options take them."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    mem_gib: int  # per node; 0 = all of it
    time_min: int

    def options(self) -> list[str]:
        """``--nodes=.. --ntasks-per-node=.. [--gpus-per-node=..] --cpus-per-task=.. --mem=..G --time=HH:MM:SS``."""
        opts = [f"--nodes={self.nodes}", f"--ntasks-per-node={self.tasks_per_node}"]
        if self.gpus_per_node:
            opts.append(f"--gpus-per-node={self.gpus_per_node}")
        opts += [f"--cpus-per-task={self.cpus_per_task}", f"--mem={self.mem_gib}G" if self.mem_gib else "--mem=0",
                 f"--time={format_time(self.time_min)}"]
        return opts


def point_shape(experiment: Experiment, scale: str, point: Point, overrides: Overrides = Overrides()) -> Shape:
    """The job shape of one point: its :func:`resources_of` with the overrides applied (ValueError when they
    cannot hold the point). ``--gpus-per-node G`` alone re-derives the nodes (one rank per GPU); derived memory
    (no declared resources) follows the ranks per node, declared memory per node stays as declared."""
    res = resources_of(point, experiment=experiment, scale=scale)
    ranks = point.world_size
    gpus = 0 if overrides.cpu else (overrides.gpus_per_node if overrides.gpus_per_node is not None
                                    else res.gpus_per_node)
    if overrides.nodes is not None:
        nodes = overrides.nodes
        if ranks % nodes:
            raise ValueError(f"--nodes {nodes} does not fit point {point.name!r}: its {ranks} rank(s) must split "
                             f"evenly over the nodes (world_size a multiple of --nodes)")
    elif overrides.gpus_per_node and not overrides.cpu:
        nodes = next(n for n in range(math.ceil(ranks / gpus), ranks + 1) if ranks % n == 0)
    else:
        nodes = res.nodes
    per_node = ranks // nodes
    if ranks % nodes:
        raise ValueError(f"point {point.name!r}: {ranks} rank(s) do not split evenly over {nodes} node(s)")
    if gpus and per_node > gpus:
        raise ValueError(f"--nodes {nodes} is too few for point {point.name!r}: its {ranks} ranks need "
                         f"{math.ceil(ranks / gpus)} node(s) of {gpus} GPU(s) (one rank per GPU)")
    if overrides.mem_gib is not None:
        mem = overrides.mem_gib
    elif point.resources is None and per_node != ranks // res.nodes:  # derived memory follows the ranks per node
        mem = max(1, math.ceil(point.memory_gib * per_node))
    else:
        mem = math.ceil(res.mem_gib)
    return Shape(nodes=nodes, tasks_per_node=per_node, gpus_per_node=gpus,
                 cpus_per_task=overrides.cpus_per_task or res.cpus_per_task, mem_gib=mem,
                 time_min=overrides.time_min or res.time_min)


def envelope(experiment: Experiment, scale: str, points: Sequence[Point], overrides: Overrides = Overrides(), *,
             one_after_the_other: bool) -> Shape:
    """One shape that holds every point: the largest of each resource. Time: the longest point's when each point
    gets a job (array task) of its own; when one job runs them ``one_after_the_other``, declared times add up and
    derived ones (each already the whole scale's) count once."""
    shapes = [point_shape(experiment, scale, p, overrides) for p in points]
    if overrides.time_min or not one_after_the_other:
        time_min = max(s.time_min for s in shapes)
    else:
        declared = [s.time_min for p, s in zip(points, shapes) if p.resources is not None]
        derived = [s.time_min for p, s in zip(points, shapes) if p.resources is None]
        time_min = sum(declared) + max(derived, default=0)
    mems = [s.mem_gib for s in shapes]
    return Shape(nodes=max(s.nodes for s in shapes), tasks_per_node=max(s.tasks_per_node for s in shapes),
                 gpus_per_node=max(s.gpus_per_node for s in shapes),
                 cpus_per_task=max(s.cpus_per_task for s in shapes), mem_gib=0 if 0 in mems else max(mems),
                 time_min=time_min)


@dataclass(frozen=True)
class Job:
    """One sbatch submission: the points it runs (``indices`` into the scale's points), whether it is an array
    (one point per task, ``--array=<indices>``) and its shape."""

    scale: str
    points: tuple[str, ...]
    indices: tuple[int, ...]
    array: bool
    shape: Shape
    #: at most this many array tasks at once (Slurm's ``%N``); None: no limit
    max_parallel: int | None = None

    def array_spec(self) -> str:
        """``0-3``, ``0,2,5`` or ``0-2,7``: the indices as Slurm writes ranges."""
        runs: list[list[int]] = []
        for index in self.indices:
            if runs and index == runs[-1][-1] + 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        spec = ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
        return spec + (f"%{self.max_parallel}" if self.max_parallel else "")

    def options(self) -> list[str]:
        return ([f"--array={self.array_spec()}"] if self.array else []) + self.shape.options()


def jobs_for(experiment: Experiment, scale: str, names: Sequence[str] | None = None, *,
             overrides: Overrides = Overrides(), array: bool | None = None) -> list[Job]:
    """The jobs that run ``names`` (default: every point) of ``experiment`` at ``scale``.

    CPU scales (ci, smoke) are small: one job sized by the :func:`envelope` of the points, an array when there are
    several (``array=False``: every point one after the other in one job). Other scales (node, paper): one job per
    distinct shape (after the overrides), an array of that shape's points, so each point gets exactly the
    resources it declares. A job that runs only some points of the scale is always an array (its indices pick
    them); ``array=False`` is refused there.
    """
    every = list(experiment.points_for(scale))
    wanted = list(dict.fromkeys(names)) if names else [p.name for p in every]
    for name in wanted:
        experiment.point_named(scale, name)  # ValueError naming the known points
    chosen = [(i, p) for i, p in enumerate(every) if p.name in wanted]
    if scale in CPU_SCALES:
        groups = [chosen]
    else:
        by_shape: dict[Shape, list[tuple[int, Point]]] = {}
        for index, point in chosen:
            by_shape.setdefault(point_shape(experiment, scale, point, overrides), []).append((index, point))
        groups = list(by_shape.values())
    jobs = []
    for group in groups:
        whole = len(group) == len(every)
        if array is False and not whole:
            raise ValueError(
                f"--no-array runs every point of the scale in one job, but {experiment.name} at scale {scale!r} "
                f"needs {len(groups)} job(s) of different resources" + ("" if len(chosen) == len(every) else
                                                                        " or only some points are chosen")
                + ": drop --no-array")
        is_array = (not whole) or (len(group) > 1 if array is None else array)
        points = [p for _, p in group]
        shape = envelope(experiment, scale, points, overrides, one_after_the_other=not is_array)
        jobs.append(Job(scale, tuple(p.name for p in points), tuple(i for i, _ in group), is_array, shape))
    return jobs
