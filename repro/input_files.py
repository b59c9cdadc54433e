"""Every file the suite reads is a regular file, and a directory's files stay inside it: one rule, one home.

Inputs come from elsewhere (a checkpoint copied from a cluster, a data directory, a config from a colleague), so
before a byte is read:

* **a file is a file.** A FIFO blocks its reader until someone writes (a pointer file that is a pipe held a run
  until its watchdog fired), a device never ends (``/dev/zero`` as a config grew until the kernel killed the
  process), a socket cannot be opened, a symlink loop cannot be followed (it read as "no checkpoint"). Each is
  refused at once, in one line naming the path and what it is. The file is opened without blocking and checked
  again on the open descriptor (``fstat``), so a path swapped after the check is caught too.
* **a small text file is small.** Pointers (an iteration number) and configs (JSON) are read whole: each kind has a
  cap (:data:`POINTER_MAX_BYTES`, :data:`CONFIG_MAX_BYTES`), and a larger file is refused, not read into memory.
* **a directory's names stay inside it.** A name from a manifest, an index map or a header is relative, without
  ``..``, and what it resolves to (symlinks followed) lies inside the directory the user gave: a symlink leaving
  it is refused, naming the entry and where it points. A symlink that stays inside is followed (a Hugging Face
  cache's snapshots point into its own ``blobs/``).

Each check returns the reason (``None`` when the path is fine) or raises the caller's exception class with one
line, so a checkpoint reader raises its ``CheckpointError`` and a command-line check its ``UsageError`` with the
same words. This module imports nothing of repro: every floor may use it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

#: a pointer file (an iteration number, ``release``, ``global_step12``) is a line; anything longer is not one
POINTER_MAX_BYTES = 4096
#: a JSON config, header, manifest or index map the suite reads whole (a config.json, a DeepSpeed config, a
#: checkpoint's manifest of 100,000 ranks is ~10 MB)
CONFIG_MAX_BYTES = 64 << 20


class InputFileError(ValueError):
    """A path that is not a regular file (or directory) where one is read, a file over its size cap, or a name that
    leaves its directory: one line naming the path and the rule."""


def kind_of(mode: int) -> str:
    """What a ``stat`` mode is, in words ("a FIFO (named pipe)", "a character device", ...)."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def _stat_problem(path: Path) -> tuple[os.stat_result | None, str | None]:
    """(stat of ``path`` following symlinks, None) or (None, why it cannot be stat'ed)."""
    try:
        return os.stat(path), None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return None, "is a symlink loop (or a chain of more than 40 links)"
        if err.errno == errno.ENOENT:
            dangling = os.path.islink(path)
            return None, ("is a symlink to a missing file" if dangling else "does not exist")
        if err.errno == errno.ENAMETOOLONG:
            return None, "has a name too long for the file system"
        return None, f"cannot be read ({err.strerror or err})"


def regular_file_problem(path: str | os.PathLike, *, missing_ok: bool = False) -> str | None:
    """Why ``path`` is not a regular file that can be read (a FIFO, a device, a socket, a directory, a symlink
    loop, missing), or None. ``missing_ok``: a path that does not exist is no problem (the caller handles it)."""
    info, problem = _stat_problem(Path(path))
    if info is None:
        return None if missing_ok and problem == "does not exist" else problem
    if not stat.S_ISREG(info.st_mode):
        return f"is {kind_of(info.st_mode)}, not a regular file"
    return None


def directory_problem(path: str | os.PathLike, *, missing_ok: bool = False) -> str | None:
    """Why ``path`` is not a directory (a file, a FIFO, a symlink loop, missing), or None."""
    info, problem = _stat_problem(Path(path))
    if info is None:
        return None if missing_ok and problem == "does not exist" else problem
    if not stat.S_ISDIR(info.st_mode):
        return f"is {kind_of(info.st_mode)}, not a directory"
    return None


def check_regular_file(path: str | os.PathLike, *, what: str = "", error: type[Exception] = InputFileError,
                       missing_ok: bool = False) -> Path:
    """``path``, when it is a regular file; else ``error("<what> '<path>' <why>")``."""
    problem = regular_file_problem(path, missing_ok=missing_ok)
    if problem is not None:
        raise error(f"{what + ' ' if what else ''}{str(path)!r} {problem}")
    return Path(path)


def open_regular(path: str | os.PathLike, *, what: str = "", error: type[Exception] = InputFileError) -> BinaryIO:
    """``path`` opened for binary reading, checked on the open descriptor to be a regular file. Opened with
    ``O_NONBLOCK`` (so a FIFO without a writer cannot block the open), which is cleared once it is known to be a
    regular file; a symlink loop, a device, a socket or a FIFO is ``error`` naming it."""
    label = f"{what + ' ' if what else ''}{str(path)!r}"
    problem = regular_file_problem(path)
    if problem is not None:
        raise error(f"{label} {problem}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise error(f"{label} cannot be opened ({err.strerror or err})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped for something else between the stat and the open
            raise error(f"{label} is {kind_of(mode)}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike, limit: int, *, what: str = "",
                error: type[Exception] = InputFileError) -> bytes:
    """The bytes of the regular file ``path``, refused (``error``) when it holds more than ``limit`` bytes."""
    with open_regular(path, what=what, error=error) as handle:
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:  # the second: a file that grew while it was read
        label = f"{what + ' ' if what else ''}{str(path)!r}"
        raise error(f"{label} holds {max(size, len(data)):,} bytes; a file of this kind holds at most {limit:,} "
                    "(is it the right file?)")
    return data


def read_pointer(path: str | os.PathLike, *, what: str = "", error: type[Exception] = InputFileError) -> bytes:
    """A pointer file's bytes (at most :data:`POINTER_MAX_BYTES`), regular-file checked."""
    return read_capped(path, POINTER_MAX_BYTES, what=what, error=error)


def read_config(path: str | os.PathLike, *, what: str = "", error: type[Exception] = InputFileError) -> bytes:
    """A config's bytes (at most :data:`CONFIG_MAX_BYTES`), regular-file checked."""
    return read_capped(path, CONFIG_MAX_BYTES, what=what, error=error)


def name_inside_problem(name: object) -> str | None:
    """Why ``name`` (from a manifest, header or index map) is not a relative path inside its directory: not a
    non-empty string, absolute, or holding a ``..`` component; else None. Touches nothing."""
    if not isinstance(name, str) or not name.strip():
        return f"names {name!r}, not a file name (a non-empty string)"
    if "\0" in name:
        return f"names {name!r}, which holds a NUL byte"
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or Path(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        return f"names {name!r}, an absolute path, which leaves the directory (only names inside it are read)"
    if ".." in pure.parts:
        return f"names {name!r}, whose '..' leaves the directory (only names inside it are read)"
    return None


def resolves_inside_problem(root: str | os.PathLike, path: str | os.PathLike) -> str | None:
    """Why ``path`` (under ``root``) does not stay inside ``root`` once its symlinks are followed, or None."""
    try:
        real_root = Path(os.path.realpath(root))
        real = Path(os.path.realpath(path))
    except (OSError, ValueError) as err:  # realpath raises on a loop only in strict mode; be safe
        return f"cannot be resolved ({err})"
    if real == real_root or real_root in real.parents:
        return None
    return (f"is a symlink (or lies under one) to {str(real)!r}, which leaves the directory {str(real_root)!r} "
            "(only files inside it are read)")


def inside(root: str | os.PathLike, name: object, *, what: str = "", error: type[Exception] = InputFileError,
           kind: str = "file", missing_ok: bool = False, within: str | os.PathLike | None = None) -> Path:
    """``root / name`` after checking that ``name`` stays inside ``root`` (lexically and with its symlinks
    followed; ``within``: a directory above ``root`` that bounds it instead) and is a regular file
    (``kind="file"``) or a directory (``kind="dir"``); else ``error`` naming the entry. ``missing_ok``: a name that
    does not exist is returned unchecked (the caller says it is missing)."""
    label = f"{what}: " if what else ""
    problem = name_inside_problem(name)
    if problem is not None:
        raise error(f"{label}entry {problem}")
    path = Path(root) / str(name)
    if not os.path.lexists(path):
        if missing_ok:
            return path
        raise error(f"{label}{str(path)!r} does not exist")
    problem = resolves_inside_problem(root if within is None else within, path)
    if problem is not None:
        raise error(f"{label}entry {name!r}: {str(path)!r} {problem}")
    problem = (regular_file_problem if kind == "file" else directory_problem)(path)
    if problem is not None:
        raise error(f"{label}{str(path)!r} {problem}")
    return path
