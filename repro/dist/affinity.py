"""One core per rank: pin a rank's compute thread to a core of its own while it is timed, as ``srun --cpu-bind``.

On a CPU a rank stands in for a GPU, so each rank computes on one torch thread. Left to the scheduler, the compute
threads of two ranks on two cores are moved between the cores (and sometimes onto one core) from call to call,
which spreads the fastest round of a timed call (measured here: tp 2 Megatron steps varied by +-10% between runs;
a 2-rank overlapped sublayer's fastest of 20 rounds by +-15%). Only the calling thread is pinned: threads that
already exist (gloo's worker and socket threads, created with the process group) keep the whole core set, so the
collective's CPU work can still run on whichever core is free.

Pinning happens only where it can mean one core per rank: the OS exposes affinity, and the process may use at least
as many cores as there are ranks on this node (under ``srun --cpu-bind=cores`` each task already owns its cores and
nothing is changed).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


def allowed_cores() -> list[int]:
    """The cores this process may run on (empty where the OS cannot pin threads)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def local_rank_and_size(rank: int, world_size: int) -> tuple[int, int]:
    """This process's rank and rank count on its node: ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (torchrun; set for
    local spawns too), else ``SLURM_LOCALID``/``SLURM_NTASKS_PER_NODE``, else the global ones (one node)."""
    env = os.environ
    local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID"))
    size = env.get("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE"))
    return (int(local) if local is not None else rank), (int(size) if size is not None else world_size)


@contextmanager
def one_core_per_rank(rank: int, world_size: int) -> Iterator[int | None]:
    """Pin the calling thread to the ``local_rank``-th allowed core inside the block, and restore its core set
    after; yields the core, or None where nothing was pinned (no affinity, or fewer cores than local ranks)."""
    cores = allowed_cores()
    local, local_size = local_rank_and_size(rank, world_size)
    if not cores or local_size > len(cores) or not 0 <= local < len(cores):
        yield None
        return
    os.sched_setaffinity(0, {cores[local]})
    try:
        yield cores[local]
    finally:
        os.sched_setaffinity(0, set(cores))
