"""How one paper claim is decided: the value an experiment computed or measured against the paper's number, beside
the value of a stated naive model (its null), and the verdict that follows from the kind of evidence it is (the
vocabulary is :mod:`repro.vocabulary`; the report that gathers every claim is :mod:`repro.claims`).

Every :class:`ClaimCheck` an experiment returns is made here, never by hand: :func:`check_value` (``|value - paper|
<= max(abs, rel * |paper|, half a unit of the paper's last printed digit)``), :func:`check_range` (a claim the paper
gives as a range), :func:`check_condition` (a bound or a formula the experiment evaluated), :func:`not_run` and
:func:`needs_gpu`. All of them decide through :func:`_decided`, one rule for every paper:

* independent evidence (measured, simulated, predicted, derived) is ``reproduced`` only when its value is within the
  tolerance and its null's (:class:`repro.vocabulary.Null`) is not; within with the null also within (or no null
  stated) is ``agrees, not decisive``; outside is ``differs``;
* the paper's own arithmetic is ``consistent``/``inconsistent``; conformance to the design ``conforms``/``does not
  conform``; a configuration or fitted value is ``not counted``.

One rounding rule: a paper number is as precise as it is printed, so every comparison allows at least half a unit
of its last printed digit (``1.76`` -> +-0.005); experiments pass unrounded values. Whether a row restates a
quantity another row counts is decided by the report from the rows' ``basis`` (:func:`repro.claims.restatements`).
:func:`row_evidence` reads the evidence class a stored row carries.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from repro.paper import half_last_digit, paper_range, paper_value
from repro.vocabulary import (
    CONFORMANCE_EVIDENCE, CONSISTENCY_EVIDENCE, COUNTED_EVIDENCE, EVIDENCE, NOT_COUNTED_EVIDENCE, ClaimCheck, Null,
)

if TYPE_CHECKING:  # annotations only: pandas (~1 s of CPU) is not needed to declare a claim's check
    import pandas as pd


def is_missing(value: object) -> bool:
    """No value: None, or the NaN a data frame turns None into."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _check_evidence(evidence: str) -> None:
    if evidence not in EVIDENCE:
        raise ValueError(f"evidence={evidence!r} must be one of {EVIDENCE}")


def _basis(basis: str | tuple[str, ...] | list[str]) -> str:
    keys = [basis] if isinstance(basis, str) else list(basis)
    keys = [k.strip() for k in keys if k and k.strip()]
    if any(";" in k for k in keys):
        raise ValueError(f"basis keys may not contain ';': {keys!r}")
    return ";".join(dict.fromkeys(keys))


#: One naive model, or several: an agreement is decisive only when every one of them falls outside the tolerance.
Nulls = Null | tuple[Null, ...] | list[Null] | None


def _check_null(null: Nulls, evidence: str, claim_id: str) -> None:
    for one in _as_list(null, claim_id):
        if not isinstance(one, Null):
            raise TypeError(f"{claim_id}: null={one!r} must be a repro.vocabulary.Null")


def _as_list(null: Nulls, claim_id: str = "") -> list:
    if null is None:
        return []
    if isinstance(null, (list, tuple)):
        if not null:
            raise ValueError(f"{claim_id}: give at least one null model, or null=None")
        return list(null)
    return [null]


def _deciding(null: Nulls, within, target: float | None = None) -> tuple[Null | None, bool | None, str]:
    """The null a row is decided against, whether it meets the row's test, and the others in words. Of several
    naive models the first that agrees decides (the row is then not decisive); if none agrees, the one closest to
    the paper's value is shown."""
    nulls = _as_list(null)
    if not nulls:
        return None, None, ""
    judged = [(one, _null_within(one, within)) for one in nulls]
    agreeing = [j for j in judged if j[1]]
    compared = [j for j in judged if j[1] is False]
    if agreeing:
        pick = agreeing[0]
    elif compared and target is not None and all(isinstance(j[0].value, (int, float)) for j in compared):
        pick = min(compared, key=lambda j: builtin_abs(float(j[0].value) - target))
    else:
        pick = (compared or judged)[0]
    others = "; ".join(f"{one.name}: {_show(one.value)}" for one, _ in judged if one is not pick[0])
    return pick[0], pick[1], (f"other nulls: {others}" if others else "")


def check_value(
    paper: str, claim_id: str, value: float | None, *, evidence: str, rel: float | None = None,
    abs: float | None = None, note: str = "", claims: pd.DataFrame | None = None, null: Nulls = None,
    basis: str | tuple[str, ...] = "", same_as: str = "",
) -> ClaimCheck:
    """Compare ``value`` with the paper's number for ``claim_id``: it agrees when ``|value - paper| <= max(abs, rel *
    |paper|, half a unit of the paper's last printed digit)``; ``not run`` when value is None.

    ``evidence`` (one of :data:`EVIDENCE`) says what kind of number ``value`` is; the caller, which computed it,
    decides (:func:`repro.paper.evidence_from`). ``null``: the naive model's value on the same inputs, compared the
    same way (:class:`repro.vocabulary.Null`), or several naive models; independent evidence is ``reproduced`` only
    when every null falls outside. ``basis``: the independent quantities ``value`` was computed from (see :class:`ClaimCheck`).
    ``same_as``: a claim of the same paper whose quantity this row restates, for rows that are not compared on
    their own (never counted; a compared row says its ``basis`` instead)."""
    _check_evidence(evidence)
    _check_null(null, evidence, claim_id)
    if rel is not None and rel < 0 or abs is not None and abs < 0:
        raise ValueError(f"tolerances must be >= 0, got rel={rel!r} abs={abs!r}")
    target = paper_value(paper, claim_id, claims)
    half = half_last_digit(paper, claim_id, claims)
    allowed = max(abs or 0.0, (rel or 0.0) * builtin_abs(target), half)
    parts = ([f"±{rel * 100:g}%"] if rel else []) + ([f"±{abs:g}"] if abs else [])
    if half > max(abs or 0.0, (rel or 0.0) * builtin_abs(target)):
        parts.append(f"±{half:g} (printed precision)")
    tolerance = " or ".join(parts)

    def within(x: object) -> bool:
        return builtin_abs(float(x) - target) <= allowed + 1e-12 * max(1.0, builtin_abs(target))

    deciding, null_within, others = _deciding(null, within, float(target))
    if is_missing(value):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence,
                          **_null_fields(deciding, None))
    close = within(value)
    agree = "equals the paper's value" if close else "differs from the paper's value"
    return _decided(paper, claim_id, float(value), tolerance, close, agree, _join(note, others) if others else note,
                    evidence, same_as, null=deciding, null_within=null_within, basis=_basis(basis))


builtin_abs = abs  # check_value's keyword ``abs`` shadows the builtin inside it


def _null_within(null: Null | None, within) -> bool | None:
    """Whether the null's value meets the same test as the suite's (None: no null, a null without a value, or a
    condition the caller did not evaluate on it)."""
    if null is None:
        return None
    if null.holds is not None:
        return bool(null.holds)
    if within is None or is_missing(null.value) or isinstance(null.value, str):
        return None
    return bool(within(null.value))


def _null_fields(null: Null | None, null_within: bool | None) -> dict:
    if null is None:
        return {}
    value = null.value if not isinstance(null.value, float) or not math.isnan(null.value) else None
    return {"null": null.name, "null_value": value, "null_within": null_within}


def _decided(paper: str, claim_id: str, value: float | str, tolerance: str, close: bool, agree: str, note: str,
             evidence: str, same_as: str = "", setting: str = "", *, null: Null | None = None,
             null_within: bool | None = None, basis: str = "") -> ClaimCheck:
    """The verdict of a compared value: ``reproduced`` (independent evidence within the tolerance, its null outside),
    ``agrees, not decisive`` (within, and so is the null, or no null stated), ``differs``; ``consistent``/
    ``inconsistent`` (the paper's own arithmetic); ``conforms``/``does not conform`` (conformance); ``not counted``
    (saying whether it agrees) for a configuration or fitted value, or for a row ``same_as`` another claim."""
    fields = _null_fields(null, null_within)
    if evidence in NOT_COUNTED_EVIDENCE:  # never counted, whether or not another claim states the same quantity
        what = "a setting the suite was given" if evidence == "configuration" else "an input of the fit"
        what += f" ({setting})" if setting else ""
        same = f"same quantity as {same_as}; " if same_as else ""
        note = f"{what}; {same}{agree}" + (f"; {note}" if note else "")
        return ClaimCheck(paper, claim_id, value, tolerance, "not counted", note, evidence, same_as, basis=basis,
                          **fields)
    if evidence in CONSISTENCY_EVIDENCE:
        verdict = "consistent" if close else "inconsistent"
    elif evidence in CONFORMANCE_EVIDENCE:
        verdict = "conforms" if close else "does not conform"
    elif not close:
        verdict = "differs"
        if null_within:
            note = _join(f"the null ({null.name}: {_show(null.value)}) would agree", note)
    elif null is None:
        verdict = "agrees, not decisive"
        note = _join("no null model stated", note)
    elif null_within is None and null.reason:
        verdict = "reproduced"  # no meaningful null; the reason is shown
        note = _join(f"no null model: {null.reason}", note)
    elif null_within:
        verdict = "agrees, not decisive"
        note = _join(f"the null ({null.name}: {_show(null.value)}) agrees too", note)
    elif null_within is None:
        verdict = "agrees, not decisive"
        note = _join(f"the null ({null.name}) could not be compared", note)
    else:
        verdict = "reproduced"
    if same_as and verdict not in ("differs", "inconsistent", "does not conform"):
        # a row restating another claim's quantity by declaration (the report also finds restatements by basis)
        basis = basis or f"claim:{same_as}"
    return ClaimCheck(paper, claim_id, value, tolerance, verdict, note, evidence, "", basis=basis, **fields)


def _show(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _join(first: str, rest: str) -> str:
    return f"{first}; {rest}" if rest else first


def check_range(
    paper: str, claim_id: str, value: float | None, *, evidence: str, abs: float = 0.0, note: str = "",
    claims: pd.DataFrame | None = None, null: Nulls = None, basis: str | tuple[str, ...] = "",
) -> ClaimCheck:
    """Compare ``value`` with a claim the paper gives as a range (``'40-45'``): it agrees when
    ``low - abs <= value <= high + abs``; otherwise as :func:`check_value` (``not run`` for None, never counted
    for a configuration or fitted value, the null compared the same way)."""
    _check_evidence(evidence)
    _check_null(null, evidence, claim_id)
    if abs < 0:
        raise ValueError(f"tolerances must be >= 0, got abs={abs!r}")
    low, high = paper_range(paper, claim_id, claims)
    tolerance = f"in [{low:g}, {high:g}]" + (f" ±{abs:g}" if abs else "")
    def within(x: object) -> bool:
        return low - abs <= float(x) <= high + abs

    deciding, null_within, others = _deciding(null, within, (low + high) / 2)
    if is_missing(value):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence,
                          **_null_fields(deciding, None))
    close = within(value)
    agree = "within the paper's range" if close else "outside the paper's range"
    return _decided(paper, claim_id, float(value), tolerance, close, agree, _join(note, others) if others else note,
                    evidence, null=deciding, null_within=null_within, basis=_basis(basis))


def check_condition(
    paper: str, claim_id: str, value: float | str | None, *, holds: bool, tolerance: str, evidence: str,
    note: str = "", same_as: str = "", setting: str = "", null: Nulls = None,
    basis: str | tuple[str, ...] = "",
    says: tuple[str, str] = ("meets the paper's condition", "does not meet the paper's condition"),
) -> ClaimCheck:
    """A claim decided by a condition the experiment evaluated instead of ``|value - paper| <= tolerance``: a bound
    (``>= 30``), a formula checked at several configurations, a ratio in a band. ``holds`` is the outcome,
    ``tolerance`` states the condition, ``value`` is what the row shows (a number or a short text); ``null.holds``
    whether the naive model meets the same condition. The verdict is decided as :func:`check_value` decides it:
    ``not run`` for None, never counted for a configuration or fitted value, ``consistent``/``inconsistent`` for the
    paper's arithmetic, ``conforms``/``does not conform`` for conformance, else ``reproduced`` (the null fails the
    condition), ``agrees, not decisive`` or ``differs``. ``says``: how the outcome reads in the note of a row that is
    not counted; ``setting``: which setting a configuration value is."""
    _check_evidence(evidence)
    _check_null(null, evidence, claim_id)
    deciding, null_within, others = _deciding(null, None)
    if is_missing(value):
        return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence,
                          **_null_fields(deciding, None))
    agree = says[0] if holds else says[1]  # in the note of a row that is not counted or counted elsewhere
    return _decided(paper, claim_id, value, tolerance, holds, agree, _join(note, others) if others else note,
                    evidence, same_as, setting, null=deciding, null_within=null_within, basis=_basis(basis))


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


def not_decidable(paper: str, claim_id: str, value: float | str | None, *, reason: str, evidence: str,
                  tolerance: str = "", null: Nulls = None, basis: str | tuple[str, ...] = "") -> ClaimCheck:
    """A claim the suite covers only in part (a subset of the claim's models, an unknown definition, a quantity
    whose setting it does not have): the value it has is shown, never compared; ``reason`` says what is missing."""
    _check_evidence(evidence)
    _check_null(null, evidence, claim_id)
    if not reason.strip():
        raise ValueError(f"{claim_id}: a claim that is not decidable says why")
    value = None if is_missing(value) else value
    return ClaimCheck(paper, claim_id, value, tolerance, "not decidable", f"not decidable: {reason}", evidence,
                      basis=_basis(basis), **_null_fields(_deciding(null, None)[0], None))


def not_run(paper: str, claim_id: str, note: str = "", tolerance: str = "", *, evidence: str) -> ClaimCheck:
    """A mapped claim without a value yet; ``evidence`` is the kind of value its mapping will give."""
    _check_evidence(evidence)
    return ClaimCheck(paper, claim_id, None, tolerance, "not run", note, evidence)


def needs_gpu(paper: str, claim_id: str, note: str = "", tolerance: str = "", *,
              evidence: str = "measured") -> ClaimCheck:
    """A mapped claim that only a GPU run can give a value (a measurement unless said otherwise)."""
    _check_evidence(evidence)
    return ClaimCheck(paper, claim_id, None, tolerance, "needs GPU", note, evidence)
