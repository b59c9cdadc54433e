"""Every "needs GPU" claim is either mapped by a GPU experiment or out of reach with a stated reason (issue 11)."""

from __future__ import annotations

import re

import pandas as pd

from repro.claims_scope import ONLY_PAPER_HARDWARE, OUT_OF_REACH, out_of_reach
from repro.paper import load_claims
from repro.results import REPO_ROOT

UNMAPPED = "no experiment maps this claim yet"



def test_every_scope_row_covers_a_claim():
    claims = load_claims()
    for row in OUT_OF_REACH:
        ids = claims[claims["paper"] == row.paper]["claim_id"]
        assert any(re.fullmatch(row.pattern, i) for i in ids), f"{row} matches no claim of {row.paper}"


def test_no_needs_gpu_claim_is_unmapped(committed_ci_report):
    """The report ``repro claims`` writes, rebuilt from the committed result rows (as CI has them; conftest.py)."""
    report = committed_ci_report
    gpu = report[report["verdict"] == "needs GPU"]
    unmapped = set(gpu[gpu["note"].fillna("").str.contains(UNMAPPED)]["claim_id"])
    assert not unmapped, f"unmapped needs-GPU claims: {sorted(unmapped)}"
    out = gpu[gpu["note"].fillna("").str.startswith(ONLY_PAPER_HARDWARE)]
    assert len(out) and (out["experiment"] == "").all()


def test_out_of_reach_never_hides_a_mapped_claim(committed_ci_report):
    report = committed_ci_report
    mapped = report[report["experiment"] != ""]
    hidden = [r.claim_id for r in mapped.itertuples() if out_of_reach(r.paper, r.claim_id) is not None]
    assert not hidden, f"claims both mapped and declared out of reach: {hidden}"


def test_committed_report_has_no_unmapped_gpu_claim():
    report = pd.read_csv(REPO_ROOT / "results" / "claims.csv")
    gpu = report[report["verdict"] == "needs GPU"]
    assert not set(gpu[gpu["note"].fillna("").str.contains(UNMAPPED)]["claim_id"])
