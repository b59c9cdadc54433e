"""Partition arithmetic, without processes (ZeRO sec. 5: equal contiguous shards of a padded flat buffer)."""

import itertools
import random

import pytest

from repro.zero.partition import flat_layout, group_into_buckets, padded_numel, total_padding


def test_padded_numel_rounds_up_to_equal_shards():
    assert padded_numel(10, 4) == 12
    assert padded_numel(12, 4) == 12
    assert padded_numel(0, 3) == 3  # an empty bucket still gives every rank a (padding) element
    assert padded_numel(10, 2, align=4) == 16
    with pytest.raises(ValueError, match="world_size"):
        padded_numel(10, 0)
    with pytest.raises(ValueError, match="align"):
        padded_numel(10, 2, align=0)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_pieces_cover_every_element_exactly_once(world):
    rng = random.Random(world)
    for _ in range(20):
        numels = [rng.randint(0, 50) for _ in range(rng.randint(1, 6))]
        layout = flat_layout(numels, world)
        assert layout.padded_numel % world == 0 and 0 <= layout.padding < world
        covered = {i: [0] * n for i, n in enumerate(numels)}
        for rank in range(world):
            lo, hi = layout.shard_range(rank)
            for piece in layout.pieces(rank):
                assert lo <= piece.flat_offset and piece.flat_offset + piece.numel <= hi
                assert piece.flat_offset == lo + piece.shard_offset
                assert piece.flat_offset == layout.offsets[piece.index] + piece.start
                for j in range(piece.start, piece.stop):
                    covered[piece.index][j] += 1
                assert rank in layout.owners(piece.index)
        assert all(c == 1 for counts in covered.values() for c in counts)


def test_shards_are_contiguous_and_equal():
    layout = flat_layout([5, 7, 3], 4)  # 15 -> 16
    assert layout.padded_numel == 16 and layout.shard_numel == 4 and layout.padding == 1
    assert [layout.shard_range(r) for r in range(4)] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    # rank 1 holds the last element of tensor 0 and the first three of tensor 1
    assert [(p.index, p.start, p.stop) for p in layout.pieces(1)] == [(0, 4, 5), (1, 0, 3)]
    assert layout.owners(1) == [1, 2] and layout.owners(2) == [3]
    with pytest.raises(ValueError, match="outside"):
        layout.shard_range(4)


def test_group_into_buckets_keeps_order_and_limits_size():
    numels = [3, 4, 10, 1, 1, 6]
    buckets = group_into_buckets(numels, 8)
    assert list(itertools.chain(*buckets)) == list(range(len(numels)))
    assert buckets == [[0, 1], [2], [3, 4, 5]]
    for bucket in buckets:
        assert sum(numels[i] for i in bucket) <= 8 or len(bucket) == 1
    with pytest.raises(ValueError, match="bucket_numel"):
        group_into_buckets(numels, 0)


def test_total_padding():
    layouts = [flat_layout([5], 4), flat_layout([8], 4)]
    assert total_padding(layouts) == 3
