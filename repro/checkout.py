"""Where this copy of repro runs from, and where its per-user files go when it is not a checkout.

Two ways to run repro: from a checkout of the repository (an editable install, ``PYTHONPATH``), whose parent folder
holds ``shared/`` (the data, the papers' claims table), or from an installed wheel, whose parent folder is
``site-packages``. The rules that depend on which (results in ``./results``, the data directory, the batch files)
ask :func:`in_checkout`; an installed wheel never writes next to itself, so per-user files go to the platform's
user data directory (:func:`user_data_dir`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: the folder above the ``repro`` package: the checkout's root, or site-packages for an installed wheel
REPO_ROOT = Path(__file__).resolve().parents[1]


def in_checkout() -> bool:
    """Whether the code runs from a checkout of the repository (editable install, PYTHONPATH) rather than from an
    installed wheel, whose parent folder is site-packages."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "repro").is_dir()


def user_data_dir(app: str = "repro") -> Path:
    """The platform's per-user data directory for ``app``, as the platforms define it (none of it is created here):
    ``$XDG_DATA_HOME/app`` (an absolute ``XDG_DATA_HOME`` only, as the XDG spec says), else
    ``~/.local/share/app`` on Linux and other Unix; ``~/Library/Application Support/app`` on macOS;
    ``%LOCALAPPDATA%\\app`` (else ``%APPDATA%``) on Windows."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.environ.get("APPDATA")
        return Path(base) / app if base else Path.home() / "AppData" / "Local" / app
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / app
    xdg = os.environ.get("XDG_DATA_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share") / app
