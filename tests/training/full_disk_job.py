"""One rank of ``repro train`` whose rank ``--full-rank`` finds the disk full (ENOSPC) when it writes its own file of
the ``--full-at``-th save, as a node-local or quota-limited file system would. Every other argument goes to
``python -m repro.training``. Started by test_disk_full.py as independent processes (see ranks.py, forked.py)."""

import argparse
import errno
import os
import sys

import repro.zero.checkpoint as zero_checkpoint
from repro.dist import read_launch_env
from repro.training.cli import main

parser = argparse.ArgumentParser()
parser.add_argument("--full-rank", type=int, required=True)
parser.add_argument("--full-at", type=int, default=2)
args, rest = parser.parse_known_args()
writes = 0
original = zero_checkpoint.atomic_write


def full_disk_write(target, chunks):
    global writes
    if read_launch_env().rank == args.full_rank:
        writes += 1
        if writes == args.full_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
    return original(target, chunks)


zero_checkpoint.atomic_write = full_disk_write  # the rank's own file of a save (save_checkpoint writes it)
sys.exit(main(rest))
