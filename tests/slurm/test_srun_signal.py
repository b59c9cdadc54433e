"""SIGUSR1 sent to ``srun`` itself (not the batch shell, not a rank) preempts a training job like any other path
(issue 27): srun passes the signal to its tasks, every rank finishes its step, saves and exits 75, srun ends with
75, slurm/launch.sh requeues the job and the next attempt resumes from the checkpoint.

The local Slurm runs on this machine, so the test finds the job's srun among this machine's processes by the
``SLURM_JOB_ID`` in its environment and signals it directly.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.results import REPO_ROOT
from tests.slurm.local_slurm import restarts, skip_without_local_slurm

pytestmark = pytest.mark.slurm
skip_without_local_slurm()

ITERATION = re.compile(r"^ \[[^]]+\] iteration\s+(\d+)/\s*(\d+) \|", re.M)
WAIT_S = 240.0


def _srun_of(job_id: str) -> int | None:
    """The pid of the job's srun on this machine (the step's launcher, started by the batch script)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"srun" and f"SLURM_JOB_ID={job_id}".encode() in environ:
            return int(entry.name)
    return None


def test_sigusr1_to_srun_saves_exits_75_and_requeues(tmp_path):
    env = {**os.environ, "REPRO_ROOT": str(REPO_ROOT), "REPRO_PYTHON": sys.executable,
           "REPRO_RESULTS_DIR": str(tmp_path / "results")}
    ckpt = tmp_path / "ckpt"
    proc = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks=2", f"--output={tmp_path}/%x-%j.out", "slurm/train.sbatch",
         "--tp", "2", "--steps", "40", "--save", str(ckpt), "--load", str(ckpt), "--save-interval", "1000",
         "--log-interval", "1"],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    log = tmp_path / f"repro-train-{job}.out"
    start, pid = time.monotonic(), None
    try:
        while time.monotonic() - start < WAIT_S:
            text = log.read_text(errors="replace") if log.exists() else ""
            if len(ITERATION.findall(text)) >= 3:
                pid = _srun_of(job)
                if pid is not None:
                    os.kill(pid, signal.SIGUSR1)
                    break
            time.sleep(0.2)
        assert pid is not None, f"no srun of job {job} running 3 iterations in:\n{text[-2000:]}"
        while time.monotonic() - start < WAIT_S:
            queued = subprocess.run(["squeue", "-h", "-o", "%i", "-j", job], capture_output=True, text=True,
                                    timeout=30).stdout.split()
            if job not in queued:
                break
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    text = log.read_text(errors="replace")
    assert text.count("exiting with code 75") >= 1, text[-3000:]
    assert restarts(job) == 1, text[-3000:]
    assert "resumed from checkpoint" in text and "training done: iteration 40" in text, text[-3000:]
    iterations = [int(i) for i, _ in ITERATION.findall(text)]
    assert iterations[-1] == 40 and sorted(set(iterations)) == list(range(1, 41))  # no step lost or repeated
