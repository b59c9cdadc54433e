"""GNA through FlexAttention against dense attention on one device: compiled Flex in bf16 on a GPU (the paper's
question, GNA §4 Tables 2-4, asked of a different kernel and GPU), eager Flex at toy size on a CPU (the same code).

One problem (:class:`repro.gna.gpu_config.GpuConfig`): a token grid, a GNA spec, the query/KV tile shapes whose
(query tile, KV tile) pairs are Flex's blocks, heads and head_dim. :func:`measure` times, each after warm-up with
:func:`repro.gna.time_cap.time_capped` (CUDA events on a GPU):

* ``dense``: ``F.scaled_dot_product_attention`` over all tokens, on [batch, heads, tokens, dim] views of the same
  q/k/v, with the SDPA backend that was fastest on this device, dtype, shape and direction
  (:mod:`repro.gna.dense_baseline`: every backend is probed briefly, the winner named in ``dense_backend`` and
  timed in full like the other two; the ladder is in ``dense_probe_s``, the backends not probed in
  ``dense_probe_notes``);
* ``gna``: Flex on the tile-permuted sequences with the GNA block mask (the kernel: what the tile simulator bounds);
* ``gna_op``: the whole op as :func:`repro.gna.flex.flex_gna` runs it: permute tokens into tiles, Flex, permute back
  (what a model pays).

forward (``torch.no_grad``) or forward + backward (``torch.autograd.grad`` of the output against a fixed random
gradient). Every measurement is checked (:mod:`repro.gna.gpu_check`): the op's output (and, with backward, dq) at
sampled query tokens against dense SDPA with the GNA mask in fp32 (fp64 on CPU), over all tokens (and dk, dv too)
when the grid is small. Iterations are capped so that a point stays within ``time_cap_s`` after compilation.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from repro.gna.dense_baseline import SdpaBackend, dense_attention, math_skip_reason, probe_dense
from repro.gna.flex_kernel import kernel_for
from repro.gna.flex_problem import Attend, FlexProblem, compile_settings, flex_attend
from repro.gna.gpu_check import check_against_reference, check_tokens
from repro.gna.gpu_config import GpuConfig, random_inputs, shape_text
from repro.gna.simulator import attended_pairs, simulate
from repro.gna.time_cap import time_capped


def _fresh(x: torch.Tensor) -> torch.Tensor:
    """A contiguous leaf copy (the tile-ordered inputs of the kernel timing, never views of the grid tensors)."""
    return x.detach().clone(memory_format=torch.contiguous_format)


def measure(config: GpuConfig, *, backward: bool, device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
            warmup: int = 3, iters: int = 10, time_cap_s: float = 60.0, check_queries: int = 256,
            dense_probe_iters: int = 3, dense_probe_cap_s: float | None = None, compile: bool | None = None,
            attend: Attend | None = None) -> dict:
    """Dense vs GNA (kernel and op) times, the dense backend ladder, the simulator's bounds for these tiles, and the
    correctness check.

    The dense ladder probes each SDPA backend for ``dense_probe_iters`` iterations within ``dense_probe_cap_s``
    (default a quarter of ``time_cap_s``); ``compile`` defaults to True on CUDA (Flex's kernel) and False on CPU
    (Flex runs eagerly there, forward only); ``attend`` replaces Flex (tests use it to run the backward path on
    CPU)."""
    device = torch.device(device)
    compile = device.type == "cuda" if compile is None else compile
    if attend is None:
        if backward and device.type == "cpu":
            raise ValueError("Flex has no backward on CPU: run forward points on CPU, forward+backward on a GPU")
        attend = flex_attend(compile=compile)
    probe_cap_s = 0.25 * time_cap_s if dense_probe_cap_s is None else dense_probe_cap_s
    with compile_settings():
        return _measure(config, backward=backward, device=device, dtype=dtype, warmup=warmup, iters=iters,
                        time_cap_s=time_cap_s, check_queries=check_queries, probe_iters=dense_probe_iters,
                        probe_cap_s=probe_cap_s, compile=compile, attend=attend)


def _measure(config: GpuConfig, *, backward: bool, device: torch.device, dtype: torch.dtype, warmup: int, iters: int,
             time_cap_s: float, check_queries: int, probe_iters: int, probe_cap_s: float, compile: bool,
             attend: Attend) -> dict:
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    problem = FlexProblem(config, device, attend)
    kernel = kernel_for(torch.empty(1, 1, 1, config.head_dim, device=device, dtype=dtype), problem.block_mask)
    sim = simulate(config.grid, config.spec, config.q_tile, config.kv_tile)
    q, k, v, grad_out = random_inputs(config, device, dtype)
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

    def dense_with(backend: SdpaBackend) -> Callable[[], object]:
        def dense():
            with backend.context():
                return dense_attention(q, k, v)
        return forward_and_backward(dense, (q, k, v), grad_heads_first)

    if backward:
        for x in (q, k, v, q_seq, k_seq, v_seq):
            x.requires_grad_(True)
    math_why = math_skip_reason(config.batch, config.heads, config.tokens, backward=backward, device=device)
    ladder = probe_dense(dense_with, device=device, deadline=time.perf_counter() + probe_cap_s, warmup=warmup,
                         probe_iters=probe_iters, skip={"sdpa_math": math_why} if math_why else None)
    fns = {
        "dense": dense_with(ladder.fastest),  # timed in full below, exactly like the GNA kernel and op
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
        config=config.name, model=config.model, grid=shape_text(config.grid),
        window=shape_text(config.spec.window), stride=shape_text(config.spec.stride),
        q_tile=shape_text(config.q_tile), kv_tile=shape_text(config.kv_tile),
        batch=config.batch, heads=config.heads, head_dim=config.head_dim, dtype=str(dtype).removeprefix("torch."),
        passes="fwd+bwd" if backward else "fwd", gna_backend=f"flex_{'compiled' if compile else 'eager'}",
        flex_kernel=kernel.describe() if kernel else "cpu",
        flex_kernel_source=kernel.source if kernel else "Flex's CPU kernel (no options)",
        dense_backend=ladder.fastest.name, dense_probe_s=ladder.probe_s(), dense_probe_iters=ladder.probe_iters(),
        dense_probe_notes=ladder.notes(), block_sparse=sim.block_sparse, checked_queries=int(tokens.numel()),
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

