"""MT-NLG 530B (Smith et al. 2022) on DGX A100: 3D layout, parameter count, memory, throughput.

Configuration (MT-NLG sec 2.3-3; secondary sources in paper_claims.csv): 105 layers, hidden 20480, 128 heads,
sequence 2048, vocabulary 51200 (GPT-2 BPE padded), global batch 1920; 8-way tensor parallelism inside a node,
35-way pipeline parallelism across nodes, data parallelism over the rest (280 GPUs per replica).

One constant is fitted: ``Efficiency.gemm`` (A100) on the 280-node iteration time (60.1 s, ``calibrate_a100``).
The 350- and 420-node throughputs are predictions. Assumed (not fitted): micro-batch 1, HBM efficiency 0.8,
NVSwitch bus-bandwidth fraction 0.77 (~230 of 300 GB/s, nccl-tests on DGX A100), InfiniBand 0.8, gradient
all-reduce after the pipeline flush (not overlapped), fp16 gradients, no straggler term.
"""

from __future__ import annotations

from dataclasses import replace

from repro.perfmodel.zero_memory import K_ADAM

from .flops import gpt_flops_per_iteration
from .hardware import DGX_A100, Cluster, Efficiency
from .megatron import _bisect
from .memory import MemoryPerGPU, memory_per_gpu
from .step_time import GPTConfig, Layout, StepTime, iteration_time

MTNLG_530B = GPTConfig(num_layers=105, hidden_size=20480, num_heads=128, vocab_size=51200, seq_length=2048)
TP_SIZE = 8
PP_SIZE = 35
GLOBAL_BATCH = 1920
MICRO_BATCH = 1
SELENE_NODES = 560  # MT-NLG sec 2.4: DGX A100 nodes in Selene (the full-cluster layout, dp = 16)


def mixed_precision_adam_bytes_per_param(*, fp32_grad_copy: bool = True) -> int:
    """Training memory per parameter with mixed-precision Adam (MT-NLG sec 2.1 states 20 bytes, no breakdown).

    2 bytes of fp16 weights + 2 of fp16 gradients + ``K_ADAM`` = 12 of fp32 master weights, momentum and variance
    (ZeRO sec 3.1) = 16, plus 4 for the fp32 copy of the gradients that Megatron's mixed-precision optimizer
    steps on (``fp32_grad_copy``) = 20.
    """
    return 2 + 2 + K_ADAM + (4 if fp32_grad_copy else 0)


BYTES_PER_PARAM = mixed_precision_adam_bytes_per_param()

A100_ASSUMED = Efficiency(gemm=0.5, memory=0.8, kernel_overhead=5e-6, intra_link=0.77, inter_link=0.8)


def layout_for_nodes(num_nodes: int, *, cluster: Cluster = DGX_A100) -> Layout:
    """The 8 x 35 x dp layout on ``num_nodes`` DGX A100 nodes (dp = 8 / 10 / 12 for 280 / 350 / 420 nodes)."""
    gpus = num_nodes * cluster.devices_per_node
    replica = TP_SIZE * PP_SIZE
    if gpus % replica:
        raise ValueError(f"{num_nodes} nodes = {gpus} GPUs is not a multiple of tp x pp = {replica}")
    return Layout(tp_size=TP_SIZE, pp_size=PP_SIZE, dp_size=gpus // replica, micro_batch_size=MICRO_BATCH,
                  global_batch_size=GLOBAL_BATCH, dp_overlap=0.0)


def total_gpus(num_nodes: int, *, cluster: Cluster = DGX_A100) -> int:
    """GPUs of the 3-D layout on ``num_nodes`` nodes: ``tp x pp x dp`` (sec 2.4: 8 x 35 x 16 = 4480 on 560 nodes)."""
    layout = layout_for_nodes(num_nodes, cluster=cluster)
    return layout.tp_size * layout.pp_size * layout.dp_size


def tokens_per_step(model: GPTConfig = MTNLG_530B, global_batch: int = GLOBAL_BATCH) -> int:
    """Tokens per optimizer step at the full batch: ``global_batch x seq_length`` (sec 3: 1920 x 2048)."""
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    return global_batch * model.seq_length


def tokens_per_parameter(train_tokens: float, model: GPTConfig = MTNLG_530B) -> float:
    """Training tokens per model parameter (sec 3: 270B tokens for the 530B model)."""
    if train_tokens <= 0:
        raise ValueError(f"train_tokens must be > 0, got {train_tokens}")
    return train_tokens / model.num_params


def flops_per_iteration(model: GPTConfig = MTNLG_530B, global_batch: int = GLOBAL_BATCH) -> float:
    return gpt_flops_per_iteration(batch_size=global_batch, seq_length=model.seq_length,
                                   num_layers=model.num_layers, hidden_size=model.hidden_size,
                                   vocab_size=model.vocab_size)


def predict_iteration(num_nodes: int, *, eff: Efficiency, cluster: Cluster = DGX_A100) -> StepTime:
    layout = layout_for_nodes(num_nodes, cluster=cluster)
    return iteration_time(MTNLG_530B, layout, cluster.with_nodes(num_nodes), eff)


def predict_tflops_per_gpu(num_nodes: int, *, eff: Efficiency, cluster: Cluster = DGX_A100) -> float:
    """Per-GPU model TFLOP/s (MT-NLG sec 2.4 reports 126 / 121 / 113 at 280 / 350 / 420 nodes)."""
    step = predict_iteration(num_nodes, eff=eff, cluster=cluster)
    return flops_per_iteration() / (step.total * num_nodes * cluster.devices_per_node) / 1e12


def tflops_from_iteration_time(num_nodes: int, iteration_time_s: float, *, cluster: Cluster = DGX_A100) -> float:
    """The paper's own conversion: model FLOPs / (iteration time x GPUs)."""
    return flops_per_iteration() / (iteration_time_s * num_nodes * cluster.devices_per_node) / 1e12


def calibrate_a100(*, num_nodes: int, iteration_time_s: float, cluster: Cluster = DGX_A100,
                   assumed: Efficiency = A100_ASSUMED) -> Efficiency:
    """Fit ``Efficiency.gemm`` so the model's iteration time on ``num_nodes`` equals ``iteration_time_s``."""
    gemm = _bisect(lambda g: -predict_iteration(num_nodes, eff=replace(assumed, gemm=g), cluster=cluster).total,
                   -iteration_time_s, 0.05, 1.0, increasing=True)
    return replace(assumed, gemm=gemm, fitted_on=f"gemm: MT-NLG {num_nodes}-node iteration time "
                                                 f"{iteration_time_s:g} s (sec 2.4)")


def memory_per_gpu_530b(*, num_nodes: int = 280, bytes_per_param: float = BYTES_PER_PARAM) -> MemoryPerGPU:
    """Memory per GPU of the 8 x 35 layout (first pipeline stage, full recomputation)."""
    return memory_per_gpu(MTNLG_530B, layout_for_nodes(num_nodes), bytes_per_param=bytes_per_param)
