"""The memory ledger: bytes of model states a rank actually holds, by kind and by tier.

ZeRO sec. 3.1 counts model states as parameters (2 psi in fp16), gradients (2 psi) and optimizer states (K psi:
fp32 master weights, momentum and variance, K = 12). The ledger measures the same quantities from the tensors a
stage holds, so the paper's formula can be set beside a measurement instead of being assumed:

* each storage is counted once, under the first kind that names it (an fp32 master that *is* the parameter
  shard adds nothing);
* tiers are ``device``, ``cpu``, ``nvme`` (bytes on disk) and ``nvme_buffers`` (host staging buffers);
* transient buffers (reduce-scatter outputs, gradient buckets in flight, gathered stage-3 parameters) are
  tracked as a running peak by :class:`TransientTracker`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable

import torch

MODEL_STATE_KINDS = ("params", "grads", "master", "optimizer_states")
KINDS = MODEL_STATE_KINDS + ("comm_buffers", "working_params", "io_buffers")


@dataclass
class MemoryLedger:
    """bytes[(kind, tier)]; build it with :func:`measure`."""

    bytes: dict[tuple[str, str], int] = field(default_factory=dict)

    def total(self, kind: str | None = None, tier: str | None = None) -> int:
        return sum(v for (k, t), v in self.bytes.items() if (kind is None or k == kind) and (tier is None or t == tier))

    def model_states(self, tier: str | None = None) -> int:
        return sum(self.total(kind, tier) for kind in MODEL_STATE_KINDS)

    def rows(self) -> list[dict]:
        return [{"kind": k, "tier": t, "bytes": v} for (k, t), v in sorted(self.bytes.items())]


Item = tuple[str, str, "torch.Tensor | int"]


def measure(items: Iterable[Item]) -> MemoryLedger:
    """Sum (kind, tier, tensor-or-bytes) items; tensors are counted by storage, once."""
    ledger = MemoryLedger()
    seen: set[int] = set()
    for kind, tier, value in items:
        if kind not in KINDS:
            raise ValueError(f"unknown memory kind {kind!r}; known: {KINDS}")
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            nbytes = storage.nbytes()
        else:
            nbytes = int(value)
        ledger.bytes[(kind, tier)] = ledger.bytes.get((kind, tier), 0) + nbytes
    return ledger


class TransientTracker:
    """Current and peak bytes of short-lived buffers, by kind."""

    def __init__(self) -> None:
        self.current: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.largest: dict[str, int] = {}  # the largest single buffer of each kind
        self._lock = threading.Lock()

    def add(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.current[kind] = self.current.get(kind, 0) + nbytes
            self.peak[kind] = max(self.peak.get(kind, 0), self.current[kind])
            self.largest[kind] = max(self.largest.get(kind, 0), nbytes)

    def remove(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.current[kind] = self.current.get(kind, 0) - nbytes

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = dict(self.current)


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
