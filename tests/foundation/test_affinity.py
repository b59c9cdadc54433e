"""``repro.dist.affinity``: one core per rank while timed, restored after; nothing pinned where it cannot be."""

import os

import pytest

from repro.dist.affinity import allowed_cores, local_rank_and_size, one_core_per_rank

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="the OS cannot pin threads")


def test_pins_the_rank_to_its_core_and_restores(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cores = allowed_cores()
    with one_core_per_rank(len(cores) - 1, len(cores)) as core:
        assert core == cores[-1] and os.sched_getaffinity(0) == {cores[-1]}
    assert sorted(os.sched_getaffinity(0)) == cores


def test_more_ranks_than_cores_pins_nothing(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(len(allowed_cores()) + 1))
    with one_core_per_rank(0, 1) as core:
        assert core is None and sorted(os.sched_getaffinity(0)) == allowed_cores()


def test_local_rank_comes_from_the_launcher(monkeypatch):
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert local_rank_and_size(5, 8) == (5, 8)  # one node: the global rank
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    assert local_rank_and_size(5, 8) == (1, 4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_rank_and_size(5, 8) == (2, 4)


def _pin_rank(rank, world_size):
    with one_core_per_rank(rank, world_size) as core:
        return core, sorted(os.sched_getaffinity(0))


def test_spawned_ranks_pin_distinct_cores():
    from repro.dist import spawn

    if len(allowed_cores()) < 2:
        pytest.skip("needs two cores")

    got = spawn(_pin_rank, 2)
    assert [core for core, _ in got] == allowed_cores()[:2]
    assert all(seen == [core] for core, seen in got)
