"""``repro submit``: size a Slurm job for an experiment, sbatch its file, and (optionally) wait for the verdict.

Sizing: ranks per node are the GPUs per node when GPUs are requested, else the largest point's world size (on one
node); nodes = ceil(largest world size / ranks per node). A scale with several points becomes a job array, one
point per task. ``--mem`` defaults to the points' declared memory per node, so an allocation the cluster cannot
give is refused at submit time (the local Slurm sets EnforcePartLimits=ALL) instead of waiting forever.

Waiting polls ``squeue`` (``sbatch --wait`` notices the end late), then reads the final state, exit code and log
path from ``scontrol show job`` (or ``sacct -c`` without a database).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from repro.experiments.base import Experiment
from repro.experiments.sbatch import SLURM_DIR, sbatch_path, write
from repro.results import REPO_ROOT


class SlurmMissing(RuntimeError):
    """sbatch (or squeue/scontrol) is not on PATH."""


class SubmitError(RuntimeError):
    """sbatch refused the job (its message says why: too many resources, bad partition, ...)."""


def require(tool: str = "sbatch") -> str:
    path = shutil.which(tool)
    if path is None:
        raise SlurmMissing(
            f"`{tool}` is not on PATH: `repro submit` needs a Slurm cluster. Run locally with "
            "`repro run EXP --scale ci`, or start the local test cluster with `sudo slurm/local/start.sh`"
        )
    return path


@dataclass(frozen=True)
class Plan:
    """The sbatch command line for one submission."""

    experiment: str
    scale: str
    argv: tuple[str, ...]
    array: bool
    nodes: int
    ranks_per_node: int
    gpus_per_node: int
    log_pattern: str


def plan(
    experiment: Experiment, scale: str, *, gpus_per_node: int | None = None, nodes: int | None = None,
    cpu: bool = False, array: bool | None = None, partition: str | None = None, time_limit: str | None = None,
    mem_gb: int | None = None, log_dir: Path | None = None, slurm_dir: Path | None = None,
    extra: Sequence[str] = (),
) -> Plan:
    """Build the sbatch argv (writes ``slurm/<name>.sbatch`` first if it does not exist)."""
    points = list(experiment.points_for(scale))
    needs_gpu = any(p.needs_gpu for p in points) and not cpu
    gpus = gpus_per_node if gpus_per_node is not None else (8 if needs_gpu else 0)
    if gpus < 0:
        raise ValueError(f"--gpus-per-node {gpus} must be >= 0")
    world = max(p.world_size for p in points)
    per_node = gpus if gpus > 0 else world
    need_nodes = math.ceil(world / per_node)
    nodes = nodes if nodes is not None else need_nodes
    if nodes < need_nodes:
        raise ValueError(f"--nodes {nodes} is too few: the largest point needs {world} ranks = {need_nodes} node(s) "
                         f"of {per_node}")
    use_array = len(points) > 1 if array is None else array
    mem_per_node = mem_gb if mem_gb is not None else math.ceil(
        max(p.memory_gib * min(p.world_size, per_node) for p in points) * 1.25 + 1)
    log_dir = log_dir or (REPO_ROOT / "results" / "slurm-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_pattern = str(log_dir / ("%x-%A_%a.out" if use_array else "%x-%j.out"))
    path = write(experiment, slurm_dir or SLURM_DIR, overwrite=False)
    argv = ["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={per_node}", f"--output={log_pattern}"]
    if mem_per_node > 0:
        argv.append(f"--mem={mem_per_node}G")
    if gpus > 0:
        argv.append(f"--gpus-per-node={gpus}")
    if use_array:
        argv.append(f"--array=0-{len(points) - 1}")
    if partition:
        argv.append(f"--partition={partition}")
    if time_limit:
        argv.append(f"--time={time_limit}")
    argv += list(extra) + [str(path), scale]
    return Plan(experiment.name, scale, tuple(argv), use_array, nodes, per_node, gpus, log_pattern)


def submit(job: Plan, *, env: dict[str, str] | None = None) -> str:
    """Run sbatch; return the job id. Environment: REPRO_ROOT is set to this checkout; CPU runs of GPU points
    need REPRO_DEVICE=cpu in ``env``."""
    require("sbatch")
    full_env = {**os.environ, "REPRO_ROOT": str(REPO_ROOT), **(env or {})}
    proc = subprocess.run(list(job.argv), capture_output=True, text=True, env=full_env, cwd=REPO_ROOT, timeout=60)
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


def wait(job_id: str, *, timeout_s: float = 600.0, poll_s: float = 1.0) -> list[JobState]:
    """Poll ``squeue`` until the job has left the queue (or ``timeout_s`` passes), then return its states.

    A job still queued or running at the timeout is returned with its current state (PENDING/RUNNING), so a
    caller can tell "failed" from "still going" and never hangs.
    """
    require("squeue")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True,
                              timeout=30)
        if proc.returncode == 0 and not proc.stdout.strip():
            break
        if proc.returncode != 0 and "Invalid job id" in proc.stderr:
            break  # already purged from the controller: finished
        time.sleep(poll_s)
    states = job_states(job_id)
    return states or [JobState(job_id, "UNKNOWN", "?", "")]
