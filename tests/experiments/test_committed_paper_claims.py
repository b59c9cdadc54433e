"""The committed ``results/paper/paper_claims.csv`` is the shared table's copy: every column the shared table has,
row for row (the committed copy adds parsed columns). Tests on a fresh clone without ``../shared`` read the copy."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from repro.paper import CLAIMS_FILE, SHARED_CLAIMS


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_committed_copy_holds_the_shared_table():
    shared = Path(os.environ["REPRO_SHARED"]) / "paper_claims.csv" if os.environ.get("REPRO_SHARED") \
        else SHARED_CLAIMS
    if not shared.exists():
        pytest.skip(f"no shared paper claims at {shared} to compare with")
    theirs, ours = _rows(shared), _rows(CLAIMS_FILE)
    assert len(ours) == len(theirs)
    for mine, source in zip(ours, theirs):
        assert {key: mine[key] for key in source} == source
