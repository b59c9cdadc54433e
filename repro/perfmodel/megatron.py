"""Megatron-LM (Shoeybi et al. 2019) weak scaling on DGX-2H V100 nodes: Table 1 configs, Fig. 5 efficiencies.

Weak-scaling efficiency (Megatron-LM sec 5.1) is per-GPU model throughput relative to the 1-GPU 1.2B baseline:
``eff = [F(model) / (gpus * T)] / [F(1.2B) / T_1]`` with ``F`` the model FLOPs (``flops.gpt_flops_per_iteration``).

Three constants are fitted, each on one paper number, in this order (``calibrate_v100``), on as few Fig. 5 bars as
the model needs (one per constant it cannot take from a datasheet):

1. ``Efficiency.gemm`` on the 1-GPU baseline, 39 TFLOP/s (sec 5.1.1);
2. ``Efficiency.straggler_sigma`` on 64-way pure data parallelism, 96 % (Fig. 5, 1.2B x 64 GPUs);
3. ``Efficiency.intra_link`` (NVSwitch bus-bandwidth fraction) on the 4-way model-parallel bar, 82 % (Fig. 5,
   ``LINK_FIT_MP``): the smallest bar whose all-reduces weigh enough to fix the constant, so that the 8-way bar (the
   paper's headline 77 %) and the 512-GPU bar are held out.

Everything else (2- and 8-way MP, 128/256/512-GPU MP+DP, 15.1 PFLOP/s, Table 7 heads, Table 8 strong scaling,
Table 2 days per epoch) is predicted, not fitted. Assumed (not fitted): HBM efficiency 0.8, 5 us between kernels,
IB efficiency 0.8.

The data-parallel gradient all-reduce is modelled as overlapped with the backward pass (``dp_overlap = 1``): a
512-GPU run moves ~32 GB per node per iteration over 100 GB/s of InfiniBand (>= 0.33 s), while Fig. 5 charges
8-way MP + 64-way DP only ~0.1 s more than 8-way MP alone, which no un-overlapped all-reduce can reach.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .flops import achieved_flops_per_device, gpt_flops_per_iteration
from .hardware import DGX2H, Accelerator, Cluster, Efficiency
from .step_time import GPTConfig, Layout, iteration_time

PADDED_VOCAB = 51200  # Megatron-LM sec 5.1: 50,257 padded to a multiple of 128 x 8
SEQ_LENGTH = 1024
MP_BATCH = 8  # sec 5.1: batch 8 for the model-parallel runs
DP_DEGREE = 64  # sec 5.1: 64-way data parallel, global batch 512
GPT2_GLOBAL_BATCH = 512  # sec 5.2 (Table 2 runs): GPT-2 trained on batches of 512 sequences of 1024 tokens
SECONDS_PER_DAY = 86400
#: The Fig. 5 model-parallel bar the link constant is fitted on (module docstring, ``calibrate_v100``).
LINK_FIT_MP = 4


@dataclass(frozen=True)
class ScalingConfig:
    """One row of Megatron-LM Table 1 (the label is the paper's parameter count)."""

    label: str
    num_layers: int
    hidden_size: int
    num_heads: int
    mp_size: int

    def model(self, *, num_heads: int | None = None) -> GPTConfig:
        return GPTConfig(self.num_layers, self.hidden_size, num_heads or self.num_heads, PADDED_VOCAB, SEQ_LENGTH)


#: Megatron-LM Table 1 (claim ids ``t1_<label>_*`` in paper_claims.csv).
TABLE1 = (
    ScalingConfig("1p2B", 40, 1536, 16, 1),
    ScalingConfig("2p5B", 54, 1920, 20, 2),
    ScalingConfig("4p2B", 64, 2304, 24, 4),
    ScalingConfig("8p3B", 72, 3072, 32, 8),
)


@dataclass(frozen=True)
class TrainingRun:
    """One row of Megatron-LM Table 2: a GPT-2 model trained on ``gpus`` GPUs with batch ``GPT2_GLOBAL_BATCH``."""

    label: str
    num_layers: int
    hidden_size: int
    num_heads: int
    gpus: int
    #: model-parallel degree; the rest of the GPUs are data parallel (sec 5.2: 64-way, global batch 512)
    mp_size: int = 1

    def model(self) -> GPTConfig:
        return GPTConfig(self.num_layers, self.hidden_size, self.num_heads, PADDED_VOCAB, SEQ_LENGTH)


#: Megatron-LM Table 2 (claim ids ``t2_<label>_*``). The 8.3B run has 24 heads here, 32 in Table 1. Each run is
#: 64-way data parallel over 1-, 2- and 8-way model parallelism (64 / 128 / 512 GPUs, global batch 512).
TABLE2 = (
    TrainingRun("355M", 24, 1024, 16, 64, 1),
    TrainingRun("2p5B", 54, 1920, 20, 128, 2),
    TrainingRun("8p3B", 72, 3072, 24, 512, 8),
)


def _flops(model: GPTConfig, batch: int) -> float:
    return gpt_flops_per_iteration(batch_size=batch, seq_length=model.seq_length, num_layers=model.num_layers,
                                   hidden_size=model.hidden_size, vocab_size=model.vocab_size)


def per_gpu_flops(model: GPTConfig, layout: Layout, cluster: Cluster, eff: Efficiency) -> float:
    """Model FLOP/s per GPU the model predicts for ``layout``."""
    step = iteration_time(model, layout, cluster.with_nodes(nodes_for(layout.world_size, cluster)), eff)
    return _flops(model, layout.global_batch_size) / (step.total * layout.world_size)


def nodes_for(world_size: int, cluster: Cluster = DGX2H) -> int:
    """Nodes a ``world_size``-GPU run occupies: ``ceil(world_size / devices_per_node)`` (at least one).
    Megatron-LM sec 5: the 512-GPU runs use 32 DGX-2H servers of 16 V100s."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return max(1, -(-world_size // cluster.devices_per_node))


def percent_of_peak(flops_per_device: float, device: Accelerator) -> float:
    """Achieved FLOP/s as a percentage of the device's dense 16-bit peak (Megatron-LM abstract / sec 1: the
    1-GPU baseline's 39 TFLOP/s is 30 % of a V100's peak)."""
    if flops_per_device < 0:
        raise ValueError(f"flops_per_device must be >= 0, got {flops_per_device}")
    return 100.0 * flops_per_device / device.peak_flops


def tokens_per_epoch(iterations: float, *, global_batch: int = GPT2_GLOBAL_BATCH,
                     seq_length: int = SEQ_LENGTH) -> float:
    """Tokens one epoch of ``iterations`` steps reads: ``iterations x batch x seq`` (sec 5.2: an epoch is 68,507
    iterations of 512 x 1024 tokens)."""
    if iterations <= 0 or global_batch < 1 or seq_length < 1:
        raise ValueError(f"iterations, global_batch and seq_length must be positive, got "
                         f"{iterations}, {global_batch}, {seq_length}")
    return float(iterations) * global_batch * seq_length


def tflops_from_epoch_time(run: TrainingRun, *, days_per_epoch: float, iterations_per_epoch: float) -> float:
    """Per-GPU model TFLOP/s implied by a Table 2 epoch time: the iteration's model FLOPs (Narayanan et al. 2021,
    with recomputation; ``flops.gpt_flops_per_iteration``) over the time per iteration and ``run.gpus``."""
    if days_per_epoch <= 0 or iterations_per_epoch <= 0:
        raise ValueError(f"days_per_epoch and iterations_per_epoch must be > 0, got {days_per_epoch}, "
                         f"{iterations_per_epoch}")
    seconds = days_per_epoch * SECONDS_PER_DAY / iterations_per_epoch
    flops = _flops(run.model(), GPT2_GLOBAL_BATCH)
    return achieved_flops_per_device(flops_per_iteration=flops, iteration_time_s=seconds, num_devices=run.gpus) / 1e12


def mp_layout(mp_size: int, *, batch: int = MP_BATCH) -> Layout:
    return Layout(tp_size=mp_size, pp_size=1, dp_size=1, micro_batch_size=batch, global_batch_size=batch,
                  dp_overlap=1.0)


def mpdp_layout(mp_size: int, *, dp_size: int = DP_DEGREE, batch: int = MP_BATCH) -> Layout:
    return Layout(tp_size=mp_size, pp_size=1, dp_size=dp_size, micro_batch_size=batch,
                  global_batch_size=batch * dp_size, dp_overlap=1.0)


def weak_scaling_efficiency(config: ScalingConfig, *, data_parallel: bool, eff: Efficiency,
                            cluster: Cluster = DGX2H) -> float:
    """Fig. 5: per-GPU throughput of ``config`` (MP alone, or MP x 64-way DP) over the 1-GPU 1.2B baseline."""
    baseline = per_gpu_flops(TABLE1[0].model(), mp_layout(1), cluster, eff)
    layout = mpdp_layout(config.mp_size) if data_parallel else mp_layout(config.mp_size)
    return per_gpu_flops(config.model(), layout, cluster, eff) / baseline


def aggregate_flops(config: ScalingConfig, *, eff: Efficiency, cluster: Cluster = DGX2H) -> float:
    """Sustained FLOP/s of the whole MP x 64-way DP run (abstract: 15.1 PFLOP/s for 8.3B on 512 GPUs)."""
    layout = mpdp_layout(config.mp_size)
    return per_gpu_flops(config.model(), layout, cluster, eff) * layout.world_size


def strong_scaling_speedup(mp_size: int, *, eff: Efficiency, cluster: Cluster = DGX2H) -> float:
    """Table 8: the 1.2B model at fixed batch 8 on ``mp_size`` GPUs, speedup over 1 GPU."""
    return (strong_scaling_iteration_s(1, eff=eff, cluster=cluster)
            / strong_scaling_iteration_s(mp_size, eff=eff, cluster=cluster))


def days_per_epoch(run: TrainingRun, *, eff: Efficiency, iterations_per_epoch: float,
                   cluster: Cluster = DGX2H) -> float:
    """Table 2: days one epoch of ``iterations_per_epoch`` iterations takes for ``run`` on ``run.gpus`` GPUs as
    ``run.mp_size``-way model parallelism x the rest data parallelism (batch 8 per replica)."""
    if iterations_per_epoch <= 0 or run.gpus % run.mp_size:
        raise ValueError(f"iterations_per_epoch must be > 0 and {run.gpus} GPUs a multiple of "
                         f"mp_size={run.mp_size}, got {iterations_per_epoch}")
    layout = mpdp_layout(run.mp_size, dp_size=run.gpus // run.mp_size)
    step = iteration_time(run.model(), layout, cluster.with_nodes(nodes_for(layout.world_size, cluster)), eff)
    return iterations_per_epoch * step.total / SECONDS_PER_DAY


def strong_scaling_iteration_s(mp_size: int, *, eff: Efficiency, cluster: Cluster = DGX2H) -> float:
    """Table 8: seconds per iteration of the 1.2B model at batch 8 on ``mp_size`` GPUs (model parallel)."""
    return iteration_time(TABLE1[0].model(), mp_layout(mp_size), cluster, eff).total


def heads_efficiency(num_heads: int, *, eff: Efficiency, cluster: Cluster = DGX2H) -> float:
    """Table 7: 8.3B on 8-way MP with ``num_heads`` heads, weak-scaling efficiency vs the 1-GPU baseline."""
    config = TABLE1[3]
    baseline = per_gpu_flops(TABLE1[0].model(), mp_layout(1), cluster, eff)
    return per_gpu_flops(config.model(num_heads=num_heads), mp_layout(8), cluster, eff) / baseline


def _bisect(fn: Callable[[float], float], target: float, lo: float, hi: float, increasing: bool) -> float:
    """Solve ``fn(x) = target`` for monotone ``fn`` on [lo, hi]."""
    f_lo, f_hi = fn(lo), fn(hi)
    if not min(f_lo, f_hi) <= target <= max(f_lo, f_hi):
        raise ValueError(f"target {target} outside the model's range [{min(f_lo, f_hi)}, {max(f_lo, f_hi)}] "
                         f"for parameter in [{lo}, {hi}]")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if (fn(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def calibrate_v100(*, baseline_flops: float, pure_dp_efficiency: float, mp_efficiency: float,
                   mp_size: int = LINK_FIT_MP, cluster: Cluster = DGX2H, assumed: Efficiency | None = None) -> Efficiency:
    """Fit the three V100 constants (module docstring) on three Megatron-LM numbers, in order: the link constant on
    the Fig. 5 model-parallel bar of ``mp_size`` GPUs (``LINK_FIT_MP``), whose efficiency is ``mp_efficiency``."""
    link_config = next((c for c in TABLE1 if c.mp_size == mp_size and mp_size > 1), None)
    if link_config is None:
        raise ValueError(f"mp_size={mp_size!r} must be the model-parallel degree of a Table 1 bar above 1 "
                         f"({[c.mp_size for c in TABLE1 if c.mp_size > 1]})")
    eff = assumed or Efficiency(gemm=0.5, memory=0.8, kernel_overhead=5e-6, intra_link=0.5, inter_link=0.8)
    base_model = TABLE1[0].model()
    gemm = _bisect(lambda g: per_gpu_flops(base_model, mp_layout(1), cluster, replace(eff, gemm=g)),
                   baseline_flops, 0.05, 1.0, increasing=True)
    eff = replace(eff, gemm=gemm)
    sigma = _bisect(lambda s: weak_scaling_efficiency(TABLE1[0], data_parallel=True, eff=replace(eff, straggler_sigma=s),
                                                      cluster=cluster),
                    pure_dp_efficiency, 0.0, 0.2, increasing=False)
    eff = replace(eff, straggler_sigma=sigma)
    link = _bisect(lambda x: weak_scaling_efficiency(link_config, data_parallel=False, eff=replace(eff, intra_link=x),
                                                     cluster=cluster),
                   mp_efficiency, 0.05, 1.0, increasing=True)
    return replace(eff, intra_link=link,
                   fitted_on=f"gemm: 1-GPU {baseline_flops / 1e12:g} TFLOP/s; straggler_sigma: 64-GPU DP "
                             f"{pure_dp_efficiency:.0%}; intra_link: {mp_size}-way MP {mp_efficiency:.0%} "
                             "(Megatron-LM sec 5.1, Fig. 5)")
