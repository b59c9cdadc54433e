"""Write a file so that it either holds all of its new content or is unchanged: temporary name, fsync, rename.

Checkpoints (repro.zero.checkpoint, repro.training.checkpoint) and tokenized corpora (repro.training.corpus) are
written this way, so a crash, a full disk or a killed job never leaves a half-written file under the real name. The
temporary name is unique per process and call, so two writers of the same target never share it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Iterable


def atomic_write(target: str | os.PathLike, chunks: Iterable[bytes]) -> str:
    """Write ``chunks`` to a temporary file beside ``target``, fsync it, rename it over ``target``; return the
    sha256 of what was written."""
    target = Path(target)
    digest = hashlib.sha256()
    temporary = target.with_name(f"{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as handle:  # created with the umask's permissions, like any output
            for chunk in chunks:
                digest.update(chunk)
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return digest.hexdigest()
