"""Reference GNA: dense attention with the GNA mask. The definition every other backend is tested against.

It builds the full [N, N] mask (N = number of tokens) from the per-dimension rules of :mod:`repro.gna.spec`, so it
is only meant for small grids; it works in any floating dtype, float64 included.
Layout: ``[batch, *grid, heads, head_dim]``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from repro.gna.spec import GNASpec, masks_per_dim


def gna_mask(grid: Sequence[int], spec: GNASpec) -> torch.Tensor:
    """Bool mask [N, N] over the row-major flattened grid: ``mask[q, k]`` is True when q may attend to k.

    The multi-dimensional mask is the AND of the 1-D masks of each dimension (GNA §3.1).
    """
    grid = spec.validate_grid(grid)
    mask = torch.ones(1, 1, dtype=torch.bool)
    for mask_dim in masks_per_dim(grid, spec):
        n = mask_dim.shape[0]
        # [Nq, Nk] x [n, n] -> [Nq * n, Nk * n]: append one dimension to the row-major flattening.
        mask = (mask[:, None, :, None] & mask_dim[None, :, None, :]).reshape(mask.shape[0] * n, mask.shape[1] * n)
    return mask


def check_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, spec: GNASpec) -> tuple[int, ...]:
    """Validate the ``[batch, *grid, heads, head_dim]`` layout and dtypes; return the token grid."""
    expected = spec.ndim + 3
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if tensor.dim() != expected:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}; a {spec.ndim}-D GNA expects "
                f"[batch, *grid ({spec.ndim} dims), heads, head_dim], i.e. {expected} dimensions"
            )
        if not tensor.is_floating_point():
            raise ValueError(f"{name} has dtype {tensor.dtype}; GNA needs floating point tensors")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"dtype mismatch: query {query.dtype}, key {key.dtype}, value {value.dtype}; they must match")
    if not (query.device == key.device == value.device):
        raise ValueError(f"device mismatch: query {query.device}, key {key.device}, value {value.device}")
    if query.shape != key.shape:
        raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)} must have the same shape")
    if value.shape[:-1] != key.shape[:-1]:
        raise ValueError(
            f"value {tuple(value.shape)} must match key {tuple(key.shape)} in every dimension but head_dim"
        )
    return spec.validate_grid(query.shape[1:-2])


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: GNASpec,
    scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * Q K^T masked by GNA) V, computed densely in the inputs' dtype.

    Shapes: query/key [B, *grid, H, D], value [B, *grid, H, Dv] -> out [B, *grid, H, Dv]
    (and the log-sum-exp [B, *grid, H] when ``return_lse``).
    """
    grid = check_qkv(query, key, value, spec)
    batch, heads, head_dim = query.shape[0], query.shape[-2], query.shape[-1]
    tokens = math.prod(grid)
    scale = head_dim**-0.5 if scale is None else scale

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [B, *grid, H, D] -> [B, H, N, D]
        return x.reshape(batch, tokens, heads, x.shape[-1]).transpose(1, 2)

    q, k, v = heads_first(query), heads_first(key), heads_first(value)
    scores = (q @ k.transpose(-1, -2)) * scale  # [B, H, N, N]
    scores = scores.masked_fill(~gna_mask(grid, spec).to(query.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # every query sees >= 1 key, so lse is finite
    out = torch.exp(scores - lse[..., None]) @ v  # [B, H, N, Dv]
    out = out.transpose(1, 2).reshape(batch, *grid, heads, value.shape[-1])
    if return_lse:
        return out, lse.transpose(1, 2).reshape(batch, *grid, heads)
    return out
