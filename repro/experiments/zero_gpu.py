"""ZeRO and ZeRO-Offload on GPUs: the largest GPT that trains per GPU count, stage, offload tier and ZeRO-R
configuration, and the throughput per GPU (ZeRO Figs. 2, 3 and 6, sec. 9, 10.4 and Table 2's measured sizes;
ZeRO-Offload's largest model on one GPU; ZeRO-Infinity's largest model on one node and on 32 nodes).

A *search* point tries the GPT sizes of a schedule (ZeRO Table 4's configurations) in increasing order for each
*arm* (a ZeRO stage with its offload tiers and its kind of activation checkpoints): a per-rank memory estimate
first (``repro.zero.capacity``; sizes that cannot fit the GPU, or the host memory available now, are skipped: a host
out-of-memory kills the process), then a real try: the model is built on the GPU (stage 3: block by block, each
partitioned at once, ``repro.zero.partitioned_gpt``, so no rank holds the whole model), its 16-bit parameters
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

Known limit: stages 0-2 build the whole (tensor-parallel) model in fp32 on the GPU before ZeRO flattens and
partitions it; the estimate counts that build peak. ZeRO-Infinity's memory-centric tiling (splitting one huge
linear layer) is not implemented: a module of one tensor-parallel rank must fit the GPU whole.
"""

from __future__ import annotations

import gc
import math
import os
import time
from typing import Any

import torch

from repro.claims import check_value, needs_gpu
from repro.experiments.base import ClaimCheck, Experiment, Point, Resources, RunContext

PAPER = "zero_2019"
INFINITY = "zero_infinity_2021"
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
_UNITS = {"step_time_s": "s", "tflops_per_gpu": "TFLOP/s", "tokens_per_s": "tokens/s", "peak_device_gib": "GiB",
          "peak_host_rss_gib": "GiB", "loss": "nats", "setup_s": "s"}


# -- set-up --------------------------------------------------------------------------------------------------------
def _config(size: dict, params: dict):
    from repro.models import GPTConfig

    return GPTConfig(vocab_size=params["vocab"], hidden_size=size["hidden"], num_layers=size["layers"],
                     num_attention_heads=size["heads"], max_position_embeddings=params["seq_len"],
                     hidden_dropout=params["dropout"], attention_dropout=params["dropout"])


def _host_available_bytes(ranks_here: int) -> float:
    """This rank's share of the host memory that can be allocated now: MemAvailable, bounded by the cgroup."""
    from repro.experiments.resources import available_memory_gib

    available = available_memory_gib() * 2**30
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            limit = handle.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as handle:
            current = int(handle.read().strip())
        if limit != "max":
            available = min(available, int(limit) - current)
    except (OSError, ValueError):
        pass
    return available / max(ranks_here, 1)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)  # pinned staging buffers of the last size
        if empty_host is not None:
            empty_host()


def _agree(groups, device: torch.device):
    """Logical AND over all ranks (every rank tries a size, or none does)."""
    import torch.distributed as dist

    def agree(ok: bool) -> bool:
        if groups.world_size == 1 or not dist.is_initialized():
            return ok
        flag = torch.tensor([1.0 if ok else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item() > 0.5)
    return agree


def _zero_config(arm: dict, params: dict, nvme_path: str):
    from repro.zero import OffloadConfig, ZeroConfig

    def tier(name: str) -> OffloadConfig:
        return OffloadConfig(name, nvme_path=nvme_path if name == "nvme" else None)

    return ZeroConfig(stage=arm["stage"], dtype=params["dtype"], offload_optimizer=tier(arm["optimizer"]),
                      offload_param=tier(arm.get("param", "none")), bucket_numel=params["bucket_numel"],
                      max_grad_norm=1.0)


def _params(config, groups) -> int:
    from repro.models.params import count_parameters

    return count_parameters(config, groups.tp_size)


def _flops(config, params: dict, groups) -> float:
    from repro.perfmodel.flops import gpt_flops_per_iteration

    batch = params["micro_batch"] * params["micro_batches"] * groups.dp_size
    return gpt_flops_per_iteration(batch_size=batch, seq_length=params["seq_len"], num_layers=config.num_layers,
                                   hidden_size=config.hidden_size, vocab_size=config.padded_vocab_size(groups.tp_size),
                                   activation_recompute=params["checkpointing"])


# -- one size ------------------------------------------------------------------------------------------------------
def train_size(size: dict, arm: dict, params: dict, *, device: torch.device, groups, nvme_path: str) -> dict:
    """Build ``size`` on ``device``, train ``warmup + steps`` steps under ``arm``; the measurements (raises on a
    device out-of-memory, with the optimizer's tiers closed)."""
    from repro.models import GPTModel
    from repro.tensor_parallel import seed_everything
    from repro.timing import time_iterations
    from repro.training.recompute import checkpoint_layers
    from repro.zero import build_zero_optimizer
    from repro.zero.partitioned_gpt import build_partitioned_gpt
    from repro.zero.measure import peak_rss_bytes, reset_peak_rss

    config = _config(size, params)
    _free(device)
    reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    tracker = seed_everything(params["seed"], tp_rank=groups.tp_rank, device=device.type)
    zero_config, hparams = _zero_config(arm, params, nvme_path), dict(lr=params["lr"], betas=(0.9, 0.95),
                                                                       weight_decay=0.01)
    with torch.device(device):  # built where it trains: no host copy of the fp32 model
        if arm["stage"] == 3:  # block by block, each partitioned at once: no rank holds the whole model
            model, optimizer = build_partitioned_gpt(config, zero_config, dp_group=groups.dp, tp_group=groups.tp,
                                                     rng_tracker=tracker, **hparams)
        else:
            model = GPTModel(config, tp_group=groups.tp, rng_tracker=tracker)
    if params["checkpointing"]:
        checkpoint_layers(model.layers, arm.get("activations", "replicated"), groups.tp, rng_tracker=tracker)
    if arm["stage"] != 3:
        optimizer = build_zero_optimizer(model, zero_config, dp_group=groups.dp, tp_group=groups.tp, **hparams)
    try:
        limit, total = arm.get("simulate_oom_above"), _params(config, groups)
        if limit is not None and total > limit:  # smoke scale: the out-of-memory path without a GPU
            raise getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)(
                f"simulated: {total} parameters > simulate_oom_above={limit}")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        setup_s = time.perf_counter() - start
        generator = torch.Generator(device=device).manual_seed(1000 + groups.dp_rank)
        b, s, chunks = params["micro_batch"], params["seq_len"], params["micro_batches"]
        losses: list[torch.Tensor] = []

        def step() -> None:
            total = torch.zeros((), device=device)
            for _ in range(chunks):
                tokens = torch.randint(0, config.vocab_size, (b, s + 1), device=device, generator=generator)
                loss = model.loss(tokens[:, :-1], tokens[:, 1:]).float().mean() / chunks
                optimizer.backward(loss)
                total += loss.detach()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(total)

        timing = time_iterations(step, device=device, warmup=params["warmup"], iters=params["steps"])
        values = [float(loss) for loss in losses]
        seconds = timing.median_s
        flops = _flops(config, params, groups)
        return {
            "loss": values[-1], "first_loss": values[0],
            "step_time_s": seconds, "tflops_per_gpu": flops / seconds / groups.world_size / 1e12,
            "tokens_per_s": b * s * chunks * groups.dp_size / seconds, "setup_s": setup_s,
            "peak_device_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "peak_host_rss_gib": peak_rss_bytes() / 2**30,
        }
    finally:
        optimizer.close()


# -- points --------------------------------------------------------------------------------------------------------
def _describe(device: torch.device, groups) -> dict:
    from repro.dist.device import describe

    info = describe(device)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
    return {"gpu": info.get("name") if device.type == "cuda" else None, "gpu_memory_gib": info.get("memory_gib"),
            "host_memory_gib": round(host, 1) if host else None, "gpus": groups.world_size, "tp": groups.tp_size,
            "dp": groups.dp_size}


def _row(metric: str, value, unit: str, **fields) -> dict:
    return {"metric": metric, "value": None if value is None else float(value), "unit": unit, **fields}


def _measure_rows(result: dict, *, largest: bool = False, **fields) -> list[dict]:
    """The measurements of one trained size (``largest``: the arm's summary metrics, a subset)."""
    names = ("step_time_s", "tflops_per_gpu", "peak_device_gib", "peak_host_rss_gib") if largest else tuple(_UNITS)
    return [_row(f"largest_{name}" if largest else name, result[name], _UNITS[name], **fields)
            for name in names if result.get(name) is not None]


def _search_arm(arm: dict, params: dict, *, device, groups, nvme_path: str, fixed: dict, say) -> list[dict]:
    from repro.zero.capacity import estimate_memory, search_largest

    sizes = arm.get("sizes") or params["sizes"]
    overhead = params["device_overhead_gib"]
    if overhead is None:
        overhead = 2.5 if device.type == "cuda" else 0.0
    pb = {"bf16": 2, "fp16": 2, "fp32": 4}[params["dtype"]]

    def estimate(size):
        return estimate_memory(_config(size, params), stage=arm["stage"], optimizer_tier=arm["optimizer"],
                               param_tier=arm.get("param", "none"), dp=groups.dp_size, tp=groups.tp_size,
                               micro_batch=params["micro_batch"], seq_len=params["seq_len"],
                               checkpointing=params["checkpointing"], bucket_numel=params["bucket_numel"],
                               param_bytes=pb, device_overhead_bytes=overhead * 2**30,
                               activation_checkpoints=arm.get("activations", "replicated"), partitioned_build=True)

    def params_of(size) -> float:
        return float(_params(_config(size, params), groups))

    _free(device)
    if params["device_cap_gib"] is not None:
        device_cap = params["device_cap_gib"] * 2**30
    elif device.type == "cuda":
        device_cap = float(torch.cuda.mem_get_info(device)[0]) + torch.cuda.memory_allocated(device)
    else:
        device_cap = _host_available_bytes(1)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", groups.world_size))

    def host_available() -> float:
        if params["host_cap_gib"] is not None:
            return params["host_cap_gib"] * 2**30
        return _host_available_bytes(min(ranks_here, groups.world_size))

    common = dict(fixed, arm=arm["name"], stage=arm["stage"], optimizer_tier=arm["optimizer"],
                  param_tier=arm.get("param", "none"), activations=arm.get("activations", "replicated"),
                  micro_batch=params["micro_batch"], seq_len=params["seq_len"], device_cap_gib=device_cap / 2**30)

    def report(attempt) -> None:
        line = f"[zero_gpu] {arm['name']} {attempt.size['name']} ({attempt.params / 1e9:.2f}B): {attempt.decision}"
        if attempt.decision == "trained":
            r = attempt.result
            line += f", step {r['step_time_s']:.2f} s, {r['tflops_per_gpu']:.1f} TFLOP/s, loss {r['loss']:.3f}"
        elif attempt.error:
            line += f" ({attempt.error})"
        say(line)

    outcome = search_largest(
        sizes, params_of=params_of, estimate=estimate, device_cap_bytes=device_cap, host_available_bytes=host_available,
        try_size=lambda size: train_size(size, arm, params, device=device, groups=groups, nvme_path=nvme_path),
        time_cap_s=arm["time_cap_s"], agree=_agree(groups, device), on_attempt=report)
    _free(device)
    rows = []
    for attempt in outcome.attempts:
        fields = dict(common, size=attempt.size["name"], layers=attempt.size["layers"], hidden=attempt.size["hidden"],
                      params_b=attempt.params / 1e9, decision=attempt.decision, error=attempt.error)
        rows += [_row("estimate_device_gib", attempt.estimate.device_bytes / 2**30, "GiB", **fields),
                 _row("estimate_host_gib", attempt.estimate.host_bytes / 2**30, "GiB", **fields),
                 _row("attempt", 1.0 if attempt.decision == "trained" else 0.0, "trained", **fields)]
        if attempt.decision == "trained":
            rows += _measure_rows(attempt.result, **fields)
    largest, above = outcome.largest, outcome.next_larger
    fits_device = [a.params for a in outcome.attempts if a.estimate.device_bytes <= device_cap]
    fits_host = [a.params for a in outcome.attempts if a.estimate.host_bytes <= 0.9 * host_available()]
    summary = dict(common, stopped=outcome.stopped, largest_size=largest.size["name"] if largest else None,
                   next_params_b=above.params / 1e9 if above else None, next_decision=above.decision if above else None,
                   next_error=above.error if above else None)
    rows.append(_row("largest_trained_params_b", largest.params / 1e9 if largest else 0.0, "billion params", **summary))
    rows.append(_row("largest_device_fit_estimate_b", max(fits_device, default=0.0) / 1e9, "billion params",
                     **summary))
    rows.append(_row("largest_host_fit_estimate_b", max(fits_host, default=0.0) / 1e9, "billion params", **summary))
    if largest is not None:
        rows += _measure_rows(largest.result, largest=True, **summary)
    return rows


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    from repro.dist import init_parallel
    from repro.dist.device import rank_device
    from repro.zero.measure import nvme_dir

    params = dict(DEFAULTS, **point.params)
    device = rank_device(ctx.device, ctx.rank)
    groups = init_parallel(tp=params["tp"])
    fixed = _describe(device, groups)
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
                      params_b=_params(_config(size, params), groups) / 1e9,
                      micro_batch=params["micro_batch"], seq_len=params["seq_len"])
        say(f"[zero_gpu] {point.name}: {result['step_time_s']:.2f} s/step, {result['tflops_per_gpu']:.1f} TFLOP/s/GPU")
        return _measure_rows(result, **fields)
    largest: dict[str, float] = {}
    for arm in params["arms"]:
        arm_rows = _search_arm(arm, params, device=device, groups=groups, nvme_path=nvme_path, fixed=fixed, say=say)
        largest[arm["name"]] = next(r["value"] for r in arm_rows if r["metric"] == "largest_trained_params_b")
        rows += arm_rows
    for arm in params["arms"]:
        base = arm.get("compare_to")
        if base and largest.get(base) and largest.get(arm["name"]):
            rows.append(_row("offload_gain_x", largest[arm["name"]] / largest[base], "x", **fixed, arm=arm["name"],
                             baseline_arm=base))
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
#: The V100's fp16 tensor-core peak the paper's "over 30 % of peak" refers to (125 TFLOP/s, NVIDIA datasheet).
V100_PEAK_TFLOPS = 125.0

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


# -- claims --------------------------------------------------------------------------------------------------------
def _summary(rows, point: str, arm: str, metric: str = "largest_trained_params_b"):
    """The newest summary row of ``arm`` in ``point`` (a dict), or None."""
    if rows is None or not len(rows) or "metric" not in rows or "point" not in rows or "arm" not in rows:
        return None
    sel = rows[(rows["metric"] == metric) & (rows["point"] == point) & (rows["arm"] == arm)]
    return None if sel.empty else sel.iloc[-1].to_dict()


def _is_v100_32gb(row: dict) -> bool:
    return "V100" in str(row.get("gpu")) and 30 <= float(row.get("gpu_memory_gib") or 0) <= 33


def _bracket_check(paper: str, claim_id: str, row: dict | None, what: str, paper_gb: float = 32.0,
                   billions_per_unit: float = 1.0) -> ClaimCheck:
    """Largest-model claims: reproduced on the paper's GPU when the paper's size lies between the largest size that
    trained and the next one that did not (both within 5 %: the schedule's sizes are rounded like the paper's); on
    other GPUs "needs GPU", with the measured value and a memory-scaled
    one in the note (scaling by memory alone ignores activations and workspaces: it is not a verdict). The rows are
    in billions of parameters; ``billions_per_unit`` converts to the claim's unit (1000 for trillions)."""
    from repro.paper import paper_value

    if row is None:
        return needs_gpu(paper, claim_id, f"run zero_gpu's {what} point on GPUs")
    value, above = float(row["value"]), row.get("next_params_b")
    above = None if above is None or (isinstance(above, float) and math.isnan(above)) else float(above)
    target = paper_value(paper, claim_id) * billions_per_unit
    span = f"largest trained {value:.2f}B, next size {'%.2fB' % above if above else 'none'} did not train " \
           f"({row.get('next_decision')})"
    if _is_v100_32gb(row):
        # the sizes are discrete: a failed size within 5 % of the paper's counts as the paper's size failing
        ok = value <= target * 1.05 and (above is None or above > target * 1.05)
        return ClaimCheck(paper, claim_id, round(value / billions_per_unit, 3),
                          "paper size within [largest trained, next size)", "reproduced" if ok else "differs",
                          f"{span}, on {row.get('gpu')}", evidence="measured")
    memory = float(row.get("gpu_memory_gib") or 0) or float("nan")
    return needs_gpu(paper, claim_id, f"needs the paper's 32 GB V100; measured on {row.get('gpu')} ({memory:.0f} GiB, "
                     f"{row.get('gpus')} GPU(s)): {span}; x {paper_gb:g}/{memory:.0f} by memory alone = "
                     f"{value * paper_gb / memory:.2f}B (not a verdict)")


def _throughput_note(paper: str, claim_id: str, row: dict | None, what: str) -> ClaimCheck:
    if row is None:
        return needs_gpu(paper, claim_id, f"run zero_gpu's {what} point on GPUs")
    return needs_gpu(paper, claim_id, f"TFLOP/s is the hardware's: needs the paper's V100s; measured on "
                     f"{row.get('gpu')} x {row.get('gpus')}: {float(row['value']):.1f} TFLOP/s per GPU ({what})")


def _throughput_row(rows, point: str) -> dict | None:
    if rows is None or not len(rows) or "point" not in rows:
        return None
    sel = rows[(rows["metric"] == "tflops_per_gpu") & (rows["point"] == point)]
    return None if sel.empty else sel.iloc[-1].to_dict()


def _zero100b_sustained(rows) -> list[ClaimCheck]:
    """``zero100B_pflops`` = mean over :data:`ZERO100B_POINTS` of TFLOP/s per GPU x GPUs / 1000 (15 PFLOP/s on 400
    V100s); ``zero100B_pct_peak`` = that mean per GPU over :data:`V100_PEAK_TFLOPS` (over 30 %). Decided on V100s
    only; elsewhere the measured values are in the note."""
    found = [r for r in (_throughput_row(rows, p) for p in ZERO100B_POINTS) if r is not None]
    if len(found) < len(ZERO100B_POINTS):
        why = f"run zero_gpu's {', '.join(ZERO100B_POINTS)} points ({len(found)} of {len(ZERO100B_POINTS)} have rows)"
        return [needs_gpu(PAPER, "zero100B_pflops", why), needs_gpu(PAPER, "zero100B_pct_peak", why)]
    per_gpu = sum(float(r["value"]) for r in found) / len(found)
    pflops = sum(float(r["value"]) * int(r["gpus"]) for r in found) / len(found) / 1000
    gpus = {str(r.get("gpu")) for r in found}
    what = f"mean of 8B-100B on {', '.join(sorted(gpus))}: {per_gpu:.1f} TFLOP/s per GPU, {pflops:.2f} PFLOP/s"
    if all("V100" in g for g in gpus):
        pct = 100 * per_gpu / V100_PEAK_TFLOPS
        return [check_value(PAPER, "zero100B_pflops", pflops, rel=0.10, note=what, evidence="measured"),
                ClaimCheck(PAPER, "zero100B_pct_peak", round(pct, 1), ">= 30", "reproduced" if pct >= 30 else
                           "differs", f"{what}; over the V100's {V100_PEAK_TFLOPS:g} TFLOP/s", evidence="measured")]
    return [needs_gpu(PAPER, "zero100B_pflops", f"needs the paper's V100s; measured {what}"),
            needs_gpu(PAPER, "zero100B_pct_peak", f"needs the paper's V100s; measured {what}")]


def _megatron_baselines(rows) -> list[ClaimCheck]:
    """``megatron_in_node_tflops`` (about 30 TFLOP/s per V100) = ``megatron_in_node_8gpu``'s TFLOP/s per GPU;
    ``megatron_40B_tflops`` (5 TFLOP/s per V100 across two DGX-2 nodes) = ``megatron_40B_32gpu``'s."""
    out = []
    for claim, point, what in (("megatron_in_node_tflops", "megatron_in_node_8gpu", "8.2B, tp 8 inside a node"),
                               ("megatron_40B_tflops", "megatron_40B_32gpu", "40B, tp 32 across nodes")):
        row = _throughput_row(rows, point)
        if row is not None and "V100" in str(row.get("gpu")):
            out.append(check_value(PAPER, claim, float(row["value"]), rel=0.15, evidence="measured",
                                   note=f"{what} on {row.get('gpus')} x {row.get('gpu')}, ZeRO stage 0"))
        else:
            out.append(_throughput_note(PAPER, claim, row, f"{point}, {what}"))
    return out


def global_batch(point: Point) -> int:
    """Sequences per step of a point: micro-batch x micro-batches x data-parallel degree (GPUs / tp)."""
    params = dict(DEFAULTS, **point.params)
    return params["micro_batch"] * params["micro_batches"] * point.world_size // params["tp"]


def _superlinear_configuration() -> list[ClaimCheck]:
    """Fig. 3's 60B model, its largest GPU count and largest batch, as the fig3 points declare them
    (configuration)."""
    fig3 = [p for p in PAPER_POINTS if p.name.startswith("fig3_")]
    size = fig3[0].params["sizes"][0]
    params_b = 12 * size["layers"] * size["hidden"] ** 2 / 1e9
    largest = max(fig3, key=lambda p: p.world_size)
    return [check_value(PAPER, "superlinear_model", params_b, rel=0.05, evidence="configuration",
                        note=f"12 l h^2 of the fig3 points' {size['name']}"),
            check_value(PAPER, "superlinear_gpus_max", largest.world_size, evidence="configuration",
                        note="the largest fig3 point"),
            check_value(PAPER, "largest_batch_superlinear", global_batch(largest), evidence="configuration",
                        note=f"{largest.name}'s micro-batch x micro-batches x data-parallel degree; the same 32 "
                        "sequences per data-parallel rank at every GPU count (the paper's smaller counts' batches "
                        "are in appendix tables not read)")]


#: ZeRO Fig. 6's configurations (Table 3) and their claims: C3 has no claim of its own (the figure's bar is read).
FIG6_CLAIMS = {"C1": "fig6_c1", "C2": "fig6_c2", "C4": "fig6_c4", "C5": "fig6_c5"}


def claims(rows) -> list[ClaimCheck]:
    """The claims these rows decide, with the formula from rows to value:

    * ``dp_alone_max`` (1.4B, plain DP on a 32 GB V100) = ``largest_trained_params_b`` of ``offload_1gpu``'s
      ``gpu_only`` arm (ZeRO stage 2 at N_d = 1 holds DP's 16 bytes per parameter on the GPU);
      ``dp_only_tflops`` = that arm's ``largest_tflops_per_gpu``;
    * ``no_mp_max_model`` (13B on 128 GPUs) = ``nomp_128gpu``'s largest; ``no_mp_tflops`` its TFLOP/s;
    * ``t2_mp1_meas_baseline`` / ``t2_mp1_meas_Pos`` (1.3B / 6.2B at N_d = 64) = ``max_model_64gpu``'s stage-0 /
      stage-1 largest;
    * ``zero100B_100B_tflops_gpu`` (38 TFLOP/s at 100B on 400 GPUs) = ``fig2_l125_h8192_400gpu``'s TFLOP/s,
      ``zero100B_max_model`` (170B) = whether ``fig2_l212_h8192_400gpu`` trained;
    * ZeRO-Infinity ``finetune_1T_one_dgx2`` = ``offload_1node``'s NVMe arm;
    * ``zero100B_pflops`` / ``zero100B_pct_peak``, ``megatron_in_node_tflops`` / ``megatron_40B_tflops``: see
      :func:`_zero100b_sustained` and :func:`_megatron_baselines`; Fig. 3's model, GPU count and largest batch
      are configuration;
    * ``fig6_c1`` ... ``fig6_c5`` = ``fig6_400gpu``'s largest per arm (C1 ... C5, see :data:`FIG6_CLAIMS`);
      ``megatron_max_efficient`` (16-20B on one DGX-2) = ``megatron_max_16gpu``'s stage-0 largest; ZeRO-Infinity's
      ``32T_512gpu`` = ``offload_32node``'s NVMe arm, in trillions.

    Sizes are decided only on the paper's 32 GB V100 (the paper's size must lie in the bracket the search found);
    TFLOP/s only on V100s; everything measured on other GPUs stays "needs GPU" with the measured value in the note.
    ZeRO-Offload's own claims (13B on one V100, 10x PyTorch) are not in paper_claims.csv; ``offload_1gpu`` reports
    them as ``largest_trained_params_b`` of ``zero2_cpu`` and ``offload_gain_x``.
    """
    checks = [
        _bracket_check(PAPER, "dp_alone_max", _summary(rows, "offload_1gpu", "gpu_only"), "offload_1gpu"),
        _throughput_note(PAPER, "dp_only_tflops", _summary(rows, "offload_1gpu", "gpu_only", "largest_tflops_per_gpu"),
                         "offload_1gpu, gpu_only arm, its largest model on 1 GPU"),
        _bracket_check(PAPER, "no_mp_max_model", _summary(rows, "nomp_128gpu", "zero2"), "nomp_128gpu"),
        _throughput_note(PAPER, "no_mp_tflops", _summary(rows, "nomp_128gpu", "zero2", "largest_tflops_per_gpu"),
                         "nomp_128gpu, its largest model"),
        _bracket_check(PAPER, "t2_mp1_meas_baseline", _summary(rows, "max_model_64gpu", "stage0"), "max_model_64gpu"),
        _bracket_check(PAPER, "t2_mp1_meas_Pos", _summary(rows, "max_model_64gpu", "stage1"), "max_model_64gpu"),
        _throughput_note(PAPER, "zero100B_100B_tflops_gpu", _throughput_row(rows, "fig2_l125_h8192_400gpu"),
                         "fig2_l125_h8192_400gpu, 100B on 400 GPUs"),
    ]
    checks += _zero100b_sustained(rows) + _megatron_baselines(rows) + _superlinear_configuration()
    checks += [_bracket_check(PAPER, claim, _summary(rows, "fig6_400gpu", arm), f"fig6_400gpu ({arm})")
               for arm, claim in FIG6_CLAIMS.items()]
    checks.append(_bracket_check(PAPER, "megatron_max_efficient", _summary(rows, "megatron_max_16gpu", "stage0"),
                                 "megatron_max_16gpu"))
    checks.append(_bracket_check(INFINITY, "32T_512gpu", _summary(rows, "offload_32node", "zero3_nvme"),
                                 "offload_32node", billions_per_unit=1000.0))
    trained_170 = _throughput_row(rows, "fig2_l212_h8192_400gpu")
    checks.append(needs_gpu(PAPER, "zero100B_max_model", "run zero_gpu's fig2_l212_h8192_400gpu point" if trained_170
                            is None else f"170B trained on {trained_170.get('gpus')} x {trained_170.get('gpu')}; "
                            "the claim is about 400 V100s"))
    nvme = _summary(rows, "offload_1node", "zero3_nvme")
    checks.append(needs_gpu(INFINITY, "finetune_1T_one_dgx2", "run zero_gpu's offload_1node point" if nvme is None
                            else f"largest trained with NVMe offload on one node of {nvme.get('gpu')}: "
                            f"{float(nvme['value']):.1f}B (the claim: 1T on one DGX-2)"))
    return checks


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
