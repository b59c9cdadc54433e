"""Make a multi-process job die as a whole when one rank dies, instead of hanging (within 60 s).

Under ``repro.dist.spawn`` (and torchrun's single-node agent) a parent kills the surviving ranks. Under srun
without ``--kill-on-bad-exit``, or ranks started by hand, nobody does; the survivors must notice by themselves:

1. **A dead peer closes its sockets.** gloo then fails every pending and later operation with that peer at once
   ("Connection closed by peer"): the neighbours of the dead rank raise within a second.
2. **A raising rank must exit at once.** :func:`run_fail_fast` prints the traceback and leaves with
   ``os._exit(1)``, skipping interpreter shutdown (process-group destructors may wait on peers). Its sockets close
   in turn, so the failure spreads through every group it belonged to, stage by stage, until all ranks are gone.
3. **A peer that is alive but stuck, or stopped** (never sends) is caught by the process-group timeout
   (``init_distributed(timeout_s=...)`` and every group of ``init_parallel`` bound every collective and receive)
   and, as a last resort, by :class:`repro.training.watchdog.Watchdog`, which also turns the timeout into one line
   naming the rank, what it was doing and the rank it waits for.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, TypeVar

T = TypeVar("T")

EXIT_FAILED = 1
EXIT_USAGE = 2  # a bad option, configuration or input file: the same on every rank, printed once
EXIT_HUNG = 124  # what ``timeout`` reports: the job made no progress
EXIT_WRITE_FAILED = 74  # sysexits' EX_IOERR: a checkpoint could not be written (a full disk); the last one is intact
EXIT_NONFINITE = 3  # a step's loss or gradient norm was inf or NaN (repro.training.loop.NonFiniteTraining)
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C before the training loop could stop at a step boundary
#: What a non-finite loss or gradient norm does: stop the run (the default), or log it and train on (Megatron's
#: "number of nan iterations"). An fp16 step the loss scaler skipped is its business, never a stop.
ON_NAN = ("stop", "continue")


class UsageError(ValueError):
    """A configuration or input the job cannot run with: one line, exit code 2, no traceback.

    ``message=None`` marks a rank that stops because another rank reported the error (it prints nothing)."""

    def __init__(self, message: str | None) -> None:
        super().__init__(message or "")
        self.message = message


def agree_on_setup(build: Callable[[], T]) -> T:
    """Run ``build()`` on every rank; if it raises a configuration error (``ValueError``, ``OSError``) on any rank,
    every rank raises :class:`UsageError`, and only the lowest failing rank carries the message.

    One all-reduce over the default process group decides, so no rank goes on to a collective that a failed rank
    will never join (the hang a rank-local error used to cause), and the error is printed once, not once per rank."""
    import torch
    import torch.distributed as dist

    failure: Exception | None = None
    result = None
    try:
        result = build()
    except (ValueError, OSError) as err:
        failure = err
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if failure is not None:
            raise UsageError(str(failure)) from failure
        return result
    rank, world = dist.get_rank(), dist.get_world_size()
    # [lowest rank with its own error, lowest rank with any error]: a rank that only learnt of another rank's
    # failure (``follower`` errors) speaks only when no rank has an error of its own to report.
    own = failure is not None and not getattr(failure, "follower", False)
    lowest = torch.tensor([rank if own else world, rank if failure is not None else world], dtype=torch.int64,
                          device=_agreement_device())  # nccl reduces GPU tensors only
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    speaker = int(lowest[0]) if int(lowest[0]) < world else int(lowest[1])
    if speaker < world:
        if failure is not None and rank == speaker:
            prefix = "" if isinstance(failure, UsageError) else f"rank {rank}: "
            raise UsageError(prefix + str(failure)) from failure
        raise UsageError(None)
    return result


def _agreement_device():
    """Where the agreement's tensor must be for the default group's backend (the rank's GPU under nccl)."""
    from repro.dist.launch import device_for

    return device_for()


def interrupted_before_training(prog: str) -> str:
    """The line a Ctrl-C before training started ends a rank with (exit code :data:`EXIT_INTERRUPTED`)."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    return f"{prog}: interrupted (SIGINT) on rank {rank} before training started; nothing was saved"


def run_fail_fast(main: Callable[[], int | None], *, prog: str = "repro") -> int:
    """Run ``main()`` and return its exit code; if it raises, print the traceback and ``os._exit(1)``; a
    :class:`UsageError` prints its one line (if it has one) and exits with :data:`EXIT_USAGE`.

    Only for a process's entry point (a torchrun/srun rank), never inside a test process or a library call.
    """
    try:
        code = main()
    except UsageError as err:
        if err.message:
            print(f"{prog}: error: {err.message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_USAGE)
    except KeyboardInterrupt:  # Ctrl-C before the training loop's handler is in place
        print(interrupted_before_training(prog), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)
    except BaseException:  # noqa: BLE001 - any failure of a rank must end the rank now
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "?"))
        print(f"[rank {rank}] failed; exiting now so that the other ranks fail fast:\n{traceback.format_exc()}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_FAILED)
    return int(code or 0)
