"""On the local two-node Slurm: every srun step of slurm/launch.sh gets its CPUs (srun no longer inherits
--cpus-per-task since Slurm 22.05), and a job preempted on every attempt stops at REPRO_MAX_REQUEUES instead of
coming back forever (issue 34). A REPRO_PYTHON wrapper records what each training task was given, then runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from repro.results import REPO_ROOT
from tests.slurm.local_slurm import ITERATION, read_log, restarts, sbatch, skip_without_local_slurm

pytestmark = pytest.mark.slurm

skip_without_local_slurm(nodes=2)

WAIT_S = 240.0


def _wait(condition, what: str, log) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S:.0f} s:\n{read_log(log)[-3000:]}"
        time.sleep(0.2)


def test_each_step_gets_its_cpus_and_requeues_stop_at_the_cap(tmp_path):
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/bash\necho "$SLURM_PROCID ${{SLURM_CPUS_PER_TASK:-unset}}" >> "$CPU_LOG"\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "REPRO_ROOT": str(REPO_ROOT), "REPRO_PYTHON": str(wrapper),
           "CPU_LOG": str(tmp_path / "cpus"), "REPRO_RESULTS_DIR": str(tmp_path / "results"),
           "REPRO_MAX_REQUEUES": "1"}
    job = sbatch(["sbatch", "--parsable", f"--output={tmp_path}/%x-%j.out", "--nodes=2", "--ntasks-per-node=1",
                  "--cpus-per-task=2", "slurm/train.sbatch", "--steps", "100000", "--layers", "2", "--hidden", "32",
                  "--save-interval", "1000"], env)
    log = tmp_path / f"repro-train-{job}.out"
    try:
        for attempt in (1, 2):  # preempted on both attempts: requeued once, then the cap holds
            _wait(lambda: read_log(log).count("attempt=") == attempt
                  and len(ITERATION.findall(read_log(log).rsplit("attempt=", 1)[-1])) >= 3, f"attempt {attempt}", log)
            subprocess.run(["scancel", "--signal=USR1", job], check=True)
            if attempt == 1:
                _wait(lambda: restarts(job) == 1, "requeue", log)
        _wait(lambda: job not in subprocess.run(["squeue", "-h", "-o", "%i", "-j", job], capture_output=True,
                                                text=True).stdout.split(), "end of the job", log)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    text = read_log(log)
    assert restarts(job) in (1, -1), text[-3000:]  # -1: the controller forgot the finished job
    assert "was requeued 1 time(s) already (REPRO_MAX_REQUEUES=1): not requeued" in text, text[-3000:]
    given = (tmp_path / "cpus").read_text().split("\n")
    tasks = [line.split() for line in given if line.strip()]
    assert len(tasks) == 4 and all(cpus == "2" for _, cpus in tasks), given  # 2 tasks x 2 attempts, 2 CPUs each
