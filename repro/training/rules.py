"""The rules across settings of a training run, each written once, and said in the words of whoever reads it.

The same rule guards a library call (``TrainSettings(zero_stage=2, ...)``, ``LRSchedule(...)``) and a command line
(``repro train --zero-stage 2 --pp 2``); the first reader knows fields (``zero_stage=2``), the second options
(``--zero-stage 2``). So each rule below takes a :data:`Say`, which names a setting and its value: the rule's text,
its reason and its way out exist once, and :class:`~repro.training.settings.TrainSettings`,
:class:`~repro.training.schedule.LRSchedule`, :func:`~repro.training.parallelize.check_layout` and
:class:`~repro.training.config.TrainConfig` all call it. A setting is named by its ``repro train`` option's
destination (``lr_warmup_iters``); :func:`renamed` maps those names to a dataclass's own field names.

Rules on one value alone (a positive count, a probability) belong to that value's type: the command line's
(:mod:`repro.cliargs`) and the dataclass's field check.
"""

from __future__ import annotations

from typing import Callable, Mapping

#: names a setting with its value, as its reader writes it: ``say("pp", 2)`` -> ``"pp=2"`` or ``"--pp 2"``
Say = Callable[[str, object], str]


def as_field(name: str, value: object) -> str:
    """A dataclass's words: ``zero_stage=2``."""
    return f"{name}={value!r}"


def renamed(names: Mapping[str, str], say: Say = as_field) -> Say:
    """``say`` with some settings called by another name (a dataclass whose field ``lr_warmup`` is the option
    ``--lr-warmup-iters``)."""
    return lambda name, value: say(names.get(name, name), value)


def check_zero_pipeline(zero_stage: int, pp: int, say: Say = as_field) -> None:
    """ZeRO sec. 5.2: stages 2 and 3 reduce-scatter each gradient as backward makes it; the pipeline sums the tied
    embedding's gradient over its first and last stage afterwards, which needs it whole (DeepSpeed refuses the
    same)."""
    if zero_stage >= 2 and pp > 1:
        raise ValueError(f"{say('zero_stage', zero_stage)} needs {say('pp', 1)} (ZeRO-2/3 shard gradients as "
                         f"backward makes them; the pipeline's tied embedding needs them whole), got {say('pp', pp)}")


def check_fp16_zero(precision: str, zero_stage: int, say: Say = as_field) -> None:
    """fp16 needs a loss scaler; the trainer has one for plain data parallelism, and its ZeRO stages keep their own
    fp32 states without one."""
    if precision == "fp16" and zero_stage != 0:
        raise ValueError(f"{say('precision', 'fp16')} needs {say('zero_stage', 0)} (the trainer's ZeRO stages have "
                         f"no loss scaler), got {say('zero_stage', zero_stage)}; use {say('precision', 'bf16')}")


def check_zero_matches(zero_stage: int, zero, say: Say = as_field) -> None:
    """A ZeRO config (:class:`~repro.zero.config.ZeroConfig`, a DeepSpeed file's) beside a stage: one stage, and
    fp32 parameters, since the trainer keeps fp32 masters and computes in its precision by autocast."""
    if zero is None:
        return
    if zero.stage != zero_stage:
        raise ValueError(f"the ZeRO config's stage {zero.stage} differs from {say('zero_stage', zero_stage)}")
    if zero.dtype != "fp32":
        raise ValueError(f"{say('zero.dtype', zero.dtype)}: the trainer keeps fp32 parameters and masters and "
                         f"computes in its precision by autocast; use {say('precision', zero.dtype)} and drop the "
                         "fp16/bf16 block")


def check_lr_floor(min_lr: float, lr: float, say: Say = as_field) -> None:
    """The decay ends at ``min_lr``, below the peak."""
    if min_lr > lr:
        raise ValueError(f"{say('min_lr', min_lr)} must be <= {say('lr', lr)}")


def check_warmup_within_decay(lr_warmup_iters: int, lr_decay_iters: int | None, say: Say = as_field) -> None:
    """The decay starts where the warm-up ends, so it ends no earlier (Megatron-LM's schedule)."""
    if lr_decay_iters is not None and lr_decay_iters < lr_warmup_iters:
        raise ValueError(f"{say('lr_decay_iters', lr_decay_iters)} must be >= "
                         f"{say('lr_warmup_iters', lr_warmup_iters)}")
