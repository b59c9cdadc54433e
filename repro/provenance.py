"""A run's identity and provenance: its run id (a UTC timestamp that orders runs, plus a random suffix) and what
every row of it records to tell two runs apart and to rerun one (config, git commit, torch, device, Slurm job).
:mod:`repro.results` writes them into the rows; this module knows nothing of rows."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import socket
import subprocess
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from repro.checkout import REPO_ROOT


def new_run_id(now: _dt.datetime | None = None) -> str:
    """``20261122T041000.123456Z-3f9a2c``: sorts by time (to the microsecond), unique by its random suffix."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%S.%fZ')}-{uuid.uuid4().hex[:6]}"


#: what :func:`new_run_id` writes (and ``slurm/launch.sh``): a UTC time to the microsecond and a random suffix
RUN_ID_PATTERN = re.compile(r"(\d{8}T\d{6})(\.\d{6})?Z-[0-9a-f]{6}")


def check_run_id(run_id: str) -> str:
    """``run_id`` when it is a timestamp run id of a real time; else one line (ValueError): the newest run of a
    point is the one reported, and runs are ordered by the time their id carries."""
    match = RUN_ID_PATTERN.fullmatch(run_id)
    if not match:
        raise ValueError(f"run id {run_id!r} is not a timestamp run id like {new_run_id()!r} (a UTC time, Z, a "
                         f"dash, 6 hex digits): runs are ordered by it")
    try:
        _dt.datetime.strptime(match.group(1), "%Y%m%dT%H%M%S")
    except ValueError:
        raise ValueError(f"run id {run_id!r}: {match.group(1)} is not a real UTC time (YYYYMMDDTHHMMSS: month "
                         f"01-12, a day of that month, hour 00-23, minutes and seconds 00-59): runs are ordered by "
                         f"it") from None
    return run_id


def run_time(run_id: str, date: Any = None) -> str:
    """When a run was made, as ``YYYYMMDDTHHMMSS.ffffff`` (sortable): from a timestamp run id, else from the
    provenance ``date`` of its rows (a run written under another id by hand), else empty (oldest)."""
    match = RUN_ID_PATTERN.fullmatch(str(run_id))
    if match:
        return match.group(1) + (match.group(2) or ".000000")
    try:
        when = _dt.datetime.fromisoformat(str(date)).astimezone(_dt.timezone.utc)
    except (TypeError, ValueError):
        return ""
    return when.strftime("%Y%m%dT%H%M%S.%f")


@lru_cache(maxsize=1)
def git_state(repo: Path = REPO_ROOT) -> tuple[str, bool]:
    """(commit, dirty) of the checkout the code runs from; ("unknown", False) outside git, and where the git
    repository found is not this project's own (an exported copy placed inside another repository: its HEAD is
    another project's commit, which a GPU session once recorded). Where git cannot tell, ``$REPRO_GIT_COMMIT``
    (set by whoever exported the copy) is recorded instead, as given."""
    unknown = (os.environ.get("REPRO_GIT_COMMIT") or "unknown", False)
    try:
        top = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10,
            check=True).stdout.strip()
        if Path(top).resolve() != Path(repo).resolve():
            return unknown
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", "repro"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return unknown


def device_description(device: str) -> str:
    """``cpu (x86_64, 2 cores)`` or ``cuda (NVIDIA H100 80GB HBM3 x1)``."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)} x{torch.cuda.device_count()})"
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def slurm_provenance(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Job id (``<array job>_<task>`` for array tasks), array task id and node list when run under Slurm; a
    ValueError naming ``SLURM_ARRAY_TASK_ID`` when it is not a whole number."""
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" not in env:
        return {"job_id": None, "array_task_id": None, "nodelist": None}
    task = env.get("SLURM_ARRAY_TASK_ID")
    if task is not None and not (task.isascii() and task.isdigit()):
        raise ValueError(f"launch variable SLURM_ARRAY_TASK_ID={task!r} must be an integer >= 0 (an array task id)")
    job = f"{env['SLURM_ARRAY_JOB_ID']}_{task}" if task is not None and "SLURM_ARRAY_JOB_ID" in env else env[
        "SLURM_JOB_ID"
    ]
    return {
        "job_id": job,
        "array_task_id": int(task) if task is not None else None,
        "nodelist": env.get("SLURM_JOB_NODELIST"),
    }


def provenance(
    *, config: Mapping[str, Any], world_size: int, device: str, elapsed_s: float, launcher: str = "local"
) -> dict[str, Any]:
    """Everything needed to tell two runs apart and to rerun one."""
    import torch

    commit, dirty = git_state()
    return {
        "config": dict(config),
        "world_size": world_size,
        "git_commit": commit,
        "git_dirty": dirty,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": device_description(device),
        "hostname": socket.gethostname(),
        "launcher": launcher,
        **slurm_provenance(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed_s, 3),
    }
