"""The learning-rate schedule of Megatron-LM / MT-NLG: linear warm-up, then linear or cosine decay to a floor.

MT-NLG sec. 3.2: "the learning rate is linearly warmed up ... then decayed with a cosine schedule to 10% of its
value"; Megatron-LM sec. 5 uses warm-up then cosine (GPT-2) or linear (BERT) decay. The schedule is a pure function
of the iteration, so a resumed run needs only the iteration to continue it (it is saved anyway, with its settings,
so that a resume with different settings is noticed).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from repro.training.rules import check_lr_floor, check_warmup_within_decay, renamed

DECAY_STYLES = ("constant", "linear", "cosine")
#: the rules' names (repro train's options) for this class's fields
_FIELDS = renamed({"lr": "max_lr", "lr_warmup_iters": "warmup", "lr_decay_iters": "decay_iters"})


@dataclass(frozen=True)
class LRSchedule:
    """``lr(iteration)`` for iterations 0, 1, ...: ``warmup`` steps rising linearly to ``max_lr`` (iteration ``i``
    of the warm-up uses ``max_lr (i + 1) / warmup``), then ``decay_style`` from ``max_lr`` to ``min_lr`` over the
    remaining ``decay_iters - warmup`` iterations, ``min_lr`` afterwards."""

    max_lr: float
    min_lr: float = 0.0
    warmup: int = 0
    decay_iters: int | None = None
    decay_style: str = "constant"

    def __post_init__(self) -> None:
        if not self.max_lr > 0:
            raise ValueError(f"lr={self.max_lr} must be positive")
        if not self.min_lr >= 0:
            raise ValueError(f"min_lr={self.min_lr} must be >= 0")
        check_lr_floor(self.min_lr, self.max_lr, _FIELDS)
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup={self.warmup!r} must be a non-negative integer of iterations")
        if self.decay_style not in DECAY_STYLES:
            raise ValueError(f"decay_style={self.decay_style!r} must be one of {', '.join(DECAY_STYLES)}")
        if self.decay_iters is not None and not isinstance(self.decay_iters, int):
            raise ValueError(f"decay_iters={self.decay_iters!r} must be an integer of iterations")
        check_warmup_within_decay(self.warmup, self.decay_iters, _FIELDS)

    def lr(self, iteration: int) -> float:
        if iteration < self.warmup:
            return self.max_lr * (iteration + 1) / self.warmup
        if self.decay_style == "constant" or self.decay_iters is None:
            return self.max_lr
        span = self.decay_iters - self.warmup
        if span == 0 or iteration >= self.decay_iters:
            return self.min_lr
        progress = (iteration - self.warmup) / span
        if self.decay_style == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + (self.max_lr - self.min_lr) * factor

    def state_dict(self) -> dict:
        return asdict(self)
