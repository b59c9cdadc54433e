"""A small trainer for GPT under any tensor x pipeline x data parallel layout, and its data.

The names below load on first use (PEP 562), so that ``python -m repro.training`` reaches its entry point, which
turns a Ctrl-C during the imports into one line, before torch is imported."""

from __future__ import annotations

from repro.lazy import lazy_names

_HOMES = {"local_micro_batches": "repro.training.data", "synthetic_tokens": "repro.training.data",
          "PipelineTrainer": "repro.training.trainer", "TrainSettings": "repro.training.trainer",
          "train_gpt": "repro.training.trainer"}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
