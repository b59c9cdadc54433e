"""Megatron sec. 3: a transformer layer costs exactly two all-reduces forward and two backward at tp > 1."""

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig, GPTModel
from repro.models.output import parallel_lm_logits
from repro.tensor_parallel import vocab_parallel_cross_entropy

CONFIG = GPTConfig(vocab_size=120, hidden_size=32, num_layers=3, num_attention_heads=4, max_position_embeddings=16,
                   hidden_dropout=0.0, attention_dropout=0.0, make_vocab_size_divisible_by=8)
BATCH, SEQ = 2, 10


def _all_reduce_counts_rank(rank, ws):
    groups = init_parallel(tp=ws)
    ledger = groups.ledger
    torch.manual_seed(0)
    model = GPTModel(CONFIG, tp_group=groups.tp)
    ids = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ))
    start = ledger.snapshot()
    hidden = model.embedding(ids)
    embedding_fwd = ledger.since(start)
    after_embedding = ledger.snapshot()
    for layer in model.layers:
        hidden = layer(hidden)
    layers_fwd = ledger.since(after_embedding)
    before_loss = ledger.snapshot()
    loss = vocab_parallel_cross_entropy(
        parallel_lm_logits(model.final_layernorm(hidden), model.embedding.word_embeddings), ids, groups.tp
    )
    loss_fwd = ledger.since(before_loss)
    before_bwd = ledger.snapshot()
    loss.mean().backward()
    bwd = ledger.since(before_bwd)
    return {
        "embedding": embedding_fwd.calls("all_reduce", "tp"),
        "layers_fwd_calls": layers_fwd.calls("all_reduce", "tp"),
        "layers_fwd_bytes": layers_fwd.bytes("all_reduce", "tp"),
        "loss_fwd_calls": loss_fwd.calls("all_reduce", "tp"),
        "loss_fwd_bytes": loss_fwd.bytes("all_reduce", "tp"),
        "bwd_calls": bwd.calls("all_reduce", "tp"),
        "bwd_bytes": bwd.bytes("all_reduce", "tp"),
        "other_kinds": [row["kind"] for row in ledger.rows() if row["kind"] != "all_reduce"],
    }


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_counts_and_bytes(world_size):
    activation_bytes = BATCH * SEQ * CONFIG.hidden_size * 4  # one fp32 [b, s, h] tensor
    for counts in spawn(_all_reduce_counts_rank, world_size):
        assert counts["embedding"] == 1  # g after the vocab-parallel lookup
        assert counts["layers_fwd_calls"] == 2 * CONFIG.num_layers  # g after attention, g after the MLP
        assert counts["layers_fwd_bytes"] == 2 * CONFIG.num_layers * activation_bytes
        assert counts["loss_fwd_calls"] == 3  # max, target logit, sum of exp
        assert counts["loss_fwd_bytes"] == 3 * BATCH * SEQ * 4
        # backward: f before QKV and f before FC1 in each layer, plus f before the output embedding
        assert counts["bwd_calls"] == 2 * CONFIG.num_layers + 1
        assert counts["bwd_bytes"] == (2 * CONFIG.num_layers + 1) * activation_bytes
        assert counts["other_kinds"] == []


def test_no_communication_at_tp1():
    groups = init_parallel(tp=1)
    model = GPTModel(CONFIG, tp_group=groups.tp)
    ids = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ))
    model.loss(ids, ids).mean().backward()
    assert groups.ledger.calls() == 0
