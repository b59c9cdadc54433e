"""The split of a drive's busy time into reads alone, writes alone and both (repro.zero.offload.io_regimes)."""

import math

import pytest

from repro.zero.offload.io_regimes import regime_bandwidths, split_regimes


def test_disjoint_directions_are_alone():
    got = split_regimes(reads=[(0.0, 1.0, 100)], writes=[(2.0, 4.0, 400)])
    assert got["read"] == {"seconds": 1.0, "read_bytes": 100.0, "write_bytes": 0.0}
    assert got["write"] == {"seconds": 2.0, "read_bytes": 0.0, "write_bytes": 400.0}
    assert got["both"]["seconds"] == 0.0


def test_overlap_credits_bytes_by_duration():
    """A read over [0, 2] and a write over [1, 3]: [0, 1] read alone, [1, 2] both, [2, 3] write alone; each
    request's bytes are spread evenly over its own duration."""
    got = split_regimes(reads=[(0.0, 2.0, 200)], writes=[(1.0, 3.0, 600)])
    assert [got[r]["seconds"] for r in ("read", "write", "both")] == [1.0, 1.0, 1.0]
    assert got["read"]["read_bytes"] == pytest.approx(100) and got["both"]["read_bytes"] == pytest.approx(100)
    assert got["both"]["write_bytes"] == pytest.approx(300) and got["write"]["write_bytes"] == pytest.approx(300)
    rates = regime_bandwidths(got)
    assert rates["read_alone_gbs"] == pytest.approx(100 / 1e9) and rates["write_both_gbs"] == pytest.approx(300 / 1e9)


def test_concurrent_requests_of_one_direction_add_and_idle_time_is_not_counted():
    """Two ranks' reads in flight together are one 'read alone' regime whose rate is their sum; the gap between
    requests counts in no regime; every byte is credited once."""
    reads = [(0.0, 1.0, 100), (0.5, 1.5, 100), (5.0, 6.0, 50)]
    writes = [(1.0, 2.0, 10)]
    got = split_regimes(reads, writes)
    total_s = sum(got[r]["seconds"] for r in got)
    assert total_s == pytest.approx(3.0)  # [0, 2] and [5, 6]; [2, 5] is idle
    assert sum(got[r]["read_bytes"] for r in got) == pytest.approx(250)
    assert sum(got[r]["write_bytes"] for r in got) == pytest.approx(10)
    assert got["both"]["seconds"] == pytest.approx(0.5)  # [1, 1.5]


def test_absent_regime_has_no_bandwidth_and_bad_request_is_refused():
    rates = regime_bandwidths(split_regimes(reads=[(0.0, 1.0, 8)], writes=[]))
    assert rates["write_alone_gbs"] is None and rates["read_both_gbs"] is None
    assert math.isclose(rates["read_alone_gbs"], 8e-9)
    with pytest.raises(ValueError, match="ends"):
        split_regimes(reads=[(2.0, 1.0, 8)], writes=[])
