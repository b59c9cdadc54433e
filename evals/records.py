"""Evaluation results as tidy rows with provenance, written through :mod:`repro.results`.

A row is ``{"metric", "value", "unit", "task", "definition", "model", "checkpoint_sha256", "data_sha256",
"settings"}``; :func:`write_rows` adds the run id and provenance (git commit, torch version, device, date, ...) and
appends them to ``results/runs/evals_<task>/<run_id>.jsonl`` (or under ``--results-dir``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from repro import results


def row(metric: str, value: float | int, unit: str, *, task: str, definition: str, model: str,
        checkpoint_sha256: str | None, data_sha256: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metric": metric, "value": value, "unit": unit, "task": task, "definition": definition, "model": model,
        "checkpoint_sha256": checkpoint_sha256, "data_sha256": data_sha256, "settings": dict(settings),
    }


def write_rows(rows: Sequence[Mapping[str, Any]], *, task: str, config: Mapping[str, Any], started: float,
               results_root: str | Path | None = None, world_size: int = 1, device: str = "cpu") -> Path:
    """Append ``rows`` (one evaluation run) with provenance; returns the JSONL file written."""
    for r in rows:
        results.check_row(r, where=f"evals {task}")
    root = results.results_dir(results_root)
    prov = results.provenance(config=config, world_size=world_size, device=device,
                              elapsed_s=time.perf_counter() - started, launcher="python -m evals")
    return results.append_rows(root, experiment=f"evals_{task}", scale="cli", point=task,
                               run_id=results.new_run_id(), rows=rows, prov=prov)
