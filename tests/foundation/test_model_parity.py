"""Attention, MLP, a whole GPT and a whole BERT at tp = 1, 2, 4 against the single-process references.

Each rank loads its shard of the reference's weights; outputs and every gradient (merged across ranks) must match
to relative error <= 1e-5 in fp32.
"""

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.models import (
    BertConfig,
    BertModel,
    GPTConfig,
    GPTModel,
    ReferenceBert,
    ReferenceGPT,
    merge_state_dicts,
    shard_state_dict,
)
from repro.models.reference import _Attention, _MLP
from repro.models.sharding import split_rule
from repro.models.transformer import ParallelMLP, ParallelSelfAttention
from repro.testing import assert_rel_close, merge_prefixed, shard_prefixed

TOL = 1e-5
WORLD_SIZES = [1, 2, 4]
GPT = GPTConfig(vocab_size=203, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16,
                hidden_dropout=0.0, attention_dropout=0.0, make_vocab_size_divisible_by=8)
BERT = BertConfig(vocab_size=203, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16,
                  hidden_dropout=0.0, attention_dropout=0.0, make_vocab_size_divisible_by=8)


def _grads(module):
    """Every parameter's gradient (zeros for parameters the loss does not reach, e.g. BERT's binary head)."""
    return {
        name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        for name, p in module.named_parameters()
    }


def _check_grads(merged: dict, expected: dict):
    assert set(merged) == set(expected), set(merged) ^ set(expected)
    for name, grad in expected.items():
        assert_rel_close(merged[name], grad, TOL, f"grad of {name}")


def _sublayer_rank(rank, ws, kind, state, prefix, x, x_grad, y, grad_out):
    tp = init_parallel(tp=ws).tp
    layer = ParallelSelfAttention(GPT, group=tp, causal=True) if kind == "attention" else ParallelMLP(GPT, group=tp)
    layer.load_state_dict(shard_prefixed(state, prefix, GPT, rank, ws))
    xi = x.clone().requires_grad_(True)
    out = layer(xi)
    assert_rel_close(out, y, TOL, "output")
    out.backward(grad_out)
    assert_rel_close(xi.grad, x_grad, TOL, "input grad")
    return _grads(layer)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_sublayer_parity(world_size, kind):
    torch.manual_seed(10)
    ref = _Attention(GPT, causal=True) if kind == "attention" else _MLP(GPT)
    x = torch.randn(3, 9, GPT.hidden_size, requires_grad=True)
    grad_out = torch.randn(3, 9, GPT.hidden_size)
    y = ref(x)
    y.backward(grad_out)
    prefix = "layers.0.attention." if kind == "attention" else "layers.0.mlp."
    state = ref.state_dict()
    shards = spawn(_sublayer_rank, world_size, kind, state, prefix, x.detach(), x.grad, y.detach(), grad_out)
    _check_grads(merge_prefixed(shards, prefix, GPT), _grads(ref))


def _gpt_rank(rank, ws, state, ids, labels, logits, loss):
    tp = init_parallel(tp=ws).tp
    model = GPTModel(GPT, tp_group=tp)
    model.load_state_dict(shard_state_dict(state, GPT, rank, ws))
    assert_rel_close(model.full_logits(ids), logits, TOL, "logits")
    out = model.loss(ids, labels)
    assert_rel_close(out, loss, TOL, "loss")
    out.mean().backward()
    return _grads(model)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gpt_parity(world_size):
    torch.manual_seed(11)
    ref = ReferenceGPT(GPT)
    ids = torch.randint(0, GPT.vocab_size, (2, 12))
    labels = torch.randint(0, GPT.vocab_size, (2, 12))
    logits = ref(ids)
    loss = ref.loss(ids, labels)
    loss.mean().backward()
    state = ref.state_dict()
    shards = spawn(_gpt_rank, world_size, state, ids, labels, logits.detach(), loss.detach())
    _check_grads(merge_state_dicts(shards, GPT), _grads(ref))


def _bert_rank(rank, ws, config, state, ids, types, mask, seq, pooled, logits, weights):
    tp = init_parallel(tp=ws).tp
    model = BertModel(config, tp_group=tp)
    model.load_state_dict(shard_state_dict(state, config, rank, ws))
    s, p = model(ids, types, mask)
    assert_rel_close(s, seq, TOL, "sequence output")
    assert_rel_close(p, pooled, TOL, "pooled output")
    shard = model.lm_logits(s)  # this rank's vocabulary columns (padding masked)
    per_rank = shard.shape[-1]
    lo, hi = rank * per_rank, min((rank + 1) * per_rank, config.vocab_size)
    assert_rel_close(shard[..., : hi - lo], logits[..., lo:hi], TOL, "LM logits shard")
    w = torch.zeros(*logits.shape[:-1], per_rank)
    w[..., : hi - lo] = weights[2][..., lo:hi]
    # The replicated terms are the same on every rank; the LM term is this rank's partial sum (f all-reduces
    # its input gradient), so every rank back-propagates the full objective, as in training.
    ((s * weights[0]).sum() + (p * weights[1]).sum() + (shard * w).sum()).backward()
    return _grads(model)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("placement", ["megatron", "original"])
def test_bert_parity(world_size, placement):
    config = BertConfig(**{**BERT.__dict__, "layernorm_placement": placement})
    torch.manual_seed(12)
    ref = ReferenceBert(config)
    ids = torch.randint(0, config.vocab_size, (2, 10))
    types = torch.randint(0, 2, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0  # padding in the second sequence
    seq, pooled = ref(ids, types, mask)
    logits = ref.lm_logits(seq)
    weights = [torch.randn_like(seq), torch.randn_like(pooled), torch.randn_like(logits)]
    ((seq * weights[0]).sum() + (pooled * weights[1]).sum() + (logits * weights[2]).sum()).backward()
    state = ref.state_dict()
    shards = spawn(_bert_rank, world_size, config, state, ids, types, mask, seq.detach(), pooled.detach(),
                   logits.detach(), weights)
    for name in shards[0]:
        if split_rule(name) is None:  # replicated parameters: every rank holds the same full gradient
            for shard in shards[1:]:
                assert_rel_close(shard[name], shards[0][name], TOL, f"replicated grad of {name}")
    _check_grads(merge_state_dicts(shards, config), _grads(ref))
