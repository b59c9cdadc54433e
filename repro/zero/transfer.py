"""Copies between the compute device and the host tiers, and when they may run asynchronously.

On a CPU-only machine every function here is a plain synchronous copy (or nothing), so the CPU tests run the very
code a GPU runs. On CUDA the rules are (ZeRO-Offload sec. 4: gradients go to the CPU, updated parameters come back,
both overlapped with the CPU's Adam):

* host -> device from page-locked (pinned) memory is asynchronous; the host must not write that memory again until
  the copy has run. Every host write to a tier (the optimizer step, a checkpoint load) is preceded by
  :func:`synchronize` of the device, so a copy issued in one step is complete before the next step touches it;
* device -> host into pinned memory is asynchronous too, and read only after its event (:class:`GradientStager`);
* anything involving pageable memory is a synchronous copy.
"""

from __future__ import annotations

import torch


def is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device: torch.device | str) -> None:
    """Wait for all work on a CUDA device (every stream); nothing on the CPU."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def async_safe(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether ``dst.copy_(src)`` may be issued with ``non_blocking=True``: host -> device from pinned memory, or
    device -> device (stream-ordered anyway)."""
    if dst.device.type != "cuda":
        return False
    if src.device.type == "cuda":
        return True
    return src.device.type == "cpu" and src.is_pinned()


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """``dst.copy_(src)`` (dtype and device converted); asynchronous where :func:`async_safe`. Returns whether the
    copy may still be running."""
    non_blocking = async_safe(dst, src)
    dst.copy_(src, non_blocking=non_blocking)
    return non_blocking and src.device.type == "cpu"


class GradientStager:
    """Gradient shards, produced on the device, brought to the CPU tier one bucket ahead of the optimizer.

    ``start(i, shard)`` issues the device -> pinned-host copy of bucket ``i`` (on the current stream, after the
    backward that produced it) and records an event; ``fetch(i, shard)`` waits for that event and returns the host
    copy, in the shard's dtype (16-bit on the wire, as ZeRO-Offload moves fp16 gradients; the caller converts to
    fp32 on the CPU). A shard already on the tier's device is returned as is, so CPU runs are unchanged.
    """

    def __init__(self, tier_device: torch.device | str) -> None:
        self.device = torch.device(tier_device)
        self._started: dict[int, tuple[torch.Tensor, object]] = {}
        self.bytes_moved = 0

    def _moves(self, shard: torch.Tensor) -> bool:
        return shard.device != self.device

    def start(self, index: int, shard: torch.Tensor) -> None:
        if not self._moves(shard) or index in self._started:
            return
        if shard.device.type == "cuda" and self.device.type == "cpu":
            host = torch.empty(shard.shape, dtype=shard.dtype, pin_memory=True)
            host.copy_(shard, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(shard.device))
        else:
            host, event = shard.to(self.device), None
        self.bytes_moved += shard.numel() * shard.element_size()
        self._started[index] = (host, event)

    def fetch(self, index: int, shard: torch.Tensor) -> torch.Tensor:
        if not self._moves(shard):
            return shard
        self.start(index, shard)
        host, event = self._started.pop(index)
        if event is not None:
            event.synchronize()
        return host

    def clear(self) -> None:
        self._started.clear()
