"""Result rows with provenance: written as JSONL, one file per run, read back as one pandas table.

Layout (DESIGN.md, "data flows one way")::

    results/runs/<experiment>/<run_id>.jsonl    one line per row; never overwritten
    results/paper/*.csv                         paper reference tables (scripts/paper_tables.py)
    results/figures/*.png|svg                   `repro figures`
    results/claims.md, results/claims.csv       `repro claims`

A row is ``{"metric", "value", "unit", <the experiment's own columns>, "experiment", "scale", "point",
"run_id", "provenance": {config, git commit, torch version, device, job id, date, ...}}``. A run id is a UTC
timestamp (microseconds) plus a short random suffix, so runs sort by time and two runs never share a file (the
worker refuses any other id). When an experiment point has been run more than once, :func:`latest` keeps the newest
run's rows (a run written by hand under another id is placed by its rows' provenance date). The run id and the
provenance a row carries are :mod:`repro.provenance`'s.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from repro.checkout import REPO_ROOT, in_checkout  # noqa: F401 - re-exported: results, assets and tests ask here
from repro.input_files import open_regular, regular_file_problem
from repro.provenance import run_time
from repro.vocabulary import RESERVED_ROW_KEYS, Row

if TYPE_CHECKING:  # annotations only: pandas (~1 s of CPU) loads where tables are made, not for the worker's plan
    import pandas as pd

RESULTS_ENV = "REPRO_RESULTS_DIR"
KEY_COLUMNS = ["experiment", "scale", "point", "run_id", "metric", "value", "unit"]


def results_dir(override: str | os.PathLike | None = None) -> Path:
    """``override``, else ``$REPRO_RESULTS_DIR``, else ``results/`` at the repository root in a checkout, else
    ``results/`` in the current directory (an installed wheel never writes next to site-packages)."""
    if override is not None:
        return Path(override)
    env = os.environ.get(RESULTS_ENV)
    if env:
        return Path(env)
    return REPO_ROOT / "results" if in_checkout() else Path.cwd() / "results"


def runs_dir(root: Path) -> Path:
    return Path(root) / "runs"


def _plain(value: Any) -> Any:
    """Numpy/torch scalars -> Python numbers, so rows serialise as JSON."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"value {value!r} of type {type(value).__name__} is not JSON-serialisable")


def check_row(row: Mapping[str, Any], *, metrics: Iterable[str] = (), where: str = "") -> None:
    """A row needs ``metric`` (str), ``value`` (a number, or None for no value; a numpy or torch scalar counts) and
    ``unit`` (str), and none of the keys the runner adds: what :func:`read_run` reads back."""
    prefix = f"{where}: " if where else ""
    if not isinstance(row, Mapping):
        raise ValueError(f"{prefix}a row must be a dict, got {type(row).__name__}")
    missing = [key for key in ("metric", "value", "unit") if key not in row]
    if missing:
        raise ValueError(f"{prefix}row {dict(row)!r} lacks {missing}; every row has metric, value and unit")
    if not isinstance(row["metric"], str) or not isinstance(row["unit"], str):
        raise ValueError(f"{prefix}row {dict(row)!r}: metric and unit must be strings")
    if not _is_value(row["value"]):
        raise ValueError(f"{prefix}row {dict(row)!r}: {VALUE_RULE}, got {row['value']!r}")
    clash = [key for key in RESERVED_ROW_KEYS if key in row]
    if clash:
        raise ValueError(f"{prefix}row {dict(row)!r} uses keys {clash} that the runner reserves")
    metrics = list(metrics)
    if metrics and row["metric"] not in metrics:
        raise ValueError(f"{prefix}metric {row['metric']!r} is not among the declared metrics {metrics}")


def run_path(root: Path, experiment: str, run_id: str) -> Path:
    return runs_dir(root) / experiment / f"{run_id}.jsonl"


def append_rows(
    root: Path, *, experiment: str, scale: str, point: str, run_id: str, rows: Iterable[Row],
    prov: Mapping[str, Any],
) -> Path:
    """Append ``rows`` of one point to the run's file (created on first use; other runs' files are never touched)."""
    path = run_path(root, experiment, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for row in rows:
        record = {**row, "experiment": experiment, "scale": scale, "point": point, "run_id": run_id,
                  "provenance": dict(prov)}
        lines.append(json.dumps(record, default=_plain, sort_keys=False))
    with open(path, "a", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line + "\n")
    return path


#: what a row's value may be, in the words of the errors: what :func:`append_rows` writes for it
VALUE_RULE = "value must be a number (or null: no value)"
#: the columns of a row that are text; ``value`` is the one other column every row has
TEXT_COLUMNS = tuple(key for key in KEY_COLUMNS if key != "value")


def _is_value(value: Any) -> bool:
    """A number (not a bool), None, or a 0-d numpy/torch number (:func:`_plain` writes it as one)."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        value = value.item()
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _json_kind(value: Any) -> str:
    """The JSON type of a parsed value, and the value (shortened)."""
    kinds = ((bool, "true/false"), (dict, "an object"), (list, "an array"), (str, "a string"), (object, "a number"))
    text = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return "null" if value is None else next(f"{name} {text}" for kind, name in kinds if isinstance(value, kind))


def row_problem(record: Any) -> str | None:
    """Why ``record`` (one parsed line of a run file) is not a row, in words; None for a row: a JSON object with
    :data:`KEY_COLUMNS` (text, except a number or null ``value``) and, when present, a ``provenance`` object."""
    if not isinstance(record, dict):
        return f"a row must be a JSON object, got {_json_kind(record)}"
    missing = [key for key in KEY_COLUMNS if key not in record]
    if missing:
        return f"the row lacks {', '.join(missing)}; every row has {', '.join(KEY_COLUMNS)}"
    not_text = [key for key in TEXT_COLUMNS if not isinstance(record[key], str)]
    if not_text:
        return f"{not_text[0]} must be a string, got {_json_kind(record[not_text[0]])}"
    if not _is_value(record["value"]):
        return f"{VALUE_RULE}, got {_json_kind(record['value'])}"
    if not isinstance(record.get("provenance", {}), dict):
        return f"provenance must be a JSON object, got {_json_kind(record['provenance'])}"
    return None


def read_run(path: Path) -> list[dict[str, Any]]:
    """The rows of one run file (blank lines skipped), each checked by :func:`row_problem`. A file that cannot be
    read, a line that is not UTF-8 or JSON, and a record that is not a row raise one line (ValueError) that names
    ``path:line``: a corrupt run file is refused before anything is computed from it."""
    records = []
    problem = regular_file_problem(path)
    if problem is not None:  # a FIFO would block the reader, a device never end
        raise ValueError(f"{path}: cannot be read as a run file (it {problem})")
    try:
        with open_regular(path, what="run file", error=ValueError) as handle:
            for number, raw in enumerate(handle, 1):
                records.extend(_parse_line(path, number, raw))
    except OSError as err:
        raise ValueError(f"{path}: cannot be read as a run file ({err.strerror or err})") from None
    return records


def _parse_line(path: Path, number: int, raw: bytes) -> list[dict[str, Any]]:
    """The row on one line of a run file ([] for a blank line)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column "
                         f"{err.start + 1}); a run file is JSON lines") from None
    if not line.strip():
        return []
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{path}:{number}: not a JSON row ({err})") from None
    problem = row_problem(record)
    if problem is not None:
        raise ValueError(f"{path}:{number}: {problem}")
    return [record]


def run_files(root: Path, experiment: str | None = None) -> list[Path]:
    base = runs_dir(root)
    pattern = f"{experiment}/*.jsonl" if experiment else "*/*.jsonl"
    return sorted(base.glob(pattern))


def _flatten(record: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level columns as they are; provenance as ``prov_<key>``; nested values as JSON text."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if key == "provenance" and isinstance(value, Mapping):
            for pkey, pvalue in value.items():
                flat[f"prov_{pkey}"] = json.dumps(pvalue, sort_keys=True) if isinstance(pvalue, (dict, list)) else pvalue
        elif isinstance(value, (dict, list)):
            flat[key] = json.dumps(value, sort_keys=True)
        else:
            flat[key] = value
    return flat


def load_rows(
    root: Path | None = None, *, experiments: Iterable[str] | None = None, scale: str | None = None,
    latest_only: bool = True,
) -> pd.DataFrame:
    """All rows under ``root`` as one DataFrame (``KEY_COLUMNS`` first, then the experiments' own columns, then
    ``prov_*``); with ``latest_only`` only the newest run of every (experiment, scale, point)."""
    import pandas as pd

    root = results_dir(root)
    wanted = set(experiments) if experiments is not None else None
    records = []
    for path in run_files(root):
        if wanted is not None and path.parent.name not in wanted:
            continue
        records.extend(_flatten(r) for r in read_run(path))
    frame = pd.DataFrame.from_records(records)
    if frame.empty:
        return pd.DataFrame(columns=KEY_COLUMNS)
    if scale is not None:
        frame = frame[frame["scale"] == scale]
    if latest_only:
        frame = latest(frame)
    extra = [c for c in frame.columns if c not in KEY_COLUMNS and not c.startswith("prov_")]
    prov = [c for c in frame.columns if c.startswith("prov_")]
    return frame[KEY_COLUMNS + extra + prov].reset_index(drop=True)


def latest(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the newest run of each (experiment, scale, point), by :func:`run_time` (then by run id)."""
    import pandas as pd

    if frame.empty:
        return frame
    dates = frame["prov_date"] if "prov_date" in frame else pd.Series([None] * len(frame), index=frame.index)
    when = pd.Series([f"{run_time(r, d)}|{r}" for r, d in zip(frame["run_id"], dates)], index=frame.index)
    when = when.groupby(frame["run_id"]).transform("max")  # one time per run: its latest row's
    newest = when.groupby([frame["experiment"], frame["scale"], frame["point"]]).transform("max")
    return frame[when == newest]


def last_row(rows: pd.DataFrame | None, metric: str, **where: Any) -> pd.Series | None:
    """The newest row of ``metric`` whose columns equal ``where``; None when there are no rows, a column is
    missing, or nothing matches."""
    if rows is None or not len(rows) or "metric" not in rows:
        return None
    sel = rows[rows["metric"] == metric]
    for key, value in where.items():
        if key not in sel:
            return None
        sel = sel[sel[key] == value]
    return None if sel.empty else sel.iloc[-1]


def earlier_runs(root: Path, experiment: str, scale: str, points: Iterable[str] | None = None) -> list[Path]:
    """Run files of ``experiment`` at ``scale`` whose points are all among ``points`` (all, if None): the runs a
    ``--force`` rerun of those points replaces."""
    points = set(points) if points is not None else None
    found = []
    for path in run_files(root, experiment):
        records = read_run(path)
        scales = {r.get("scale") for r in records}
        if scales != {scale}:
            continue
        if points is None or {r.get("point") for r in records} <= points:
            found.append(path)
    return found


def value_changes(old: pd.DataFrame, new: pd.DataFrame, *, rel_tol: float = 1e-9) -> pd.DataFrame:
    """Rows whose value changed between two tables, matched on (experiment, scale, point, metric, unit) and the
    experiments' own columns; ``old_value`` is NaN for new rows and ``new_value`` NaN for vanished ones."""
    import pandas as pd

    ignore = {"run_id", "value"}
    # columns both tables have: a column an experiment added since (or dropped) must not make every row "new"
    keys = [c for c in new.columns.intersection(old.columns) if c not in ignore and not str(c).startswith("prov_")]

    def keyed(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.reindex(columns=keys + ["value"]).copy()
        frame[keys] = frame[keys].astype(str)
        return frame.drop_duplicates(subset=keys, keep="last")

    merged = keyed(old).merge(keyed(new), on=keys, how="outer", suffixes=("_old", "_new"))

    def differs(a: Any, b: Any) -> bool:
        na, nb = _isnan(a), _isnan(b)
        if na or nb:
            return na != nb
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return not math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0)
        return a != b

    mask = [differs(a, b) for a, b in zip(merged["value_old"], merged["value_new"])]
    out = merged[mask].rename(columns={"value_old": "old_value", "value_new": "new_value"})
    return out[["experiment", "scale", "point", "metric", "unit", "old_value", "new_value"]].reset_index(drop=True)


def _isnan(value: Any) -> bool:
    import pandas as pd

    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
