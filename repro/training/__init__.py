"""A small trainer for GPT under any tensor x pipeline x data parallel layout, and its data.

The names below load on first use (PEP 562), so that ``python -m repro.training`` reaches its entry point, which
turns a Ctrl-C during the imports into one line, before torch is imported."""

from __future__ import annotations

import importlib

_HOMES = {"local_micro_batches": "repro.training.data", "synthetic_tokens": "repro.training.data",
          "PipelineTrainer": "repro.training.trainer", "TrainSettings": "repro.training.trainer",
          "train_gpt": "repro.training.trainer"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'repro.training' has no attribute {name!r}")
