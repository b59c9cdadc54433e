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
import contextlib
import pickle
import re
from pathlib import Path
from typing import Any, Iterator

import torch

from repro.training.consolidate import torch_load_reason
from repro.zero.checkpoint import CheckpointError

TRACKER = "latest_checkpointed_iteration.txt"
SHARD_FILE = "model_optim_rng.pt"
#: Classes a Megatron checkpoint may construct beyond tensors and plain containers.
SAFE_GLOBALS = (argparse.Namespace,)
RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")


@contextlib.contextmanager
def _allowed(classes: tuple[type, ...]) -> Iterator[None]:
    """Allow ``classes`` in ``torch.load(weights_only=True)`` for the block (torch >= 2.5's ``safe_globals``); torch
    2.4 has only the process-wide ``add_safe_globals``, so there they stay allowed after the block (the same short
    allow-list for every later weights-only load of this process)."""
    scoped = getattr(torch.serialization, "safe_globals", None)
    if scoped is not None:
        with scoped(list(classes)):
            yield
        return
    torch.serialization.add_safe_globals(list(classes))
    yield


class MegatronCheckpointError(CheckpointError):
    """A Megatron checkpoint that cannot be read as a repro model (one clear sentence)."""


def is_megatron_checkpoint(path: str | Path) -> bool:
    """A Megatron checkpoint root (with the tracker file) or an iteration directory holding ``mp_rank_*`` folders."""
    path = Path(path)
    return (path / TRACKER).is_file() or any(RANK_DIR.match(p.name) for p in subdirs(path))


def subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


def iteration_dir(path: str | Path) -> Path:
    """The directory holding the ``mp_rank_*`` folders: read from the tracker file, or ``path`` itself."""
    path = Path(path)
    tracker = path / TRACKER
    if not tracker.is_file():
        if any(RANK_DIR.match(p.name) for p in subdirs(path)):
            return path
        raise MegatronCheckpointError(f"{str(path)!r} is not a Megatron checkpoint: neither {TRACKER} nor "
                                      "mp_rank_XX folders are in it")
    text = tracker.read_text(encoding="utf-8", errors="replace").strip()
    if text == "release":
        name = "release"
    elif text.isdigit() and int(text) > 0:
        name = f"iter_{int(text):07d}"
    else:
        raise MegatronCheckpointError(f"{str(tracker)!r} holds {text[:40]!r}; it must be 'release' or an iteration "
                                      "number > 0")
    directory = path / name
    if not directory.is_dir():
        raise MegatronCheckpointError(f"{str(tracker)!r} names {text!r}, but {str(directory)!r} does not exist")
    return directory


def load_file(path: str | Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` with ``argparse.Namespace`` allowed; any other class is refused, named."""
    path = Path(path)
    if not path.is_file():
        raise MegatronCheckpointError(f"Megatron checkpoint file {str(path)!r} is missing")
    try:
        with _allowed(SAFE_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise MegatronCheckpointError(_refusal(path, err)) from None
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError, KeyError, IndexError,
            ImportError) as err:  # truncated or not a torch file
        raise MegatronCheckpointError(f"{str(path)!r} is not a PyTorch weights file (or holds objects other than "
                                      f"tensors): {torch_load_reason(err)}") from None
    if not isinstance(state, dict):
        raise MegatronCheckpointError(f"{str(path)!r} holds a {type(state).__name__}, not Megatron's checkpoint dict")
    return state


def _refusal(path: Path, err: Exception) -> str:
    """One short sentence for a file ``torch.load(weights_only=True)`` refused: the classes it would construct when
    they can be listed, else torch's reason (garbage bytes)."""
    allowed = {f"{c.__module__}.{c.__qualname__}" for c in SAFE_GLOBALS}
    try:
        names = [n for n in torch.serialization.get_unsafe_globals_in_checkpoint(path) if n not in allowed]
    except Exception:  # noqa: BLE001 - fall back to the unpickler's own words
        names = re.findall(r"GLOBAL ([\w.]+)", str(err))
    head = f"{str(path)!r} is not a PyTorch weights file (or holds objects other than tensors)"
    if not names:
        return f"{head}: {torch_load_reason(err)}"
    return (f"{head}: it pickles {', '.join(sorted(set(names)))}; the allow-list is {', '.join(sorted(allowed))}, "
            "tensors and plain containers (save with Megatron's --no-save-optim --no-save-rng)")


def shard_files(directory: Path, tp: int, pp: int) -> list[list[Path]]:
    """``files[tp_rank][pp_rank]``, Megatron's names (``mp_rank_XX`` without pipeline parallelism)."""
    if pp == 1:
        return [[directory / f"mp_rank_{t:02d}" / SHARD_FILE] for t in range(tp)]
    return [[directory / f"mp_rank_{t:02d}_{p:03d}" / SHARD_FILE for p in range(pp)] for t in range(tp)]


def first_file(directory: Path) -> Path:
    for name in ("mp_rank_00", "mp_rank_00_000"):
        if (directory / name / SHARD_FILE).is_file():
            return directory / name / SHARD_FILE
    expected = [str(directory / name / SHARD_FILE) for name in ("mp_rank_00", "mp_rank_00_000")]
    raise MegatronCheckpointError(f"Megatron checkpoint {str(directory)!r} has no rank-0 shard: expected "
                                  f"{expected[0]!r} or {expected[1]!r}")
