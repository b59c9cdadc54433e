"""``python -m repro.dist.torchrun``: torchrun, with every preemption signal passed on and exit code 75 passed out.

    python -m repro.dist.torchrun --nproc-per-node 2 -m repro.training --tp 2 --save ckpt --load ckpt

It takes torchrun's own options and runs ``python -m torch.distributed.run`` with them, fixing what plain torchrun
does to a preemption:

* **SIGUSR1 kills torchrun's agent** (exit 138) unless the agent is told to handle it (``--signals-to-handle``,
  added after torch 2.8 by PyTorch PR 160690: 2.13 and 2.15 have it, 2.4 has not), and its ranks go on training,
  orphaned. This wrapper asks the agent to handle SIGUSR1 where it can (``PET_SIGNALS_TO_HANDLE``), and passes
  SIGUSR1 and SIGTERM that reach the wrapper on to the agent: as they are where the agent handles them, as SIGTERM
  where it does not. The agent sends the signal to its ranks, which finish their step, save and exit 75
  (:mod:`repro.training.preemption`).
* **torchrun turns a rank's 75 into its own 1**, so a batch script cannot tell a preemption from a crash. Each rank
  that stops for a preemption writes the file named by ``REPRO_PREEMPTED_FILE`` (set here, one per run); when it
  exists, or when a preemption signal reached this wrapper and torchrun then failed, the wrapper exits 75.
* **An agent killed by a signal leaves its ranks behind.** The wrapper is a child subreaper: ranks orphaned by the
  agent become its children; it sends them SIGTERM (repro's training ranks get it from the kernel anyway, through
  ``PR_SET_PDEATHSIG``), waits until every one of them has saved and exited, and only then decides its exit code.
* **A frozen rank holds the job for torchrun's shutdown timeout.** When a rank gives up on a hang (exit 124, see
  :mod:`repro.training.watchdog`), the agent SIGTERMs the others and waits ``--shutdown-timeout`` (30 s) for them;
  a stopped rank (SIGSTOP, a frozen node) cannot act on SIGTERM, so the job ended 41 s after the stop with
  ``--timeout-s 5``. Each rank that gives up writes the file ``REPRO_HUNG_FILE`` names; the wrapper then SIGKILLs
  the stopped ranks at once and exits 124, so the job ends within ``--timeout-s`` + 15 s.

* **torchrun turns a rank's 2, 3 or 74 into its own 1 and buries the rank's one line under ~45 lines** of its
  failure report. The agent runs as :mod:`repro.dist.torchrun_agent`: when every failed rank exited with one of the
  suite's codes (2 a bad input, 3 a non-finite loss, 74 a failed save, 75, 124) or was stopped by the agent after
  it, the report is left out and the first failed rank's code is passed out.

* **A signal after the end is no failure.** Each training rank notes in ``REPRO_RANKS_FILE`` that it started and
  that it finished (saved, exit 0); when every rank that started finished, the job exits 0 whatever signal reached
  torchrun after that (the agent stopping on it made torchrun's code 1, or 75 here). A signal to the agent is one
  line, not torchrun's ``SignalException`` traceback (:mod:`repro.dist.torchrun_agent`).

Other exit codes are torchrun's (128 + N when a signal N ended it). After forwarding a signal the agent gives its
ranks ``--shutdown-timeout`` seconds (30 by default; torch 2.4 has no such option) before it kills them: raise it
when a checkpoint takes longer to write.
"""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Sequence

#: exit code of a job stopped by a preemption signal (after saving); ``EX_TEMPFAIL`` of sysexits.h
EXIT_PREEMPTED = 75
#: names the file a rank that stops for a preemption writes (see :func:`repro.training.preemption.note_preempted`)
PREEMPTED_FILE_VAR = "REPRO_PREEMPTED_FILE"
#: the signals the agent should handle and forward: torchrun's default four and Slurm's preemption warning
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
PREEMPTION_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
FORWARDED_SIGNALS = (*PREEMPTION_SIGNALS, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: names the file a rank that gives up on a hang writes (see :func:`repro.training.watchdog.note_hung`)
HUNG_FILE_VAR = "REPRO_HUNG_FILE"
#: names the file where each training rank notes that it started and that it finished (saved, exit 0): a signal
#: that comes after every rank finished does not turn the job's 0 into a failure
#: (see :func:`repro.training.preemption.note_rank`)
RANKS_FILE_VAR = "REPRO_RANKS_FILE"
#: what ``timeout`` and the trainer's watchdog report for a job that made no progress
EXIT_HUNG = 124
#: seconds between the wrapper's looks for a hung rank while torchrun runs
POLL_S = 0.5
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36
PROG = "repro torchrun"


def prctl(option: int, value: int) -> bool:
    """Linux ``prctl(option, value)``; False where it is unavailable or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def agent_handles_signal_option() -> bool:
    """Whether this torch's torchrun takes ``--signals-to-handle`` (and so ``PET_SIGNALS_TO_HANDLE``): whether its
    ``LaunchConfig`` has the field. Read from torch's source, not imported: importing torch cost the wrapper ~2.5 s of
    CPU per job (the agent imports it anyway). The source answers for any build (a version number would not, for a
    nightly); where it cannot be read, the class itself does."""
    spec = importlib.util.find_spec("torch")  # finds torch without running it
    source = Path(spec.origin).parent / "distributed" / "launcher" / "api.py" if spec and spec.origin else None
    try:
        tree = ast.parse(source.read_bytes()) if source is not None else None
    except (OSError, SyntaxError, ValueError):
        tree = None
    config = [node for node in getattr(tree, "body", ()) if isinstance(node, ast.ClassDef)
              and node.name == "LaunchConfig"]
    if config:  # a dataclass's fields are its annotated names
        return any(isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                   and item.target.id == "signals_to_handle" for item in config[0].body)
    from torch.distributed.launcher.api import LaunchConfig

    return "signals_to_handle" in {field.name for field in dataclasses.fields(LaunchConfig)}


def exit_code(torchrun_rc: int, *, rank_preempted: bool, signalled: str | None, rank_hung: bool = False) -> int:
    """The wrapper's exit code: 75 when a rank stopped for a preemption, or when a preemption signal reached the
    wrapper and torchrun then ended unsuccessfully; 124 when a rank gave up on a hang (and torchrun failed); else
    torchrun's (128 + N for a signal N, as a shell reports)."""
    if rank_preempted or (signalled is not None and torchrun_rc != 0):
        return EXIT_PREEMPTED
    if rank_hung and torchrun_rc != 0:
        return EXIT_HUNG
    return 128 - torchrun_rc if torchrun_rc < 0 else torchrun_rc


def all_finished(ranks_file: Path) -> bool:
    """Whether every rank that noted its start in ``ranks_file`` also noted that it finished (at least one did)."""
    import json

    started, finished = set(), set()
    try:
        lines = ranks_file.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            entry = json.loads(line)
            (finished if entry["event"] == "finished" else started).add(int(entry["rank"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a rank killed while writing it
    return bool(started) and started <= finished


def _state(pid: int) -> str:
    """The process state letter of /proc/PID/stat ('T': stopped), or '' when it is gone."""
    try:
        return Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the agent's ranks and theirs)."""
    found, todo = [], [pid]
    while todo:
        below = children(todo.pop())
        found += below
        todo += below
    return found


def kill_stopped(agent_pid: int) -> list[int]:
    """SIGKILL the stopped processes under the agent (a frozen rank; SIGTERM would wait for a SIGCONT that never
    comes); returns their pids."""
    stopped = [pid for pid in descendants(agent_pid) if _state(pid) in ("T", "t")]
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return stopped


def wait_for_agent(agent: subprocess.Popen, hung_marker: Path) -> int:
    """torchrun's exit code; meanwhile, once a rank has reported a hang, kill the ranks that are stopped, so the
    agent ends the job now instead of after its shutdown timeout (30 s by default)."""
    reported = False
    while True:
        try:
            return agent.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if hung_marker.exists():
            stopped = kill_stopped(agent.pid)
            if stopped and not reported:
                print(f"{PROG}: a rank gave up on a hang; killed {len(stopped)} stopped rank(s) (pid "
                      f"{', '.join(map(str, stopped))}), which cannot end by themselves", file=sys.stderr, flush=True)
                reported = True


def children(pid: int | None = None) -> list[int]:
    """The pids of the children of ``pid`` (default: this process: the agent, or ranks it left behind), from /proc."""
    found = []
    me = os.getpid() if pid is None else pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")"
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.append(int(entry))
    return found


class Forwarder:
    """Signal handlers of the wrapper: pass each signal on to the agent (or, once it is gone, to the ranks it left)
    and remember the first preemption signal, which goes on only once (the agent's handler raises on every signal
    it gets, and a second one would cut its wait for the ranks short)."""

    def __init__(self, *, agent_handles_usr1: bool) -> None:
        self.agent: subprocess.Popen | None = None
        self.agent_handles_usr1 = agent_handles_usr1
        self.signalled: str | None = None

    def install(self) -> None:
        """Catch the forwarded signals now, before the agent starts (one that comes earlier is passed on by
        :meth:`started`)."""
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self._handle)

    def started(self, agent: subprocess.Popen) -> None:
        self.agent = agent
        if self.signalled is not None:
            self._forward(signal.Signals[self.signalled])

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if sig in PREEMPTION_SIGNALS:
            if self.signalled is not None:
                print(f"{PROG}: got {sig.name} again: the ranks are already stopping", file=sys.stderr, flush=True)
                return
            self.signalled = sig.name
        if self.agent is not None:
            self._forward(sig)

    def _forward(self, sig: signal.Signals) -> None:
        assert self.agent is not None
        if self.agent.returncode is None and self.agent.poll() is None:
            # an agent that does not handle SIGUSR1 dies of it; SIGTERM it handles in every torch version
            send = sig if sig != signal.SIGUSR1 or self.agent_handles_usr1 else signal.SIGTERM
            targets, whom = [self.agent.pid], "torchrun's agent"
        else:
            send, targets, whom = sig, children(), "the ranks torchrun's agent left"
        print(f"{PROG}: got {sig.name}: passing {send.name} on to {whom}", file=sys.stderr, flush=True)
        for pid in targets:
            try:
                os.kill(pid, send)
            except ProcessLookupError:
                pass


def reap_orphans() -> None:
    """Wait for every remaining child: ranks that the agent left behind when a signal killed it (reparented to this
    subreaper). They are told to stop (SIGTERM: a training rank saves and exits 75) and waited for."""
    orphans = children()
    for pid in orphans:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    if orphans:
        print(f"{PROG}: torchrun's agent left {len(orphans)} rank(s) running; told them to stop (SIGTERM), "
              "waiting", file=sys.stderr, flush=True)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _option_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the first of ``names`` in ``argv`` (``--name V`` or ``--name=V``), or None."""
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name and index + 1 < len(argv):
                return argv[index + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]) or not argv:
        print(__doc__.strip())
        print("\ntorchrun's options follow:\n", flush=True)
        return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--help"])
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    handles_option = agent_handles_signal_option()
    with tempfile.TemporaryDirectory(prefix="repro-torchrun-") as scratch:
        marker, hung, ranks = Path(scratch) / "preempted", Path(scratch) / "hung", Path(scratch) / "ranks"
        env = dict(os.environ, **{PREEMPTED_FILE_VAR: str(marker), HUNG_FILE_VAR: str(hung),
                                  RANKS_FILE_VAR: str(ranks)})
        if handles_option:
            env.setdefault("PET_SIGNALS_TO_HANDLE", AGENT_SIGNALS)
        handled = (_option_value(argv, "--signals-to-handle", "--signals_to_handle")
                   or env.get("PET_SIGNALS_TO_HANDLE", "")) if handles_option else ""
        forwarder = Forwarder(agent_handles_usr1="SIGUSR1" in handled.replace(" ", "").upper().split(","))
        forwarder.install()
        agent = subprocess.Popen([sys.executable, "-m", "repro.dist.torchrun_agent", *argv], env=env)
        forwarder.started(agent)
        rc = wait_for_agent(agent, hung)
        reap_orphans()
        preempted, rank_hung, finished = marker.exists(), hung.exists(), all_finished(ranks)
    code = exit_code(rc, rank_preempted=preempted, signalled=forwarder.signalled, rank_hung=rank_hung)
    if code != 0 and finished and not preempted and not rank_hung:
        why = f"after {forwarder.signalled} arrived" if forwarder.signalled else "after its ranks ended"
        print(f"{PROG}: every rank had finished its run (and saved, with --save) before torchrun ended with "
              f"{128 - rc if rc < 0 else rc} ({why}): exit code 0", file=sys.stderr, flush=True)
        return 0
    # the agent passes 75 and 124 out itself (repro.dist.torchrun_agent); the line says why all the same
    if code == EXIT_PREEMPTED and (rc != EXIT_PREEMPTED or preempted):
        why = "its ranks stopped for a preemption" if preempted else f"it got {forwarder.signalled} and failed"
        print(f"{PROG}: torchrun ended with {128 - rc if rc < 0 else rc}; {why}: exit code {EXIT_PREEMPTED}",
              file=sys.stderr, flush=True)
    elif code == EXIT_HUNG and (rc != EXIT_HUNG or rank_hung):
        print(f"{PROG}: torchrun ended with {128 - rc if rc < 0 else rc}; a rank gave up on a hang: exit code "
              f"{EXIT_HUNG}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
