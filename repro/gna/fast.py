"""Fast CPU GNA: tile-sparse attention with batched matmuls, forward and backward (custom autograd).

Tokens are permuted into multi-dimensional tiles (:mod:`repro.gna.tiling`); for every group of query tiles only the
KV tiles it needs are gathered (:mod:`repro.gna.plan`), and each bucket of equally shaped groups is computed in
chunks of batched matmuls sized to stay in cache. Full tiles are computed without a mask, partial ones with one
(GNA §3.2). The softmax is exact (two-pass within a gathered row: max, then exp and sum); the backward recomputes
the probabilities from the inputs (as FlashAttention does) instead of storing them:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale * dS K,  dK = scale * dS^T Q.

bf16/fp16 inputs are computed in float32 (CPUs have no fast half-precision softmax) and cast back; float64 stays
float64, so tests can compare to the reference at high precision.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch

from repro.gna.plan import Bucket, TilePlan, build_plan
from repro.gna.reference import check_qkv
from repro.gna.spec import GNASpec
from repro.gna.tiling import permute_to_tiles, unpermute_from_tiles

# Score bytes per chunk: small enough for the chunk's scores to stay in a core's L2 between the passes.
_CHUNK_BYTES = 1 << 20


def _chunks(bucket: Bucket, batch_heads: int, score_bytes: int) -> Iterator[tuple[slice, slice]]:
    """(group slice, batch-head slice) pairs whose score blocks total about ``_CHUNK_BYTES``."""
    items = max(1, _CHUNK_BYTES // score_bytes)
    if items >= batch_heads:
        step = items // batch_heads
        for g0 in range(0, bucket.num_groups, step):
            yield slice(g0, min(g0 + step, bucket.num_groups)), slice(0, batch_heads)
    else:
        for g0 in range(bucket.num_groups):
            for b0 in range(0, batch_heads, items):
                yield slice(g0, g0 + 1), slice(b0, min(b0 + items, batch_heads))


def _flat_index(tiles: torch.Tensor, heads: slice, tiles_per_head: int) -> torch.Tensor:
    """Rows of the [B*H*T, t, D] tile tensor for tile ids [g, n] and a batch-head range: [g * h * n], g-major."""
    bh = torch.arange(heads.start, heads.stop)
    return (bh[None, :, None] * tiles_per_head + tiles[:, None, :]).reshape(-1)


def _probabilities(q, k, bucket: Bucket, groups: slice, heads_count: int) -> torch.Tensor:
    """Softmax of the scores of one chunk (q already scaled): [items, M, K], masked entries exactly 0."""
    scores = torch.bmm(q, k.transpose(1, 2))
    if bucket.blocked is not None:
        items, m, n = scores.shape
        blocked = bucket.blocked[groups][:, None]  # [g, 1, M, K], broadcast over the chunk's batch-heads
        scores.view(items // heads_count, heads_count, m, n).masked_fill_(blocked, float("-inf"))
    return torch.softmax(scores, dim=-1)


class _TiledAttention(torch.autograd.Function):
    """Attention over tiled tensors q [BH*Tq, tq, D], k [BH*Tk, tk, D], v [BH*Tk, tk, Dv]."""

    @staticmethod
    def forward(ctx, q, k, v, plan: TilePlan, batch_heads: int, scale: float):
        tq, tk = plan.q_tile_numel, plan.kv_tile_numel
        out = torch.empty(q.shape[0], tq, v.shape[-1], dtype=q.dtype, device=q.device)  # every row is written
        for bucket in plan.buckets:
            nq, nk = bucket.q_tiles.shape[1], bucket.kv_tiles.shape[1]
            score_bytes = nq * tq * nk * tk * q.element_size()
            for groups, heads in _chunks(bucket, batch_heads, score_bytes):
                q_rows = _flat_index(bucket.q_tiles[groups], heads, plan.num_q_tiles)
                kv_rows = _flat_index(bucket.kv_tiles[groups], heads, plan.num_kv_tiles)
                items = q_rows.numel() // nq
                # Scale the gathered queries rather than every score: D / K of the work.
                q_c = q.index_select(0, q_rows).view(items, nq * tq, -1).mul_(scale)
                k_c = k.index_select(0, kv_rows).view(items, nk * tk, -1)
                v_c = v.index_select(0, kv_rows).view(items, nk * tk, -1)
                probs = _probabilities(q_c, k_c, bucket, groups, heads.stop - heads.start)
                out.index_copy_(0, q_rows, torch.bmm(probs, v_c).view(items * nq, tq, -1))
        ctx.save_for_backward(q, k, v, out)
        ctx.plan, ctx.batch_heads, ctx.scale = plan, batch_heads, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        plan, batch_heads, scale = ctx.plan, ctx.batch_heads, ctx.scale
        tq, tk = plan.q_tile_numel, plan.kv_tile_numel
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)  # [BH*Tq, tq]: rowsum(dO * O)
        grad_q = torch.empty_like(q)  # every query row belongs to exactly one group
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        for bucket in plan.buckets:
            nq, nk = bucket.q_tiles.shape[1], bucket.kv_tiles.shape[1]
            score_bytes = nq * tq * nk * tk * q.element_size()
            for groups, heads in _chunks(bucket, batch_heads, score_bytes):
                q_rows = _flat_index(bucket.q_tiles[groups], heads, plan.num_q_tiles)
                kv_rows = _flat_index(bucket.kv_tiles[groups], heads, plan.num_kv_tiles)
                items = q_rows.numel() // nq
                q_c = q.index_select(0, q_rows).view(items, nq * tq, -1).mul_(scale)
                k_c = k.index_select(0, kv_rows).view(items, nk * tk, -1)
                v_c = v.index_select(0, kv_rows).view(items, nk * tk, -1)
                do_c = grad_out.index_select(0, q_rows).view(items, nq * tq, -1)
                delta_c = delta.index_select(0, q_rows).view(items, nq * tq, 1)
                probs = _probabilities(q_c, k_c, bucket, groups, heads.stop - heads.start)
                grad_v.index_add_(0, kv_rows, torch.bmm(probs.transpose(1, 2), do_c).view(items * nk, tk, -1))
                grad_scores = torch.bmm(do_c, v_c.transpose(1, 2)).sub_(delta_c).mul_(probs)  # dS
                grad_q.index_copy_(0, q_rows, torch.bmm(grad_scores, k_c).mul_(scale).view(items * nq, tq, -1))
                grad_k.index_add_(0, kv_rows, torch.bmm(grad_scores.transpose(1, 2), q_c).view(items * nk, tk, -1))
        return grad_q, grad_k, grad_v, None, None, None


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def fast_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: GNASpec,
    scale: float | None = None,
    q_tile: Sequence[int] | None = None,
    kv_tile: Sequence[int] | None = None,
) -> torch.Tensor:
    """GNA with the tile-sparse CPU kernel. Layout [batch, *grid, heads, head_dim]; differentiable in q, k, v.

    ``q_tile``/``kv_tile`` are tile shapes (one entry per dimension); by default they are chosen by the
    simulator's cost model (:func:`repro.gna.simulator.choose_tile_shapes`).
    """
    from repro.gna.simulator import choose_tile_shapes  # the simulator imports the tiling code, not this module

    grid = check_qkv(query, key, value, spec)
    if (q_tile is None) != (kv_tile is None):
        raise ValueError(f"give both q_tile and kv_tile or neither, got q_tile={q_tile}, kv_tile={kv_tile}")
    if q_tile is None:
        q_tile, kv_tile = choose_tile_shapes(grid, spec)
    plan = build_plan(grid, spec, tuple(int(t) for t in q_tile), tuple(int(t) for t in kv_tile))
    batch, heads = query.shape[0], query.shape[-2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    dtype = _compute_dtype(query.dtype)
    q_t = permute_to_tiles(query, plan.q_layouts).to(dtype)
    k_t = permute_to_tiles(key, plan.kv_layouts).to(dtype)
    v_t = permute_to_tiles(value, plan.kv_layouts).to(dtype)
    out_t = _TiledAttention.apply(
        q_t.flatten(0, 1), k_t.flatten(0, 1), v_t.flatten(0, 1), plan, batch * heads, scale
    )
    out = unpermute_from_tiles(out_t.view(batch * heads, plan.num_q_tiles, plan.q_tile_numel, -1), plan.q_layouts, batch)
    return out.to(query.dtype)
