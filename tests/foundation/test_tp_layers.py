"""Tensor-parallel layers vs nn.Linear / nn.Embedding / F.cross_entropy, on 1, 2 and 4 gloo ranks.

Every rank builds its layer from the shards of the same reference weights; forward outputs and every gradient
(weight, bias, input) must match the single-process reference to relative error <= 1e-5 (fp32).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from repro.dist import init_parallel, spawn
from repro.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from repro.testing import assert_rel_close

TOL = 1e-5
WORLD_SIZES = [1, 2, 4]


def _reference_linear(seed, in_f, out_f, x_shape):
    """The reference layer's weights, its input, output and gradients, as plain tensors (picklable to a rank)."""
    torch.manual_seed(seed)
    ref = nn.Linear(in_f, out_f)
    x = torch.randn(*x_shape, in_f, requires_grad=True)
    grad_out = torch.randn(*x_shape, out_f)
    y = ref(x)
    y.backward(grad_out)
    return {"weight": ref.weight.detach(), "bias": ref.bias.detach(), "weight_grad": ref.weight.grad,
            "bias_grad": ref.bias.grad, "x": x.detach(), "x_grad": x.grad, "grad_out": grad_out, "y": y.detach()}


def _column_parallel_rank(rank, ws, ref, gather_output):
    tp = init_parallel(tp=ws).tp
    layer = ColumnParallelLinear(16, 24, group=tp, gather_output=gather_output)
    with torch.no_grad():
        layer.weight.copy_(ref["weight"].chunk(ws, 0)[rank])
        layer.bias.copy_(ref["bias"].chunk(ws, 0)[rank])
    xi = ref["x"].clone().requires_grad_(True)
    out = layer(xi)
    expected = ref["y"] if gather_output else ref["y"].chunk(ws, -1)[rank]
    assert_rel_close(out, expected, TOL, "output")
    out.backward(ref["grad_out"] if gather_output else ref["grad_out"].chunk(ws, -1)[rank].contiguous())
    assert_rel_close(xi.grad, ref["x_grad"], TOL, "input grad")
    assert_rel_close(layer.weight.grad, ref["weight_grad"].chunk(ws, 0)[rank], TOL, "weight grad")
    assert_rel_close(layer.bias.grad, ref["bias_grad"].chunk(ws, 0)[rank], TOL, "bias grad")
    return True


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel_linear(world_size, gather_output):
    ref = _reference_linear(0, 16, 24, (3, 5))
    assert all(spawn(_column_parallel_rank, world_size, ref, gather_output))


def _row_parallel_rank(rank, ws, ref, input_is_parallel):
    tp = init_parallel(tp=ws).tp
    layer = RowParallelLinear(24, 16, group=tp, input_is_parallel=input_is_parallel)
    with torch.no_grad():
        layer.weight.copy_(ref["weight"].chunk(ws, 1)[rank])
        layer.bias.copy_(ref["bias"])
    source = ref["x"].chunk(ws, -1)[rank] if input_is_parallel else ref["x"]
    xi = source.clone().requires_grad_(True)
    out = layer(xi)
    assert_rel_close(out, ref["y"], TOL, "output")
    out.backward(ref["grad_out"])
    expected_x_grad = ref["x_grad"].chunk(ws, -1)[rank] if input_is_parallel else ref["x_grad"]
    assert_rel_close(xi.grad, expected_x_grad, TOL, "input grad")
    assert_rel_close(layer.weight.grad, ref["weight_grad"].chunk(ws, 1)[rank], TOL, "weight grad")
    assert_rel_close(layer.bias.grad, ref["bias_grad"], TOL, "bias grad")
    return True


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_linear(world_size, input_is_parallel):
    ref = _reference_linear(1, 24, 16, (3, 5))
    assert all(spawn(_row_parallel_rank, world_size, ref, input_is_parallel))


def _vocab_parallel_embedding_rank(rank, ws, vocab, padded, hidden, full_ref, full_grad, ids, grad_out, y):
    tp = init_parallel(tp=ws).tp
    layer = VocabParallelEmbedding(padded, hidden, group=tp, vocab_size=vocab)
    assert layer.weight.shape == (padded // ws, hidden)
    with torch.no_grad():
        layer.weight.copy_(full_ref.chunk(ws, 0)[rank])
    out = layer(ids)
    assert_rel_close(out, y, TOL, "output")
    out.backward(grad_out)
    assert_rel_close(layer.weight.grad, full_grad.chunk(ws, 0)[rank], TOL, "weight grad")
    return True


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_vocab_parallel_embedding(world_size):
    torch.manual_seed(2)
    vocab, padded, hidden = 50, 64, 8  # padded is a multiple of every tested tp size
    ref = nn.Embedding(vocab, hidden)
    ids = torch.randint(0, vocab, (4, 7))
    grad_out = torch.randn(4, 7, hidden)
    y = ref(ids)
    y.backward(grad_out)
    full_ref = torch.cat([ref.weight.detach(), torch.zeros(padded - vocab, hidden)])
    full_grad = torch.cat([ref.weight.grad, torch.zeros(padded - vocab, hidden)])
    assert all(spawn(_vocab_parallel_embedding_rank, world_size, vocab, padded, hidden, full_ref, full_grad, ids,
                     grad_out, y.detach()))


def _vocab_parallel_cross_entropy_rank(rank, ws, logits, logits_grad, target, grad_loss, loss, shifted):
    groups = init_parallel(tp=ws)
    shard = logits.chunk(ws, -1)[rank].clone().requires_grad_(True)
    out = vocab_parallel_cross_entropy(shard, target, groups.tp)
    assert_rel_close(out, loss, TOL, "loss")
    out.backward(grad_loss)
    assert_rel_close(shard.grad, logits_grad.chunk(ws, -1)[rank], TOL, "logit grad")
    # Megatron sec. 3: three all-reduces of [b, s] scalars (max, target logit, sum of exp), no gather.
    if ws > 1:
        assert groups.ledger.calls("all_reduce", "tp") == 3
        assert groups.ledger.bytes("all_reduce", "tp") == 3 * 4 * 6 * 4
        assert groups.ledger.calls("all_gather") == 0
    # the same logits + 1000: e^1000 overflows fp32 and fp64, so only the global max subtracted first keeps it finite
    big = (logits + 1000).chunk(ws, -1)[rank].clone().requires_grad_(True)
    out = vocab_parallel_cross_entropy(big, target, groups.tp)
    out.backward(grad_loss)
    assert_rel_close(out, shifted["loss"], TOL, "loss of logits + 1000")
    assert_rel_close(big.grad, shifted["grad"].chunk(ws, -1)[rank], TOL, "logit grad of logits + 1000")
    return True


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_vocab_parallel_cross_entropy(world_size):
    torch.manual_seed(3)
    logits = (3 * torch.randn(4, 6, 32)).requires_grad_(True)
    target = torch.randint(0, 32, (4, 6))
    grad_loss = torch.rand(4, 6)
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(4, 6)
    loss.backward(grad_loss)
    big = (logits.detach() + 1000).double().requires_grad_(True)  # torch's reference in fp64 (it subtracts the max)
    big_loss = F.cross_entropy(big.flatten(0, 1), target.flatten(), reduction="none").view(4, 6)
    big_loss.backward(grad_loss.double())
    shifted = {"loss": big_loss.detach().float(), "grad": big.grad.float()}
    assert all(spawn(_vocab_parallel_cross_entropy_rank, world_size, logits.detach(), logits.grad, target, grad_loss,
                     loss.detach(), shifted))
