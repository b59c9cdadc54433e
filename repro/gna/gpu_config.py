"""One GNA problem on one device (:class:`GpuConfig`) and how much device memory its measurement needs.

A problem is a token grid, a GNA spec, the query/KV tile shapes whose (query tile, KV tile) pairs are Flex's blocks,
heads and head_dim (GNA §4, Tables 2-4: the paper's FLUX, HunyuanVideo and Cosmos shapes, or toys for CPU).
:func:`random_inputs` draws its q, k, v and output gradient in the grid layout [batch, *grid, heads, head_dim].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from repro.gna.spec import GNASpec

if TYPE_CHECKING:  # torch and the tiling (which imports it) are imported where used: a problem is declared without
    import torch  # them (the gna_speedup_gpu experiment's points, for repro list and Slurm's planning step)


@dataclass(frozen=True)
class GpuConfig:
    """One GNA problem: ``model`` names the paper's model (or a toy), ``heads`` the heads run (``model_heads``, the
    model's own, unless memory forced fewer)."""

    name: str
    model: str
    grid: tuple[int, ...]
    spec: GNASpec
    q_tile: tuple[int, ...]
    kv_tile: tuple[int, ...]
    heads: int
    head_dim: int = 128
    batch: int = 1

    @property
    def tokens(self) -> int:
        return math.prod(self.grid)


def shape_text(values: Sequence[int]) -> str:
    """(16, 44, 80) -> "16x44x80", as rows write grids, windows, strides and tiles."""
    return "x".join(str(v) for v in values)


def estimate_memory_gib(config: GpuConfig, *, backward: bool, dtype: torch.dtype, heads: int | None = None) -> float:
    """Peak device memory of :func:`repro.gna.gpu_benchmark.measure`, roughly: q/k/v/grad-out and outputs in the
    grid layout, their tile-ordered (padded) copies, gradients of both with backward, plus the fp32 Q/K/V/grad-out
    of the reference check and its chunk scratch (~3 GiB)."""
    import torch

    from repro.gna.tiling import all_dim_tiles

    heads = config.heads if heads is None else heads
    dims = all_dim_tiles(config.grid, config.spec, config.q_tile, config.kv_tile)
    padded = max(math.prod(d.q_layout.padded for d in dims), math.prod(d.kv_layout.padded for d in dims))
    per_token = config.batch * heads * config.head_dim * torch.finfo(dtype).bits // 8
    tensors = 5 * config.tokens + 5 * padded  # q, k, v, grad-out, output; same for the sequences
    if backward:
        tensors += 3 * config.tokens + 3 * padded + 2 * config.tokens  # dq, dk, dv of both + the op's saved copies
    reference = 4 * config.tokens * config.batch * heads * config.head_dim * 4  # fp32 Q, K, V, grad-out
    return (tensors * per_token + reference) / 2**30 + 3.0


def heads_that_fit(config: GpuConfig, *, backward: bool, dtype: torch.dtype, memory_gib: float,
                   headroom: float = 0.85) -> int:
    """The model's heads when the estimate fits ``headroom`` of the device memory, else the most that fit (the
    measured ratio dense / GNA does not depend on the number of heads, only the times do)."""
    heads = config.heads
    budget = headroom * memory_gib
    while heads > 1 and estimate_memory_gib(config, backward=backward, dtype=dtype, heads=heads) > budget:
        heads -= 1
    return heads


def random_inputs(config: GpuConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v and the output gradient, each [batch, *grid, heads, head_dim], from a seeded generator."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (config.batch, *config.grid, config.heads, config.head_dim)
    return [torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4)]
