"""Tile-level GNA simulator: upper-bound speedups from counting visited tiles (GNA §3.2-3.3, Fig. 3, Tables 2-4).

A tiled attention kernel pays for whole (query tile, KV tile) pairs, so the speedup a sparse mask can give is
bounded by how many KV tiles each query tile must visit, not by its FLOPs. Given a token grid, GNA parameters and
the query/KV tile shapes (static tiling: tiles are fixed boxes of the grid), the simulator reports

* ``flopwise_speedup``: dense score entries / attended score entries (= tokens / window without causality);
* ``worst_tile_speedup``: self-attention KV tiles per query tile / the most KV tiles any query tile visits. This is
  the NATTEN-Sim-like bound the paper prints (Fig. 3: HunyuanVideo NA is limited to 3.3x, block-sparse strides
  reach 11.1x), since the slowest query tile sets a tiled kernel's runtime;
* ``work_speedup``: dense score entries / entries of all visited tiles (padding included): the bound for a kernel
  that processes every visited tile once, like this package's CPU kernel;
* ``block_sparse``: every visited tile is full (no masking anywhere: "perfectly block-sparse", §3.2).

and :func:`end_to_end_speedup` turns an attention speedup into a model speedup with Amdahl's law (Tables 2-4).
:func:`paper_end_to_end_speedup` is the same law applied the way the paper's tables apply it: to the op-level speedup
rounded to the one decimal the paper prints (Fig. 3: 3.3x, 11.1x; §4.3: 10.2x). With it, every FLOP-wise and
simulator cell of Tables 2-4 and every non-WSA row of Tables 5-6 is reproduced at the printed precision; applied to
the unrounded op speedup, 4 FLOP-wise (Cosmos) and 3 simulator (HunyuanVideo) cells come out 0.01 off.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from repro.gna.spec import GNASpec, dilation_group_size, key_interval_1d
from repro.gna.tiling import all_dim_tiles, dim_tiles


@dataclass(frozen=True)
class SimResult:
    grid: tuple[int, ...]
    spec: GNASpec
    q_tile: tuple[int, ...]
    kv_tile: tuple[int, ...]
    num_q_tiles: int
    self_attention_kv_tiles: int  # KV tiles a query tile visits in self attention
    worst_kv_tiles: int  # most KV tiles any query tile visits
    full_pairs: int  # visited (query tile, KV tile) pairs without masking, summed over query tiles
    partial_pairs: int  # visited pairs that need a mask
    flopwise_speedup: float
    worst_tile_speedup: float
    work_speedup: float

    @property
    def block_sparse(self) -> bool:
        return self.partial_pairs == 0

    @property
    def mean_kv_tiles(self) -> float:
        return (self.full_pairs + self.partial_pairs) / self.num_q_tiles


def attended_pairs(grid: Sequence[int], spec: GNASpec) -> int:
    """Number of (query, key) pairs the mask allows; it factorises over dimensions."""
    grid = spec.validate_grid(grid)
    total = 1
    for n, w, s, d, c in zip(grid, spec.window, spec.stride, spec.dilation, spec.causal):
        coord = torch.arange(n)
        first, last = key_interval_1d(coord // d, dilation_group_size(n, d, coord % d), w, s, c)
        total *= int((last - first + 1).sum())
    return total


def flopwise_speedup(grid: Sequence[int], spec: GNASpec) -> float:
    """Dense attention FLOPs / GNA FLOPs: N^2 over attended pairs (= prod extent / prod window if not causal)."""
    tokens = math.prod(grid)
    return tokens * tokens / attended_pairs(grid, spec)


def sparsity(grid: Sequence[int], spec: GNASpec) -> float:
    """Fraction of the dense score matrix that GNA skips (1 - window / tokens without causality)."""
    return 1.0 - 1.0 / flopwise_speedup(grid, spec)


def simulate(grid: Sequence[int], spec: GNASpec, q_tile: Sequence[int], kv_tile: Sequence[int]) -> SimResult:
    """Count visited tiles under static tiling (see module docstring)."""
    dims = all_dim_tiles(grid, spec, q_tile, kv_tile)
    grid = tuple(grid)
    tokens = math.prod(grid)
    visited_per_dim = [d.nonempty.sum(dim=1) for d in dims]  # KV tiles per query tile, per dimension
    full_pairs = math.prod(int(d.full.sum()) for d in dims)
    visited_pairs = math.prod(int(v.sum()) for v in visited_per_dim)
    worst = math.prod(int(v.max()) for v in visited_per_dim)
    self_attention_tiles = math.prod(-(-n // t) for n, t in zip(grid, kv_tile))
    tile_elems = math.prod(q_tile) * math.prod(kv_tile)
    return SimResult(
        grid=grid,
        spec=spec,
        q_tile=tuple(q_tile),
        kv_tile=tuple(kv_tile),
        num_q_tiles=math.prod(d.q_layout.num_tiles for d in dims),
        self_attention_kv_tiles=self_attention_tiles,
        worst_kv_tiles=worst,
        full_pairs=full_pairs,
        partial_pairs=visited_pairs - full_pairs,
        flopwise_speedup=flopwise_speedup(grid, spec),
        worst_tile_speedup=self_attention_tiles / worst,
        work_speedup=tokens * tokens / (visited_pairs * tile_elems),
    )


def dynamic_tiling_block_sparse(spec: GNASpec, q_tile: Sequence[int], kv_tile: Sequence[int]) -> bool:
    """The paper's perfectly block-sparse condition (GNA §3.2, dynamic KV tiling): in every dimension the KV tile
    divides the window and the query tile divides the stride."""
    return all(w % tk == 0 and s % tq == 0 for w, s, tq, tk in zip(spec.window, spec.stride, q_tile, kv_tile))


def end_to_end_speedup(op_speedup: float, attention_share: float, sparse_step_fraction: float = 1.0) -> float:
    """Amdahl's law (GNA §4, Tables 2-4): a fraction ``attention_share * sparse_step_fraction`` of the end-to-end
    runtime (self attention, in the diffusion steps that use GNA) is sped up by ``op_speedup``."""
    if not 0.0 <= attention_share <= 1.0 or not 0.0 <= sparse_step_fraction <= 1.0:
        raise ValueError(
            f"attention_share={attention_share} and sparse_step_fraction={sparse_step_fraction} must be in [0, 1]"
        )
    if op_speedup <= 0:
        raise ValueError(f"op_speedup={op_speedup} must be > 0")
    accelerated = attention_share * sparse_step_fraction
    return 1.0 / ((1.0 - accelerated) + accelerated / op_speedup)


# The paper prints op-level speedups with one decimal (Fig. 3 caption: 3.3x and 11.1x; §4.3: 10.2x for FLUX) and its
# end-to-end columns are Amdahl's law applied to those printed values.
PAPER_OP_DECIMALS = 1


def paper_end_to_end_speedup(
    op_speedup: float,
    attention_share: float,
    sparse_step_fraction: float = 1.0,
    op_decimals: int = PAPER_OP_DECIMALS,
) -> float:
    """End-to-end speedup as GNA Tables 2-6 compute it: :func:`end_to_end_speedup` of the op-level speedup rounded
    to ``op_decimals`` decimals (the precision the paper prints op-level speedups at, §3.3 Fig. 3 and §4.3).

    Rounding first is what separates the printed end-to-end columns from exact Amdahl: e.g. HunyuanVideo window
    30x40x40 (NA) simulates to 900/630 = 1.43x at op level, printed as 1.4x, and the tables' 1.21x end to end is
    Amdahl of 1.4x (exact Amdahl of 1.43x gives 1.22x). The same holds for the FLOP-wise columns (Cosmos 16x32x48:
    2.29x -> 2.3x -> 1.50x end to end, printed 1.50x)."""
    if not isinstance(op_decimals, int) or isinstance(op_decimals, bool) or op_decimals < 0:
        raise ValueError(f"op_decimals={op_decimals!r} must be an integer >= 0")
    rounded = round(op_speedup, op_decimals)
    if rounded <= 0:
        raise ValueError(
            f"op_speedup={op_speedup} rounds to {rounded} at {op_decimals} decimals; the rounded speedup must be > 0"
        )
    return end_to_end_speedup(rounded, attention_share, sparse_step_fraction)


# ---- tile shape choice for the CPU kernel ---------------------------------------------------------------------------

# Cost model in score-entry equivalents: a masked entry costs more than an unmasked one, and every visited tile
# pair / query tile has a fixed overhead (gathers, kernel calls), which favours larger tiles.
_PARTIAL_COST, _PAIR_OVERHEAD, _Q_TILE_OVERHEAD = 1.5, 1024, 4096
_MAX_TILE_NUMEL = 256


def _candidates(extent: int, *extra: int) -> list[int]:
    """Powers of two up to the extent, plus the stride / window; at most 512 tiles per dimension."""
    sizes = {1 << i for i in range(9) if (1 << i) < 2 * extent}
    sizes |= {e for e in extra if e <= extent}
    return sorted(s for s in sizes if s <= _MAX_TILE_NUMEL and s * 512 >= extent)


@functools.lru_cache(maxsize=256)
def _dim_table(extent, window, stride, dilation, causal) -> list[tuple[int, int, int, int, int]]:
    """(q tile, kv tile, query tiles, visited pairs, full pairs) for every candidate tile pair of one dimension."""
    rows = []
    for tq in _candidates(extent, stride):
        for tk in _candidates(extent, window):
            d = dim_tiles(extent, window, stride, dilation, causal, tq, tk)
            rows.append((tq, tk, d.q_layout.num_tiles, int(d.nonempty.sum()), int(d.full.sum())))
    return rows


@functools.lru_cache(maxsize=256)
def choose_tile_shapes(grid: tuple[int, ...], spec: GNASpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Pick query/KV tile shapes for the CPU kernel by minimising the simulated cost (visited tiles, masked tiles
    weighted higher, fixed overheads), with at most 256 tokens per tile. Per-dimension counts multiply, so all
    combinations are scored at once by broadcasting."""
    grid = spec.validate_grid(grid)
    tables = [
        torch.tensor(_dim_table(n, w, s, d, c), dtype=torch.float64)
        for n, w, s, d, c in zip(grid, spec.window, spec.stride, spec.dilation, spec.causal)
    ]
    ndim = len(tables)

    def combined(column: int) -> torch.Tensor:  # product over dimensions, shape [rows_1, ..., rows_d]
        out = torch.ones([1] * ndim, dtype=torch.float64)
        for i, table in enumerate(tables):
            out = out * table[:, column].view([-1 if j == i else 1 for j in range(ndim)])
        return out

    q_numel, kv_numel, q_tiles, visited, full = (combined(c) for c in range(5))
    cost = q_numel * kv_numel * (full + _PARTIAL_COST * (visited - full))
    cost = cost + _PAIR_OVERHEAD * visited + _Q_TILE_OVERHEAD * q_tiles
    cost = cost.masked_fill((q_numel > _MAX_TILE_NUMEL) | (kv_numel > _MAX_TILE_NUMEL), math.inf)
    flat = int(cost.argmin())
    rows = []
    for size in reversed(cost.shape):
        rows.append(flat % size)
        flat //= size
    rows.reverse()
    q_tile = tuple(int(tables[i][r, 0]) for i, r in enumerate(rows))
    kv_tile = tuple(int(tables[i][r, 1]) for i, r in enumerate(rows))
    return q_tile, kv_tile


__all__ = [
    "SimResult",
    "attended_pairs",
    "choose_tile_shapes",
    "dynamic_tiling_block_sparse",
    "end_to_end_speedup",
    "flopwise_speedup",
    "paper_end_to_end_speedup",
    "simulate",
    "sparsity",
]
