"""Evaluation results as tidy rows with provenance, written through :mod:`repro.results`.

A row is ``{"metric", "value", "unit", "task", "definition", "model", "checkpoint_sha256", "data_sha256",
"settings"}``; :func:`write_rows` adds the run id and provenance (git commit, torch version, device, date, ...) and
writes them to ``results/evals/<task>/<run_id>.jsonl`` (or under ``--results-dir``), beside -- not inside -- the
``results/runs/`` tree that ``repro reproduce`` owns (the registered experiments ``eval_wikitext_lambada`` and
``eval_race`` write there through the runner).
"""

from __future__ import annotations

import json
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
    prov = results.provenance(config=config, world_size=world_size, device=device,
                              elapsed_s=time.perf_counter() - started, launcher="python -m evals")
    run_id = results.new_run_id()
    path = results.results_dir(results_root) / "evals" / task / f"{run_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for r in rows:
            record = {**r, "experiment": f"evals_{task}", "scale": "cli", "point": task, "run_id": run_id,
                      "provenance": prov}
            handle.write(json.dumps(record, default=str) + "\n")
    return path
