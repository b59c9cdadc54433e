"""Checks made before a point starts: will it fit in this machine's memory, and does it have the device it needs.

Every point declares ``memory_gib`` (peak host memory per rank) and ``needs_gpu``; checking them up front turns
"the machine swapped for an hour" or "CUDA error deep in a kernel" into one clear sentence.
"""

from __future__ import annotations

import os

from repro.experiments.base import Point

DEVICES = ("auto", "cpu", "cuda")


class NeedsGPU(RuntimeError):
    """The point measures GPU behaviour and no GPU is available (and CPU was not asked for)."""


def available_memory_gib() -> float:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), in GiB."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30 if pages else float("inf")


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


def resolve_device(requested: str, point: Point, *, experiment: str = "", cuda_devices: int | None = None) -> str:
    """``cpu`` or ``cuda`` for this point.

    ``auto``: cuda when there are at least ``world_size`` GPUs (nccl wants one per rank), else cpu; a point that
    ``needs_gpu`` then raises :class:`NeedsGPU`. ``cpu``: always cpu (runs GPU points on CPU when asked to).
    ``cuda``: ValueError when there are too few GPUs.
    """
    if requested not in DEVICES:
        raise ValueError(f"device {requested!r} is not one of {DEVICES}")
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    enough = cuda_devices >= point.world_size
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if not enough:
            raise ValueError(
                f"--device cuda: point {point.name!r} needs {point.world_size} GPU(s), this machine has {cuda_devices}"
            )
        return "cuda"
    if enough and cuda_devices > 0:
        return "cuda"
    if point.needs_gpu:
        raise NeedsGPU(
            f"{experiment} point {point.name!r} measures GPU behaviour and needs {point.world_size} GPU(s); "
            f"this machine has {cuda_devices}. Submit it to a GPU cluster, or pass --device cpu to run it on CPU "
            "anyway (its numbers then say nothing about GPUs)"
        )
    return "cpu"
