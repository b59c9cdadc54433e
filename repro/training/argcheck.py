"""What ``repro train`` checks before any work, so that every rank refuses a bad command in one line (exit code 2)
before a process group exists: the paths and the DeepSpeed config here, the options as one
:class:`~repro.training.config.TrainConfig` (:mod:`repro.training.options`, which checks itself), then the launch
variables, corpora, memory and output paths (:mod:`repro.training.startcheck`). :func:`check_args` returns the
config, resolved; nothing here changes the parsed options.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from repro.input_files import directory_problem, read_config, read_pointer, regular_file_problem
from repro.optional import available
from repro.paths import name_problem
from repro.training.checkpoint_kinds import describe_foreign
from repro.training.config import TrainConfig
from repro.training.failfast import UsageError
from repro.training.options import config_from_options, resolve_batch


class DeepSpeedOptions(NamedTuple):
    """What ``repro train`` reads of a DeepSpeed JSON file: its ZeRO settings
    (:class:`~repro.zero.config.ZeroConfig`), batch keys and monitor blocks."""

    zero: Any
    batch: Any
    logging: Any


def read_deepspeed_config(path: str) -> DeepSpeedOptions:
    """(ZeRO settings, batch keys, monitors) of a DeepSpeed JSON file (a :class:`UsageError` names the file, key and
    rule)."""
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
        return DeepSpeedOptions(ZeroConfig.from_deepspeed(data), deepspeed_batch(data), deepspeed_logging(data))
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


def _check_save_belongs_to_this_run(config: TrainConfig) -> None:
    """A checkpoint directory belongs to one run: saving into one that holds checkpoints this run does not load
    would move its newest pointer to another model, and its own run could not resume (a --load typo, a changed
    --hidden). Refused unless --overwrite-checkpoints. A save inside an iteration directory is always refused."""
    from repro.training.checkpoint import LATEST

    save, load = config.checkpoint.save, config.checkpoint.load
    if save is None:
        return
    inside = checkpoint_dir_around(save)
    if inside is not None:
        raise UsageError(f"--save {save} is inside the checkpoint (iteration) directory {inside}: save into the "
                         f"directory that holds the iter_* directories, e.g. --save {inside.parent}")
    pointer = Path(save) / LATEST
    if not os.path.lexists(pointer):
        return
    newest = read_pointer(pointer, what=f"--save {save}: its pointer", error=UsageError)
    if config.checkpoint.overwrite_checkpoints or _loads_from(load, Path(save)):
        return  # resuming the run that wrote them, or told to take the directory over
    newest = newest.strip()[:20].decode("utf-8", "replace")
    raise UsageError(f"--save {save} holds another run's checkpoints (newest: iteration {newest}) and this run "
                     f"does not load them: resume it with --load {save}, save elsewhere, or pass "
                     f"--overwrite-checkpoints")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return a.resolve() == b.resolve()


def _check_logs_are_not_inputs(config: TrainConfig) -> None:
    """--log-jsonl is appended to: it must not be a file the run reads (a corpus, the DeepSpeed config, a
    checkpoint's file), and --tensorboard-dir must not lie in a checkpoint's iteration directory."""
    logging, data, checkpoint = config.logging, config.data, config.checkpoint
    if logging.tensorboard_dir is not None and (inside := checkpoint_dir_around(logging.tensorboard_dir)) is not None:
        raise UsageError(f"--tensorboard-dir {logging.tensorboard_dir} is inside the checkpoint directory {inside}: "
                         "TensorBoard files must go elsewhere")
    if logging.log_jsonl is None:
        return
    target = Path(logging.log_jsonl)
    inputs = [("--deepspeed-config", Path(config.deepspeed_config))] if config.deepspeed_config else []
    for option, prefix in (("--data", data.data), ("--valid-data", data.valid_data)):
        if prefix not in (None, "synthetic"):
            inputs += [(f"{option} {prefix}", Path(f"{prefix}{suffix}")) for suffix in (".bin", ".idx.json")]
    for what, path in inputs:
        if _same_file(target, path):
            raise UsageError(f"--log-jsonl {logging.log_jsonl} is the input file {path} of {what}: the log is "
                             "appended to and would destroy it; log to another file")
    for option, folder in (("--load", checkpoint.load), ("--save", checkpoint.save)):
        if folder is None:
            continue
        root = Path(folder).resolve()
        if target.resolve().is_relative_to(root) and target.resolve() != root / "log.jsonl":
            raise UsageError(f"--log-jsonl {logging.log_jsonl} lies in the checkpoint directory {option} {folder}, "
                             f"whose files are checkpoints: the only log there is {root / 'log.jsonl'} (the default "
                             "with --save); log elsewhere")
    if (inside := checkpoint_dir_around(target)) is not None:
        raise UsageError(f"--log-jsonl {logging.log_jsonl} is inside the checkpoint directory {inside}: log "
                         "elsewhere")


#: the options that name a path, and those that name a directory, a file the run reads, or a corpus (a prefix: the
#: corpus's two files)
PATH_OPTIONS = ("--save", "--load", "--log-jsonl", "--tensorboard-dir", "--data", "--valid-data", "--deepspeed-config")
DIRECTORY_OPTIONS = ("--save", "--load", "--tensorboard-dir", "--wandb-save-dir")
FILE_OPTIONS = ("--deepspeed-config",)
CORPUS_OPTIONS = ("--data", "--valid-data")


def _value(options: Mapping[str, Any], option: str):
    return options.get(option[2:].replace("-", "_"))


def _check_paths(options: Mapping[str, Any]) -> None:
    """Every path of the command line is a usable name, and what it must be, or absent (made, or refused, later): a
    directory for --save, --load and the log directories, a regular file for the DeepSpeed config and each corpus
    file; a FIFO, a device, a socket or a symlink loop is refused here, before anything blocks on it or reads it
    forever."""
    for option in PATH_OPTIONS:
        value = _value(options, option)
        # '' would mean the current directory, or nothing; a name too long fails at the first stat
        problem = None if value is None or value == "synthetic" else name_problem(value)
        if problem is not None:
            raise UsageError(f"{option} {value!r} {problem}")
    for option in DIRECTORY_OPTIONS + FILE_OPTIONS + CORPUS_OPTIONS:
        value = _value(options, option)
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


def _check_checkpoints(config: TrainConfig) -> None:
    """--load is a checkpoint directory of this suite (or absent); --save belongs to this run; the logs are no
    inputs."""
    load = config.checkpoint.load
    if load is not None and Path(load).exists() and not Path(load).is_dir():
        raise UsageError(f"--load {load} is a file; it must be a checkpoint directory")
    foreign = describe_foreign(load) if load is not None else None
    if foreign is not None:
        raise UsageError(f"--load {load} {foreign}")
    _check_save_belongs_to_this_run(config)
    _check_logs_are_not_inputs(config)


def check_args(options: argparse.Namespace, given: frozenset[str] = frozenset()) -> TrainConfig:
    """The run's config, resolved, once everything that needs no process group is checked, so every rank refuses a
    bad command before it starts (exit code 2, one line): the paths, the DeepSpeed config, the options (``options``:
    the parsed command line, read only; ``given``: the destinations it gave rather than defaulted), then
    (:mod:`repro.training.startcheck`) the launch variables, the corpora against the vocabulary, the model against
    the device's memory, and the output paths."""
    from repro.training import startcheck

    values = dict(vars(options))
    _check_paths(values)
    deepspeed = read_deepspeed_config(values["deepspeed_config"]) if values.get("deepspeed_config") else None
    config = config_from_options(values, given, deepspeed)
    for option, value, package in (("--tensorboard-dir", config.logging.tensorboard_dir, "tensorboard"),
                                   ("--wandb-project", config.logging.wandb_project, "wandb")):
        if value is not None and not available(package):
            raise UsageError(f"{option} needs the package {package}, which is not installed: pip install {package} "
                             "(or leave the option out)")
    _check_checkpoints(config)
    launch, dp = startcheck.check_launch(config)
    config = resolve_batch(config, dp=dp, given=given, batch=deepspeed.batch if deepspeed is not None else None)
    config = config.replaced(vocab=startcheck.check_data(config, vocab_given="vocab" in given))
    startcheck.check_memory(config, launch=launch)
    startcheck.check_outputs(config, launch=launch)
    return config
