"""Measure how idle each pipeline stage is during 1F1B steps, and gather the timeline on every stage.

Idle fraction of a stage (the quantity the bubble formula (p-1)/(m+p-1) predicts): the share of the step in which
it computes nothing, ``1 - busy / step``. ``busy`` is the summed duration of its forward and backward passes (the
engine times them; waiting in a receive is not busy). ``step`` runs from the moment every stage has left a barrier
to the moment the last stage has finished, taken as the span of all stages' events on the host's monotonic clock
(``time.perf_counter`` is CLOCK_MONOTONIC, shared by the processes of one machine; on several nodes use the
per-stage ``wall_s`` instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.pipeline.engine import StepResult, run_1f1b
from repro.pipeline.fixed_cost import FixedCostStage
from repro.pipeline.schedule import BACKWARD, FORWARD
from repro.pipeline.timeline import StageEvent, idle_fractions

_KINDS = (FORWARD, BACKWARD)


@dataclass(frozen=True)
class IdleMeasurement:
    """Idle fraction per stage (averaged over the measured steps) and the last step's full timeline."""

    idle_per_stage: tuple[float, ...]
    recv_wait_per_stage: tuple[float, ...]  # share of the step spent blocked in receives
    step_s: float
    events: tuple[StageEvent, ...]

    @property
    def mean_idle(self) -> float:
        return sum(self.idle_per_stage) / len(self.idle_per_stage)


def gather_events(result: StepResult, pp_group: CommGroup) -> list[StageEvent]:
    """Every stage's events of one step (same count on each stage: 2 m), on every stage of ``pp_group``."""
    rows = [[e.stage, _KINDS.index(e.kind), e.micro_batch, e.start, e.end] for e in result.events]
    device = comm.group_device(pp_group)  # the group's backend decides: the rank's GPU under nccl
    mine = torch.tensor(rows, dtype=torch.float64, device=device)
    everyone = torch.empty((pp_group.size * mine.shape[0], mine.shape[1]), dtype=torch.float64, device=device)
    comm.all_gather_into_tensor(everyone, mine, pp_group)
    return [StageEvent(int(r[0]), _KINDS[int(r[1])], int(r[2]), float(r[3]), float(r[4])) for r in everyone.tolist()]


def measure_idle(run_step: Callable[[], StepResult], pp_group: CommGroup, *, steps: int, warmup: int = 1
                 ) -> IdleMeasurement:
    """Run ``warmup + steps`` steps (a barrier before each) and measure the idle share of the last ``steps``.

    Per stage, the *median* over the measured steps is kept: a step in which the operating system parked one
    process (a shared machine) is an outlier of the machine, not of the schedule.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup={warmup} >= 0")
    idle, waits, spans = [], [], []
    events: list[StageEvent] = []
    for step in range(warmup + steps):
        comm.barrier(pp_group)
        result = run_step()
        events = gather_events(result, pp_group)
        if step < warmup:
            continue
        start, end = min(e.start for e in events), max(e.end for e in events)
        idle.append(idle_fractions(events, pp_group.size))
        wait = torch.zeros(pp_group.size, dtype=torch.float64, device=comm.group_device(pp_group))
        wait[pp_group.rank] = result.recv_wait_s / (end - start)
        comm.all_reduce(wait, pp_group)
        waits.append(wait.tolist())
        spans.append(end - start)
    return IdleMeasurement(_median(idle), _median(waits), float(torch.tensor(spans).median()), tuple(events))


def _median(per_step: list[list[float]]) -> tuple[float, ...]:
    """Per-stage median over steps (rows: steps, columns: stages)."""
    return tuple(torch.tensor(per_step, dtype=torch.float64).median(dim=0).values.tolist())


def fixed_cost_step(pp_group: CommGroup, *, num_micro_batches: int, forward_s: float, backward_s: float,
                    micro_batch_size: int = 2, hidden_size: int = 8, seed: int = 0) -> Callable[[], StepResult]:
    """A ``run_step`` for :func:`measure_idle`: every stage a :class:`FixedCostStage`, a sum as the loss. The stage
    and its inputs are drawn on the CPU (the same numbers anywhere) and placed where ``pp_group`` communicates."""
    device = comm.group_device(pp_group)
    torch.manual_seed(seed + pp_group.rank)
    stage = FixedCostStage(hidden_size, forward_s=forward_s, backward_s=backward_s).to(device)
    shape = (micro_batch_size, hidden_size)
    inputs = [torch.randn(shape).to(device) for _ in range(num_micro_batches)] if pp_group.rank == 0 else None

    def run_step() -> StepResult:
        stage.zero_grad(set_to_none=True)
        return run_1f1b(forward_fn=lambda x, i: stage(x), loss_fn=lambda y, i: y.sum() / num_micro_batches,
                        inputs=inputs, num_micro_batches=num_micro_batches, activation_shape=shape,
                        pp_group=pp_group, device=device)

    return run_step
