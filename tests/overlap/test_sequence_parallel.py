"""Sequence-parallel overlapped linears (reduce-scatter / all-gather along the sequence, chunked) against a
single-process reference, at tp = 2 and 4 and for 1 (sequential) to 4 chunks; and a whole sequence-parallel MLP
against the plain tensor-parallel MLP."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig
from repro.models.transformer import ParallelMLP
from repro.overlap.sequence_parallel import SequenceParallelColumnLinear, SequenceParallelRowLinear
from repro.overlap.verify import rel_err
from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear

TOL = 1e-5
BATCH, SEQ = 2, 16


def _reference(in_f, out_f, seed):
    torch.manual_seed(seed)
    ref = nn.Linear(in_f, out_f)
    with torch.no_grad():
        ref.bias.normal_()
    x = torch.randn(BATCH, SEQ, in_f, requires_grad=True)
    grad = torch.randn(BATCH, SEQ, out_f)
    y = ref(x)
    y.backward(grad)
    weights = {"weight": ref.weight.detach(), "bias": ref.bias.detach(), "weight_grad": ref.weight.grad,
               "bias_grad": ref.bias.grad}
    return weights, x.detach(), x.grad, grad, y.detach()  # plain tensors, picklable to a rank


def _sequence_parallel_linears_rank(rank, ws, row_ref, col_ref):
    groups = init_parallel(tp=ws)
    seq = slice(rank * SEQ // ws, (rank + 1) * SEQ // ws)
    errors = []
    for num_chunks in (1, 2, 4):
        ref, x, x_grad, grad, y = row_ref
        row = SequenceParallelRowLinear(24, 8, group=groups.tp, num_chunks=num_chunks)
        with torch.no_grad():
            row.weight.copy_(ref["weight"].chunk(ws, 1)[rank])
            row.bias.copy_(ref["bias"])
        xi = x.chunk(ws, -1)[rank].clone().requires_grad_(True)  # full sequence, features split
        before = groups.ledger.snapshot()
        out = row(xi)  # own sequence shard
        out.backward(grad[:, seq])
        moved = groups.ledger.since(before)
        bias_grad = row.bias.grad.clone()
        torch.distributed.all_reduce(bias_grad)  # partial over this rank's tokens (documented)
        errors += [("row out", rel_err(out, y[:, seq])), ("row dX", rel_err(xi.grad, x_grad.chunk(ws, -1)[rank])),
                   ("row dW", rel_err(row.weight.grad, ref["weight_grad"].chunk(ws, 1)[rank])),
                   ("row db", rel_err(bias_grad, ref["bias_grad"])),
                   ("row bytes", moved.bytes("reduce_scatter") == 4 * BATCH * SEQ * 8
                    and moved.bytes("all_gather") == 4 * BATCH * SEQ * 8),
                   ("row calls", moved.calls("reduce_scatter") == num_chunks)]

        ref, x, x_grad, grad, y = col_ref
        col = SequenceParallelColumnLinear(8, 24, group=groups.tp, num_chunks=num_chunks)
        with torch.no_grad():
            col.weight.copy_(ref["weight"].chunk(ws, 0)[rank])
            col.bias.copy_(ref["bias"].chunk(ws, 0)[rank])
        xi = x[:, seq].clone().requires_grad_(True)  # own sequence shard, all features
        out = col(xi)  # full sequence, features split
        out.backward(grad.chunk(ws, -1)[rank])
        errors += [("col out", rel_err(out, y.chunk(ws, -1)[rank])), ("col dX", rel_err(xi.grad, x_grad[:, seq])),
                   ("col dW", rel_err(col.weight.grad, ref["weight_grad"].chunk(ws, 0)[rank])),
                   ("col db", rel_err(col.bias.grad, ref["bias_grad"].chunk(ws, 0)[rank]))]
    return errors


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_linears_match_reference(world_size):
    row_ref = _reference(24, 8, 0)
    col_ref = _reference(8, 24, 1)
    for per_rank in spawn(_sequence_parallel_linears_rank, world_size, row_ref, col_ref):
        for what, value in per_rank:
            if isinstance(value, bool):
                assert value, what
            else:
                assert value <= TOL, f"{what}: relative error {value:.2e}"


def _sequence_parallel_mlp_rank(rank, ws, config):
    groups = init_parallel(tp=ws)
    seq = slice(rank * SEQ // ws, (rank + 1) * SEQ // ws)
    torch.manual_seed(5)
    plain = ParallelMLP(config, group=groups.tp)
    torch.manual_seed(5)
    twin = ParallelMLP(config, group=groups.tp)
    fc1 = SequenceParallelColumnLinear.from_plain(twin.fc1, num_chunks=2)
    fc2 = SequenceParallelRowLinear.from_plain(twin.fc2, num_chunks=2)
    torch.manual_seed(6)
    x, grad = torch.randn(BATCH, SEQ, 16), torch.randn(BATCH, SEQ, 16)
    xp = x.clone().requires_grad_(True)
    yp = plain(xp)
    yp.backward(grad)
    xs = x[:, seq].clone().requires_grad_(True)
    ys = fc2(F.gelu(fc1(xs), approximate=config.gelu_approximate))
    ys.backward(grad[:, seq])
    fc2_bias_grad = fc2.bias.grad.clone()
    torch.distributed.all_reduce(fc2_bias_grad)
    return max(rel_err(ys, yp[:, seq]), rel_err(xs.grad, xp.grad[:, seq]),
               rel_err(fc1.weight.grad, plain.fc1.weight.grad), rel_err(fc1.bias.grad, plain.fc1.bias.grad),
               rel_err(fc2.weight.grad, plain.fc2.weight.grad), rel_err(fc2_bias_grad, plain.fc2.bias.grad))


def test_sequence_parallel_mlp_matches_plain_mlp():
    config = GPTConfig(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2,
                       max_position_embeddings=SEQ, hidden_dropout=0.0, attention_dropout=0.0)
    assert max(spawn(_sequence_parallel_mlp_rank, 2, config)) <= TOL


def _indivisible_sequence_rank(rank, ws):
    layer = SequenceParallelRowLinear.from_plain(RowParallelLinear(8, 8, group=init_parallel(tp=ws).tp),
                                                 num_chunks=4)
    try:
        layer(torch.randn(1, 12, 4))
    except ValueError as error:
        return str(error)
    return "no error"


def test_sequence_parallel_bad_input():
    with pytest.raises(ValueError, match="input_is_parallel=True"):
        SequenceParallelRowLinear(8, 8, input_is_parallel=False)
    with pytest.raises(ValueError, match="gather_output=False"):
        SequenceParallelColumnLinear.from_plain(ColumnParallelLinear(8, 8, gather_output=True))
    with pytest.raises(ValueError, match=r"batch-first \[batch, seq, features\]"):
        SequenceParallelRowLinear(8, 8)(torch.randn(4, 8))
    assert all("sequence length 12 is not divisible by tp_size x num_chunks = 2 x 4" in m
               for m in spawn(_indivisible_sequence_rank, 2))
