"""Command-line conventions shared by every ``repro`` command: one-line errors (exit code 2) and checked numbers.

argparse prints its whole usage block before an error; on a cluster log that buries the one line that matters.
:class:`OneLineParser` prints only ``PROG: error: MESSAGE (see PROG --help)``. The ``positive_int`` family are
argparse ``type=`` functions whose error names the value given and the rule it breaks.
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2 (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive, finite number")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value
