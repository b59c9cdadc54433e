"""The words rows and claims are spoken in, shared by experiments, results, the claims report and the figures: a
result row, the keys the runner reserves in it, a claim check, the verdicts of the report and the kinds of evidence.

The ground floor of the report side (tests/foundation/test_layering.py): it imports nothing of repro, and everything
that writes, reads, decides or draws rows imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Keys the runner adds to every row; a row returned by ``run_point`` may not use them.
RESERVED_ROW_KEYS = ("experiment", "scale", "point", "run_id", "provenance")

#: Verdicts of the claims report:
#:
#: * ``reproduced``: independent evidence (:data:`COUNTED_EVIDENCE`) within the tolerance where the row's stated
#:   null model (:class:`Null`: no effect, linear scaling, the FLOP-wise ratio...) is not: the only verdict the
#:   headline counts;
#: * ``agrees, not decisive``: within the tolerance, but so is the null model (or the row states none): shown and
#:   counted apart;
#: * ``differs``: independent evidence outside the tolerance;
#: * ``consistent`` / ``inconsistent``: the paper's own arithmetic on its printed numbers (``consistency``) agrees
#:   with / differs from the number it prints (shown apart, never counted as reproduced);
#: * ``conforms`` / ``does not conform``: a value any correct implementation of the paper's design must give
#:   (``conformance``: collective counts by construction, bytes fixed by dtypes and shapes), tested and shown, never
#:   counted as a reproduction;
#: * ``same quantity``: the row was computed from a quantity another row already counts (its ``basis``: the same op
#:   speedup through Amdahl at another step count, the same number in the abstract and a table, a ratio of counted
#:   rows); that row counts and this one points to it (``same_as``). Decided by the report from the rows' bases
#:   (:func:`repro.claims.restatements`), never for a disagreement;
#: * ``not counted``: a configuration the suite was given or an input of a fit (``configuration`` / ``fitted``);
#: * ``not decidable``: the rows' scale cannot decide the claim (the note names the scale that can);
#: * ``not run``: no value yet; ``needs GPU``: only a GPU or cluster run can give the value.
VERDICTS = ("reproduced", "agrees, not decisive", "differs", "consistent", "inconsistent", "conforms",
            "does not conform", "same quantity", "not counted", "not decidable", "not run", "needs GPU")
#: The verdicts of a compared row that disagrees with the paper (never hidden as "same quantity").
DISAGREEING = ("differs", "inconsistent", "does not conform")

#: What kind of evidence a claim row is, decided by the code that produces it:
#:
#: * ``measured``: measured by this suite (CPU or GPU; the device is in the rows' provenance);
#: * ``simulated``: computed by one of the suite's simulators (GNA tile simulator, T3 GPU model, pipeline timeline);
#: * ``predicted``: a model's output for a claim that was not an input of its fit;
#: * ``derived``: computed from something the suite built or counted itself (an instantiated module's parameters,
#:   a data file's tokens, a ledger), or a closed form applied to a different quantity than the paper's printed one;
#: * ``conformance``: a value that any correct implementation of the paper's design must give, measured or counted
#:   on the suite's implementation (the number of all-reduces a layer's design calls for, the bytes its dtypes and
#:   shapes fix, the volume of the collectives it chooses): a test that the implementation is the design, not a
#:   reproduction of a finding;
#: * ``consistency``: the paper's own formula or arithmetic evaluated on numbers printed in the paper
#:   (:func:`repro.paper.evidence_from` decides it from the inputs): the paper agrees with itself, nothing more;
#: * ``configuration``: a setting the suite was given (shown, never counted as reproduced);
#: * ``fitted``: an input of a fit, or a statistic over the same set as a fitted target (never counted).
#:
#: A row without a value yet (``needs GPU``, ``not run``) carries the class its run will give; the report shows it
#: as ``pending``.
EVIDENCE = ("measured", "simulated", "predicted", "derived", "conformance", "consistency", "configuration", "fitted")
#: Independent evidence: the classes the headline "reproduced" count includes.
COUNTED_EVIDENCE = ("measured", "simulated", "predicted", "derived")
#: The paper's arithmetic on its own numbers: counted apart ("the paper's arithmetic checks out").
CONSISTENCY_EVIDENCE = ("consistency",)
#: Conformance to the paper's design: "conforms" / "does not conform", never counted as reproduced.
CONFORMANCE_EVIDENCE = ("conformance",)
#: The classes whose rows get the verdict "not counted" whatever their value.
NOT_COUNTED_EVIDENCE = ("configuration", "fitted")


Row = dict[str, Any]


@dataclass(frozen=True)
class Null:
    """The naive model a claim check is set against (DESIGN: "a claim beats its null"): what a reviewer would get
    without the suite's mechanism: no effect, linear or perfect scaling, a straight interpolation of the fit inputs,
    the product of the fitted factors, the FLOP-wise ratio, dtype bytes x shape, the plain CU ratio. The experiment
    that declares the claim names it and computes its ``value`` on the same inputs; a row agrees decisively only
    when the suite's value is within the tolerance and the null's is not.

    ``value``: the null's number (or short text), compared as the suite's value is; ``holds``: for a claim decided
    by a condition, whether the null meets it (the caller evaluates it). A claim with no meaningful null (a count over
    external data) gives ``value=None`` and says why in ``reason`` (:func:`no_null`)."""

    name: str
    value: float | str | None = None
    holds: bool | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("a null model has a name")
        if self.value is None and self.holds is None and not self.reason.strip():
            raise ValueError(f"null model {self.name!r}: give its value (or whether it holds), or say in `reason` "
                             "why the claim has no meaningful null")


def no_null(reason: str) -> Null:
    """A claim with no meaningful naive model (a count over external data: any other count would simply be wrong);
    ``reason`` says why, and the report shows it in the row."""
    return Null("none", None, None, reason)


@dataclass(frozen=True)
class ClaimCheck:
    """One row of the claims report: a paper claim (``paper``, ``claim_id`` as in paper_claims.csv) set beside the
    value this suite computed or measured. ``verdict`` is one of :data:`VERDICTS`; ``evidence`` one of
    :data:`EVIDENCE` (for rows without a value yet: the kind of evidence the mapping will give)."""

    paper: str
    claim_id: str
    reproduced_value: float | str | None
    tolerance: str
    verdict: str
    note: str = ""
    evidence: str = ""
    #: for the verdict "same quantity": the claim id (same paper) whose row counts this quantity
    same_as: str = ""
    #: measured on another class of GPU than the paper's: both named (repro.cross_hardware); counted apart
    hardware: str = ""
    #: the null model's name, value and whether it falls within the tolerance (None: no null, or not compared)
    null: str = ""
    null_value: float | str | None = None
    null_within: bool | None = None
    #: what the value was computed from: ';'-joined keys of independent quantities (an experiment's op speedup at a
    #: configuration, a fitted model's prediction at a point); a row whose every key another row already counts is
    #: "same quantity" (:func:`repro.claims.restatements`). Empty: the row's own quantity.
    basis: str = ""
