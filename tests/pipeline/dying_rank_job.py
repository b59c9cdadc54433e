"""One rank of a training job whose rank ``--fail-rank`` fails at its ``--fail-after``-th pipeline action.

Started by test_pipeline_faults.py as independent processes (like srun without --kill-on-bad-exit: no parent kills the
survivors), each ``python -m tests.pipeline.dying_rank_job`` forked from a warm server. ``--mode exit`` crashes
(os._exit, as a segfault or OOM kill would), ``raise`` throws a Python error,
``hang`` stops making progress while staying alive. Every other argument goes to ``python -m repro.training``.
"""

import argparse
import os
import sys
import time

from repro.dist import read_launch_env
from repro.training.cli import main

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, required=True)
parser.add_argument("--fail-after", type=int, required=True)
parser.add_argument("--mode", choices=("exit", "raise", "hang"), required=True)
args, rest = parser.parse_known_args()
actions = 0


def fault(kind: str, micro_batch: int) -> None:
    global actions
    actions += 1
    if read_launch_env().rank != args.fail_rank or actions < args.fail_after:  # torchrun or srun variables
        return
    print(f"rank {args.fail_rank}: injecting '{args.mode}' before {kind} {micro_batch} at {time.time():.3f}",
          file=sys.stderr, flush=True)
    if args.mode == "exit":
        os._exit(17)
    if args.mode == "raise":
        raise RuntimeError("injected failure")
    time.sleep(3600)


sys.exit(main(rest, on_action=fault))
