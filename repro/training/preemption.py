"""Preemption: finish the step, save, exit with a code the batch script turns into ``scontrol requeue``.

Slurm warns a job before it ends it: at the time limit it sends SIGTERM (then SIGKILL ``KillWait`` seconds later),
and ``#SBATCH --signal=B:USR1@120`` asks for SIGUSR1 two minutes ahead; ``scancel --signal=USR1`` sends it by hand.
Megatron-LM's ``--exit-signal-handler`` does the same thing as this module: the handler only raises a flag, the
training loop looks at it after each step, every rank agrees (one all-reduce of the flag, since the signal may reach
only some ranks), a checkpoint is written, and the process exits with :data:`EXIT_PREEMPTED`. The generated sbatch
file sees that code and requeues the job, which resumes from the checkpoint with the same job id and appends to the
same log (``--open-mode=append``).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import torch

from repro.dist import comm
from repro.dist.comm import CommGroup

#: the exit code of a rank that stopped on a preemption signal (after saving when ``--save`` was given); 75 is
#: ``EX_TEMPFAIL`` of sysexits.h: "try again later". slurm/launch.sh requeues the job when a step ends with it.
EXIT_PREEMPTED = 75

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionFlag:
    """Catch SIGTERM and SIGUSR1 while active; :meth:`agreed` says whether any rank of ``group`` got one.

    The handler only records the signal: a collective or a file write interrupted half-way would leave the ranks
    out of step, so the work stops at the next step boundary instead.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = SIGNALS) -> None:
        self.signals = signals
        self.received: str | None = None
        self._previous: dict[signal.Signals, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name

    def __enter__(self) -> "PreemptionFlag":
        if threading.current_thread() is threading.main_thread():  # signal handlers live on the main thread only
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def agreed(self, group: CommGroup | None, device: torch.device | str) -> bool:
        """True on every rank of ``group`` when any of them received a signal (a MAX all-reduce of the flag, on
        ``device``: the rank's compute device, as nccl needs)."""
        flag = torch.tensor(1.0 if self.received else 0.0, device=device)
        if group is not None and group.size > 1:
            comm.all_reduce(flag, group, op=torch.distributed.ReduceOp.MAX)
        return bool(flag > 0)
