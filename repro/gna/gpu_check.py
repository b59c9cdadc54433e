"""The correctness check of every GNA measurement: the op's output (and input gradients) against dense SDPA with the
GNA mask (the definition, :mod:`repro.gna.reference`; GNA §3), in fp32 (fp64 on CPU), at sampled query tokens or
every token when the grid is small.

A query's output and dq depend on its own row of the mask only, so a sample of queries is an exact check of those
rows; dk and dv sum over every query and are checked only when all of them are.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from repro.gna.flex_problem import FlexProblem
from repro.gna.spec import GNASpec, masks_per_dim


def reference_rows(query, key, value, spec: GNASpec, tokens: torch.Tensor, grad_out=None, *, kv_grads=False,
                   chunk_elements: int = 2**27) -> dict[str, torch.Tensor]:
    """Dense SDPA with the GNA mask for the query ``tokens`` (row-major grid indices) against all keys, in fp32
    (fp64 on CPU): ``out`` [B, S, H, Dv]; with ``grad_out`` also ``dq`` [B, S, H, D] (exact for a subset: a query's
    gradient depends on its own row only) and, with ``kv_grads`` (all tokens given), ``dk`` and ``dv`` [B, N, H, D].
    Queries are processed in chunks of at most ``chunk_elements`` score entries."""
    grid = tuple(query.shape[1:-2])
    batch, heads, head_dim = query.shape[0], query.shape[-2], query.shape[-1]
    ndim, tokens_total, device = len(grid), math.prod(grid), query.device
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    if kv_grads and (grad_out is None or tokens.numel() != tokens_total):
        raise ValueError("kv_grads needs grad_out and every query token (dk, dv sum over all queries)")

    def rows_of(x: torch.Tensor) -> torch.Tensor:  # [B, *grid, H, D] -> [B, H, N, D] in the reference dtype
        return x.detach().reshape(batch, tokens_total, heads, x.shape[-1]).transpose(1, 2).to(dtype, copy=True)

    q_all, k, v = rows_of(query), rows_of(key), rows_of(value)
    grad_all = rows_of(grad_out) if grad_out is not None else None
    if kv_grads:
        k.requires_grad_(True)
        v.requires_grad_(True)
    masks = [m.to(device) for m in masks_per_dim(grid, spec)]
    coords = torch.unravel_index(tokens.to(device), grid)
    step = max(1, chunk_elements // (batch * heads * tokens_total))
    outs, dqs = [], []
    dk = torch.zeros_like(k) if kv_grads else None
    dv = torch.zeros_like(v) if kv_grads else None
    for start in range(0, tokens.numel(), step):
        part = slice(start, start + step)
        allowed = torch.ones((1,) * (ndim + 1), dtype=torch.bool, device=device)
        for i, (mask, coord) in enumerate(zip(masks, coords)):
            allowed = allowed & mask[coord[part]].view([-1] + [grid[j] if j == i else 1 for j in range(ndim)])
        allowed = allowed.reshape(-1, tokens_total)  # [S, N]
        idx = tokens[part].to(device)
        q = q_all[:, :, idx].requires_grad_(grad_out is not None)
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=head_dim**-0.5)
        if grad_out is not None:
            targets = (q, k, v) if kv_grads else (q,)
            grads = torch.autograd.grad(out, targets, grad_all[:, :, idx])
            dqs.append(grads[0].transpose(1, 2))
            if kv_grads:
                dk += grads[1]
                dv += grads[2]
        outs.append(out.detach().transpose(1, 2))
    result = {"out": torch.cat(outs, dim=1)}
    if grad_out is not None:
        result["dq"] = torch.cat(dqs, dim=1)
    if kv_grads:
        result["dk"], result["dv"] = dk.transpose(1, 2), dv.transpose(1, 2)
    return result


def check_tokens(grid: Sequence[int], count: int, seed: int = 0) -> torch.Tensor:
    """All tokens when ``count`` covers the grid, else the first and last token (the last one sits in padded
    tiles when tiles do not divide the grid) and ``count - 2`` random ones."""
    total = math.prod(grid)
    if count >= total:
        return torch.arange(total)
    generator = torch.Generator().manual_seed(seed)
    middle = torch.randperm(total - 2, generator=generator)[: max(count - 2, 0)] + 1
    return torch.cat([torch.tensor([0]), middle.sort().values, torch.tensor([total - 1])])


def _errors(name: str, got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    diff = float((got.to(want.dtype) - want).abs().max())
    scale = float(want.abs().max())
    return {f"{name}_max_abs_error": diff, f"{name}_max_rel_error": diff / max(scale, 1e-30)}


def check_against_reference(problem: FlexProblem, q, k, v, grad_out, tokens: torch.Tensor,
                            backward: bool) -> dict[str, float]:
    """Max abs / relative errors of the op's output (and input gradients with ``backward``) at ``tokens``."""
    config, batch = problem.config, q.shape[0]
    full = tokens.numel() == config.tokens
    inputs = [x.detach().requires_grad_(backward) for x in (q, k, v)]
    with torch.set_grad_enabled(backward):
        out = problem.op(*inputs)
    got = {"out": out.detach().reshape(batch, config.tokens, *out.shape[-2:])}
    if backward:
        dq, dk, dv = torch.autograd.grad(out, inputs, grad_out)
        got["dq"] = dq.reshape(batch, config.tokens, *dq.shape[-2:])
        if full:
            got["dk"] = dk.reshape(batch, config.tokens, *dk.shape[-2:])
            got["dv"] = dv.reshape(batch, config.tokens, *dv.shape[-2:])
    want = reference_rows(q, k, v, config.spec, tokens, grad_out if backward else None, kv_grads=backward and full)
    errors: dict[str, float] = {}
    index = tokens.to(q.device)
    for name, tensor in got.items():
        errors.update(_errors(name, tensor if name in ("dk", "dv") else tensor[:, index], want[name]))
    return errors

