"""FlexAttention backend: GNA as a ``mask_mod`` plus a block mask built from the same tiling (GNA §3.2).

Tokens are permuted into multi-dimensional tiles exactly as for the CPU kernel (:mod:`repro.gna.tiling`), so
Flex's 1-D blocks of ``prod(q_tile)`` queries and ``prod(kv_tile)`` keys are our tiles and its block sparsity is the
tile sparsity the simulator counts. The mask_mod looks a token's per-dimension position up in small tables and tests
it against the query's KV interval in every dimension. Meant for GPUs; on CPU it runs forward (eagerly, or compiled
with ``compile=True``). Layout [batch, *grid, heads, head_dim].
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from types import ModuleType
from typing import Callable, Sequence

import torch

from repro.gna.flex_kernel import kernel_for
from repro.gna.plan import build_plan
from repro.gna.reference import check_qkv
from repro.gna.spec import GNASpec
from repro.gna.tiling import DimLayout, all_dim_tiles, permute_to_tiles, unpermute_from_tiles


def _positions(layouts: Sequence[DimLayout]) -> list[torch.Tensor]:
    """Per-dimension permuted position of every index of the flattened tiled sequence (tile-major)."""
    ndim = len(layouts)
    tiles = [layout.num_tiles for layout in layouts]
    inner = [layout.tile for layout in layouts]
    index = torch.arange(math.prod(tiles) * math.prod(inner))
    tile_id, offset = index // math.prod(inner), index % math.prod(inner)
    positions = []
    for i in range(ndim):
        tile_coord = (tile_id // math.prod(tiles[i + 1 :])) % tiles[i]
        offset_coord = (offset // math.prod(inner[i + 1 :])) % inner[i]
        positions.append(tile_coord * inner[i] + offset_coord)
    return positions


def flex_api() -> ModuleType:
    """``torch.nn.attention.flex_attention``, or one clear error where this torch has none (before 2.5): the flex
    backend needs it, the rest of the suite does not."""
    try:
        return importlib.import_module("torch.nn.attention.flex_attention")
    except ImportError:
        from repro.optional import MissingPackage

        raise MissingPackage(f"GNA's flex backend needs FlexAttention (torch >= 2.5); this torch is "
                             f"{torch.__version__}: upgrade torch, or use backend='fast'",
                             name="torch.nn.attention.flex_attention") from None


def gna_mask_mod(
    grid: Sequence[int], spec: GNASpec, q_tile: Sequence[int], kv_tile: Sequence[int], device="cpu"
) -> Callable:
    """A Flex ``mask_mod(b, h, q_idx, kv_idx)`` over the tiled token order of
    :func:`repro.gna.tiling.permute_to_tiles`."""
    dims = all_dim_tiles(grid, spec, q_tile, kv_tile)
    q_positions = _positions([d.q_layout for d in dims])
    kv_positions = _positions([d.kv_layout for d in dims])
    # Per flattened query index: its KV interval in every dimension; per key index: its position in every dimension.
    # One 1-D table per dimension, indexed by the token index alone (``table[idx]``): the lookup every torch with
    # FlexAttention traces (a 2-D ``table[i, idx]`` is refused as data-dependent by create_block_mask on 2.9-2.10).
    q_lo = [d.lo[p].to(device) for d, p in zip(dims, q_positions)]  # per dimension: [Lq]
    q_hi = [d.hi[p].to(device) for d, p in zip(dims, q_positions)]
    kv_pos = [p.to(device) for p in kv_positions]  # per dimension: [Lk]

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (kv_pos[0][kv_idx] >= q_lo[0][q_idx]) & (kv_pos[0][kv_idx] <= q_hi[0][q_idx])
        for pos, lo, hi in zip(kv_pos[1:], q_lo[1:], q_hi[1:]):
            allowed = allowed & (pos[kv_idx] >= lo[q_idx]) & (pos[kv_idx] <= hi[q_idx])
        return allowed

    return mask_mod


def _tile_product(per_dim: Sequence[torch.Tensor]) -> torch.Tensor:
    """[q tiles, kv tiles] of the whole grid from the per-dimension [q tiles_i, kv tiles_i] tables: a pair is set iff
    it is set in every dimension (tiles numbered row-major over the tile grid, as in :func:`_positions`)."""
    out = torch.ones(1, 1, dtype=torch.bool)
    for table in per_dim:
        rows, cols = table.shape
        out = (out[:, None, :, None] & table[None, :, None, :]).reshape(out.shape[0] * rows, out.shape[1] * cols)
    return out


def _ordered_blocks(blocks: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Flex's (num_blocks [1, 1, Tq], indices [1, 1, Tq, Tk]) of a [Tq, Tk] bool table: per query tile, how many KV
    tiles and their ids first (ascending), the rest of the row padding."""
    counts = blocks.sum(dim=-1, dtype=torch.int32)
    order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[None, None].contiguous().to(device), order[None, None].contiguous().to(device)


def gna_block_mask(grid: Sequence[int], spec: GNASpec, q_tile: Sequence[int], kv_tile: Sequence[int], device="cpu"):
    """Flex BlockMask of the tiled sequence with blocks = (query tile, KV tile).

    Built from the per-dimension tile classification (:func:`repro.gna.tiling.all_dim_tiles`), not by evaluating
    the mask_mod on every (query, key) pair as ``create_block_mask`` does: the paper's grids have 56k-123k tokens,
    whose dense [N, N] mask (and its int64 intermediates) would not fit in a GPU's memory. Full tiles are listed
    as full blocks (no mask_mod in the kernel), partial tiles as partial blocks, empty tiles not at all."""
    BlockMask = flex_api().BlockMask

    grid = spec.validate_grid(grid)
    dims = all_dim_tiles(grid, spec, q_tile, kv_tile)
    q_len = math.prod(d.q_layout.padded for d in dims)
    kv_len = math.prod(d.kv_layout.padded for d in dims)
    nonempty = _tile_product([d.nonempty for d in dims])
    full = _tile_product([d.full for d in dims])
    partial_counts, partial_indices = _ordered_blocks(nonempty & ~full, device)
    full_counts, full_indices = _ordered_blocks(full, device)
    extra = {}
    if "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters:  # torch >= 2.6
        extra["seq_lengths"] = (q_len, kv_len)  # older ones take tiles x tile size, which is the same: padded grids
    return BlockMask.from_kv_blocks(
        partial_counts,
        partial_indices,
        full_counts,
        full_indices,
        BLOCK_SIZE=(math.prod(q_tile), math.prod(kv_tile)),
        mask_mod=gna_mask_mod(grid, spec, q_tile, kv_tile, device),
        **extra,
    )


@functools.lru_cache(maxsize=1)
def compiled_flex() -> Callable:
    return torch.compile(flex_api().flex_attention, dynamic=False)


def flex_gna(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: GNASpec,
    scale: float | None = None,
    q_tile: Sequence[int] | None = None,
    kv_tile: Sequence[int] | None = None,
    compile: bool = False,
    block_mask=None,
) -> torch.Tensor:
    """GNA through ``torch.nn.attention.flex_attention``. ``block_mask`` may be passed in to reuse one built by
    :func:`gna_block_mask` with the same grid, spec and tiles."""
    from repro.gna.simulator import choose_tile_shapes

    flex_attention = flex_api().flex_attention

    grid = check_qkv(query, key, value, spec)
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    if query.device.type == "cpu" and needs_grad:
        raise ValueError(
            "the flex backend is forward-only on CPU (FlexAttention has no CPU backward); run it under "
            "torch.no_grad() or use backend='fast'"
        )
    if (q_tile is None) != (kv_tile is None):
        raise ValueError(f"give both q_tile and kv_tile or neither, got q_tile={q_tile}, kv_tile={kv_tile}")
    if q_tile is None:
        q_tile, kv_tile = choose_tile_shapes(grid, spec)
    plan = build_plan(grid, spec, tuple(q_tile), tuple(kv_tile))
    if block_mask is None:
        block_mask = gna_block_mask(grid, spec, q_tile, kv_tile, device=query.device.type)
    batch, heads = query.shape[0], query.shape[-2]

    def sequence(x: torch.Tensor, layouts) -> torch.Tensor:  # [B, *grid, H, D] -> [B, H, L, D]
        tiled = permute_to_tiles(x, layouts)
        return tiled.reshape(batch, heads, -1, x.shape[-1])

    q = sequence(query, plan.q_layouts)
    k = sequence(key, plan.kv_layouts)
    v = sequence(value, plan.kv_layouts)
    attend = compiled_flex() if compile else flex_attention
    kernel = kernel_for(q, block_mask)  # on a GPU: sub-tiles that divide the tiles (repro.gna.flex_kernel)
    out = attend(q, k, v, block_mask=block_mask, scale=scale,
                 kernel_options=kernel.options if kernel else None)  # [B, H, Lq, Dv]
    out = out.reshape(batch * heads, plan.num_q_tiles, plan.q_tile_numel, -1)
    return unpermute_from_tiles(out, plan.q_layouts, batch)
