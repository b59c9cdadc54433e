"""Partition arithmetic of ZeRO-DP (ZeRO sec. 5): pure functions, no processes, no tensors.

A *bucket* is a run of consecutive parameters flattened into one buffer. The buffer is padded to a multiple of
the data-parallel degree N_d and cut into N_d equal, contiguous shards; rank r owns shard r: it keeps the optimizer
states of those elements (P_os), receives their reduced gradients (P_g) and, in stage 3, stores only those
parameter elements (P_p). Equal shards are what lets one reduce-scatter and one all-gather move the data
(ZeRO sec. 7: each moves (N_d - 1)/N_d x psi elements per rank).

    flat buffer [padded]   |--- p0 ---|------ p1 ------|- p2 -|pad|
    shards (N_d = 3)       |   rank 0    |   rank 1    |   rank 2  |

:func:`flat_layout` places tensors, :meth:`FlatLayout.pieces` says which slice of which tensor falls into a rank's
shard, and :func:`group_into_buckets` cuts a parameter list into buckets of about ``bucket_numel`` elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Piece:
    """The part of tensor ``index`` that lies in a shard: tensor elements [start, stop) sit at ``shard_offset``
    of the shard (and at ``flat_offset`` of the whole flat buffer)."""

    index: int
    start: int
    stop: int
    shard_offset: int
    flat_offset: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class FlatLayout:
    """Where each tensor of a bucket sits in its flat buffer and how the buffer is split over ``world_size``."""

    numels: tuple[int, ...]
    offsets: tuple[int, ...]
    world_size: int
    padded_numel: int

    @property
    def numel(self) -> int:
        """Elements that belong to tensors (the padding excluded)."""
        return sum(self.numels)

    @property
    def padding(self) -> int:
        return self.padded_numel - self.numel

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, stop) of rank ``rank``'s shard inside the flat buffer."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, world_size={self.world_size})")
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def tensor_range(self, index: int) -> tuple[int, int]:
        """[start, stop) of tensor ``index`` inside the flat buffer."""
        return self.offsets[index], self.offsets[index] + self.numels[index]

    def pieces(self, rank: int) -> list[Piece]:
        """The slices of tensors that fall into ``rank``'s shard, in flat order (padding is never a piece)."""
        lo, hi = self.shard_range(rank)
        out = []
        for index, (offset, numel) in enumerate(zip(self.offsets, self.numels)):
            start, stop = max(lo, offset), min(hi, offset + numel)
            if start < stop:
                out.append(Piece(index, start - offset, stop - offset, start - lo, start))
        return out

    def owners(self, index: int) -> list[int]:
        """Ranks whose shard holds at least one element of tensor ``index``."""
        start, stop = self.tensor_range(index)
        if start == stop:
            return []
        return list(range(start // self.shard_numel, (stop - 1) // self.shard_numel + 1))


def padded_numel(numel: int, world_size: int, align: int = 1) -> int:
    """Round ``numel`` up so that it splits into ``world_size`` shards of a multiple of ``align`` elements."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if align < 1:
        raise ValueError(f"align={align} must be >= 1")
    if numel < 0:
        raise ValueError(f"numel={numel} must be >= 0")
    quantum = world_size * align
    return max(quantum, -(-numel // quantum) * quantum)


def flat_layout(numels: Sequence[int], world_size: int, *, align: int = 1) -> FlatLayout:
    """Place tensors of ``numels`` elements back to back and pad to ``world_size`` equal shards."""
    offsets, cursor = [], 0
    for numel in numels:
        if numel < 0:
            raise ValueError(f"tensor sizes must be >= 0, got {numel}")
        offsets.append(cursor)
        cursor += numel
    padded = padded_numel(cursor, world_size, align)
    return FlatLayout(tuple(int(n) for n in numels), tuple(offsets), world_size, padded)


def group_into_buckets(numels: Sequence[int], bucket_numel: int) -> list[list[int]]:
    """Cut consecutive tensors into buckets of at most ``bucket_numel`` elements (a larger tensor is a bucket of
    its own). Returns lists of tensor indices; every index appears once, in order."""
    if bucket_numel < 1:
        raise ValueError(f"bucket_numel={bucket_numel} must be >= 1")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index, numel in enumerate(numels):
        if current and size + numel > bucket_numel:
            buckets.append(current)
            current, size = [], 0
        current.append(index)
        size += numel
    if current:
        buckets.append(current)
    return buckets


def total_padding(layouts: Sequence[FlatLayout]) -> int:
    """Padding elements summed over buckets: the documented excess over psi in the memory and traffic checks."""
    return sum(layout.padding for layout in layouts)
