"""What ``repro train`` checks before any work, so that every rank refuses a bad command in one line (exit code 2)
before a process group exists: the options, paths and the DeepSpeed config here, then the launch variables, corpora,
memory and output paths (:mod:`repro.training.startcheck`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from repro.input_files import directory_problem, read_config, read_pointer, regular_file_problem
from repro.optional import available
from repro.paths import name_problem
from repro.training.checkpoint_kinds import describe_foreign
from repro.training.failfast import UsageError
from repro.training.megatron_names import resolve_global_batch

#: the longest --timeout-s / --watchdog-s: beyond it, a timedelta or a C++ timeout overflows
MAX_WAIT_S = 30 * 24 * 3600.0
#: the shortest: below a second no rendezvous, collective or heartbeat can complete, and every rank would report a hang
MIN_WAIT_S = 1.0
#: the most --eval-iters: global batches per validation (a validation is not cut short but by a preemption signal)
MAX_EVAL_ITERS = 100_000


def read_deepspeed_config(path: str):
    """(ZeRO settings, batch keys) of a DeepSpeed JSON file (a :class:`UsageError` names the file, key and rule)."""
    import json

    from repro.zero.config import ZeroConfig
    from repro.zero.deepspeed_json import deepspeed_batch, deepspeed_logging

    def unique(pairs: list[tuple[str, object]]) -> dict:
        seen: dict = {}
        for key, value in pairs:
            if key in seen:  # json.loads would keep the later one silently; DeepSpeed refuses the file
                raise UsageError(f"--deepspeed-config {path}: key {key!r} appears twice in one object")
            seen[key] = value
        return seen

    try:
        data = json.loads(read_config(path, what="--deepspeed-config", error=UsageError).decode("utf-8"),
                          object_pairs_hook=unique)
    except UsageError:
        raise  # not a regular file, or over the config cap (repro.input_files): its own line
    except OSError as err:
        raise UsageError(f"--deepspeed-config {path}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise UsageError(f"--deepspeed-config {path} is not UTF-8 text (byte {err.start}: {err.reason}); a "
                         "DeepSpeed config is a JSON file") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"--deepspeed-config {path} is not valid JSON ({err})") from None
    except RecursionError:
        raise UsageError(f"--deepspeed-config {path} nests its JSON too deeply to read (over "
                         f"{sys.getrecursionlimit()} levels); a DeepSpeed config is a few levels deep") from None
    except ValueError as err:  # an integer longer than Python converts (4300 digits)
        raise UsageError(f"--deepspeed-config {path} holds a number that cannot be read ({err}); a DeepSpeed "
                         "config's numbers are small") from None
    if not isinstance(data, dict):
        raise UsageError(f"--deepspeed-config {path} must hold a JSON object, holds {type(data).__name__}")
    try:
        return ZeroConfig.from_deepspeed(data), deepspeed_batch(data), deepspeed_logging(data)
    except ValueError as err:
        raise UsageError(f"--deepspeed-config {path}: {err}") from None


def checkpoint_dir_around(path: str | Path) -> Path | None:
    """The checkpoint (iteration) directory ``path`` is or lies in: the nearest folder holding a manifest."""
    from repro.zero.checkpoint import MANIFEST

    resolved = Path(path).resolve()
    for folder in (resolved, *resolved.parents):
        if (folder / MANIFEST).is_file():
            return folder
    return None


def _loads_from(load: str | None, save: Path) -> bool:
    """Whether ``--load`` resumes the run of ``--save``: the directory itself, or one of its iteration directories."""
    from repro.zero.checkpoint import MANIFEST

    if load is None:
        return False
    loaded = Path(load).resolve()
    return loaded == save.resolve() or (loaded.parent == save.resolve() and (loaded / MANIFEST).is_file())


def _check_save_belongs_to_this_run(args: argparse.Namespace) -> None:
    """A checkpoint directory belongs to one run: saving into one that holds checkpoints this run does not load
    would move its newest pointer to another model, and its own run could not resume (a --load typo, a changed
    --hidden). Refused unless --overwrite-checkpoints. A save inside an iteration directory is always refused."""
    from repro.training.checkpoint import LATEST

    if args.save is None:
        return
    inside = checkpoint_dir_around(args.save)
    if inside is not None:
        raise UsageError(f"--save {args.save} is inside the checkpoint (iteration) directory {inside}: save into the "
                         f"directory that holds the iter_* directories, e.g. --save {inside.parent}")
    pointer = Path(args.save) / LATEST
    if not os.path.lexists(pointer):
        return
    newest = read_pointer(pointer, what=f"--save {args.save}: its pointer", error=UsageError)
    if args.overwrite_checkpoints or _loads_from(args.load, Path(args.save)):
        return  # resuming the run that wrote them, or told to take the directory over
    newest = newest.strip()[:20].decode("utf-8", "replace")
    raise UsageError(f"--save {args.save} holds another run's checkpoints (newest: iteration {newest}) and this run "
                     f"does not load them: resume it with --load {args.save}, save elsewhere, or pass "
                     f"--overwrite-checkpoints")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return a.resolve() == b.resolve()


def _check_logs_are_not_inputs(args: argparse.Namespace) -> None:
    """--log-jsonl is appended to: it must not be a file the run reads (a corpus, the DeepSpeed config, a
    checkpoint's file), and --tensorboard-dir must not lie in a checkpoint's iteration directory."""
    if args.tensorboard_dir is not None and (inside := checkpoint_dir_around(args.tensorboard_dir)) is not None:
        raise UsageError(f"--tensorboard-dir {args.tensorboard_dir} is inside the checkpoint directory {inside}: "
                         "TensorBoard files must go elsewhere")
    if args.log_jsonl is None:
        return
    target = Path(args.log_jsonl)
    inputs = [("--deepspeed-config", Path(args.deepspeed_config))] if args.deepspeed_config else []
    for option, prefix in (("--data", args.data), ("--valid-data", args.valid_data)):
        if prefix not in (None, "synthetic"):
            inputs += [(f"{option} {prefix}", Path(f"{prefix}{suffix}")) for suffix in (".bin", ".idx.json")]
    for what, path in inputs:
        if _same_file(target, path):
            raise UsageError(f"--log-jsonl {args.log_jsonl} is the input file {path} of {what}: the log is appended "
                             "to and would destroy it; log to another file")
    for option, folder in (("--load", args.load), ("--save", args.save)):
        if folder is None:
            continue
        root = Path(folder).resolve()
        if target.resolve().is_relative_to(root) and target.resolve() != root / "log.jsonl":
            raise UsageError(f"--log-jsonl {args.log_jsonl} lies in the checkpoint directory {option} {folder}, "
                             f"whose files are checkpoints: the only log there is {root / 'log.jsonl'} (the default "
                             "with --save); log elsewhere")
    if (inside := checkpoint_dir_around(target)) is not None:
        raise UsageError(f"--log-jsonl {args.log_jsonl} is inside the checkpoint directory {inside}: log elsewhere")


def _agrees(args: argparse.Namespace, option: str, value, source: str) -> None:
    """An option given on the command line that the DeepSpeed config sets too must have the config's value:
    otherwise one of them would be ignored without a word."""
    name = option[2:].replace("-", "_")
    if name in getattr(args, "explicit", ()) and getattr(args, name) != value:
        raise UsageError(f"{option} {getattr(args, name)} contradicts --deepspeed-config {args.deepspeed_config}: "
                         f"its {source} make it {value}; drop one of them")


def explicit_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> frozenset[str]:
    """The destinations the command line gave (not the defaults): parsed again with every default suppressed. An
    option given twice keeps its last value, as argparse and Megatron-LM do: scripts override a base command line by
    appending, and slurm/launch.sh appends --load on a requeue."""
    import copy

    probe = copy.deepcopy(parser)
    for action in probe._actions:  # argparse keeps no record of which values were defaults
        action.default = argparse.SUPPRESS
    return frozenset(vars(probe.parse_args(argv)))


def _check_no_effect(args: argparse.Namespace) -> None:
    """Options that would do nothing with the others given: refused, not ignored."""
    explicit = getattr(args, "explicit", frozenset())
    if args.lr_decay_style == "constant":
        for option in ("--lr-decay-iters", "--min-lr"):
            if option[2:].replace("-", "_") in explicit:
                raise UsageError(f"{option} {getattr(args, option[2:].replace('-', '_'))} has no effect with "
                                 "--lr-decay-style constant (the default): choose a decay style, or leave it out")
    if args.wandb_project is None:
        for option in ("--wandb-exp-name", "--wandb-save-dir"):
            if option[2:].replace("-", "_") in explicit:
                raise UsageError(f"{option} {getattr(args, option[2:].replace('-', '_'))!r} has no effect without "
                                 "--wandb-project (or a DeepSpeed config's wandb block): give one, or leave it out")
    if args.eval_interval is not None and args.valid_data is None and args.data != "synthetic":
        raise UsageError(f"--eval-interval {args.eval_interval} needs --valid-data PREFIX with --data {args.data} "
                         "(held-out samples come from the synthetic data only): give a validation corpus, or leave "
                         "it out")


#: the options that name a directory, and those that name a file the run reads (prefixes: the corpus's two files)
DIRECTORY_OPTIONS = ("--save", "--load", "--tensorboard-dir", "--wandb-save-dir")
FILE_OPTIONS = ("--deepspeed-config",)
CORPUS_OPTIONS = ("--data", "--valid-data")


def _check_path_kinds(args: argparse.Namespace) -> None:
    """Every path of the command line is what it must be, or absent (made, or refused, later): a directory for
    --save, --load and the log directories, a regular file for the DeepSpeed config and each corpus file; a FIFO, a
    device, a socket or a symlink loop is refused here, before anything blocks on it or reads it forever."""
    for option in DIRECTORY_OPTIONS + FILE_OPTIONS + CORPUS_OPTIONS:
        value = getattr(args, option[2:].replace("-", "_"), None)
        if value is None or (option in CORPUS_OPTIONS and value == "synthetic"):
            continue
        if option in DIRECTORY_OPTIONS:
            checks = [(value, directory_problem(value, missing_ok=True))]
        elif option in FILE_OPTIONS:
            checks = [(value, regular_file_problem(value))]
        else:
            checks = [(f"{value}{suffix}", regular_file_problem(f"{value}{suffix}", missing_ok=True))
                      for suffix in (".idx.json", ".bin")]
        for path, problem in checks:
            if problem is not None:
                named = "" if path == value else f" ({path!r})"
                raise UsageError(f"{option} {value!r}{named} {problem}")


def check_args(args: argparse.Namespace) -> None:
    """Everything that needs no process group, so every rank refuses a bad command before it starts (exit code 2,
    one line): the options, the DeepSpeed config, then (:mod:`repro.training.startcheck`) the launch variables, the
    corpora against the vocabulary, the model against the device's memory, and the output paths."""
    from repro.training import startcheck

    for option, value in (("--timeout-s", args.timeout_s), ("--watchdog-s", args.watchdog_s)):
        if value is not None and value > MAX_WAIT_S:
            raise UsageError(f"{option} {value:g} must be at most {MAX_WAIT_S:.0f} s (30 days)")
        if value is not None and value < MIN_WAIT_S:
            raise UsageError(f"{option} {value:g} must be at least {MIN_WAIT_S:g} s (a shorter wait reports a hang "
                             "on every rank)")
    for option in ("--save", "--load", "--log-jsonl", "--tensorboard-dir", "--data", "--valid-data",
                   "--deepspeed-config"):
        value = getattr(args, option[2:].replace("-", "_"), None)
        # '' would mean the current directory, or nothing; a name too long fails at the first stat
        problem = None if value is None or value == "synthetic" else name_problem(value)
        if problem is not None:
            raise UsageError(f"{option} {value!r} {problem}")
    _check_path_kinds(args)
    args.zero, batch = None, None
    args.wandb_group = args.wandb_entity = None
    if args.deepspeed_config is not None:
        args.zero, batch, monitors = read_deepspeed_config(args.deepspeed_config)
        for option, value, source in (("--tensorboard-dir", monitors.tensorboard_dir, "tensorboard block"),
                                      ("--wandb-project", monitors.wandb_project, "wandb block"),
                                      ("--log-interval", monitors.log_interval, "steps_per_print")):
            if value is not None:  # honoured: the file's value, unless the command line says otherwise
                _agrees(args, option, value, source)
                setattr(args, option[2:].replace("-", "_"), value)
        args.wandb_group, args.wandb_entity = monitors.wandb_group, monitors.wandb_entity
        _agrees(args, "--zero-stage", args.zero.stage, "zero_optimization.stage")
        args.zero_stage = args.zero.stage
        if args.zero.max_grad_norm is not None:
            _agrees(args, "--clip-grad", args.zero.max_grad_norm, "gradient_clipping")
            args.clip_grad = args.zero.max_grad_norm
        if args.zero.dtype != "fp32":
            raise UsageError(f"--deepspeed-config {args.deepspeed_config} enables {args.zero.dtype}: the trainer "
                             f"computes in --precision (autocast over fp32 masters); use --precision "
                             f"{args.zero.dtype} and drop the fp16/bf16 block")
    for option, package in (("--tensorboard-dir", "tensorboard"), ("--wandb-project", "wandb")):
        if getattr(args, option[2:].replace("-", "_")) is not None and not available(package):
            raise UsageError(f"{option} needs the package {package}, which is not installed: pip install {package} "
                             "(or leave the option out)")
    if args.save_interval is not None and args.save is None:
        raise UsageError(f"--save-interval {args.save_interval} needs --save DIR (where to write the checkpoints)")
    decay = args.lr_decay_iters if args.lr_decay_iters is not None else args.steps
    if decay < args.lr_warmup_iters:
        raise UsageError(f"--lr-decay-iters {decay} must be >= --lr-warmup-iters {args.lr_warmup_iters}")
    if args.min_lr > args.lr:
        raise UsageError(f"--min-lr {args.min_lr} must be <= --lr {args.lr}")
    if args.hidden % args.heads:
        raise UsageError(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    if args.zero_stage >= 2 and args.pp > 1:
        raise UsageError(f"--zero-stage {args.zero_stage} needs --pp 1 (ZeRO-2/3 shard gradients as backward makes "
                         f"them; the pipeline's tied embedding needs them whole), got --pp {args.pp}")
    if args.precision == "fp16" and args.zero_stage > 0:
        raise UsageError(f"--precision fp16 needs --zero-stage 0 (the trainer's ZeRO stages have no loss scaler), "
                         f"got --zero-stage {args.zero_stage}; use --precision bf16")
    _check_no_effect(args)
    if args.eval_iters > MAX_EVAL_ITERS:
        raise UsageError(f"--eval-iters {args.eval_iters} must be at most {MAX_EVAL_ITERS:,} (global batches per "
                         "validation)")
    if args.valid_data is not None and args.eval_interval is None:
        raise UsageError(f"--valid-data {args.valid_data} needs --eval-interval N (how often to evaluate)")
    if args.load is not None and Path(args.load).exists() and not Path(args.load).is_dir():
        raise UsageError(f"--load {args.load} is a file; it must be a checkpoint directory")
    foreign = describe_foreign(args.load) if args.load is not None else None
    if foreign is not None:
        raise UsageError(f"--load {args.load} {foreign}")
    _check_save_belongs_to_this_run(args)
    _check_logs_are_not_inputs(args)
    launch, dp = startcheck.check_launch(args)
    if batch is not None:
        try:
            size, steps = batch.resolve(micro_batch_size=args.micro_batch_size, micro_batches=args.micro_batches,
                                        dp=dp)
        except ValueError as err:
            raise UsageError(f"--deepspeed-config {args.deepspeed_config}: {err}") from None
        keys = "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps"
        _agrees(args, "--micro-batch-size", size, f"batch keys ({keys}) with dp {dp}")
        _agrees(args, "--micro-batches", steps, f"batch keys ({keys}) with dp {dp}")
        args.micro_batch_size, args.micro_batches = size, steps
    resolve_global_batch(args, dp, from_config=batch is not None)  # Megatron's --global-batch-size
    startcheck.check_data(args)
    config = startcheck.model_config(args)
    startcheck.check_memory(args, config, launch=launch, dp=dp)
    startcheck.check_outputs(args, launch=launch, checkpoint_bytes=startcheck.checkpoint_bytes(
        config, tp=args.tp, dp=dp, zero_stage=args.zero_stage))
