"""Does a point fit this machine: its memory (``memory_gib`` per rank) and its device (``needs_gpu``, GPUs per rank).

Checking up front turns "the machine swapped for an hour" or "CUDA error deep in a kernel" into one clear sentence.
With ``--device cuda``, a point needing more GPUs than the machine has is skipped with the reason
(:class:`TooFewGPUs`) while the points that fit run. ``REPRO_STANDIN_GPUS`` is a CPU stand-in for a GPU machine.
"""

from __future__ import annotations

import os
import re

from repro.experiments.base import Point

DEVICES = ("auto", "cpu", "cuda")


class NeedsGPU(RuntimeError):
    """The point measures GPU behaviour and no GPU is available (and CPU was not asked for)."""


def available_memory_gib() -> float:
    """What can be allocated on this machine now, in GiB: :func:`repro.machine.host_memory` (MemAvailable, capped by
    a container's memory limit, which a local run meets before the host's)."""
    from repro.machine import host_memory_gib

    return host_memory_gib()


def check_memory(
    experiment: str, scale: str, point: Point, *, ranks_here: int | None = None, available_gib: float | None = None,
    headroom: float = 0.9,
) -> None:
    """Raise ValueError when ``ranks_here`` ranks of ``point`` (default: all of them, as a local run starts them
    on this machine) would need more than ``headroom`` of the available memory."""
    ranks = point.world_size if ranks_here is None else ranks_here
    need = point.memory_gib * ranks
    have = available_memory_gib() if available_gib is None else available_gib
    if need > headroom * have:
        raise ValueError(
            f"{experiment} point {point.name!r} at scale {scale!r} needs about {need:.1f} GiB "
            f"({ranks} rank(s) x {point.memory_gib:g} GiB) but this machine has {have:.1f} GiB available; "
            f"run a smaller scale here (--scale ci) or submit it to a cluster (repro submit {experiment} "
            f"--scale {scale})"
        )


#: A CPU stand-in for a GPU machine: ``REPRO_STANDIN_GPUS=N`` makes device resolution act as if this machine had N
#: GPUs, while the points that fit compute on the CPU (the GPU command's rehearsal, and tests of the rules below).
STANDIN_ENV = "REPRO_STANDIN_GPUS"


class TooFewGPUs(NeedsGPU, ValueError):
    """``--device cuda``: this point needs more GPUs than the machine has (the points that fit still run)."""


def gpu_count() -> tuple[int, bool]:
    """(GPUs this process can use, whether that count is the CPU stand-in of :data:`STANDIN_ENV`)."""
    standin = os.environ.get(STANDIN_ENV)
    if standin is not None:
        if not re.fullmatch(r"\d+", standin.strip()):
            raise ValueError(f"{STANDIN_ENV}={standin!r} must be a whole number of stand-in GPUs (0 or more)")
        return int(standin), True
    import torch

    return (torch.cuda.device_count() if torch.cuda.is_available() else 0), False


def resolve_device(requested: str, point: Point, *, experiment: str = "", cuda_devices: int | None = None) -> str:
    """``cpu`` or ``cuda`` for this point.

    ``auto``: cuda when there are at least ``world_size`` GPUs (nccl wants one per rank), else cpu; a point that
    ``needs_gpu`` then raises :class:`NeedsGPU`. ``cpu``: always cpu (runs GPU points on CPU when asked to).
    ``cuda``: ValueError on a machine without GPUs; :class:`TooFewGPUs` for a point that needs more GPUs than it has
    (the runner skips that point and runs the others). Under the CPU stand-in (:data:`STANDIN_ENV`), a point that
    would get cuda runs on cpu.
    """
    if requested not in DEVICES:
        raise ValueError(f"device {requested!r} is not one of {DEVICES}")
    standin = False
    if cuda_devices is None:
        cuda_devices, standin = gpu_count()
    gpu = "cpu" if standin else "cuda"
    enough = cuda_devices >= point.world_size
    where = f"this machine has {cuda_devices}" + (f" (stand-in: {STANDIN_ENV})" if standin else "")
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if cuda_devices == 0:
            raise ValueError(f"--device cuda: point {point.name!r} needs {point.world_size} GPU(s), {where}")
        if not enough:
            raise TooFewGPUs(f"point {point.name!r} needs {point.world_size} GPUs (one per rank), {where}")
        return gpu
    if enough and cuda_devices > 0:
        return gpu
    if point.needs_gpu:
        raise NeedsGPU(
            f"{experiment} point {point.name!r} measures GPU behaviour and needs {point.world_size} GPU(s); "
            f"{where}. Submit it to a GPU cluster, or pass --device cpu to run it on CPU "
            "anyway (its numbers then say nothing about GPUs)"
        )
    return "cpu"
