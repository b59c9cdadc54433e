"""Generalized Neighborhood Attention (GNA, Hassani et al. 2025): spec, reference, fast CPU kernel, Flex backend,
tile-level simulator and an nn.Module. Tensor layout everywhere: [batch, *grid, heads, head_dim].

Files, one concept each:
    spec.py           parameters and their 1-D semantics (window, stride, dilation, causal)
    reference.py      dense masked attention: the definition
    tiling.py         token permutation into multi-dimensional tiles, per-dimension tile classification
    plan.py           which KV tiles each query tile visits, grouped for batched matmuls
    fast.py           tile-sparse CPU kernel, forward and backward
    flex.py           FlexAttention backend with a GNA block mask
    bench_problems.py the CPU benchmark's problems (grid, spec, heads), as data: declared without torch
    gpu_config.py     one GPU benchmark problem (grid, spec, tiles, heads) and its memory estimate
    flex_problem.py   Flex GNA as the GPU benchmark runs it: tile layouts, block mask, kernel and whole op
    gpu_check.py      every measurement's correctness check against dense masked SDPA
    time_cap.py       timing several contenders under one deadline
    dense_baseline.py the dense denominator: the fastest SDPA backend for the shape, probed as a ladder
    gpu_benchmark.py  dense vs GNA (kernel and op) on one device: times, speedups, bounds, errors
    gpu_selfcheck.py  a first check of compiled Flex GNA on a GPU before any timing
    simulator.py      upper-bound speedups from tile counts, Amdahl end-to-end estimates, tile choice
    module.py         backend ladder and the NeighborhoodAttention layer

The names load on first use (PEP 562), as in :mod:`repro.dist`: a module that needs one torch-free piece of this
package (the experiments' declarations, which `repro list` and the Slurm planning step import) does not import torch
through this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.lazy import lazy_names

#: name -> the module that defines it, imported at the name's first use
_HOMES = {
    **dict.fromkeys(("fast_attention",), "repro.gna.fast"),
    **dict.fromkeys(("flex_gna", "gna_block_mask", "gna_mask_mod"), "repro.gna.flex"),
    **dict.fromkeys(("NeighborhoodAttention", "neighborhood_attention"), "repro.gna.module"),
    **dict.fromkeys(("gna_mask", "reference_attention"), "repro.gna.reference"),
    **dict.fromkeys((
        "SimResult", "choose_tile_shapes", "dynamic_kv_tiling_is_block_sparse",
        "dynamic_tiling_block_sparse", "end_to_end_speedup", "flopwise_speedup", "simulate", "sparsity"
    ), "repro.gna.simulator"),
    **dict.fromkeys(("GNASpec", "mask_1d"), "repro.gna.spec"),
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from repro.gna.fast import fast_attention
    from repro.gna.flex import flex_gna, gna_block_mask, gna_mask_mod
    from repro.gna.module import NeighborhoodAttention, neighborhood_attention
    from repro.gna.reference import gna_mask, reference_attention
    from repro.gna.simulator import (
        SimResult,
        choose_tile_shapes,
        dynamic_kv_tiling_is_block_sparse,
        dynamic_tiling_block_sparse,
        end_to_end_speedup,
        flopwise_speedup,
        simulate,
        sparsity,
    )
    from repro.gna.spec import GNASpec, mask_1d


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
