"""A checkpoint that cannot be written (a full disk) stops the run on every rank with one line and exit code 74
(not 75, which would requeue it into the same full disk), and the last checkpoint stays the newest and loads
(issue 36)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from repro.training.checkpoint import latest_iteration
from repro.training.failfast import EXIT_WRITE_FAILED
from tests.training import forked
from tests.training.forked import ForkedRanks


@pytest.fixture
def small_tmpfs(tmp_path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    # room for one checkpoint of the model below (~1.4 MB) and the first pieces of a second
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2600k", "tmpfs", str(mount_point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _train(*args: str, interpreter: bool = False) -> subprocess.CompletedProcess:
    """``python -m repro.training``: a new interpreter, or forked from a warm server (tests/training/forked.py)."""
    argv = ["--layers", "2", "--hidden", "64", "--log-interval", "1", *args]
    if not interpreter:
        return forked.train(argv, timeout=180)
    return subprocess.run([sys.executable, "-m", "repro.training", *argv], capture_output=True, text=True,
                          timeout=180)


def test_a_full_disk_during_a_save_stops_with_one_line_and_the_last_checkpoint_intact(small_tmpfs):
    ckpt = small_tmpfs / "ckpt"
    run = _train("--steps", "4", "--save", str(ckpt), "--save-interval", "2", interpreter=True)
    assert run.returncode == EXIT_WRITE_FAILED, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    line = [text for text in run.stderr.splitlines() if "error" in text]  # the error line goes to stderr
    assert len(line) == 1 and "disk full while writing" in line[0], run.stdout + run.stderr
    assert "the last checkpoint, iteration 2, is intact" in line[0] and f"--load {ckpt}" in line[0]
    assert latest_iteration(ckpt) == 2
    assert sorted(p.name for p in ckpt.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt", "log.jsonl",
                                                      "train_args.json"]  # no partial directory
    resumed = _train("--steps", "2", "--load", str(ckpt))
    assert resumed.returncode == 0 and "resumed from checkpoint" in resumed.stdout, resumed.stdout + resumed.stderr


def test_one_rank_with_a_full_disk_stops_every_rank_naming_it(tmp_path):
    """Rank 1 alone cannot write (its own disk, or its quota): rank 0 must not wait for it until the timeout, and
    must not publish a checkpoint without rank 1's file."""
    ckpt = tmp_path / "ckpt"
    job = ForkedRanks(tmp_path, "full", 2, ["--steps", "6", "--pp", "2", "--save", str(ckpt), "--save-interval", "2",
                                      "--full-rank", "1", "--full-at", "2"],
                timeout_s=30, program=["-m", "tests.training.full_disk_job"])
    try:
        codes = job.wait(timeout_s=120)
    finally:
        job.kill()
    assert codes == [EXIT_WRITE_FAILED, EXIT_WRITE_FAILED], job.all_output()
    output = job.all_output()
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if "repro train: error" in line]
    assert len(errors) == 1, output
    assert "rank 1: disk full while writing" in errors[0] and "rank00001.pt" in errors[0], errors
    assert "the last checkpoint, iteration 2, is intact" in errors[0]
    assert latest_iteration(ckpt) == 2 and not (ckpt / "iter_0000004.partial").exists()
