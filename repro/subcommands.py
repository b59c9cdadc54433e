"""The subcommands of ``repro`` that are other entry points (``repro train``, ``repro eval``, ``repro data``, ...):
their table and their hand-over, shared by the command's front (:mod:`repro.commands`, which forwards them before
the rest of the command loads) and :mod:`repro.cli` (which lists them in its help and forwards them the same way
when it is called in-process). Loads nothing but the environment's checks."""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from repro.environment import SettingError, check_environment

#: subcommands that are other entry points: name -> (module with main(argv), help)
FORWARDED = {
    "eval": ("evals.cli", "WikiText-103 / LAMBADA / RACE harnesses (same as python -m evals)"),
    "data": ("evals.fetch", "repro data fetch: download every data file from its source, checked by sha256"),
    "export-hf": ("evals.hf_export", "a checkpoint as a Hugging Face GPT-2 directory (config.json + "
                  "model.safetensors)"),
    "train": ("repro.training.cli", "train a small GPT under tp x pp x dp (same as python -m repro.training)"),
    "corpus": ("repro.training.corpus", "tokenize text into a corpus for repro train (= python -m "
               "repro.training.corpus)"),
    "consolidate": ("repro.training.consolidate", "a repro train checkpoint as one state dict file (= python -m "
                    "repro.training.consolidate)"),
    "zero-report": ("repro.harness.zero_report", "where a ZeRO rank's memory goes (same as python -m "
                    "repro.harness.zero_report)"),
}


def forward(argv: Sequence[str]) -> int:
    """Run the forwarded subcommand ``argv[0]`` with the rest of ``argv``, once the environment's settings are
    checked (as every ``repro`` command checks them first: a bad one is one line and exit code 2)."""
    try:
        check_environment()
    except SettingError as err:
        print(f"repro: error: {err}", file=sys.stderr)
        return 2
    return int(importlib.import_module(FORWARDED[argv[0]][0]).main(list(argv[1:])) or 0)

