"""Paper values for the performance-model tests, read from ``$REPRO_SHARED/paper_claims.csv`` where that is set,
else from the committed copy ``results/paper/paper_claims.csv``."""

from __future__ import annotations

import csv
from functools import lru_cache

import pytest

from repro.testing import paper_claims_file


@lru_cache(maxsize=1)
def _claims() -> dict[tuple[str, str], str]:
    path = paper_claims_file()
    if not path.exists():
        pytest.skip(f"paper claims not found at {path} (set REPRO_SHARED)")
    with open(path, newline="") as handle:
        return {(row["paper"], row["claim_id"]): row["value"] for row in csv.DictReader(handle)}


def paper(paper_name: str, claim_id: str) -> float:
    """The numeric value of one claim."""
    try:
        return float(_claims()[(paper_name, claim_id)])
    except KeyError:
        raise KeyError(f"no claim {paper_name}/{claim_id} in {paper_claims_file()}") from None
