"""Iteration time of GPT training under tensor x pipeline x data parallelism on a cluster.

The model composes (each piece is a documented formula elsewhere in this package):

* per-layer kernels on one tensor-parallel rank timed by the roofline (``ops``, ``roofline``);
* tensor-parallel all-reduces per layer (Megatron-LM sec 3: 2 forward + 2 backward, +2 with recompute);
* the 1F1B pipeline: the slowest stage runs ``m`` micro-batches and the fill/drain passes one micro-batch through
  every stage, ``T = (m - 1) t_max + sum_stages t_stage`` (Narayanan et al. 2021 sec 2.2; uniform stages give
  the bubble ``(p - 1)/m``); stage boundaries send activations forward and gradients backward;
* the data-parallel gradient all-reduce (ring, ``2 (N_d - 1)/N_d`` of the gradient bytes), either exposed after
  the backward pass or partly hidden under it (``dp_overlap``);
* the optimizer step (memory-bound Adam);
* the straggler factor ``1 + sigma sqrt(2 ln N)`` of a synchronous step over N devices (``Efficiency``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .collectives import allreduce_time, ring_time
from .flops import gpt_param_count
from .hardware import Cluster, Efficiency, Link
from .ops import ADAM_BYTES_PER_PARAM, LayerShape, head_iteration_ops, layer_iteration_ops, optimizer_ops
from .parallel_comm import tp_allreduce_message_bytes, tp_allreduces_per_layer
from .roofline import ops_time


@dataclass(frozen=True)
class GPTConfig:
    """A GPT model as the papers describe it."""

    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    seq_length: int

    @property
    def num_params(self) -> float:
        """The MT-NLG closed form (``flops.gpt_param_count``)."""
        return gpt_param_count(num_layers=self.num_layers, hidden_size=self.hidden_size,
                               vocab_size=self.vocab_size, seq_length=self.seq_length)


@dataclass(frozen=True)
class Layout:
    """How the model is split: ``tp x pp x dp`` devices, micro-batches of ``micro_batch_size`` sequences, and
    ``global_batch_size`` sequences per iteration (so ``m = global / (dp * micro)`` micro-batches per pipeline)."""

    tp_size: int
    pp_size: int
    dp_size: int
    micro_batch_size: int
    global_batch_size: int
    activation_recompute: bool = True
    grad_bytes: int = 2  # bytes per gradient element in the data-parallel all-reduce
    activation_bytes: int = 2  # bytes per activation element (2: fp16/bf16 on GPUs, 4: fp32 on CPUs)
    fused_attention: bool = False  # SDPA-style fused softmax instead of Megatron-LM 2019's unfused kernels
    dropout: bool = True
    optimizer_bytes_per_param: float = ADAM_BYTES_PER_PARAM
    optimizer_launches: int = 7
    dp_overlap: float = 0.0  # fraction of the backward time that can hide the gradient all-reduce

    def __post_init__(self) -> None:
        for name in ("tp_size", "pp_size", "dp_size", "micro_batch_size", "global_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"Layout.{name} must be >= 1, got {getattr(self, name)}")
        if self.global_batch_size % (self.dp_size * self.micro_batch_size):
            raise ValueError(f"global_batch_size {self.global_batch_size} must be divisible by dp_size x "
                             f"micro_batch_size = {self.dp_size * self.micro_batch_size}")
        if not 0 <= self.dp_overlap <= 1:
            raise ValueError(f"dp_overlap must be in [0, 1], got {self.dp_overlap}")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size * self.dp_size

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch_size // (self.dp_size * self.micro_batch_size)


@dataclass(frozen=True)
class StepTime:
    """Breakdown of one iteration (seconds)."""

    total: float
    pipeline: float
    stage_max: float
    layer_compute: float
    tp_comm: float
    head: float
    p2p: float
    dp_comm_exposed: float
    optimizer: float
    straggler: float
    overhead: float = 0.0  # fitted time the kernels do not explain (CPU calibration; see cpu.fit_overheads)


def tp_link(cluster: Cluster, tp_size: int) -> Link:
    """Tensor parallelism inside a node uses the intra-node link, across nodes the node's share of IB."""
    if tp_size <= cluster.devices_per_node:
        return cluster.intra_node
    per_device = cluster.inter_node.bandwidth / cluster.devices_per_node
    return Link(cluster.inter_node.name + " (per device)", per_device, cluster.inter_node.latency)


def dp_link(cluster: Cluster, *, tp_size: int, pp_size: int, dp_size: int) -> Link:
    """Effective per-rank link of a data-parallel ring.

    Ranks are placed tp-fastest, then dp (Megatron-LM's rank order), pipeline stages on separate nodes. A DP group
    has ``k`` ranks per node; the node's ``devices_per_node / k`` concurrent DP groups share its inter-node
    bandwidth, each ring crossing the node boundary once, so each rank sees ``node_bw * k / devices_per_node``
    (capped by the intra-node link). A group inside one node uses the intra-node link alone.
    """
    per_node = cluster.devices_per_node
    ranks_per_node = max(1, min(dp_size, per_node // min(tp_size, per_node)))
    if ranks_per_node >= dp_size:
        return cluster.intra_node
    inter = cluster.inter_node.bandwidth * ranks_per_node / per_node
    bandwidth = min(cluster.intra_node.bandwidth, inter)
    return Link("data-parallel ring", bandwidth, cluster.inter_node.latency)


def layer_time(model: GPTConfig, layout: Layout, cluster: Cluster, eff: Efficiency) -> tuple[float, float]:
    """(compute, tensor-parallel communication) seconds of one layer for one micro-batch."""
    shape = LayerShape(layout.micro_batch_size, model.seq_length, model.hidden_size, model.num_heads,
                       layout.tp_size, layout.activation_bytes, layout.fused_attention,
                       layout.dropout)
    compute = ops_time(layer_iteration_ops(shape, activation_recompute=layout.activation_recompute),
                       cluster.device, eff)
    if layout.tp_size == 1:
        return compute, 0.0
    message = tp_allreduce_message_bytes(micro_batch_size=layout.micro_batch_size, seq_length=model.seq_length,
                                         hidden_size=model.hidden_size, bytes_per_element=layout.activation_bytes)
    one = allreduce_time(num_ranks=layout.tp_size, message_bytes=message, link=tp_link(cluster, layout.tp_size),
                         link_efficiency=eff.intra_link)
    return compute, tp_allreduces_per_layer(activation_recompute=layout.activation_recompute) * one


def head_time(model: GPTConfig, layout: Layout, cluster: Cluster, eff: Efficiency) -> float:
    """Embedding + logits + loss for one micro-batch, with their 2 tensor-parallel all-reduces of ``b s h`` and the
    cross-entropy's 3 all-reduces of ``b s`` fp32 values."""
    ops = head_iteration_ops(micro_batch_size=layout.micro_batch_size, seq_length=model.seq_length,
                             hidden_size=model.hidden_size, vocab_size=model.vocab_size, tp_size=layout.tp_size,
                             dtype_bytes=layout.activation_bytes)
    compute = ops_time(ops, cluster.device, eff)
    if layout.tp_size == 1:
        return compute
    message = tp_allreduce_message_bytes(micro_batch_size=layout.micro_batch_size, seq_length=model.seq_length,
                                         hidden_size=model.hidden_size, bytes_per_element=layout.activation_bytes)
    link = tp_link(cluster, layout.tp_size)
    comm = 2 * allreduce_time(num_ranks=layout.tp_size, message_bytes=message, link=link,
                              link_efficiency=eff.intra_link)
    # vocab-parallel cross-entropy: max, sum of exp and target logit, one fp32 value per token each (sec 3)
    per_token = layout.micro_batch_size * model.seq_length * 4
    comm += 3 * allreduce_time(num_ranks=layout.tp_size, message_bytes=per_token, link=link,
                               link_efficiency=eff.intra_link)
    return compute + comm


def iteration_time(model: GPTConfig, layout: Layout, cluster: Cluster, eff: Efficiency) -> StepTime:
    """Predicted seconds per training iteration, with a breakdown."""
    if model.num_layers % layout.pp_size:
        raise ValueError(f"num_layers {model.num_layers} must be divisible by pp_size {layout.pp_size}")
    layers_per_stage = model.num_layers // layout.pp_size
    compute, tp_comm = layer_time(model, layout, cluster, eff)
    head = head_time(model, layout, cluster, eff)
    body = layers_per_stage * (compute + tp_comm)

    p2p = 0.0
    if layout.pp_size > 1:
        # forward activation + backward gradient per micro-batch, split across the tp ranks (scatter/gather)
        message = (layout.micro_batch_size * model.seq_length * model.hidden_size * layout.activation_bytes
                   / layout.tp_size)
        link = tp_link(cluster, cluster.devices_per_node + 1)  # a device's share of the node's IB
        p2p = 2 * ring_time(bytes_per_rank=message, steps=1, link=link, link_efficiency=eff.inter_link)
    stage_times = [body + p2p for _ in range(layout.pp_size)]
    stage_times[-1] += head  # logits + loss (the embedding's share is small; charged to the same stage)
    m = layout.num_micro_batches
    pipeline = (m - 1) * max(stage_times) + sum(stage_times)

    params_per_rank = model.num_params / (layout.tp_size * layout.pp_size)
    optimizer = ops_time(optimizer_ops(params_per_rank=params_per_rank, bytes_per_param=layout.optimizer_bytes_per_param,
                                       launches=layout.optimizer_launches), cluster.device, eff)
    dp_exposed = 0.0
    if layout.dp_size > 1:
        link = dp_link(cluster, tp_size=layout.tp_size, pp_size=layout.pp_size, dp_size=layout.dp_size)
        efficiency = eff.intra_link if link is cluster.intra_node else eff.inter_link
        dp = allreduce_time(num_ranks=layout.dp_size, message_bytes=params_per_rank * layout.grad_bytes,
                            link=link, link_efficiency=efficiency)
        backward = m * layers_per_stage * compute / 2  # about half of the per-layer work is backward
        dp_exposed = max(0.0, dp - layout.dp_overlap * backward)
    busy = pipeline + optimizer + dp_exposed
    straggler = busy * eff.straggler_sigma * math.sqrt(2 * math.log(layout.world_size))
    return StepTime(total=busy + straggler, pipeline=pipeline, stage_max=max(stage_times), layer_compute=compute,
                    tp_comm=tp_comm, head=head, p2p=p2p, dp_comm_exposed=dp_exposed, optimizer=optimizer,
                    straggler=straggler)
