"""No command drops evidence: the README's main job, ``repro reproduce --scale ci``, adds its rows and writes the
report of every scale (the committed GPU and paper-scale runs stay in it); a one-scale view goes to files of its
own."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from repro.experiments import registry
from repro.harness.reproduce import make_claims, reproduce
from repro.results import REPO_ROOT


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A results directory holding the committed runs and report, as a fresh clone has them."""
    root = tmp_path_factory.mktemp("results")
    shutil.copytree(REPO_ROOT / "results" / "runs", root / "runs")
    for name in ("claims.csv", "claims.md"):
        shutil.copy(REPO_ROOT / "results" / name, root / name)
    return root


def test_reproduce_at_ci_keeps_the_gpu_rows_and_changes_no_line_whose_evidence_is_unchanged(clone):
    pytest.importorskip("matplotlib")
    lines: list[str] = []
    # one figure, the rerun experiment's own (claims_overview, drawn from these rows in test_figures_current.py,
    # took 14 s of CPU of this test's 28): the claims report of every scale is what this test reads
    out = reproduce(registry(), "ci", root=clone, only=["megatron_weak_scaling"], figures=["megatron_weak_scaling"],
                    say=lines.append)
    assert out.ok, "\n".join(lines)
    assert len(list((clone / "runs" / "megatron_weak_scaling").glob("*.jsonl"))) >= 2  # a new run beside the old
    # the analytic model gives the same rows again: the report is the committed one, line for line
    assert (clone / "claims.csv").read_text() == (REPO_ROOT / "results" / "claims.csv").read_text()
    report = pd.read_csv(clone / "claims.csv", keep_default_na=False).set_index("claim_id")
    assert "H200" in report.loc["baseline_pct_peak", "hardware"]
    assert "## Measured on GPUs" in (clone / "claims.md").read_text()
    assert not list(clone.glob("claims-*"))
    text = "\n".join(lines)
    assert "reproduced decisively" in text and "changed claims since the previous report: 0" in text


def test_a_one_scale_report_goes_to_files_of_its_own(clone):
    before = (clone / "claims.csv").read_text()
    out = make_claims(registry(), clone, "ci")
    assert [p.name for p in out.claims_files] == ["claims-ci.md", "claims-ci.csv"]
    assert (clone / "claims.csv").read_text() == before
    ci = pd.read_csv(clone / "claims-ci.csv", keep_default_na=False).set_index("claim_id")
    assert ci.loc["baseline_pct_peak", "hardware"] == ""  # the ci view has no GPU row: that is why it is apart
