"""Timing a piece of work on CPU or GPU the same way: warm-up, then per-iteration times after synchronisation.

On CUDA each iteration is bracketed by CUDA events (recorded on the current stream, read after one final
synchronisation), so the time is the GPU's, not the host's launch time; on CPU ``time.perf_counter``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per iteration of the timed iterations (warm-up excluded)."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_iterations(fn: Callable[[], object], *, device: torch.device | str, warmup: int = 3,
                    iters: int = 10) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``iters`` times timed; seconds per call."""
    if warmup < 0 or iters < 1:
        raise ValueError(f"warmup={warmup} must be >= 0 and iters={iters} >= 1")
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return Timing(tuple(start.elapsed_time(end) / 1e3 for start, end in events))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return Timing(tuple(times))
