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


@pytest.mark.parametrize("settled", [False, True])
def test_a_settled_rank_ignores_the_same_signal_on_its_way_out(settled):
    """After a preemption's save (``settle``), SIGUSR1 again (Slurm signals every process of the step, a launcher may
    pass it on) must not kill the rank with 138 instead of its 75: its handlers stay ignored after the block.
    Unsettled, the block gives back the handlers it found."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        with PreemptionFlag(signals=(signal.SIGTERM, signal.SIGUSR1), on_parent_death=False) as flag:
            signal.raise_signal(signal.SIGUSR1)
            assert flag.received == "SIGUSR1"
            if settled:
                flag.settle()
        after = signal.getsignal(signal.SIGUSR1)
        assert after == (signal.SIG_IGN if settled else signal.SIG_DFL)
        if settled:
            signal.raise_signal(signal.SIGUSR1)  # ignored: this process lives on
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
