"""The front of the ``repro`` command: a subcommand that is another entry point (``repro train``, ``repro eval``,
``repro data``, ...) is handed its arguments before the rest of the command loads.

:mod:`repro.cli` imports the experiments, the harness and the results tables (pandas) at its start: ~1 s of CPU that
``repro train`` paid on every rank of every run, and ``repro data`` on every fetch, for a parser they never use. Here
the table of forwarded subcommands (:data:`repro.subcommands.FORWARDED`) and the hand-over load nothing of that; any
other subcommand goes on to :func:`repro.cli.main`, which the installed ``repro`` script and ``python -m repro``
reach through here."""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from repro.subcommands import FORWARDED, forward


def main(argv: Sequence[str] | None = None) -> int:
    """``repro ARGS``: a forwarded subcommand at once, anything else by :func:`repro.cli.main`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in FORWARDED:
        return forward(argv)
    return importlib.import_module("repro.cli").main(argv)
