"""A rank that dies mid-pipeline ends the whole job, non-zero, within 60 s (issue 7), and bad layouts are refused.

Two launch styles: ``repro.dist.spawn`` (a parent that kills the survivors), and independent processes that only
share MASTER_ADDR/PORT, as srun without --kill-on-bad-exit starts them: there the survivors must find out by
themselves (closed sockets, fail-fast exit, process-group timeout, watchdog: see repro.training.failfast). Those
ranks are forked from a warm server (tests/training/forked.py): what is tested is how survivors learn of a dead peer,
not a fresh interpreter's start.
"""

import os
import re
import time

import pytest

from repro.dist import SpawnError, init_parallel, spawn
from repro.dist.spawn import free_port
from repro.models import GPTConfig
from repro.training import train_gpt
from tests.training.forked import Forked  # rank processes forked from a warm server: see forked.py
from tests.training.ranks import ROOT

JOB = "tests.pipeline.dying_rank_job"  # run as python -m JOB from the repository root
SMALL = ["--layers", "2", "--hidden", "16", "--heads", "2", "--vocab", "64", "--seq-len", "8", "--steps", "50"]
CONFIG = GPTConfig(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2, max_position_embeddings=8,
                   hidden_dropout=0.0, attention_dropout=0.0)


def _bad_layout(rank, world_size, kind):
    if kind == "world":
        init_parallel(tp=2, pp=2, dp=2)  # 4 ranks launched, 8 asked for
    groups = init_parallel(pp=2)
    if kind == "layers":
        train_gpt(GPTConfig(vocab_size=64, hidden_size=16, num_layers=3, num_attention_heads=2,
                            max_position_embeddings=8), groups, 1, 2, seq_len=8)
    if kind == "micro_batches":
        train_gpt(CONFIG, groups, 1, 1, seq_len=8)


@pytest.mark.parametrize("kind,world_size,message", [
    ("world", 4, r"world size 4 != tp \* pp \* dp = 2 \* 2 \* 2 = 8"),
    ("layers", 2, "num_layers=3 is not divisible by the pipeline-parallel size pp=2"),
    ("micro_batches", 2, "num_micro_batches=1 is fewer than the pipeline stages pp=2"),
])
def test_bad_layout_is_refused_with_a_clear_error(kind, world_size, message):
    with pytest.raises(SpawnError, match=message):
        spawn(_bad_layout, world_size, kind, timeout_s=60)


def _die_in_spawn(rank, world_size):
    groups = init_parallel(tp=2, pp=2)
    actions = []

    def fault(kind, micro_batch):
        actions.append(kind)
        if rank == 3 and len(actions) == 7:  # last stage, second step, mid-schedule
            raise RuntimeError("rank 3 dies mid-pipeline")

    train_gpt(CONFIG, groups, 5, 4, seq_len=8, on_action=fault)


def test_dying_rank_fails_spawn_job():
    start = time.monotonic()
    with pytest.raises(SpawnError, match="rank 3 dies mid-pipeline"):
        spawn(_die_in_spawn, 4, timeout_s=60)
    assert time.monotonic() - start < 60


def _killed_by_the_kernel(rank, world_size):
    import signal

    import torch
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does: no traceback, no report
    time.sleep(0.5)
    dist.all_reduce(torch.ones(4))  # the survivor fails on the closed socket


def test_a_rank_killed_by_a_signal_is_named_before_the_survivors_error():
    """The OOM killer's SIGKILL leaves no traceback; the survivor's "connection closed by peer" arrives first and
    says nothing of memory, so the message names the killed rank and the signal before it."""
    with pytest.raises(SpawnError, match=r"^rank 0 was killed by SIGKILL \(the kernel's OOM killer"):
        spawn(_killed_by_the_kernel, 2, timeout_s=60)


@pytest.mark.parametrize("mode", ["exit", "raise", "hang"])
def test_dying_rank_fails_job_without_a_parent(mode, tmp_path):
    """pp=2; rank 1 (the last stage) fails at its 6th action (step 1); both processes must end non-zero.

    The process-group timeout is long (120 s: starting torch processes on a loaded 2-core machine can take tens
    of seconds, and the rendezvous shares that timeout); a dead or raising rank is noticed through its closed
    sockets, a hung one through the watchdog of every rank (8 s: it runs from the first step on, when a step of this
    model takes milliseconds, so a healthy rank is not mistaken for a hung one even on a loaded machine)."""
    world_size, port = 2, free_port()
    procs = []
    start = time.monotonic()
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(Forked(
            ["-m", JOB, "--fail-rank", "1", "--fail-after", "6", "--mode", mode, "--pp", "2",
             "--micro-batches", "2", "--timeout-s", "120", "--watchdog-s", "8", *SMALL],
            out=tmp_path / f"rank{rank}.log", env=env, cwd=ROOT))
    codes = []
    try:
        for proc in procs:  # generous: starting torch processes on a loaded 2-core machine can take a while
            codes.append(proc.wait(timeout=max(1.0, start + 150 - time.monotonic())))
        all_done = time.time()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    output = "\n".join(f"--- rank {r}\n{(tmp_path / f'rank{r}.log').read_text()[-1500:]}" for r in range(world_size))
    whole = "\n".join((tmp_path / f"rank{r}.log").read_text() for r in range(world_size))  # not only the tails
    injected = re.search(r"injecting '\w+' before \w+ \d+ at ([0-9.]+)", whole)
    assert injected, f"the fault was never injected; exit codes {codes}\n{output}"
    assert re.search(r" iteration +1/", (tmp_path / "rank0.log").read_text())  # it was training before the fault
    assert all(code != 0 for code in codes), f"exit codes {codes}\n{output}"
    elapsed = all_done - float(injected.group(1))
    print(f"{mode}: all {world_size} ranks exited {elapsed:.1f} s after the fault, codes {codes}")
    assert elapsed < 60, f"the job took {elapsed:.0f} s to die after the fault; exit codes {codes}\n{output}"
