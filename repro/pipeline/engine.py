"""Run one training step of a pipeline stage under the 1F1B schedule (Narayanan et al. 2021 sec. 2.2.1).

The engine knows nothing about transformers: a stage is two callables,

* ``forward_fn(x, i) -> y``: this stage's part of the model on micro-batch ``i`` (``x`` is the stage input: the
  micro-batch's data on the first stage, the received activation elsewhere);
* ``loss_fn(y, i) -> scalar``: on the last stage only, the loss to back-propagate for micro-batch ``i`` (already
  scaled, e.g. by 1/m, so that gradients accumulate to the mean over the batch).

Per action of :func:`~repro.pipeline.schedule.one_f_one_b`:
forward ``i`` = receive the activation (unless first), run ``forward_fn``, send the output (unless last) or compute
the loss (last); backward ``i`` = receive the output gradient (unless last), back-propagate, send the input gradient
(unless first). Gradients accumulate in ``.grad`` over the micro-batches; the caller reduces and steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from repro.dist.comm import CommGroup
from repro.pipeline.p2p import P2PChannel
from repro.pipeline.schedule import FORWARD, one_f_one_b
from repro.pipeline.timeline import StageEvent

ForwardFn = Callable[[torch.Tensor, int], torch.Tensor]
LossFn = Callable[[torch.Tensor, int], torch.Tensor]


@dataclass
class StepResult:
    """What one stage saw in one step. ``losses`` (last stage only): each micro-batch's ``loss_fn`` value, a detached
    0-dim tensor where it was computed (reading it is the caller's host sync, not the schedule's)."""

    losses: list[torch.Tensor] = field(default_factory=list)
    events: list[StageEvent] = field(default_factory=list)
    recv_wait_s: float = 0.0
    wall_s: float = 0.0


def run_1f1b(
    *,
    forward_fn: ForwardFn,
    loss_fn: LossFn,
    inputs: Sequence[torch.Tensor] | None,
    num_micro_batches: int,
    activation_shape: Sequence[int],
    pp_group: CommGroup,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    on_action: Callable[[str, int], None] | None = None,
) -> StepResult:
    """Forward and backward ``num_micro_batches`` micro-batches through this stage; return losses and timings.

    ``inputs`` (first stage only) holds one tensor per micro-batch. ``activation_shape`` is the shape of the
    tensor passed between stages (``[micro_batch, seq, hidden]`` for GPT), the same for activations and their
    gradients. ``on_action(kind, i)`` is called before each action (a heartbeat for watchdogs, or fault tests).
    """
    channel = P2PChannel(pp_group)
    stage = pp_group.rank
    if channel.is_first and (inputs is None or len(inputs) != num_micro_batches):
        got = None if inputs is None else len(inputs)
        raise ValueError(f"the first stage needs {num_micro_batches} micro-batch inputs, got {got}")
    device = torch.device(device)
    saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}  # i -> (stage input, output or loss)
    result = StepResult()
    step_start = time.perf_counter()
    for action in one_f_one_b(stage, pp_group.size, num_micro_batches):
        i = action.micro_batch
        if on_action is not None:
            on_action(action.kind, i)
        if action.kind == FORWARD:
            if channel.is_first:
                x, stage_input = inputs[i], None
            else:
                x = channel.recv_forward(activation_shape, dtype, device).requires_grad_(True)
                stage_input = x
            start = time.perf_counter()
            y = forward_fn(x, i)
            if channel.is_last:
                y = loss_fn(y, i)
                result.losses.append(y.detach())
            result.events.append(StageEvent(stage, action.kind, i, start, time.perf_counter()))
            if not channel.is_last:
                channel.send_forward(y)
            saved[i] = (stage_input, y)
        else:
            stage_input, y = saved.pop(i)
            grad = None if channel.is_last else channel.recv_backward(activation_shape, dtype, device)
            start = time.perf_counter()
            torch.autograd.backward(y, grad_tensors=grad)
            result.events.append(StageEvent(stage, action.kind, i, start, time.perf_counter()))
            if not channel.is_first:
                channel.send_backward(stage_input.grad)
    channel.wait_sends()
    result.recv_wait_s = channel.recv_wait_s
    result.wall_s = time.perf_counter() - step_start
    return result


@dataclass(frozen=True)
class Schedule1F1B:
    """The 1F1B schedule of one stage, fixed once for a run (what the trainer's ``apply_pipeline`` returns):
    ``num_micro_batches`` per step, the ``activation_shape`` passed between stages, over ``pp_group``."""

    num_micro_batches: int
    activation_shape: tuple[int, ...]
    pp_group: CommGroup
    device: torch.device

    def step(self, forward_fn: ForwardFn, loss_fn: LossFn, inputs: Sequence[torch.Tensor] | None, *,
             on_action: Callable[[str, int], None] | None = None) -> StepResult:
        """:func:`run_1f1b` of one step: ``inputs`` on the first stage, None elsewhere."""
        return run_1f1b(forward_fn=forward_fn, loss_fn=loss_fn, inputs=inputs,
                        num_micro_batches=self.num_micro_batches, activation_shape=self.activation_shape,
                        pp_group=self.pp_group, device=self.device, on_action=on_action)
