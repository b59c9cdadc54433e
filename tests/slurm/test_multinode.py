"""Multi-node jobs on a real Slurm (issue 27): the emulated cluster of ``slurm/local/start.sh --nodes 2`` (two
slurmd on this machine, each its own node; CI starts it; skipped with fewer than 2 usable nodes).

* ``repro train --tp 2`` through slurm/train.sbatch with ``sbatch --nodes=2 --ntasks-per-node=1``: one rank per
  node, the head node's name as MASTER_ADDR. It gets ``scancel --signal=USR1`` after a few iterations (Slurm signals
  the step's processes on both nodes); both ranks save and exit 75, slurm/launch.sh requeues the two-node job, and
  the second attempt (again on two nodes) resumes and ends with the losses of the same job run straight through.
* One point of a cheap experiment spread over two nodes, submitted as a user would:
  ``repro submit t3_overlap --point exactness_tp2 --nodes 2 --wait``. slurm/launch.sh starts one torchrun per node
  with c10d rendezvous on the head node, and the rows land with the job id and the two-node node list.

REPRO_PYTHON is a wrapper that logs on which node each task of an srun step runs, so the logs show the placement.
All jobs run side by side (about a minute on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.harness import submit as S
from repro.results import REPO_ROOT, load_rows
from tests.slurm.local_slurm import (
    ITERATION, check_resumed_like_straight, read_log, restarts, sbatch, skip_without_local_slurm, usable_nodes,
)

pytestmark = pytest.mark.slurm

WAIT_S = 240.0
PLACED = re.compile(r"^task (\d+) of step (\S+) runs on (\S+)$", re.M)
TRAIN = ["--tp", "2", "--steps", "40", "--layers", "4", "--hidden", "128", "--seq-len", "64", "--save-interval", "1000"]
TWO_NODES = ["--nodes=2", "--ntasks-per-node=1"]
SUBMIT = ["submit", "t3_overlap", "--point", "exactness_tp2", "--nodes", "2", "--wait", "--timeout", str(int(WAIT_S)),
          "--progress-every", "60"]

WRAPPER = """#!/bin/bash
# REPRO_PYTHON of these jobs: python, after saying on which (emulated) node this task of an srun step runs
if [[ "${SLURM_STEP_ID:-}" =~ ^[0-9]+$ ]]; then
  echo "task ${SLURM_PROCID:-?} of step $SLURM_STEP_ID runs on ${SLURMD_NODENAME:-?}" >&2
fi
exec %s "$@"
"""

skip_without_local_slurm(nodes=2)


def _hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    return out.stdout.split()


def _queued(job_ids: list[str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True,
                         timeout=30).stdout.split()
    return [job_id for job_id in job_ids if job_id in out]


def _cancel(job_ids: list[str]) -> None:
    """scancel until the jobs have left the queue (a cancel that meets a job while it is being requeued is lost)."""
    deadline = time.monotonic() + 30
    while job_ids and time.monotonic() < deadline:
        subprocess.run(["scancel", *job_ids], capture_output=True)
        time.sleep(1)
        job_ids = _queued(job_ids)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Submit the two training jobs and the experiment, preempt one training job after 3 iterations, wait for all."""
    tmp = tmp_path_factory.mktemp("multinode")
    wrapper = tmp / "python.sh"
    wrapper.write_text(WRAPPER % sys.executable)
    wrapper.chmod(0o755)
    env = {**os.environ, "REPRO_ROOT": str(REPO_ROOT), "REPRO_PYTHON": str(wrapper),
           "REPRO_RESULTS_DIR": str(tmp / "results")}
    ids: dict[str, str] = {}
    submit = None
    try:
        for key in ("preempted", "straight"):
            ids[key] = sbatch(["sbatch", "--parsable", *TWO_NODES, f"--output={tmp}/{key}-%j.out",
                                "slurm/train.sbatch", *TRAIN], env)
        logs = {key: tmp / f"{key}-{ids[key]}.out" for key in ids}
        submit = subprocess.Popen([sys.executable, "-m", "repro", "--results-dir", str(tmp / "exp"), *SUBMIT],
                                  cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        start = time.monotonic()
        signalled = None
        while signalled is None and time.monotonic() - start < WAIT_S:
            if len(ITERATION.findall(read_log(logs["preempted"]))) >= 3:
                subprocess.run(["scancel", "--signal=USR1", ids["preempted"]], check=True)
                signalled = round(time.monotonic() - start, 1)
            time.sleep(0.2)
        while _queued(list(ids.values())) and time.monotonic() - start < WAIT_S:
            time.sleep(0.5)
        trained = round(time.monotonic() - start, 1)
        try:
            submitted, _ = submit.communicate(timeout=max(10.0, WAIT_S - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            submit.kill()
            submitted, _ = submit.communicate()
        print(f"signalled at {signalled} s, training jobs ended at {trained} s, "
              f"repro submit --wait ended at {time.monotonic() - start:.1f} s")
        found = re.search(r"^submitted job (\d+) ", submitted, re.M)
        if found:
            ids["experiment"] = found.group(1)
        log_path = re.search(r"^job \S+: \w+, exit code \S+, log (\S+)$", submitted, re.M)
        yield {"ids": ids, "signalled": signalled, "submit_rc": submit.returncode, "submit_out": submitted,
               "states": {key: S.job_states(ids[key]) for key in ("preempted", "straight")},
               "restarts": {key: restarts(ids[key]) for key in ("preempted", "straight")},
               "logs": {key: read_log(path) for key, path in logs.items()},
               "experiment_log": read_log(Path(log_path.group(1))) if log_path else "",
               "results": tmp / "results", "exp_results": tmp / "exp"}
    finally:
        if submit is not None and submit.poll() is None:
            submit.kill()
        _cancel(list(ids.values()))


def _placement(log: str) -> dict[str, str]:
    """rank -> node of the one srun step in this part of a training log."""
    return {task: node for task, _, node in PLACED.findall(log)}


def test_two_node_training_preempted_by_scancel_usr1_requeues_resumes_and_matches_a_straight_run(jobs):
    ids, logs = jobs["ids"], jobs["logs"]
    assert jobs["signalled"] is not None, "the training job never logged 3 iterations:\n" + logs["preempted"]
    for key in ("preempted", "straight"):
        states = jobs["states"][key]
        assert states and all(s.ok for s in states), "; ".join(s.describe() for s in states) + "\n" + logs[key]
    log, straight = logs["preempted"], logs["straight"]
    first, _, second = log.partition("attempt=2")
    assert "attempt=1" in first and second, log
    nodes = usable_nodes()
    for part in (first, second, straight):
        # one rank per node, on two different nodes, rendezvous at the head node (the first of the allocation)
        assert "nodes=2" in part and "ranks=2" in part, part
        placement = _placement(part)
        assert sorted(placement) == ["0", "1"] and len(set(placement.values())) == 2, part
        assert set(placement.values()) <= set(nodes), (placement, nodes)
        head = re.search(r"head=(\S+)", part).group(1)
        assert head == placement["0"], part
    # the preemption reached both nodes' ranks: they saved, exited 75, and the two-node job was requeued
    assert "no checkpoint in" in first and "received SIGUSR1" in first and "exiting with code 75" in first, log
    placement = _placement(first)
    for rank, node in placement.items():  # srun's report of each rank, from its own node
        assert f"srun: error: {node}: task {rank}: Exited with exit code 75" in first, first
    assert "training stopped for preemption (exit code 75)" in first and f"scontrol requeue {ids['preempted']}" in first
    assert jobs["restarts"] == {"preempted": 1, "straight": 0}
    check_resumed_like_straight(first, second, straight)
    # what trained was tp 2 over the two ranks
    ckpt = jobs["results"] / "checkpoints" / f"repro-train-{ids['preempted']}" / "iter_0000040"
    trainer = json.loads((ckpt / "trainer.json").read_text())
    assert (trainer["tp"], trainer["pp"], trainer["dp"]) == (2, 1, 1)
    assert json.loads((ckpt / "manifest.json").read_text())["world_size"] == 2


def test_an_experiment_point_over_two_nodes_runs_through_launch_sh_and_writes_rows(jobs):
    out, log = jobs["submit_out"], jobs["experiment_log"]
    assert jobs["submit_rc"] == 0, out + "\n" + log
    assert "--nodes=2 --ntasks-per-node=1" in out and "t3_overlap.sbatch ci" in out, out
    assert re.search(r"^job \S+: (RUNNING|COMPLETING) -> COMPLETED \(exit code 0:0\)", out, re.M), out + "\n" + log
    assert "nodes=2" in log and "ranks/node=1" in log and "point exactness_tp2: 2 rank(s) on cpu" in log, log
    # one torchrun agent per node (srun --ntasks-per-node=1), each with one rank
    placement = {task: node for task, _, node in PLACED.findall(log)}
    assert sorted(placement) == ["0", "1"] and len(set(placement.values())) == 2, log
    rows = load_rows(jobs["exp_results"], latest_only=False)
    rows = rows[(rows.experiment == "t3_overlap") & (rows.point == "exactness_tp2")]
    assert len(rows) > 0, log
    assert set(rows["prov_job_id"].astype(str)) == {f"{jobs['ids']['experiment']}_0"}
    assert set(rows["prov_world_size"]) == {2} and set(rows["prov_launcher"]) == {"torchrun"}
    (nodelist,) = set(rows["prov_nodelist"])
    assert sorted(_hostnames(nodelist)) == sorted(placement.values()), (nodelist, placement)
