"""A checkpoint is published last: the newest-pointer (``latest_checkpointed_iteration.txt``) moves only once the
iteration's ``trainer.json`` is complete, so a save cut short anywhere (a full disk, a kill) leaves the pointer on
the previous checkpoint, which still loads. The disk-full tests fail the rank files; these fail the metadata, in
one process (no job to launch)."""

from __future__ import annotations

import errno
import json

import pytest

from repro.dist import init_parallel
from repro.models import GPTConfig
from repro.training import checkpoint as C
from repro.training.data import SyntheticSamples
from repro.training.trainer import PipelineTrainer, TrainSettings
from repro.zero.checkpoint import CheckpointWriteError

CONFIG = GPTConfig(vocab_size=32, hidden_size=16, num_layers=1, num_attention_heads=2, max_position_embeddings=8)
SETTINGS = TrainSettings(steps=4, micro_batches=1, micro_batch_size=2, seq_len=8, seed=3)


def _trainer_at(iteration: int) -> PipelineTrainer:
    trainer = PipelineTrainer(CONFIG, init_parallel(), SETTINGS)
    source = SyntheticSamples(vocab_size=32, seq_len=8, seed=3)
    while trainer.iteration < iteration:
        trainer.step(source.batch(trainer.consumed_samples, trainer.global_batch_size))
    return trainer


def test_the_pointer_moves_after_trainer_json_is_complete(tmp_path, monkeypatch):
    """What the directory holds at the moment the pointer is written: the iteration's trainer.json, whole."""
    seen = []
    write = C.atomic_write_bytes

    def watching(path, data):
        if path.name == C.LATEST:
            iteration = int(data.decode())
            meta = C.iteration_dir(tmp_path, iteration) / C.TRAINER
            seen.append((iteration, json.loads(meta.read_text())["iteration"] if meta.exists() else None))
        return write(path, data)

    monkeypatch.setattr(C, "atomic_write_bytes", watching)
    trainer = _trainer_at(1)
    C.save_training_checkpoint(tmp_path, trainer)
    assert seen == [(1, 1)] and C.latest_iteration(tmp_path) == 1


def test_a_trainer_json_that_cannot_be_written_leaves_the_pointer_on_the_last_good_checkpoint(tmp_path, monkeypatch):
    trainer = _trainer_at(1)
    C.save_training_checkpoint(tmp_path, trainer)
    trainer.step(SyntheticSamples(vocab_size=32, seq_len=8, seed=3).batch(trainer.consumed_samples, 2))
    write = C.atomic_write_bytes

    def full_disk_for_trainer_json(path, data):
        if path.name == C.TRAINER:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write(path, data)

    monkeypatch.setattr(C, "atomic_write_bytes", full_disk_for_trainer_json)
    with pytest.raises(CheckpointWriteError, match=r"disk full while writing .*trainer\.json"):
        C.save_training_checkpoint(tmp_path, trainer)
    assert (tmp_path / C.LATEST).read_text() == "1\n"  # the pointer did not move
    assert not C.iteration_dir(tmp_path, 2).exists()  # the unpublished iteration is gone
    monkeypatch.setattr(C, "atomic_write_bytes", write)
    resumed = PipelineTrainer(CONFIG, init_parallel(), SETTINGS)
    assert C.load_training_checkpoint(tmp_path, resumed) == C.iteration_dir(tmp_path, 1)
    assert resumed.iteration == 1
