"""A PyTorch weights file read as untrusted input: a regular file, ``torch.load(weights_only=True)``, one line.

Every ``.pt`` file the suite reads (repro train's rank files, the evaluation harness's shards, Megatron-LM's
``model_optim_rng.pt``, a Hugging Face ``pytorch_model.bin``) comes through :func:`load_weights`: the path is checked
to be a regular file and opened without blocking (:mod:`repro.input_files`), then unpickled with torch's
weights-only unpickler, which constructs tensors and plain containers only. Whatever it refuses (a pickle that
would call ``posix.system``, garbage, a truncated file) is one sentence naming the file and the classes it would
construct, never torch's paragraph on ``weights_only``, which suggests loading the file with it turned off: a
suggestion the suite must never pass on about a file from elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
from typing import Any, Iterator

import torch

from repro.input_files import open_regular

#: the lines of torch.load's errors that explain weights_only in general, not what is wrong with this file
_TORCH_BOILERPLATE = ("Weights only load failed", "Check the documentation", "Please file an issue",
                      "(1) Re-running", "(2) Alternatively", "Re-running", "In PyTorch 2.6")
#: what a reason must never say (torch's advice to load an untrusted file with the unpickler unrestricted)
_NEVER = re.compile(r"weights_only\s*(set to|=)\s*False|Re-running `?torch\.load", re.IGNORECASE)


def torch_load_reason(err: BaseException) -> str:
    """What ``torch.load`` found wrong, in one short line: the first line of its error that is not its general
    paragraph on ``weights_only`` (at most 160 characters), never its advice to turn ``weights_only`` off."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line.split("WeightsUnpickler error: ", 1)[-1] for line in lines
              if not line.startswith(_TORCH_BOILERPLATE) and not _NEVER.search(line)]
    if not lines:
        return f"{type(err).__name__} (the file is empty or cut short)"
    if not useful:
        return f"{type(err).__name__}: torch's weights-only unpickler refused it"
    text = useful[0]
    return (text.split(". ")[0] if len(text) > 120 else text)[:160]


@contextlib.contextmanager
def allowed_classes(classes: tuple[type, ...]) -> Iterator[None]:
    """Allow ``classes`` in ``torch.load(weights_only=True)`` for the block (torch >= 2.5's ``safe_globals``); torch
    2.4 has only the process-wide ``add_safe_globals``, so there they stay allowed after the block (the same short
    allow-list for every later weights-only load of this process)."""
    if not classes:
        yield
        return
    scoped = getattr(torch.serialization, "safe_globals", None)
    if scoped is not None:
        with scoped(list(classes)):
            yield
        return
    torch.serialization.add_safe_globals(list(classes))
    yield


def _unsafe_globals(path: str | os.PathLike, err: BaseException, allowed: tuple[type, ...]) -> list[str]:
    """The classes and functions the file would construct beyond ``allowed``, as torch lists them (else as its
    error names them)."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in allowed}
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a zip checkpoint, or torch 2.4 (no such function): the error's words
        found = re.findall(r"GLOBAL ([\w.]+)", str(err))
    return sorted({n for n in found if n not in names})


def load_weights(path: str | os.PathLike, *, error: type[Exception] = ValueError,
                 allowed: tuple[type, ...] = (), hint: str = "") -> Any:
    """``torch.load(path, weights_only=True)`` of a regular file (``allowed``: classes beyond tensors and plain
    containers); anything refused is ``error("'<path>' is not a PyTorch weights file (or holds objects other than
    tensors): <reason>")``, with ``hint`` (how to save a file without them) after the classes it would construct."""
    head = f"{str(path)!r} is not a PyTorch weights file (or holds objects other than tensors)"
    with open_regular(path, error=error) as handle:
        try:
            with allowed_classes(allowed):
                return torch.load(handle, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            names = _unsafe_globals(path, err, allowed)
            if names:
                permitted = ", ".join(f"{c.__module__}.{c.__qualname__}" for c in allowed)
                raise error(f"{head}: it pickles {', '.join(names)}; the allow-list is tensors, plain containers"
                            f"{', ' + permitted if permitted else ''}{' ' + hint if hint else ''}") from None
            raise error(f"{head}: {torch_load_reason(err)}") from None
        except (EOFError, RuntimeError, OSError, ValueError, TypeError, AttributeError, ImportError, KeyError,
                IndexError, UnicodeDecodeError, MemoryError, OverflowError) as err:
            raise error(f"{head}: {torch_load_reason(err)}") from None
