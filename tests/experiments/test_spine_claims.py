"""The claims report: one row per checkable paper claim, experiments' verdicts joined, the rest classified."""

from __future__ import annotations

import pandas as pd
import pytest

from repro import claims as C
from repro import verdicts as V
from repro.claims_render import render_markdown
from repro.experiments.base import Experiment, Point
from repro.vocabulary import VERDICTS, ClaimCheck, Null

FAR = Null("far off", 1e9)  # a null no tolerance admits: agreement decides alone
from repro.paper import load_claims, paper_value, parse_value, table_key


def test_check_value_compares_within_tolerance():
    assert paper_value("zero_2019", "K_adam") == 12.0
    assert V.check_value("zero_2019", "K_adam", 12.0, evidence="derived", null=FAR).verdict == "reproduced"
    assert V.check_value("zero_2019", "K_adam", 12.51, evidence="derived", null=FAR).verdict == "differs"
    assert V.check_value("zero_2019", "K_adam", 12.49, evidence="derived", null=FAR).verdict == "reproduced"  # "12"
    ok = V.check_value("zero_2019", "K_adam", 12.5, rel=0.05, evidence="derived", null=FAR)
    assert ok.verdict == "reproduced" and ok.tolerance == "±5%"
    assert V.check_value("zero_2019", "K_adam", 13.0, abs=1.0, evidence="derived", null=FAR).verdict == "reproduced"
    assert V.check_value("zero_2019", "K_adam", None, evidence="derived").verdict == "not run"
    with pytest.raises(ValueError, match="no claim 'nope'"):
        V.check_value("zero_2019", "nope", 1.0, evidence="derived")
    with pytest.raises(ValueError, match="non-numeric"):
        V.check_value("zero_2019", "formula_pos", 1.0, evidence="derived")


def test_paper_values_and_table_keys_parse():
    assert parse_value("1,024") == 1024.0 and pd.isna(parse_value("16x32x48")) and pd.isna(parse_value(None))
    assert table_key("MEG-A: Table 1") == "table_1"
    assert table_key("MEG-A: Figure 5 bar labels") == "figure_5"
    assert table_key("ZERO-SC: Table IV (= arXiv Table 4)") == "table_iv"
    assert table_key("ZERO-A: §3.2") == "text"


def _experiment(claims_fn) -> Experiment:
    return Experiment(name="mapper", paper="zero_2019", title="t", points={"ci": (Point("a"),),
                      "paper": (Point("a"),)}, run_point=lambda p, c: [], claims=claims_fn)


def test_report_has_one_row_per_checkable_claim_with_valid_verdicts():
    claims = load_claims()
    rows = pd.DataFrame({"experiment": ["mapper"], "scale": ["ci"], "point": ["a"], "run_id": ["r"],
                         "metric": ["k"], "value": [12.0], "unit": ["-"]})
    checks = C.collect_checks([_experiment(lambda r: [V.check_value("zero_2019", "K_adam", float(r.value.iloc[0]),
                                                                    evidence="derived", null=FAR),
                                                      V.needs_gpu("zero_2019", "zero100B_pflops")])],
                              rows, scale="ci", claims=claims)
    report = C.build_report(checks, claims)
    checkable = claims[claims["value"].notna() & (claims["verbatim_or_derived"] != "not_found")]
    assert len(report) == len(checkable) and not report.duplicated(["paper", "claim_id"]).any()
    assert set(report["verdict"]) <= set(VERDICTS)
    assert list(report.columns[:9]) == ["paper", "claim_id", "quantity", "setting", "unit", "paper_value",
                                        "reproduced_value", "tolerance", "verdict"]
    k = report[report.claim_id == "K_adam"].iloc[0]
    assert (k.verdict, k.reproduced_value, k.experiment, k.command) == (
        "reproduced", 12.0, "mapper", "repro run mapper --scale ci")
    gpu = report[report.claim_id == "zero100B_pflops"].iloc[0]
    assert gpu.verdict == "needs GPU" and gpu.command.startswith("repro submit mapper --scale paper")
    # unmapped claims: GPU measurements by unit/wording, the rest "not run"
    assert report[report.claim_id == "baseline_tflops_1gpu"].verdict.item() == "needs GPU"
    assert report[report.claim_id == "t3_8p3B_wt103_ppl"].verdict.item() == "needs GPU"
    assert report[report.claim_id == "padded_vocab"].verdict.item() == "not run"


def test_bad_mappings_are_reported_not_fatal():
    def broken(rows):
        raise KeyError("oops")

    rows = pd.DataFrame(columns=["experiment", "scale", "point", "run_id", "metric", "value", "unit"])
    bad = _experiment(lambda r: [ClaimCheck("zero_2019", "no_such_claim", 1.0, "", "reproduced"),
                                 ClaimCheck("zero_2019", "K_adam", 1.0, "", "great")])
    checks = C.collect_checks([bad, Experiment(**{**bad.__dict__, "name": "broken", "claims": broken})], rows)
    text = "\n".join(checks.problems)
    assert "no_such_claim is not in paper_claims.csv" in text and "'great'" in text and "KeyError" in text
    markdown = render_markdown(C.build_report(checks), checks, scale="ci")
    assert "## Headline" in markdown and "Problems met" in markdown


def test_disagreeing_experiments_show_differs():
    rows = pd.DataFrame(columns=["experiment", "scale", "point", "run_id", "metric", "value", "unit"])
    good = _experiment(lambda r: [V.check_value("zero_2019", "K_adam", 12.0, evidence="derived")])
    bad = Experiment(**{**good.__dict__, "name": "other", "claims": lambda r: [V.check_value("zero_2019", "K_adam",
                                                                                           11.0, evidence="derived")]})
    report = C.build_report(C.collect_checks([good, bad], rows))
    row = report[report.claim_id == "K_adam"].iloc[0]
    assert row.verdict == "differs" and "also checked by mapper" in row.note


def test_verdict_changes_between_reports():
    old = pd.DataFrame({"paper": ["p", "p"], "claim_id": ["a", "b"], "verdict": ["not run", "reproduced"],
                        "reproduced_value": [None, 1.0]})
    new = pd.DataFrame({"paper": ["p", "p"], "claim_id": ["a", "b"], "verdict": ["reproduced", "reproduced"],
                        "reproduced_value": [2.0, 1.0]})
    changes = C.verdict_changes(old, new)
    assert list(changes["claim_id"]) == ["a"]
