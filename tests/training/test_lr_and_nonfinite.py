"""The learning rate each step uses and logs, and the stop on a non-finite gradient norm, against values worked out
by hand (not by the schedule or the loop under test).

Megatron-LM's warm-up (sec. 5; its ``OptimizerParamScheduler`` counts the step before reading the rate): step ``k``
(1-based) of a ``W``-step warm-up uses ``max_lr * k / W``, so the first step already moves the weights and step
``W`` reaches ``max_lr``; the linear or cosine decay then runs from ``max_lr`` at the end of the warm-up to
``min_lr`` at ``decay_iters``. A run stops (exit code 3) at the first step whose loss *or* gradient norm is not
finite, even when the loss of that step still is (the gradient that will ruin the weights is the first sign)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from repro.dist import init_parallel
from repro.models import GPTConfig
from repro.training.data import SyntheticSamples
from repro.training.log import TrainingLog
from repro.training.loop import NonFiniteTraining, train_loop
from repro.training.schedule import LRSchedule
from repro.training.trainer import PipelineTrainer, TrainSettings, train_gpt

CONFIG = GPTConfig(vocab_size=32, hidden_size=16, num_layers=1, num_attention_heads=2, max_position_embeddings=8,
                   hidden_dropout=0.0, attention_dropout=0.0)
MAX_LR = 0.01
#: warm-up 4, linear decay to 0.1 max_lr at iteration 10: the rates of iterations 0..11 (0-based), by hand
LINEAR = [0.25, 0.5, 0.75, 1.0,  # warm-up: (i + 1) / 4
          1.0, 1 - 0.9 / 6, 1 - 1.8 / 6, 1 - 2.7 / 6, 1 - 3.6 / 6, 1 - 4.5 / 6,  # 1 - 0.9 (i - 4) / 6
          0.1, 0.1]  # the floor from decay_iters on


def test_the_schedule_against_hand_values():
    linear = LRSchedule(max_lr=1.0, min_lr=0.1, warmup=4, decay_iters=10, decay_style="linear")
    assert [linear.lr(i) for i in range(12)] == pytest.approx(LINEAR, rel=1e-12, abs=1e-15)
    cosine = LRSchedule(max_lr=1.0, min_lr=0.1, warmup=4, decay_iters=10, decay_style="cosine")
    # cos(pi * (i - 4) / 6) at i = 4, 5, 7, 10: 1, sqrt(3)/2, 0, -1
    expected = {0: 0.25, 3: 1.0, 4: 1.0, 5: 0.1 + 0.45 * (1 + 3 ** 0.5 / 2), 7: 0.55, 10: 0.1, 50: 0.1}
    assert {i: cosine.lr(i) for i in expected} == pytest.approx(expected, rel=1e-12)
    assert [LRSchedule(max_lr=2.0, warmup=1).lr(i) for i in range(3)] == [2.0, 2.0, 2.0]  # a 1-step warm-up
    assert [LRSchedule(max_lr=2.0).lr(i) for i in range(2)] == [2.0, 2.0]  # no warm-up: max_lr from the start


def _settings(**overrides) -> TrainSettings:
    base = dict(steps=6, micro_batches=1, micro_batch_size=2, seq_len=8, lr=MAX_LR, min_lr=0.1 * MAX_LR,
                lr_warmup=4, lr_decay_iters=10, lr_decay_style="linear", seed=3)
    return TrainSettings(**{**base, **overrides})


def test_each_step_uses_and_logs_the_warm_up_rate(tmp_path):
    """The rate on the optimizer during step k and the ``learning_rate`` logged for iteration k are both the hand
    table's entry k - 1 (Megatron logs the rate the iteration used)."""
    trainer = PipelineTrainer(CONFIG, init_parallel(), _settings())
    used = []
    step = trainer.step_lazy

    def recording_step(batch):
        loss = step(batch)
        used.append(trainer.optimizer.param_groups[0]["lr"])  # what optimizer.step() just read
        return loss

    trainer.step_lazy = recording_step
    log = TrainingLog(total_iters=6, jsonl=tmp_path / "log.jsonl", stream=open(tmp_path / "out.txt", "w"))
    try:
        train_loop(trainer, SyntheticSamples(vocab_size=32, seq_len=8, seed=3), steps=6, log=log)
    finally:
        log.close()
        log.stream.close()
    expected = [MAX_LR * f for f in LINEAR[:6]]
    assert used == pytest.approx(expected, rel=1e-12)
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    logged = {r["iteration"]: r["learning_rate"] for r in logged if r["event"] == "iteration"}
    assert logged == pytest.approx({k + 1: lr for k, lr in enumerate(expected)}, rel=1e-12)


def test_the_first_warm_up_step_moves_the_weights_by_max_lr_over_warmup():
    """Through the weights, not the optimizer's field: one SGD step of a 4-step warm-up is bit for bit one step at
    the constant rate max_lr / 4, and differs from steps at max_lr / 2 or max_lr (an off-by-one warm-up)."""
    def weights_after_one_step(**settings):
        final = {}
        train_gpt(CONFIG, None, steps=1, micro_batches=1, optimizer="sgd", on_step=lambda i, loss, t: final.update(
            {k: v.detach().clone() for k, v in t.stage.state_dict().items()}),
            **{**dict(micro_batch_size=2, seq_len=8, seed=3), **settings})
        return final

    warm = weights_after_one_step(lr=MAX_LR, lr_warmup=4, lr_decay_iters=10, lr_decay_style="linear")
    for rate, same in ((MAX_LR / 4, True), (MAX_LR / 2, False), (MAX_LR, False)):
        constant = weights_after_one_step(lr=rate)
        assert all(torch.equal(warm[k], constant[k]) for k in warm) is same, rate


def test_an_infinite_gradient_norm_stops_the_run_though_its_loss_is_finite(tmp_path):
    """Step 2's gradient is made infinite after its (finite) loss was computed: the run stops at iteration 2 naming
    the gradient norm, before the update it would make poisons step 3's loss."""
    trainer = PipelineTrainer(CONFIG, init_parallel(), _settings(clip_grad=1.0, lr_warmup=0))
    weight = next(p for p in trainer.stage.parameters() if p.requires_grad)

    def one_infinite_entry(grad):  # during step 2: an infinite norm (not a NaN: no 0 * inf)
        if trainer.iteration != 1:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = math.inf
        return grad

    weight.register_hook(one_infinite_entry)
    losses = []
    step = trainer.step_lazy
    trainer.step_lazy = lambda batch: losses.append(step(batch)) or losses[-1]
    log = TrainingLog(total_iters=6, jsonl=tmp_path / "log.jsonl", stream=open(tmp_path / "out.txt", "w"))
    try:
        with pytest.raises(NonFiniteTraining) as stopped:
            train_loop(trainer, SyntheticSamples(vocab_size=32, seq_len=8, seed=3), steps=6, log=log)
    finally:
        log.close()
        log.stream.close()
    assert (stopped.value.iteration, stopped.value.what, stopped.value.value) == (2, "grad norm", math.inf)
    assert len(losses) == 2 and all(math.isfinite(float(loss)) for loss in losses)  # the loss never went bad
    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [(e["iteration"], e["what"]) for e in events if e["event"] == "nonfinite"] == [(2, "grad norm")]
