"""How one paper claim is decided: the value an experiment computed or measured against the paper's number, and the
verdict that follows from the kind of evidence it is (the vocabulary is :mod:`repro.vocabulary`; the report that
gathers every claim is :mod:`repro.claims`).

Every :class:`ClaimCheck` an experiment returns is made here, never by hand: :func:`check_value` (``|value - paper|
<= max(abs, rel * |paper|)``), :func:`check_range` (a claim the paper gives as a range), :func:`check_condition` (a
bound or a formula the experiment evaluated), :func:`not_run` and :func:`needs_gpu`. All of them decide through
:func:`_decided`: independent evidence is ``reproduced``/``differs``, the paper's own arithmetic
``consistent``/``inconsistent``, a configuration or fitted value is ``not counted`` (never reproduced), a quantity
another claim counts is ``same quantity``. :func:`row_evidence` reads the evidence class a stored row carries.
"""

from __future__ import annotations

import math

import pandas as pd

from repro.paper import paper_range, paper_value
from repro.vocabulary import CONSISTENCY_EVIDENCE, EVIDENCE, NOT_COUNTED_EVIDENCE, ClaimCheck


def is_missing(value: object) -> bool:
    """No value: None, or the NaN a data frame turns None into."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _check_evidence(evidence: str) -> None:
    if evidence not in EVIDENCE:
        raise ValueError(f"evidence={evidence!r} must be one of {EVIDENCE}")


def check_value(
    paper: str, claim_id: str, value: float | None, *, evidence: str, rel: float | None = None,
    abs: float | None = None, note: str = "", claims: pd.DataFrame | None = None, same_as: str = "",
) -> ClaimCheck:
    """Compare ``value`` with the paper's number for ``claim_id``: it agrees when
    ``|value - paper| <= max(abs, rel * |paper|)`` (exact when neither is given); ``not run`` when value is None.

    ``evidence`` (one of :data:`EVIDENCE`) says what kind of number ``value`` is; the caller, which computed it,
    decides (:func:`repro.paper.evidence_from`). Independent evidence is ``reproduced``/``differs``; the paper's own
    arithmetic is ``consistent``/``inconsistent``; a ``configuration`` or ``fitted`` value is never counted: its
    verdict is "not counted" and the note says whether it equals the paper's number. ``same_as``: another claim of
    the same paper states this quantity and counts it; this row is "same quantity", pointing there."""
    _check_evidence(evidence)
    if rel is not None and rel < 0 or abs is not None and abs < 0:
        raise ValueError(f"tolerances must be >= 0, got rel={rel!r} abs={abs!r}")
    target = paper_value(paper, claim_id, claims)
    parts = ([f"±{rel * 100:g}%"] if rel else []) + ([f"±{abs:g}"] if abs else [])
    tolerance = " or ".join(parts) if parts else "exact"
    if is_missing(value):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)
    allowed = max(abs or 0.0, (rel or 0.0) * builtin_abs(target))
    close = builtin_abs(float(value) - target) <= allowed + 1e-12 * max(1.0, builtin_abs(target))
    agree = "equals the paper's value" if close else "differs from the paper's value"
    return _decided(paper, claim_id, float(value), tolerance, close, agree, note, evidence, same_as)


builtin_abs = abs  # check_value's keyword ``abs`` shadows the builtin inside it


def _decided(paper: str, claim_id: str, value: float | str, tolerance: str, close: bool, agree: str, note: str,
             evidence: str, same_as: str = "", setting: str = "") -> ClaimCheck:
    """The verdict of a compared value: ``reproduced``/``differs`` (independent evidence), ``consistent``/
    ``inconsistent`` (the paper's own arithmetic), ``not counted`` (saying whether it agrees) for a configuration or
    fitted value, ``same quantity`` (saying whether it agrees) when another claim counts it."""
    if evidence in NOT_COUNTED_EVIDENCE:  # never counted, whether or not another claim states the same quantity
        what = "a setting the suite was given" if evidence == "configuration" else "an input of the fit"
        what += f" ({setting})" if setting else ""
        same = f"same quantity as {same_as}; " if same_as else ""
        note = f"{what}; {same}{agree}" + (f"; {note}" if note else "")
        return ClaimCheck(paper, claim_id, value, tolerance, "not counted", note, evidence, same_as)
    if same_as:
        note = f"same quantity as {same_as} (counted there); {agree}" + (f"; {note}" if note else "")
        return ClaimCheck(paper, claim_id, value, tolerance, "same quantity", note, evidence, same_as)
    if evidence in CONSISTENCY_EVIDENCE:
        return ClaimCheck(paper, claim_id, value, tolerance, "consistent" if close else "inconsistent", note, evidence)
    return ClaimCheck(paper, claim_id, value, tolerance, "reproduced" if close else "differs", note, evidence)


def check_range(
    paper: str, claim_id: str, value: float | None, *, evidence: str, abs: float = 0.0, note: str = "",
    claims: pd.DataFrame | None = None,
) -> ClaimCheck:
    """Compare ``value`` with a claim the paper gives as a range (``'40-45'``): it agrees when
    ``low - abs <= value <= high + abs``; otherwise as :func:`check_value` (``not run`` for None, never counted
    for a configuration or fitted value)."""
    _check_evidence(evidence)
    if abs < 0:
        raise ValueError(f"tolerances must be >= 0, got abs={abs!r}")
    low, high = paper_range(paper, claim_id, claims)
    tolerance = f"in [{low:g}, {high:g}]" + (f" ±{abs:g}" if abs else "")
    if is_missing(value):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)
    close = low - abs <= float(value) <= high + abs
    agree = "within the paper's range" if close else "outside the paper's range"
    return _decided(paper, claim_id, float(value), tolerance, close, agree, note, evidence)


def check_condition(
    paper: str, claim_id: str, value: float | str | None, *, holds: bool, tolerance: str, evidence: str,
    note: str = "", same_as: str = "", setting: str = "",
    says: tuple[str, str] = ("meets the paper's condition", "does not meet the paper's condition"),
) -> ClaimCheck:
    """A claim decided by a condition the experiment evaluated instead of ``|value - paper| <= tolerance``: a bound
    (``>= 30``), a formula checked at several configurations, a ratio in a band. ``holds`` is the outcome,
    ``tolerance`` states the condition, ``value`` is what the row shows (a number or a short text). The verdict is
    decided as :func:`check_value` decides it: ``not run`` for None, never counted for a configuration or fitted
    value, ``consistent``/``inconsistent`` for the paper's arithmetic, else ``reproduced``/``differs``. ``says``:
    how the outcome reads in the note of a row that is not counted or counted elsewhere; ``setting``: which setting
    a configuration value is."""
    _check_evidence(evidence)
    if is_missing(value):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)
    agree = says[0] if holds else says[1]  # in the note of a row that is not counted or counted elsewhere
    return _decided(paper, claim_id, value, tolerance, holds, agree, note, evidence, same_as, setting)


def row_evidence(row, experiment: str) -> str:
    """The evidence class a result row carries (its experiment's ``run_point`` decided it from the inputs); a
    ValueError naming the rerun for a row written before rows carried one."""
    evidence = row.get("evidence")
    if not isinstance(evidence, str) or not evidence:
        raise ValueError(f"{experiment} row {row.get('metric')} ({row.get('claim_id')}) of run {row.get('run_id')} "
                         f"has no evidence class: written before rows carried it; rerun `repro run {experiment} "
                         f"--scale {row.get('scale', 'ci')}`")
    return evidence


def rows_evidence(rows, experiment: str) -> str:
    """One evidence class for a check over several rows (a formula at several points): the paper's own arithmetic
    only when every row is."""
    classes = [row_evidence(row, experiment) for _, row in rows.iterrows()]
    return next((c for c in classes if c not in CONSISTENCY_EVIDENCE), classes[0])


def not_run(paper: str, claim_id: str, note: str = "", tolerance: str = "", *, evidence: str) -> ClaimCheck:
    """A mapped claim without a value yet; ``evidence`` is the kind of value its mapping will give."""
    _check_evidence(evidence)
    return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)


def needs_gpu(paper: str, claim_id: str, note: str = "", tolerance: str = "", *,
              evidence: str = "measured") -> ClaimCheck:
    """A mapped claim that only a GPU run can give a value (a measurement unless said otherwise)."""
    _check_evidence(evidence)
    return ClaimCheck(paper, claim_id, None, tolerance, "needs GPU", note, evidence)
