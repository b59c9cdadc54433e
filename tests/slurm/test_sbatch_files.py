"""The sbatch files and the shared launcher, checked without a cluster: syntax, no hard-wired GPUs, in sync with
the experiments, early failures, and a full launch through a stand-in ``srun`` that runs its command here."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from repro.experiments import registry
from repro.harness.resources import cpu_scale_of
from repro.harness.sbatch import render, sbatch_path
from repro.results import REPO_ROOT, load_rows

SLURM = REPO_ROOT / "slurm"
FAKE = REPO_ROOT / "tests" / "experiments" / "fake_experiments.py"
SCRIPTS = sorted(SLURM.glob("*.sbatch")) + [SLURM / "launch.sh", *sorted((SLURM / "local").glob("*.sh"))]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(SLURM)))
def test_scripts_pass_bash_n(path: Path):
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path", sorted(SLURM.glob("*.sbatch")), ids=lambda p: p.name)
def test_sbatch_files_never_request_gpus(path: Path):
    directives = [line for line in path.read_text().splitlines() if line.startswith("#SBATCH")]
    assert directives, "no #SBATCH directives"
    assert not [d for d in directives if re.search(r"--gres|--gpus|-G\b|--gpu", d)], directives
    assert "slurm/launch.sh" in path.read_text()


def test_every_experiment_has_an_sbatch_file_that_fits_its_ci_points():
    """Each registered experiment has its file, asking for enough tasks for the largest point of its CPU scale (ci,
    or smoke), and the file is exactly what ``python scripts/write_sbatch.py`` generates now (the per-scale
    commands listed in its comments included)."""
    problems = []
    for exp in registry(refresh=True):
        path = sbatch_path(exp.name)
        if not path.exists():
            problems.append(f"{exp.name}: no {path.name}")
            continue
        tasks = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", path.read_text(), re.M)
        cpu = cpu_scale_of(exp)
        need = max(p.world_size for p in exp.points_for(cpu))
        if tasks is None or int(tasks.group(1)) < need:
            problems.append(f"{exp.name}: asks for {tasks and tasks.group(1)} tasks, its {cpu} points need {need}")
        if render(exp) != path.read_text():
            problems.append(f"{exp.name}: {path.name} is out of date")
    assert not problems, f"{problems}: run python scripts/write_sbatch.py"


def test_write_sbatch_check_agrees():
    proc = subprocess.run([sys.executable, "scripts/write_sbatch.py", "--check"], capture_output=True, text=True,
                          cwd=REPO_ROOT, env={k: v for k, v in os.environ.items() if k != "REPRO_EXTRA_EXPERIMENTS"})
    assert proc.returncode == 0, proc.stderr


def test_a_job_at_another_scale_than_the_header_says_so(tmp_path):
    """`sbatch slurm/EXP.sbatch paper` without the listed options would run with the ci header: the job log says
    so (the launcher itself is replaced by a stub here)."""
    root = tmp_path / "root"
    (root / "slurm").mkdir(parents=True)
    (root / "slurm" / "launch.sh").write_text('echo "launch $*"\n')
    exp = next(iter(registry(refresh=True)))
    script = tmp_path / "job.sbatch"
    script.write_text(render(exp))
    for scale, warned in (("paper", True), (cpu_scale_of(exp), False)):
        proc = subprocess.run(["bash", str(script), scale], capture_output=True, text=True,
                              env={**os.environ, "REPRO_ROOT": str(root)})
        assert proc.returncode == 0 and proc.stdout.strip() == f"launch {exp.name} {scale}", proc.stderr
        assert ("fit the" in proc.stderr) == warned, proc.stderr


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(REPRO_ROOT=str(REPO_ROOT), REPRO_EXTRA_EXPERIMENTS=str(FAKE), REPRO_RESULTS_DIR=str(tmp_path / "res"),
               SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", SLURM_NTASKS_PER_NODE="2",
               SLURM_CPUS_ON_NODE="2")
    env.update(extra)
    return env


def _launch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SLURM / "launch.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=240, cwd=REPO_ROOT)


def test_launch_outside_slurm_says_how_to_submit(tmp_path):
    proc = _launch(_env(tmp_path), "fake_sum", "ci")
    assert proc.returncode == 2 and "not inside a Slurm allocation" in proc.stderr


def test_launch_fails_early_for_gpu_points_without_gpus(tmp_path):
    proc = _launch(_env(tmp_path, SLURM_JOB_ID="41"), "fake_gpu", "ci")
    assert proc.returncode == 3, proc.stderr
    assert "needs GPUs but this allocation has none" in proc.stderr and "--gpus-per-node" in proc.stderr
    assert "REPRO_DEVICE=cpu" in proc.stderr


def test_launch_rejects_unknown_experiment_and_array_index(tmp_path):
    proc = _launch(_env(tmp_path, SLURM_JOB_ID="42"), "no_such_exp", "ci")
    assert proc.returncode == 2 and "unknown experiment 'no_such_exp'" in proc.stderr
    proc = _launch(_env(tmp_path, SLURM_JOB_ID="42", SLURM_ARRAY_TASK_ID="7"), "fake_sum", "ci")
    assert proc.returncode == 2 and "point index 7 is out of range" in proc.stderr


def test_launch_runs_every_point_through_srun_and_torchrun(tmp_path):
    """A stand-in srun that drops its options and runs the command: the launcher's sizing, the torchrun c10d
    rendezvous (2 ranks) and the rows with the job id all work as in a real allocation."""
    shim = tmp_path / "bin" / "srun"
    shim.parent.mkdir()
    shim.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = _env(tmp_path, SLURM_JOB_ID="4242", PATH=f"{shim.parent}:{os.environ['PATH']}",
               REPRO_MASTER_PORT=str(29000 + os.getpid() % 1000))
    proc = _launch(env, "fake_sum", "ci")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = load_rows(tmp_path / "res")
    values = {(r.point, r.metric): r.value for r in rows.itertuples()}
    assert values == {("n3", "triangle"): 6.0, ("n4_ws2", "triangle"): 10.0, ("n4_ws2", "rank_sum"): 3.0}
    assert set(rows["prov_job_id"]) == {"4242"} and rows["run_id"].nunique() == 1
    assert set(rows.loc[rows.point == "n4_ws2", "prov_launcher"]) == {"torchrun"}
