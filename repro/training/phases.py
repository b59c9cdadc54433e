"""Where a training step's time goes: device time between marks set around its phases (forward, loss, backward,
optimizer), CUDA events on a GPU (the device's timeline, idle gaps included), the host clock elsewhere.

``with PhaseMarks(device, trainer) as marks: trainer.step_lazy(batch)`` then ``marks.milliseconds()``. The phases are
found by wrapping, for the block's duration, :meth:`GPTModel.hidden_states`, :meth:`GPTModel.output_loss`,
``torch.autograd.backward`` (the pipeline engine's backward call) and the trainer's ``optimizer.step``.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

PHASES = (("forward", "GPTModel.hidden_states"), ("loss", "GPTModel.output_loss"),
          ("backward", "torch.autograd.backward"), ("optimizer", "optimizer.step"))


class PhaseMarks:
    def __init__(self, device: torch.device, trainer: Any) -> None:
        from repro.models.gpt import GPTModel

        self.device = device
        self.targets = {"forward": (GPTModel, "hidden_states"), "loss": (GPTModel, "output_loss"),
                        "backward": (torch.autograd, "backward"), "optimizer": (trainer.optimizer, "step")}
        self.marks: list[tuple[str, bool, Any]] = []  # (phase, is_start, event or seconds)
        self._saved: list[tuple[Any, str, Any, bool]] = []

    def _mark(self, phase: str, start: bool) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((phase, start, event))
        else:
            self.marks.append((phase, start, time.perf_counter()))

    def __enter__(self) -> "PhaseMarks":
        for phase, (owner, name) in self.targets.items():
            original = getattr(owner, name)
            own = name in vars(owner) if not isinstance(owner, type) else True

            def wrapped(*args, _original=original, _phase=phase, **kwargs):
                self._mark(_phase, True)
                try:
                    return _original(*args, **kwargs)
                finally:
                    self._mark(_phase, False)

            self._saved.append((owner, name, original, own))
            setattr(owner, name, functools.wraps(original)(wrapped))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original, own in reversed(self._saved):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the instance had the class's method: drop the wrapper
        self._saved.clear()

    def milliseconds(self) -> dict[str, float]:
        """Summed milliseconds per phase (a phase entered several times: once per micro-batch), and ``step``: from
        the first mark to the last."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

        def between(a: Any, b: Any) -> float:
            return a.elapsed_time(b) if self.device.type == "cuda" else 1e3 * (b - a)

        totals: dict[str, float] = {phase: 0.0 for phase, _ in PHASES}
        open_at: dict[str, Any] = {}
        for phase, start, stamp in self.marks:
            if start:
                open_at.setdefault(phase, stamp)
            elif phase in open_at:
                totals[phase] += between(open_at.pop(phase), stamp)
        if self.marks:
            totals["step"] = between(self.marks[0][2], self.marks[-1][2])
        return totals
