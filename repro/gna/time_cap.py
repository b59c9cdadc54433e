"""Timing several functions under one deadline, the way every contender of the GNA GPU benchmark is timed: warm-up
calls (the first compiles), then :func:`repro.timing.time_iterations` (CUDA events on a GPU) with as many
iterations as the time left allows, never fewer than a floor.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from repro.timing import Timing, synchronize, time_iterations


def time_capped(fns: dict[str, Callable[[], object]], *, device: torch.device, warmup: int, iters: int,
                deadline: float, min_iters: int = 3) -> dict[str, Timing]:
    """Time each function with :func:`repro.timing.time_iterations` after ``warmup`` calls (the first compiles);
    iterations drop from ``iters`` (not below ``min_iters``, or ``iters`` if fewer) so that the remaining functions
    share the time left until ``deadline`` (``time.perf_counter()`` seconds)."""
    timings: dict[str, Timing] = {}
    names = list(fns)
    for position, name in enumerate(names):
        fn = fns[name]
        last = 0.0
        for _ in range(max(warmup, 1)):
            start = time.perf_counter()
            fn()
            synchronize(device)
            last = time.perf_counter() - start
        share = (deadline - time.perf_counter()) / (len(names) - position)
        count = max(min(min_iters, iters), min(iters, int(share / max(last, 1e-9))))
        timings[name] = time_iterations(fn, device=device, warmup=0, iters=count)
    return timings
