"""Measure training throughput the way Megatron-LM reports it: time per iteration, tokens/s and model TFLOP/s per GPU.

Model FLOPs per iteration are the paper's formula (:func:`repro.perfmodel.flops.gpt_flops_per_iteration`,
``96 B s l h^2 (1 + s/6h + V/16lh)`` with activation recomputation counted, 72 instead of 96 without), never a
profiler count, so the numbers compare with the papers' however the kernels are fused. The share of peak divides by
the GPU's datasheet peak (:mod:`repro.perfmodel.gpus`). Iterations are timed after warm-up with CUDA events
(:mod:`repro.timing`); the median is reported.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Callable

import torch

from repro.perfmodel.flops import gpt_flops_per_iteration
from repro.timing import time_iterations


@dataclass(frozen=True)
class Throughput:
    """One measured configuration: per-iteration time and what follows from it (per GPU where it says so)."""

    iteration_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    flops_per_iteration: float
    peak_memory_gib: float | None
    setup_s: float
    last_loss: float


def model_flops(*, global_batch: int, seq_len: int, num_layers: int, hidden_size: int, vocab_size: int,
                recompute: bool) -> float:
    """The paper's model FLOPs of one iteration on a global batch of ``global_batch`` sequences."""
    return gpt_flops_per_iteration(batch_size=global_batch, seq_length=seq_len, num_layers=num_layers,
                                   hidden_size=hidden_size, vocab_size=vocab_size, activation_recompute=recompute)


def measure_steps(step: Callable[[], float | torch.Tensor], *, device: torch.device, flops_per_iteration: float,
                  tokens_per_iteration: int, num_gpus: int, warmup: int, iters: int, setup_s: float) -> Throughput:
    """Time ``step`` (one optimizer step; returns its loss, best as a device tensor: read once, after the timing,
    so that no step waits for the GPU) and turn the median time into throughput."""
    losses: list[float | torch.Tensor] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timing = time_iterations(lambda: losses.append(step()), device=device, warmup=warmup, iters=iters)
    seconds = timing.median_s
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return Throughput(
        iteration_s=seconds,
        tokens_per_s=tokens_per_iteration / seconds,
        model_tflops_per_gpu=flops_per_iteration / seconds / num_gpus / 1e12,
        flops_per_iteration=flops_per_iteration,
        peak_memory_gib=peak,
        setup_s=setup_s,
        last_loss=float(losses[-1]),
    )


def release(device: torch.device) -> None:
    """Free what the last measurement left (models, optimizers, compiled graphs) before the next one."""
    gc.collect()
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - dynamo may be unavailable; nothing to reset then
        pass
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def measure_trainer(config, groups, settings, *, device: torch.device, warmup: int, iters: int) -> Throughput:
    """Build a :class:`~repro.training.trainer.PipelineTrainer` (timed as setup), run one untimed step (which
    compiles the layers when asked to), then time ``iters`` steps on one fixed random global batch, the same on
    every rank. Model FLOPs count recomputation when ``settings.activation_checkpointing`` is on."""
    from repro.training.trainer import PipelineTrainer

    with Stopwatch(device) as build:
        trainer = PipelineTrainer(config, groups, settings)
    s = settings.seq_len
    generator = torch.Generator().manual_seed(1234)
    batch = torch.randint(0, config.vocab_size, (trainer.global_batch_size, s + 1), generator=generator)
    with Stopwatch(device) as first:
        trainer.step(batch)
    flops = model_flops(global_batch=trainer.global_batch_size, seq_len=s, num_layers=config.num_layers,
                        hidden_size=config.hidden_size, vocab_size=config.vocab_size,
                        recompute=settings.activation_checkpointing)
    result = measure_steps(lambda: trainer.step_lazy(batch), device=device, flops_per_iteration=flops,
                           tokens_per_iteration=trainer.global_batch_size * s, num_gpus=groups.world_size,
                           warmup=warmup, iters=iters, setup_s=build.s + first.s)
    del trainer
    return result


class Stopwatch:
    """``with Stopwatch() as sw: ...; sw.s`` (wall seconds, synchronised on CUDA)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device, self.s = device, 0.0

    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.s = time.perf_counter() - self.start


def device_peak_flops(device: torch.device) -> float | None:
    """The dense 16-bit peak (FLOP/s) of ``device`` from the datasheet table (:mod:`repro.perfmodel.gpus`), or None
    (a CPU, or a GPU not in the table: MFU is then not reported rather than guessed)."""
    if device.type != "cuda":
        return None
    from repro.perfmodel.gpus import peak_from_table

    peak = peak_from_table(torch.cuda.get_device_name(device))
    return peak.peak_flops if peak is not None else None


def max_memory(device: torch.device) -> tuple[float, str]:
    """(MiB, what it is) of this process's peak memory so far: the CUDA caching allocator's max allocated on a GPU,
    the peak resident set (VmHWM) on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "max allocated"
    from repro.machine import peak_rss_bytes

    return peak_rss_bytes() / 2**20, "max RSS"
