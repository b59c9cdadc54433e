"""A transformer block whose four projections come from a linear-layer factory, so the same block (same math,
same attention, same layer norms) can be timed with plain ``nn.Linear``, repro's parallel layers, or
megatron-core's ``ColumnParallelLinear`` / ``RowParallelLinear``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-LN block: x + Wo(attn(Wqkv(LN(x)))), then x + W2(gelu(W1(LN(x)))). ``column``/``row`` build the
    projections; ``heads_per_rank`` is heads / tp."""

    def __init__(self, hidden: int, heads_per_rank: int, column, row) -> None:
        super().__init__()
        self.heads, self.head_dim = heads_per_rank, None
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.dense = column(hidden, 3 * hidden), row(hidden, hidden)
        self.fc1, self.fc2 = column(hidden, 4 * hidden), row(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x))
        head_dim = qkv.shape[-1] // (3 * self.heads)
        q, k, v = qkv.view(b, s, self.heads, 3, head_dim).unbind(3)
        ctx = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.dense(ctx.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class _FirstOfTuple(nn.Module):
    """megatron-core's linear layers return (output, bias); keep the output."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


def megatron_core_factories(tp_size: int, process_group):
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    config = ModelParallelConfig(tensor_model_parallel_size=tp_size, use_cpu_initialization=True)
    init = lambda w: nn.init.normal_(w, std=0.02)  # noqa: E731

    def column(i, o):
        return _FirstOfTuple(ColumnParallelLinear(i, o, config=config, init_method=init, bias=True,
                                                  gather_output=False, tp_group=process_group))

    def row(i, o):
        return _FirstOfTuple(RowParallelLinear(i, o, config=config, init_method=init, bias=True,
                                               input_is_parallel=True, skip_bias_add=False, tp_group=process_group))

    return column, row


def repro_factories(group, *, async_grad_all_reduce: bool = False):
    """repro's layers; with ``async_grad_all_reduce`` the column layers start dX's all-reduce before the dW GEMM
    (Megatron's asynchronous all-reduce: the T3 overlapped layer with one chunk)."""
    from repro.overlap.column_parallel import OverlappedColumnParallelLinear
    from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    def column(i, o):
        if async_grad_all_reduce:
            return OverlappedColumnParallelLinear(i, o, group=group, num_chunks=1)
        return ColumnParallelLinear(i, o, group=group)

    return column, (lambda i, o: RowParallelLinear(i, o, group=group))


def plain_factories():
    return nn.Linear, nn.Linear


def time_interleaved(steps: dict, rounds: int, warmup: int = 2, sync=None) -> dict[str, float]:
    """Median seconds per call of each step function, measured in interleaved rounds (A B A B ...), so that load
    from the rest of the machine hits every contender alike. ``sync`` (e.g. a barrier) runs before each timing."""
    import statistics
    import time

    samples: dict[str, list[float]] = {name: [] for name in steps}
    for index in range(warmup + rounds):
        for name, step in steps.items():
            if sync is not None:
                sync()
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
            if index >= warmup:
                samples[name].append(elapsed)
    return {name: statistics.median(values) for name, values in samples.items()}
