"""Reusing the large CPU buffers of stages 2 and 3: gathered parameters, flat gradients and reduce-scatter shards
(ZeRO sec. 5.3 gathers every module twice a step and reduce-scatters its gradients once; ZeRO-Infinity sec. 6.2
keeps that traffic off the critical path).

Without a pool every gather allocates a fresh full buffer (67 MB for a 2048 x 8192 layer) and every release frees
it; so does every bucket's flat gradient and its shard. On the CPU glibc maps blocks that large straight from the
kernel and unmaps them on free, so each use first takes a page fault per 4 KB page and has the kernel zero the
page: measured on this machine with gloo and two ranks, an all-gather of 67 MB took 0.14 s into a fresh buffer and
0.10 s into a reused one. A GPU needs none of this (torch's caching allocator already reuses device memory, and a
side stream would make reuse unsafe without ``record_stream`` bookkeeping), so the pools are used on the CPU only.

A buffer is taken back only when nothing else can still see it: its storage has no other tensor (no parameter
view, no tensor autograd saved; ``saved_params.py`` already stores references instead of views) -- otherwise it
is simply left to be freed. A pool holds at most ``max_per_size`` buffers of each size and is emptied by
``clear()`` (stage 3's gathers at the step, the gradients' at the end of a backward), so between steps it holds
nothing. A reused buffer is not zeroed: a flat gradient is zeroed by its user (stage2.py).
"""

from __future__ import annotations

import torch


def only_reference(tensor: torch.Tensor) -> bool:
    """True when no other tensor shares ``tensor``'s storage (so its memory may be handed out again)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:  # no way to tell: never reuse
        return False
    storage = tensor.untyped_storage()
    return use_count(storage._cdata) <= 2  # ``tensor`` and the ``storage`` object just made


class GatherBufferPool:
    """``take(numel)`` a 1-D buffer (a released one of that size if any, else new); ``give(buffer)`` it back."""

    def __init__(self, *, dtype: torch.dtype, device: torch.device, max_per_size: int = 4) -> None:
        self.dtype, self.device, self.max_per_size = dtype, torch.device(device), max_per_size
        self._spare: dict[int, list[torch.Tensor]] = {}
        self.reused = 0  # takes served from the pool (for tests)

    def take(self, numel: int) -> torch.Tensor:
        spare = self._spare.get(numel)
        if spare:
            self.reused += 1
            return spare.pop()
        return torch.empty(numel, dtype=self.dtype, device=self.device)

    def give(self, buffer: torch.Tensor) -> None:
        spare = self._spare.setdefault(buffer.numel(), [])
        if len(spare) < self.max_per_size and only_reference(buffer):
            spare.append(buffer)

    def held_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for spare in self._spare.values() for b in spare)

    def clear(self) -> None:
        self._spare.clear()
