"""The two-resource pipeline schedule of chunked GEMM -> collective (pure arithmetic)."""

import pytest

from repro.overlap.schedule import (
    equal_chunks_time,
    ideal_overlap_time,
    pipelined_time,
    share_of_ideal_saving,
    speedup_percent,
)


def test_one_chunk_is_sequential():
    assert equal_chunks_time(3.0, 2.0, 1) == 5.0


@pytest.mark.parametrize("gemm,comm,n", [(4.0, 2.0, 4), (2.0, 4.0, 4), (3.0, 3.0, 8), (1.0, 0.25, 2)])
def test_equal_chunks_closed_form(gemm, comm, n):
    expected = max(gemm + comm / n, gemm / n + comm)
    assert equal_chunks_time(gemm, comm, n) == pytest.approx(expected)
    assert ideal_overlap_time(gemm, comm) <= equal_chunks_time(gemm, comm, n) <= gemm + comm


def test_more_chunks_approach_the_ideal():
    times = [equal_chunks_time(4.0, 3.0, n) for n in (1, 2, 4, 16, 256)]
    assert times == sorted(times, reverse=True)
    assert times[-1] == pytest.approx(ideal_overlap_time(4.0, 3.0), rel=1e-2)


def test_uneven_chunks_and_trailing_compute():
    # link busy with chunk 0 until 1 + 5 = 6; chunk 1 computed at 2, sent 6..7; trailing compute ends at 2 + 4.
    assert pipelined_time([1.0, 1.0], [5.0, 1.0]) == 7.0
    assert pipelined_time([1.0, 1.0], [0.5, 0.5], trailing=4.0) == 6.0


def test_speedup_and_saving():
    assert speedup_percent(1.3, 1.0) == pytest.approx(30.0)
    assert share_of_ideal_saving(5.0, 4.0, 3.0) == pytest.approx(0.5)
    assert share_of_ideal_saving(5.0, 5.5, 3.0) < 0


def test_bad_input():
    with pytest.raises(ValueError, match="one collective per GEMM chunk"):
        pipelined_time([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=">= 0"):
        pipelined_time([-1.0], [1.0])
    with pytest.raises(ValueError, match="num_chunks=0"):
        equal_chunks_time(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="no saving is possible"):
        share_of_ideal_saving(3.0, 3.0, 3.0)
