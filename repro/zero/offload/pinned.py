"""Page-locked host memory for the CPU tier, pinned in place with ``cudaHostRegister``.

Why not ``torch.empty(..., pin_memory=True)``: torch's caching host allocator rounds every block up to a power of
two, so a 268 MB fp32 shard takes 512 MB of page-locked memory. When host memory is what bounds the largest model
(ZeRO-Offload keeps 12 bytes per parameter in CPU memory), that waste decides the result. Here each tensor gets
its own anonymous mapping (whole pages, so no two registrations share a page), viewed as a tensor of exactly its
bytes and registered with CUDA; the tier unregisters it before letting go of it (``release_all``, also when the
tier is garbage collected), so memory is never unmapped while registered.

Without CUDA the tier never asks for pinned memory (``build_tier`` pins only for a model on a GPU), and every copy
from ordinary host memory is synchronous (see ``repro/zero/transfer.py``): slower, but correct.
"""

from __future__ import annotations

import mmap

import torch

PAGE = mmap.PAGESIZE


class PinningError(RuntimeError):
    """CUDA refused to page-lock host memory."""


class PinnedHostMemory:
    """Host tensors that CUDA may copy from asynchronously. ``empty(shape, dtype)``; ``release_all()``."""

    def __init__(self, cudart=None) -> None:
        self._cudart = cudart  # the CUDA runtime bindings (torch.cuda.cudart(), looked up on first use)
        self._registered: dict[int, int] = {}  # data_ptr -> bytes

    @property
    def cudart(self):
        if self._cudart is None:
            self._cudart = torch.cuda.cudart()
        return self._cudart

    @property
    def pinned_bytes(self) -> int:
        return sum(self._registered.values())

    def empty(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= int(size)
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        # page-aligned, zero-filled, ours alone; MAP_POPULATE faults the pages in at once rather than one by one
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        region = mmap.mmap(-1, (nbytes + PAGE - 1) // PAGE * PAGE, flags=flags)
        tensor = torch.frombuffer(region, dtype=dtype, count=numel).view(shape)
        error = int(self.cudart.cudaHostRegister(tensor.data_ptr(), nbytes, 0))
        if error != 0:
            raise PinningError(
                f"cudaHostRegister of {nbytes} bytes failed (cudaError {error}) after {self.pinned_bytes} bytes "
                "were pinned; offload with pin_memory=False, or free host memory")
        self._registered[tensor.data_ptr()] = nbytes
        return tensor

    def unregister(self, tensor: torch.Tensor) -> None:
        """Unpin one tensor made by :meth:`empty` (before it is dropped or replaced)."""
        if self._registered.pop(tensor.data_ptr(), None) is not None:
            self.cudart.cudaHostUnregister(tensor.data_ptr())

    def release_all(self) -> None:
        """Unpin everything (the tensors stay valid as ordinary host memory)."""
        for pointer in list(self._registered):
            self.cudart.cudaHostUnregister(pointer)
        self._registered.clear()
