"""Preemption on a real Slurm (issue 12), on the one-node cluster of ``slurm/local/start.sh`` (CI starts it;
skipped when no Slurm controller answers).

* A training job, started with slurm/README.md's ``sbatch slurm/train.sbatch ...`` command, gets README's
  ``scancel --signal=USR1 JOBID`` after a few iterations: its ranks save and exit 75, slurm/launch.sh requeues it,
  the second attempt resumes from the checkpoint and ends with the same losses as the same command run straight
  through as a second job; the log holds both attempts.
* An experiment job gets ``scancel --full --signal=USR1`` (the batch-shell path that Slurm's
  ``--signal=B:USR1@120`` takes) during its second point: the launcher passes the signal on, requeues the job, and the
  second attempt appends to the same run, skipping the point the first attempt wrote.
* The same experiment, cancelled with a plain ``scancel`` (SIGTERM, like the time limit), is not requeued.

All jobs run side by side (about a minute on 2 cores; the local cluster lets a requeued job start again after
10 s instead of Slurm's default 120 s).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.experiments import registry
from repro.harness import submit as S
from repro.results import REPO_ROOT, load_rows
from tests.readme_blocks import SLURM_README, commands
from tests.slurm.local_slurm import (
    ITERATION, check_resumed_like_straight, read_log, restarts, sbatch, skip_without_local_slurm,
)

pytestmark = pytest.mark.slurm

WAIT_S = 240.0

PROBE = '''
"""A two-point experiment whose second point waits to be preempted on the first attempt of its job."""
import os
import time
from pathlib import Path

from repro.experiments.base import Experiment, Point


def _run(point, ctx):
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1
    if point.name == "slow" and attempt == 1:
        Path(os.environ["PROBE_STARTED"] + "." + os.environ["SLURM_JOB_ID"]).touch()
        time.sleep(300)  # ended by the preemption signal (or by scancel)
    return [{"metric": "attempt", "value": float(attempt), "unit": "count"}]


POINTS = (Point("quick", {}), Point("slow", {}))
EXPERIMENTS = (Experiment(name="preempt_probe", paper="megatron_lm_2019", title="Probe: preempted second point",
                          points={"ci": POINTS, "paper": POINTS}, run_point=_run, metrics=("attempt",)),)
'''


skip_without_local_slurm()


def readme_commands() -> list[str]:
    """The commands of slurm/README.md's training section (this test runs them)."""
    return commands(SLURM_README, "## Training, preemption and requeue")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Submit the jobs, signal the ones to preempt (or cancel) once they are under way, wait for all."""
    tmp = tmp_path_factory.mktemp("requeue")
    probe = tmp / "preempt_probe.py"
    probe.write_text(PROBE)
    started = tmp / "probe.started"
    env = {**os.environ, "REPRO_ROOT": str(REPO_ROOT), "REPRO_PYTHON": sys.executable,
           "REPRO_RESULTS_DIR": str(tmp / "results"), "PROBE_STARTED": str(started)}
    command, scancel = readme_commands()
    argv = shlex.split(command)
    assert argv[:2] == ["sbatch", "slurm/train.sbatch"] and scancel == "scancel --signal=USR1 JOBID"
    ids: dict[str, str] = {}
    logs: dict[str, Path] = {}
    old = os.environ.get("REPRO_EXTRA_EXPERIMENTS")
    try:
        ids["preempted"] = sbatch(["sbatch", "--parsable", f"--output={tmp}/%x-%j.out", *argv[1:]], env)
        ids["straight"] = sbatch(["sbatch", "--parsable", *argv[1:]], env)  # the header's log: results/slurm-logs/
        os.environ["REPRO_EXTRA_EXPERIMENTS"] = str(probe)
        plan = S.plan(registry(refresh=True).get("preempt_probe"), "ci", slurm_dir=tmp, log_dir=tmp / "logs",
                      array=False)
        for key in ("experiment", "cancelled"):
            ids[key] = S.submit(plan, env={**env, "REPRO_EXTRA_EXPERIMENTS": str(probe)})
        logs = {"preempted": tmp / f"repro-train-{ids['preempted']}.out",
                "straight": REPO_ROOT / "results" / "slurm-logs" / f"repro-train-{ids['straight']}.out",
                **{key: tmp / "logs" / f"repro-preempt_probe-{ids[key]}.out" for key in ("experiment", "cancelled")}}
        signals = {  # what to send, and when
            "preempted": (shlex.split(scancel.replace("JOBID", ids["preempted"])),
                          lambda: len(ITERATION.findall(read_log(logs["preempted"]))) >= 3),
            "experiment": (["scancel", "--full", "--signal=USR1", ids["experiment"]],
                           Path(f"{started}.{ids['experiment']}").exists),
            "cancelled": (["scancel", ids["cancelled"]], Path(f"{started}.{ids['cancelled']}").exists),
        }
        signalled: dict[str, float] = {}
        start = time.monotonic()
        while len(signalled) < len(signals) and time.monotonic() - start < WAIT_S:
            for key, (command, ready) in signals.items():
                if key not in signalled and ready():
                    subprocess.run(command, check=True)
                    signalled[key] = round(time.monotonic() - start, 1)
            time.sleep(0.2)
        ended: dict[str, float] = {}
        while len(ended) < len(ids) and time.monotonic() - start < WAIT_S:
            queued = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(ids.values())], capture_output=True,
                                    text=True, timeout=30).stdout.split()
            ended.update({key: round(time.monotonic() - start, 1) for key, job_id in ids.items()
                          if job_id not in queued and key not in ended})
            time.sleep(0.5)
        states = {key: S.job_states(job_id) for key, job_id in ids.items()}
        requeues = {key: restarts(job_id) for key, job_id in ids.items()}
        texts = {key: read_log(path) for key, path in logs.items()}
        print(f"signalled at {signalled} s, ended at {ended} s")
        yield {"ids": ids, "states": states, "logs": texts, "signalled": signalled, "restarts": requeues,
               "results": tmp / "results", "ended": ended}
    finally:
        if old is None:
            os.environ.pop("REPRO_EXTRA_EXPERIMENTS", None)
        else:
            os.environ["REPRO_EXTRA_EXPERIMENTS"] = old
        registry(refresh=True)
        _cancel(list(ids.values()))
        if "straight" in logs:
            logs["straight"].unlink(missing_ok=True)


def _cancel(job_ids: list[str]) -> None:
    """scancel until the jobs have left the queue (a cancel that meets a job while it is being requeued is lost)."""
    deadline = time.monotonic() + 30
    while job_ids and time.monotonic() < deadline:
        subprocess.run(["scancel", *job_ids], capture_output=True)
        time.sleep(1)
        queued = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True,
                                text=True).stdout.split()
        job_ids = [job_id for job_id in job_ids if job_id in queued]


def _ok(jobs, key: str) -> None:
    states = jobs["states"][key]
    assert jobs["logs"][key], f"{key}: no log"
    assert states and all(s.ok for s in states), "; ".join(s.describe() for s in states) + "\n" + jobs["logs"][key]


def test_training_preempted_by_scancel_usr1_requeues_resumes_and_matches_a_straight_run(jobs):
    assert "preempted" in jobs["signalled"], "the training job never logged 3 iterations:\n" + jobs["logs"]["preempted"]
    _ok(jobs, "preempted")
    _ok(jobs, "straight")
    log, straight = jobs["logs"]["preempted"], jobs["logs"]["straight"]
    # both attempts in one log (--open-mode=append): a fresh start, the preemption save, the resume
    first, _, second = log.partition("attempt=2")
    assert "attempt=1" in first and second, log
    assert "no checkpoint in" in first and "received SIGUSR1" in first and "exiting with code 75" in first, log
    assert "training stopped for preemption (exit code 75)" in first and f"scontrol requeue {jobs['ids']['preempted']}" in first
    assert jobs["restarts"]["preempted"] == 1 and jobs["restarts"]["straight"] == 0
    check_resumed_like_straight(first, second, straight)


def test_requeued_experiment_appends_to_its_run_and_skips_the_written_point(jobs):
    assert "experiment" in jobs["signalled"], "the probe's slow point never started:\n" + jobs["logs"]["experiment"]
    _ok(jobs, "experiment")
    log = jobs["logs"]["experiment"]
    assert "got SIGUSR1: passing it to the running step" in log and "point slow stopped for preemption" in log, log
    assert "attempt=2" in log and "point quick is already in run" in log, log
    assert jobs["restarts"]["experiment"] == 1
    rows = load_rows(jobs["results"], latest_only=False)
    rows = rows[rows["prov_job_id"].astype(str) == jobs["ids"]["experiment"]]
    assert rows["run_id"].nunique() == 1, rows
    assert dict(zip(rows.point, rows.value)) == {"quick": 1.0, "slow": 2.0} and len(rows) == 2
    run_ids = {line.split("run_id=")[1].split()[0] for line in log.splitlines() if "run_id=" in line}
    assert run_ids == set(rows["run_id"])


def test_a_cancelled_job_is_not_requeued(jobs):
    """scancel sends SIGTERM, which the launcher passes on like a preemption signal; it must not requeue the job."""
    assert "cancelled" in jobs["signalled"], "the probe's slow point never started:\n" + jobs["logs"]["cancelled"]
    (state,) = jobs["states"]["cancelled"]
    log = jobs["logs"]["cancelled"]
    assert state.state == "CANCELLED" and jobs["restarts"]["cancelled"] == 0, state.describe() + "\n" + log
    assert "was cancelled (JobState=" in log and "not requeued" in log and "attempt=2" not in log, log
