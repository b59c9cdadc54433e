"""The claims report: every checkable paper claim beside the value this suite computed or measured.

``repro claims`` -> ``results/claims.csv`` (one row per claim with a value in ``paper_claims.csv``) and
``results/claims.md`` (summary, checked claims in full, the rest grouped). Verdicts:

* ``reproduced`` / ``agrees, not decisive`` / ``differs``: an experiment mapped the claim (``Experiment.claims``)
  and compared its value, independent evidence (measured, simulated, predicted, derived), with the stated tolerance:
  reproduced only where the row's null model falls outside it (:mod:`repro.verdicts`);
* ``consistent`` / ``inconsistent``: the same comparison for the paper's own arithmetic on its printed numbers
  (evidence ``consistency``), counted apart;
* ``conforms`` / ``does not conform``: a value any correct implementation of the design gives (conformance);
* ``same quantity``: the row was computed from quantities other rows already count (its ``basis``), decided here by
  :func:`restatements`, never for a disagreement;
* ``not counted``: a configuration or an input of a fit; ``not decidable``: not at the rows' scale;
* ``needs GPU``: the claim is a GPU or cluster measurement (per the experiment, or, for claims no experiment maps,
  by its unit and wording: FLOP/s, runtimes, efficiencies, trained-model scores);
* ``not run``: an experiment maps it but has no rows yet, or no experiment maps it.

Experiments build their :class:`ClaimCheck` rows with :mod:`repro.verdicts` (``check_value``, ``check_range``,
``check_condition``, ``not_run``, ``needs_gpu``), never by hand, so that one function decides every verdict; the
evidence class of a computed value comes from its inputs (:func:`repro.paper.evidence_from`). The summaries and the
markdown are :mod:`repro.claims_render`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import pandas as pd

from repro.claims_scope import ONLY_PAPER_HARDWARE, out_of_reach
from repro.vocabulary import (
    CONFORMANCE_EVIDENCE, CONSISTENCY_EVIDENCE, COUNTED_EVIDENCE, DISAGREEING, EVIDENCE, VERDICTS, ClaimCheck,
)
from repro.paper import load_claims
from repro.verdicts import is_missing

COUNTED = COUNTED_EVIDENCE

REPORT_COLUMNS = [
    "paper", "claim_id", "quantity", "setting", "unit", "paper_value", "reproduced_value", "tolerance", "verdict",
    "null", "null_value", "evidence", "evidence_when_run", "same_as", "basis", "device", "hardware", "experiment",
    "scale", "command", "note", "source", "verbatim_or_derived",
]
#: The evidence column of a row without a value yet: its class is what its run will give (``evidence_when_run``).
PENDING = "pending"


_GPU_UNIT = re.compile(r"FLOP/s|^PF|EFLOP|of peak|^days$|^s$|^minutes$|^ms$|Gbps|^GB/s$|^TB/s$", re.I)
_GPU_WORDS = re.compile(
    r"measured|throughput|runtime|iteration time|efficiency|wall|sustained|days per epoch|speedup achieved|"
    r"super-linear|largest model trained|max model size|time per|strong-scaling|weak-scaling", re.I)
_TRAINED = re.compile(r"^(perplexity|F1|EM|score|nats)$|accuracy|\bacc\b|vbench|geneval|loss", re.I)


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


#: Scales from the most decisive down: the paper's setting, one GPU node, then the CPU stand-ins.
SCALE_ORDER = ("paper", "node", "ci", "smoke")


def present_scales(rows: pd.DataFrame) -> list[str]:
    """The scales ``rows`` hold, most decisive first (:data:`SCALE_ORDER`, then any other, by name)."""
    found = set(rows["scale"]) if len(rows) else set()
    return [s for s in SCALE_ORDER if s in found] + sorted(found - set(SCALE_ORDER))


def choose_scale(rows: pd.DataFrame, scale: str) -> str:
    """The scale asked for; ``any`` -> the most decisive scale the experiment has rows at (ci when none)."""
    if scale != "any":
        return scale
    present = present_scales(rows)
    return present[0] if present else "ci"


def _at_scale(rows: pd.DataFrame, experiment: str, scale: str) -> pd.DataFrame:
    mine = rows[rows["experiment"] == experiment] if len(rows) else rows
    return mine[mine["scale"] == scale].reset_index(drop=True) if len(mine) else mine


def _by_experiment(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Experiment name -> its rows (every column, the original index), as ``rows[rows.experiment == name]``."""
    if not len(rows):
        return {}
    return {name: mine for name, mine in rows.groupby("experiment", sort=False, dropna=False)}


def _decided_elsewhere(exp, checks: list, used: str, all_rows: pd.DataFrame | None) -> tuple[list, dict[str, str]]:
    """The checks with every claim the ``used`` scale cannot decide (``exp.decided_at``) replaced: by the check its
    deciding scale's rows give, where ``all_rows`` hold such rows, else by "not decidable" naming that scale.
    Returns the checks and, per replaced claim decided elsewhere, the scale its verdict came from."""
    elsewhere = {claim: scale for claim, scale in dict(getattr(exp, "decided_at", {}) or {}).items() if scale != used}
    if not elsewhere:
        return checks, {}
    verdicts: dict[str, ClaimCheck] = {}
    for scale in sorted(set(elsewhere.values())):
        rows = _at_scale(all_rows, exp.name, scale) if all_rows is not None else pd.DataFrame()
        if len(rows):
            verdicts.update({c.claim_id: c for c in exp.claims(rows) if elsewhere.get(c.claim_id) == scale})
    out, came_from = [], {}
    for check in checks:
        scale = elsewhere.get(check.claim_id)
        if scale is None:
            out.append(check)
        elif check.claim_id in verdicts:
            decided = verdicts[check.claim_id]
            note = f"decided at scale {scale} (scale {used} cannot decide it)" + (
                f"; {decided.note}" if decided.note else "")
            out.append(dataclasses.replace(decided, note=note))
            came_from[check.claim_id] = scale
        else:
            out.append(ClaimCheck(check.paper, check.claim_id, None, check.tolerance, "not decidable",
                                  f"scale {used} cannot decide this claim; scale {scale} can "
                                  f"(repro run {exp.name} --scale {scale})", check.evidence))
    return out, came_from


def collect_checks(experiments: Iterable, rows: pd.DataFrame, *, scale: str = "any",
                   claims: pd.DataFrame | None = None, all_rows: pd.DataFrame | None = None) -> CheckSet:
    """Call every experiment's ``claims(rows)`` on its newest rows at the chosen scale. A claim that scale cannot
    decide (``Experiment.decided_at``) takes its verdict from the deciding scale's rows in ``all_rows`` (every
    scale's newest rows; default ``rows``), or is "not decidable"; the ``scale`` column says where each verdict came
    from."""
    claims = load_claims() if claims is None else claims
    all_rows = rows if all_rows is None else all_rows
    known = set(zip(claims["paper"], claims["claim_id"]))
    records, problems, scales = [], [], {}
    # one split of the (wide: every experiment's columns) frames per experiment, not one filter of them per check
    by_experiment = _by_experiment(rows)
    every_by_experiment = by_experiment if all_rows is rows else _by_experiment(all_rows)
    for exp in experiments:
        if exp.claims is None:
            continue
        mine = by_experiment.get(exp.name, rows.iloc[:0])
        every = every_by_experiment.get(exp.name, all_rows.iloc[:0])
        candidates = (present_scales(mine) if scale == "any" else [scale]) or [choose_scale(mine, scale)]
        scales[exp.name] = candidates[0]
        try:
            checks = _most_decisive(exp, candidates, mine, every)
        except Exception:  # noqa: BLE001 - one broken mapping must not hide the report
            problems.append(f"{exp.name}.claims raised:\n{traceback.format_exc()}")
            continue
        used_rows = len(_at_scale(mine, exp.name, candidates[0]))
        for check, where in checks:
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
            mismatch = _verdict_problem(check)
            if mismatch:
                problems.append(f"{exp.name}: {check.claim_id} is {check.evidence} evidence but has the verdict "
                                f"{check.verdict!r} ({mismatch})")
                continue
            if check.same_as and (check.paper, check.same_as) not in known:
                problems.append(f"{exp.name}: {check.claim_id} is the same quantity as {check.same_as!r}, which is not "
                                f"a claim of {check.paper}")
                continue
            measured = check.evidence == "measured" and check.reproduced_value is not None
            device = _devices(_at_scale(every, exp.name, where)) if measured else ""
            records.append({**check.__dict__, "device": device, "experiment": exp.name, "scale": where,
                            "rows": used_rows})
    frame = pd.DataFrame.from_records(
        records, columns=["paper", "claim_id", "reproduced_value", "tolerance", "verdict", "note", "evidence",
                          "same_as", "hardware", "null", "null_value", "null_within", "basis", "device", "experiment",
                          "scale", "rows"])
    return CheckSet(frame, problems, scales)


def _most_decisive(exp, candidates: list[str], rows: pd.DataFrame,
                   all_rows: pd.DataFrame) -> list[tuple[ClaimCheck, str]]:
    """Each claim's check from the most decisive of ``candidates`` (scales, most decisive first) whose rows give it
    a value (a GPU scale before a CPU stand-in), else from the first; with the scale it came from."""
    picked: dict[str, tuple[ClaimCheck, str]] = {}
    for used in candidates:
        checks, came_from = _decided_elsewhere(exp, exp.claims(_at_scale(rows, exp.name, used)), used, all_rows)
        for check in checks:
            where = came_from.get(check.claim_id, used)
            if not isinstance(check, ClaimCheck):
                picked.setdefault(repr(check), (check, where))
            elif check.claim_id not in picked or (is_missing(picked[check.claim_id][0].reproduced_value)
                                                  and not is_missing(check.reproduced_value)):
                picked[check.claim_id] = (check, where)
    return list(picked.values())


def _verdict_problem(check: ClaimCheck) -> str:
    """Why a compared row's verdict does not fit its evidence class ('' when it does)."""
    if check.verdict in ("reproduced", "differs", "agrees, not decisive") and check.evidence not in COUNTED:
        return "only independent evidence is 'reproduced', 'agrees, not decisive' or 'differs'"
    if check.verdict in ("consistent", "inconsistent") and check.evidence not in CONSISTENCY_EVIDENCE:
        return "'consistent' and 'inconsistent' are for consistency evidence"
    if check.verdict in ("conforms", "does not conform") and check.evidence not in CONFORMANCE_EVIDENCE:
        return "'conforms' and 'does not conform' are for conformance evidence"
    if check.verdict == "same quantity" and not check.same_as:
        return "a 'same quantity' row names the claim it points to (same_as)"
    return ""


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


def _command(experiment: str, verdict: str, scale: str) -> str:
    if verdict == "needs GPU":
        return f"repro submit {experiment} --scale paper"
    return f"repro run {experiment} --scale {scale}"


#: The order in which several experiments' rows for one claim are preferred (see :func:`speaking_row`).
_CLASS_RANK = {name: i for i, name in enumerate(EVIDENCE)}
_DISAGREES = DISAGREEING


def speaking_row(mapped: list[dict]) -> dict:
    """The row that speaks for a claim several experiments map. The rule, in order: a row with a value before one
    without; the more independent evidence class first (measured, simulated, predicted, derived, consistency,
    configuration, fitted: a measurement outranks the paper's arithmetic); at the same class a disagreement
    ("differs", "inconsistent") before an agreement, so that no check that failed is hidden behind one that passed;
    then the experiment's name. The others are named in the note with their verdicts."""
    return min(mapped, key=lambda r: (is_missing(r["reproduced_value"]),
                                      _CLASS_RANK.get(r["evidence"], len(EVIDENCE)),
                                      r["verdict"] not in _DISAGREES, r["experiment"]))


def build_report(checks: CheckSet, claims: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per checkable claim (a non-empty paper value), with the verdict of the experiments that map it
    (:func:`speaking_row` when several do). A row without a value has the evidence ``pending`` and the class its
    run will give in ``evidence_when_run``."""
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
                        "null": "", "null_value": None, "evidence": "", "evidence_when_run": "", "same_as": "",
                        "basis": "", "device": "", "hardware": "", "experiment": "", "scale": "", "command": "",
                        "note": note})
            continue
        best = speaking_row(mapped)
        others = sorted((r["experiment"], r["verdict"]) for r in mapped if r is not best)
        note = best["note"] or ""
        if others:
            note = (note + "; " if note else "") + "also checked by " + ", ".join(f"{e} ({v})" for e, v in others)
        pending = is_missing(best["reproduced_value"])
        out.append({**base, "reproduced_value": best["reproduced_value"], "tolerance": best["tolerance"],
                    "verdict": best["verdict"], "null": best.get("null") or "",
                    "null_value": best.get("null_value"), "evidence": PENDING if pending else best["evidence"],
                    "evidence_when_run": best["evidence"] if pending else "", "same_as": best.get("same_as") or "",
                    "basis": best.get("basis") or "", "device": best["device"], "hardware": best.get("hardware") or "",
                    "experiment": best["experiment"], "scale": best["scale"],
                    "command": _command(best["experiment"], best["verdict"], best["scale"]), "note": note})
    return restatements(pd.DataFrame.from_records(out, columns=REPORT_COLUMNS))


#: The verdicts of a row compared on its own, which :func:`restatements` may turn into "same quantity".
COMPARED = ("reproduced", "agrees, not decisive", "differs", "consistent", "inconsistent", "conforms",
            "does not conform")
_DECISIVENESS = {"reproduced": 0, "consistent": 0, "conforms": 0, "agrees, not decisive": 1}


def basis_keys(row: dict) -> list[str]:
    """The independent quantities a report row was computed from: its ``basis`` keys (``;``-joined), else its own
    claim; per paper."""
    basis = row.get("basis")
    keys = str(basis).split(";") if isinstance(basis, str) and basis else [f"claim:{row['claim_id']}"]
    return [f"{row['paper']}|{key}" for key in keys]


def restatements(report: pd.DataFrame) -> pd.DataFrame:
    """One counted row per independent quantity, decided from the rows' bases: a compared row whose every basis key
    another row already counts is "same quantity" pointing to it. The row that counts a quantity is chosen by one
    rule: rows of fewer keys first (a ratio of counted rows restates them); a disagreement before an agreement, so
    that no failed check hides behind one that passed (a disagreement is never "same quantity" itself); a decisive
    agreement before one that is not; the claim a declared restatement names (``same_as``) before the rows naming
    it; a value printed in the paper before one derived from it; then the claims table's order."""
    if not len(report):
        return report
    report = report.copy()
    records = report.to_dict("records")
    compared = [i for i, r in enumerate(records) if r["verdict"] in COMPARED]

    def order(i: int) -> tuple:
        r = records[i]
        keys = basis_keys(r)
        named_for_it = keys == [f"{r['paper']}|claim:{r['claim_id']}"]  # the claim whose quantity others point to
        return (len(keys), r["verdict"] not in DISAGREEING, _DECISIVENESS.get(r["verdict"], 0), not named_for_it,
                r.get("verbatim_or_derived") != "verbatim", i)

    counted_by: dict[str, str] = {}
    for i in sorted(compared, key=order):
        r = records[i]
        keys = basis_keys(r)
        if r["verdict"] in DISAGREEING or not all(k in counted_by for k in keys):
            for key in keys:
                counted_by.setdefault(key, r["claim_id"])
            continue
        owners = ";".join(dict.fromkeys(counted_by[k] for k in keys))
        report.at[i, "note"] = (f"same quantity as {owners} (counted there); on its own: {r['verdict']}"
                                + (f"; {r['note']}" if r["note"] else ""))
        report.at[i, "verdict"] = "same quantity"
        report.at[i, "same_as"] = owners
    return report


def write_report(report: pd.DataFrame, markdown: str, out_dir: Path, name: str = "claims") -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{name}.csv", out_dir / f"{name}.md"
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
