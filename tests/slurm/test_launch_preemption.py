"""slurm/launch.sh's preemption logic without a cluster: stand-ins for ``srun`` (runs its command here) and
``scontrol`` (records what it is asked), a stand-in trainer that exits 75 when signalled, and the worker's
``--skip-done`` plan. The same logic runs on a real Slurm in tests/slurm/test_train_requeue.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from repro.harness import worker
from repro.harness.sbatch import LOG_DIRECTIVE, PREEMPTION_DIRECTIVES
from repro.results import REPO_ROOT, append_rows, load_rows
from tests.slurm.launch_stubs import FAKE, JOB, LAUNCH, make_stubs, stub_env


@pytest.fixture()
def stubs(tmp_path):
    return make_stubs(tmp_path)


def _train(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LAUNCH), "--train", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO_ROOT)


def _requeues(tmp_path: Path) -> list[str]:
    log = tmp_path / "scontrol.log"
    return log.read_text().splitlines() if log.exists() else []


def test_train_requeues_only_a_step_that_exits_75(tmp_path, stubs):
    ckpt = str(tmp_path / "res" / "checkpoints" / f"repro-train-{JOB}")
    for rc, launch_rc, requeued in ((75, 0, True), (0, 0, False), (1, 1, False)):
        (tmp_path / "scontrol.log").unlink(missing_ok=True)
        proc = _train(stub_env(tmp_path, stubs, REPRO_PYTHON=str(stubs / "fakepy"), FAKE_RC=str(rc)), "--steps", "3")
        assert proc.returncode == launch_rc, proc.stdout + proc.stderr
        assert _requeues(tmp_path) == ([f"requeue {JOB}"] if requeued else []), proc.stdout
        # --save and --load default to <results>/checkpoints/<job name>-<job id>
        assert json.loads((tmp_path / "fake.args").read_text()) == ["--steps", "3", "--save", ckpt, "--load", ckpt]
    assert "training FAILED with exit code 1" in proc.stderr


def test_an_array_task_requeues_only_itself(tmp_path, stubs):
    """The first task of an array has the array's job id as its own: `scontrol requeue <that id>` would requeue
    every task, so an array task names itself <array job>_<task>."""
    env = stub_env(tmp_path, stubs, REPRO_PYTHON=str(stubs / "fakepy"), FAKE_RC="75", SLURM_ARRAY_JOB_ID=JOB,
               SLURM_ARRAY_TASK_ID="0")
    proc = _train(env)
    assert proc.returncode == 0 and _requeues(tmp_path) == [f"requeue {JOB}_0"], proc.stdout + proc.stderr


def test_a_cancelled_job_is_not_requeued_but_one_at_its_time_limit_is(tmp_path, stubs):
    """scancel sends SIGTERM too: the trainer saves and exits 75, but the job is no longer RUNNING, so it ends
    there; at the time limit (Reason=TimeLimit) it is requeued."""
    env = stub_env(tmp_path, stubs, REPRO_PYTHON=str(stubs / "fakepy"), FAKE_RC="75", FAKE_JOB_STATE="COMPLETING")
    proc = _train(env)
    assert proc.returncode == 75 and _requeues(tmp_path) == [], proc.stdout + proc.stderr
    assert f"job {JOB} was cancelled (JobState=COMPLETING Reason=None): not requeued" in proc.stderr
    proc = _train({**env, "FAKE_REASON": "TimeLimit"})
    assert proc.returncode == 0 and _requeues(tmp_path) == [f"requeue {JOB}"], proc.stdout + proc.stderr


def test_a_requeued_attempt_loads_its_own_checkpoints(tmp_path, stubs):
    env = stub_env(tmp_path, stubs, REPRO_PYTHON=str(stubs / "fakepy"))
    assert _train(env, "--save", "mine", "--load=pretrained").returncode == 0
    assert json.loads((tmp_path / "fake.args").read_text()) == ["--save", "mine", "--load=pretrained"]
    proc = _train({**env, "SLURM_RESTART_COUNT": "1"}, "--save", "mine", "--load=pretrained")
    assert proc.returncode == 0 and "attempt 2 resumes from --save mine instead of --load pretrained" in proc.stdout
    assert json.loads((tmp_path / "fake.args").read_text())[-2:] == ["--load", "mine"]


def test_launch_outside_slurm_names_the_training_sbatch(tmp_path, stubs):
    env = stub_env(tmp_path, stubs)
    del env["SLURM_JOB_ID"]
    proc = _train(env)
    assert proc.returncode == 2 and "sbatch slurm/train.sbatch" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_to_the_batch_shell_reaches_the_step_and_requeues(tmp_path, stubs, sig):
    """Slurm's --signal=B:USR1@120 (and the time limit's SIGTERM) reach the batch shell only: launch.sh passes the
    signal on to srun while it waits, the step exits 75, and the job is requeued."""
    env = stub_env(tmp_path, stubs, REPRO_PYTHON=str(stubs / "fakepy"), FAKE_WAIT="1")
    proc = subprocess.Popen(["bash", str(LAUNCH), "--train", "--steps", "3"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO_ROOT)
    deadline = time.monotonic() + 60
    while not (tmp_path / "fake.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert (tmp_path / "fake.signal").read_text() == sig.name
    assert f"got {sig.name}: passing it to the running step" in out
    assert f"exit code 75 after {sig.name}" in out and _requeues(tmp_path) == [f"requeue {JOB}"]


def test_a_requeued_experiment_appends_to_its_run_and_skips_written_points(tmp_path, stubs):
    """The first attempt keeps its run id in <results>/slurm-logs/<job>.run_id; a requeued attempt (same job id,
    SLURM_RESTART_COUNT=1) reads it, and runs only the points that have no rows from this job in that run."""
    env = stub_env(tmp_path, stubs)
    launch = ["bash", str(LAUNCH), "fake_sum", "ci"]
    first = subprocess.run(launch, capture_output=True, text=True, env=env, timeout=240, cwd=REPO_ROOT)
    assert first.returncode == 0, first.stdout + first.stderr
    run_id = (tmp_path / "res" / "slurm-logs" / f"{JOB}.run_id").read_text().strip()
    run_file = tmp_path / "res" / "runs" / "fake_sum" / f"{run_id}.jsonl"
    records = [json.loads(line) for line in run_file.read_text().splitlines()]
    # as if attempt 1 had been stopped during n4_ws2: only n3's rows were written
    run_file.write_text("".join(json.dumps(r) + "\n" for r in records if r["point"] == "n3"))
    again = subprocess.run(launch, capture_output=True, text=True, env={**env, "SLURM_RESTART_COUNT": "1"},
                           timeout=240, cwd=REPO_ROOT)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"attempt=2" in again.stdout and f"run_id={run_id}" in again.stdout
    assert "point n3 is already in run" in again.stderr and "point n4_ws2:" in again.stdout
    rows = load_rows(tmp_path / "res", latest_only=False)
    assert set(rows["run_id"]) == {run_id} and len(list(run_file.parent.glob("*.jsonl"))) == 1
    assert sorted(zip(rows.point, rows.metric)) == [("n3", "triangle"), ("n4_ws2", "rank_sum"), ("n4_ws2", "triangle")]


def test_worker_plan_skips_only_points_this_job_wrote(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REPRO_EXTRA_EXPERIMENTS", str(FAKE))
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    prov = {"job_id": JOB}
    r1 = "20261128T000000.000000Z-0000a1"
    append_rows(tmp_path, experiment="fake_sum", scale="ci", point="n3", run_id=r1,
                rows=[{"metric": "triangle", "value": 6.0, "unit": "count"}], prov=prov)
    append_rows(tmp_path, experiment="fake_sum", scale="ci", point="n4_ws2", run_id=r1,
                rows=[{"metric": "triangle", "value": 10.0, "unit": "count"}], prov={"job_id": "77"})
    plan = ["fake_sum", "--scale", "ci", "--plan", "--results-dir", str(tmp_path), "--run-id", r1, "--skip-done"]
    assert worker.main(plan) == 0  # outside Slurm nothing counts as written by "this job"
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["n3", "n4_ws2"]
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    assert worker.main(plan) == 0
    captured = capsys.readouterr()
    assert [line.split("\t")[0] for line in captured.out.splitlines()] == ["n4_ws2"]
    assert f"point n3 is already in run {r1}" in captured.err
    assert worker.main(["fake_sum", "--plan", "--skip-done"]) == 2
    assert "--skip-done needs --plan and --run-id" in capsys.readouterr().err
    assert worker.main(["fake_sum", "--plan", "--run-id", "plainlong"]) == 2  # run ids are timestamps
    err = capsys.readouterr().err
    assert "run id 'plainlong' is not a timestamp run id" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "slurm").glob("*.sbatch")), ids=lambda p: p.name)
def test_every_sbatch_file_is_preemptible_and_logs_under_results(path: Path):
    lines = path.read_text().splitlines()
    for directive in (*PREEMPTION_DIRECTIVES, LOG_DIRECTIVE):
        assert directive in lines, f"{path.name} lacks {directive!r}"


def test_the_log_folder_is_in_the_repository():
    """Slurm opens --output before the script runs and does not create folders: results/slurm-logs/ must exist in
    every checkout (its .gitignore is committed; the logs themselves are not)."""
    tracked = subprocess.run(["git", "ls-files", "results/slurm-logs", "results/checkpoints"], cwd=REPO_ROOT,
                             capture_output=True, text=True).stdout.split()
    if not tracked and subprocess.run(["git", "rev-parse"], cwd=REPO_ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    assert tracked == ["results/checkpoints/.gitignore", "results/slurm-logs/.gitignore"]
    for path in ("results/slurm-logs/repro-train-1.out", "results/slurm-logs/1.run_id",
                 "results/checkpoints/repro-train-1/iter_0000001/model.pt"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT).returncode == 0, path


def test_train_sbatch_hands_its_arguments_to_the_launcher(tmp_path):
    root = tmp_path / "root"
    (root / "slurm").mkdir(parents=True)
    (root / "slurm" / "launch.sh").write_text('echo "launch $*"\n')
    proc = subprocess.run(["bash", str(REPO_ROOT / "slurm" / "train.sbatch"), "--steps", "3", "--tp", "2"],
                          capture_output=True, text=True, env={**os.environ, "REPRO_ROOT": str(root)})
    assert proc.returncode == 0 and proc.stdout.strip() == "launch --train --steps 3 --tp 2", proc.stderr


def test_requeues_stop_at_the_cap(tmp_path, stubs):
    """A job that is preempted (or runs past its --time) on every attempt is requeued REPRO_MAX_REQUEUES times
    (default 5), then ends with 75 and one line saying why."""
    env = stub_env(tmp_path, stubs, REPRO_PYTHON=str(stubs / "fakepy"), FAKE_RC="75")
    proc = _train({**env, "SLURM_RESTART_COUNT": "4"})
    assert proc.returncode == 0 and _requeues(tmp_path) == [f"requeue {JOB}"], proc.stdout + proc.stderr
    (tmp_path / "scontrol.log").unlink()
    proc = _train({**env, "SLURM_RESTART_COUNT": "5"})
    assert proc.returncode == 75 and _requeues(tmp_path) == [], proc.stdout + proc.stderr
    assert "was requeued 5 time(s) already (REPRO_MAX_REQUEUES=5): not requeued" in proc.stderr
    proc = _train({**env, "SLURM_RESTART_COUNT": "1", "REPRO_MAX_REQUEUES": "1"})
    assert proc.returncode == 75 and _requeues(tmp_path) == [], proc.stdout + proc.stderr
    proc = _train({**env, "REPRO_MAX_REQUEUES": "lots"})
    assert proc.returncode == 2 and "REPRO_MAX_REQUEUES=lots must be a whole number" in proc.stderr


def test_every_srun_step_passes_cpus_per_task(tmp_path, stubs):
    """Since Slurm 22.05 srun does not inherit --cpus-per-task, so ranks could be pinned to one CPU: the training
    step and both kinds of experiment step (one rank, several) pass it."""
    log = tmp_path / "srun.log"
    (stubs / "srun").write_text('#!/bin/bash\necho "$*" >> "$SRUN_LOG"\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                '[ "${SRUN_RUN:-1}" = 1 ] || exit 0\nexec "$@"\n')
    env = stub_env(tmp_path, stubs, REPRO_PYTHON=str(stubs / "fakepy"), SRUN_LOG=str(log), SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_ON_NODE="8")
    assert _train(env).returncode == 0
    assert "--cpus-per-task=4 " in log.read_text()  # 8 CPUs over 2 tasks of the node
    assert _train({**env, "SLURM_CPUS_PER_TASK": "3"}).returncode == 0
    assert log.read_text().splitlines()[-1].count("--cpus-per-task=3 ") == 1  # the job's own value
    log.unlink()
    # the experiment's steps are only logged (SRUN_RUN=0): their options are what this test reads, and running the
    # points through this stand-in is tests/slurm/test_sbatch_files.py's test
    env = {**stub_env(tmp_path, stubs, SRUN_LOG=str(log), SLURM_CPUS_ON_NODE="2", SRUN_RUN="0")}
    done = subprocess.run(["bash", str(LAUNCH), "fake_sum", "ci"], capture_output=True, text=True, env=env,
                          timeout=240, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = log.read_text().splitlines()
    assert len(steps) == 2 and all("--cpus-per-task=" in step for step in steps), steps
