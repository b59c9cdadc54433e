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
#: * ``reproduced`` / ``differs``: independent evidence (:data:`COUNTED_EVIDENCE`) within / outside the tolerance;
#: * ``consistent`` / ``inconsistent``: the paper's own arithmetic on its printed numbers (``consistency``) agrees
#:   with / differs from the number it prints (shown apart, never counted as reproduced);
#: * ``same quantity``: the claim states a quantity another claim states (the same number in the abstract, a figure
#:   and a table); that claim counts and this row points to it (``same_as``);
#: * ``not counted``: a configuration the suite was given or an input of a fit (``configuration`` / ``fitted``);
#: * ``not decidable``: the rows' scale cannot decide the claim (the note names the scale that can);
#: * ``not run``: no value yet; ``needs GPU``: only a GPU or cluster run can give the value.
VERDICTS = ("reproduced", "differs", "consistent", "inconsistent", "same quantity", "not counted", "not decidable",
            "not run", "needs GPU")

#: What kind of evidence a claim row is, decided by the code that produces it:
#:
#: * ``measured``: measured by this suite (CPU or GPU; the device is in the rows' provenance);
#: * ``simulated``: computed by one of the suite's simulators (GNA tile simulator, T3 GPU model, pipeline timeline);
#: * ``predicted``: a model's output for a claim that was not an input of its fit;
#: * ``derived``: computed from something the suite built or counted itself (an instantiated module's parameters,
#:   a data file's tokens, a ledger), or a closed form applied to a different quantity than the paper's printed one;
#: * ``consistency``: the paper's own formula or arithmetic evaluated on numbers printed in the paper
#:   (:func:`repro.paper.evidence_from` decides it from the inputs): the paper agrees with itself, nothing more;
#: * ``configuration``: a setting the suite was given (shown, never counted as reproduced);
#: * ``fitted``: an input of a fit, or a statistic over the same set as a fitted target (never counted).
#:
#: A row without a value yet (``needs GPU``, ``not run``) carries the class its run will give; the report shows it
#: as ``pending``.
EVIDENCE = ("measured", "simulated", "predicted", "derived", "consistency", "configuration", "fitted")
#: Independent evidence: the classes the headline "reproduced" count includes.
COUNTED_EVIDENCE = ("measured", "simulated", "predicted", "derived")
#: The paper's arithmetic on its own numbers: counted apart ("the paper's arithmetic checks out").
CONSISTENCY_EVIDENCE = ("consistency",)
#: The classes whose rows get the verdict "not counted" whatever their value.
NOT_COUNTED_EVIDENCE = ("configuration", "fitted")


Row = dict[str, Any]


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
