"""Tile plan: which KV tiles each query tile visits, grouped into batches of equal shape for batched matmuls.

Query tiles whose KV tile lists are identical form a *group* (in a strided GNA, all query tiles of one stride group
share one window, GNA §3.2); a group is one attention problem of ``nq * q_tile`` queries against ``nk * kv_tile``
gathered keys. Groups of equal (nq, nk) are stacked into a :class:`Bucket` so that a kernel runs one batched matmul
per bucket chunk instead of a Python loop over tiles. Buckets whose tiles are all full carry no mask; the others
carry a bool mask of the masked-out entries.

Since the KV tiles of a query tile are the Cartesian product of per-dimension ranges (see :mod:`repro.gna.tiling`),
groups are products of per-dimension groups, which keeps plan building cheap.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from repro.gna.spec import GNASpec
from repro.gna.tiling import DimLayout, DimTiles, all_dim_tiles


@dataclass(frozen=True)
class Bucket:
    """Groups of ``nq`` query tiles that attend to the same ``nk`` KV tiles.

    ``q_tiles`` [G, nq] and ``kv_tiles`` [G, nk] hold flat tile ids (row-major over the tile grid);
    ``q_tokens`` [G, M = nq * q_tile_numel] and ``kv_tokens`` [G, K = nk * kv_tile_numel] the row-major grid index
    of every token of the group's tiles in kernel order (-1 for padding), so kernels can gather straight from the
    [batch, *grid, heads, dim] tensors; ``blocked`` is None when every tile pair is full, else [G, M, K] with True
    where the query must NOT see the key.
    """

    q_tiles: torch.Tensor
    kv_tiles: torch.Tensor
    q_tokens: torch.Tensor
    kv_tokens: torch.Tensor
    blocked: torch.Tensor | None

    @property
    def num_groups(self) -> int:
        return self.q_tiles.shape[0]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity (it is cached, and holds tensors)
class TilePlan:
    grid: tuple[int, ...]
    spec: GNASpec
    q_tile: tuple[int, ...]
    kv_tile: tuple[int, ...]
    q_layouts: tuple[DimLayout, ...]
    kv_layouts: tuple[DimLayout, ...]
    buckets: tuple[Bucket, ...]
    full_pairs: int  # visited (query tile, KV tile) pairs computed without a mask
    partial_pairs: int  # visited pairs computed with a mask

    @property
    def q_tile_numel(self) -> int:
        return math.prod(self.q_tile)

    @property
    def kv_tile_numel(self) -> int:
        return math.prod(self.kv_tile)

    @property
    def num_q_tiles(self) -> int:
        return math.prod(layout.num_tiles for layout in self.q_layouts)

    @property
    def num_kv_tiles(self) -> int:
        return math.prod(layout.num_tiles for layout in self.kv_layouts)

    @property
    def tile_speedup_bound(self) -> float:
        """Self-attention score entries over visited score entries (all tiles, padding included): the upper bound
        on the speedup of a kernel that visits whole tiles, against a dense kernel on the unpadded grid."""
        tokens = math.prod(self.grid)
        visited = (self.full_pairs + self.partial_pairs) * self.q_tile_numel * self.kv_tile_numel
        return tokens * tokens / visited


def _flat_ids(per_dim: Sequence[Sequence[int]], tiles_per_dim: Sequence[int]) -> torch.Tensor:
    """Row-major flat ids of the Cartesian product of per-dimension tile indices."""
    ids = torch.zeros((), dtype=torch.long)
    for indices, count in zip(per_dim, tiles_per_dim):
        ids = ids[..., None] * count + torch.as_tensor(indices, dtype=torch.long)
    return ids.reshape(-1)


def _token_positions(per_dim: Sequence[Sequence[int]], tile: Sequence[int]) -> list[torch.Tensor]:
    """Per-dimension positions (in permuted order) of the tokens of a tile product, in kernel order:
    tiles row-major over the product, then tokens row-major inside a tile. Each entry is [num_tiles * numel]."""
    ndim = len(tile)
    shape = [len(indices) for indices in per_dim] + list(tile)
    positions = []
    for i in range(ndim):
        starts = torch.as_tensor(per_dim[i], dtype=torch.long) * tile[i]
        starts = starts.view([-1 if j == i else 1 for j in range(ndim)] + [1] * ndim)
        offsets = torch.arange(tile[i]).view([1] * ndim + [-1 if j == i else 1 for j in range(ndim)])
        positions.append((starts + offsets).expand(shape).reshape(-1))
    return positions


def _grid_tokens(positions: Sequence[torch.Tensor], layouts: Sequence[DimLayout]) -> torch.Tensor:
    """Row-major grid index of tokens given by per-dimension permuted positions; -1 where any is padding."""
    index = torch.zeros_like(positions[0])
    padding = torch.zeros_like(positions[0], dtype=torch.bool)
    for position, layout in zip(positions, layouts):
        coord = layout.order[position]
        padding |= coord < 0
        index = index * layout.extent + coord.clamp(min=0)
    return torch.where(padding, -1, index)


def _dim_groups(tiles: DimTiles) -> list[tuple[list[int], list[int]]]:
    """Group the query tiles of one dimension by identical non-empty KV tile lists: [(q tiles, kv tiles)]."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for q_index, row in enumerate(tiles.nonempty):
        groups.setdefault(tuple(row.nonzero().flatten().tolist()), []).append(q_index)
    return [(members, list(kv)) for kv, members in groups.items()]


@functools.lru_cache(maxsize=64)
def build_plan(grid: tuple[int, ...], spec: GNASpec, q_tile: tuple[int, ...], kv_tile: tuple[int, ...]) -> TilePlan:
    """Build (and cache) the tile plan of a token grid, a spec and tile shapes."""
    dims = all_dim_tiles(grid, spec, q_tile, kv_tile)
    q_counts = [d.q_layout.num_tiles for d in dims]
    kv_counts = [d.kv_layout.num_tiles for d in dims]
    # Per-dimension visited/full pair counts factorise over dimensions.
    full_pairs = math.prod(int(d.full.sum()) for d in dims)
    visited_pairs = math.prod(int(d.nonempty.sum()) for d in dims)

    by_shape: dict[tuple[int, int, bool], list[tuple]] = {}
    for combo in itertools.product(*[_dim_groups(d) for d in dims]):
        q_per_dim = [members for members, _ in combo]
        kv_per_dim = [kv for _, kv in combo]
        all_full = all(
            bool(d.full[q][:, kv].all()) for d, q, kv in zip(dims, q_per_dim, kv_per_dim)
        )
        nq = math.prod(len(q) for q in q_per_dim)
        nk = math.prod(len(kv) for kv in kv_per_dim)
        by_shape.setdefault((nq, nk, all_full), []).append((q_per_dim, kv_per_dim))

    q_layouts, kv_layouts = [d.q_layout for d in dims], [d.kv_layout for d in dims]
    buckets = []
    for (_, _, all_full), groups in sorted(by_shape.items()):
        q_ids = torch.stack([_flat_ids(q, q_counts) for q, _ in groups])
        kv_ids = torch.stack([_flat_ids(kv, kv_counts) for _, kv in groups])
        q_tokens, kv_tokens, masks = [], [], []
        for q_per_dim, kv_per_dim in groups:
            q_pos = _token_positions(q_per_dim, q_tile)
            kv_pos = _token_positions(kv_per_dim, kv_tile)
            q_tokens.append(_grid_tokens(q_pos, q_layouts))
            kv_tokens.append(_grid_tokens(kv_pos, kv_layouts))
            if not all_full:
                allowed = torch.ones(q_pos[0].numel(), kv_pos[0].numel(), dtype=torch.bool)
                for d, qp, kp in zip(dims, q_pos, kv_pos):
                    allowed &= d.allowed(qp, kp)
                masks.append(~allowed)
        blocked = torch.stack(masks) if masks else None
        buckets.append(Bucket(q_ids, kv_ids, torch.stack(q_tokens), torch.stack(kv_tokens), blocked))

    return TilePlan(
        grid=tuple(grid),
        spec=spec,
        q_tile=tuple(q_tile),
        kv_tile=tuple(kv_tile),
        q_layouts=tuple(q_layouts),
        kv_layouts=tuple(kv_layouts),
        buckets=tuple(buckets),
        full_pairs=full_pairs,
        partial_pairs=visited_pairs - full_pairs,
    )
