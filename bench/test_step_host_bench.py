"""The host's share of a training step: repro's 1-GPU baseline step against the plain GPT's, on a GPT of many tiny
layers (CPU).

On a GPU the 1.2B step is ~0.19 s of kernels, but everything the host does per parameter or per operation (launches,
Python around the optimizer, a norm over ~500 tensors) either hides behind the kernels or, where the GPU waits for
it (the optimizer after the backward, the forward after a host sync), adds to the step. Tiny layers make the kernels
nearly free, so on a CPU a step's time is its host time: what it costs to issue. Both sides train the same
configuration the way the GPU experiment runs them (:mod:`repro.experiments.megatron_weak_scaling_gpu`: bf16 autocast,
activation checkpointing per layer, clipping at 1.0, AdamW; the trainer's ``step_lazy``, the plain GPT's own loop
with torch's foreach clipping), eager on both sides, on one thread (tiny tensors gain nothing from more, and idle
worker threads spinning would count), their rounds alternated (A B A B ...) so that machine load hits both alike.
Each round's host time is the process's CPU time (``time.process_time``: what the host spent, not what a busy machine
made it wait); the ratio reported is that of the medians of the rounds, the wall-clock ratio beside it.

Run: ``python -m pytest bench/test_step_host_bench.py --benchmark-only -s``
"""

from __future__ import annotations

import statistics
import time

import torch

from repro.dist import init_parallel
from repro.models import GPTConfig
from repro.training.parallelize import build_plain_gpt
from repro.training.trainer import PipelineTrainer, TrainSettings

#: many layers of almost nothing: ~14 parameters and ~100 operations per layer, each on a few hundred numbers
CONFIG = GPTConfig(vocab_size=128, hidden_size=16, num_layers=48, num_attention_heads=2, max_position_embeddings=8,
                   hidden_dropout=0.1, attention_dropout=0.1)
BATCH, SEQ, ROUNDS, STEPS_PER_ROUND = 2, 8, 11, 3


def _repro_step(batch: torch.Tensor):
    settings = TrainSettings(steps=10**6, micro_batches=1, micro_batch_size=BATCH, seq_len=SEQ, lr=1.5e-4,
                             clip_grad=1.0, precision="bf16", activation_checkpointing=True)
    trainer = PipelineTrainer(CONFIG, init_parallel(), settings)
    return lambda: trainer.step_lazy(batch)


def _plain_step(batch: torch.Tensor):
    torch.manual_seed(0)
    model = build_plain_gpt(CONFIG, activation_checkpointing=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.5e-4, betas=(0.9, 0.95))
    ids, labels = batch[:, :-1], batch[:, 1:]
    model.train()

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model.loss(ids, labels).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        return loss.detach()

    return step


def test_host_time_of_a_step_on_many_tiny_layers(benchmark):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpu, wall = _alternated_rounds()
    finally:
        torch.set_num_threads(threads)
    median = {name: statistics.median(times) for name, times in cpu.items()}
    ratio = median["repro"] / median["plain"]
    wall_ratio = statistics.median(wall["repro"]) / statistics.median(wall["plain"])
    spread = {name: (min(times), max(times)) for name, times in cpu.items()}
    benchmark.extra_info.update(cpu_s_per_step_median=median, cpu_s_per_step_min_max=spread, ratio_of_medians=ratio,
                                wall_ratio_of_medians=wall_ratio, layers=CONFIG.num_layers, rounds=ROUNDS)
    print(f"\nstep on {CONFIG.num_layers} tiny layers (host CPU time): repro {1e3 * median['repro']:.1f} ms "
          f"[{1e3 * spread['repro'][0]:.1f}, {1e3 * spread['repro'][1]:.1f}], plain GPT {1e3 * median['plain']:.1f} ms "
          f"[{1e3 * spread['plain'][0]:.1f}, {1e3 * spread['plain'][1]:.1f}]; ratio of medians {ratio:.3f} "
          f"(wall clock {wall_ratio:.3f})")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    assert all(t > 0 for times in cpu.values() for t in times)


def _alternated_rounds() -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per arm, the CPU seconds and wall seconds per step of each round, the rounds alternated."""
    batch = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    arms = {"repro": _repro_step(batch), "plain": _plain_step(batch)}
    for step in arms.values():  # warm-up: first-step allocations, optimizer states
        step()
        step()
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    wall: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(ROUNDS):
        for name, step in arms.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(STEPS_PER_ROUND):
                step()
            cpu[name].append((time.process_time() - started_cpu) / STEPS_PER_ROUND)
            wall[name].append((time.perf_counter() - started) / STEPS_PER_ROUND)
    return cpu, wall
