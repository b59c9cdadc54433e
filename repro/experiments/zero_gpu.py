"""ZeRO and ZeRO-Offload on GPUs: the largest GPT that trains per GPU count, stage, offload tier and ZeRO-R
configuration, and the throughput per GPU (ZeRO Figs. 2, 3 and 6, sec. 9, 10.4 and Table 2's measured sizes;
ZeRO-Offload's largest model on one GPU; ZeRO-Infinity's largest model on one node and on 32 nodes).

A *search* point tries the GPT sizes of a schedule (ZeRO Table 4's configurations) in increasing order for each
*arm* (a ZeRO stage with its offload tiers and its kind of activation checkpoints): a per-rank memory estimate
first (``repro.experiments.zero_capacity``; sizes that cannot fit the GPU, or the host memory available now, are skipped: a host
out-of-memory kills the process), then a real try: the model is built on the GPU (stage 3: block by block, each
partitioned at once, ``repro.models.partitioned_gpt``, so no rank holds the whole model), its 16-bit parameters
trained by ``repro.zero`` with fp32 masters and AdamW, one activation checkpoint per layer
(``repro.training.recompute.checkpoint_layers``: Megatron's replicated checkpoint, or ZeRO-R's P_a / P_a+cpu),
``warmup + steps`` steps of ``micro_batch x seq_len`` tokens per rank (``micro_batches`` of them accumulated).
A device out-of-memory is caught, the memory freed, and the arm stops there. Each arm has a time cap after which
it reports the largest size so far. Per size: the estimate, the decision, and for a trained size its step time,
model TFLOP/s per GPU (``repro.perfmodel.flops``, the 96-formula with recomputation), peak GPU memory
(``max_memory_allocated``) and peak host RSS. Per arm: the largest size that trained with a finite loss and the
next size that did not (the bracket the paper's number is checked against).

A *throughput* point trains one size and reports the same measurements (Figs. 2-3).

Scales: ``smoke`` runs the same code on CPU ranks with toy sizes and a fake memory cap (``device_cap_gib``,
``host_cap_gib``), so the estimate-driven skips, the out-of-memory path (``simulate_oom_above``), partitioned
checkpoints at tp 2 and the multi-rank agreement are exercised in CI; ``paper`` declares the GPU points (only
``offload_1gpu`` is meant for one GPU).

Stages 0-2 build the whole (tensor-parallel) model in its 16-bit training dtype on the GPU before ZeRO flattens and
partitions it (no fp32 copy of the model, which is not ZeRO's memory). Known limit: ZeRO-Infinity's memory-centric
tiling (splitting one huge linear layer) is not implemented: a module of one tensor-parallel rank must fit the GPU
whole.

This module declares the sizes, arms and points and runs a point; training one size and searching one arm are in
:mod:`repro.experiments.zero_gpu_search`, the claims these rows decide in :mod:`repro.experiments.zero_gpu_claims`.
"""

from __future__ import annotations

import math
from typing import Any

from repro.experiments.base import Experiment, Point, Resources, RunContext
from repro.vocabulary import ClaimCheck
from repro.experiments.zero_gpu_claims import FIG6_CLAIMS, INFINITY, PAPER, V100_PEAK_TFLOPS, check_claims
from repro.experiments.zero_gpu_search import (
    describe_arm, measure_rows, param_count, result_row, search_arm, search_config, train_size,
)

__all__ = ["DEFAULTS", "EXPERIMENT", "FIG6_CLAIMS", "INFINITY", "PAPER", "PAPER_POINTS", "SMOKE_POINTS",
           "V100_PEAK_TFLOPS", "ZERO100B_POINTS", "claims", "global_batch", "run_point", "train_size"]

VOCAB, SEQ = 50257, 1024


def _size(layers: int, hidden: int, heads: int | None = None) -> dict:
    return {"name": f"l{layers}_h{hidden}", "layers": layers, "hidden": hidden, "heads": heads or hidden // 128}


#: ZeRO Table 4, Figs. 3/4 (no model parallelism; claims t4_fig3_*): 1.16B ... 13B.
NOMP_SIZES = [_size(24, 1920), _size(34, 1920), _size(54, 1920), _size(64, 2304), _size(52, 3072), _size(72, 3072),
              _size(50, 4096), _size(54, 4096), _size(58, 4096), _size(62, 4096)]
#: ZeRO Table 4, Fig. 2 (with model parallelism; claims t4_fig2_*): 1.5B ... 170B. Heads of 128 (1.5B: 40 of 40,
#: so that 8-way model parallelism splits them).
FIG2_SIZES = [_size(48, 1600, 40), _size(72, 3072), _size(98, 4096), _size(88, 6144), _size(132, 6144),
              *(_size(layers, 8192) for layers in (100, 125, 150, 175, 212))]
#: Beyond Table 4, for the node-level offload search: about 0.2T, 0.5T and 1T parameters (12 l h^2).
HUGE_SIZES = [_size(100, 12800, 100), _size(64, 25600, 160), _size(128, 25600, 160)]
#: ZeRO-Infinity's 32 DGX-2 search (claim 32T_512gpu): about 1T, 5T, 10T, 20T and 32T; hidden 65536 (512 heads)
#: keeps the largest module of one tensor-parallel rank (the h -> 4h linear layer / tp) at 2.1B parameters at tp 8.
TRILLION_SIZES = [HUGE_SIZES[-1], *(_size(layers, 65536, 512) for layers in (97, 194, 388, 621))]
#: ZeRO Fig. 6 (claims fig6_c*): 20B to 170B at MP 16 (heads of 128: 48 or 64, both divisible by 16).
FIG6_SIZES = [*(_size(layers, 6144) for layers in (44, 66, 88, 110, 132)),
              *(_size(layers, 8192) for layers in (100, 125, 150, 175, 187, 212))]
#: Megatron-LM alone in one DGX-2 (claim megatron_max_efficient, 16-20B): 8.3B, then 16B to 29B at MP 16.
MEGATRON_NODE_SIZES = [_size(72, 3072, 32), *(_size(layers, 6144) for layers in (36, 40, 44, 48, 56, 64))]


def _sizes(*lists: list[dict]) -> list[dict]:
    """The sizes of several schedules, each once (Table 4 lists the 8B model under both figures)."""
    return list({size["name"]: size for schedule in lists for size in schedule}.values())

_METRICS = ("estimate_device_gib", "estimate_host_gib", "attempt", "step_time_s", "tflops_per_gpu", "tokens_per_s",
            "peak_device_gib", "peak_host_rss_gib", "loss", "setup_s", "largest_trained_params_b",
            "largest_step_time_s", "largest_tflops_per_gpu", "largest_peak_device_gib", "largest_peak_host_rss_gib",
            "largest_device_fit_estimate_b", "largest_host_fit_estimate_b", "offload_gain_x")


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    from repro.dist import init_parallel
    from repro.dist.device import rank_device
    from repro.experiments.zero_measure import nvme_dir

    params = dict(DEFAULTS, **point.params)
    device = rank_device(ctx.device, ctx.rank)
    groups = init_parallel(tp=params["tp"])
    fixed = describe_arm(device, groups)
    nvme_path = nvme_dir(str(ctx.scratch_dir))

    def say(line: str) -> None:
        if groups.rank == 0:
            print(line, flush=True)

    rows: list[dict] = []
    if params["kind"] == "throughput":
        size, arm = params["sizes"][0], params["arms"][0]
        result = train_size(size, arm, params, device=device, groups=groups, nvme_path=nvme_path)
        fields = dict(fixed, arm=arm["name"], stage=arm["stage"], optimizer_tier=arm["optimizer"],
                      param_tier=arm.get("param", "none"), size=size["name"],
                      params_b=param_count(search_config(size, params), groups) / 1e9,
                      micro_batch=params["micro_batch"], seq_len=params["seq_len"])
        say(f"[zero_gpu] {point.name}: {result['step_time_s']:.2f} s/step, {result['tflops_per_gpu']:.1f} TFLOP/s/GPU")
        return measure_rows(result, **fields)
    largest: dict[str, float] = {}
    for arm in params["arms"]:
        arm_rows = search_arm(arm, params, device=device, groups=groups, nvme_path=nvme_path, fixed=fixed, say=say,
                               emit=ctx.emit_rows)  # on disk as measured: a time limit keeps the arms done
        largest[arm["name"]] = next(r["value"] for r in arm_rows if r["metric"] == "largest_trained_params_b")
        rows += arm_rows
    for arm in params["arms"]:
        base = arm.get("compare_to")
        if base and largest.get(base) and largest.get(arm["name"]):
            rows.append(result_row("offload_gain_x", largest[arm["name"]] / largest[base], "x", **fixed,
                                   arm=arm["name"], baseline_arm=base))
    return rows


DEFAULTS: dict[str, Any] = dict(
    kind="search", tp=1, vocab=VOCAB, seq_len=SEQ, micro_batch=4, micro_batches=1, warmup=1, steps=2,
    checkpointing=True, dtype="bf16", dropout=0.1, lr=1e-4, seed=0, bucket_numel=1 << 25, device_cap_gib=None,
    host_cap_gib=None, device_overhead_gib=None,
)


def _arm(name: str, stage: int, optimizer: str = "none", param: str = "none", time_cap_s: float = 1800.0,
         **extra) -> dict:
    return dict(name=name, stage=stage, optimizer=optimizer, param=param, time_cap_s=time_cap_s, **extra)


def _gpu_point(name: str, gpus: int, params: dict, *, time_min: int, mem_gib: float, memory_gib: float = 48.0,
               cpus: int = 8) -> Point:
    per_node = min(gpus, 8)
    return Point(name, params, world_size=gpus, needs_gpu=True, memory_gib=memory_gib,
                 resources=Resources(nodes=math.ceil(gpus / per_node), gpus_per_node=per_node, cpus_per_task=cpus,
                                     mem_gib=mem_gib, time_min=time_min))


#: One GPU: ZeRO-Offload's largest model (stage 2, optimizer states and step on the CPU) beside the same stage
#: without offload (at N_d = 1 it keeps plain DP's 16 bytes per parameter on the GPU). 8 minutes in all.
OFFLOAD_1GPU = dict(sizes=NOMP_SIZES, arms=[
    _arm("zero2_cpu", 2, "cpu", time_cap_s=330.0,
         sizes=[NOMP_SIZES[i] for i in (0, 3, 4, 5, 6, 7, 8, 9)]),
    _arm("gpu_only", 2, "none", time_cap_s=120.0, sizes=NOMP_SIZES[:5]),
])
OFFLOAD_1GPU["arms"][0]["compare_to"] = "gpu_only"

PAPER_POINTS = (
    _gpu_point("offload_1gpu", 1, OFFLOAD_1GPU, time_min=15, mem_gib=120.0, memory_gib=64.0, cpus=16),
    # ZeRO-Infinity sec. 8: the largest model on one node, per tier of parameters and optimizer states
    _gpu_point("offload_1node", 8, dict(sizes=_sizes(NOMP_SIZES, FIG2_SIZES, HUGE_SIZES), arms=[
        _arm("zero3_gpu", 3), _arm("zero3_cpu", 3, "cpu", "cpu", compare_to="zero3_gpu"),
        _arm("zero3_nvme", 3, "nvme", "nvme", compare_to="zero3_gpu")]), time_min=120, mem_gib=960.0),
    # ZeRO sec. 10.4 / Fig. 4: the largest model without model parallelism on 128 GPUs, and its throughput
    _gpu_point("nomp_128gpu", 128, dict(sizes=_sizes(NOMP_SIZES, FIG2_SIZES[2:4]), arms=[_arm("zero2", 2)]),
               time_min=90, mem_gib=480.0),
    # ZeRO Table 2 (MP = 1, N_d = 64): the largest model per stage
    _gpu_point("max_model_64gpu", 64, dict(sizes=_sizes(NOMP_SIZES, FIG2_SIZES[2:5]), arms=[
        _arm(f"stage{stage}", stage) for stage in (0, 1, 2, 3)]), time_min=180, mem_gib=480.0),
    # ZeRO Fig. 2: throughput per GPU of 1.5B-170B on 400 GPUs (ZeRO-100B = P_os+g, model parallelism in a node)
    *(_gpu_point(f"fig2_{size['name']}_400gpu", 400, dict(kind="throughput", tp=8, sizes=[size],
                                                           arms=[_arm("zero2", 2)]), time_min=30, mem_gib=480.0)
      for size in FIG2_SIZES),
    # ZeRO Fig. 3: the 60B model (75 x 8192) on 64-400 GPUs, per-GPU throughput (super-linear); 32 sequences per
    # data-parallel rank (4 x 8 micro-batches), so that 400 GPUs at MP 8 train the paper's largest batch, 1600
    *(_gpu_point(f"fig3_60B_{gpus}gpu", gpus, dict(kind="throughput", tp=8, micro_batches=8, sizes=[_size(75, 8192)],
                                                    arms=[_arm("zero2", 2)]), time_min=30, mem_gib=480.0)
      for gpus in (64, 128, 256, 400)),
    # ZeRO Fig. 6 / Table 3: the largest model per ZeRO-R configuration at MP 16 and a fixed batch (32 sequences of
    # 1024 per GPU, the setting of sec. 6.1's MP-16 checkpoint example; the figure's own batch is in appendix
    # tables only available as images). C1 P_os, C2 P_os + P_a, C3 P_os+g, C4 P_os+g + P_a, C5 P_os+g + P_a+cpu;
    # CB (constant-size fused buffers: ``bucket_numel``) and MD (contiguous flat gradient and parameter buffers) in all
    _gpu_point("fig6_400gpu", 400, dict(tp=16, micro_batch=32, sizes=FIG6_SIZES, arms=[
        _arm("C1", 1), _arm("C2", 1, activations="partitioned"), _arm("C3", 2),
        _arm("C4", 2, activations="partitioned"), _arm("C5", 2, activations="partitioned_cpu")]),
        time_min=300, mem_gib=480.0),
    # ZeRO sec. 9: Megatron-LM alone (stage 0, MP 16 = one DGX-2 of 16 GPUs; two 8-GPU nodes today), largest model
    _gpu_point("megatron_max_16gpu", 16, dict(tp=16, sizes=MEGATRON_NODE_SIZES, arms=[_arm("stage0", 0)]),
               time_min=120, mem_gib=480.0),
    # ZeRO-Infinity sec. 8 (secondary: 32T on 32 DGX-2 nodes): stage 3, parameters and optimizer states on NVMe,
    # P_a+cpu checkpoints, MP 8, one sequence per GPU; 16 bytes per parameter on disk: 512 TB at 32T
    _gpu_point("offload_32node", 512, dict(tp=8, micro_batch=1, sizes=TRILLION_SIZES, arms=[
        _arm("zero3_nvme", 3, "nvme", "nvme", activations="partitioned_cpu", time_cap_s=6 * 3600.0)]),
        time_min=480, mem_gib=960.0),
    # ZeRO sec. I/1: Megatron-LM's model parallelism alone (stage 0, no data parallelism) inside a node (8.2B, tp 8)
    # and across nodes (40B, tp 32 = two DGX-2 of 16 GPUs; four 8-GPU nodes on today's clusters)
    _gpu_point("megatron_in_node_8gpu", 8, dict(kind="throughput", tp=8, sizes=[_size(72, 3072)],
                                                arms=[_arm("stage0", 0)]), time_min=30, mem_gib=480.0),
    _gpu_point("megatron_40B_32gpu", 32, dict(kind="throughput", tp=32, sizes=[_size(88, 6144, 64)],
                                              arms=[_arm("stage0", 0)]), time_min=30, mem_gib=480.0),
)
#: ZeRO-100B's sustained throughput (abstract, sec. 10.2): the Fig. 2 points of 8B to 100B parameters.
ZERO100B_POINTS = tuple(f"fig2_{size['name']}_400gpu" for size in FIG2_SIZES[1:7])

_TOY = [_size(1, 32, 4), _size(2, 64, 4), _size(2, 96, 4), _size(3, 128, 4), _size(4, 160, 4)]
_SMOKE = dict(vocab=256, seq_len=32, micro_batch=2, warmup=1, steps=1, bucket_numel=4096, dropout=0.0,
              device_overhead_gib=0.0, sizes=_TOY)
SMOKE_POINTS = (
    # fake caps: 10 MiB of "GPU" and 16 MiB of host, so that the estimate skips sizes on both sides
    Point("search_1rank", dict(_SMOKE, device_cap_gib=10 / 1024, host_cap_gib=16 / 1024, arms=[
        _arm("zero2_cpu", 2, "cpu", time_cap_s=120.0, compare_to="gpu_only"),
        _arm("gpu_only", 2, "none", time_cap_s=120.0),
        _arm("zero3_cpu_oom", 3, "cpu", "cpu", time_cap_s=120.0, simulate_oom_above=150_000)]), memory_gib=1.0),
    Point("search_dp2", dict(_SMOKE, sizes=_TOY[:3], device_cap_gib=1.0, host_cap_gib=1.0, arms=[
        _arm("zero3_cpu", 3, "cpu", "cpu", time_cap_s=120.0), _arm("stage1", 1, time_cap_s=120.0)]),
          world_size=2, memory_gib=1.0),
    Point("throughput_tp2", dict(_SMOKE, kind="throughput", tp=2, sizes=[_TOY[1]], arms=[_arm("zero2_cpu", 2, "cpu")]),
          world_size=2, memory_gib=1.0),
    # Fig. 6's configurations at toy size: ZeRO-R's partitioned checkpoints (P_a, P_a+cpu) under tp 2
    Point("zero_r_tp2", dict(_SMOKE, tp=2, sizes=_TOY[:2], device_cap_gib=1.0, host_cap_gib=1.0, arms=[
        _arm("C1", 1, time_cap_s=120.0), _arm("C2", 1, activations="partitioned", time_cap_s=120.0),
        _arm("C5", 2, activations="partitioned_cpu", time_cap_s=120.0)]), world_size=2, memory_gib=1.0),
)


def global_batch(point: Point) -> int:
    """Sequences per step of a point: micro-batch x micro-batches x data-parallel degree (GPUs / tp)."""
    params = dict(DEFAULTS, **point.params)
    return params["micro_batch"] * params["micro_batches"] * point.world_size // params["tp"]


def claims(rows) -> list[ClaimCheck]:
    """The claims these rows decide: :func:`repro.experiments.zero_gpu_claims.check_claims` (the formulas from rows
    to values) with this module's ZeRO-100B points, paper points and :func:`global_batch`."""
    return check_claims(rows, zero100b_points=ZERO100B_POINTS, paper_points=PAPER_POINTS, global_batch=global_batch)


EXPERIMENT = Experiment(
    name="zero_gpu",
    paper=PAPER,
    title="ZeRO / ZeRO-Offload on GPUs: largest trainable GPT per GPU count, stage and offload tier; TFLOP/s per GPU",
    points={"smoke": SMOKE_POINTS, "paper": PAPER_POINTS},
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
    budget_s={"smoke": 120.0, "paper": 3 * 3600.0},
    metrics=_METRICS,
)
