"""Paths the user names on a command line, checked before any work: why one cannot be used, in words.

Each function returns ``None`` for a usable path, else the reason (the caller names its option and exits 2), so
that ``repro train``, ``repro run --results-dir``, ``python -m repro.gpu_session --out`` and the evaluation
harnesses refuse the same things with the same words: an empty path, a name longer than the file system allows, a
directory under a file, one that cannot be created or written, a log file on a device that refuses writes
(``/dev/full``).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

#: used where the file system does not say (POSIX's NAME_MAX and Linux's PATH_MAX)
DEFAULT_NAME_MAX, DEFAULT_PATH_MAX = 255, 4096


def _limit(path: Path, name: str, default: int) -> int:
    """``pathconf(name)`` of the nearest existing ancestor of ``path``."""
    for parent in (path, *path.parents):
        try:
            if parent.exists():
                return os.pathconf(parent, name)
        except (OSError, ValueError):
            return default
    return default


def name_problem(text: str | os.PathLike) -> str | None:
    """Lexical checks, touching nothing: empty, a component or the whole path too long for the file system."""
    text = os.fspath(text)
    if not text.strip():
        return "is empty: give a path (or leave the option out)"
    path = Path(text).absolute()
    whole, name_max = len(os.fsencode(str(path))), _limit(path.parent, "PC_NAME_MAX", DEFAULT_NAME_MAX)
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            return (f"has a name of {len(os.fsencode(part))} bytes ({part[:24]}...); the file system allows "
                    f"{name_max}")
    path_max = _limit(path.parent, "PC_PATH_MAX", DEFAULT_PATH_MAX)
    if whole >= path_max:
        return f"is {whole} bytes long; the file system allows paths below {path_max}"
    return None


def _under_a_file(path: Path) -> Path | None:
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def writable_dir_problem(text: str | os.PathLike, *, create: bool = True, write: bool = True) -> str | None:
    """A directory that exists (or is created here when ``create``) and takes a new file. Without ``create`` a
    missing directory is probed and left as it was: its first missing level is made and removed again. Without
    ``write`` only the name and what lies above it are checked (a directory that is only read)."""
    problem = name_problem(text)
    if problem is not None:
        return problem
    path = Path(text)
    if path.exists() and not path.is_dir():
        return "is a file; it must be a directory (created when missing)"
    blocker = _under_a_file(path)
    if blocker is not None:
        return f"is under {blocker}, which is a file"
    if not write:
        return None
    try:
        if path.exists() or create:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".repro-write-check-"):
                pass
        else:  # the first missing level below the nearest existing directory, made and removed again
            existing = next(parent for parent in path.parents if parent.exists())
            probe = existing / path.relative_to(existing).parts[0]
            probe.mkdir()
            try:
                with tempfile.NamedTemporaryFile(dir=probe, prefix=".repro-write-check-"):
                    pass
            finally:
                probe.rmdir()
    except OSError as err:
        return f"is not a writable directory ({err.strerror or err})"
    return None


def appendable_file_problem(text: str | os.PathLike) -> str | None:
    """A file that can be appended to: created (empty) when missing, as the writer would; a device or pipe must
    take a byte (``/dev/full`` refuses it; ``/dev/null`` and a terminal take it)."""
    problem = name_problem(text)
    if problem is not None:
        return problem
    path = Path(text)
    if path.is_dir():
        return "is a directory; it must name a file (appended to)"
    blocker = _under_a_file(path)
    if blocker is not None:
        return f"is under {blocker}, which is a file"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_file():  # without blocking on a pipe nobody reads (ENXIO)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            try:
                os.write(fd, b"\n")
            finally:
                os.close(fd)
        else:
            with open(path, "a"):  # an empty file is what the writer would create anyway
                pass
    except OSError as err:
        reason = "the device is full" if err.errno == errno.ENOSPC else (err.strerror or str(err))
        return f"cannot be appended to ({reason})"
    return None
