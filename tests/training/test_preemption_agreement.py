"""The preemption agreement (repro/training/preemption.py): every rank stops when any rank got a signal, and every
rank knows which rank got which signal. The signal reaches a job's nodes one after another, so rank 0 often learns of
it from another rank; its log line must still name the signal (issue 27: a 2-node job's log said only "a preemption
signal on another rank")."""

from __future__ import annotations

import signal

import pytest
import torch

from repro.dist.comm import CommGroup
from repro.dist.spawn import spawn
from repro.training.preemption import PreemptionFlag


def _agree(rank: int, world: int, got: dict[int, str]) -> tuple[bool, dict[int, str], str]:
    from repro.dist.groups import init_parallel

    groups = init_parallel(tp=1, pp=1)
    flag = PreemptionFlag(signals=())
    flag.received = got.get(rank)
    agreed = flag.agreed(groups.world, "cpu")
    return agreed, flag.heard, flag.describe()


@pytest.mark.parametrize("world, got, expected", [
    (2, {1: "SIGUSR1"}, "SIGUSR1 on rank 1 of 2"),
    (2, {0: "SIGTERM", 1: "SIGTERM"}, "SIGTERM on all ranks"),
    (4, {1: "SIGUSR1", 3: "SIGUSR1", 2: "SIGTERM"}, "SIGUSR1 on ranks 1, 3 of 4; SIGTERM on rank 2 of 4"),
    (4, {}, "no preemption signal"),
])
def test_every_rank_agrees_and_names_the_signal_and_the_ranks_that_got_it(world, got, expected):
    results = spawn(_agree, world, got)
    assert [r[0] for r in results] == [bool(got)] * world
    assert all(r[1] == got for r in results), results
    assert all(r[2] == expected for r in results), results


def test_a_job_of_one_rank_names_only_the_signal():
    flag = PreemptionFlag(signals=())
    assert not flag.agreed(CommGroup.single(), "cpu") and flag.describe() == "no preemption signal"
    flag.received = signal.Signals.SIGUSR1.name
    assert flag.agreed(None, torch.device("cpu")) and flag.heard == {0: "SIGUSR1"}
    assert flag.describe() == "SIGUSR1"
