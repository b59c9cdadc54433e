"""``repro submit``: size Slurm jobs for an experiment from its points' resources, sbatch its file, and
(optionally) wait for the verdict.

Sizing reads :func:`repro.harness.resources.resources_of` (what each point declares, or the derived default)
and :func:`~repro.harness.resources.jobs_for` groups the points into jobs:

* ``node`` and ``paper`` scales: one job per distinct resource shape (nodes, tasks per node, GPUs per node, CPUs
  per task, memory per node, time); a job is a Slurm array over the indices of its points (``--array=0,2,5``), so
  every point runs with exactly the resources it declares. A scale whose points all share one shape is one job.
* ``ci`` and ``smoke`` scales (small, CPU): one job whose resources hold every point (the largest of each), an
  array when there are several points, or all points one after the other with ``--no-array``; this is also what
  the ``#SBATCH`` header of ``slurm/<experiment>.sbatch`` asks for.

Every job gets ``--nodes``, ``--ntasks-per-node`` (= world size / nodes), ``--gpus-per-node`` (omitted when 0),
``--cpus-per-task``, ``--mem=<N>G`` (per node) and ``--time=HH:MM:SS``. Overrides (``--nodes``,
``--gpus-per-node``, ``--cpus-per-task``, ``--mem``, ``--time``, ``--partition``, ``--cpu``) are validated
before anything is written (:func:`~repro.harness.resources.parse_overrides`, bounded by :data:`LIMITS`, the
fields Slurm keeps them in); ``--dry-run`` prints the
sbatch command lines and needs no Slurm. Over-large requests are refused by sbatch at submit time (the local Slurm
sets EnforcePartLimits=ALL) instead of waiting forever.

Waiting polls ``squeue`` (``sbatch --wait`` notices the end late), says every state change of a job or array task
as it happens and, between changes, how long it has waited; then it reads the final state, exit code and log path
from ``scontrol show job`` (or ``sacct -c`` without a database).
"""

from __future__ import annotations

import dataclasses

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from repro.checkout import in_checkout
from repro.experiments.base import Experiment
from repro.harness.resources import Job, Overrides, jobs_for, parse_overrides
from repro.harness.sbatch import SLURM_DIR, log_name, sbatch_path, write
from repro.assets import project_root
from repro.results import RESULTS_ENV, results_dir


class SlurmMissing(RuntimeError):
    """sbatch (or squeue/scontrol) is not on PATH."""


class SubmitError(RuntimeError):
    """sbatch refused the job (its message says why: too many resources, bad partition, ...)."""


def require(tool: str = "sbatch") -> str:
    path = shutil.which(tool)
    if path is None:
        # the local test cluster's script is in the repository, not in a wheel: named where it exists
        local = ("start the local test cluster with `sudo slurm/local/start.sh`" if in_checkout() else
                 "start a local test cluster with slurm/local/start.sh from a checkout of the repository")
        raise SlurmMissing(
            f"`{tool}` is not on PATH: `repro submit` needs a Slurm cluster. Run locally with "
            "`repro run EXP --scale ci`, print the commands with `repro submit EXP --dry-run`, or " + local
        )
    return path


#: sbatch options that ``repro submit`` sets itself (from the points' resources or its own options): name -> what to
#: use instead. An ``--sbatch-arg`` naming one is refused, since sbatch would silently take one of the two.
OWN_OPTIONS = {
    "--nodes": "--nodes", "-N": "--nodes", "--ntasks-per-node": "the points' world sizes (repro list --scale S)",
    "--ntasks": "the points' world sizes (repro list --scale S)", "-n": "the points' world sizes",
    "--gpus-per-node": "--gpus-per-node", "--gres": "--gpus-per-node", "--cpus-per-task": "--cpus-per-task",
    "-c": "--cpus-per-task", "--mem": "--mem", "--time": "--time", "-t": "--time", "--partition": "--partition",
    "-p": "--partition", "--array": "--array / --no-array (and --max-parallel N for a throttle, %N)",
    "-a": "--array / --no-array (and --max-parallel N)",
    "--output": "--results-dir (logs go to <results>/slurm-logs/repro-EXP-<job id>[_<task>].out)",
    "-o": "the log name repro submit gives", "--parsable": "nothing (repro submit always passes it)",
    "--wait": "repro submit --wait", "-W": "repro submit --wait",
    "--mem-per-cpu": "--mem (GiB per node)", "--mem-per-gpu": "--mem (GiB per node)",
    "--gpus": "--gpus-per-node", "-G": "--gpus-per-node", "--gpus-per-task": "--gpus-per-node",
    "--gpus-per-socket": "--gpus-per-node", "--cpus-per-gpu": "--cpus-per-task",
    "--wrap": "nothing (the job runs slurm/EXP.sbatch; repro run EXP runs the points here)",
    "--chdir": "nothing (the job runs in the checkout, REPRO_ROOT; --results-dir says where results go)",
    "-D": "nothing (the job runs in the checkout, REPRO_ROOT; --results-dir says where results go)",
}
#: ``--export`` must keep the caller's environment (``ALL``): the job reads REPRO_ROOT, REPRO_RESULTS_DIR and
#: REPRO_DEVICE from it.
EXPORT_RULE = ("--export must keep the environment, the job reads REPRO_ROOT and REPRO_RESULTS_DIR from it: write "
               "--sbatch-arg=--export=ALL,NAME=value")


def check_sbatch_arg(text: str | list[str]) -> str:
    """One extra sbatch option as ``--name=value`` or ``--flag``; ValueError naming it and the rule otherwise.

    argparse hands over ``--sbatch-arg=--`` as an empty list (it drops a lone ``--``): that is refused as ``--``."""
    if not isinstance(text, str):
        text = " ".join(map(str, text)) or "--"
    rule = "one sbatch option per --sbatch-arg, written --name=value or --flag (e.g. --sbatch-arg=--account=abc)"
    if not text.startswith("-") or text.strip("-") == "" or any(ch.isspace() for ch in text):
        raise ValueError(f"--sbatch-arg {text!r} is not valid: it must be {rule}")
    name, _, value = text.partition("=") if text.startswith("--") else (text[:2], "", text[2:])
    if name in OWN_OPTIONS:
        raise ValueError(f"--sbatch-arg {text!r} is not valid: repro submit sets {name} itself; use "
                         f"{OWN_OPTIONS[name]} instead")
    if name == "--export" and "ALL" not in value.upper().split(","):
        raise ValueError(f"--sbatch-arg {text!r} is not valid: {EXPORT_RULE}")
    return text


@dataclass(frozen=True)
class Plan:
    """The sbatch command line of one job, and what it asks for."""

    experiment: str
    scale: str
    argv: tuple[str, ...]
    array: bool
    nodes: int
    ranks_per_node: int
    gpus_per_node: int
    log_pattern: str
    points: tuple[str, ...] = ()
    cpus_per_task: int = 1
    mem_gib: int = 0
    time_min: int = 0


def plans(
    experiment: Experiment, scale: str, *, points: Sequence[str] | None = None, gpus_per_node: object = None,
    nodes: object = None, cpus_per_task: object = None, cpu: bool = False, array: bool | None = None,
    partition: object = None, time_limit: object = None, mem_gb: object = None, log_dir: Path | None = None,
    slurm_dir: Path | None = None, extra: Sequence[str] = (), write_files: bool = True, max_parallel: object = None,
) -> list[Plan]:
    """The sbatch argv of every job that runs ``points`` (default: all) of ``experiment`` at ``scale``.

    Overrides may be strings (as typed) or numbers; bad ones raise ValueError naming the value and the rule.
    ``write_files`` writes ``slurm/<name>.sbatch`` when it is missing and creates the log folder (``--dry-run``
    passes False: nothing is written).
    """
    overrides = parse_overrides(nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task, mem=mem_gb,
                                time=time_limit, partition=partition, cpu=cpu)
    _check_limits({"--time": (time_limit, overrides.time_min), "--mem": (mem_gb, overrides.mem_gib),
                   "--cpus-per-task": (cpus_per_task, overrides.cpus_per_task),
                   "--gpus-per-node": (gpus_per_node, overrides.gpus_per_node)})
    throttle = _max_parallel(max_parallel)
    if throttle is not None and array is False:
        raise ValueError(f"--max-parallel {throttle} limits the tasks of an array running at once; --no-array runs "
                         "the points one after the other in one job: drop one of them")
    jobs = jobs_for(experiment, scale, points, overrides=overrides, array=array)
    _check_gpus(experiment, scale, jobs, overrides)
    if throttle is not None:
        jobs = [dataclasses.replace(job, max_parallel=throttle) for job in jobs]
    # absolute: sbatch runs in the checkout, so a relative --output would name a folder under it
    log_dir = Path(log_dir or (results_dir() / "slurm-logs")).absolute()
    slurm_dir = slurm_dir or SLURM_DIR
    if write_files:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = write(experiment, slurm_dir, overwrite=False)
    else:
        path = sbatch_path(experiment.name, slurm_dir)
    return [_plan(experiment, job, overrides, log_dir, path, extra) for job in jobs]


#: Upper bounds of the overrides: what a cluster can grant at all (a larger value is a typo that Slurm would take,
#: and the job would wait in the queue forever or be refused hours later): option -> (largest value, unit and why).
LIMITS = {
    "--time": (366 * 24 * 60, "minutes (a year): no partition grants a longer limit (MaxTime is days or weeks); "
                              "leave --time out for the declared one"),
    "--cpus-per-task": (1024, "CPUs: the largest nodes have 768 hardware threads, and each rank gets this many"),
    "--gpus-per-node": (64, "GPUs: the largest nodes hold 16 (repro runs one rank per GPU)"),
    "--mem": (2**16, "GiB (64 TiB): more memory than any node holds; such a job would never start"),
    "--max-parallel": (4000001, "tasks: Slurm's MaxArraySize is at most 4000001, so no array has more tasks"),
}


def _check_limits(values: dict[str, tuple[object, int | None]]) -> None:
    """ValueError naming the first override (option -> (as typed, parsed)) above its :data:`LIMITS` bound."""
    for option, (typed, parsed) in values.items():
        limit, why = LIMITS[option]
        if parsed is not None and parsed > limit:
            raise ValueError(f"{option} {typed!r} is not valid: it must be at most {limit} {why}")


def _check_gpus(experiment: Experiment, scale: str, jobs: Sequence[Job], overrides: Overrides) -> None:
    """``--gpus-per-node 0`` without ``--cpu`` for points that need GPUs: ValueError (launch.sh would stop them)."""
    if overrides.gpus_per_node != 0 or overrides.cpu:
        return
    needy = [name for job in jobs for name in job.points if experiment.point_named(scale, name).needs_gpu]
    if needy:
        shown = ", ".join(needy[:4]) + (f" and {len(needy) - 4} more" if len(needy) > 4 else "")
        raise ValueError(f"--gpus-per-node 0 asks for no GPUs, but point(s) {shown} of {experiment.name} at scale "
                         f"{scale!r} need a GPU: give --gpus-per-node >= 1, or --cpu to run them on CPU")


def _max_parallel(value: object) -> int | None:
    """``--max-parallel``: a whole number in [1, 4000001] (Slurm's array throttle, ``--array=0-7%N``), or None."""
    if value is None:
        return None
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--max-parallel {value!r} is not valid: it must be a whole number >= 1 (array tasks that "
                         "may run at once)")
    _check_limits({"--max-parallel": (value, int(text))})
    return int(text)


def _plan(experiment: Experiment, job: Job, overrides: Overrides, log_dir: Path, path: Path,
          extra: Sequence[str]) -> Plan:
    log_pattern = str(log_dir / log_name(job.array))
    argv = ["sbatch", "--parsable", *job.options(), f"--output={log_pattern}"]
    if overrides.partition:
        argv.append(f"--partition={overrides.partition}")
    argv += [*extra, str(path), job.scale]
    shape = job.shape
    return Plan(experiment.name, job.scale, tuple(argv), job.array, shape.nodes, shape.tasks_per_node,
                shape.gpus_per_node, log_pattern, job.points, shape.cpus_per_task, shape.mem_gib, shape.time_min)


def plan(experiment: Experiment, scale: str, **options) -> Plan:
    """The one job of :func:`plans` (ValueError when the chosen points need several jobs; use :func:`plans`)."""
    found = plans(experiment, scale, **options)
    if len(found) != 1:
        raise ValueError(f"{experiment.name} at scale {scale!r} needs {len(found)} jobs of different resources "
                         f"(points {[list(p.points) for p in found]}); submit them with plans()")
    return found[0]


def submit(job: Plan, *, env: dict[str, str] | None = None) -> str:
    """Run sbatch; return the job id. Environment: REPRO_ROOT is set to this checkout; CPU runs of GPU points
    need REPRO_DEVICE=cpu in ``env``."""
    require("sbatch")
    root = project_root()
    full_env = {**os.environ, "REPRO_ROOT": str(root), **(env or {})}
    if full_env.get(RESULTS_ENV):  # sbatch runs in the checkout: a relative folder would be read from there
        full_env[RESULTS_ENV] = str(Path(full_env[RESULTS_ENV]).absolute())
    proc = subprocess.run(list(job.argv), capture_output=True, text=True, env=full_env, cwd=root, timeout=60)
    if proc.returncode != 0:
        raise SubmitError(f"sbatch refused the job ({' '.join(job.argv)}): {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


@dataclass(frozen=True)
class JobState:
    """Final (or last seen) state of a job or array task."""

    job_id: str
    state: str
    exit_code: str
    log_path: str

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code.split(":")[0] == "0"

    def describe(self) -> str:
        return f"job {self.job_id}: {self.state}, exit code {self.exit_code}, log {self.log_path or '(unknown)'}"


def _scontrol(job_id: str) -> list[JobState]:
    proc = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    states = []
    for line in proc.stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobState" not in fields:
            continue
        task = fields.get("ArrayTaskId")
        name = f"{fields['ArrayJobId']}_{task}" if task and "ArrayJobId" in fields else fields.get("JobId", job_id)
        states.append(JobState(name, fields["JobState"], fields.get("ExitCode", "?"), fields.get("StdOut", "")))
    return states


def _sacct(job_id: str) -> list[JobState]:
    if shutil.which("sacct") is None:
        return []
    proc = subprocess.run(["sacct", "-c", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode"],
                          capture_output=True, text=True, timeout=30)
    states = []
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0]:
            states.append(JobState(parts[0], parts[1].split()[0], parts[2], ""))
    return states


def job_states(job_id: str) -> list[JobState]:
    """State of a job (one entry per array task), from scontrol, else sacct -c."""
    return _scontrol(job_id) or _sacct(job_id)


def format_elapsed(seconds: float) -> str:
    """``12 s``, ``2 min 05 s``, ``1 h 02 min``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


_ARRAY_RANGE = re.compile(r"^(?P<job>\d+)_\[(?P<tasks>[^\]]+)\]$")


def _expand(task_id: str) -> list[str]:
    """squeue's ``123_[0-2,5%2]`` (pending array tasks) -> ``123_0 123_1 123_2 123_5``; other ids unchanged."""
    match = _ARRAY_RANGE.match(task_id)
    if not match:
        return [task_id]
    out = []
    for part in match["tasks"].split("%")[0].split(","):
        low, _, high = part.partition("-")
        try:
            out += [f"{match['job']}_{i}" for i in range(int(low), int(high or low) + 1)]
        except ValueError:
            return [task_id]
    return out


def _queued(job_id: str) -> dict[str, str] | None:
    """Task id -> state of ``job_id``'s tasks still in the queue ({} once it has left), None when squeue failed."""
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return {} if "Invalid job id" in proc.stderr else None  # purged from the controller: finished
    states: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states.update(dict.fromkeys(_expand(parts[0]), parts[1]))
    return states


def wait_all(job_ids: Sequence[str], *, timeout_s: float = 600.0, poll_s: float = 1.0, say=None,
             progress_s: float = 60.0) -> list[JobState]:
    """Poll ``squeue`` until every job has left the queue (or ``timeout_s`` passes), then return their states (one
    per job or array task, from ``scontrol``/``sacct``).

    ``say`` (e.g. ``print``) hears every state change of a job or array task as it is seen
    (``job 123_0: PENDING -> RUNNING (12 s)``; a task that leaves the queue is reported with its final state) and,
    every ``progress_s`` seconds without a change, how many tasks are in which state and the time waited. A job
    still queued or running at the timeout is returned with its current state (PENDING/RUNNING), so a caller can
    tell "failed" from "still going" and never hangs.
    """
    require("squeue")
    say = say or (lambda message: None)
    start = time.monotonic()
    last_said = start
    seen: dict[str, str] = {}
    active = list(job_ids)
    finished: dict[str, list[JobState]] = {}

    def elapsed() -> str:
        return format_elapsed(time.monotonic() - start)

    while active and time.monotonic() - start < timeout_s:
        for job_id in list(active):
            queued = _queued(job_id)
            if queued is None:
                continue  # squeue did not answer this time: ask again at the next poll
            mine = {task: state for task, state in seen.items() if task == job_id or task.startswith(f"{job_id}_")}
            gone = [task for task in mine if task not in queued]  # finished: said first, then what started
            if gone:
                final = {s.job_id: s for s in job_states(job_id)}
                for task in gone:
                    end = final.get(task)
                    say(f"job {task}: {seen.pop(task)} -> {end.state if end else 'left the queue'}"
                        f"{f' (exit code {end.exit_code})' if end else ''} ({elapsed()})")
                last_said = time.monotonic()
            for task, state in queued.items():
                if mine.get(task) != state:
                    say(f"job {task}: {mine.get(task, 'submitted')} -> {state} ({elapsed()})")
                    last_said = time.monotonic()
                seen[task] = state
            if not queued:
                active.remove(job_id)
                finished[job_id] = job_states(job_id) or [JobState(job_id, "UNKNOWN", "?", "")]
        if active and time.monotonic() - last_said >= progress_s:
            counts: dict[str, int] = {}
            for state in seen.values():
                counts[state] = counts.get(state, 0) + 1
            summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "not yet listed by squeue"
            say(f"waiting for job {', '.join(active)}: {summary} ({elapsed()} elapsed, timeout "
                f"{format_elapsed(timeout_s)})")
            last_said = time.monotonic()
        if active:
            time.sleep(poll_s)
    for job_id in active:
        say(f"stopped waiting after {elapsed()} (--timeout): job {job_id} goes on; `squeue -j {job_id}` follows it, "
            f"`scancel {job_id}` stops it")
        finished[job_id] = job_states(job_id) or [JobState(job_id, "UNKNOWN", "?", "")]
    return [state for job_id in job_ids for state in finished[job_id]]


def wait(job_id: str, *, timeout_s: float = 600.0, poll_s: float = 1.0, say=None,
         progress_s: float = 60.0) -> list[JobState]:
    """:func:`wait_all` for one job."""
    return wait_all([job_id], timeout_s=timeout_s, poll_s=poll_s, say=say, progress_s=progress_s)
