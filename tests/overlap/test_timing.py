"""The sublayer timer runs every mode on real ranks and derives its figures consistently (no speed asserted:
speed targets live in bench/)."""

import math

import pytest

from repro.dist import init_parallel, spawn
from repro.overlap.timing import MODES, SublayerSpec, SublayerTiming, time_sublayer, transformer_sublayers


def _time_sublayers_rank(rank, ws):
    groups = init_parallel(tp=ws)
    specs = transformer_sublayers(16)
    before = groups.ledger.snapshot()
    timings = [time_sublayer(spec, groups.tp, tokens=16, num_chunks=2, rounds=1, warmup=0)
               for spec in specs.values()]
    return timings, groups.ledger.since(before).calls()


def test_time_every_sublayer_on_two_ranks():
    (timings, calls), (other, _) = spawn(_time_sublayers_rank, 2)
    assert timings == other  # the maximum over ranks is shared
    assert calls == 0  # measurement collectives use a scratch ledger
    assert [t.sublayer for t in timings] == ["OP", "FC-2", "IP", "FC-1", "FC-2/RS"]
    for timing in timings:
        assert timing.tp_size == 2 and timing.num_chunks == 2
        assert min(timing.gemm_s, timing.comm_s, timing.sequential_s, timing.chunked_s, timing.overlapped_s) > 0
        assert 0 < timing.comm_share < 1
        row = timing.as_dict()
        assert row["ideal_s"] == max(timing.gemm_s, timing.comm_s)
        assert row["predicted_s"] >= row["ideal_s"]
        assert all(row[f"{mode}_median_s"] >= row[f"{mode}_s"] for mode in MODES)
        assert row["paired_speedup_pct"] > -100


def test_derived_figures():
    timing = SublayerTiming("OP", "forward", 8, 4, 4, 2, 4, 1, gemm_s=4.0, comm_s=2.0, sequential_s=6.0,
                            chunked_s=6.5, overlapped_s=5.0)
    assert timing.comm_share == pytest.approx(1 / 3)
    assert timing.speedup_pct == pytest.approx(20.0)
    assert timing.ideal_speedup_pct == pytest.approx(50.0)
    assert timing.predicted_s == pytest.approx(4.5)  # max(4 + 2/4, 1 + 2)
    assert timing.realised_fraction == pytest.approx(0.5)
    backward = SublayerTiming("FC-1", "backward", 8, 4, 4, 2, 2, 1, gemm_s=4.0, comm_s=2.0, sequential_s=3.0,
                              chunked_s=6.0, overlapped_s=5.0)
    assert backward.predicted_s == pytest.approx(4.0)  # dX chunks 1+1 with AR 1+1 behind, dW 2 trailing
    assert math.isnan(backward.realised_fraction)  # sequential below the ideal: nothing to realise


def test_bad_spec_and_arguments():
    assert len(MODES) == 5
    with pytest.raises(ValueError, match="parallel='diagonal'"):
        SublayerSpec("X", "diagonal", 4, 4)
    with pytest.raises(ValueError, match="rounds=0"):
        time_sublayer(transformer_sublayers(8)["OP"], init_parallel().tp, tokens=4, num_chunks=2, rounds=0)
