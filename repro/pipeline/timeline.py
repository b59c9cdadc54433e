"""Timelines of a pipeline step: simulated from the schedule, or recorded while it runs; and their idle share.

A timeline is a list of :class:`StageEvent` (which stage did what, from when to when). The idle fraction of a
stage is the share of the step (first start to last end over *all* stages) in which it computed nothing.
:func:`simulate_1f1b` places every action of :func:`~repro.pipeline.schedule.one_f_one_b` as early as its
dependencies allow (forward ``i`` on stage ``r`` after forward ``i`` on ``r - 1``; backward ``i`` after backward
``i`` on ``r + 1``), which gives the "schedule slot" timeline of Narayanan et al. 2021 Fig. 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from repro.pipeline.schedule import BACKWARD, FORWARD, one_f_one_b


@dataclass(frozen=True)
class StageEvent:
    """Stage ``stage`` ran ``kind`` (forward / backward) of ``micro_batch`` in [start, end) seconds."""

    stage: int
    kind: str
    micro_batch: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def simulate_1f1b(
    pp_size: int, num_micro_batches: int, *, forward_time: float = 1.0, backward_time: float = 2.0,
    p2p_time: float = 0.0,
) -> list[StageEvent]:
    """Earliest-start timeline of one 1F1B step with equal work per stage (times in any unit)."""
    if forward_time <= 0 or backward_time <= 0 or p2p_time < 0:
        raise ValueError(
            f"forward_time={forward_time} and backward_time={backward_time} must be > 0, p2p_time={p2p_time} >= 0"
        )
    orders = [list(one_f_one_b(r, pp_size, num_micro_batches)) for r in range(pp_size)]
    done: dict[tuple[int, str, int], float] = {}  # (stage, kind, micro_batch) -> end time
    free = [0.0] * pp_size  # when each stage finishes its previous action
    events: list[StageEvent] = []
    cursor = [0] * pp_size
    while any(cursor[r] < len(orders[r]) for r in range(pp_size)):
        progressed = False
        for r in range(pp_size):
            if cursor[r] == len(orders[r]):
                continue
            action = orders[r][cursor[r]]
            if action.kind == FORWARD:
                dep = (r - 1, FORWARD, action.micro_batch) if r > 0 else None
            else:
                dep = (r + 1, BACKWARD, action.micro_batch) if r < pp_size - 1 else None
            if dep is not None and dep not in done:
                continue
            ready = done[dep] + p2p_time if dep is not None else 0.0
            start = max(free[r], ready)
            end = start + (forward_time if action.kind == FORWARD else backward_time)
            done[(r, action.kind, action.micro_batch)] = free[r] = end
            events.append(StageEvent(r, action.kind, action.micro_batch, start, end))
            cursor[r] += 1
            progressed = True
        if not progressed:  # pragma: no cover - 1F1B has no dependency cycle
            raise RuntimeError("the schedule deadlocks")
    return events


def step_window(events: Sequence[StageEvent]) -> tuple[float, float]:
    if not events:
        raise ValueError("an empty timeline has no step window")
    return min(e.start for e in events), max(e.end for e in events)


def busy_time(events: Iterable[StageEvent], stage: int) -> float:
    return sum(e.duration for e in events if e.stage == stage and e.kind in (FORWARD, BACKWARD))


def idle_fractions(events: Sequence[StageEvent], pp_size: int) -> list[float]:
    """Per stage: 1 - (time computing) / (step time), the step spanning every stage's events."""
    start, end = step_window(events)
    span = end - start
    if span <= 0:
        raise ValueError("the timeline spans no time")
    return [1.0 - busy_time(events, r) / span for r in range(pp_size)]


def render(events: Sequence[StageEvent], pp_size: int, slot: float) -> str:
    """ASCII Gantt chart, one row per stage, one character per ``slot`` of time (``F``/``B``/``.``)."""
    start, end = step_window(events)
    width = int(round((end - start) / slot))
    rows = [["."] * width for _ in range(pp_size)]
    for e in events:
        for t in range(int(round((e.start - start) / slot)), int(round((e.end - start) / slot))):
            rows[e.stage][min(t, width - 1)] = "F" if e.kind == FORWARD else "B"
    return "\n".join(f"stage {r}: " + "".join(row) for r, row in enumerate(rows))
