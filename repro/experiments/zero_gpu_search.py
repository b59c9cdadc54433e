"""ZeRO on GPUs, one arm at a time: build and train one GPT size under a ZeRO stage and its offload tiers
(:func:`train_size`), and search an arm's sizes for the largest that trains (:func:`search_arm`, over
``repro.experiments.zero_capacity.search_largest``), with the rows each size and each arm report. The experiment that declares
the sizes, arms and points is :mod:`repro.experiments.zero_gpu` (its docstring tells the method: ZeRO Figs. 2, 3
and 6, sec. 9, 10.4; ZeRO-Offload's and ZeRO-Infinity's largest models).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:  # annotations only: torch loads where it runs, not for `repro list` or Slurm's planning
    import torch

#: Units of the measurements of one trained size (:func:`train_size`'s keys that become rows).
_UNITS = {"step_time_s": "s", "tflops_per_gpu": "TFLOP/s", "tokens_per_s": "tokens/s", "peak_device_gib": "GiB",
          "peak_host_rss_gib": "GiB", "loss": "nats", "setup_s": "s"}


# -- set-up --------------------------------------------------------------------------------------------------------
def search_config(size: dict, params: dict):
    from repro.models import GPTConfig

    return GPTConfig(vocab_size=params["vocab"], hidden_size=size["hidden"], num_layers=size["layers"],
                     num_attention_heads=size["heads"], max_position_embeddings=params["seq_len"],
                     hidden_dropout=params["dropout"], attention_dropout=params["dropout"])


def _host_available_bytes(ranks_here: int) -> float:
    """This rank's share of the host memory that can be allocated now (:func:`repro.machine.host_memory`)."""
    from repro.machine import host_memory

    return host_memory()[0] / max(ranks_here, 1)


def _free(device: torch.device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)  # pinned staging buffers of the last size
        if empty_host is not None:
            empty_host()


def _agree(groups, device: torch.device):
    """Logical AND over all ranks (every rank tries a size, or none does)."""
    import torch
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


def param_count(config, groups) -> int:
    from repro.models.params import count_parameters

    return count_parameters(config, groups.tp_size)


def _flops(config, params: dict, groups) -> float:
    from repro.perfmodel.flops import gpt_flops_per_iteration

    batch = params["micro_batch"] * params["micro_batches"] * groups.dp_size
    return gpt_flops_per_iteration(batch_size=batch, seq_length=params["seq_len"], num_layers=config.num_layers,
                                   hidden_size=config.hidden_size, vocab_size=config.padded_vocab_size(groups.tp_size),
                                   activation_recompute=params["checkpointing"])


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules in ``dtype`` (torch's default floating dtype for the block), restoring the previous one."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


# -- one size ------------------------------------------------------------------------------------------------------
def train_size(size: dict, arm: dict, params: dict, *, device: torch.device, groups, nvme_path: str) -> dict:
    """Build ``size`` on ``device``, train ``warmup + steps`` steps under ``arm``; the measurements (raises on a
    device out-of-memory, with the optimizer's tiers closed)."""
    import torch

    from repro.models import GPTModel
    from repro.tensor_parallel import seed_everything
    from repro.timing import time_iterations
    from repro.training.recompute import checkpoint_layers
    from repro.zero import build_zero_optimizer
    from repro.models.partitioned_gpt import build_partitioned_gpt
    from repro.machine import peak_rss_bytes, reset_peak_rss
    from repro.zero.precision import TORCH_DTYPES

    config = search_config(size, params)
    _free(device)
    reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    tracker = seed_everything(params["seed"], tp_rank=groups.tp_rank, device=device.type)
    zero_config, hparams = _zero_config(arm, params, nvme_path), dict(lr=params["lr"], betas=(0.9, 0.95),
                                                                       weight_decay=0.01)
    with torch.device(device):  # built where it trains: no host copy of the model
        if arm["stage"] == 3:  # block by block, each partitioned at once: no rank holds the whole model
            model, optimizer = build_partitioned_gpt(config, zero_config, dp_group=groups.dp, tp_group=groups.tp,
                                                     rng_tracker=tracker, **hparams)
        else:  # in its 16-bit training dtype: no fp32 copy of the whole model, which is not ZeRO's memory
            with default_dtype(TORCH_DTYPES[params["dtype"]]):
                model = GPTModel(config, tp_group=groups.tp, rng_tracker=tracker)
    if params["checkpointing"]:
        checkpoint_layers(model.layers, arm.get("activations", "replicated"), groups.tp, rng_tracker=tracker)
    if arm["stage"] != 3:
        optimizer = build_zero_optimizer(model, zero_config, dp_group=groups.dp, tp_group=groups.tp, **hparams)
    try:
        limit, total = arm.get("simulate_oom_above"), param_count(config, groups)
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


# -- rows, and the search of one arm -------------------------------------------------------------------------------
def describe_arm(device: torch.device, groups) -> dict:
    from repro.dist.device import describe

    info = describe(device)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
    return {"gpu": info.get("name") if device.type == "cuda" else None, "gpu_memory_gib": info.get("memory_gib"),
            "host_memory_gib": round(host, 1) if host else None, "gpus": groups.world_size, "tp": groups.tp_size,
            "dp": groups.dp_size}


def result_row(metric: str, value, unit: str, **fields) -> dict:
    return {"metric": metric, "value": None if value is None else float(value), "unit": unit, **fields}


def measure_rows(result: dict, *, largest: bool = False, **fields) -> list[dict]:
    """The measurements of one trained size (``largest``: the arm's summary metrics, a subset)."""
    names = ("step_time_s", "tflops_per_gpu", "peak_device_gib", "peak_host_rss_gib") if largest else tuple(_UNITS)
    return [result_row(f"largest_{name}" if largest else name, result[name], _UNITS[name], **fields)
            for name in names if result.get(name) is not None]


def _device_cap_bytes(params: dict, device) -> float:
    """The device memory a size may use: the point's cap, else the GPU's free memory plus what this process holds
    (a CPU run: the host's available memory)."""
    import torch

    if params["device_cap_gib"] is not None:
        return params["device_cap_gib"] * 2**30
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0]) + torch.cuda.memory_allocated(device)
    return _host_available_bytes(1)


def _summary_rows(outcome, common: dict, device_cap: float, host_limit: float) -> list[dict]:
    """The arm's summary: the largest size trained (and its measurements), the next size and why it failed, and the
    largest sizes the estimate fits on the device and within ``host_limit`` bytes of host memory."""
    largest, above = outcome.largest, outcome.next_larger
    fits_device = [a.params for a in outcome.attempts if a.estimate.device_bytes <= device_cap]
    fits_host = [a.params for a in outcome.attempts if a.estimate.host_bytes <= host_limit]
    summary = dict(common, stopped=outcome.stopped, largest_size=largest.size["name"] if largest else None,
                   next_params_b=above.params / 1e9 if above else None, next_decision=above.decision if above else None,
                   next_error=above.error if above else None)
    rows = [result_row("largest_trained_params_b", largest.params / 1e9 if largest else 0.0, "billion params",
                       **summary),
            result_row("largest_device_fit_estimate_b", max(fits_device, default=0.0) / 1e9, "billion params",
                       **summary),
            result_row("largest_host_fit_estimate_b", max(fits_host, default=0.0) / 1e9, "billion params",
                       **summary)]
    if largest is not None:
        rows += measure_rows(largest.result, largest=True, **summary)
    return rows


def search_arm(arm: dict, params: dict, *, device, groups, nvme_path: str, fixed: dict, say,
                emit: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Search ``arm``'s sizes for the largest that trains; its rows: per attempt (in size order) the estimate, the
    decision and, when trained, the measurements, then the arm's summary. ``emit`` gets each attempt's rows as the
    attempt is decided and the rest (sizes not reached after a failure, the summary) when the arm ends, so that a
    point stopped later keeps them (:meth:`RunContext.emit_rows`); the returned list holds the same row objects,
    which the runner does not write twice."""
    from repro.experiments.zero_capacity import estimate_memory, search_largest

    sizes = arm.get("sizes") or params["sizes"]
    overhead = params["device_overhead_gib"]
    if overhead is None:
        overhead = 2.5 if device.type == "cuda" else 0.0
    pb = {"bf16": 2, "fp16": 2, "fp32": 4}[params["dtype"]]

    def estimate(size):
        return estimate_memory(search_config(size, params), stage=arm["stage"], optimizer_tier=arm["optimizer"],
                               param_tier=arm.get("param", "none"), dp=groups.dp_size, tp=groups.tp_size,
                               micro_batch=params["micro_batch"], seq_len=params["seq_len"],
                               checkpointing=params["checkpointing"], bucket_numel=params["bucket_numel"],
                               param_bytes=pb, device_overhead_bytes=overhead * 2**30,
                               activation_checkpoints=arm.get("activations", "replicated"), partitioned_build=True)

    def params_of(size) -> float:
        return float(param_count(search_config(size, params), groups))

    _free(device)
    device_cap = _device_cap_bytes(params, device)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", groups.world_size))

    def host_available() -> float:
        if params["host_cap_gib"] is not None:
            return params["host_cap_gib"] * 2**30
        return _host_available_bytes(min(ranks_here, groups.world_size))

    common = dict(fixed, arm=arm["name"], stage=arm["stage"], optimizer_tier=arm["optimizer"],
                  param_tier=arm.get("param", "none"), activations=arm.get("activations", "replicated"),
                  micro_batch=params["micro_batch"], seq_len=params["seq_len"], device_cap_gib=device_cap / 2**30)

    def attempt_rows(attempt) -> list[dict]:
        fields = dict(common, size=attempt.size["name"], layers=attempt.size["layers"], hidden=attempt.size["hidden"],
                      params_b=attempt.params / 1e9, decision=attempt.decision, error=attempt.error)
        rows = [result_row("estimate_device_gib", attempt.estimate.device_bytes / 2**30, "GiB", **fields),
                result_row("estimate_host_gib", attempt.estimate.host_bytes / 2**30, "GiB", **fields),
                result_row("attempt", 1.0 if attempt.decision == "trained" else 0.0, "trained", **fields)]
        if attempt.decision == "trained":
            rows += measure_rows(attempt.result, **fields)
        return rows

    decided: dict[int, list[dict]] = {}  # id(attempt) -> its rows, emitted (the attempts live in the outcome)

    def report(attempt) -> None:
        line = f"[zero_gpu] {arm['name']} {attempt.size['name']} ({attempt.params / 1e9:.2f}B): {attempt.decision}"
        if attempt.decision == "trained":
            r = attempt.result
            line += f", step {r['step_time_s']:.2f} s, {r['tflops_per_gpu']:.1f} TFLOP/s, loss {r['loss']:.3f}"
        elif attempt.error:
            line += f" ({attempt.error})"
        say(line)
        decided[id(attempt)] = attempt_rows(attempt)  # decided: search_largest changes it no more
        emit(decided[id(attempt)])

    outcome = search_largest(
        sizes, params_of=params_of, estimate=estimate, device_cap_bytes=device_cap, host_available_bytes=host_available,
        try_size=lambda size: train_size(size, arm, params, device=device, groups=groups, nvme_path=nvme_path),
        time_cap_s=arm["time_cap_s"], agree=_agree(groups, device), on_attempt=report)
    _free(device)
    rows = []
    for attempt in outcome.attempts:  # in size order; the sizes after a failure were not reached (not reported)
        rows += decided[id(attempt)] if id(attempt) in decided else attempt_rows(attempt)
    rows += _summary_rows(outcome, common, device_cap, 0.9 * host_available())
    emitted = {id(row) for done in decided.values() for row in done}
    emit([row for row in rows if id(row) not in emitted])  # the arm has ended: the rest of its rows
    return rows
