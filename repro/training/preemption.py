"""Preemption: finish the step, save, exit with a code the batch script turns into ``scontrol requeue``.

Slurm warns a job before it ends it: at the time limit it sends SIGTERM (then SIGKILL ``KillWait`` seconds later),
and ``#SBATCH --signal=B:USR1@120`` asks for SIGUSR1 two minutes ahead; ``scancel --signal=USR1`` sends it by hand.
Megatron-LM's ``--exit-signal-handler`` does the same thing as this module: the handler only raises a flag, the
training loop looks at it after each step, every rank agrees (one all-reduce of the flag, since the signal may reach
only some ranks), a checkpoint is written, and the process exits with :data:`EXIT_PREEMPTED`. The generated sbatch
file sees that code and requeues the job, which resumes from the checkpoint with the same job id and appends to the
same log (``--open-mode=append``).

Under torchrun two things stand between a rank's 75 and the batch script: an agent killed by a signal it
does not handle (SIGUSR1, before ``--signals-to-handle``) would leave its ranks training, orphaned, so each rank asks
the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``) and stops like any preempted rank; and the agent
reports a rank's 75 as its own exit code 1, so a rank that stops writes the file ``REPRO_PREEMPTED_FILE`` names,
which :mod:`repro.dist.torchrun` (torchrun with exit code 75 passed out) reads.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from types import FrameType

import torch

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.dist.torchrun import EXIT_PREEMPTED, PR_SET_PDEATHSIG, PREEMPTED_FILE_VAR, RANKS_FILE_VAR, prctl
from repro.training.failfast import EXIT_INTERRUPTED

#: :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL`` of sysexits.h: "try again later") is the exit code of a rank that
#: stopped on a preemption signal (after saving when ``--save`` was given); slurm/launch.sh requeues on it.
__all__ = ["EXIT_INTERRUPTED", "EXIT_PREEMPTED", "PreemptionFlag", "launched_by_torchrun", "note_preempted",
           "note_rank"]

#: the parent when this module was imported (early in a rank's life): a different one later means it died
_PARENT_AT_IMPORT = os.getppid()

#: SIGINT (Ctrl-C) stops like a preemption: the first one saves at the next step boundary; a second one exits at once
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class PreemptionFlag:
    """Catch SIGTERM, SIGUSR1 and SIGINT while active; :meth:`agreed` says whether any rank of ``group`` got one.
    A second SIGINT (Ctrl-C twice) exits at once with :data:`EXIT_INTERRUPTED`, saving nothing.

    The handler only records the signal: a collective or a file write interrupted half-way would leave the ranks
    out of step, so the work stops at the next step boundary instead.

    ``on_parent_death`` (default: when torchrun started this process) also asks for SIGTERM when the parent
    process dies, so that ranks whose torchrun agent was killed stop as if preempted instead of training on.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = SIGNALS, *, on_parent_death: bool | None = None) -> None:
        self.signals = signals
        self.received: str | None = None
        self._previous: dict[signal.Signals, object] = {}
        self.on_parent_death = launched_by_torchrun() if on_parent_death is None else on_parent_death
        self._death_signal = False
        self._settled = False
        #: after :meth:`agreed`: rank in the group -> name of the signal it received (empty: none did)
        self.heard: dict[int, str] = {}
        self._size = 1

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        first = self.received is None
        self.received = self.received or name  # first: a signal may come while this handler prints
        if name != "SIGINT":
            return
        import sys

        if not first:  # the second Ctrl-C: leave now, saving nothing
            print(f"interrupted again ({name}): exiting now with code {EXIT_INTERRUPTED}, without saving (the last "
                  "checkpoint is as it was; a save cut short is left as iter_N.partial/, which the next run with "
                  "this --save removes)", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        print("interrupted (SIGINT): stopping after this step, then saving (Ctrl-C again to exit at once)",
              file=sys.stderr, flush=True)

    def __enter__(self) -> "PreemptionFlag":
        if threading.current_thread() is threading.main_thread():  # signal handlers live on the main thread only
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
            if self.on_parent_death and signal.SIGTERM in self.signals:
                self._death_signal = prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
                if self._death_signal and os.getppid() != _PARENT_AT_IMPORT:  # it died before the request
                    self.received = "SIGTERM"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._death_signal:
            prctl(PR_SET_PDEATHSIG, 0)
            self._death_signal = False
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self._settled else previous)
        self._previous.clear()

    def finish(self) -> None:
        """This rank's run finished and saved: note it (:func:`note_rank`), and from now on a preemption signal
        changes nothing: the work it would save is saved, and the process ends with 0 instead of dying of the
        signal on its way out (its handlers stay ignored after the block)."""
        self.settle()
        note_rank("finished")

    def settle(self) -> None:
        """This rank stopped and its work is saved (a preemption's checkpoint, or the end of the run): a further
        preemption signal changes nothing, and the process ends with its own exit code (75 after a preemption)
        instead of dying of that signal on its way out. Slurm signals every process of a step, and a launcher may
        pass the same signal on: a rank of a two-node job, told twice, printed "exiting with code 75" and then died
        of the second SIGUSR1 once its handler was gone (exit 138: the job was not requeued)."""
        self._settled = True

    def agreed(self, group: CommGroup | None, device: torch.device | str) -> bool:
        """True on every rank of ``group`` when any of them received a signal; afterwards :attr:`heard` says which
        rank got which signal (the signal reaches the nodes of a job one after another, so rank 0 may learn of it
        from another rank). One SUM all-reduce of a vector of signal numbers, one entry per rank, on ``device``:
        the rank's compute device, as nccl needs."""
        size = group.size if group is not None else 1
        rank = group.rank if group is not None else 0
        codes = torch.zeros(size, device=device)
        if self.received:
            codes[rank] = float(signal.Signals[self.received].value)
        if size > 1:
            comm.all_reduce(codes, group, op=torch.distributed.ReduceOp.SUM)
        values = [int(v) for v in codes.tolist()]
        self._size = size
        self.heard = {r: signal.Signals(v).name for r, v in enumerate(values) if v}
        return bool(self.heard)

    def describe(self) -> str:
        """What :meth:`agreed` found, for the log: ``SIGUSR1`` in a job of one rank, else the signal and the ranks
        that got it, e.g. ``SIGUSR1 on rank 1 of 2``."""
        if not self.heard:
            return "no preemption signal"
        size = self._size
        by_signal: dict[str, list[int]] = {}
        for rank, name in sorted(self.heard.items()):
            by_signal.setdefault(name, []).append(rank)
        if size == 1:
            return ", ".join(by_signal)
        parts = []
        for name, ranks in by_signal.items():
            which = "all ranks" if len(ranks) == size else (
                f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of {size}")
            parts.append(f"{name} on {which}")
        return "; ".join(parts)


def launched_by_torchrun() -> bool:
    """Whether torchrun's agent started this process (it exports ``TORCHELASTIC_RUN_ID`` to its workers)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def note_preempted(rank: int | str | None = None) -> None:
    """Record that this rank stopped for a preemption in the file ``REPRO_PREEMPTED_FILE`` names, if it names one
    (:mod:`repro.dist.torchrun` sets it and exits 75 when the file exists). One JSON line per rank, appended."""
    path = os.environ.get(PREEMPTED_FILE_VAR)
    if not path:
        return
    rank = os.environ.get("RANK", "0") if rank is None else rank
    try:
        with open(path, "a") as handle:
            handle.write(json.dumps({"rank": int(rank), "exit_code": EXIT_PREEMPTED}) + "\n")
    except OSError as err:  # the wrapper's scratch folder is gone: nobody is left to read it
        print(f"[rank {rank}] could not note the preemption in {path}: {err.strerror}", flush=True)


def note_rank(event: str, rank: int | str | None = None) -> None:
    """Record ``event`` ("started" or "finished") of this rank in the file ``REPRO_RANKS_FILE`` names, if it names
    one (:mod:`repro.dist.torchrun` exits 0 when every rank that started finished, whatever signal came after)."""
    path = os.environ.get(RANKS_FILE_VAR)
    if not path:
        return
    rank = os.environ.get("RANK", "0") if rank is None else rank
    try:
        with open(path, "a") as handle:
            handle.write(json.dumps({"rank": int(rank), "event": event}) + "\n")
    except (OSError, ValueError):
        pass  # the wrapper's scratch folder is gone, or RANK is not a number: nobody reads it

