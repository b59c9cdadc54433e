"""One rank of ``repro train`` whose rank ``--stop-rank`` stops itself (SIGSTOP, as a frozen node or a debugger
would stop it) in a step, an evaluation, a save or a load. Every other argument goes to ``python -m repro.training``.

Started by test_hangs.py as independent processes (see ranks.py). The stopped rank prints
``rank R: stopping in WHERE at T`` (T: wall clock) just before it stops, so that the test can time the others.
"""

import argparse
import os
import signal
import sys
import time

import repro.training.checkpoint as training_checkpoint
import repro.zero.checkpoint as zero_checkpoint
from repro.dist import read_launch_env
from repro.training.cli import main
from repro.training.trainer import PipelineTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--stop-rank", type=int, required=True)
parser.add_argument("--stop-in", choices=("step", "evaluation", "save", "load"), required=True)
parser.add_argument("--stop-at", type=int, default=1, help="the n-th time it gets there (step: pipeline action)")
args, rest = parser.parse_known_args()
visits = 0


def stop_here(where: str) -> None:
    """SIGSTOP this process at the ``--stop-at``-th visit of ``where`` when it is ``--stop-in`` on the stop rank."""
    global visits
    if where != args.stop_in or read_launch_env().rank != args.stop_rank:
        return
    visits += 1
    if visits == args.stop_at:
        print(f"rank {args.stop_rank}: stopping in {where} at {time.time():.3f}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


def wrap(owner, name: str, where: str) -> None:
    original = getattr(owner, name)

    def stopping(*a, **k):
        stop_here(where)
        return original(*a, **k)

    setattr(owner, name, stopping)


wrap(zero_checkpoint, "atomic_write", "save")  # the rank's own file of a save (save_checkpoint writes it)
wrap(training_checkpoint, "_read", "load")  # a file of the checkpoint being loaded
wrap(PipelineTrainer, "evaluate", "evaluation")  # a validation batch
sys.exit(main(rest, on_action=lambda kind, micro_batch: stop_here("step")))
