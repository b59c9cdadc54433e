"""End to end: a whole transformer layer on T3's GPU, and what T3 saves of it.

The layer's kernels are the performance model's own op list (``repro.perfmodel.ops``: fused attention, 16-bit
activations, no activation recomputation): training runs the forward and backward kernels, prompt inference the
forward ones. Each GEMM is timed by the tile/wave model (``gemm``), each element-wise kernel by its bytes over the
HBM bandwidth, and each tensor-parallel all-reduce (forward after OP and FC-2, backward after IP and FC-1) as a
reduce-scatter then an all-gather (``ring``). Every layer of a model is the same, so the layer's shares are the
model's (embedding, logits and optimizer are left out).

T3 changes only its sublayers: the layer under a schedule takes ``baseline - sum(sequential - schedule)`` over the
sublayers of the passes that run. Heads that do not divide by the TP degree (T-NLG's 28, PaLM's 48) are rounded up
to a multiple of it: the busiest rank holds ``ceil(heads / tp)`` heads and sets the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from repro.perfmodel.ops import LayerShape, backward_ops, layer_forward_ops

from .gemm import gemm_cost
from .hardware import T3Gpu
from .ring import all_gather, reduce_scatter
from .schedules import SublayerResult, simulate_sublayer
from .workloads import FORWARD, SUBLAYERS, Model, sublayer

SCHEDULES = ("sequential", "ideal", "t3", "t3_mca")


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one layer per schedule, and of its all-reduces in the baseline."""

    model: str
    tp: int
    mode: str  # "training" or "inference"
    compute_s: float  # every kernel of the layer
    comm_s: float  # the all-reduces (RS + AG), sequential
    schedule_s: dict

    @property
    def comm_share(self) -> float:
        return self.comm_s / (self.compute_s + self.comm_s)

    def speedup(self, schedule: str) -> float:
        return self.schedule_s["sequential"] / self.schedule_s[schedule]


def _op_s(gpu: T3Gpu, op) -> float:
    if op.kind == "gemm":
        m, n, k, batch = op.gemm_shape
        return gemm_cost(gpu, m=m, n=n, k=k, batch=batch).time_s
    return op.bytes / gpu.hbm_bandwidth


def layer_times(gpu: T3Gpu, model: Model, tp: int, *, mode: str, contention: float,
                results: dict[str, SublayerResult] | None = None) -> LayerTimes:
    """One layer of ``model`` at ``tp`` in ``mode`` ("training" or "inference") under every schedule."""
    if mode not in ("training", "inference"):
        raise ValueError(f"mode={mode!r} must be 'training' or 'inference'")
    heads = math.ceil(model.num_heads / tp) * tp
    shape = LayerShape(micro_batch_size=model.tokens // model.seq_length, seq_length=model.seq_length,
                       hidden_size=model.hidden_size, num_heads=heads, tp_size=tp, dtype_bytes=gpu.element_bytes,
                       fused_attention=True, dropout=True)
    forward = layer_forward_ops(shape)
    ops = forward + (backward_ops(forward) if mode == "training" else [])
    compute = sum(_op_s(gpu, op) for op in ops)
    names = SUBLAYERS if mode == "training" else FORWARD
    if results is None:
        results = {name: simulate_sublayer(gpu, sublayer(model, name, tp), contention=contention) for name in names}
    message = model.tokens * model.hidden_size * gpu.element_bytes
    allreduce = (reduce_scatter(gpu, message_bytes=message, ranks=tp).time_s
                 + all_gather(gpu, message_bytes=message, ranks=tp).time_s)
    comm = len(names) * allreduce
    baseline = compute + comm
    times = {s: baseline - sum(results[n].sequential_s - getattr(results[n], f"{s}_s") for n in names)
             for s in SCHEDULES}
    return LayerTimes(model.name, tp, mode, compute, comm, times)
