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

T3 projects end to end with a share of time in "non-sliced attention ops" that it takes from MLPerf v1.1's BERT
(40-45 % per T3-SEC1; the primary text is not available here, so what T3 counts as non-sliced is not known). This
model's counterpart (:func:`attention_core_share`) is the share of a layer's kernel time in the attention kernels
between the QKV and output projections, the ones no T3 sublayer holds, on the same op list (fused softmax and
dropout, as for every model here) and GPU, for BERT-large at MLPerf's shape (``workloads.MLPERF_BERT``).
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


def _forward_ops(gpu: T3Gpu, model: Model, tp: int) -> list:
    heads = math.ceil(model.num_heads / tp) * tp
    shape = LayerShape(micro_batch_size=model.tokens // model.seq_length, seq_length=model.seq_length,
                       hidden_size=model.hidden_size, num_heads=heads, tp_size=tp, dtype_bytes=gpu.element_bytes,
                       fused_attention=True, dropout=True)
    return layer_forward_ops(shape)


def _passes(forward: list, mode: str) -> list:
    """The kernels that run: the forward ones, and in training their backward ones too."""
    if mode not in ("training", "inference"):
        raise ValueError(f"mode={mode!r} must be 'training' or 'inference'")
    return forward + (backward_ops(forward) if mode == "training" else [])


def attention_core(forward: list) -> list:
    """The forward kernels between the QKV projection and the output projection (split q/k/v, scores, softmax
    with dropout, context, transpose): the attention ops no T3 sublayer holds, "non-sliced" in T3's terms."""
    names = [op.name for op in forward]
    first = next(i for i, name in enumerate(names) if name.startswith("qkv"))
    last = next(i for i, name in enumerate(names) if name.startswith("projection"))
    return forward[first + 1:last]


def attention_core_share(gpu: T3Gpu, model: Model, tp: int = 1, *, mode: str = "training") -> float:
    """Share of one layer's kernel time (no communication) in :func:`attention_core`'s kernels, forward and, in
    training, backward; the same op list and GPU as :func:`layer_times`."""
    forward = _forward_ops(gpu, model, tp)
    total = sum(_op_s(gpu, op) for op in _passes(forward, mode))
    return sum(_op_s(gpu, op) for op in _passes(attention_core(forward), mode)) / total


def layer_flops(gpu: T3Gpu, model: Model, tp: int, *, mode: str) -> float:
    """FLOPs of one layer's kernels on one rank in ``mode`` (the op list :func:`layer_times` times)."""
    return sum(op.flops for op in _passes(_forward_ops(gpu, model, tp), mode))


def layer_times(gpu: T3Gpu, model: Model, tp: int, *, mode: str, contention: float,
                results: dict[str, SublayerResult] | None = None) -> LayerTimes:
    """One layer of ``model`` at ``tp`` in ``mode`` ("training" or "inference") under every schedule."""
    compute = sum(_op_s(gpu, op) for op in _passes(_forward_ops(gpu, model, tp), mode))
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
