"""The environment variables the suite reads as settings, each parsed in one place with its rule.

A setting read where it is used fails where it is used: ``REPRO_GLOO_CHUNK_BYTES=abc`` was a ValueError traceback at
import, ``=1`` made an iteration take a minute (every collective cut into one-byte pieces) and ``=-5`` passed
silently; ``REPRO_START_METHOD=bogus`` failed only when the first multi-rank point started, after the points before
it had run; ``LOCAL_WORLD_SIZE=0`` divided this machine's memory among zero ranks. Here each variable has its rule,
and :func:`check_environment` applies them all: the entry points (``repro``, ``repro train``, ``python -m evals``,
the experiment worker) call it before any work, so a bad value is one line naming it and the rule, exit code 2.
Library code that reads a setting at import takes the default for a bad value (:func:`gloo_chunk_bytes` with
``strict=False``) and leaves the refusal to the entry point.
"""

from __future__ import annotations

import multiprocessing
import os

GLOO_CHUNK_VAR = "REPRO_GLOO_CHUNK_BYTES"
#: the piece size of a large gloo collective (repro.dist.comm): 4 MiB ran fastest on the machines measured
GLOO_CHUNK_DEFAULT = 4 << 20
#: the smallest piece: below it a collective of a few hundred MiB becomes thousands of calls (``=1`` took a minute
#: per iteration); 0 turns the pieces off
GLOO_CHUNK_MIN = 64 << 10
START_METHOD_VAR = "REPRO_START_METHOD"
LOCAL_WORLD_SIZE_VAR = "LOCAL_WORLD_SIZE"


class SettingError(ValueError):
    """An environment variable whose value breaks its rule: one line naming it, the value and the rule."""


def _integer(name: str, text: str) -> int:
    stripped = text.strip()
    if not (stripped.isascii() and stripped.lstrip("-").isdigit()) or len(stripped) > 19:
        raise SettingError(f"environment variable {name}={text!r} is not an integer")
    return int(stripped)


def gloo_chunk_bytes(*, strict: bool = True) -> int:
    """``REPRO_GLOO_CHUNK_BYTES``: 0 (one call per collective) or at least :data:`GLOO_CHUNK_MIN` bytes; default
    :data:`GLOO_CHUNK_DEFAULT`. ``strict=False``: a bad value gives the default (the entry point refuses it)."""
    text = os.environ.get(GLOO_CHUNK_VAR)
    if text is None or text == "":
        return GLOO_CHUNK_DEFAULT
    try:
        value = _integer(GLOO_CHUNK_VAR, text)
        if value != 0 and value < GLOO_CHUNK_MIN:
            raise SettingError(f"environment variable {GLOO_CHUNK_VAR}={text!r} must be 0 (collectives in one call) "
                               f"or at least {GLOO_CHUNK_MIN:,} bytes (smaller pieces turn one collective into "
                               "thousands of calls)")
    except SettingError:
        if strict:
            raise
        return GLOO_CHUNK_DEFAULT
    return value


def start_method() -> str | None:
    """``REPRO_START_METHOD``: None when unset, else one of this platform's multiprocessing start methods."""
    text = os.environ.get(START_METHOD_VAR)
    if not text:
        return None
    available = multiprocessing.get_all_start_methods()
    if text not in available:
        raise SettingError(f"environment variable {START_METHOD_VAR}={text!r} is not one of this platform's start "
                           f"methods: {', '.join(available)}")
    return text


def local_world_size() -> int | None:
    """``LOCAL_WORLD_SIZE`` (torchrun: this machine's ranks): None when unset, else an integer >= 1 that exceeds
    ``LOCAL_RANK`` when that is set too."""
    text = os.environ.get(LOCAL_WORLD_SIZE_VAR)
    if text is None:
        return None
    value = _integer(LOCAL_WORLD_SIZE_VAR, text)
    if value < 1:
        raise SettingError(f"launch variable {LOCAL_WORLD_SIZE_VAR}={text!r} must be an integer >= 1 (the ranks on "
                           "this machine)")
    local_rank = os.environ.get("LOCAL_RANK", "").strip()
    if local_rank.isdigit() and int(local_rank) >= value:
        raise SettingError(f"launch variables LOCAL_RANK={local_rank} and {LOCAL_WORLD_SIZE_VAR}={text!r}: the local "
                           "rank must be below the ranks on this machine")
    return value


def check_environment() -> None:
    """Every setting above, read and checked: a :class:`SettingError` for the first bad one."""
    gloo_chunk_bytes()
    start_method()
    local_world_size()
