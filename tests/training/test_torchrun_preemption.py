"""Issue 27: a preemption signal to any process of a torchrun job saves every rank, and the caller learns of it.

One training (tp=2 over 2 ranks, dropout on, cosine schedule) is stopped five or six times (the torch of 2.9 on has
one stop more), each time through another process and launcher, and resumed from its checkpoint each time; its losses
must equal a straight run's. That one run (:func:`preempted`) is read by each test that needs a stopped job. The exit
codes are the ones README.md documents: plain torchrun dies of SIGUSR1 (138) while its ranks, told by the kernel,
save on their own; told to handle SIGUSR1 it passes it on but exits 1; ``python -m repro.dist.torchrun`` exits 75.
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

from repro.dist.torchrun import AGENT_SIGNALS, EXIT_HUNG, EXIT_PREEMPTED, agent_handles_signal_option, children, exit_code
from tests.training.forked import ForkedRanks  # rank processes forked from a warm server: see forked.py
from tests.training.ranks import SMALL, iterations

#: enough steps that six stops, each a few steps past its signal on a loaded machine (38 once, through the wrapper
#: at a load of 24 on 2 cores), leave some for the last resume
STEPS = 100
TRAIN = ["--tp", "2", "--steps", str(STEPS), "--lr-warmup-iters", "3", "--lr-decay-style", "cosine", "--dropout", "0.1"]


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts: an orphan's new parent may be slow to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class TorchrunJob:
    """``[python -m repro.dist.torchrun | python -m torch.distributed.run] --nproc-per-node 2 -m repro.training``."""

    def __init__(self, tmp: Path, name: str, args: list[str], *, wrapper: bool, torchrun_args: tuple = ()) -> None:
        self.log = tmp / f"{name}.log"
        launcher = "repro.dist.torchrun" if wrapper else "torch.distributed.run"
        if not wrapper:  # a port of its own, as the wrapper gives one on every torch (torch 2.4 would bind 29500)
            torchrun_args = ("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", *torchrun_args)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "SLURM_"))}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", launcher, "--nproc-per-node", "2", *torchrun_args, "-m", "repro.training",
                 *SMALL, "--timeout-s", "60", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        self.wrapper = wrapper

    def output(self) -> str:
        return self.log.read_text()

    def wait_for_iteration(self, iteration: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            done = [int(n) for n in re.findall(r"^ \[[^]]+\] iteration +(\d+)/", self.output(), re.M)]
            if done and done[-1] >= iteration:
                return
            assert self.proc.poll() is None, f"ended before iteration {iteration}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no iteration {iteration} in {timeout_s} s:\n{self.output()[-3000:]}"
            time.sleep(0.05)

    def agent(self) -> int:
        return children(self.proc.pid)[0] if self.wrapper else self.proc.pid

    def ranks(self) -> list[int]:
        pids = children(self.agent())
        assert len(pids) == 2, pids
        return pids

    def wait(self, timeout_s: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _latest(ckpt: Path) -> int:
    return int((ckpt / "latest_checkpointed_iteration.txt").read_text())


def _stop(tmp: Path, ckpt: Path, name: str, target: str, sig: signal.Signals, *, wrapper: bool,
          torchrun_args: tuple = ()) -> tuple[int, str]:
    """Resume the training, let it take two steps, send ``sig`` to ``target`` (wrapper, agent or rank); returns the
    caller's exit code and the output, once every rank has exited and the checkpoint has moved on."""
    before = _latest(ckpt) if (ckpt / "latest_checkpointed_iteration.txt").exists() else 0
    job = TorchrunJob(tmp, name, [*TRAIN, "--save", str(ckpt), "--load", str(ckpt)], wrapper=wrapper,
                      torchrun_args=torchrun_args)
    job.wait_for_iteration(before + 2)
    ranks = job.ranks()
    pid = {"wrapper": job.proc.pid, "agent": job.agent(), "rank": ranks[1]}[target]
    os.kill(pid, sig)
    code = job.wait()
    deadline = time.monotonic() + 60
    while not all(_gone(rank) for rank in ranks):  # orphans of a dead agent finish on their own
        assert time.monotonic() < deadline, job.output()[-3000:]
        time.sleep(0.1)
    out = job.output()
    assert "exiting with code 75" in out, out[-3000:]
    saved = _latest(ckpt)
    assert before < saved < STEPS, (before, saved)
    shards = sorted(p.name for p in (ckpt / f"iter_{saved:07d}").glob("rank*.pt"))
    assert shards == ["rank00000.pt", "rank00001.pt"], shards  # every rank saved
    return code, out


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> dict:
    """The training stopped through each process and launcher in turn, then finished beside a straight run: each
    stop's (exit code, output) by name, in order, and the checkpoint and straight run's logs. One run for this file's
    tests (its seven torchrun jobs are ~11 s of CPU each, nearly all of it new interpreters starting)."""
    tmp_path = tmp_path_factory.mktemp("preempted")
    ckpt = tmp_path / "ckpt"
    stops: dict[str, tuple[int, str]] = {}
    # plain torchrun, SIGUSR1 to its agent; then SIGTERM, which it handles
    stops["plain"] = _stop(tmp_path, ckpt, "plain", "agent", signal.SIGUSR1, wrapper=False)
    stops["plain_term"] = _stop(tmp_path, ckpt, "plain_term", "agent", signal.SIGTERM, wrapper=False)
    if agent_handles_signal_option():  # torch >= 2.9: the agent can be told to pass SIGUSR1 on
        stops["handled"] = _stop(tmp_path, ckpt, "handled", "agent", signal.SIGUSR1, wrapper=False,
                                 torchrun_args=("--signals-to-handle", AGENT_SIGNALS))
    # repro.dist.torchrun, the signal to each of its processes
    for name, target, sig in (("to_agent", "agent", signal.SIGUSR1), ("to_rank", "rank", signal.SIGUSR1),
                              ("to_wrapper", "wrapper", signal.SIGTERM)):
        stops[name] = _stop(tmp_path, ckpt, name, target, sig, wrapper=True)
    # the last resume and the straight run train side by side (they share nothing but the machine; the stopped
    # jobs above run alone, so that a loaded machine does not let them train past the signal into the last step)
    straight = ForkedRanks(tmp_path, "straight", 2, [*TRAIN, "--log-jsonl", str(tmp_path / "straight.jsonl")])
    try:
        last = TorchrunJob(tmp_path, "last", [*TRAIN, "--save", str(ckpt), "--load", str(ckpt)], wrapper=True)
        last_code = last.wait()
    except BaseException:
        straight.kill()
        raise
    return {"stops": stops, "ckpt": ckpt, "last": (last_code, last.output()), "straight": straight.wait(),
            "straight_output": straight.all_output(), "straight_log": tmp_path / "straight.jsonl"}


def test_signals_to_every_process_of_a_torchrun_job_save_and_resume_exactly(preempted):
    stops = preempted["stops"]
    # plain torchrun, SIGUSR1 to its agent: the agent dies of it (138 in a shell); the ranks get SIGTERM from the
    # kernel (PR_SET_PDEATHSIG) and save, but nobody is left to report their 75
    code, out = stops["plain"]
    assert code == -signal.SIGUSR1 and "received SIGTERM" in out, (code, out[-3000:])
    # SIGTERM it handles: it passes it on, waits for the ranks, and exits 1
    code, out = stops["plain_term"]
    assert code == 1 and "received SIGTERM" in out, (code, out[-3000:])
    if "handled" in stops:  # torch >= 2.9, told to handle SIGUSR1: the agent passes it on; it then exits 1
        code, out = stops["handled"]
        assert code == 1 and "received SIGUSR1" in out, (code, out[-3000:])
    # repro.dist.torchrun: 75 whichever process gets the signal
    for name in ("to_agent", "to_rank", "to_wrapper"):
        code, out = stops[name]
        assert code == EXIT_PREEMPTED, (name, code, out[-3000:])
    code, out = preempted["last"]
    assert code == 0, out[-3000:]
    assert preempted["straight"] == [0, 0], preempted["straight_output"]
    ckpt = preempted["ckpt"]
    resumed = iterations(ckpt / "log.jsonl")
    assert [r["iteration"] for r in resumed] == list(range(1, STEPS + 1))
    assert [r["lm_loss"] for r in resumed] == [r["lm_loss"] for r in iterations(preempted["straight_log"])]
    starts = [line for line in (ckpt / "log.jsonl").read_text().splitlines() if '"event": "start"' in line]
    assert len(starts) == len(stops) + 1


def test_a_signal_to_the_wrapper_during_training_is_passed_on_without_a_traceback(preempted):
    """SIGTERM to ``python -m repro.dist.torchrun`` while its ranks train: passed on without torchrun's
    SignalException traceback, and 75 once the ranks saved (the "to_wrapper" stop; tests/training/
    test_torchrun_signals.py has the signal after the end)."""
    code, out = preempted["stops"]["to_wrapper"]
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]
    assert code == EXIT_PREEMPTED and "exiting with code 75 (preempted" in out, out[-3000:]


STATELESS = """
import os, sys, time
open(os.environ["OUT"] + "." + os.environ["RANK"], "w").close()
time.sleep(float(os.environ.get("SLEEP", "0")))
sys.exit(int(os.environ.get("RC", "0")))
"""


@pytest.mark.parametrize("sig,rc,expected", [(None, 0, 0), (None, 1, 1), (signal.SIGUSR1, 0, EXIT_PREEMPTED)],
                         ids=["success", "failure", "signalled"])
def test_a_stateless_point_under_the_wrapper(tmp_path, sig, rc, expected):
    """A point that keeps no state (an experiment) and dies of the signal: the wrapper exits 75 when a preemption
    signal reached it and the run failed; otherwise torchrun's code (1 for a failed worker)."""
    script = tmp_path / "point.py"
    script.write_text(STATELESS)
    env = dict(os.environ, OUT=str(tmp_path / "started"), SLEEP="60" if sig else "0", RC=str(rc))
    proc = subprocess.Popen([sys.executable, "-m", "repro.dist.torchrun", "--nproc-per-node", "2", str(script)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if sig is not None:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"started.{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        proc.send_signal(sig)
    out = proc.communicate(timeout=90)[0]
    assert proc.returncode == expected, out[-3000:]


def test_exit_code_rules():
    assert exit_code(0, rank_preempted=False, signalled=None) == 0
    assert exit_code(1, rank_preempted=True, signalled=None) == EXIT_PREEMPTED
    assert exit_code(-signal.SIGUSR1, rank_preempted=False, signalled="SIGUSR1") == EXIT_PREEMPTED
    assert exit_code(0, rank_preempted=False, signalled="SIGTERM") == 0  # finished before the signal mattered
    assert exit_code(-signal.SIGKILL, rank_preempted=False, signalled=None) == 137
    assert exit_code(1, rank_preempted=False, signalled=None) == 1
    assert exit_code(1, rank_preempted=False, signalled=None, rank_hung=True) == EXIT_HUNG
    assert exit_code(1, rank_preempted=True, signalled=None, rank_hung=True) == EXIT_PREEMPTED  # saved: requeue
    assert exit_code(0, rank_preempted=False, signalled=None, rank_hung=True) == 0


def test_a_stopped_rank_ends_a_wrapped_torchrun_job_within_timeout_plus_15_s(tmp_path):
    """Rank 1 frozen (SIGSTOP): rank 0 gives up after --timeout-s and exits 124; torchrun's agent would then wait its
    30 s shutdown timeout for a rank that cannot act on SIGTERM (41 s in all). The wrapper kills the stopped rank
    once a rank has reported the hang, and exits 124."""
    timeout_s = 5
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "SLURM_"))}
    log = tmp_path / "stopped.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "repro.dist.torchrun", "--nproc-per-node", "2", "-m",
                                 "repro.training", *SMALL, "--pp", "2", "--steps", "100000", "--timeout-s",
                                 str(timeout_s)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not re.search(r"^ \[[^]]+\] iteration +2/", log.read_text(), re.M):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        agent = children(proc.pid)[0]
        rank1 = [pid for pid in children(agent)
                 if b"LOCAL_RANK=1\0" in Path(f"/proc/{pid}/environ").read_bytes()][0]
        os.kill(rank1, signal.SIGSTOP)
        stopped = time.monotonic()
        code = proc.wait(timeout=120)
        elapsed = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert code == EXIT_HUNG, output[-3000:]
    assert elapsed < timeout_s + 15, f"{elapsed:.1f} s:\n{output[-3000:]}"
    assert "killed 1 stopped rank(s)" in output and "a rank gave up on a hang: exit code 124" in output
