"""``repro train``'s configuration: one frozen, typed value, made once from the options, that checks itself.

torchtitan's habit (its ``JobConfig``): the command line, and a DeepSpeed JSON file beside it, become one frozen
dataclass of sections -- the model, the parallelism, the training, the optimizer and its schedule, the data, the
checkpoints, the logging and the failure handling -- which every part of the run reads and nothing edits. Each field
is named after the option that sets it (``tp`` is ``--tp``, ``lr_warmup_iters`` is ``--lr-warmup-iters``), so a
refusal names what the user typed. Each rule is written once: a section checks its own fields, :class:`TrainConfig`
the rules across sections, and the rules it shares with the trainer's
:class:`~repro.training.settings.TrainSettings` come from :mod:`repro.training.rules`.

:mod:`repro.training.options` makes a config from the options, with ``dp`` and the vocabulary still open (None)
where the launch or the corpus decides them; :meth:`TrainConfig.replaced` then fills them in, checked again. The
trainer's two inputs come from here, each built in one place: :meth:`TrainConfig.gpt_config` (the model) and
:meth:`TrainConfig.train_settings` (how to train).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from repro.models.config import GPTConfig
from repro.training.failfast import ON_NAN, UsageError
from repro.training.rules import (
    check_fp16_zero, check_lr_floor, check_warmup_within_decay, check_zero_matches, check_zero_pipeline,
)
from repro.training.schedule import DECAY_STYLES
from repro.training.settings import PRECISIONS, TrainSettings
from repro.zero.config import ZeroConfig, check_stage

#: the longest --timeout-s / --watchdog-s: beyond it, a timedelta or a C++ timeout overflows
MAX_WAIT_S = 30 * 24 * 3600.0
#: the shortest: below a second no rendezvous, collective or heartbeat can complete, and every rank would report a hang
MIN_WAIT_S = 1.0
#: the most --eval-iters: global batches per validation (a validation is not cut short but by a preemption signal)
MAX_EVAL_ITERS = 100_000
#: --vocab of the synthetic data when none is given
SYNTHETIC_VOCAB = 256
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(UsageError):
    """A configuration that breaks a rule: on the command line, one line naming the options and exit code 2."""


def option(name: str) -> str:
    """The option that sets a field: ``lr_warmup_iters`` -> ``--lr-warmup-iters``."""
    return "--" + name.replace("_", "-")


def as_option(name: str, value: object) -> str:
    """The command line's words for a setting (:data:`repro.training.rules.Say`): ``--zero-stage 2``."""
    return f"{option(name)} {value}"


def _one_of(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{option(name)} {value!r} must be one of {', '.join(map(str, choices))}")


@dataclass(frozen=True)
class ModelConfig:
    """The GPT's shape (Megatron-LM's names on the command line: --num-layers, --hidden-size, ...)."""

    layers: int = 4
    hidden: int = 64
    heads: int = 4
    #: None until resolved: the --data corpus's vocab_size (SYNTHETIC_VOCAB for synthetic data)
    vocab: int | None = None
    seq_len: int = 32
    #: both dropouts (--dropout), unless Megatron's --hidden-dropout / --attention-dropout set one apart
    dropout: float = 0.0
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    make_vocab_size_divisible_by: int = 128

    def dropouts(self) -> dict[str, float]:
        """The GPT's two dropout probabilities: each its own option's, else --dropout's."""
        return {name: self.dropout if getattr(self, name) is None else getattr(self, name)
                for name in ("hidden_dropout", "attention_dropout")}


@dataclass(frozen=True)
class ParallelismConfig:
    """The layout tp x pp x dp (MT-NLG sec. 2.4) and the data-parallel optimizer (ZeRO sec. 5)."""

    tp: int = 1
    pp: int = 1
    #: None until resolved: world size / (tp x pp)
    dp: int | None = None
    zero_stage: int = 0
    #: a DeepSpeed config's ZeRO settings (buckets, offload tiers); its stage is zero_stage
    zero: ZeroConfig | None = None

    def __post_init__(self) -> None:
        try:
            check_stage(self.zero_stage, option("zero_stage"))
        except ValueError as err:
            raise ConfigError(str(err)) from None


@dataclass(frozen=True)
class TrainingConfig:
    """What a step is: the batch (global = micro-batch size x micro-batches x dp), the precision, recomputation."""

    steps: int = 20
    micro_batches: int = 4
    micro_batch_size: int = 2
    #: Megatron's --global-batch-size; None until resolved, where it sets micro_batches
    global_batch_size: int | None = None
    precision: str = "fp32"
    activation_checkpointing: bool = False
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("device", self.device, DEVICES)


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW and its learning-rate schedule (:class:`~repro.training.schedule.LRSchedule`)."""

    lr: float = 1e-3
    min_lr: float = 0.0
    lr_warmup_iters: int = 0
    #: None: --steps
    lr_decay_iters: int | None = None
    lr_decay_style: str = "constant"
    weight_decay: float = 0.0
    #: 0: no clipping
    clip_grad: float = 1.0

    def __post_init__(self) -> None:
        _one_of("lr_decay_style", self.lr_decay_style, DECAY_STYLES)


@dataclass(frozen=True)
class DataConfig:
    """The training corpus, and the held-out one with how often and how much of it to evaluate."""

    data: str = "synthetic"
    valid_data: str | None = None
    eval_interval: int | None = None
    eval_iters: int = 2

    def __post_init__(self) -> None:
        if self.eval_iters > MAX_EVAL_ITERS:
            raise ConfigError(f"--eval-iters {self.eval_iters} must be at most {MAX_EVAL_ITERS:,} (global batches "
                              "per validation)")
        if self.valid_data is not None and self.eval_interval is None:
            raise ConfigError(f"--valid-data {self.valid_data} needs --eval-interval N (how often to evaluate)")
        if self.eval_interval is not None and self.valid_data is None and self.data != "synthetic":
            raise ConfigError(f"--eval-interval {self.eval_interval} needs --valid-data PREFIX with --data "
                              f"{self.data} (held-out samples come from the synthetic data only): give a validation "
                              "corpus, or leave it out")


@dataclass(frozen=True)
class CheckpointConfig:
    """Where checkpoints go and come from (:mod:`repro.training.checkpoint`)."""

    save: str | None = None
    save_interval: int | None = None
    load: str | None = None
    overwrite_checkpoints: bool = False

    def __post_init__(self) -> None:
        if self.save_interval is not None and self.save is None:
            raise ConfigError(f"--save-interval {self.save_interval} needs --save DIR (where to write the "
                              "checkpoints)")


@dataclass(frozen=True)
class LoggingConfig:
    """The printed lines, the JSON lines, TensorBoard and W&B (group and entity: a DeepSpeed config's only)."""

    log_interval: int = 1
    log_jsonl: str | None = None
    tensorboard_dir: str | None = None
    wandb_project: str | None = None
    wandb_exp_name: str | None = None
    wandb_save_dir: str | None = None
    wandb_group: str | None = None
    wandb_entity: str | None = None

    def __post_init__(self) -> None:
        if self.wandb_project is None:
            for name in ("wandb_exp_name", "wandb_save_dir"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{option(name)} {getattr(self, name)!r} has no effect without --wandb-project "
                                      "(or a DeepSpeed config's wandb block): give one, or leave it out")


@dataclass(frozen=True)
class FailureConfig:
    """How long a rank waits, and what a non-finite loss does (:mod:`repro.training.failfast`)."""

    timeout_s: float = 30.0
    #: None: timeout_s + 10
    watchdog_s: float | None = None
    on_nan: str = "stop"

    def __post_init__(self) -> None:
        for name in ("timeout_s", "watchdog_s"):
            value = getattr(self, name)
            if value is not None and value > MAX_WAIT_S:
                raise ConfigError(f"{option(name)} {value:g} must be at most {MAX_WAIT_S:.0f} s (30 days)")
            if value is not None and value < MIN_WAIT_S:
                raise ConfigError(f"{option(name)} {value:g} must be at least {MIN_WAIT_S:g} s (a shorter wait "
                                  "reports a hang on every rank)")
        _one_of("on_nan", self.on_nan, ON_NAN)


#: the sections, as TrainConfig's fields name them
SECTIONS: dict[str, type] = {
    "model": ModelConfig, "parallelism": ParallelismConfig, "training": TrainingConfig,
    "optimizer": OptimizerConfig, "data": DataConfig, "checkpoint": CheckpointConfig, "logging": LoggingConfig,
    "failures": FailureConfig,
}


def _owners() -> dict[str, str]:
    """Each setting's section: a setting is one option, so its name is unique over the sections."""
    owners: dict[str, str] = {}
    for section, kind in SECTIONS.items():
        for item in fields(kind):
            if item.name in owners:
                raise TypeError(f"setting {item.name!r} is in both {owners[item.name]} and {section}")
            owners[item.name] = section
    return owners


#: setting name -> its section
OWNERS = _owners()


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``repro train`` is told, checked. ``deepspeed_config``: the file the ZeRO, batch and logging
    settings came from, if any (named in its refusals)."""

    model: ModelConfig = ModelConfig()
    parallelism: ParallelismConfig = ParallelismConfig()
    training: TrainingConfig = TrainingConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    data: DataConfig = DataConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    failures: FailureConfig = FailureConfig()
    deepspeed_config: str | None = None

    def __post_init__(self) -> None:
        parallel, training, optimizer = self.parallelism, self.training, self.optimizer
        try:
            check_zero_matches(parallel.zero_stage, parallel.zero, self._say)
            check_warmup_within_decay(optimizer.lr_warmup_iters, self.lr_decay_iters, self._say)
            check_lr_floor(optimizer.min_lr, optimizer.lr, self._say)
            check_zero_pipeline(parallel.zero_stage, parallel.pp, self._say)
            check_fp16_zero(training.precision, parallel.zero_stage, self._say)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.model.vocab is not None:  # the model's own rules (heads divide the hidden size, and tp)
            self.gpt_config()

    def _say(self, name: str, value: object) -> str:
        if name == "zero.dtype":  # a setting only a DeepSpeed file gives
            return f"--deepspeed-config {self.deepspeed_config} enables {value}"
        return as_option(name, value)

    # ---- made and remade from settings by name -----------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None = None, **more: Any) -> TrainConfig:
        """A config from settings named as the options' destinations (``{"tp": 2, "lr_warmup_iters": 10}``), each
        put in its section; the others keep their defaults."""
        values = {**(settings or {}), **more}
        unknown = set(values) - set(OWNERS) - {"deepspeed_config"}
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        parts: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for name, value in values.items():
            if name in OWNERS:
                parts[OWNERS[name]][name] = value
        return cls(**{section: SECTIONS[section](**part) for section, part in parts.items()},
                   deepspeed_config=values.get("deepspeed_config"))

    def settings(self) -> dict[str, Any]:
        """Every setting by name (the inverse of :meth:`from_settings`)."""
        values = {item.name: getattr(getattr(self, OWNERS[item.name]), item.name)
                  for section in SECTIONS.values() for item in fields(section)}
        return {**values, "deepspeed_config": self.deepspeed_config}

    def replaced(self, **changes: Any) -> TrainConfig:
        """This config with some settings changed (by name), checked again."""
        return TrainConfig.from_settings({**self.settings(), **changes})

    # ---- what the run reads --------------------------------------------------------------------------------------

    @property
    def lr_decay_iters(self) -> int:
        """Where the decay reaches --min-lr: --lr-decay-iters, else --steps."""
        given = self.optimizer.lr_decay_iters
        return given if given is not None else self.training.steps

    @property
    def log_jsonl(self) -> str | None:
        """The JSON-lines log: --log-jsonl, else DIR/log.jsonl with --save DIR, else none."""
        save = self.checkpoint.save
        return self.logging.log_jsonl or (str(Path(save) / "log.jsonl") if save else None)

    def gpt_config(self) -> GPTConfig:
        """The GPT the options describe, checked against tp; the vocabulary must be known (resolved)."""
        model, tp = self.model, self.parallelism.tp
        if model.vocab is None:
            raise ValueError("the vocabulary is not known yet: resolve it first (TrainConfig.replaced(vocab=...))")
        try:
            config = GPTConfig(vocab_size=model.vocab, hidden_size=model.hidden, num_layers=model.layers,
                               num_attention_heads=model.heads, max_position_embeddings=model.seq_len,
                               make_vocab_size_divisible_by=model.make_vocab_size_divisible_by, **model.dropouts())
            config.check_tensor_parallel(tp)
        except ValueError as err:
            raise ConfigError(f"--heads {model.heads} --hidden {model.hidden} --tp {tp}: {err}") from None
        return config

    def train_settings(self, device: str) -> TrainSettings:
        """How the trainer trains on ``device`` (this rank's, resolved from --device)."""
        model, parallel, training, optimizer = self.model, self.parallelism, self.training, self.optimizer
        return TrainSettings(
            steps=training.steps, micro_batches=training.micro_batches,
            micro_batch_size=training.micro_batch_size, seq_len=model.seq_len, lr=optimizer.lr,
            min_lr=optimizer.min_lr, lr_warmup=optimizer.lr_warmup_iters, lr_decay_iters=self.lr_decay_iters,
            lr_decay_style=optimizer.lr_decay_style, weight_decay=optimizer.weight_decay,
            clip_grad=optimizer.clip_grad or None, zero_stage=parallel.zero_stage, seed=training.seed,
            device=device, precision=training.precision,
            activation_checkpointing=training.activation_checkpointing,
            zero=parallel.zero if parallel.zero is not None and parallel.zero_stage > 0 else None,
        )

    def arguments(self) -> dict[str, Any]:
        """Every setting as JSON values (the ZeRO settings as a dict), for the arguments block and train_args.json."""
        values = self.settings()
        values["zero"] = dataclasses.asdict(self.parallelism.zero) if self.parallelism.zero is not None else None
        return values
