"""The 16-bit casts of a layer's weights made once, before its checkpoint (repro.training.weight_casts).

The arithmetic is autocast's (the same casts of the same weights), so the losses equal autocast's bit for bit, with
and without flat buffers (with them the casts' backward writes the gradients into the buffer), over several
micro-batches; the recomputation casts nothing; and the settings refuse the option where it has nothing to keep.
"""

from __future__ import annotations

import pytest
import torch

from repro.models import GPTConfig
from repro.training.census import Census
from repro.training.settings import TrainSettings
from repro.training.trainer import train_gpt

CONFIG = GPTConfig(vocab_size=128, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=8,
                   hidden_dropout=0.1, attention_dropout=0.1)
RUN = dict(micro_batch_size=2, seq_len=8, seed=3, weight_decay=0.01, lr=3e-3, clip_grad=1.0,
           activation_checkpointing=True)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("flat", [True, False], ids=["flat_buffers", "per_parameter"])
def test_saved_casts_train_as_autocast_bit_for_bit(precision, flat):
    saved = train_gpt(CONFIG, None, 3, 2, precision=precision, flat_buffers=flat, weight_casts="saved", **RUN)
    autocast = train_gpt(CONFIG, None, 3, 2, precision=precision, flat_buffers=flat, weight_casts="autocast", **RUN)
    assert saved == autocast


def _casts_in_backward(weight_casts: str) -> int:
    """fp32 -> bf16 copies made while backward runs (the recomputation's casts)."""
    from repro.dist import init_parallel
    from repro.training.trainer import PipelineTrainer

    trainer = PipelineTrainer(CONFIG, init_parallel(), TrainSettings(steps=2, micro_batches=1, precision="bf16",
                                                                     weight_casts=weight_casts, **RUN))
    batch = torch.randint(0, CONFIG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    trainer.step(batch)
    backward = torch.autograd.backward
    counts = []

    def counted(*args, **kwargs):
        with Census() as census:
            backward(*args, **kwargs)
        counts.append(census.by_op["aten._to_copy"])

    torch.autograd.backward = counted
    try:
        trainer.step(batch)
    finally:
        torch.autograd.backward = backward
    return sum(counts)


def test_the_recomputation_casts_no_weight_again():
    """Under autocast the recomputed forward casts each matmul weight again (6 per layer) and the casts' backward
    makes an fp32 copy of each gradient; with the casts saved neither happens (the gradients are written into the
    flat buffer by a copy that converts)."""
    per_layer = 6  # qkv weight and bias, attention output weight, fc1 weight and bias, fc2 weight
    assert _casts_in_backward("autocast") - _casts_in_backward("saved") >= 2 * per_layer * CONFIG.num_layers


@pytest.mark.parametrize("options,accepted", [
    (dict(precision="bf16", activation_checkpointing=True, weight_casts="saved"), True),
    (dict(precision="fp16", activation_checkpointing=True, weight_casts="saved"), True),
    (dict(precision="fp32", activation_checkpointing=True, weight_casts="saved"), False),  # nothing to cast
    (dict(precision="bf16", activation_checkpointing=False, weight_casts="saved"), False),  # nothing recomputed
    (dict(precision="bf16", activation_checkpointing=False, weight_casts="autocast"), True),
    (dict(precision="fp32", activation_checkpointing=False, weight_casts="auto"), True),
    (dict(precision="bf16", activation_checkpointing=True, weight_casts="bf16"), False),
    (dict(precision="bf16", activation_checkpointing=True, weight_casts="saved", zero_stage=3), False),  # gathers late
    (dict(precision="bf16", activation_checkpointing=True, weight_casts="saved", zero_stage=2), True),
])
def test_settings_refuse_saved_casts_where_there_is_nothing_to_keep(options, accepted):
    if accepted:
        settings = TrainSettings(steps=1, micro_batches=1, **options)
        assert settings.casts in ("saved", "autocast")
    else:
        with pytest.raises(ValueError, match="weight_casts"):
            TrainSettings(steps=1, micro_batches=1, **options)


def test_auto_saves_the_casts_where_they_apply():
    assert TrainSettings(steps=1, micro_batches=1, precision="bf16", activation_checkpointing=True).casts == "saved"
    assert TrainSettings(steps=1, micro_batches=1, precision="bf16").casts == "autocast"
    assert TrainSettings(steps=1, micro_batches=1, activation_checkpointing=True).casts == "autocast"
    assert TrainSettings(steps=1, micro_batches=1, precision="bf16", activation_checkpointing=True,
                         zero_stage=3).casts == "autocast"
