"""A --save directory belongs to one running job (repro.training.dirlock): the lease rules as a table in this process
(each refused holder beside the stale one that is taken over), then two real jobs of two ranks each on one
directory: one trains, the other is refused in one line naming the holder, and after the holder is killed (-9) a
resume takes the directory over. Those ranks are forked from a warm server (tests/training/forked.py): the lock is
between processes, not about a fresh interpreter."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict

import pytest

from repro.training import dirlock
from repro.training.dirlock import LOCK_NAME, STALE_AFTER_S, DirectoryHeld, DirectoryLock, Holder, hold_directory
from tests.training.forked import ForkedRanks  # rank processes forked from a warm server: see forked.py

HOST = socket.gethostname()


@pytest.fixture(autouse=True)
def outside_slurm(monkeypatch):
    """Every run here is its own job (a test session inside a Slurm allocation would give them one job id)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _me(**changes) -> dict:
    holder = Holder.me()
    return {**asdict(holder), "token": "other-run", **changes}


#: name -> (lease written into the lock file (a function of nothing, run late), SLURM_JOB_ID of the taker, held?)
LEASES = {
    "a living process on this host": (lambda: _me(), None, True),
    "its process gone from this host": (lambda: _me(pid=_dead_pid()), None, False),
    "its pid reused by another program": (lambda: _me(pid=1, start="1"), None, False),
    "this host rebooted since": (lambda: _me(boot="another-boot"), None, False),
    "another host, refreshed just now": (lambda: _me(host="node-elsewhere"), None, True),
    "another host, not refreshed for too long": (
        lambda: _me(host="node-elsewhere", refreshed=time.time() - STALE_AFTER_S - 5), None, False),
    "another host, another Slurm job": (lambda: _me(host="node-elsewhere", job_id="41"), "42", True),
    "another host, this Slurm job (requeued)": (lambda: _me(host="node-elsewhere", job_id="42"), "42", False),
    "this host, this Slurm job (requeued)": (lambda: _me(job_id="42"), "42", False),
    "this host, another Slurm job": (lambda: _me(job_id="41"), "42", True),
    "another pid namespace, refreshed just now": (lambda: _me(pidns="pid:[1]"), None, True),
    "another pid namespace, stale": (lambda: _me(pidns="pid:[1]", refreshed=time.time() - 2 * STALE_AFTER_S),
                                     None, False),
    "an empty lease (released)": (lambda: "", None, False),
    "garbage": (lambda: "not json {", None, False),
    "a JSON list": (lambda: [1, 2], None, False),
    "a pid out of range": (lambda: _me(pid=2**70), None, False),
    "times that are not times": (lambda: _me(host="node-elsewhere", since="yesterday", refreshed=1e300), None, False),
    "a host that is not a name": (lambda: _me(host=["n1"]), None, False),
}


@pytest.mark.parametrize("name", sorted(LEASES))
def test_a_lease_holds_or_is_taken_over(name, tmp_path, monkeypatch):
    lease, job_id, held = LEASES[name]
    monkeypatch.setattr(dirlock, "_READ_PAUSE_S", 0.0)
    if job_id is None:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    else:
        monkeypatch.setenv("SLURM_JOB_ID", job_id)
    content = lease()
    (tmp_path / LOCK_NAME).write_text(content if isinstance(content, str) else json.dumps(content))
    if held:
        with pytest.raises(DirectoryHeld) as refused:
            hold_directory(tmp_path)
        line = str(refused.value)
        assert "\n" not in line and f"--save {tmp_path} is held by another run: pid " in line, line
        assert (tmp_path / LOCK_NAME).read_text() == (content if isinstance(content, str) else json.dumps(content))
    else:
        lock = hold_directory(tmp_path)
        try:
            mine = json.loads((tmp_path / LOCK_NAME).read_text())
            assert mine["pid"] == os.getpid() and mine["host"] == HOST and mine["token"] == lock.me.token
            assert lock.check() is None
        finally:
            lock.release()
        assert not (tmp_path / LOCK_NAME).exists()  # released: the directory is as it was, the next run takes it


def test_a_second_lock_in_the_same_process_is_refused_and_release_frees_it(tmp_path):
    first = hold_directory(tmp_path)
    try:
        with pytest.raises(DirectoryHeld, match=f"pid {os.getpid()} on host"):
            hold_directory(tmp_path)
    finally:
        first.release()
    hold_directory(tmp_path).release()


def test_a_busy_flock_refuses_until_its_lease_is_stale(tmp_path, monkeypatch):
    """Another open file holds the flock: with no lease yet (a run between its flock and its lease) the directory is
    held; with a lease whose process is gone (a dead node's lock, a forked child's descriptor) it is taken over."""
    monkeypatch.setattr(dirlock, "SETTLE_S", 0.01)
    path = tmp_path / LOCK_NAME
    path.write_text("")
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(DirectoryHeld):
            hold_directory(tmp_path)
        path.write_text(json.dumps(_me(pid=_dead_pid())))
        lock = hold_directory(tmp_path)
        assert lock.flock == "busy"
        lock.release()
    finally:
        os.close(other)


def test_a_lock_taken_over_is_noticed_before_the_next_save(tmp_path):
    lock = hold_directory(tmp_path)
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps(_me(host="node-elsewhere")))
        problem = lock.check()
        assert problem is not None and "was taken over by another run: pid" in problem, problem
    finally:
        lock.release()
    assert "node-elsewhere" in (tmp_path / LOCK_NAME).read_text()  # another run's lease is not emptied


def test_without_flock_the_lease_alone_decides(tmp_path, monkeypatch):
    """A file system without working locks (flock fails with ENOLCK): the first run's lease still refuses the second,
    and a lease that another run wrote over this one's during the settle time makes this one give way."""
    monkeypatch.setattr(dirlock, "_try_flock", lambda fd: "unsupported")
    monkeypatch.setattr(dirlock, "SETTLE_S", 0.01)
    first = hold_directory(tmp_path)
    try:
        assert first.flock == "unsupported"
        with pytest.raises(DirectoryHeld, match=f"pid {os.getpid()} on host {HOST}"):
            hold_directory(tmp_path)
    finally:
        first.release()
    real_sleep = time.sleep

    def rival_writes_meanwhile(seconds: float) -> None:  # the other run's lease lands between write and re-read
        (tmp_path / LOCK_NAME).write_text(json.dumps(_me(host="node-elsewhere", token="rival")))
        real_sleep(seconds)
    monkeypatch.setattr(dirlock.time, "sleep", rival_writes_meanwhile)
    with pytest.raises(DirectoryHeld, match="host node-elsewhere"):
        hold_directory(tmp_path)


def test_a_save_whose_lock_was_taken_over_publishes_nothing(tmp_path):
    """save_training_checkpoint's guard (rank 0's DirectoryLock.check): a reason stops the save before a byte is
    written, as CheckpointWriteError (exit code 74 in repro train)."""
    from repro.dist import init_parallel
    from repro.models import GPTConfig
    from repro.training.checkpoint import save_training_checkpoint
    from repro.training.trainer import PipelineTrainer, TrainSettings
    from repro.zero.checkpoint import CheckpointWriteError

    config = GPTConfig(vocab_size=64, hidden_size=32, num_layers=1, num_attention_heads=4, max_position_embeddings=16)
    trainer = PipelineTrainer(config, init_parallel(), TrainSettings(steps=1, micro_batches=1, micro_batch_size=1,
                                                                     seq_len=16))
    with pytest.raises(CheckpointWriteError, match="taken over by another run: pid 7; nothing was published"):
        save_training_checkpoint(tmp_path / "c", trainer, guard=lambda: "taken over by another run: pid 7")
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    save_training_checkpoint(tmp_path / "c", trainer, guard=lambda: None)
    assert (tmp_path / "c" / "latest_checkpointed_iteration.txt").read_text() == "0\n"


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_lock_file_that_is_not_a_file_is_refused(kind, tmp_path):
    path = tmp_path / LOCK_NAME
    if kind == "symlink":
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(ValueError, match=f"lock file {path}"):
        DirectoryLock(tmp_path).acquire()


def test_two_jobs_of_two_ranks_on_one_directory(tmp_path):
    """Both jobs start together: exactly one trains, the other's ranks exit 2 with one line from its rank 0 naming
    the holder. The holder killed with SIGKILL leaves its lease behind; a resume takes the directory over."""
    ckpt = tmp_path / "ckpt"
    common = ["--save", str(ckpt), "--load", str(ckpt), "--save-interval", "1"]
    jobs = [ForkedRanks(tmp_path, name, 2, ["--steps", "100000", *common]) for name in ("a", "b")]
    try:
        deadline = time.monotonic() + 150
        while not any(all(p.poll() is not None for p in job.procs) for job in jobs):
            assert time.monotonic() < deadline, "\n".join(job.all_output() for job in jobs)
            time.sleep(0.2)
        refused = next(job for job in jobs if all(p.poll() is not None for p in job.procs))
        holder = next(job for job in jobs if job is not refused)
        assert [p.returncode for p in refused.procs] == [2, 2], refused.all_output()
        lines = [line for line in refused.output(0).splitlines() if line.strip()]
        assert len(lines) == 1 and f"--save {ckpt} is held by another run: pid {holder.procs[0].pid} on host" in \
            lines[0], refused.all_output()
        assert not refused.output(1).strip(), refused.all_output()  # rank 1 says nothing: rank 0 says why
        holder.wait_for(r"saved checkpoint at iteration\s+2 ")
        os.kill(holder.procs[0].pid, signal.SIGKILL)
        holder.kill()
    finally:
        for job in jobs:
            job.kill()
    assert json.loads((ckpt / LOCK_NAME).read_text())["pid"] == holder.procs[0].pid  # the dead run's lease
    resumed = ForkedRanks(tmp_path, "resumed", 1, ["--steps", "3", "--micro-batches", "4", *common])  # dp 2 -> 1
    assert resumed.wait() == [0], resumed.all_output()
    assert "resumed from checkpoint" in resumed.output(), resumed.all_output()
