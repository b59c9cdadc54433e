"""Measure training throughput the way Megatron-LM reports it: time per iteration, tokens/s and model TFLOP/s per GPU.

Model FLOPs per iteration are the paper's formula (:func:`repro.perfmodel.flops.gpt_flops_per_iteration`,
``96 B s l h^2 (1 + s/6h + V/16lh)`` with activation recomputation counted, 72 instead of 96 without), never a
profiler count, so the numbers compare with the papers' however the kernels are fused. The share of peak divides by
the GPU's datasheet peak (:mod:`repro.perfmodel.gpus`). Iterations are timed after warm-up with CUDA events
(:mod:`repro.timing`); the median is reported. :func:`alternate` times several variants in turn (A B A B ...) over
repetitions and reports each one's median and range, so that two models compare within one process and one drift.
"""

from __future__ import annotations

import gc
import statistics
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
    prepared = prepare_trainer(config, groups, settings, device=device)
    result = measure_steps(prepared.step, device=device, flops_per_iteration=prepared.flops_per_iteration,
                           tokens_per_iteration=prepared.tokens_per_iteration, num_gpus=groups.world_size,
                           warmup=warmup, iters=iters, setup_s=prepared.setup_s)
    del prepared
    return result


@dataclass
class Prepared:
    """A built model ready to be timed: ``step()`` runs one optimizer step and returns its loss (best left on the
    device); FLOPs per iteration by the paper's formula (recomputation counted under checkpointing) and without the
    recomputation (``executed_flops_per_iteration``: every forward and backward GEMM once, as model FLOPs utilisation
    counts); ``setup_s`` built it and ran its first (compiling) step; ``static_bytes`` is the device memory it holds
    between steps (parameters, gradients, optimizer states; None off a GPU)."""

    step: Callable[[], float | torch.Tensor]
    flops_per_iteration: float
    executed_flops_per_iteration: float
    tokens_per_iteration: int
    setup_s: float
    static_bytes: int | None = None
    #: what the step runs on (a trainer), for a caller that measures more of it
    owner: object | None = None


def prepare_trainer(config, groups, settings, *, device: torch.device) -> Prepared:
    """:func:`measure_trainer`'s model, built and stepped once (compiled), not yet timed."""
    from repro.training.trainer import PipelineTrainer

    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    with Stopwatch(device) as build:
        trainer = PipelineTrainer(config, groups, settings)
    s = settings.seq_len
    generator = torch.Generator().manual_seed(1234)
    batch = torch.randint(0, config.vocab_size, (trainer.global_batch_size, s + 1), generator=generator)
    with Stopwatch(device) as first:
        trainer.step(batch)
    sizes = dict(global_batch=trainer.global_batch_size, seq_len=s, num_layers=config.num_layers,
                 hidden_size=config.hidden_size, vocab_size=config.vocab_size)
    return Prepared(lambda: trainer.step_lazy(batch),
                    model_flops(**sizes, recompute=settings.activation_checkpointing),
                    model_flops(**sizes, recompute=False), trainer.global_batch_size * s, build.s + first.s,
                    None if before is None else torch.cuda.memory_allocated(device) - before, owner=trainer)


@dataclass(frozen=True)
class Spread:
    """The median and the range (min, max) of one quantity over repetitions."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> "Spread":
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class Alternated:
    """One variant timed in alternation with others: per repetition, the median seconds per iteration of ``iters``
    iterations (``repetition_s``), and what follows, each as median and range over the repetitions."""

    repetition_s: tuple[float, ...]
    iteration_s: Spread
    tokens_per_s: Spread
    model_tflops_per_gpu: Spread  # the paper's formula
    executed_tflops_per_gpu: Spread  # without the recomputation credit
    peak_memory_gib: float | None
    setup_s: float
    last_loss: float


def alternate(prepared: dict[str, Prepared], *, device: torch.device, warmup: int, iters: int, repetitions: int,
              num_gpus: int = 1, on_repetition: Callable[[str, int, float], None] | None = None
              ) -> dict[str, Alternated]:
    """Time the variants in turn, A B A B ..., ``repetitions`` times ``iters`` iterations each (after ``warmup``
    untimed ones, repeated before every block: the other variant ran in between), so that a drift of the machine
    (clocks, temperature, a neighbour) hits every variant alike; ``on_repetition(name, k, seconds)`` as each block
    ends (rows written as they come survive a time limit). Each variant's peak memory is its own: the peak while its
    blocks ran, less what the other variants hold between steps."""
    if repetitions < 1:
        raise ValueError(f"repetitions={repetitions} must be >= 1")
    times: dict[str, list[float]] = {name: [] for name in prepared}
    losses: dict[str, list] = {name: [] for name in prepared}
    peaks: dict[str, int] = {}
    for k in range(repetitions):
        for name, variant in prepared.items():
            held = None
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                held = torch.cuda.memory_allocated(device) - (variant.static_bytes or 0)
                torch.cuda.reset_peak_memory_stats(device)
            timing = time_iterations(lambda: losses[name].append(variant.step()), device=device, warmup=warmup,
                                     iters=iters)
            if held is not None:
                peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device) - held)
            losses[name] = losses[name][-1:]  # keep the last loss only (a device tensor), not every step's
            times[name].append(timing.median_s)
            if on_repetition is not None:
                on_repetition(name, k, timing.median_s)
    out = {}
    for name, variant in prepared.items():
        seconds = Spread.of(times[name])
        per_second = lambda work: Spread(work / seconds.median, work / seconds.max, work / seconds.min)  # noqa: E731
        out[name] = Alternated(
            repetition_s=tuple(times[name]), iteration_s=seconds,
            tokens_per_s=per_second(variant.tokens_per_iteration),
            model_tflops_per_gpu=per_second(variant.flops_per_iteration / num_gpus / 1e12),
            executed_tflops_per_gpu=per_second(variant.executed_flops_per_iteration / num_gpus / 1e12),
            peak_memory_gib=peaks[name] / 2**30 if name in peaks else None, setup_s=variant.setup_s,
            last_loss=float(losses[name][-1]))
    return out


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
