"""The 1F1B (PipeDream-flush) schedule as data: the ordered list of actions each stage runs in one step.

Narayanan et al. 2021 (sec. 2.2.1, Fig. 4 top), used by MT-NLG (sec. 2.4): stage ``r`` of ``p`` first runs
``min(p - r - 1, m)`` warm-up forwards, then alternates one forward and one backward (the steady state), then
drains the remaining backwards (cool-down). A stage therefore keeps at most ``p - r`` micro-batches of
activations alive, instead of the ``m`` of GPipe, while the pipeline bubble stays the same:

    bubble fraction = (p - 1) / (m + p - 1)         (idle time / step time, equal forward/backward work)

i.e. ``(p - 1) / m`` of the ideal (bubble-free) time, the form the papers quote.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.pipeline.partition import check_micro_batches

FORWARD = "forward"
BACKWARD = "backward"


@dataclass(frozen=True)
class Action:
    """Run the forward or backward pass of micro-batch ``micro_batch`` on this stage."""

    kind: str  # FORWARD | BACKWARD
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind[0].upper()}{self.micro_batch}"


def one_f_one_b(pp_rank: int, pp_size: int, num_micro_batches: int) -> tuple[Action, ...]:
    """The actions of stage ``pp_rank`` in one 1F1B step, in order (``F0 F1 B0 F2 B1 ... B(m-1)``)."""
    check_micro_batches(num_micro_batches, pp_size)
    if not isinstance(pp_rank, int) or not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank={pp_rank!r} is outside [0, pp_size={pp_size})")
    warmup = min(pp_size - pp_rank - 1, num_micro_batches)
    steady = num_micro_batches - warmup
    actions = [Action(FORWARD, i) for i in range(warmup)]
    for i in range(steady):
        actions += [Action(FORWARD, warmup + i), Action(BACKWARD, i)]
    actions += [Action(BACKWARD, i) for i in range(steady, num_micro_batches)]
    return tuple(actions)


def max_in_flight(actions: tuple[Action, ...]) -> int:
    """Most micro-batches whose activations a stage holds at once (forwarded, not yet backwarded)."""
    alive = peak = 0
    for action in actions:
        alive += 1 if action.kind == FORWARD else -1
        peak = max(peak, alive)
    return peak


def bubble_fraction(pp_size: int, num_micro_batches: int) -> float:
    """Idle share of a 1F1B step with equal per-stage work: ``(p - 1) / (m + p - 1)``."""
    check_micro_batches(num_micro_batches, pp_size)
    return (pp_size - 1) / (num_micro_batches + pp_size - 1)
