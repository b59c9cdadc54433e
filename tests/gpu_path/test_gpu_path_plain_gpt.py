"""The plain GPT, the speed reference of the GPU experiments (:func:`repro.training.parallelize.build_plain_gpt`), is
the trainer's GPT with no parallel step applied: the same parameters by name, and with the same weights the same loss
and gradients as the trainer's stage at tp = pp = dp = 1, bit for bit, so the ratio of the two speeds is the cost of
the parallel machinery alone."""

from __future__ import annotations

import pytest
import torch

from repro.dist import init_parallel
from repro.models import GPTConfig
from repro.models.params import count_parameters
from repro.training.parallelize import build_plain_gpt
from repro.training.settings import TrainSettings
from repro.training.trainer import PipelineTrainer


def _config(vocab=96):
    return GPTConfig(vocab_size=vocab, hidden_size=64, num_layers=2, num_attention_heads=4, max_position_embeddings=32,
                     hidden_dropout=0.0, attention_dropout=0.0)


def _pair(config, device, checkpointing):
    settings = TrainSettings(steps=1, micro_batches=1, micro_batch_size=2, seq_len=32, seed=3, device=device,
                             activation_checkpointing=checkpointing)
    trainer = PipelineTrainer(config, init_parallel(), settings)
    plain = build_plain_gpt(config, activation_checkpointing=checkpointing).to(device)
    plain.load_state_dict(trainer.stage.state_dict())
    return trainer.stage, plain


def _tokens(config, device, b=2, s=32):
    batch = torch.randint(0, config.vocab_size, (b, s + 1), generator=torch.Generator().manual_seed(1)).to(device)
    return batch[:, :-1], batch[:, 1:]


def test_the_plain_gpt_has_the_trainers_parameters():
    config = _config(vocab=96)  # padded to 128 rows at tp 1, as the trainer pads it
    stage, plain = _pair(config, "cpu", checkpointing=False)
    assert [(n, p.shape) for n, p in plain.named_parameters()] == [(n, p.shape) for n, p in stage.named_parameters()]
    assert sum(p.numel() for p in plain.parameters()) == count_parameters(config)
    assert not plain.embedding.check_ids  # the caller checks the ids on the host, as the trainer does


@pytest.mark.parametrize("checkpointing", [False, True])
def test_same_weights_give_the_same_loss_and_gradients(device, checkpointing):
    config = _config()
    stage, plain = _pair(config, device, checkpointing)
    ids, labels = _tokens(config, device)
    stage.train(), plain.train()
    loss_stage = stage.output_loss(stage.hidden_states(ids), labels).mean()
    loss_plain = plain.loss(ids, labels).mean()
    assert torch.equal(loss_plain, loss_stage), (loss_plain.item(), loss_stage.item())
    loss_stage.backward()
    loss_plain.backward()
    grads = dict(stage.named_parameters())
    for name, param in plain.named_parameters():
        assert torch.equal(param.grad, grads[name].grad), name
