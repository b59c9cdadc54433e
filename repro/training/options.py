"""``repro train``'s command line (:func:`option_parser`), and a DeepSpeed JSON file beside it, made into one
:class:`~repro.training.config.TrainConfig`.

Each option's destination is the config setting it sets, and its default is the config's, so the two cannot drift
(:func:`config_from_options` refuses an option without a setting). The parsed options are read, never changed. Two sources may set one thing: a DeepSpeed file's ZeRO stage, gradient
clipping, batch keys and monitor blocks are honoured, and an option the command line gives too must agree with the
file (else one of them would be ignored without a word). What only the launch decides (dp, and with it a DeepSpeed
or Megatron global batch) is filled in by :func:`resolve_batch` once the launch is known.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any, Mapping, Sequence

from repro.cliargs import (
    OneLineParser, non_negative_float, non_negative_int, positive_float, positive_int, probability, seed,
)
from repro.training.config import DEVICES, OWNERS, PRECISIONS, SYNTHETIC_VOCAB, TrainConfig, option
from repro.training.failfast import ON_NAN, UsageError
from repro.training.megatron_names import add_megatron_options, names, resolve_global_batch
from repro.training.schedule import DECAY_STYLES
from repro.zero.config import STAGES

#: options that do nothing unless --lr-decay-style decays (refused, not ignored)
DECAY_OPTIONS = ("lr_decay_iters", "min_lr")


def option_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options of ``repro train``; each sets the setting of :class:`TrainConfig` named as its destination, and
    shows its default (the config's)."""
    parser = OneLineParser(prog=prog, description=description)
    default = TrainConfig().settings()
    _layout_options(parser, default)
    _model_options(parser, default)
    _training_options(parser, default)
    _data_options(parser, default)
    _logging_and_checkpoint_options(parser, default)
    _failure_options(parser, default)
    add_megatron_options(parser)
    return parser


def _layout_options(parser: argparse.ArgumentParser, default: Mapping[str, Any]) -> None:
    """The options of the group "layout"."""
    g = parser.add_argument_group("layout")
    g.add_argument(*names("--tp"), type=positive_int, default=default["tp"], help="tensor-parallel size")
    g.add_argument(*names("--pp"), type=positive_int, default=default["pp"], help="pipeline-parallel size (stages)")
    g.add_argument("--dp", type=positive_int, default=None, help="data-parallel size; default: world / (tp x pp)")
    g.add_argument("--zero-stage", type=int, default=default["zero_stage"], choices=STAGES,
                   help="0: all-reduce gradients (DDP); 1-3: ZeRO over dp (2 and 3 need --pp 1)")
    g.add_argument("--deepspeed-config", default=None, metavar="JSON",
                   help="a DeepSpeed config file: its zero_optimization (stage, bucket sizes, offload tiers), "
                        "gradient_clipping and batch keys are used (the stage in place of --zero-stage, the clipping "
                        "of --clip-grad, train_micro_batch_size_per_gpu of --micro-batch-size, "
                        "gradient_accumulation_steps of --micro-batches; train_batch_size must equal micro-batch "
                        "size x micro-batches x dp, or sets the one of them the file leaves out; an option also "
                        "given on the command line must agree with the file, else both are refused); every key is "
                        "checked for its name and type, "
                        "keys that would change the results unhonoured are refused (repro.zero.deepspeed_json); "
                        "default: none, the options below")
    g.add_argument("--device", default=default["device"], choices=DEVICES,
                   help="auto: the rank's GPU (LOCAL_RANK) when there is one, else the CPU")


def _model_options(parser: argparse.ArgumentParser, default: Mapping[str, Any]) -> None:
    """The options of the group "model"."""
    g = parser.add_argument_group("model")
    g.add_argument(*names("--layers"), type=positive_int, default=default["layers"], help="transformer layers")
    g.add_argument(*names("--hidden"), type=positive_int, default=default["hidden"], help="hidden size")
    g.add_argument(*names("--heads"), type=positive_int, default=default["heads"], help="attention heads")
    g.add_argument(*names("--vocab"), type=positive_int, default=None,
                   help="the model's vocabulary; every token id of --data and --valid-data must be below it "
                        "(default: 256 with synthetic data, else the vocab_size of the --data corpus's index, "
                        "GPT-2's 50257)")
    g.add_argument(*names("--seq-len"), type=positive_int, default=default["seq_len"], help="sequence length")
    g.add_argument("--dropout", type=probability, default=default["dropout"],
                   help="hidden and attention dropout probability, in [0, 1) (--hidden-dropout and "
                        "--attention-dropout set them apart)")


def _training_options(parser: argparse.ArgumentParser, default: Mapping[str, Any]) -> None:
    """The options of the group "training"."""
    g = parser.add_argument_group("training")
    g.add_argument(*names("--steps"), dest="steps", type=positive_int, default=default["steps"],
                   help="iterations to train in all (a resumed run continues up to this count)")
    g.add_argument("--micro-batches", type=positive_int, default=default["micro_batches"],
                   help="micro-batches per step per dp rank")
    g.add_argument("--micro-batch-size", type=positive_int, default=default["micro_batch_size"],
                   help="sequences per micro-batch")
    g.add_argument("--lr", type=positive_float, default=default["lr"], help="peak learning rate")
    g.add_argument("--min-lr", type=non_negative_float, default=default["min_lr"], help="floor of the decay")
    g.add_argument("--lr-warmup-iters", type=non_negative_int, default=default["lr_warmup_iters"],
                   help="linear warm-up iterations")
    g.add_argument("--lr-decay-iters", type=positive_int, default=None,
                   help="iteration where the decay reaches --min-lr; default: --steps")
    g.add_argument("--lr-decay-style", default=default["lr_decay_style"], choices=DECAY_STYLES,
                   help="decay after the warm-up")
    g.add_argument("--weight-decay", type=non_negative_float, default=default["weight_decay"],
                   help="AdamW's decoupled weight decay")
    g.add_argument("--clip-grad", type=non_negative_float, default=default["clip_grad"],
                   help="clip the global gradient norm to this (0: no clipping)")
    g.add_argument("--precision", default=default["precision"], choices=PRECISIONS,
                   help="autocast dtype over fp32 master weights (fp16 with dynamic loss scaling)")
    g.add_argument(*names("--activation-checkpointing"), action="store_true",
                   help="recompute each layer in backward (default: off, activations are kept)")
    g.add_argument("--seed", type=seed, default=default["seed"],
                   help="seed of the weights, dropout, synthetic data and corpus shuffling, in [0, 2**63)")


def _data_options(parser: argparse.ArgumentParser, default: Mapping[str, Any]) -> None:
    """The options of the group "data"."""
    g = parser.add_argument_group("data")
    g.add_argument(*names("--data"), default=default["data"],
                   help="'synthetic' (a learnable random corpus) or the prefix of a token file written by "
                        "python -m repro.training.corpus")
    g.add_argument(*names("--valid-data"), default=None,
                   help="prefix of the held-out token file; default: held-out synthetic samples (with --data "
                        "synthetic) or none")
    g.add_argument("--eval-interval", type=positive_int, default=None,
                   help="validation loss every this many iterations; default: none")
    g.add_argument("--eval-iters", type=positive_int, default=default["eval_iters"],
                   help="global batches per validation, at most 100,000 (a preemption signal stops a validation "
                        "between two of its batches)")


def _logging_and_checkpoint_options(parser: argparse.ArgumentParser, default: Mapping[str, Any]) -> None:
    """The options of the group "logging and checkpoints"."""
    g = parser.add_argument_group("logging and checkpoints")
    g.add_argument("--log-interval", type=positive_int, default=default["log_interval"],
                   help="iterations per printed log line")
    g.add_argument("--on-nan", choices=ON_NAN, default=default["on_nan"],
                   help="stop (default): a loss or gradient norm that is inf or NaN (not an fp16 step the loss scaler "
                        "skipped) stops the run with one line naming the iteration and exit code 3, before any "
                        "later save; the line names the newest checkpoint known good (its weights gave a finite "
                        "loss in the step after it) and how to resume from it; continue: log it and train on "
                        "(Megatron's 'number of nan iterations')")
    g.add_argument("--log-jsonl", default=None,
                   help="every iteration as one JSON line (appended); default: DIR/log.jsonl with --save DIR")
    g.add_argument("--tensorboard-dir", default=None,
                   help="TensorBoard scalars here (needs tensorboard; default: none, or the DeepSpeed config's "
                        "tensorboard block)")
    g.add_argument("--wandb-project", default=None,
                   help="log to this Weights & Biases project from rank 0 (needs wandb; WANDB_MODE=offline keeps "
                        "the run on disk; default: none, or the DeepSpeed config's wandb block)")
    g.add_argument("--wandb-exp-name", default=None,
                   help="the W&B run's name (default: the --save directory's name, else W&B's own)")
    g.add_argument("--wandb-save-dir", default=None,
                   help="the folder W&B makes its wandb/ folder in, as Megatron's (default: the --save DIR, so the "
                        "run lands in DIR/wandb/; without --save, W&B's ./wandb)")
    g.add_argument("--save", default=None, help="directory for checkpoints, held by this job for its life (the lock "
                   "file DIR/repro-train.lock: a second run is refused, naming the holder; a dead run's lock is taken "
                   "over); a save that cannot be written, e.g. on a full disk, stops the run with one line and exit "
                   "code 74, the previous checkpoint intact; default: no checkpoints")
    g.add_argument("--save-interval", type=positive_int, default=None,
                   help="checkpoint every this many iterations (and always at the end and on preemption; "
                        "default: only then)")
    g.add_argument("--load", default=None,
                   help="resume from the newest checkpoint in this directory, if any (default: start afresh)")
    g.add_argument("--overwrite-checkpoints", action="store_true",
                   help="save into a --save directory that holds another run's checkpoints without loading them "
                        "(its newest pointer then moves to this run's); default: refused, since that run could no "
                        "longer resume")


def _failure_options(parser: argparse.ArgumentParser, default: Mapping[str, Any]) -> None:
    """The options of the group "failure handling"."""
    g = parser.add_argument_group("failure handling")
    g.add_argument("--timeout-s", type=positive_float, default=default["timeout_s"],
                   help="seconds a rank waits for the others in a collective or receive of any process group (tp, "
                        "pp, dp, world; also the start-up rendezvous) before it exits with code 124 and one line "
                        "naming itself, what it was doing and the rank it waits for. A save or load waits at its "
                        "barriers for the slowest rank to write or read its own checkpoint file: set it above that "
                        "time for big models. A MASTER_ADDR that does not resolve is looked up again until then (DNS "
                        "may lag at a job's start), then exit code 124 with one line naming it. At least 1 s, at "
                        "most 30 days")
    g.add_argument("--watchdog-s", type=positive_float, default=None,
                   help="exit with code 124 when this rank makes no progress for this long in a step (each pipeline "
                        "action is a heartbeat), an evaluation (each batch), a save or a load (each file): catches "
                        "a hang that no collective times out; at least 1 s, at most 30 days; default: --timeout-s + 10")


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
        if batch.train_batch_size is not None or batch.micro_batches is not None:  # else they are the options'
            fixed_by = "--deepspeed-config's batch keys"
    if fixed_by is None and "micro_batches" in given:
        fixed_by = "--micro-batches"
    steps, total = resolve_global_batch(training.global_batch_size, micro_batch_size=size, micro_batches=steps,
                                        dp=dp, fixed_by=fixed_by)
    return config.replaced(dp=dp, micro_batch_size=size, micro_batches=steps, global_batch_size=total)
