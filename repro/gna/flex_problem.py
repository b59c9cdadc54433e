"""GNA through FlexAttention, as the GPU benchmark runs it (GNA §3-4: tokens permuted into multi-dimensional tiles,
then one block-sparse attention whose blocks are (query tile, KV tile) pairs; :mod:`repro.gna.flex` builds the mask).

:class:`FlexProblem` holds one config's tile layouts, block mask and token permutation: ``kernel`` is Flex on
tile-ordered sequences (what the tile simulator bounds), ``op`` the whole op with the permutation in and out (what a
model pays). :func:`compile_settings` keeps dynamo from silently falling back to eager Flex over many points.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from repro.gna.flex import compiled_flex, gna_block_mask
from repro.gna.flex_kernel import kernel_for
from repro.gna.gpu_config import GpuConfig
from repro.gna.tiling import all_dim_tiles, permute_to_tiles, unpermute_from_tiles

#: attend(q, k, v, block_mask, scale) on [B, H, L, D] tile-ordered sequences -> [B, H, Lq, D].
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object, float], torch.Tensor]


def flex_attend(*, compile: bool) -> Attend:
    """Flex on tile-ordered sequences: compiled (the GPU kernel; ``repro.gna.flex``'s cached compiled function, with
    the kernel options :mod:`repro.gna.flex_kernel` chooses on a GPU) or eager (CPU, forward only; it evaluates the
    mask_mod densely and ignores the block sparsity)."""
    from repro.gna.flex import flex_api

    flex_attention = flex_api().flex_attention

    def attend(q, k, v, block_mask, scale):
        fn = compiled_flex() if compile else flex_attention
        kernel = kernel_for(q, block_mask)  # sub-tiles that divide the tiles on this GPU (None on CPU)
        return fn(q, k, v, block_mask=block_mask, scale=scale, kernel_options=kernel.options if kernel else None)

    return attend


class FlexProblem:
    """The tile layouts, block mask and token permutation of one config on one device (built once, reused)."""

    def __init__(self, config: GpuConfig, device: torch.device, attend: Attend):
        self.config = config
        dims = all_dim_tiles(config.grid, config.spec, config.q_tile, config.kv_tile)
        self.q_layouts, self.kv_layouts = [d.q_layout for d in dims], [d.kv_layout for d in dims]
        self.num_q_tiles = math.prod(layout.num_tiles for layout in self.q_layouts)
        self.block_mask = gna_block_mask(config.grid, config.spec, config.q_tile, config.kv_tile,
                                         device=device.type if device.index is None else str(device))
        self.attend = attend

    def q_sequence(self, x: torch.Tensor) -> torch.Tensor:  # [B, *grid, H, D] -> [B, H, Lq, D]
        return permute_to_tiles(x, self.q_layouts).reshape(x.shape[0], x.shape[-2], -1, x.shape[-1])

    def kv_sequence(self, x: torch.Tensor) -> torch.Tensor:  # [B, *grid, H, D] -> [B, H, Lkv, D]
        return permute_to_tiles(x, self.kv_layouts).reshape(x.shape[0], x.shape[-2], -1, x.shape[-1])

    def kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attend(q, k, v, self.block_mask, q.shape[-1] ** -0.5)

    def op(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """GNA on [B, *grid, H, D] as :func:`repro.gna.flex.flex_gna` computes it."""
        out = self.kernel(self.q_sequence(query), self.kv_sequence(key), self.kv_sequence(value))
        batch, heads = query.shape[0], query.shape[-2]
        out = out.reshape(batch * heads, self.num_q_tiles, math.prod(self.config.q_tile), -1)
        return unpermute_from_tiles(out, self.q_layouts, batch)


def compile_settings():
    """Dynamo settings for a run of many points, as a context manager: every (grid, tiles, grad mode) compiles Flex
    once, and the run must never reach dynamo's recompile limit, since past it Flex would run eagerly and materialise
    [N, N] scores; raise instead of falling back."""
    config = torch._dynamo.config
    settings = {}
    for names, limit in ((("recompile_limit", "cache_size_limit"), 256),
                         (("accumulated_recompile_limit", "accumulated_cache_size_limit"), 1024)):
        name = next((n for n in names if hasattr(config, n)), None)
        if name is not None:
            settings[name] = max(getattr(config, name), limit)
    if hasattr(config, "fail_on_recompile_limit_hit"):
        settings["fail_on_recompile_limit_hit"] = True
    return config.patch(settings)

