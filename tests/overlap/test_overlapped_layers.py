"""Overlapped row/column-parallel layers against the plain Megatron layers at tp = 2 and 4 (gloo ranks).

Forward output, input gradient and every parameter gradient must agree to relative error <= 1e-5 (fp32), and the
overlapped layer must move exactly the bytes the plain one moves (only the number of calls may grow).
"""

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.overlap import OverlappedColumnParallelLinear, OverlappedRowParallelLinear
from repro.overlap.verify import forward_backward, max_rel_err
from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear

TOL = 1e-5


def _bytes_and_calls(ledger, snapshot):
    delta = ledger.since(snapshot)
    return delta.bytes(), delta.calls()


def _compare(plain, overlapped, x, grad_out, ledger):
    before = ledger.snapshot()
    expected = forward_backward(plain, x, grad_out)
    plain_bytes, plain_calls = _bytes_and_calls(ledger, before)
    before = ledger.snapshot()
    actual = forward_backward(overlapped, x, grad_out)
    overlapped_bytes, overlapped_calls = _bytes_and_calls(ledger, before)
    err, what = max_rel_err(actual, expected)
    return err, what, plain_bytes, overlapped_bytes, plain_calls, overlapped_calls


def _row_and_column_rank(rank, ws):
    groups = init_parallel(tp=ws)
    tp = groups.tp
    results = []
    # (batch, seq) shapes: chunks that divide the tokens, that do not, and more chunks than tokens.
    for shape, num_chunks in (((2, 8), 4), ((3, 5), 4), ((1, 3), 8), ((2, 6), 1)):
        torch.manual_seed(10)
        row = RowParallelLinear(24, 16, group=tp)
        torch.manual_seed(10)
        row_ovl = OverlappedRowParallelLinear(24, 16, group=tp, num_chunks=num_chunks)
        with torch.no_grad():  # the bias is zero-initialised; make it non-trivial (replicated value)
            torch.manual_seed(11)
            row.bias.normal_()
            row_ovl.bias.copy_(row.bias)
        torch.manual_seed(20 + rank)
        x = torch.randn(*shape, 24 // ws)
        torch.manual_seed(30)
        grad = torch.randn(*shape, 16)
        results.append(("row", num_chunks, *_compare(row, row_ovl, x, grad, groups.ledger)))

        torch.manual_seed(12)
        col = ColumnParallelLinear(16, 24, group=tp)
        torch.manual_seed(12)
        col_ovl = OverlappedColumnParallelLinear.from_plain(ColumnParallelLinear(16, 24, group=tp),
                                                            num_chunks=num_chunks)
        with torch.no_grad():
            torch.manual_seed(13 + rank)
            col.bias.normal_()
            col_ovl.bias.copy_(col.bias)
        torch.manual_seed(40)
        x = torch.randn(*shape, 16)
        torch.manual_seed(50 + rank)
        grad = torch.randn(*shape, 24 // ws)
        results.append(("column", num_chunks, *_compare(col, col_ovl, x, grad, groups.ledger)))
    return results


@pytest.mark.parametrize("world_size", [2, 4])
def test_row_and_column_overlap_match_plain(world_size):
    for per_rank in spawn(_row_and_column_rank, world_size):
        for kind, num_chunks, err, what, plain_b, ovl_b, plain_c, ovl_c in per_rank:
            assert err <= TOL, f"{kind} num_chunks={num_chunks}: {what} relative error {err:.2e}"
            assert plain_b == ovl_b > 0, f"{kind}: bytes {ovl_b} != plain {plain_b}"
            assert plain_c == 1 and 1 <= ovl_c <= num_chunks, (kind, plain_c, ovl_c)


def _gather_and_scatter_rank(rank, ws):
    groups = init_parallel(tp=ws)
    def build():
        torch.manual_seed(3)
        return (ColumnParallelLinear(8, 12, group=groups.tp, gather_output=True),
                RowParallelLinear(12, 8, group=groups.tp, input_is_parallel=False))

    col, row = build()
    col_twin, row_twin = build()
    col_ovl = OverlappedColumnParallelLinear.from_plain(col_twin, num_chunks=3)
    row_ovl = OverlappedRowParallelLinear.from_plain(row_twin, num_chunks=3)
    torch.manual_seed(4)
    x8, g12, x12, g8 = torch.randn(4, 8), torch.randn(4, 12), torch.randn(4, 12), torch.randn(4, 8)
    return [_compare(col, col_ovl, x8, g12, groups.ledger)[:4], _compare(row, row_ovl, x12, g8, groups.ledger)[:4]]


def test_column_gather_output_and_row_scatter_input_match_plain():
    for per_rank in spawn(_gather_and_scatter_rank, 2):
        for err, what, plain_b, ovl_b in per_rank:
            assert err <= TOL, (what, err)
            assert plain_b == ovl_b


def test_from_plain_shares_parameters_and_does_not_touch_rng():
    plain = RowParallelLinear(8, 4)
    state = torch.get_rng_state()
    twin = OverlappedRowParallelLinear.from_plain(plain, num_chunks=2)
    assert torch.equal(state, torch.get_rng_state())
    assert twin.weight is plain.weight and twin.bias is plain.bias
    col = ColumnParallelLinear(4, 8, bias=False)
    col_twin = OverlappedColumnParallelLinear.from_plain(col, num_chunks=2)
    assert col_twin.weight is col.weight and col_twin.bias is None


def test_single_rank_is_plain_linear():
    torch.manual_seed(0)
    layer = OverlappedRowParallelLinear(6, 5, num_chunks=3)
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_bad_num_chunks():
    with pytest.raises(ValueError, match="num_chunks=0 must be a positive integer"):
        OverlappedRowParallelLinear(4, 4, num_chunks=0)
    with pytest.raises(ValueError, match="num_chunks=-2"):
        OverlappedColumnParallelLinear.from_plain(ColumnParallelLinear(4, 4), num_chunks=-2)
