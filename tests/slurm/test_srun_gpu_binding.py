"""slurm/launch.sh names the GPUs of every srun step on a GPU allocation (``--gpus-per-node=N --gpu-bind=none``:
each rank sees its node's GPUs and takes cuda:LOCAL_RANK) beside its ``--cpus-per-task``, and names none on a CPU
allocation (where a GPU option would make Slurm refuse the step). Without a cluster: srun is a stand-in that logs
its options and runs the command here (tests/slurm/launch_stubs.py); the GPU points run on CPU (REPRO_DEVICE=cpu).
The cpus on a real 2-node Slurm: tests/slurm/test_slurm_cpus_and_cap.py."""

from __future__ import annotations

import subprocess

import pytest

from repro.results import REPO_ROOT
from tests.slurm.launch_stubs import LAUNCH, make_stubs, stub_env

BIND = "--gpus-per-node=4 --gpu-bind=none"


def _steps(tmp_path, *launch_args: str, **env: str) -> list[str]:
    stubs = make_stubs(tmp_path)
    log = tmp_path / "srun.log"
    done = subprocess.run(["bash", str(LAUNCH), *launch_args], capture_output=True, text=True, timeout=300,
                          cwd=REPO_ROOT, env=stub_env(tmp_path, stubs, SRUN_LOG=str(log), **env))
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines()


@pytest.mark.parametrize("gpus", ["4", "4(IDX:0-3)", None])
def test_the_training_step_gets_the_nodes_gpus(tmp_path, gpus):
    extra = {"SLURM_GPUS_ON_NODE": gpus} if gpus else {}
    stubs_python = str(tmp_path / "bin" / "fakepy")
    (step,) = _steps(tmp_path, "--train", "--steps", "1", REPRO_PYTHON=stubs_python, **extra)
    assert "--cpus-per-task=1" in step  # 2 CPUs shared by 2 tasks per node
    assert (BIND in step) == bool(gpus) and ("--gpu" in step) == bool(gpus), step


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_every_experiment_step_gets_the_nodes_gpus(tmp_path, launcher):
    # srun's tasks are the ranks themselves: the stand-in, which would start one of them, only logs the step
    steps = _steps(tmp_path, "fake_sum", "ci", SLURM_GPUS_ON_NODE="4", SLURM_CPUS_ON_NODE="8", REPRO_DEVICE="cpu",
                   REPRO_LAUNCHER=launcher, SRUN_RUN="1" if launcher == "torchrun" else "0")
    assert len(steps) == 2, steps  # the one-rank point n3, the two-rank point n4_ws2
    one_rank, two_ranks = steps
    assert "--ntasks=1" in one_rank and "--cpus-per-task=8" in one_rank and BIND in one_rank
    assert BIND in two_ranks
    if launcher == "torchrun":  # one torchrun per node, given all of the node's CPUs and GPUs
        assert "--ntasks-per-node=1" in two_ranks and "--cpus-per-task=8" in two_ranks
    else:  # one task per rank, each a share of the node's CPUs
        assert "--ntasks=2" in two_ranks and "--cpus-per-task=4" in two_ranks
