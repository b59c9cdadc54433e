"""Is GNA's Flex kernel slow at sparsity or slow per tile? Its options measured against its own dense speed.

GNA §4 states speedups proportional to the FLOPs removed, which a kernel reaches only when a tile costs what a dense
tile costs. On the paper's shapes the compiled Flex kernel ran at 0.67-0.71 of the tile bound (H200, 2026-11-28),
which says nothing yet about where the rest went. :func:`probe_flex_options` times, on one problem
(:class:`~repro.gna.gpu_config.GpuConfig`), Flex over the tile-ordered sequences:

* ``current``: the options :func:`repro.gna.flex_kernel.choose_flex_kernel` passes today;
* ``all_full``: the same tiles with every block full (no mask_mod, no sparsity): Flex's dense speed per tile, the
  ceiling of what GNA's blocks can reach with this kernel; GNA's own time over (this time x the fraction of blocks
  it visits) is then the cost of sparsity, apart from the kernel's speed;
* Triton options one at a time on top of ``current``: ``USE_TMA``, ``num_stages`` 2/3/4, a wider ``BLOCK_N``,
  ``PRESCALE_QK``, ``ROWS_GUARANTEED_SAFE`` (every GNA query attends to at least its own neighbourhood);
* the FLASH backend (FlashAttention-4 in CuTe DSL) where this torch and the ``flash_attn`` package offer it.

An option this torch does not name (:class:`torch.nn.attention.flex_attention.FlexKernelOptions`) or refuses is
reported with the reason instead of a time. ``emit(variant, values, fields)`` receives each result as it comes.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from repro.gna.flex import compiled_flex, flex_api
from repro.gna.flex_kernel import FlexKernel, flash_available, kernel_for
from repro.gna.flex_problem import FlexProblem, compile_settings, flex_attend
from repro.gna.gpu_config import GpuConfig, random_inputs
from repro.gna.simulator import attended_pairs, simulate

Emit = Callable[[str, dict, dict], None]


def accepted_option(name: str) -> str:
    """'' when this torch's Flex names option ``name`` (``fwd_``/``bwd_`` prefixes aside), else why not."""
    api = flex_api()
    known = getattr(api, "FlexKernelOptions", None)
    if known is None:  # older torch: no list to check; the call itself decides
        return ""
    bare = name.split("_", 1)[1] if name.startswith(("fwd_", "bwd_")) else name
    return "" if bare in getattr(known, "__annotations__", {}) else (
        f"this torch ({torch.__version__}) names no Flex kernel option {bare!r}")


def candidate_options(current: FlexKernel | None, *, tile_tokens: int, capability: tuple[int, int] | None
                      ) -> dict[str, dict | None]:
    """Name -> kernel options to try (None: the all-full block mask with the current options)."""
    base = dict(current.options) if current is not None else {}
    out: dict[str, dict | None] = {"current": base, "all_full": None}
    if current is None or current.backend != "TRITON":
        return out
    out["use_tma"] = {**base, "USE_TMA": True}
    for stages in (2, 3, 4):
        out[f"num_stages_{stages}"] = {**base, "num_stages": stages}
    wider = 2 * base.get("fwd_BLOCK_N", 64)
    if tile_tokens % wider == 0:
        out[f"fwd_block_n_{wider}"] = {**base, "fwd_BLOCK_N": wider}
    out["prescale_qk"] = {**base, "PRESCALE_QK": True}
    out["rows_guaranteed_safe"] = {**base, "ROWS_GUARANTEED_SAFE": True}
    if capability is not None and flash_available(capability):
        out["flash"] = {"BACKEND": "FLASH"}
    return out


def all_full_block_mask(problem: FlexProblem):
    """The problem's block mask with every (query tile, KV tile) block full: dense attention in Flex's tiles."""
    mask = problem.block_mask
    q_tiles, kv_tiles = mask.kv_num_blocks.shape[-1], mask.kv_indices.shape[-1]
    device = mask.kv_num_blocks.device
    full_counts = torch.full((1, 1, q_tiles), kv_tiles, dtype=torch.int32, device=device)
    full_indices = torch.arange(kv_tiles, dtype=torch.int32, device=device).expand(1, 1, q_tiles, kv_tiles)
    empty = torch.zeros((1, 1, q_tiles), dtype=torch.int32, device=device)
    extra = {"seq_lengths": mask.seq_lengths} if hasattr(mask, "seq_lengths") else {}
    return flex_api().BlockMask.from_kv_blocks(empty, full_indices.contiguous(), full_counts,
                                               full_indices.contiguous(), BLOCK_SIZE=mask.BLOCK_SIZE, **extra)


def probe_flex_options(config: GpuConfig, *, backward: bool, device: torch.device, emit: Emit, deadline: float,
                       warmup: int = 2, iters: int = 10, dtype: torch.dtype = torch.bfloat16) -> None:
    """Time every candidate (module docstring) on ``config`` until ``deadline`` (``time.perf_counter()``)."""
    if backward and device.type == "cpu":
        raise ValueError("Flex has no backward on CPU: probe forward on a CPU")
    compile = device.type == "cuda"
    with compile_settings():
        problem = FlexProblem(config, device, flex_attend(compile=compile))
        q, k, v, grad = random_inputs(config, device, dtype)
        q_seq, k_seq, v_seq = (problem.q_sequence(q).contiguous(), problem.kv_sequence(k).contiguous(),
                               problem.kv_sequence(v).contiguous())
        grad_seq = problem.q_sequence(grad).contiguous()
        del q, k, v, grad
        if backward:
            for x in (q_seq, k_seq, v_seq):
                x.requires_grad_(True)
        current = kernel_for(q_seq, problem.block_mask)
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        tile_tokens = math.prod(config.kv_tile)
        sim = simulate(config.grid, config.spec, config.q_tile, config.kv_tile)
        passes = 3.5 if backward else 1.0
        per_pair = 4 * config.head_dim * config.heads * config.batch * passes
        gna_flops = per_pair * attended_pairs(config.grid, config.spec)
        padded = q_seq.shape[-2] * k_seq.shape[-2]
        fields = dict(config=config.name, passes="fwd+bwd" if backward else "fwd", heads=config.heads,
                      block_sparse=sim.block_sparse, tile_bound=sim.worst_tile_speedup)
        attend = compiled_flex() if compile else flex_api().flex_attention
        times: dict[str, float] = {}
        for name, options in candidate_options(current, tile_tokens=tile_tokens, capability=capability).items():
            mask = all_full_block_mask(problem) if options is None else problem.block_mask
            options = dict(current.options) if options is None and current is not None else options
            refused = next((why for why in map(accepted_option, options or {}) if why), "")
            kernel = (f"{options.get('BACKEND', 'TRITON')} " + " ".join(
                f"{key}={value}" for key, value in sorted(options.items()) if key != "BACKEND")) if options else "cpu"
            if refused or time.perf_counter() > deadline:
                emit(name, {"kernel_ms": None}, dict(fields, flex_kernel=kernel,
                                                     note=refused or "not run: the probe's deadline was reached"))
                continue

            def run(mask=mask, options=options):
                out = attend(q_seq, k_seq, v_seq, block_mask=mask, scale=config.head_dim ** -0.5,
                             kernel_options=options or None)
                if backward:
                    return torch.autograd.grad(out, (q_seq, k_seq, v_seq), grad_seq)
                return out

            def timed(run=run):
                if backward:
                    return run()
                with torch.no_grad():
                    return run()

            try:
                from repro.timing import time_iterations

                for _ in range(max(warmup, 1)):
                    timed()
                seconds = time_iterations(timed, device=device, warmup=0, iters=iters).median_s
            except Exception as err:  # noqa: BLE001 - a refused option or backend is a result, in one line
                emit(name, {"kernel_ms": None}, dict(fields, flex_kernel=kernel,
                                                     note=" ".join(f"{type(err).__name__}: {err}".split())[:300]))
                continue
            times[name] = seconds
            flops = per_pair * padded if name == "all_full" else gna_flops
            values = {"kernel_ms": 1e3 * seconds, "tflops": flops / seconds / 1e12}
            emit(name, values, dict(fields, flex_kernel=kernel))
        if "all_full" in times and "current" in times:
            # the cost of sparsity apart from the kernel's speed: GNA's time over the dense-per-tile time of the
            # blocks it visits (1 = sparsity is free; the tile bound is reached when the dense speed per tile is)
            visited = times["all_full"] / sim.worst_tile_speedup
            fastest = min((n for n in times if n != "all_full"), key=times.get)
            emit("summary", {"gna_over_dense_tiles": times["current"] / visited,
                             "best_over_current": times[fastest] / times["current"]}, dict(fields, fastest=fastest))
