"""The command line, and a DeepSpeed JSON file beside it, made into one :class:`~repro.training.config.TrainConfig`.

The parsed options are read, never changed. Two sources may set one thing: a DeepSpeed file's ZeRO stage, gradient
clipping, batch keys and monitor blocks are honoured, and an option the command line gives too must agree with the
file (else one of them would be ignored without a word). What only the launch decides (dp, and with it a DeepSpeed
or Megatron global batch) is filled in by :func:`resolve_batch` once the launch is known.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any, Mapping, Sequence

from repro.training.config import OWNERS, SYNTHETIC_VOCAB, TrainConfig, option
from repro.training.failfast import UsageError
from repro.training.megatron_names import resolve_global_batch

#: options that do nothing unless --lr-decay-style decays (refused, not ignored)
DECAY_OPTIONS = ("lr_decay_iters", "min_lr")


def explicit_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> frozenset[str]:
    """The destinations the command line gave (not the defaults): parsed again with every default suppressed. An
    option given twice keeps its last value, as argparse and Megatron-LM do: scripts override a base command line by
    appending, and slurm/launch.sh appends --load on a requeue."""
    probe = copy.deepcopy(parser)
    for action in probe._actions:  # argparse keeps no record of which values were defaults
        action.default = argparse.SUPPRESS
    return frozenset(vars(probe.parse_args(argv)))


def config_from_options(options: Mapping[str, Any], given: frozenset[str] = frozenset(),
                        deepspeed=None) -> TrainConfig:
    """The config the options say (``options``: the parsed command line by destination, ``given``: those the
    command line gave rather than defaulted), with the DeepSpeed file's settings (``deepspeed``: what
    :func:`repro.training.argcheck.read_deepspeed_config` read, or None) honoured. dp stays open, and so does the
    vocabulary of a corpus; a :class:`~repro.training.config.ConfigError` names a rule broken."""
    unknown = set(options) - set(OWNERS) - {"deepspeed_config"}
    if unknown:  # an option added to the parser without its setting in the config
        raise TypeError(f"options without a setting in TrainConfig: {', '.join(sorted(unknown))}")
    values = dict(options)
    if options.get("lr_decay_style", "constant") == "constant":
        for name in DECAY_OPTIONS:
            if name in given:
                raise UsageError(f"{option(name)} {options[name]} has no effect with --lr-decay-style constant (the "
                                 "default): choose a decay style, or leave it out")
    if deepspeed is not None:
        values.update(_deepspeed_settings(values, given, deepspeed))
    if values.get("vocab") is None and values.get("data", "synthetic") == "synthetic":
        values["vocab"] = SYNTHETIC_VOCAB
    return TrainConfig.from_settings(values)


def _agree(values: Mapping[str, Any], given: frozenset[str], name: str, value, source: str) -> None:
    """An option given on the command line that the DeepSpeed config sets too must have the config's value:
    otherwise one of them would be ignored without a word."""
    if name in given and values[name] != value:
        raise UsageError(f"{option(name)} {values[name]} contradicts --deepspeed-config {values['deepspeed_config']}: "
                         f"its {source} make it {value}; drop one of them")


def _deepspeed_settings(values: Mapping[str, Any], given: frozenset[str], deepspeed) -> dict[str, Any]:
    """The settings a DeepSpeed file sets: its ZeRO block and clipping, its monitors' directory, project and
    interval (each checked against the same option given on the command line)."""
    zero, _, monitors = deepspeed
    changes: dict[str, Any] = {}
    for name, value, source in (("tensorboard_dir", monitors.tensorboard_dir, "tensorboard block"),
                                ("wandb_project", monitors.wandb_project, "wandb block"),
                                ("log_interval", monitors.log_interval, "steps_per_print")):
        if value is not None:
            _agree(values, given, name, value, source)
            changes[name] = value
    changes.update(wandb_group=monitors.wandb_group, wandb_entity=monitors.wandb_entity)
    _agree(values, given, "zero_stage", zero.stage, "zero_optimization.stage")
    changes.update(zero_stage=zero.stage, zero=zero)
    if zero.max_grad_norm is not None:
        _agree(values, given, "clip_grad", zero.max_grad_norm, "gradient_clipping")
        changes["clip_grad"] = zero.max_grad_norm
    return changes


def resolve_batch(config: TrainConfig, *, dp: int, given: frozenset[str] = frozenset(), batch=None) -> TrainConfig:
    """``config`` with the launch's dp and the batch it makes: the DeepSpeed file's batch keys (``batch``, a
    :class:`~repro.zero.deepspeed_json.DeepSpeedBatch`, or None) and Megatron's --global-batch-size, each of which
    may set the micro-batch size and the micro-batches per step (the command line's, when given, must agree)."""
    training, settings = config.training, config.settings()
    size, steps, fixed_by = training.micro_batch_size, training.micro_batches, None
    if batch is not None:
        try:
            size, steps = batch.resolve(micro_batch_size=size, micro_batches=steps, dp=dp)
        except ValueError as err:
            raise UsageError(f"--deepspeed-config {config.deepspeed_config}: {err}") from None
        keys = "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps"
        _agree(settings, given, "micro_batch_size", size, f"batch keys ({keys}) with dp {dp}")
        _agree(settings, given, "micro_batches", steps, f"batch keys ({keys}) with dp {dp}")
        fixed_by = "--deepspeed-config's batch keys"
    elif "micro_batches" in given:
        fixed_by = "--micro-batches"
    steps, total = resolve_global_batch(training.global_batch_size, micro_batch_size=size, micro_batches=steps,
                                        dp=dp, fixed_by=fixed_by)
    return config.replaced(dp=dp, micro_batch_size=size, micro_batches=steps, global_batch_size=total)
