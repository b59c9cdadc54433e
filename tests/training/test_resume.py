"""Issue 12: a run split by a checkpoint equals a straight run, bit for bit on CPU.

Each case runs, on every rank of a real gloo job: a straight N-step run; then a fresh trainer that trains N/2 steps
and saves; then another fresh trainer that loads that checkpoint (random generators included) and trains the other
N/2. The losses of the two halves must equal the straight run's exactly (fp32 and bf16 autocast alike), under tp2,
pp2, tp2 x pp2, and dp2 with ZeRO 1, 2 and 3.
"""

from __future__ import annotations

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig
from repro.training.checkpoint import load_training_checkpoint
from repro.training.data import SyntheticSamples
from repro.training.log import TrainingLog
from repro.training.loop import train_loop
from repro.training.trainer import PipelineTrainer, TrainSettings

STEPS = 6
CONFIG = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=8,
                   hidden_dropout=0.1, attention_dropout=0.1)


def _settings(zero_stage: int, precision: str) -> TrainSettings:
    return TrainSettings(steps=STEPS, micro_batches=2, micro_batch_size=2, seq_len=8, lr=3e-3, zero_stage=zero_stage,
                         precision=precision, clip_grad=1.0, weight_decay=0.01, lr_warmup=2, lr_decay_iters=STEPS,
                         lr_decay_style="cosine", seed=5)


def _run(trainer: PipelineTrainer, steps: int, save: str | None = None) -> list[float]:
    source = SyntheticSamples(vocab_size=CONFIG.vocab_size, seq_len=8, seed=5)
    log = TrainingLog(total_iters=STEPS, enabled=False)
    return train_loop(trainer, source, steps=steps, log=log, save=save).losses


def _split_vs_straight(rank, world_size, layout, zero_stage, precision, directory):
    groups = init_parallel(**layout)
    settings = _settings(zero_stage, precision)
    straight = _run(PipelineTrainer(CONFIG, groups, settings), STEPS)
    first = _run(PipelineTrainer(CONFIG, groups, settings), STEPS // 2, save=directory)
    resumed = PipelineTrainer(CONFIG, groups, settings)
    path = load_training_checkpoint(directory, resumed)
    assert path is not None and resumed.iteration == STEPS // 2
    second = _run(resumed, STEPS)
    return straight, first + second


CASES = [
    ("tp2", dict(tp=2), 0), ("pp2", dict(pp=2), 0), ("tp2pp2", dict(tp=2, pp=2), 0),
    ("dp2_zero1", dict(), 1), ("dp2_zero2", dict(), 2), ("dp2_zero3", dict(), 3),
]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name,layout,zero_stage", CASES, ids=[c[0] for c in CASES])
def test_split_run_equals_straight_run(tmp_path, name, layout, zero_stage, precision):
    world = layout.get("tp", 1) * layout.get("pp", 1) * (1 if layout else 2)
    results = spawn(_split_vs_straight, world, layout, zero_stage, precision, str(tmp_path / "ckpt"), timeout_s=240)
    for straight, split in results:
        assert split == straight, f"{name} {precision}: resumed losses {split} != straight {straight}"
    assert torch.tensor(results[0][0]).isfinite().all()


NO_DROPOUT = GPTConfig(**{**CONFIG.__dict__, "hidden_dropout": 0.0, "attention_dropout": 0.0})


def _first_half(rank, world_size, zero_stage, micro_batches, directory):
    groups = init_parallel()
    settings = TrainSettings(**{**_settings(zero_stage, "fp32").__dict__, "micro_batches": micro_batches})
    return _run(PipelineTrainer(NO_DROPOUT, groups, settings), STEPS // 2, save=directory)


def _second_half(rank, world_size, zero_stage, micro_batches, directory):
    groups = init_parallel()
    settings = TrainSettings(**{**_settings(zero_stage, "fp32").__dict__, "micro_batches": micro_batches})
    straight = _run(PipelineTrainer(NO_DROPOUT, groups, settings), STEPS)
    resumed = PipelineTrainer(NO_DROPOUT, groups, settings)
    load_training_checkpoint(directory, resumed)
    return straight, _run(resumed, STEPS)


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
@pytest.mark.parametrize("old_dp,new_dp", [(2, 1), (1, 2)])
def test_resume_at_another_dp_size(tmp_path, zero_stage, old_dp, new_dp):
    """The same global batch (micro-batches x dp = 4 x 2 sequences) at dp 1 and 2: the second half at the other dp size
    continues the straight run of that size within 1e-6 (ZeRO re-shards the optimizer states; stage 0's are whole).
    Without dropout: dp ranks draw the same dropout masks (Megatron's seeding), so a dp change changes the masks."""
    directory = str(tmp_path / "ckpt")
    first = spawn(_first_half, old_dp, zero_stage, 4 // old_dp, directory, timeout_s=240)[0]
    straight, second = spawn(_second_half, new_dp, zero_stage, 4 // new_dp, directory, timeout_s=240)[0]
    resumed = torch.tensor(first + second)
    assert len(resumed) == STEPS
    rel = ((resumed - torch.tensor(straight)).abs() / torch.tensor(straight).abs()).max()
    assert rel < 1e-6, f"resumed {resumed.tolist()} vs straight {straight}"
