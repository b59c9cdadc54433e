"""Evaluation results as tidy rows with provenance, written through :mod:`repro.results`.

A row is ``{"metric", "value", "unit", "stderr", "task", "definition", "model", "checkpoint_sha256", "data_sha256",
"settings"}`` (``stderr``: the standard error lm-eval would report beside the value, in the value's unit, or None where
lm-eval reports none: :mod:`evals.stderr`); :func:`write_rows` adds the run id and provenance (git commit, torch
version, device, date, ...) and writes them to ``results/evals/<task>/<run_id>.jsonl`` (or under ``--results-dir``),
beside -- not inside -- the ``results/runs/`` tree that ``repro reproduce`` owns (the registered experiments
``eval_wikitext_lambada`` and ``eval_race`` write there through the runner).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from repro import provenance, results


def row(metric: str, value: float | int, unit: str, *, task: str, definition: str, model: str,
        checkpoint_sha256: str | None, data_sha256: str | None, settings: Mapping[str, Any],
        stderr: float | None = None) -> dict[str, Any]:
    return {
        "metric": metric, "value": value, "unit": unit, "stderr": stderr, "task": task, "definition": definition,
        "model": model, "checkpoint_sha256": checkpoint_sha256, "data_sha256": data_sha256, "settings": dict(settings),
    }


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as lm-eval prints its results: a markdown table with a header, each metric's value and, beside it,
    ``± stderr`` (``± N/A`` where lm-eval computes none: a weighted perplexity, bits per byte; blank for a count)."""
    header = ("task", "definition", "metric", "value", "", "stderr", "unit")
    lines = []
    for r in rows:
        value, stderr = r["value"], r.get("stderr")
        shown = f"{value:.6g}" if isinstance(value, float) else f"{value}"
        is_count = r["unit"] == "count"
        error = "" if is_count else ("N/A" if stderr is None else f"{stderr:.4g}")
        lines.append((str(r.get("task", r.get("dataset", ""))), str(r.get("definition", r.get("split", ""))),
                      r["metric"], shown, "" if is_count else "±", error, r["unit"]))
    widths = [max(1, *(len(cells[i]) for cells in (header, *lines))) for i in range(len(header))]
    right = {3, 5}  # numbers align right

    def line(cells) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "|" + "|".join(padded) + "|"

    rule = "|" + "|".join(("-" * (w - 1) + ":") if i in right else "-" * w for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(cells) for cells in lines)])


def write_rows(rows: Sequence[Mapping[str, Any]], *, task: str, config: Mapping[str, Any], started: float,
               results_root: str | Path | None = None, world_size: int = 1, device: str = "cpu") -> Path:
    """Append ``rows`` (one evaluation run) with provenance; returns the JSONL file written."""
    for r in rows:
        results.check_row(r, where=f"evals {task}")
    prov = provenance.provenance(config=config, world_size=world_size, device=device,
                                 elapsed_s=time.perf_counter() - started, launcher="python -m evals")
    run_id = provenance.new_run_id()
    path = results.results_dir(results_root) / "evals" / task / f"{run_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for r in rows:
            record = {**r, "experiment": f"evals_{task}", "scale": "cli", "point": task, "run_id": run_id,
                      "provenance": prov}
            handle.write(json.dumps(record, default=str) + "\n")
    return path
