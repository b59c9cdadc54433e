"""Measured GNA speedups on this machine: the fast kernel (and compiled Flex) against dense SDPA, beside the
simulator's bound. Used by ``bench/test_gna_bench.py`` and the ``gna_speedup`` experiment.

Timing is interleaved over rounds (dense, GNA, Flex, dense, GNA, Flex, ...) so that a drifting load on a shared
CPU hits every contender alike; per mode the fastest round is kept, and the *paired* speedup is the median over
rounds of dense / GNA within a round. The bound is the simulator's ``work_speedup`` for the tiles the kernel uses:
dense score entries over the entries of all visited tiles.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from repro.gna.fast import fast_attention
from repro.gna.simulator import choose_tile_shapes, simulate
from repro.gna.bench_problems import BenchConfig


def interleaved_times(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall-clock seconds of every function in every round, run round-robin."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def _inputs(config: BenchConfig, requires_grad: bool, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (config.batch, *config.grid, config.heads, config.head_dim)
    return [torch.randn(shape, generator=generator).requires_grad_(requires_grad) for _ in range(3)]


def _dense(q, k, v) -> torch.Tensor:
    """Dense SDPA on the flattened grid (the self-attention baseline)."""
    tokens = math.prod(q.shape[1:-2])

    def heads_first(x):
        return x.reshape(x.shape[0], tokens, x.shape[-2], x.shape[-1]).transpose(1, 2)

    return F.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v))


def measure(config: BenchConfig, *, backward: bool, rounds: int = 5, flex: bool = False) -> dict:
    """Speedup of the fast kernel (forward, or forward+backward) over dense SDPA, beside the tile bound; with
    ``flex`` also compiled FlexAttention (forward only) with the same tiles as its block mask."""
    q_tile, kv_tile = choose_tile_shapes(config.grid, config.spec)
    sim = simulate(config.grid, config.spec, q_tile, kv_tile)
    q, k, v = _inputs(config, requires_grad=backward)

    def forward_only(fn: Callable[[], torch.Tensor]) -> Callable[[], object]:
        def run():
            with torch.no_grad():
                return fn()

        return run

    if backward:
        grad = torch.randn(q.shape)
        dense_grad = grad.reshape(config.batch, -1, config.heads, config.head_dim).transpose(1, 2)
        fns: dict[str, Callable[[], object]] = {
            "dense": lambda: torch.autograd.grad(_dense(q, k, v), (q, k, v), dense_grad),
            "gna": lambda: torch.autograd.grad(fast_attention(q, k, v, config.spec), (q, k, v), grad),
        }
    else:
        fns = {
            "dense": forward_only(lambda: _dense(q, k, v)),
            "gna": forward_only(lambda: fast_attention(q, k, v, config.spec)),
        }
        if flex:
            from repro.gna.flex import flex_gna, gna_block_mask

            block_mask = gna_block_mask(config.grid, config.spec, q_tile, kv_tile)
            fns["flex"] = forward_only(
                lambda: flex_gna(q, k, v, config.spec, q_tile=q_tile, kv_tile=kv_tile, compile=True,
                                 block_mask=block_mask)
            )
    times = interleaved_times(fns, rounds)
    best = {name: min(values) for name, values in times.items()}
    result = dict(
        config=config.name,
        grid="x".join(map(str, config.grid)),
        window="x".join(map(str, config.spec.window)),
        stride="x".join(map(str, config.spec.stride)),
        heads=config.heads,
        head_dim=config.head_dim,
        q_tile="x".join(map(str, q_tile)),
        kv_tile="x".join(map(str, kv_tile)),
        passes="fwd+bwd" if backward else "fwd",
        block_sparse=sim.block_sparse,
        bound=sim.work_speedup,
        flopwise_bound=sim.flopwise_speedup,
        dense_s=best["dense"],
        gna_s=best["gna"],
        speedup=best["dense"] / best["gna"],
        paired_speedup=statistics.median(d / g for d, g in zip(times["dense"], times["gna"])),
        threads=torch.get_num_threads(),
        rounds=rounds,
    )
    result["fraction_of_bound"] = result["speedup"] / result["bound"]
    if "flex" in best:
        result["flex_s"] = best["flex"]
        result["flex_speedup"] = best["dense"] / best["flex"]
        result["gna_over_flex"] = best["flex"] / best["gna"]
    return result
