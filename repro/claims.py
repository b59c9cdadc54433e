"""The claims report: every checkable paper claim beside the value this suite computed or measured.

``repro claims`` -> ``results/claims.csv`` (one row per claim with a value in ``paper_claims.csv``) and
``results/claims.md`` (summary, checked claims in full, the rest grouped). Verdicts:

* ``reproduced`` / ``differs``: an experiment mapped the claim (``Experiment.claims``) and compared its value
  within the stated tolerance;
* ``needs GPU``: the claim is a GPU or cluster measurement (per the experiment, or, for claims no experiment maps,
  by its unit and wording: FLOP/s, runtimes, efficiencies, trained-model scores);
* ``not run``: an experiment maps it but has no rows yet, or no experiment maps it.

Experiments build their :class:`ClaimCheck` rows with :func:`check_value` (:func:`check_range` for a claim the
paper gives as a range), :func:`not_run` and :func:`needs_gpu`.
"""

from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import pandas as pd

from repro.claims_scope import ONLY_PAPER_HARDWARE, out_of_reach
from repro.experiments.base import COUNTED_EVIDENCE, EVIDENCE, NOT_COUNTED_EVIDENCE, VERDICTS, ClaimCheck
from repro.paper import PAPER_TITLES, load_claims, paper_range, paper_value

REPORT_COLUMNS = [
    "paper", "claim_id", "quantity", "setting", "unit", "paper_value", "reproduced_value", "tolerance", "verdict",
    "evidence", "device", "experiment", "scale", "command", "note", "source", "verbatim_or_derived",
]


def _check_evidence(evidence: str) -> None:
    if evidence not in EVIDENCE:
        raise ValueError(f"evidence={evidence!r} must be one of {EVIDENCE}")


def check_value(
    paper: str, claim_id: str, value: float | None, *, evidence: str, rel: float | None = None,
    abs: float | None = None, note: str = "", claims: pd.DataFrame | None = None,
) -> ClaimCheck:
    """Compare ``value`` with the paper's number for ``claim_id``: reproduced when
    ``|value - paper| <= max(abs, rel * |paper|)`` (exact when neither is given); ``not run`` when value is None.

    ``evidence`` (one of :data:`EVIDENCE`) says what kind of number ``value`` is; the caller, which computed it,
    decides. A ``configuration`` or ``fitted`` value is never counted: its verdict is "not counted" and the note says
    whether it equals the paper's number."""
    _check_evidence(evidence)
    if rel is not None and rel < 0 or abs is not None and abs < 0:
        raise ValueError(f"tolerances must be >= 0, got rel={rel!r} abs={abs!r}")
    target = paper_value(paper, claim_id, claims)
    parts = ([f"±{rel * 100:g}%"] if rel else []) + ([f"±{abs:g}"] if abs else [])
    tolerance = " or ".join(parts) if parts else "exact"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)
    allowed = max(abs or 0.0, (rel or 0.0) * builtin_abs(target))
    close = builtin_abs(float(value) - target) <= allowed + 1e-12 * max(1.0, builtin_abs(target))
    agree = "equals the paper's value" if close else "differs from the paper's value"
    return _decided(paper, claim_id, float(value), tolerance, close, agree, note, evidence)


builtin_abs = abs  # check_value's keyword ``abs`` shadows the builtin inside it


def _decided(paper: str, claim_id: str, value: float, tolerance: str, close: bool, agree: str, note: str,
             evidence: str) -> ClaimCheck:
    """The verdict of a compared value: ``reproduced``/``differs``, or ``not counted`` (saying whether it agrees)
    for a configuration or fitted value."""
    if evidence in NOT_COUNTED_EVIDENCE:
        what = "a setting the suite was given" if evidence == "configuration" else "an input of the fit"
        note = f"{what}; {agree}" + (f"; {note}" if note else "")
        return ClaimCheck(paper, claim_id, value, tolerance, "not counted", note, evidence)
    return ClaimCheck(paper, claim_id, value, tolerance, "reproduced" if close else "differs", note, evidence)


def check_range(
    paper: str, claim_id: str, value: float | None, *, evidence: str, abs: float = 0.0, note: str = "",
    claims: pd.DataFrame | None = None,
) -> ClaimCheck:
    """Compare ``value`` with a claim the paper gives as a range (``'40-45'``): reproduced when
    ``low - abs <= value <= high + abs``; otherwise as :func:`check_value` (``not run`` for None, never counted
    for a configuration or fitted value)."""
    _check_evidence(evidence)
    if abs < 0:
        raise ValueError(f"tolerances must be >= 0, got abs={abs!r}")
    low, high = paper_range(paper, claim_id, claims)
    tolerance = f"in [{low:g}, {high:g}]" + (f" ±{abs:g}" if abs else "")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)
    close = low - abs <= float(value) <= high + abs
    agree = "within the paper's range" if close else "outside the paper's range"
    return _decided(paper, claim_id, float(value), tolerance, close, agree, note, evidence)


def not_run(paper: str, claim_id: str, note: str = "", tolerance: str = "", *, evidence: str) -> ClaimCheck:
    """A mapped claim without a value yet; ``evidence`` is the kind of value its mapping will give."""
    _check_evidence(evidence)
    return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)


def needs_gpu(paper: str, claim_id: str, note: str = "", tolerance: str = "", *,
              evidence: str = "measured") -> ClaimCheck:
    """A mapped claim that only a GPU run can give a value (a measurement unless said otherwise)."""
    _check_evidence(evidence)
    return ClaimCheck(paper, claim_id, None, tolerance, "needs GPU", note, evidence)


_GPU_UNIT = re.compile(r"FLOP/s|^PF|EFLOP|of peak|^days$|^s$|^minutes$|^ms$|Gbps|^GB/s$|^TB/s$", re.I)
_GPU_WORDS = re.compile(
    r"measured|throughput|runtime|iteration time|efficiency|wall|sustained|days per epoch|speedup achieved|"
    r"super-linear|largest model trained|max model size|time per|strong-scaling|weak-scaling", re.I)
_TRAINED = re.compile(r"^(perplexity|F1|EM|score|nats)$|accuracy|vbench|geneval|loss", re.I)


def is_gpu_measurement(unit: object, quantity: object) -> bool:
    """Whether an unmapped claim can only be checked with GPUs (hardware speed, or a trained large model)."""
    unit, quantity = str(unit or ""), str(quantity or "")
    return bool(_GPU_UNIT.search(unit) or _GPU_WORDS.search(quantity) or _TRAINED.search(unit)
                or _TRAINED.search(quantity))


@dataclass
class CheckSet:
    """The ClaimChecks returned by the experiments, plus the problems met while collecting them."""

    checks: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    scales: dict[str, str] = field(default_factory=dict)  # experiment -> scale whose rows were used


def choose_scale(rows: pd.DataFrame, scale: str) -> str:
    """The scale asked for; ``any`` -> paper when the experiment has paper-scale rows, else ci, else smoke."""
    if scale != "any":
        return scale
    for candidate in ("paper", "ci", "smoke"):
        if len(rows) and (rows["scale"] == candidate).any():
            return candidate
    return "ci"


def collect_checks(experiments: Iterable, rows: pd.DataFrame, *, scale: str = "any",
                   claims: pd.DataFrame | None = None) -> CheckSet:
    """Call every experiment's ``claims(rows)`` on its newest rows at the chosen scale."""
    claims = load_claims() if claims is None else claims
    known = set(zip(claims["paper"], claims["claim_id"]))
    records, problems, scales = [], [], {}
    for exp in experiments:
        if exp.claims is None:
            continue
        mine = rows[rows["experiment"] == exp.name] if len(rows) else rows
        used = choose_scale(mine, scale)
        scales[exp.name] = used
        mine = mine[mine["scale"] == used].reset_index(drop=True) if len(mine) else mine
        devices = _devices(mine)
        try:
            checks = exp.claims(mine)
        except Exception:  # noqa: BLE001 - one broken mapping must not hide the report
            problems.append(f"{exp.name}.claims raised:\n{traceback.format_exc()}")
            continue
        for check in checks:
            if not isinstance(check, ClaimCheck):
                problems.append(f"{exp.name}.claims returned {check!r}, not a ClaimCheck")
                continue
            if (check.paper, check.claim_id) not in known:
                problems.append(f"{exp.name}: claim {check.paper}/{check.claim_id} is not in paper_claims.csv")
                continue
            if check.verdict not in VERDICTS:
                problems.append(f"{exp.name}: verdict {check.verdict!r} for {check.claim_id} is not in {VERDICTS}")
                continue
            if check.evidence not in EVIDENCE:
                problems.append(f"{exp.name}: evidence {check.evidence!r} for {check.claim_id} is not in {EVIDENCE}")
                continue
            if check.verdict in ("reproduced", "differs") and check.evidence in NOT_COUNTED_EVIDENCE:
                problems.append(f"{exp.name}: {check.claim_id} is {check.evidence} evidence but has the verdict "
                                f"{check.verdict!r} (such rows are 'not counted')")
                continue
            device = devices if check.evidence == "measured" and check.reproduced_value is not None else ""
            records.append({**check.__dict__, "device": device, "experiment": exp.name, "scale": used,
                            "rows": len(mine)})
    frame = pd.DataFrame.from_records(
        records, columns=["paper", "claim_id", "reproduced_value", "tolerance", "verdict", "note", "evidence",
                          "device", "experiment", "scale", "rows"])
    return CheckSet(frame, problems, scales)


def _devices(rows: pd.DataFrame) -> str:
    """The devices named in the rows' provenance (what a ``measured`` value was measured on)."""
    if not len(rows):
        return ""
    if "prov_device" in rows:  # results.load_rows flattens the provenance into prov_* columns
        found = {d for d in rows["prov_device"] if isinstance(d, str) and d}
    elif "provenance" in rows:
        found = {p.get("device") for p in rows["provenance"] if isinstance(p, dict) and p.get("device")}
    else:
        return ""
    return "; ".join(sorted(found))


_RANK = {"differs": 0, "reproduced": 1, "not counted": 2, "needs GPU": 3, "not run": 4}


def _command(experiment: str, verdict: str, scale: str) -> str:
    if verdict == "needs GPU":
        return f"repro submit {experiment} --scale paper"
    return f"repro run {experiment} --scale {scale}"


def build_report(checks: CheckSet, claims: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per checkable claim (a non-empty paper value), with the verdict of the experiments that map it."""
    claims = load_claims() if claims is None else claims
    checkable = claims[claims["value"].notna() & (claims["verbatim_or_derived"] != "not_found")]
    by_claim: dict[tuple[str, str], list[dict]] = {}
    for record in checks.checks.to_dict("records"):
        by_claim.setdefault((record["paper"], record["claim_id"]), []).append(record)
    out = []
    for claim in checkable.to_dict("records"):
        key = (claim["paper"], claim["claim_id"])
        base = {
            "paper": claim["paper"], "claim_id": claim["claim_id"], "quantity": claim["quantity"],
            "setting": claim["setting"], "unit": claim["unit"], "paper_value": claim["value"],
            "source": claim["source"], "verbatim_or_derived": claim["verbatim_or_derived"],
        }
        mapped = by_claim.get(key)
        if not mapped:
            gpu = is_gpu_measurement(claim["unit"], claim["quantity"])
            scope = out_of_reach(claim["paper"], claim["claim_id"]) if gpu else None
            note = f"{ONLY_PAPER_HARDWARE}: {scope.reason}" if scope else "no experiment maps this claim yet"
            out.append({**base, "reproduced_value": None, "tolerance": "", "verdict": "needs GPU" if gpu else "not run",
                        "evidence": "", "device": "", "experiment": "", "scale": "", "command": "", "note": note})
            continue
        # Several experiments may check one claim: a disagreement ("differs") wins over agreement.
        best = min(mapped, key=lambda r: (r["reproduced_value"] is None, _RANK[r["verdict"]]))
        others = sorted({r["experiment"] for r in mapped} - {best["experiment"]})
        note = best["note"] or ""
        if others:
            note = (note + "; " if note else "") + f"also checked by {', '.join(others)}"
        out.append({**base, "reproduced_value": best["reproduced_value"], "tolerance": best["tolerance"],
                    "verdict": best["verdict"], "evidence": best["evidence"], "device": best["device"],
                    "experiment": best["experiment"], "scale": best["scale"],
                    "command": _command(best["experiment"], best["verdict"], best["scale"]), "note": note})
    return pd.DataFrame.from_records(out, columns=REPORT_COLUMNS)


def summary(report: pd.DataFrame) -> pd.DataFrame:
    """Counts of each verdict per paper (plus a total row)."""
    table = pd.crosstab(report["paper"], report["verdict"]).reindex(columns=list(VERDICTS), fill_value=0)
    table["total"] = table.sum(axis=1)
    table.loc["all"] = table.sum(axis=0)
    return table


#: Evidence label of rows no experiment maps.
UNMAPPED = "unmapped"


def summary_by_evidence(report: pd.DataFrame) -> pd.DataFrame:
    """Counts of each verdict per (paper, evidence class), classes in :data:`EVIDENCE` order, unmapped last."""
    evidence = report["evidence"].fillna("").replace("", UNMAPPED)
    order = {name: i for i, name in enumerate((*EVIDENCE, UNMAPPED))}
    table = pd.crosstab([report["paper"], evidence.rename("evidence")], report["verdict"])
    table = table.reindex(columns=list(VERDICTS), fill_value=0)
    table = table.iloc[sorted(range(len(table)), key=lambda i: (table.index[i][0], order[table.index[i][1]]))]
    table["total"] = table.sum(axis=1)
    return table


def headline(report: pd.DataFrame) -> dict[str, int]:
    """The counts the report leads with: reproduced by a counted class (measured, simulated, predicted, derived),
    reproduced only by arithmetic on the paper's own numbers, and configuration/fitted rows (never counted)."""
    reproduced = report["verdict"] == "reproduced"
    return {
        "claims": len(report),
        "reproduced": int((reproduced & report["evidence"].isin(COUNTED_EVIDENCE)).sum()),
        "differs": int(((report["verdict"] == "differs") & report["evidence"].isin(COUNTED_EVIDENCE)).sum()),
        "arithmetic_reproduced": int((reproduced & (report["evidence"] == "arithmetic")).sum()),
        "not_counted": int((report["verdict"] == "not counted").sum()),
        **{f"reproduced_{c}": int((reproduced & (report["evidence"] == c)).sum()) for c in COUNTED_EVIDENCE},
    }


def _fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _short(text: object, width: int = 120) -> str:
    text = _fmt(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def render_markdown(report: pd.DataFrame, checks: CheckSet, *, scale: str, rows_info: str = "") -> str:
    """The human-readable report: summary, per experiment, then per paper the checked claims in full."""
    lines = [f"# Claims report (scale: {scale})", ""]
    lines += [
        "Every claim of `results/paper/paper_claims.csv` that has a value, set beside what this suite computed or "
        "measured. Verdicts: reproduced / differs (within the stated tolerance), not counted (a configuration the "
        "suite was given or an input of a fit: shown, never counted), needs GPU (a GPU or cluster measurement), not "
        "run (no rows yet, or no experiment maps the claim). Regenerate with "
        f"`repro claims --scale {scale}` (or `repro reproduce --scale ci`).", ""]
    lines += [
        "Evidence classes, decided by the code that produces each row: **measured** (by this suite, on the device "
        "named in the `device` column of claims.csv), **simulated** (the suite's simulators), **predicted** (a "
        "model whose fit did not use the claim), **derived** (a closed form or count the suite implements), "
        "**arithmetic** (computed only from other numbers printed in the paper), **configuration** (a setting the "
        "suite was given), **fitted** (an input of a fit); *unmapped*: no experiment maps the claim.", ""]
    if rows_info:
        lines += [rows_info, ""]
    head = headline(report)
    by_class = ", ".join(f"{head['reproduced_' + c]} {c}" for c in COUNTED_EVIDENCE)
    lines += ["## Summary", "",
              f"**{head['reproduced']} of {head['claims']} claims reproduced** by measurement, simulation, "
              f"prediction or derivation ({by_class}); "
              f"{head['differs']} differ. Not in that count: {head['arithmetic_reproduced']} more agree only by "
              f"arithmetic on the paper's own numbers, and {head['not_counted']} configuration or fitted rows are "
              "shown but never counted.", ""]
    lines += ["| paper | " + " | ".join(VERDICTS) + " | total |", "|---|" + "---:|" * (len(VERDICTS) + 1)]
    for paper, counts in summary(report).iterrows():
        lines.append(f"| {paper} | " + " | ".join(str(int(counts[v])) for v in VERDICTS)
                     + f" | {int(counts['total'])} |")
    lines += ["", "### By paper and evidence class", "",
              "| paper | evidence | " + " | ".join(VERDICTS) + " | total |",
              "|---|---|" + "---:|" * (len(VERDICTS) + 1)]
    for (paper, evidence), counts in summary_by_evidence(report).iterrows():
        lines.append(f"| {paper} | {evidence} | " + " | ".join(str(int(counts[v])) for v in VERDICTS)
                     + f" | {int(counts['total'])} |")
    if checks.scales:
        lines += ["", "## Experiments", "", "| experiment | rows used (scale) | claims mapped | reproduced | differs |",
                  "|---|---|---:|---:|---:|"]
        for name in sorted(checks.scales):
            mine = checks.checks[checks.checks["experiment"] == name]
            n_rows = int(mine["rows"].iloc[0]) if len(mine) else 0
            lines.append(f"| {name} | {n_rows} ({checks.scales[name]}) | {len(mine)} | "
                         f"{int((mine['verdict'] == 'reproduced').sum())} | {int((mine['verdict'] == 'differs').sum())} |")
    if checks.problems:
        lines += ["", "## Problems met while collecting claims", ""]
        lines += [f"- {p.strip().splitlines()[0]}" for p in checks.problems]
    for paper, group in report.groupby("paper", sort=False):
        lines += ["", f"## {PAPER_TITLES.get(paper, paper)}", ""]
        mapped = group[group["experiment"] != ""]
        if len(mapped):
            lines += ["| claim_id | quantity | setting | paper | this suite | tolerance | verdict | evidence | command "
                      "| note |", "|---|---|---|---:|---:|---|---|---|---|---|"]
            for row in mapped.itertuples():
                unit = "" if row.unit in ("-", "") else f" {row.unit}"
                lines.append(
                    f"| {row.claim_id} | {_fmt(row.quantity)} | {_fmt(row.setting)} | {_fmt(row.paper_value)}{unit} | "
                    f"{_fmt(row.reproduced_value)} | {_fmt(row.tolerance)} | **{row.verdict}** | {row.evidence} | "
                    f"`{row.command}` | {_short(row.note)} |")
        rest = group[group["experiment"] == ""]
        if len(rest):
            lines += ["", f"Not mapped by any experiment yet ({len(rest)} claims; full rows in `claims.csv`):", ""]
            for verdict, sub in rest.groupby("verdict", sort=True):
                lines.append(f"- *{verdict}*: " + ", ".join(f"`{c}`" for c in sub["claim_id"]))
    return "\n".join(lines) + "\n"


def write_report(report: pd.DataFrame, markdown: str, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "claims.csv", out_dir / "claims.md"
    report.to_csv(csv_path, index=False)
    md_path.write_text(markdown, encoding="utf-8")
    return md_path, csv_path


def verdict_changes(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Claims whose verdict or reproduced value changed between two reports."""
    cols = ["paper", "claim_id", "verdict", "reproduced_value"]
    merged = old.reindex(columns=cols).merge(new.reindex(columns=cols), on=["paper", "claim_id"], how="outer",
                                             suffixes=("_old", "_new"))

    def same(a: object, b: object) -> bool:
        if pd.isna(a) and pd.isna(b):
            return True
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except (TypeError, ValueError):
            return str(a) == str(b)

    keep = [not (same(r.verdict_old, r.verdict_new) and same(r.reproduced_value_old, r.reproduced_value_new))
            for r in merged.itertuples()]
    return merged[keep].reset_index(drop=True)
