"""``repro --version``: which repro this is (its version and the commit it was built or runs from) and which torch.

In a checkout the commit is git's (``(modified)`` with uncommitted changes under repro/); an installed wheel carries
the commit it was built from (``repro/BUILD_COMMIT``, written by setup.py); elsewhere it is unknown, and says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.checkout import REPO_ROOT, in_checkout


def commit() -> str | None:
    """The commit this code is, or None when nothing records it."""
    if in_checkout():
        from repro.provenance import git_state

        sha, dirty = git_state(REPO_ROOT)
        return None if sha == "unknown" else sha + (" (modified)" if dirty else "")
    built = Path(__file__).resolve().parent / "BUILD_COMMIT"
    return built.read_text().strip() or None if built.is_file() else None


def version_text() -> str:
    """``repro 0.1.0 (commit 9dbab11..., checkout), torch 2.13.0+cpu``."""
    import torch

    import repro

    where = "checkout" if in_checkout() else "installed"
    sha = commit()
    return (f"repro {repro.__version__} ({f'commit {sha}' if sha else 'commit unknown'}, {where}), "
            f"torch {torch.__version__}")


class VersionAction(argparse.Action):
    """``--version``: prints :func:`version_text` (worked out only when asked: git and torch take a moment)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=None, help=None):  # noqa: A002
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit(0)
