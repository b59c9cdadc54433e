"""Every claim row says what kind of evidence it is, decided by the code that produces it (issue 13)."""

from __future__ import annotations

import pandas as pd
import pytest

from repro import claims as C
from repro import verdicts as V
from repro.experiments.base import Experiment, Point
from repro.vocabulary import COUNTED_EVIDENCE, EVIDENCE, NOT_COUNTED_EVIDENCE, ClaimCheck, Null

FAR = Null("far off", 1e9)  # a null no tolerance admits: agreement decides alone
from repro.results import REPO_ROOT


@pytest.fixture
def report(committed_ci_checks, committed_ci_report) -> pd.DataFrame:
    """The report ``repro claims`` builds from the committed rows (collected once per session: conftest.py)."""
    assert not committed_ci_checks.problems, committed_ci_checks.problems
    return committed_ci_report


def test_check_value_needs_a_known_evidence_class():
    with pytest.raises(TypeError):
        V.check_value("zero_2019", "K_adam", 12.0)  # the caller must decide
    with pytest.raises(ValueError, match="evidence='guess'"):
        V.check_value("zero_2019", "K_adam", 12.0, evidence="guess")
    with pytest.raises(ValueError, match="evidence="):
        V.not_run("zero_2019", "K_adam", evidence="")
    assert V.needs_gpu("zero_2019", "K_adam").evidence == "measured"


@pytest.mark.parametrize("evidence", NOT_COUNTED_EVIDENCE)
def test_configuration_and_fitted_values_are_never_counted(evidence):
    equal = V.check_value("zero_2019", "K_adam", 12.0, evidence=evidence)
    other = V.check_value("zero_2019", "K_adam", 99.0, evidence=evidence)
    assert equal.verdict == other.verdict == "not counted"
    assert "equals the paper's value" in equal.note and "differs from the paper's value" in other.note
    for counted in COUNTED_EVIDENCE:
        assert V.check_value("zero_2019", "K_adam", 12.0, evidence=counted, null=FAR).verdict == "reproduced"
    assert V.check_value("zero_2019", "K_adam", 12.0, evidence="consistency").verdict == "consistent"
    assert V.check_value("zero_2019", "K_adam", 13.0, evidence="consistency").verdict == "inconsistent"


def test_claims_decided_by_a_condition_follow_the_same_rules():
    """check_condition (a bound, a formula at several points) decides as check_value does: the evidence class, not
    the experiment, says whether an outcome counts."""
    check = lambda holds, evidence, **kw: V.check_condition(  # noqa: E731
        "zero_2019", "K_adam", 12.0, holds=holds, tolerance=">= 10", evidence=evidence,
        null=Null("no effect", 0.0, holds=False), **kw)
    for counted in COUNTED_EVIDENCE:
        assert (check(True, counted).verdict, check(False, counted).verdict) == ("reproduced", "differs")
    assert (check(True, "consistency").verdict, check(False, "consistency").verdict) == ("consistent", "inconsistent")
    for evidence in NOT_COUNTED_EVIDENCE:  # a setting that meets the condition is still not reproduced
        assert check(True, evidence).verdict == check(False, evidence).verdict == "not counted"
    given = check(True, "configuration", setting="the optimizer's", says=("equals 12", "differs from 12"))
    assert given.note.startswith("a setting the suite was given (the optimizer's); equals 12")
    elsewhere = check(False, "measured", same_as="formula_posgp")  # a disagreement is never "same quantity"
    assert elsewhere.verdict == "differs" and elsewhere.basis == ""
    restating = check(True, "measured", same_as="formula_posgp")  # the report decides from the basis
    assert restating.verdict == "reproduced" and restating.basis == "claim:formula_posgp"
    assert V.check_condition("zero_2019", "K_adam", None, holds=True, tolerance="", evidence="measured").verdict \
        == "not run"
    with pytest.raises(ValueError, match="evidence='guess'"):
        check(True, "guess")


def test_range_claims_are_checked_against_their_bounds():
    from repro.paper import parse_range

    assert parse_range("40-45") == (40.0, 45.0) and parse_range("1.5 - 2") == (1.5, 2.0)
    assert parse_range("45-40") is None and parse_range("12") is None and parse_range(12.0) is None
    check = lambda value, **kw: V.check_range("t3_2024", "nonsliced_attn_share", value, null=FAR,  # noqa: E731
                                              **kw)
    assert check(42.0, evidence="predicted").verdict == "reproduced"
    assert check(39.0, evidence="predicted").verdict == "differs"
    assert check(39.0, evidence="predicted", abs=1.0).verdict == "reproduced"
    assert check(50.5, evidence="predicted", abs=5.0).verdict == "differs"
    assert check(42.0, evidence="fitted").verdict == "not counted"
    assert check(None, evidence="predicted").verdict == "not run"
    with pytest.raises(ValueError, match="not a range"):
        V.check_range("zero_2019", "K_adam", 12.0, evidence="predicted")
    with pytest.raises(ValueError, match="abs=-1"):
        check(42.0, evidence="predicted", abs=-1)


def test_collector_refuses_rows_without_a_class_or_counted_echoes():
    rows = pd.DataFrame(columns=["experiment", "scale", "point", "run_id", "metric", "value", "unit"])
    exp = Experiment(name="mapper", paper="zero_2019", title="t", points={"ci": (Point("a"),), "paper": (Point("a"),)},
                     run_point=lambda p, c: [],
                     claims=lambda r: [ClaimCheck("zero_2019", "K_adam", 12.0, "", "reproduced"),
                                       ClaimCheck("zero_2019", "mem_formula", 16.0, "", "reproduced", "",
                                                  "configuration")])
    checks = C.collect_checks([exp], rows)
    text = "\n".join(checks.problems)
    assert "evidence '' for K_adam" in text and "mem_formula is configuration evidence" in text
    assert checks.checks.empty


def test_every_mapped_row_has_a_class_and_echoes_are_not_counted(report):
    mapped = report[report["experiment"] != ""]
    assert set(mapped["evidence"]) <= set(EVIDENCE) | {C.PENDING} and len(mapped)
    pending = mapped[mapped["evidence"] == C.PENDING]
    assert len(pending) and pending["reproduced_value"].isna().all()  # no class until a run gives a value
    assert set(pending["evidence_when_run"]) <= set(EVIDENCE)
    assert (mapped.loc[mapped["reproduced_value"].isna(), "evidence"] == C.PENDING).all()
    assert (report.loc[report["experiment"] == "", "evidence"] == "").all()
    echoes = report[report["evidence"].isin(NOT_COUNTED_EVIDENCE) & report["reproduced_value"].notna()]
    assert len(echoes) and (echoes["verdict"] == "not counted").all()
    assert not ((report["verdict"] == "not counted") & ~report["evidence"].isin(NOT_COUNTED_EVIDENCE)).any()
    # a measurement names its device (the committed report of every scale: the ci rows measure only conformance)
    committed = pd.read_csv(REPO_ROOT / "results" / "claims.csv", keep_default_na=False, na_values=[""])
    measured = committed[(committed["evidence"] == "measured") & committed["reproduced_value"].notna()]
    assert len(measured) and measured["device"].fillna("").str.len().gt(0).all()


#: A sample of rows and the class the producing code must give them: fitted inputs of the Megatron model (the
#: 4-way MP bar fixes the link constant; the 30 % of peak is circular), held-out predictions (the 8-way bar and
#: Table 7's 32-head row, its configuration; Table 2's epochs), definitions (the 1-GPU baseline over itself),
#: configuration echoes (bytes fixed by the dtypes configured), closed forms (a module count equal to the paper's
#: formula on its shapes), the simulator, the paper's own arithmetic, and measurements on this CPU.
SAMPLE = {
    ("megatron_lm_2019", "baseline_tflops_1gpu"): "fitted",
    ("megatron_lm_2019", "fig5_eff_mp_4gpu"): "fitted",
    ("megatron_lm_2019", "fig5_eff_mp_8gpu"): "predicted",
    ("megatron_lm_2019", "t7_heads32_eff"): "predicted",
    ("megatron_lm_2019", "t2_355M_days_per_epoch"): "predicted",
    ("megatron_lm_2019", "t8_strong_1gpu"): "configuration",
    ("megatron_lm_2019", "baseline_pct_peak"): "fitted",
    ("megatron_lm_2019", "t7_heads16_eff"): "predicted",
    ("megatron_lm_2019", "fig5_eff_mpdp_512gpu"): "predicted",
    ("megatron_lm_2019", "t1_8p3B_hidden"): "configuration",
    ("megatron_lm_2019", "fig5_eff_mp_1gpu"): "configuration",
    ("megatron_lm_2019", "eff_from_15p1PF"): "consistency",
    ("megatron_lm_2019", "t1_8p3B_params"): "consistency",  # the built model's count is the closed form
    ("megatron_lm_2019", "comm_allreduce_per_layer"): "conformance",  # the design's 4 all-reduces per layer
    ("mt_nlg_2022", "tflops_280n"): "fitted",
    ("mt_nlg_2022", "tflops_350n"): "predicted",
    ("mt_nlg_2022", "tflops_280n_repro"): "consistency",
    ("mt_nlg_2022", "hidden"): "configuration",
    ("zero_2019", "t2_mp16_theo_Pos"): "consistency",
    ("zero_infinity_2021", "states_1T_16B"): "consistency",  # a model sized to 1T: 16 B x 1T by construction
    ("zero_2019", "trillion_compute_ratio"): "consistency",
    ("zero_2019", "K_adam"): "configuration",  # 12 B/param: the fp32 dtypes the run configures
    ("zero_infinity_2021", "implied_peak"): "consistency",
    ("gna_2025", "fig3_na_limit"): "simulated",
    ("gna_2025", "flux_sparsity"): "consistency",
}


def test_a_sample_of_rows_has_the_class_its_code_gives(report):
    got = {(r.paper, r.claim_id): r.evidence for r in report.itertuples()}
    assert {key: got[key] for key in SAMPLE} == SAMPLE


def test_rows_compute_what_the_claim_says(report):
    row = report.set_index("claim_id")
    # 15.1 PFLOP/s / (512 x 39 TFLOP/s): the paper's arithmetic, not the model's 512-GPU prediction
    assert row.loc["eff_from_15p1PF", "reproduced_value"] == pytest.approx(100 * 15.1e15 / (512 * 39e12))
    assert row.loc["eff_from_15p1PF", "verdict"] == "consistent"
    # ZeRO Table 2: exact values decided at the paper's 0.1 B; the paper's rounding of the MP-1 value is named
    assert row.loc["t2_mp16_theo_Pos", "reproduced_value"] == pytest.approx(16 * 32 / (4 + 12 / 64))
    assert row.loc["t2_mp16_theo_Pos", "verdict"] == "inconsistent"
    assert "16 x its rounded MP-1 value 7.6" in row.loc["t2_mp16_theo_Pos", "note"]
    # 7.64 prints as 7.6, but sec 5.4's 7.5B for the same quantity does not: the disagreement counts, this points to it
    assert row.loc["t2_mp1_theo_Pos", "verdict"] == "same quantity"
    assert row.loc["t2_mp1_theo_Pos", "same_as"] == "max_model_nd64_Pos"
    assert "on its own: consistent" in row.loc["t2_mp1_theo_Pos", "note"]
    assert row.loc["t2_mp2_theo_Posg", "verdict"] == "consistent"  # 28.85 prints as 28.8


def test_summary_counts_classes_and_the_headline_only_counted_ones(report):
    from repro.claims_render import headline, summary_by_evidence

    head = headline(report)
    counted = (report["verdict"] == "reproduced") & report["evidence"].isin(COUNTED_EVIDENCE)
    assert head["reproduced"] == int(counted.sum()) == int((report["verdict"] == "reproduced").sum())
    assert head["reproduced"] == sum(head[f"reproduced_{c}"] for c in COUNTED_EVIDENCE)
    assert head["reproduced"] == sum(head[f"origin_{o}"] for o in ("verbatim", "derived", "secondary"))
    checked = report["verdict"].isin(["consistent", "inconsistent"])
    assert head["consistency"] == int(checked.sum()) >= head["consistent"] > 0
    assert (report.loc[checked, "evidence"] == "consistency").all()
    by_class = summary_by_evidence(report)
    assert int(by_class["total"].sum()) == len(report)
    assert by_class.loc[("megatron_lm_2019", "fitted"), "not counted"] >= 4


def test_evidence_is_decided_from_the_inputs():
    """The paper's formula on the paper's printed numbers is consistency; anything the suite built or counted
    among the inputs makes it derived (or the class the caller names)."""
    import pickle

    from repro.paper import PaperNumber, evidence_from, paper_value, printed

    psi, nd = paper_value("zero_2019", "K_adam"), printed(64, "zero_2019", "t2_mp1_theo_Pos")
    assert isinstance(psi, PaperNumber) and psi == 12.0 and psi.claim_id == "K_adam"
    assert evidence_from(psi, nd) == "consistency" and evidence_from([psi, nd], {"n": nd}) == "consistency"
    assert evidence_from(psi, 64) == "derived" and evidence_from(psi, 3, otherwise="simulated") == "simulated"
    assert evidence_from(psi * 2) == "derived"  # arithmetic gives a plain float: pass the inputs themselves
    assert pickle.loads(pickle.dumps(psi)).claim_id == "K_adam"
    with pytest.raises(ValueError, match="needs the inputs"):
        evidence_from()


def _mapper(name: str, checks: list) -> Experiment:
    return Experiment(name=name, paper="zero_2019", title="t", points={"ci": (Point("a"),), "paper": (Point("a"),)},
                      run_point=lambda p, c: [], claims=lambda r: checks)


def test_two_experiments_mapping_one_claim_follow_the_stated_rule():
    """C.speaking_row: a value before none, then the more independent class, then a disagreement, then the name;
    the others are named in the note."""
    rows = pd.DataFrame(columns=["experiment", "scale", "point", "run_id", "metric", "value", "unit"])

    def speaker(*experiments):
        report = C.build_report(C.collect_checks(list(experiments), rows))
        return report.set_index("claim_id").loc["K_adam"]

    arithmetic = _mapper("b_layout", [V.check_value("zero_2019", "K_adam", 12.0, evidence="consistency")])
    measured = _mapper("a_measure", [V.check_value("zero_2019", "K_adam", 13.0, evidence="measured")])
    pending = _mapper("c_gpu", [V.needs_gpu("zero_2019", "K_adam")])
    row = speaker(arithmetic, measured, pending)
    assert (row["experiment"], row["verdict"], row["evidence"]) == ("a_measure", "differs", "measured")
    assert "also checked by b_layout (consistent), c_gpu (needs GPU)" in row["note"]
    row = speaker(arithmetic, pending)
    assert (row["experiment"], row["verdict"]) == ("b_layout", "consistent")
    agree = _mapper("d_agree", [V.check_value("zero_2019", "K_adam", 12.0, evidence="measured")])
    assert speaker(agree, measured)["experiment"] == "a_measure"  # same class: the disagreement speaks
    row = speaker(pending)
    assert (row["evidence"], row["evidence_when_run"]) == (C.PENDING, "measured")


def test_same_quantity_points_to_the_claim_that_counts_it():
    rows = pd.DataFrame(columns=["experiment", "scale", "point", "run_id", "metric", "value", "unit"])
    declared = [V.check_value("zero_2019", "K_adam", 12.0, evidence="derived", null=FAR, same_as="t2_mp1_theo_Pos"),
                V.check_value("zero_2019", "t2_mp1_theo_Pos", 7.6, evidence="derived", null=FAR)]
    report = C.build_report(C.collect_checks([_mapper("m", declared)], rows)).set_index("claim_id")
    assert report.loc["K_adam", "verdict"] == "same quantity" and report.loc["K_adam", "same_as"] == "t2_mp1_theo_Pos"
    assert report.loc["K_adam", "note"].startswith("same quantity as t2_mp1_theo_Pos (counted there); on its own: "
                                                   "reproduced")
    assert report.loc["t2_mp1_theo_Pos", "verdict"] == "reproduced"


def test_readme_gives_the_committed_headline():
    """The README states the rule in one sentence and gives the committed report's counts: the decisive ones, with
    the not decisive, conformance, other-hardware and consistency counts beside them."""
    import re

    from repro.claims_render import RULE, headline

    committed = pd.read_csv(REPO_ROOT / "results" / "claims.csv", keep_default_na=False, na_values=[""])
    head = headline(committed)
    text = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert RULE[1:] in text, "README lacks the rule"  # "a claim counts as reproduced only when ..."
    found = re.search(r"\*\*(\d+) of (\d+) claims reproduced decisively\*\* \((\d+) measured, (\d+) simulated, (\d+) "
                      r"predicted, (\d+) derived\), (\d+) differ; counted apart, (\d+) agree but not decisively, "
                      r"(\d+) of (\d+) conform to the papers' designs, (\d+) claims were compared on another class of "
                      r"GPU than the paper's .*?; (\d+) agree, .*?, (\d+) are not decidable, and the papers' arithmetic "
                      r"checks out for (\d+) of (\d+) claims computed from their own printed numbers; (\d+) claims "
                      r"restate", text)
    assert found, "README lacks the headline sentence"
    assert [int(g) for g in found.groups()] == [
        head["reproduced"], head["claims"], head["reproduced_measured"], head["reproduced_simulated"],
        head["reproduced_predicted"], head["reproduced_derived"], head["differs"], head["not_decisive"],
        head["conforms"], head["conformance"], head["other_hardware"], head["other_hardware_agree"],
        head["not_decidable"], head["consistent"], head["consistency"], head["same_quantity"]]


def test_every_counted_row_names_its_null_and_basis():
    """Every compared row of independent evidence in the committed report names a null model and says what it was
    computed from; a row without a meaningful null says why."""
    committed = pd.read_csv(REPO_ROOT / "results" / "claims.csv", keep_default_na=False, na_values=[""])
    counted = committed[committed["verdict"].isin(["reproduced", "agrees, not decisive", "differs"])]
    assert len(counted) and (counted["null"].fillna("") != "").all(), counted.loc[counted["null"].isna(), "claim_id"]
    valued = counted["null_value"].notna() | counted["note"].str.contains("no null model: ")
    assert valued.all(), list(counted.loc[~valued, "claim_id"])
    assert not counted["note"].str.contains("no null model stated").any()


def test_counts_that_are_the_papers_arithmetic_are_consistency():
    """A count of built modules equal to the paper's closed form adds nothing to the paper's arithmetic on its
    printed numbers. (A simulated speedup equal to the FLOP-wise ratio stays simulated: its null, the FLOP-wise
    ratio, agrees with it, so it is not decisive; tests/experiments/test_nulls_gna.py.)"""
    from repro.paper import evidence_of_count

    assert evidence_of_count(1.2136, 1.2136) == "consistency"
    assert evidence_of_count(1.2137, 1.2136) == "derived" and evidence_of_count(None, 1.0) == "derived"
