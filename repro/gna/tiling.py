"""Multi-dimensional tiling: token permutation and the tile-level structure of a GNA mask (GNA §3.2).

A query tile (or KV tile) is a small box of the token grid, e.g. 8x16 tokens of a 2-D grid. Permuting tokens so that
each tile is contiguous turns a neighbourhood into a set of whole tiles: for a query tile, a KV tile is

* *empty*: no query of the tile attends to any key of it (skipped),
* *full*: every query attends to every key (computed without a mask),
* *partial*: anything else (computed with a mask).

Because the GNA mask is the AND of 1-D masks (one per dimension), all of this factorises: a tile pair is full iff it
is full in every dimension, non-empty iff non-empty in every dimension, and the KV tiles of a query tile are the
Cartesian product of its per-dimension KV tile ranges. Everything here is computed per dimension.

Layout of one dimension (:class:`DimLayout`): dilation groups are made contiguous (x % dilation, then x // dilation)
and each group is padded up to a multiple of the tile size, as NATTEN's token permutation does, so a tile never mixes
two dilation groups. In this order the keys of a query form one interval of positions, so the structure is
computed from intervals, never from a dense mask. Padded query rows copy the interval of the last real query of
their group (their outputs are dropped); padded keys are never inside an interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from repro.gna.spec import GNASpec, dilation_group_size, key_interval_1d


@dataclass(frozen=True)
class DimLayout:
    """Token order of one dimension after permutation: ``order[p]`` is the original coordinate at position p, or -1
    for padding. Positions ``[t * tile, (t + 1) * tile)`` form tile t."""

    extent: int
    tile: int
    dilation: int
    order: torch.Tensor  # [padded] int64

    @property
    def padded(self) -> int:
        return self.order.numel()

    @property
    def num_tiles(self) -> int:
        return self.padded // self.tile


def dim_layout(extent: int, tile: int, dilation: int = 1) -> DimLayout:
    """Dilation groups made contiguous, each padded to a multiple of ``tile``."""
    if tile < 1:
        raise ValueError(f"tile size {tile} must be >= 1")
    pieces = []
    for group in range(dilation):
        size = dilation_group_size(extent, dilation, group)
        coords = torch.arange(size, dtype=torch.long) * dilation + group
        padding = -size % tile
        pieces.append(torch.cat([coords, torch.full((padding,), -1, dtype=torch.long)]))
    return DimLayout(extent, tile, dilation, torch.cat(pieces))


def _fill_padding(order: torch.Tensor) -> torch.Tensor:
    """Replace padding (-1) by the last real coordinate before it (the last token of the same dilation group)."""
    positions = torch.where(order >= 0, torch.arange(order.numel()), torch.zeros_like(order))
    return order[torch.cummax(positions, dim=0).values]


def key_position_intervals(
    q_layout: DimLayout, kv_layout: DimLayout, window: int, stride: int, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive interval [lo, hi] of allowed KV positions (permuted order) for every query position.

    A dilation group is contiguous in the permuted order, so a query's keys (an interval of its group, see
    :func:`repro.gna.spec.key_interval_1d`) stay an interval of positions; padded keys sit after the group's last
    real key and are never inside it. Padded query rows take the interval of the last real query of their group.
    """
    extent, dilation = q_layout.extent, q_layout.dilation
    coord = _fill_padding(q_layout.order)
    group, inner = coord % dilation, coord // dilation
    first, last = key_interval_1d(inner, dilation_group_size(extent, dilation, group), window, stride, causal)
    group_sizes = [dilation_group_size(extent, dilation, g) for g in range(dilation)]
    padded_sizes = torch.tensor([size + (-size % kv_layout.tile) for size in group_sizes])
    offsets = torch.cumsum(padded_sizes, 0) - padded_sizes  # first KV position of every dilation group
    return offsets[group] + first, offsets[group] + last


@dataclass(frozen=True)
class DimTiles:
    """Tile-level structure of one dimension: per query position its KV interval and, per (q tile, kv tile),
    non-empty / full."""

    q_layout: DimLayout
    kv_layout: DimLayout
    lo: torch.Tensor  # [q padded] first allowed KV position
    hi: torch.Tensor  # [q padded] last allowed KV position
    nonempty: torch.Tensor  # [q tiles, kv tiles] bool
    full: torch.Tensor  # [q tiles, kv tiles] bool

    def allowed(self, q_positions: torch.Tensor, kv_positions: torch.Tensor) -> torch.Tensor:
        """Mask [len(q_positions), len(kv_positions)] between permuted positions."""
        kv = kv_positions[None, :]
        return (kv >= self.lo[q_positions][:, None]) & (kv <= self.hi[q_positions][:, None])


def dim_tiles(
    extent: int, window: int, stride: int, dilation: int, causal: bool, q_tile: int, kv_tile: int
) -> DimTiles:
    """Classify the tile pairs of one dimension (GNA §3.2) under static tiling of queries and keys."""
    q_layout, kv_layout = dim_layout(extent, q_tile, dilation), dim_layout(extent, kv_tile, dilation)
    lo, hi = key_position_intervals(q_layout, kv_layout, window, stride, causal)
    num_q_tiles, num_kv_tiles = q_layout.num_tiles, kv_layout.num_tiles
    # Non-empty: some row's interval touches the KV tile. Mark each row's tile range [lo // tk, hi // tk] with a
    # difference array (+1 at the start, -1 after the end) and prefix-sum it: O(rows + tile pairs).
    rows_tile = torch.arange(q_layout.padded) // q_tile
    marks = torch.zeros(num_q_tiles, num_kv_tiles + 1, dtype=torch.long)
    marks.index_put_((rows_tile, lo // kv_tile), torch.ones_like(lo), accumulate=True)
    marks.index_put_((rows_tile, hi // kv_tile + 1), -torch.ones_like(hi), accumulate=True)
    nonempty = marks.cumsum(dim=1)[:, :num_kv_tiles] > 0
    # Full: every row's interval covers the whole KV tile.
    tile_start = torch.arange(num_kv_tiles) * kv_tile
    tile_end = tile_start + kv_tile - 1
    last_start = lo.view(-1, q_tile).amax(dim=1)[:, None]  # latest first key over the tile's rows
    first_end = hi.view(-1, q_tile).amin(dim=1)[:, None]  # earliest last key
    full = (last_start <= tile_start) & (first_end >= tile_end)
    return DimTiles(q_layout, kv_layout, lo, hi, nonempty, full)


def all_dim_tiles(
    grid: Sequence[int], spec: GNASpec, q_tile: Sequence[int], kv_tile: Sequence[int]
) -> list[DimTiles]:
    """:func:`dim_tiles` for every dimension, after validating the spec and the tile shapes."""
    grid = spec.validate_grid(grid)
    q_tile, kv_tile = tuple(q_tile), tuple(kv_tile)
    if len(q_tile) != spec.ndim or len(kv_tile) != spec.ndim:
        raise ValueError(f"tile shapes q={q_tile}, kv={kv_tile} must have {spec.ndim} entries like the grid {grid}")
    if any(t < 1 for t in q_tile + kv_tile):
        raise ValueError(f"tile shapes q={q_tile}, kv={kv_tile} must be >= 1 in every dimension")
    return [
        dim_tiles(n, w, s, d, c, tq, tk)
        for n, w, s, d, c, tq, tk in zip(grid, spec.window, spec.stride, spec.dilation, spec.causal, q_tile, kv_tile)
    ]


# ---- token permutation of tensors in the [batch, *grid, heads, dim] layout ----------------------------------------


def _is_identity(layout: DimLayout) -> bool:
    return layout.padded == layout.extent and bool((layout.order == torch.arange(layout.extent)).all())


def _gather_index(layouts: Sequence[DimLayout]) -> torch.Tensor:
    """Flat source token (row-major over the grid) of every permuted position; padding points one past the end."""
    extents = [layout.extent for layout in layouts]
    index = torch.zeros((), dtype=torch.long)
    for layout, extent in zip(layouts, extents):
        index = index[..., None] * extent + layout.order.clamp(min=0)
    valid = torch.ones((), dtype=torch.bool)
    for layout in layouts:
        valid = valid[..., None] & (layout.order >= 0)
    return torch.where(valid, index, math.prod(extents)).reshape(-1)


def permute_to_tiles(x: torch.Tensor, layouts: Sequence[DimLayout]) -> torch.Tensor:
    """[B, *grid, H, D] -> [B * H, num_tiles, tile_numel, D], contiguous (differentiable; padding is zeros).

    Tiles are numbered row-major over the tile grid, and tokens row-major inside a tile.
    """
    ndim = len(layouts)
    batch, heads, dim = x.shape[0], x.shape[-2], x.shape[-1]
    if not all(_is_identity(layout) for layout in layouts):
        flat = x.flatten(1, ndim)  # [B, N, H, D]; one zero token appended for padding positions to point at
        flat = torch.cat([flat, flat.new_zeros(batch, 1, heads, dim)], dim=1)
        x = flat.index_select(1, _gather_index(layouts).to(x.device))
    split = [batch]
    for layout in layouts:
        split += [layout.num_tiles, layout.tile]
    x = x.reshape(*split, heads, dim)
    tile_axes = [1 + 2 * i for i in range(ndim)]
    inner_axes = [2 + 2 * i for i in range(ndim)]
    x = x.permute(0, 2 * ndim + 1, *tile_axes, *inner_axes, 2 * ndim + 2)
    num_tiles = math.prod(layout.num_tiles for layout in layouts)
    tile_numel = math.prod(layout.tile for layout in layouts)
    return x.reshape(batch * heads, num_tiles, tile_numel, dim)


def unpermute_from_tiles(x: torch.Tensor, layouts: Sequence[DimLayout], batch: int) -> torch.Tensor:
    """Inverse of :func:`permute_to_tiles`: [B * H, num_tiles, tile_numel, D] -> [B, *grid, H, D]."""
    ndim = len(layouts)
    heads, dim = x.shape[0] // batch, x.shape[-1]
    x = x.reshape(batch, heads, *[l.num_tiles for l in layouts], *[l.tile for l in layouts], dim)
    axes = [0]
    for i in range(ndim):
        axes += [2 + i, 2 + ndim + i]
    x = x.permute(*axes, 1, 2 + 2 * ndim).reshape(batch, -1, heads, dim)  # [B, padded tokens, H, D]
    if not all(_is_identity(layout) for layout in layouts):
        # Permuted position of every original token: invert the gather index (padding positions dropped).
        index = _gather_index(layouts)
        tokens = math.prod(layout.extent for layout in layouts)
        position = torch.empty(tokens, dtype=torch.long)
        valid = index < tokens
        position[index[valid]] = torch.arange(index.numel())[valid]
        x = x.index_select(1, position.to(x.device))
    return x.reshape(batch, *[layout.extent for layout in layouts], heads, dim)
