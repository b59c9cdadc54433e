"""Collectives issued in pieces over gloo (``repro.dist.comm.GLOO_CHUNK_BYTES``) give what one call gives, bit for
bit: an all-gather always, a reduce-scatter over two ranks (more ranks keep one call, as gloo's summation order
depends on the message size)."""

import pytest
import torch

from repro.dist import comm, init_parallel, spawn


def _pieces_vs_one_call(rank: int, world_size: int, piece_bytes: int) -> dict:
    group = init_parallel().dp
    torch.manual_seed(rank)
    n = 3 * piece_bytes // 4 + 17  # three whole pieces and a ragged one
    # values of very different magnitudes, so that a changed summation order would show in the last bits
    full = torch.randn(world_size * n) * 10.0 ** torch.randint(-4, 5, (world_size * n,)).float()
    shard, rows = torch.randn(n), torch.randn(n // 4, 4)
    got = {}
    for name, chunk in (("one call", 0), ("pieces", piece_bytes)):
        comm.GLOO_CHUNK_BYTES = chunk
        reduced, gathered = torch.empty(n), torch.empty(world_size * n)
        comm.reduce_scatter_tensor(reduced, full, group, async_op=True).wait()
        comm.all_gather_into_tensor(gathered, shard, group, async_op=True).wait()
        blocking = torch.empty(world_size * (n // 4), 4)  # 2-D (rows stacked), a blocking call
        assert comm.all_gather_into_tensor(blocking, rows, group) is None
        got[name] = (reduced, gathered, blocking.reshape(-1))
    pieces = len(comm._piece_bounds(group, shard))
    comm.GLOO_CHUNK_BYTES = 0
    one, cut = got["one call"], got["pieces"]
    return {"pieces": pieces, "reduce_equal": torch.equal(one[0], cut[0]),
            "gather_equal": torch.equal(one[1], cut[1]) and torch.equal(one[2], cut[2]),
            "own_shard_in_place": torch.equal(cut[1][rank * n:(rank + 1) * n], shard)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_pieces_equal_one_call(world_size):
    for result in spawn(_pieces_vs_one_call, world_size, 1 << 16):
        assert result == {"pieces": 4, "reduce_equal": True, "gather_equal": True, "own_shard_in_place": True}


def _piece_bounds_rank(rank, world_size):
    groups = init_parallel()
    comm.GLOO_CHUNK_BYTES = 40
    bounds = comm._piece_bounds(groups.dp, torch.empty(25))  # 100 bytes: pieces of 10 elements
    small = comm._piece_bounds(groups.dp, torch.empty(10))
    comm.GLOO_CHUNK_BYTES = 0
    off = comm._piece_bounds(groups.dp, torch.empty(25))
    return bounds, small, off


def test_piece_bounds_cover_the_shard_in_order():
    for bounds, small, off in spawn(_piece_bounds_rank, 2):
        assert bounds == [(0, 10), (10, 20), (20, 25)]
        assert small is None and off is None


def _pieces_without_list_reduce_scatter(rank: int, world_size: int) -> list[list[float]]:
    """Reduce-scatter in pieces as on a gloo without the list form (torch < 2.8): the fallback's shard, both ways."""
    import torch.distributed as dist

    from repro.dist import comm as C

    groups = init_parallel()
    C.GLOO_CHUNK_BYTES = 40
    full = torch.arange(50, dtype=torch.float32) * (rank + 1)
    out = []
    for listed in (True, False):
        C._LIST_REDUCE_SCATTER[0] = True
        original = dist.reduce_scatter
        if not listed:
            def refuse(*args, **kwargs):
                raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")
            dist.reduce_scatter = refuse
        try:
            shard = torch.empty(25)
            C.reduce_scatter_tensor(shard, full, groups.dp)
        finally:
            dist.reduce_scatter = original
        out.append(shard.tolist() + [float(C._LIST_REDUCE_SCATTER[0])])
    return out


def test_reduce_scatter_pieces_fall_back_where_gloo_lacks_the_list_form():
    for listed, fallback in spawn(_pieces_without_list_reduce_scatter, 2):
        assert listed[:-1] == fallback[:-1]  # the same sums
        assert fallback[-1] == 0.0  # the fallback was taken, and remembered
        # the real gloo: the list form where it has one (torch >= 2.8), else the fallback, learnt the same way
        assert listed[-1] == (1.0 if _gloo_has_list_reduce_scatter() else 0.0)


def _gloo_has_list_reduce_scatter() -> bool:
    from repro.optional import torch_version

    return torch_version() >= (2, 8)
