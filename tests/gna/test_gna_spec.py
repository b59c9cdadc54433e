"""The GNA specification: validation errors and the 1-D / N-D mask semantics (GNA §3.1, NATTEN conventions)."""

from __future__ import annotations

import itertools

import pytest
import torch

from repro.gna import GNASpec, gna_mask, mask_1d, neighborhood_attention, reference_attention


def test_scalars_broadcast_and_tuples_are_kept():
    spec = GNASpec((5, 4), stride=2, dilation=(1, 2), causal=True)
    assert spec.stride == (2, 2) and spec.dilation == (1, 2) and spec.causal == (True, True) and spec.ndim == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(window=(3, 3), stride=(4, 1)), "1 <= stride <= window"),
        (dict(window=(3,), stride=0), "1 <= stride <= window"),
        (dict(window=(0,)), "window >= 1"),
        (dict(window=(3,), dilation=0), "dilation >= 1"),
        (dict(window=(3, 3), stride=(1, 1, 1)), "has 3 entries"),
        (dict(window=(2, 2, 2, 2)), "1, 2 or 3 dimensions"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GNASpec(**kwargs)


def test_window_must_fit_the_grid():
    with pytest.raises(ValueError, match=r"window \* dilation <= extent, got 9 \* 1 = 9 > 8"):
        GNASpec((9, 3)).validate_grid((8, 8))
    with pytest.raises(ValueError, match=r"got 4 \* 3 = 12 > 10"):
        GNASpec((4,), dilation=3).validate_grid((10,))
    with pytest.raises(ValueError, match="2 dimensions but the spec has 3"):
        GNASpec((3, 3, 3)).validate_grid((8, 8))


def test_bad_tensors_get_clear_errors():
    spec = GNASpec((3, 3))
    q = torch.randn(1, 6, 6, 2, 4)
    with pytest.raises(ValueError, match="dtype mismatch"):
        reference_attention(q, q.double(), q, spec)
    with pytest.raises(ValueError, match=r"\[batch, \*grid \(2 dims\), heads, head_dim\]"):
        reference_attention(q[0], q[0], q[0], spec)
    with pytest.raises(ValueError, match="window \\* dilation <= extent"):
        neighborhood_attention(q, q, q, GNASpec((7, 3)), backend="fast")
    with pytest.raises(ValueError, match="must match key"):
        reference_attention(q, q, q[:, :5], spec)
    with pytest.raises(ValueError, match="floating point"):
        reference_attention(q.long(), q.long(), q.long(), spec)
    with pytest.raises(ValueError, match="backend='cuda' is not one of"):
        neighborhood_attention(q, q, q, spec, backend="cuda")


VALID = [(n, w, s, d) for n, w, s, d in itertools.product([9, 12], [1, 2, 3, 4], [1, 2], [1, 2]) if s <= w]


@pytest.mark.parametrize("extent, window, stride, dilation", VALID)
def test_non_causal_queries_see_exactly_window_keys(extent, window, stride, dilation):
    mask = mask_1d(extent, window, stride, dilation)
    assert (mask.sum(1) == window).all()
    group = torch.arange(extent) % dilation
    assert not (mask & (group[:, None] != group[None, :])).any(), "attention stays inside a dilation group"


def test_neighborhood_attention_is_a_sliding_window_clamped_at_borders():
    mask = mask_1d(8, 3)
    keys = [row.nonzero().flatten().tolist() for row in mask]
    assert keys[0] == [0, 1, 2] and keys[1] == [0, 1, 2] and keys[4] == [3, 4, 5] and keys[7] == [5, 6, 7]


def test_even_window_leans_left():
    keys = mask_1d(10, 4)[5].nonzero().flatten().tolist()
    assert keys == [3, 4, 5, 6]  # 2 keys left of the query, 1 right


def test_stride_equal_window_is_blocked_attention():
    mask = mask_1d(8, 4, stride=4)
    blocks = torch.block_diag(torch.ones(4, 4), torch.ones(4, 4)).bool()
    assert torch.equal(mask, blocks)


def test_stride_group_shares_the_window_of_its_centre():
    mask = mask_1d(12, 5, stride=3)
    for group_start in (0, 3, 6, 9):
        rows = mask[group_start : group_start + 3]
        assert (rows == rows[0]).all()
    assert mask[4].nonzero().flatten().tolist() == [2, 3, 4, 5, 6]  # leader = 3 + 3 // 2 = 4


def test_causal_window_ends_at_the_query_and_reaches_back_from_the_leader():
    mask = mask_1d(9, 4, stride=2, causal=True)
    for q in range(9):
        keys = mask[q].nonzero().flatten().tolist()
        leader = min((q // 2) * 2 + 1, 8)
        assert keys == list(range(max(0, leader - 3), q + 1))


def test_nd_mask_is_the_and_of_1d_masks():
    spec = GNASpec((3, 2), stride=(1, 2), dilation=(2, 1), causal=(False, True))
    grid = (7, 5)
    mask = gna_mask(grid, spec).view(7, 5, 7, 5)
    rows, cols = mask_1d(7, 3, 1, 2, False), mask_1d(5, 2, 2, 1, True)
    assert torch.equal(mask, rows[:, None, :, None] & cols[None, :, None, :])


def test_full_window_without_causality_is_self_attention():
    grid, spec = (4, 6), GNASpec((4, 6))
    assert spec.is_self_attention(grid)
    q, k, v = (torch.randn(2, *grid, 3, 8, dtype=torch.float64) for _ in range(3))
    out = reference_attention(q, k, v, spec)
    dense = torch.nn.functional.scaled_dot_product_attention(
        *(x.flatten(1, 2).transpose(1, 2) for x in (q, k, v))
    ).transpose(1, 2).reshape(out.shape)
    torch.testing.assert_close(out, dense)
