"""GNA through FlexAttention against dense attention on one device: compiled Flex in bf16 on a GPU (the paper's
question, GNA §4 Tables 2-4, asked of a different kernel and GPU), eager Flex at toy size on a CPU (the same code).

One problem (:class:`GpuConfig`): a token grid, a GNA spec, the query/KV tile shapes whose (query tile, KV tile)
pairs are Flex's blocks, heads and head_dim. :func:`measure` times, each after warm-up with
:func:`repro.timing.time_iterations` (CUDA events on a GPU):

* ``dense``: ``F.scaled_dot_product_attention`` over all tokens, on [batch, heads, tokens, dim] views of the same
  q/k/v (flash attention on CUDA: the baseline the paper's speedups are over);
* ``gna``: Flex on the tile-permuted sequences with the GNA block mask (the kernel: what the tile simulator bounds);
* ``gna_op``: the whole op as :func:`repro.gna.flex.flex_gna` runs it: permute tokens into tiles, Flex, permute back
  (what a model pays).

forward (``torch.no_grad``) or forward + backward (``torch.autograd.grad`` of the output against a fixed random
gradient). Every measurement is checked: the op's output (and, with backward, dq) at sampled query tokens against
dense SDPA with the GNA mask (:func:`reference_rows`) in fp32 (fp64 on CPU), over all tokens (and dk, dv too) when
the grid is small. Iterations are capped so that a point stays within ``time_cap_s`` after compilation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from repro.gna.flex import _compiled_flex, gna_block_mask
from repro.gna.simulator import attended_pairs, simulate
from repro.gna.spec import GNASpec, masks_per_dim
from repro.gna.tiling import all_dim_tiles, permute_to_tiles, unpermute_from_tiles
from repro.timing import Timing, synchronize, time_iterations

#: attend(q, k, v, block_mask, scale) on [B, H, L, D] tile-ordered sequences -> [B, H, Lq, D].
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object, float], torch.Tensor]


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


def _shape(values: Sequence[int]) -> str:
    return "x".join(str(v) for v in values)


# ---- memory ---------------------------------------------------------------------------------------------------------


def estimate_memory_gib(config: GpuConfig, *, backward: bool, dtype: torch.dtype, heads: int | None = None) -> float:
    """Peak device memory of :func:`measure`, roughly: q/k/v/grad-out and outputs in the grid layout, their
    tile-ordered (padded) copies, gradients of both with backward, plus the fp32 Q/K/V/grad-out of the reference
    check and its chunk scratch (~3 GiB)."""
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


# ---- the three contenders -------------------------------------------------------------------------------------------


def dense_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """SDPA over all tokens: [B, *grid, H, D] -> [B, H, N, D] (views; flash reads these strides directly)."""
    batch, heads = query.shape[0], query.shape[-2]

    def heads_first(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(batch, -1, heads, x.shape[-1]).transpose(1, 2)

    return F.scaled_dot_product_attention(heads_first(query), heads_first(key), heads_first(value))


def flex_attend(*, compile: bool) -> Attend:
    """Flex on tile-ordered sequences: compiled (the GPU kernel; ``repro.gna.flex``'s cached compiled function) or
    eager (CPU, forward only; it evaluates the mask_mod densely and ignores the block sparsity)."""
    from torch.nn.attention.flex_attention import flex_attention

    def attend(q, k, v, block_mask, scale):
        fn = _compiled_flex() if compile else flex_attention
        return fn(q, k, v, block_mask=block_mask, scale=scale)

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


# ---- the correctness check ------------------------------------------------------------------------------------------


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


# ---- timing ---------------------------------------------------------------------------------------------------------


def time_capped(fns: dict[str, Callable[[], object]], *, device: torch.device, warmup: int, iters: int,
                deadline: float, min_iters: int = 3) -> dict[str, Timing]:
    """Time each function with :func:`repro.timing.time_iterations` after ``warmup`` calls (the first compiles);
    iterations drop from ``iters`` (not below ``min_iters``, or ``iters`` if fewer) so that the remaining functions
    share the time left until ``deadline`` (``time.perf_counter()`` seconds)."""
    timings: dict[str, Timing] = {}
    names = list(fns)
    for position, name in enumerate(names):
        fn = fns[name]
        last = 0.0
        for _ in range(max(warmup, 1)):
            start = time.perf_counter()
            fn()
            synchronize(device)
            last = time.perf_counter() - start
        share = (deadline - time.perf_counter()) / (len(names) - position)
        count = max(min(min_iters, iters), min(iters, int(share / max(last, 1e-9))))
        timings[name] = time_iterations(fn, device=device, warmup=0, iters=count)
    return timings


def _dense_backend(device: torch.device, dtype: torch.dtype, heads: int, head_dim: int):
    """(context factory, name): flash attention on CUDA (the paper's dense baseline is FlashAttention-class), SDPA's
    own choice on CPU or where flash cannot run (tried on a tiny problem first, so a missing kernel is named in the
    rows instead of failing the point)."""
    from contextlib import nullcontext

    if device.type != "cuda":
        return nullcontext, "sdpa"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash():
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    probe = torch.zeros(1, heads, 128, head_dim, device=device, dtype=dtype, requires_grad=True)
    try:
        with flash():
            F.scaled_dot_product_attention(probe, probe, probe).sum().backward()
    except RuntimeError:
        return nullcontext, "sdpa_default"
    return flash, "sdpa_flash"


def _fresh(x: torch.Tensor) -> torch.Tensor:
    """A contiguous leaf copy (the tile-ordered inputs of the kernel timing, never views of the grid tensors)."""
    return x.detach().clone(memory_format=torch.contiguous_format)


def _compile_settings():
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


def _inputs(config: GpuConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (config.batch, *config.grid, config.heads, config.head_dim)
    return [torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4)]


def measure(config: GpuConfig, *, backward: bool, device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
            warmup: int = 3, iters: int = 10, time_cap_s: float = 60.0, check_queries: int = 256,
            compile: bool | None = None, attend: Attend | None = None) -> dict:
    """Dense vs GNA (kernel and op) times, the simulator's bounds for these tiles, and the correctness check.

    ``compile`` defaults to True on CUDA (Flex's kernel) and False on CPU (Flex runs eagerly there, forward only);
    ``attend`` replaces Flex (tests use it to run the backward path on CPU)."""
    device = torch.device(device)
    compile = device.type == "cuda" if compile is None else compile
    if attend is None:
        if backward and device.type == "cpu":
            raise ValueError("Flex has no backward on CPU: run forward points on CPU, forward+backward on a GPU")
        attend = flex_attend(compile=compile)
    with _compile_settings():
        return _measure(config, backward, device, dtype, warmup, iters, time_cap_s, check_queries, compile, attend)


def _measure(config: GpuConfig, backward: bool, device: torch.device, dtype: torch.dtype, warmup: int, iters: int,
             time_cap_s: float, check_queries: int, compile: bool, attend: Attend) -> dict:
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    problem = FlexProblem(config, device, attend)
    sim = simulate(config.grid, config.spec, config.q_tile, config.kv_tile)
    q, k, v, grad_out = _inputs(config, device, dtype)
    dense_context, dense_backend = _dense_backend(device, dtype, config.heads, config.head_dim)
    grad_heads_first = grad_out.reshape(config.batch, config.tokens, config.heads, -1).transpose(1, 2)
    q_seq, k_seq, v_seq = _fresh(problem.q_sequence(q)), _fresh(problem.kv_sequence(k)), _fresh(problem.kv_sequence(v))
    grad_seq = _fresh(problem.q_sequence(grad_out))
    setup_s = time.perf_counter() - started

    def forward_and_backward(run: Callable[[], torch.Tensor], inputs, grad) -> Callable[[], object]:
        if not backward:
            def forward():
                with torch.no_grad():
                    return run()
            return forward
        return lambda: torch.autograd.grad(run(), inputs, grad)

    def dense():
        with dense_context():
            return dense_attention(q, k, v)

    if backward:
        for x in (q, k, v, q_seq, k_seq, v_seq):
            x.requires_grad_(True)
    fns = {
        "dense": forward_and_backward(dense, (q, k, v), grad_heads_first),
        "gna": forward_and_backward(lambda: problem.kernel(q_seq, k_seq, v_seq), (q_seq, k_seq, v_seq), grad_seq),
        "gna_op": forward_and_backward(lambda: problem.op(q, k, v), (q, k, v), grad_out),
    }
    reserve = 0.15 * time_cap_s  # for the correctness check
    timings = time_capped(fns, device=device, warmup=warmup, iters=iters, deadline=started + time_cap_s - reserve)
    del fns, q_seq, k_seq, v_seq, grad_seq, grad_heads_first
    peak = {"peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30} if device.type == "cuda" else {}

    tokens = check_tokens(config.grid, check_queries)
    errors = check_against_reference(problem, q, k, v, grad_out, tokens, backward)
    seconds = {name: timing.median_s for name, timing in timings.items()}
    # Attention FLOPs (FlashAttention-2's convention): forward 4 * pairs * D * H per batch; backward 2.5x forward.
    passes = 3.5 if backward else 1.0
    per_pair = 4 * config.head_dim * config.heads * config.batch * passes
    dense_flops = per_pair * config.tokens**2
    gna_flops = per_pair * attended_pairs(config.grid, config.spec)
    result = dict(
        config=config.name, model=config.model, grid=_shape(config.grid), window=_shape(config.spec.window),
        stride=_shape(config.spec.stride), q_tile=_shape(config.q_tile), kv_tile=_shape(config.kv_tile),
        batch=config.batch, heads=config.heads, head_dim=config.head_dim, dtype=str(dtype).removeprefix("torch."),
        passes="fwd+bwd" if backward else "fwd", gna_backend=f"flex_{'compiled' if compile else 'eager'}",
        dense_backend=dense_backend, block_sparse=sim.block_sparse, checked_queries=int(tokens.numel()),
        **{f"iters_{name}": len(timing.times_s) for name, timing in timings.items()}, warmup=warmup,
        dense_s=seconds["dense"], gna_s=seconds["gna"], gna_op_s=seconds["gna_op"],
        speedup=seconds["dense"] / seconds["gna"], op_speedup=seconds["dense"] / seconds["gna_op"],
        bound=sim.worst_tile_speedup, work_bound=sim.work_speedup, flopwise_bound=sim.flopwise_speedup,
        sparsity=100.0 * (1.0 - 1.0 / sim.flopwise_speedup),
        dense_tflops=dense_flops / seconds["dense"] / 1e12, gna_tflops=gna_flops / seconds["gna"] / 1e12,
        **peak, setup_s=setup_s, elapsed_s=time.perf_counter() - started, **errors,
    )
    result["fraction_of_bound"] = result["speedup"] / result["bound"]
    result["fraction_of_work_bound"] = result["speedup"] / result["work_bound"]
    del q, k, v, grad_out
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# ---- a first check on a GPU -----------------------------------------------------------------------------------------

#: The smallest of the paper's shapes: Cosmos-7B's 16x44x80 tokens (3-D; 44 is padded to 48 by the 8-token tiles)
#: with window 16x24x16 and stride 1x8x16 (partial and full tiles), on HunyuanVideo's tiles; then FLUX.1-dev 4K
#: (2-D, 256x256, window 80x80, stride 16x16: perfectly block-sparse, Q tile 16x16, KV tile 16x8). Two heads each,
#: so that the dense check over every query is cheap.
SELFCHECKS = (
    GpuConfig("cosmos_selfcheck", "cosmos7b", (16, 44, 80), GNASpec((16, 24, 16), stride=(1, 8, 16)), (4, 8, 8),
              (2, 8, 8), heads=2),
    GpuConfig("flux_selfcheck", "flux1dev_4k", (256, 256), GNASpec((80, 80), stride=(16, 16)), (16, 16), (16, 8),
              heads=2),
)


def selfcheck(config: GpuConfig, device: torch.device | str, *, dtype: torch.dtype = torch.bfloat16,
              attend: Attend | None = None) -> dict[str, float]:
    """GNA forward + backward once (compiled Flex unless ``attend`` is given) against dense masked SDPA over every
    query: max abs and relative errors of out, dq, dk, dv."""
    device = torch.device(device)
    problem = FlexProblem(config, device, flex_attend(compile=True) if attend is None else attend)
    q, k, v, grad_out = _inputs(config, device, dtype)
    with _compile_settings():
        return check_against_reference(problem, q, k, v, grad_out, torch.arange(config.tokens), backward=True)


def cuda_selfcheck(configs: Sequence[GpuConfig] = SELFCHECKS, *, dtype: torch.dtype = torch.bfloat16,
                   tolerance: float = 5e-2) -> dict:
    """On CUDA: compiled Flex GNA forward + backward once per config against dense masked SDPA over every query
    (fp32). Returns ``max_rel_error`` (max abs error over the reference's max abs value, over out, dq, dk, dv and
    the configs), ``ok`` (within ``tolerance``: bf16 inputs with fp32 accumulation should stay near 1e-2, a wrong
    mask or permutation gives errors of order 1), ``seconds`` and per-config ``details``. About a minute per config,
    mostly compilation."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_selfcheck needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda", torch.cuda.current_device())
    started = time.perf_counter()
    details = {config.name: selfcheck(config, device, dtype=dtype) for config in configs}
    worst = max(value for errors in details.values() for name, value in errors.items() if name.endswith("_rel_error"))
    return {"max_rel_error": worst, "ok": worst <= tolerance, "seconds": time.perf_counter() - started,
            "details": details}
