"""Offload tiers handed to a ZeRO stage: ``device`` (none), ``cpu`` and ``nvme`` (ZeRO-Offload, ZeRO-Infinity)."""

from __future__ import annotations

import torch

from repro.zero.config import OffloadConfig
from repro.zero.offload.aio import AlignedBuffer, AsyncFileIO, DiskFullError
from repro.zero.offload.nvme import NvmeTier, check_nvme_path
from repro.zero.offload.tiers import ResidentTier, Tier


def build_tier(offload: OffloadConfig, *, device: torch.device | str, role: str) -> Tier:
    """The tier an :class:`OffloadConfig` asks for; ``role`` ("optimizer" or "param") names the swap directory.

    ``device`` is where the model computes; the ``cpu`` tier pins its memory only for a model on a GPU (pinning
    helps nothing but host -> GPU copies)."""
    if offload.device == "none":
        return ResidentTier("device", device)
    if offload.device == "cpu":
        return ResidentTier("cpu", "cpu", pin_memory=offload.pin_memory and torch.device(device).type == "cuda")
    return NvmeTier(
        offload.nvme_path, prefix=role, io_threads=offload.io_threads, io_block_bytes=offload.io_block_bytes
    )


__all__ = [
    "AlignedBuffer", "AsyncFileIO", "DiskFullError", "NvmeTier", "ResidentTier", "Tier", "build_tier",
    "check_nvme_path",
]
