"""Window schedules: Megatron's overlapping evaluation and lm-eval's rolling windows."""

from __future__ import annotations

import pytest

from evals.wikitext import WindowConfig, megatron_windows, rolling_windows


def megatron_reference(tokens, seq_len, stride):
    """Megatron's _LMDataset spelled out: window idx reads tokens[idx*stride : idx*stride+seq_len+1], pads to
    seq_len+1 and keeps label positions whose pad mask survives (all for idx 0, the last `stride` otherwise).
    Returns the (label index, context start) pairs scored."""
    import math

    total_targets = len(tokens) - 1
    count = max(math.ceil(max(total_targets - stride, 0) / stride) + 1, 1)
    scored = []
    for idx in range(count):
        start = idx * stride
        window = tokens[start: start + seq_len + 1]
        mask = [1] * len(window) + [0] * (seq_len + 1 - len(window))
        mask = mask[1:]
        if stride != seq_len and idx != 0:
            mask = [0] * (seq_len - stride) + mask[seq_len - stride:]
        scored += [(start + 1 + j, start) for j, m in enumerate(mask) if m]
    return scored


@pytest.mark.parametrize("n", [2, 3, 10, 33, 64, 65, 100, 257])
@pytest.mark.parametrize("seq_len, stride", [(8, 8), (8, 1), (8, 3), (16, 4), (32, 32)])
def test_megatron_windows_match_reference(n, seq_len, stride):
    tokens = list(range(100, 100 + n))
    requests = megatron_windows(tokens, WindowConfig(seq_len=seq_len, stride=stride))
    ours = []
    for context, continuation in requests:
        start = context[0] - 100
        assert len(context) + len(continuation) <= seq_len + 1  # the model reads at most seq_len tokens
        ours += [(c - 100, start) for c in continuation]
    assert ours == megatron_reference(tokens, seq_len, stride)
    assert [label for label, _ in ours] == list(range(1, n))  # every target once, none twice


def test_window_config_validation():
    assert WindowConfig(seq_len=1024, stride=32).overlap == 992
    assert WindowConfig(seq_len=64, stride=None).effective_stride == 64
    with pytest.raises(ValueError, match="stride=65"):
        WindowConfig(seq_len=64, stride=65)


def test_rolling_windows_match_lm_eval():
    utils = pytest.importorskip("lm_eval.utils")
    for n in (1, 2, 5, 16, 17, 100, 1025):
        for max_length in (1, 4, 16):
            tokens = list(range(1000, 1000 + n))
            theirs = [(list(a), list(b)) for a, b in map(
                utils.make_disjoint_window, utils.get_rolling_token_windows(tokens, 7, max_length, 1))]
            assert rolling_windows(tokens, max_length, 7) == theirs


def test_rolling_windows_score_every_token_once():
    tokens = list(range(50))
    requests = rolling_windows(tokens, 16, prefix_id=-1)
    assert [t for _, cont in requests for t in cont] == tokens
    assert requests[0][0] == [-1]
    assert all(len(ctx) + len(cont) <= 17 for ctx, cont in requests)
