"""Whole MLP, attention and transformer layers with T3's four sublayers (OP, FC-2, IP, FC-1) swapped to the
overlapped variants, against the same blocks built from the plain Megatron layers (tp = 2 and 4, gloo ranks)."""

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig, GPTModel
from repro.models.transformer import ParallelMLP, ParallelSelfAttention, TransformerLayer
from repro.overlap import OverlappedColumnParallelLinear, OverlappedRowParallelLinear, overlap_sublayers
from repro.overlap.verify import forward_backward, max_rel_err

TOL = 1e-5
CONFIG = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16,
                   hidden_dropout=0.0, attention_dropout=0.0)


def _build(kind, group):
    torch.manual_seed(7)  # same full weights at every tp size; sliced per rank
    if kind == "mlp":
        return ParallelMLP(CONFIG, group=group)
    if kind == "attention":
        return ParallelSelfAttention(CONFIG, group=group, causal=True)
    return TransformerLayer(CONFIG, group=group, causal=True)


def _overlapped_blocks_rank(rank, ws):
    groups = init_parallel(tp=ws)
    out = []
    for kind, swapped_expected in (("mlp", 2), ("attention", 2), ("layer", 4)):
        plain, overlapped = _build(kind, groups.tp), _build(kind, groups.tp)
        swapped = overlap_sublayers(overlapped, num_chunks=3)
        with torch.no_grad():  # non-zero biases so their gradients and sums are exercised
            torch.manual_seed(1)
            for p_plain, p_ovl in zip(plain.parameters(), overlapped.parameters()):
                p_plain.add_(0.01 * torch.randn_like(p_plain))
                p_ovl.copy_(p_plain)
        torch.manual_seed(2)  # replicated input and output gradient
        x, grad = torch.randn(2, 10, CONFIG.hidden_size), torch.randn(2, 10, CONFIG.hidden_size)
        before = groups.ledger.snapshot()
        expected = forward_backward(plain, x, grad)
        plain_ledger = groups.ledger.since(before)
        before = groups.ledger.snapshot()
        actual = forward_backward(overlapped, x, grad)
        ovl_ledger = groups.ledger.since(before)
        err, what = max_rel_err(actual, expected)
        out.append((kind, len(swapped) == swapped_expected, err, what,
                    plain_ledger.bytes("all_reduce"), ovl_ledger.bytes("all_reduce"),
                    plain_ledger.calls("all_reduce"), ovl_ledger.calls("all_reduce")))
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_blocks_with_overlapped_sublayers_match_plain(world_size):
    for per_rank in spawn(_overlapped_blocks_rank, world_size):
        for kind, swapped_ok, err, what, plain_b, ovl_b, plain_c, ovl_c in per_rank:
            assert swapped_ok, kind
            assert err <= TOL, f"{kind}: {what} relative error {err:.2e}"
            assert plain_b == ovl_b > 0, (kind, plain_b, ovl_b)
            assert ovl_c == 3 * plain_c, (kind, plain_c, ovl_c)  # 20 tokens in 3 chunks, every sublayer


def test_overlap_sublayers_swaps_the_four_t3_sublayers_of_a_model():
    torch.manual_seed(0)
    model = GPTModel(CONFIG)
    swapped = overlap_sublayers(model, num_chunks=2)
    assert sorted(swapped) == sorted(
        f"layers.{i}.{path}" for i in range(CONFIG.num_layers)
        for path in ("attention.qkv", "attention.dense", "mlp.fc1", "mlp.fc2")
    )
    layer = model.layers[0]
    assert isinstance(layer.attention.dense, OverlappedRowParallelLinear)
    assert isinstance(layer.mlp.fc1, OverlappedColumnParallelLinear)
    with pytest.raises(ValueError, match="no T3 sublayer"):
        overlap_sublayers(model)  # everything is already swapped
    with pytest.raises(ValueError, match="no T3 sublayer"):
        overlap_sublayers(torch.nn.Linear(2, 2))
