"""tp x pp x dp training equals single-process training (issue 7 acceptance: losses within 1e-5, fp32).

References: the trainer itself at tp = pp = dp = 1, and an independent loop over ``ReferenceGPT`` (plain
``nn.Linear``, AdamW, gradient accumulation, torch's clip_grad_norm_) started from the same weights. Every layout
uses the same global batch of 8 sequences (micro-batch size x micro-batches x dp) and clips gradients at a norm
that is active, so the global-norm reduction over tp and pp is exercised too.
"""

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig, ReferenceGPT
from repro.pipeline.tied import check_tied_embedding_equal
from repro.training import synthetic_tokens, train_gpt

CONFIG = GPTConfig(vocab_size=96, hidden_size=32, num_layers=4, num_attention_heads=4, max_position_embeddings=16,
                   hidden_dropout=0.0, attention_dropout=0.0)
STEPS, SEQ, GLOBAL_BATCH = 6, 12, 8
SETTINGS = dict(seq_len=SEQ, lr=3e-3, clip_grad=0.3, seed=5)
TOL = 1e-5


def _data():
    return synthetic_tokens(vocab_size=CONFIG.vocab_size, seq_len=SEQ, batch_size=GLOBAL_BATCH, steps=STEPS, seed=11)


def _initial_state():
    """GPT-2 style weights (normal 0.02, zero biases, unit layer norms), so the loss starts near ln V."""
    torch.manual_seed(123)
    model = ReferenceGPT(CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                p.fill_(1.0 if "layernorm.weight" in name else 0.0)
    return model.state_dict()


def _reference_losses(micro_batches=4):
    torch.manual_seed(0)
    model = ReferenceGPT(CONFIG)
    model.load_state_dict(_initial_state())
    opt = torch.optim.AdamW(model.parameters(), lr=SETTINGS["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    losses, norms = [], []
    for batch in _data():
        opt.zero_grad()
        total = 0.0
        for chunk in batch.chunk(micro_batches):
            loss = model.loss(chunk[:, :-1], chunk[:, 1:]).mean() / micro_batches
            loss.backward()
            total += float(loss.detach())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), SETTINGS["clip_grad"])))
        opt.step()
        losses.append(total)
    return losses, norms


@pytest.fixture(scope="module")
def reference():
    return _reference_losses()


def test_single_process_trainer_matches_reference_gpt(reference):
    losses = train_gpt(CONFIG, None, STEPS, 4, micro_batch_size=2, data=_data(), initial_state=_initial_state(),
                       **SETTINGS)
    ref_losses, norms = reference
    assert min(norms) > SETTINGS["clip_grad"]  # clipping is active at every step
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= TOL
    assert losses[-1] < losses[0]


def _layout_rank(rank, world_size, tp, pp, dp, micro_batches):
    groups = init_parallel(tp=tp, pp=pp, dp=dp)
    trainers = []
    losses = train_gpt(CONFIG, groups, STEPS, micro_batches, micro_batch_size=GLOBAL_BATCH // (micro_batches * dp),
                       data=_data(), initial_state=_initial_state(),
                       on_step=lambda i, loss, trainer: trainers.append(trainer), **SETTINGS)
    stage = trainers[-1].stage
    tied_diff = check_tied_embedding_equal(stage, groups.embedding, atol=1e-6)
    return losses, tied_diff, groups.ledger.calls("send", "pp"), groups.ledger.calls("all_reduce", "embedding")


@pytest.mark.parametrize("tp,pp,dp,micro_batches", [(1, 2, 1, 4), (2, 2, 1, 2), (1, 2, 2, 2)],
                         ids=["pp2", "tp2xpp2", "pp2xdp2"])
def test_layout_matches_single_process(reference, tp, pp, dp, micro_batches):
    ref_losses, _ = reference
    out = spawn(_layout_rank, tp * pp * dp, tp, pp, dp, micro_batches, timeout_s=120)
    for rank, (losses, tied_diff, sends, embedding_reduces) in enumerate(out):
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= TOL, (rank, losses, ref_losses)
        assert tied_diff <= 1e-6
        # 1F1B moves one activation forward (stage 0) or one gradient back (stage 1) per micro-batch, per step;
        # the tied-embedding gradients are summed once per step (+1: the final equality check)
        assert sends == STEPS * micro_batches
        assert embedding_reduces == STEPS + 1


def _zero1_rank(rank, world_size, tp, pp, dp, micro_batches):
    groups = init_parallel(tp=tp, pp=pp, dp=dp)
    losses = train_gpt(CONFIG, groups, STEPS, micro_batches, zero_stage=1,
                       micro_batch_size=GLOBAL_BATCH // (micro_batches * dp), data=_data(),
                       initial_state=_initial_state(), **SETTINGS)
    return losses, groups.ledger.calls("reduce_scatter", "dp")


def test_zero1_over_dp_matches_single_process(reference):
    """pp=2 x dp=2 with ZeRO-1 (repro.zero stage 1) sharding Adam's states over dp: the losses stay those of one
    process (the clipping norm runs over the model-parallel group, the tied copy counted once)."""
    ref_losses, _ = reference
    tp, pp, dp, micro_batches = 1, 2, 2, 2
    for losses, reduce_scatters in spawn(_zero1_rank, tp * pp * dp, tp, pp, dp, micro_batches, timeout_s=120):
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= TOL, (losses, ref_losses)
        assert reduce_scatters >= STEPS  # gradients are reduce-scattered to their owners, not all-reduced


def _four_stages_rank(rank, world_size):
    groups = init_parallel(tp=1, pp=world_size, dp=1)  # middle stages get an embedding group of one
    assert groups.embedding.size == (2 if groups.pp.rank in (0, world_size - 1) else 1)
    return train_gpt(CONFIG, groups, STEPS, 4, micro_batch_size=2, data=_data(), initial_state=_initial_state(),
                     **SETTINGS)


def test_four_stages_with_middle_stages_match_single_process(reference):
    ref_losses, _ = reference
    for losses in spawn(_four_stages_rank, 4, timeout_s=120):
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= TOL, (losses, ref_losses)
