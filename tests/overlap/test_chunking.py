"""Chunk arithmetic of the T3 overlap (pure functions, no processes)."""

import pytest

from repro.overlap.chunking import check_num_chunks, row_chunks, sequence_chunk_shape


@pytest.mark.parametrize("rows,chunks", [(10, 3), (8, 4), (3, 8), (1, 1), (0, 2), (7, 1)])
def test_row_chunks_cover_every_row_once_in_order(rows, chunks):
    slices = row_chunks(rows, chunks)
    covered = [i for s in slices for i in range(s.start, s.stop)]
    assert covered == list(range(rows))
    assert len(slices) == max(1, min(chunks, rows))
    sizes = [s.stop - s.start for s in slices]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_num_chunks_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="num_chunks"):
        check_num_chunks(bad)


def test_sequence_chunk_shape():
    assert sequence_chunk_shape(16, 2, 4) == (2, 4, 2)
    assert sequence_chunk_shape(8, 4, 1) == (4, 1, 2)
    with pytest.raises(ValueError, match="sequence length 12 is not divisible by tp_size x num_chunks = 2 x 4"):
        sequence_chunk_shape(12, 2, 4)
