"""The files of a Megatron-LM checkpoint: where the shards are, and each one read as untrusted input.

Layout (Megatron-LM's ``checkpointing.py``): ``DIR/latest_checkpointed_iteration.txt`` names ``release`` or an
iteration; ``DIR/release/`` or ``DIR/iter_0000123/`` holds ``mp_rank_XX/model_optim_rng.pt`` per tp rank (and
``mp_rank_XX_YYY`` per tp and pp rank with pipeline parallelism). Every file is read with
``torch.load(weights_only=True)``; the only class allowed beyond tensors and plain containers is
``argparse.Namespace`` (Megatron's ``args``), and a file that pickles anything else is refused, naming the classes.
The conversion to repro models is :mod:`evals.megatron_checkpoint`.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from repro.input_files import inside, read_pointer
from repro.zero.checkpoint import CheckpointError
from repro.zero.weights_file import load_weights

TRACKER = "latest_checkpointed_iteration.txt"
SHARD_FILE = "model_optim_rng.pt"
#: Classes a Megatron checkpoint may construct beyond tensors and plain containers.
SAFE_GLOBALS = (argparse.Namespace,)
RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")


class MegatronCheckpointError(CheckpointError):
    """A Megatron checkpoint that cannot be read as a repro model (one clear sentence)."""


def is_megatron_checkpoint(path: str | Path) -> bool:
    """A Megatron checkpoint root (with the tracker file) or an iteration directory holding ``mp_rank_*`` folders."""
    path = Path(path)
    return os.path.lexists(path / TRACKER) or any(RANK_DIR.match(p.name) for p in subdirs(path))


def subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


def iteration_dir(path: str | Path) -> Path:
    """The directory holding the ``mp_rank_*`` folders: read from the tracker file, or ``path`` itself."""
    path = Path(path)
    tracker = path / TRACKER
    if not os.path.lexists(tracker):
        if any(RANK_DIR.match(p.name) for p in subdirs(path)):
            return path
        raise MegatronCheckpointError(f"{str(path)!r} is not a Megatron checkpoint: neither {TRACKER} nor "
                                      "mp_rank_XX folders are in it")
    tracker = inside(path, TRACKER, what=f"Megatron checkpoint {str(path)!r}", error=MegatronCheckpointError)
    raw = read_pointer(tracker, error=MegatronCheckpointError)
    text = raw.decode("utf-8", errors="replace").strip()
    if text == "release":
        name = "release"
    elif text.isdigit() and int(text) > 0:
        name = f"iter_{int(text):07d}"
    else:
        raise MegatronCheckpointError(f"{str(tracker)!r} holds {text[:40]!r}; it must be 'release' or an iteration "
                                      "number > 0")
    directory = inside(path, name, kind="dir", missing_ok=True, what=f"{str(tracker)!r}",
                       error=MegatronCheckpointError)
    if not directory.is_dir():
        raise MegatronCheckpointError(f"{str(tracker)!r} names {text!r}, but {str(directory)!r} does not exist")
    return directory


def confined(root: str | Path, file: Path) -> Path:
    """``file`` (a shard under the checkpoint directory ``root``), checked to be a regular file that stays inside
    ``root`` once symlinks are followed (a missing one is returned as it is: the caller names what is missing)."""
    root = Path(root)
    relative = os.path.relpath(file, root)
    return inside(root, relative, missing_ok=True, what=f"Megatron checkpoint {str(root)!r}",
                  error=MegatronCheckpointError)


def load_file(path: str | Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` with ``argparse.Namespace`` allowed (:func:`repro.zero.weights_file.
    load_weights`: a regular file; any other class is refused, named)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise MegatronCheckpointError(f"Megatron checkpoint file {str(path)!r} is missing")
    state = load_weights(path, error=MegatronCheckpointError, allowed=SAFE_GLOBALS,
                         hint="(save with Megatron's --no-save-optim --no-save-rng)")
    if not isinstance(state, dict):
        raise MegatronCheckpointError(f"{str(path)!r} holds a {type(state).__name__}, not Megatron's checkpoint dict")
    return state


def shard_files(directory: Path, tp: int, pp: int) -> list[list[Path]]:
    """``files[tp_rank][pp_rank]``, Megatron's names (``mp_rank_XX`` without pipeline parallelism)."""
    if pp == 1:
        return [[directory / f"mp_rank_{t:02d}" / SHARD_FILE] for t in range(tp)]
    return [[directory / f"mp_rank_{t:02d}_{p:03d}" / SHARD_FILE for p in range(pp)] for t in range(tp)]


def first_file(directory: Path) -> Path:
    for name in ("mp_rank_00", "mp_rank_00_000"):
        if os.path.lexists(directory / name / SHARD_FILE):  # whatever it is: the reader refuses a special file
            return directory / name / SHARD_FILE
    expected = [str(directory / name / SHARD_FILE) for name in ("mp_rank_00", "mp_rank_00_000")]
    raise MegatronCheckpointError(f"Megatron checkpoint {str(directory)!r} has no rank-0 shard: expected "
                                  f"{expected[0]!r} or {expected[1]!r}")
