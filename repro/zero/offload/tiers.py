"""Memory tiers that hold model states: the compute device itself, CPU memory, or NVMe (see ``nvme.py``).

A stage never asks *where* a tensor lives; it asks its tier (ZeRO-Infinity sec. 5, "infinity offload engine"):

    tier.create(key, tensor)     store an initial value
    tier.prefetch(key)           start bringing it into compute memory (no-op for resident tiers)
    t = tier.fetch(key)          the tensor, in memory where ``tier.compute_device`` can use it
    tier.writeback(key, t)       store an updated value (asynchronous on NVMe)
    tier.release(key)            done with it: compute memory may be reused
    tier.flush()                 wait for every write

A resident tier hands out the stored tensor itself, so fetch/writeback cost nothing and an in-place update is the
write. On a machine without a GPU the "device" and "cpu" tiers are the same memory; the distinction still decides
where the optimizer step runs on a GPU machine (ZeRO-Offload runs it on the CPU). There the ``cpu`` tier keeps its
tensors in page-locked host memory (``pinned.py``) so that copies to the GPU run asynchronously (``transfer.py``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from repro.zero.offload.pinned import PinnedHostMemory
from repro.zero.transfer import copy_into


class Tier(Protocol):
    name: str
    compute_device: torch.device

    def create(self, key: str, tensor: torch.Tensor, *, alias: bool = False) -> None: ...
    def prefetch(self, key: str) -> None: ...
    def fetch(self, key: str) -> torch.Tensor: ...
    def writeback(self, key: str, tensor: torch.Tensor) -> None: ...
    def release(self, key: str) -> None: ...
    def flush(self) -> None: ...
    def resident_bytes(self) -> dict[str, int]: ...
    def stored(self, key: str) -> tuple[int, torch.dtype]: ...
    def close(self) -> None: ...


class ResidentTier:
    """Tensors kept in memory: ``name="device"`` on the compute device, ``name="cpu"`` in (pinned) host memory."""

    def __init__(self, name: str, device: torch.device | str, *, pin_memory: bool = False) -> None:
        self.name = name
        self.compute_device = torch.device(device)
        self.pin_memory = pin_memory and torch.cuda.is_available() and self.compute_device.type == "cpu"
        self._host = PinnedHostMemory() if self.pin_memory else None
        self._tensors: dict[str, torch.Tensor] = {}

    def create(self, key: str, tensor: torch.Tensor, *, alias: bool = False) -> None:
        """Store ``tensor``; ``alias=True`` keeps the given tensor (no copy) when it already lives here."""
        if key in self._tensors and self._host is not None:
            self._host.unregister(self._tensors[key])
        if alias and tensor.device == self.compute_device:
            self._tensors[key] = tensor
            return
        if self._host is not None:
            stored = self._host.empty(tensor.shape, tensor.dtype)
        else:
            stored = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.compute_device)
        stored.copy_(tensor)
        self._tensors[key] = stored

    def prefetch(self, key: str) -> None:
        self._get(key)

    def fetch(self, key: str) -> torch.Tensor:
        return self._get(key)

    def writeback(self, key: str, tensor: torch.Tensor) -> None:
        """Store an updated value (converted to the stored dtype; asynchronous host -> GPU from pinned memory)."""
        stored = self._get(key)
        if tensor is not stored:
            copy_into(stored, tensor)

    def release(self, key: str) -> None:
        self._get(key)

    def flush(self) -> None:
        return None

    def stored(self, key: str) -> tuple[int, torch.dtype]:
        tensor = self._get(key)
        return tensor.numel(), tensor.dtype

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self._tensors)

    def resident_bytes(self) -> dict[str, int]:
        seen: dict[int, int] = {}
        for tensor in self._tensors.values():
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return {self.name: sum(seen.values())}

    def close(self) -> None:
        if self._host is not None:
            self._host.release_all()  # unpin before the memory can be unmapped
        self._tensors.clear()

    def __del__(self) -> None:
        try:
            if getattr(self, "_host", None) is not None:
                self._host.release_all()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the CUDA runtime may already be gone
            pass

    def _get(self, key: str) -> torch.Tensor:
        try:
            return self._tensors[key]
        except KeyError:
            raise KeyError(f"{self.name} tier holds no tensor {key!r}") from None
