"""A ledger of collective communication: calls and bytes per collective kind and per group.

Two byte counts are kept for every call:

* ``bytes``: the size of the logical buffer the collective operates on (for all-gather the gathered output, for
  reduce-scatter the full input, for all-reduce the tensor) - what a reader of the code sees.
* ``wire_bytes``: what one rank sends with the bandwidth-optimal ring algorithm, the accounting ZeRO sec. 7 and
  Megatron use: all-reduce 2(N-1)/N x bytes, reduce-scatter and all-gather (N-1)/N x bytes each, broadcast and
  point-to-point sends x1. A collective on a group of one sends nothing.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

WIRE_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0 if n > 1 else 0.0,
    "all_to_all": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,
}


@dataclass
class Entry:
    calls: int = 0
    bytes: int = 0
    wire_bytes: float = 0.0


@dataclass
class CollectiveLedger:
    """Counts collectives by (kind, group name). Thread-safe; cheap enough to leave on."""

    entries: dict[tuple[str, str], Entry] = field(default_factory=lambda: defaultdict(Entry))
    enabled: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, kind: str, group_name: str, group_size: int, nbytes: int) -> None:
        if not self.enabled:
            return
        if kind not in WIRE_FACTORS:
            raise ValueError(f"unknown collective kind {kind!r}; known: {sorted(WIRE_FACTORS)}")
        with self._lock:
            entry = self.entries[(kind, group_name)]
            entry.calls += 1
            entry.bytes += int(nbytes)
            entry.wire_bytes += WIRE_FACTORS[kind](group_size) * nbytes

    def _select(self, kind: str | None, group: str | None):
        return [e for (k, g), e in self.entries.items() if (kind is None or k == kind) and (group is None or g == group)]

    def calls(self, kind: str | None = None, group: str | None = None) -> int:
        return sum(e.calls for e in self._select(kind, group))

    def bytes(self, kind: str | None = None, group: str | None = None) -> int:
        return sum(e.bytes for e in self._select(kind, group))

    def wire_bytes(self, kind: str | None = None, group: str | None = None) -> float:
        return sum(e.wire_bytes for e in self._select(kind, group))

    def reset(self) -> None:
        with self._lock:
            self.entries.clear()

    def snapshot(self) -> dict[tuple[str, str], Entry]:
        with self._lock:
            return {key: Entry(e.calls, e.bytes, e.wire_bytes) for key, e in self.entries.items()}

    def since(self, snapshot: dict[tuple[str, str], Entry]) -> "CollectiveLedger":
        """A new ledger holding what was recorded after ``snapshot`` was taken."""
        delta = CollectiveLedger()
        for key, entry in self.snapshot().items():
            before = snapshot.get(key, Entry())
            if entry.calls != before.calls:
                delta.entries[key] = Entry(
                    entry.calls - before.calls, entry.bytes - before.bytes, entry.wire_bytes - before.wire_bytes
                )
        return delta

    def rows(self) -> list[dict]:
        """One dict per (kind, group), for result tables."""
        return [
            {"kind": k, "group": g, "calls": e.calls, "bytes": e.bytes, "wire_bytes": e.wire_bytes}
            for (k, g), e in sorted(self.entries.items())
        ]
