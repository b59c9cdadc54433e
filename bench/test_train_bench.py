"""The trainer's bookkeeping cost: step time with logging and checkpointing on, against without, in one run (CPU).

Three trainers built from the same seed train the same batches, their rounds interleaved so that machine load hits
all alike:

* ``off``: no log, no preemption check, no checkpoint;
* ``defaults``: ``repro train``'s defaults: a log line and a JSONL record every iteration, the preemption check after
  every step, a checkpoint at the end only (none during these rounds). Goal: under 3% over ``off``.
* ``save100``: the defaults plus a checkpoint every 100 iterations (reported, with the seconds one save takes: a save
  writes, fsyncs and hashes the model and Adam states, 3 x 4 bytes per parameter here).

Run: ``python -m pytest bench/test_train_bench.py --benchmark-only -s``
"""

from __future__ import annotations

import io
import time

import torch

from repro.dist import init_parallel
from repro.models import GPTConfig
from repro.training.data import SyntheticSamples
from repro.training.log import TrainingLog
from repro.training.loop import train_loop
from repro.training.preemption import PreemptionFlag
from repro.training.trainer import PipelineTrainer, TrainSettings

CONFIG = GPTConfig(vocab_size=1024, hidden_size=256, num_layers=4, num_attention_heads=8,
                   max_position_embeddings=128, hidden_dropout=0.0, attention_dropout=0.0)
SETTINGS = TrainSettings(steps=10**6, micro_batches=2, micro_batch_size=4, seq_len=128, lr=1e-4, clip_grad=1.0)
ROUNDS, STEPS_PER_ROUND, GOAL = 8, 25, 1.03


def test_logging_and_checkpointing_overhead(benchmark, tmp_path):
    groups = init_parallel()
    source = SyntheticSamples(vocab_size=CONFIG.vocab_size, seq_len=SETTINGS.seq_len)

    def logged(name: str) -> TrainingLog:
        return TrainingLog(total_iters=10**6, jsonl=tmp_path / f"{name}.jsonl", stream=io.StringIO())

    arms = {
        "off": dict(log=TrainingLog(total_iters=10**6, enabled=False), preemption=None, save=None, interval=None),
        "defaults": dict(log=logged("defaults"), preemption=PreemptionFlag(), save=str(tmp_path / "d"), interval=None),
        "save100": dict(log=logged("save100"), preemption=PreemptionFlag(), save=str(tmp_path / "s"), interval=100),
    }
    seconds = {name: 0.0 for name in arms}
    saved: list[str] = []
    for arm in arms.values():
        arm["trainer"] = trainer = PipelineTrainer(CONFIG, groups, SETTINGS)
        trainer.step(source.batch(0, trainer.global_batch_size))  # warm-up, then start again from iteration 0
        trainer.iteration = trainer.consumed_samples = 0
    for _ in range(ROUNDS):
        for name, arm in arms.items():
            trainer = arm["trainer"]
            started = time.perf_counter()
            outcome = train_loop(trainer, source, steps=trainer.iteration + STEPS_PER_ROUND, log=arm["log"],
                                 save=arm["save"], save_interval=arm["interval"], preemption=arm["preemption"],
                                 save_at_end=False)
            seconds[name] += time.perf_counter() - started
            saved += outcome.saved
    steps = ROUNDS * STEPS_PER_ROUND
    assert all(arm["trainer"].iteration == steps for arm in arms.values())
    assert len(saved) == steps // 100
    per_step = {name: s / steps for name, s in seconds.items()}
    ratio = per_step["defaults"] / per_step["off"]
    ratio_saves = per_step["save100"] / per_step["off"]
    benchmark.extra_info.update(s_per_step=per_step, ratio_defaults=ratio, ratio_save_every_100=ratio_saves,
                                goal=GOAL, steps=steps, torch_threads=torch.get_num_threads())
    print(f"\ntrainer step: off {1e3 * per_step['off']:.1f} ms, defaults (log + JSONL every step, preemption check) "
          f"{1e3 * per_step['defaults']:.1f} ms (ratio {ratio:.4f}, goal < {GOAL}), defaults + a checkpoint every "
          f"100 {1e3 * per_step['save100']:.1f} ms (ratio {ratio_saves:.4f})")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    assert ratio < GOAL
