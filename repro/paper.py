"""The papers' own numbers: ``results/paper/paper_claims.csv``, a copy of ``../shared/paper_claims.csv`` with a
parsed numeric value and a table key per claim (written by ``scripts/paper_tables.py``), followed by the claims the
suite derives from a paper's printed numbers, kept apart from that copy in ``results/paper/derived_claims.csv``
(``verbatim_or_derived`` = ``derived``, e.g. the ordering Megatron-LM's Table 3 shows: perplexity falls as the model
grows). A derived claim is never a restatement of a printed value: it states what several printed values show
together, and an experiment decides it on its own evidence.

Figures and the claims report read the committed copy, so they work on a checkout without ``../shared``.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from repro.assets import paper_dir
from repro.results import REPO_ROOT

if TYPE_CHECKING:  # annotations only: pandas (~1 s of CPU) loads where the claims table is read
    import pandas as pd

PAPER_DIR = paper_dir()
CLAIMS_FILE = PAPER_DIR / "paper_claims.csv"
#: Claims derived by the suite from a paper's printed numbers (same columns; never written by paper_tables.py).
DERIVED_FILE = PAPER_DIR / "derived_claims.csv"
SHARED_CLAIMS = REPO_ROOT.parent / "shared" / "paper_claims.csv"
COLUMNS = ["paper", "claim_id", "quantity", "setting", "value", "unit", "source", "verbatim_or_derived", "notes"]

#: How each paper is named in captions.
PAPER_TITLES = {
    "megatron_lm_2019": "Megatron-LM (Shoeybi et al. 2019)",
    "zero_2019": "ZeRO (Rajbhandari et al. 2019)",
    "zero_infinity_2021": "ZeRO-Infinity (Rajbhandari et al. 2021)",
    "gna_2025": "GNA (Hassani et al. 2025)",
    "mt_nlg_2022": "MT-NLG 530B (Smith et al. 2022)",
    "t3_2024": "T3 (Pati et al. 2024)",
}

_TABLE = re.compile(r"\b(Table|Figure|Fig\.)\s*([0-9]+|[IVX]+)\b")


def parse_value(text: object) -> float:
    """The number in a value cell, NaN for formulas, shapes, ranges and words (``'1.2'`` -> 1.2)."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return float("nan")
    try:
        return float(str(text).replace(",", "").strip())
    except ValueError:
        return float("nan")


_RANGE = re.compile(r"^\s*(-?[0-9.]+)\s*-\s*([0-9.]+)\s*$")


def parse_range(text: object) -> tuple[float, float] | None:
    """The bounds of a range cell (``'40-45'`` -> ``(40.0, 45.0)``), None for anything else."""
    match = _RANGE.match(str(text)) if isinstance(text, str) else None
    if match is None:
        return None
    low, high = float(match.group(1)), float(match.group(2))
    return (low, high) if low <= high else None


def table_key(source: object) -> str:
    """``'MEG-A: Table 1'`` -> ``table_1``; ``'MEG-A: Figure 5 bar labels'`` -> ``figure_5``; prose -> ``text``."""
    source = "" if source is None or (isinstance(source, float) and math.isnan(source)) else str(source)
    match = _TABLE.search(source)
    if match:
        kind = "table" if match.group(1) == "Table" else "figure"
        return f"{kind}_{match.group(2).lower()}"
    if source.startswith("derived"):
        return "derived"
    if source.startswith("not found"):
        return "not_found"
    return "text"


def tidy(raw: pd.DataFrame) -> pd.DataFrame:
    """Add ``value_num`` and ``table`` to the raw claims table; check its columns and unique ids."""
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise ValueError(f"paper claims table lacks columns {missing}; expected {COLUMNS}")
    dupes = raw[raw.duplicated(["paper", "claim_id"], keep=False)]
    if len(dupes):
        pairs = sorted(set(zip(dupes["paper"], dupes["claim_id"])))
        raise ValueError(f"(paper, claim_id) must be unique; repeated: {pairs[:5]}")
    out = raw[COLUMNS].copy()
    out["value_num"] = out["value"].map(parse_value)
    out["table"] = out["source"].map(table_key)
    return out


def _read(path: str) -> pd.DataFrame:
    import pandas as pd

    return pd.read_csv(path, dtype={"value": str}, keep_default_na=False, na_values=[""])


def _check_derived(derived: pd.DataFrame, path: str) -> None:
    """A derived claim says so (``verbatim_or_derived`` = ``derived``, a source starting with ``derived from``):
    the report shows it as computed from the paper's numbers, never as a number the paper prints."""
    wrong = derived[(derived["verbatim_or_derived"] != "derived")
                    | ~derived["source"].astype(str).str.startswith("derived from")]
    if len(wrong):
        raise ValueError(f"{path}: claims {list(wrong['claim_id'])} must have verbatim_or_derived 'derived' and a "
                         "source 'derived from <paper>: <table>'")


@lru_cache(maxsize=4)
def _load(path: str, derived: str | None) -> pd.DataFrame:
    import pandas as pd

    raw = _read(path)
    if derived is not None:
        extra = _read(derived)
        missing = [c for c in COLUMNS if c not in extra.columns]
        if missing:
            raise ValueError(f"{derived} lacks columns {missing}; expected {COLUMNS}")
        _check_derived(extra, derived)
        raw = pd.concat([raw[COLUMNS], extra[COLUMNS]], ignore_index=True)
    return tidy(raw)  # one table: a derived id that repeats a paper's id is refused


def load_claims(path: Path | None = None, *, derived: Path | None = None) -> pd.DataFrame:
    """The paper claims table (committed copy first, ``../shared`` as a fallback), followed by the suite's derived
    claims (:data:`DERIVED_FILE`, or ``derived``) when the table is the default one."""
    return _load(*_source(path, derived)).copy()


def _source(path: Path | None, derived: Path | None) -> tuple[str, str | None]:
    """The table and derived-claims file :func:`load_claims` reads (FileNotFoundError when the table is absent)."""
    if path is None:
        path = CLAIMS_FILE if CLAIMS_FILE.exists() else SHARED_CLAIMS
        if derived is None and DERIVED_FILE.exists():
            derived = DERIVED_FILE
    if not Path(path).exists():
        raise FileNotFoundError(
            f"no paper claims table at {path}; run `python scripts/paper_tables.py` (reads {SHARED_CLAIMS})"
        )
    return str(path), None if derived is None else str(derived)


@lru_cache(maxsize=4)
def _by_id(path: str, derived: str | None) -> dict[tuple[str, str], dict]:
    """(paper, claim id) -> its row of :func:`_load`'s table (ids are unique there: :func:`tidy` refuses repeats)."""
    return {(row["paper"], row["claim_id"]): row for row in _load(path, derived).to_dict("records")}


def _claim(paper: str, claim_id: str, claims: pd.DataFrame | None) -> dict:
    """One claim's row as a dict: a dictionary look-up in the default table (the claims of every experiment ask
    for hundreds of values: filtering the table for each took seconds), else the first match in ``claims``;
    ValueError for an unknown id."""
    if claims is None:
        row = _by_id(*_source(None, None)).get((paper, claim_id))
    else:
        hit = claims[(claims["paper"] == paper) & (claims["claim_id"] == claim_id)]
        row = None if hit.empty else hit.iloc[0].to_dict()
    if row is None:
        raise ValueError(f"no claim {claim_id!r} for paper {paper!r} in the paper claims table")
    return row


class PaperNumber(float):
    """A number printed in (or computed from) a paper, as :func:`paper_value` returns it: a float that remembers
    which claim it is, so that the code computing a claim row can tell from its inputs whether the row is the
    paper's own arithmetic (:func:`evidence_from`). Arithmetic on it gives plain floats: pass the inputs themselves
    to :func:`evidence_from`, not a value computed from them."""

    paper: str
    claim_id: str

    def __new__(cls, value: float, paper: str, claim_id: str) -> "PaperNumber":
        number = super().__new__(cls, value)
        number.paper, number.claim_id = paper, claim_id
        return number

    def __reduce__(self):  # pickles (spawned ranks) keep the origin
        return PaperNumber, (float(self), self.paper, self.claim_id)


def printed(value: float, paper: str, claim_id: str) -> PaperNumber:
    """Mark a number that code holds as a constant as the paper's printed ``claim_id`` (a value the claims table
    also has: used where a formula's input is written out beside the formula, e.g. Table 1's model sizes)."""
    return PaperNumber(float(value), paper, claim_id)


def is_paper_number(value: object) -> bool:
    """True for a :class:`PaperNumber`, and for a sequence or mapping whose every item is one."""
    if isinstance(value, PaperNumber):
        return True
    if isinstance(value, dict):
        return bool(value) and all(is_paper_number(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return bool(value) and all(is_paper_number(v) for v in value)
    return False


def evidence_from(*inputs: object, otherwise: str = "derived") -> str:
    """The evidence class of a value computed from ``inputs``: ``consistency`` (the paper's own formula or arithmetic
    evaluated on numbers printed in the paper: a check that the paper agrees with itself, never counted as
    reproduced) when every input is a :class:`PaperNumber`; else ``otherwise`` (what the code computed from
    something it built, counted or measured itself: ``derived`` by default)."""
    if not inputs:
        raise ValueError("evidence_from needs the inputs the value was computed from")
    return "consistency" if all(is_paper_number(x) for x in inputs) else otherwise


def evidence_of_count(counted: float | None, closed_form: float | None, *, otherwise: str = "derived") -> str:
    """The class of a count of something the suite built: ``consistency`` when it equals the paper's closed form on
    the paper's printed shapes (the count then adds nothing to the formula: it shows the paper agrees with itself,
    and the built modules with the formula), else ``otherwise``."""
    if counted is None or closed_form is None:
        return otherwise
    return "consistency" if math.isclose(float(counted), float(closed_form), rel_tol=1e-12) else otherwise


def paper_value(paper: str, claim_id: str, claims: pd.DataFrame | None = None) -> PaperNumber:
    """The numeric value of one claim (ValueError for an unknown id or a non-numeric cell), as a
    :class:`PaperNumber`."""
    row = _claim(paper, claim_id, claims)
    value = float(row["value_num"])
    if math.isnan(value):
        raise ValueError(f"claim {paper}/{claim_id} has a non-numeric value {row['value']!r}")
    return PaperNumber(value, paper, claim_id)


def paper_text(paper: str, claim_id: str, claims: pd.DataFrame | None = None) -> str:
    """The value of one claim as the table prints it (``'OP;FC-2;FC-1;IP'``, a formula), for claims that are not
    a number; ValueError for an unknown id."""
    return str(_claim(paper, claim_id, claims)["value"])


def paper_range(paper: str, claim_id: str, claims: pd.DataFrame | None = None) -> tuple[float, float]:
    """The bounds of a claim the paper gives as a range (``'40-45'``); ValueError for anything else."""
    value = _claim(paper, claim_id, claims)["value"]
    bounds = parse_range(value)
    if bounds is None:
        raise ValueError(f"claim {paper}/{claim_id} has value {value!r}, not a range 'low-high'")
    return bounds


#: Where the claims table's value text lost the paper's printed precision (a trailing zero dropped, a size printed
#: in another unit): the text as the paper prints it, the factor to the claim's unit, and why (committed data).
PRINTED_FILE = PAPER_DIR / "printed_precision.csv"


@lru_cache(maxsize=2)
def printed_as(path: str = str(PRINTED_FILE)) -> dict[tuple[str, str], tuple[str, float]]:
    """(paper, claim id) -> (the value as the paper prints it, its unit in the claim's unit) from
    :data:`PRINTED_FILE`; empty when the file is absent."""
    import pandas as pd

    if not Path(path).exists():
        return {}
    table = pd.read_csv(path, dtype={"printed": str}, keep_default_na=False)
    return {(r.paper, r.claim_id): (r.printed, float(r.unit_factor)) for r in table.itertuples()}


def half_last_digit(paper: str, claim_id: str, claims: pd.DataFrame | None = None) -> float:
    """Half a unit of the last digit the paper prints (``'2.49'`` -> 0.005, ``'8.317'`` -> 0.0005, ``'64'`` ->
    0.5): the tolerance of a value the paper rounded, i.e. a verdict decided at the paper's printed precision. The
    printed text is the claims table's, unless :data:`PRINTED_FILE` records what the paper prints (``1.50`` stored
    as ``1.5``; ``0.5`` trillion stored as ``500`` billion)."""
    value = _claim(paper, claim_id, claims)["value"]
    text, factor = printed_as().get((paper, claim_id), (str(value), 1.0))
    text = text.replace(",", "").strip()
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0**-decimals * factor
