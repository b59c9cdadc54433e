"""Paper values for the performance-model tests, read from ``$REPRO_SHARED/paper_claims.csv`` where that is set,
else from the committed copy ``results/paper/paper_claims.csv``."""

from __future__ import annotations

import csv
import os
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def claims_path() -> Path:
    """``$REPRO_SHARED/paper_claims.csv`` where that is set, else the copy committed in ``results/paper/``: a fresh
    clone without ``../shared`` tests the models against the same numbers."""
    if os.environ.get("REPRO_SHARED"):
        return Path(os.environ["REPRO_SHARED"]) / "paper_claims.csv"
    return REPO / "results" / "paper" / "paper_claims.csv"


@lru_cache(maxsize=1)
def _claims() -> dict[tuple[str, str], str]:
    path = claims_path()
    if not path.exists():
        pytest.skip(f"paper claims not found at {path} (set REPRO_SHARED)")
    with open(path, newline="") as handle:
        return {(row["paper"], row["claim_id"]): row["value"] for row in csv.DictReader(handle)}


def paper(paper_name: str, claim_id: str) -> float:
    """The numeric value of one claim."""
    try:
        return float(_claims()[(paper_name, claim_id)])
    except KeyError:
        raise KeyError(f"no claim {paper_name}/{claim_id} in {claims_path()}") from None
