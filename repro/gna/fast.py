"""Fast CPU GNA: tile-sparse attention with batched matmuls, forward and backward (custom autograd).

Tokens are grouped into multi-dimensional tiles (:mod:`repro.gna.tiling`); for every group of query tiles only the
KV tiles it needs are visited (:mod:`repro.gna.plan`), and each bucket of equally shaped groups is computed in
chunks of batched matmuls sized to stay in cache (:func:`_chunk_bytes`). Full tiles are computed without a mask, partial ones with one
(GNA §3.2). The forward hands each chunk of gathered blocks to PyTorch's fused dense attention
(``scaled_dot_product_attention``, exact softmax, scores never stored; the partial-tile mask goes in as
``attn_mask``): inside a group, GNA *is* dense attention over the gathered keys. The backward is written out here;
it recomputes the probabilities from the inputs, as FlashAttention does, instead of storing them:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale * dS K,  dK = scale * dS^T Q.

The token permutation into tiles is never materialised: each chunk gathers its tokens' rows straight from the
[batch, *grid, heads, head_dim] tensors (the plan holds the grid index of every token of a group, in tile order)
and scatters its output rows back. Padded tokens read row 0 (their keys are masked, their outputs dropped), write
to a scratch row past the end, and read a zero dO in the backward. bf16/fp16 inputs are computed in float32 chunk
by chunk (CPUs have no fast half-precision softmax) and cast back; float64 stays float64.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from repro.gna.plan import Bucket, TilePlan, build_plan
from repro.gna.reference import check_qkv
from repro.gna.spec import GNASpec



def _chunk_bytes(backward: bool) -> int:
    """Score bytes per chunk. Single-threaded: 1 MiB, so a chunk's scores stay in a core's L2 between the passes
    over them. Multi-threaded, every op of a chunk is a parallel region whose threads must all be scheduled (on a
    shared machine a region can wait a whole time slice), so fewer, larger chunks win: 16 MiB in the backward
    (which holds scores), 64 MiB in the forward (fused attention never stores them)."""
    if torch.get_num_threads() == 1:
        return 1 << 20
    return 1 << 24 if backward else 1 << 26


def _chunks(num_groups: int, batch_heads: int, items_per_chunk: int) -> Iterator[tuple[slice, slice]]:
    """(group slice, batch-head slice) pairs of about ``items_per_chunk`` (group, batch-head) items each."""
    if items_per_chunk >= batch_heads:
        step = items_per_chunk // batch_heads
        for g0 in range(0, num_groups, step):
            yield slice(g0, min(g0 + step, num_groups)), slice(0, batch_heads)
    else:
        for g0 in range(num_groups):
            for b0 in range(0, batch_heads, items_per_chunk):
                yield slice(g0, g0 + 1), slice(b0, min(b0 + items_per_chunk, batch_heads))


class _Rows:
    """Rows of a [batch * tokens * heads, dim] view for the tokens of a chunk's (group, batch-head) items."""

    def __init__(self, tokens: torch.Tensor, heads: slice, num_heads: int, num_tokens: int, scratch: int):
        bh = torch.arange(heads.start, heads.stop)
        offset = (bh // num_heads) * num_tokens * num_heads + bh % num_heads  # row of token 0 of each batch-head
        rows = tokens[:, None, :] * num_heads + offset[None, :, None]  # [groups, batch-heads, tokens], g-major
        padding = (tokens < 0)[:, None, :].expand_as(rows)
        self.gather = torch.where(padding, 0, rows).reshape(-1)  # padding reads a real row (masked / dropped)
        self.scatter = torch.where(padding, scratch, rows).reshape(-1)  # padding writes to the scratch row


class _TiledAttention(torch.autograd.Function):
    """GNA on q [B, *grid, H, D], k [B, *grid, H, D], v [B, *grid, H, Dv] (contiguous), following a TilePlan."""

    @staticmethod
    def forward(ctx, q, k, v, plan: TilePlan, scale: float, compute_dtype: torch.dtype):
        q_rows, k_rows, v_rows = q.view(-1, q.shape[-1]), k.view(-1, k.shape[-1]), v.view(-1, v.shape[-1])
        scratch = q_rows.shape[0]
        out = q_rows.new_empty(scratch + 1, v.shape[-1], dtype=compute_dtype)  # every real row gets written
        out[scratch].zero_()
        for c in _chunk_list(plan, q.shape[0], q.shape[-2], compute_dtype, _chunk_bytes(backward=False)):
            q_c = q_rows.index_select(0, c.queries.gather).to(compute_dtype).view(1, c.items, -1, q.shape[-1])
            k_c = k_rows.index_select(0, c.keys.gather).to(compute_dtype).view(1, c.items, -1, k.shape[-1])
            v_c = v_rows.index_select(0, c.keys.gather).to(compute_dtype).view(1, c.items, -1, v.shape[-1])
            allowed = None
            if c.bucket.blocked is not None:  # [g, M, K] -> [1, g * batch-heads, M, K], matching the items
                m, n = c.bucket.blocked.shape[1:]
                allowed = ~c.bucket.blocked[c.groups][:, None].expand(-1, c.heads_count, m, n)
                allowed = allowed.reshape(1, c.items, m, n)
            o_c = F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=allowed, scale=scale)
            out.index_copy_(0, c.queries.scatter, o_c.reshape(-1, v.shape[-1]))  # SDPA may return it strided
        ctx.save_for_backward(q, k, v, out)
        ctx.plan, ctx.scale, ctx.compute_dtype = plan, scale, compute_dtype
        return out[:-1].view(v.shape).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        plan, scale, dtype = ctx.plan, ctx.scale, ctx.compute_dtype
        q_rows, k_rows, v_rows = q.view(-1, q.shape[-1]), k.view(-1, k.shape[-1]), v.view(-1, v.shape[-1])
        scratch = q_rows.shape[0]
        # dO with a zero row at `scratch`: padded query rows read it through their scatter index, so they
        # contribute nothing to dK and dV.
        do_rows = torch.cat([grad_out.reshape(-1, v.shape[-1]).to(dtype), out.new_zeros(1, v.shape[-1])])
        delta = (do_rows * out).sum(-1)  # rowsum(dO * O), one per query row
        grad_q = q_rows.new_empty(scratch + 1, q.shape[-1], dtype=dtype)  # every real query row is written once
        grad_k = k_rows.new_zeros(scratch + 1, k.shape[-1], dtype=dtype)
        grad_v = v_rows.new_zeros(scratch + 1, v.shape[-1], dtype=dtype)
        for c in _chunk_list(plan, q.shape[0], q.shape[-2], dtype, _chunk_bytes(backward=True)):
            q_c = q_rows.index_select(0, c.queries.gather).to(dtype).view(c.items, -1, q.shape[-1]).mul_(scale)
            k_c = k_rows.index_select(0, c.keys.gather).to(dtype).view(c.items, -1, k.shape[-1])
            v_c = v_rows.index_select(0, c.keys.gather).to(dtype).view(c.items, -1, v.shape[-1])
            do_c = do_rows.index_select(0, c.queries.scatter).view(c.items, -1, v.shape[-1])
            delta_c = delta.index_select(0, c.queries.scatter).view(c.items, -1, 1)
            probs = _probabilities(q_c, k_c, c)
            grad_v.index_add_(0, c.keys.scatter, torch.bmm(probs.transpose(1, 2), do_c).view(-1, v.shape[-1]))
            grad_scores = torch.bmm(do_c, v_c.transpose(1, 2)).sub_(delta_c).mul_(probs)  # dS
            grad_q.index_copy_(0, c.queries.scatter, torch.bmm(grad_scores, k_c).mul_(scale).view(-1, q.shape[-1]))
            grad_k.index_add_(0, c.keys.scatter, torch.bmm(grad_scores.transpose(1, 2), q_c).view(-1, k.shape[-1]))
        grads = (grad_q[:-1].view(q.shape), grad_k[:-1].view(k.shape), grad_v[:-1].view(v.shape))
        return tuple(g.to(x.dtype) for g, x in zip(grads, (q, k, v))) + (None, None, None)


@dataclass(frozen=True)
class _Chunk:
    bucket: Bucket
    queries: _Rows
    keys: _Rows
    groups: slice
    heads_count: int  # batch-heads in the chunk
    items: int  # (group, batch-head) pairs, group-major


@functools.lru_cache(maxsize=32)
def _chunk_list(
    plan: TilePlan, batch: int, num_heads: int, dtype: torch.dtype, chunk_bytes: int
) -> tuple[_Chunk, ...]:
    """The chunks of a plan for a batch and head count, with their row indices (cached: built once per shape)."""
    element = torch.empty((), dtype=dtype).element_size()
    num_tokens = math.prod(plan.grid)
    scratch = batch * num_tokens * num_heads
    chunks = []
    for bucket in plan.buckets:
        m, n = bucket.q_tokens.shape[1], bucket.kv_tokens.shape[1]
        items_per_chunk = max(1, chunk_bytes // (m * n * element))
        for groups, heads in _chunks(bucket.q_tokens.shape[0], batch * num_heads, items_per_chunk):
            queries = _Rows(bucket.q_tokens[groups], heads, num_heads, num_tokens, scratch)
            keys = _Rows(bucket.kv_tokens[groups], heads, num_heads, num_tokens, scratch)
            heads_count = heads.stop - heads.start
            items = (groups.stop - groups.start) * heads_count
            chunks.append(_Chunk(bucket, queries, keys, groups, heads_count, items))
    return tuple(chunks)


def _probabilities(q: torch.Tensor, k: torch.Tensor, chunk: _Chunk) -> torch.Tensor:
    """Softmax of one chunk's scores (q already scaled): [items, M, K], masked entries exactly 0 (backward)."""
    scores = torch.bmm(q, k.transpose(1, 2))
    if chunk.bucket.blocked is not None:
        items, m, n = scores.shape
        blocked = chunk.bucket.blocked[chunk.groups][:, None]  # [g, 1, M, K], broadcast over the batch-heads
        scores.view(items // chunk.heads_count, chunk.heads_count, m, n).masked_fill_(blocked, float("-inf"))
    return torch.softmax(scores, dim=-1)


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
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return _TiledAttention.apply(
        query.contiguous(), key.contiguous(), value.contiguous(), plan, scale, _compute_dtype(query.dtype)
    )
