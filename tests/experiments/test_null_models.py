"""The rules that make a claim row discriminate, each on constructed rows: a null model within the tolerance makes an
agreement not decisive; a row computed from a quantity another row counts is "same quantity" (never a
disagreement); conformance is shown, not counted; a partial setting is "not decidable"; one rounding rule, the
paper's printed precision, for every paper."""

from __future__ import annotations

import pandas as pd
import pytest

from repro import claims as C
from repro import verdicts as V
from repro.claims_render import headline, render_markdown
from repro.experiments.base import Experiment, Point
from repro.vocabulary import COUNTED_EVIDENCE, Null, no_null

NO_ROWS = pd.DataFrame(columns=["experiment", "scale", "point", "run_id", "metric", "value", "unit"])


def _report(*checks) -> pd.DataFrame:
    exp = Experiment(name="constructed", paper="t3_2024", title="t", points={"ci": (Point("a"),)},
                     run_point=lambda p, c: [], claims=lambda r: list(checks))
    collected = C.collect_checks([exp], NO_ROWS)
    assert not collected.problems, collected.problems
    return C.build_report(collected).set_index("claim_id")


@pytest.mark.parametrize("evidence", COUNTED_EVIDENCE)
def test_an_agreement_is_reproduced_only_when_its_null_falls_outside(evidence):
    # e2e_train_max: 12 % +-3 points. The suite's 12.5 agrees; a null at 20 does not, one at 10 does.
    check = lambda value, null: V.check_value("t3_2024", "e2e_train_max", value, evidence=evidence,  # noqa: E731
                                              abs=3.0, null=null)
    decisive = check(12.5, Null("no overlap", 20.0))
    assert (decisive.verdict, decisive.null, decisive.null_value, decisive.null_within) == \
        ("reproduced", "no overlap", 20.0, False)
    weak = check(12.5, Null("no overlap", 10.0))
    assert weak.verdict == "agrees, not decisive" and weak.null_within is True
    assert "the null (no overlap: 10) agrees too" in weak.note
    # the tolerance edge holds for the null exactly as for the value: 15.0 is within +-3 of 12, 15.01 is not
    assert check(12.5, Null("edge", 15.0)).verdict == "agrees, not decisive"
    assert check(12.5, Null("edge", 15.01)).verdict == "reproduced"
    assert check(15.0, Null("far", 0.0)).verdict == "reproduced" and check(15.01, Null("far", 0.0)).verdict == "differs"
    unstated = check(12.5, None)
    assert unstated.verdict == "agrees, not decisive" and "no null model stated" in unstated.note
    differs = check(30.0, Null("no overlap", 12.0))
    assert differs.verdict == "differs" and "would agree" in differs.note


def test_the_tolerance_is_relative_to_the_papers_value_not_the_measured_one():
    # comm_frac_train: 34 +-10 % of 34 = +-3.4; measured-relative would allow 37.5 * 0.1 = 3.75 around 37.5
    check = lambda v: V.check_value("t3_2024", "comm_frac_train", v, evidence="predicted", rel=0.10,  # noqa: E731
                                    null=Null("zero", 0.0))
    assert check(37.4).verdict == "reproduced" and check(37.5).verdict == "differs"
    assert check(30.6).verdict == "reproduced" and check(30.5).verdict == "differs"


def test_a_claim_without_a_meaningful_null_says_why():
    check = V.check_value("megatron_lm_2019", "wt103_T0", 245566, evidence="derived",
                          null=no_null("a count over the data set: any other count is wrong"))
    assert check.verdict == "reproduced" and check.null == "none"
    assert "no null model: a count over the data set" in check.note
    with pytest.raises(ValueError, match="why the claim has no meaningful null"):
        Null("nothing")
    with pytest.raises(ValueError, match="has a name"):
        Null(" ", 1.0)
    with pytest.raises(TypeError, match="must be a repro.vocabulary.Null"):
        V.check_value("megatron_lm_2019", "wt103_T0", 245566, evidence="derived", null=("none", 1))


def test_conditions_and_ranges_take_their_null_the_same_way():
    cond = lambda holds, null: V.check_condition("t3_2024", "e2e_train_max", "ok", holds=holds,  # noqa: E731
                                                 tolerance=">= 10", evidence="simulated", null=null)
    assert cond(True, Null("no effect", 0.0, holds=False)).verdict == "reproduced"
    assert cond(True, Null("no effect", 11.0, holds=True)).verdict == "agrees, not decisive"
    assert cond(False, Null("no effect", 0.0, holds=False)).verdict == "differs"
    rng = lambda v, null: V.check_range("t3_2024", "nonsliced_attn_share", v, evidence="predicted",  # noqa: E731
                                        null=Null("half", null))
    assert rng(42.0, 50.0).verdict == "reproduced" and rng(42.0, 44.0).verdict == "agrees, not decisive"


def test_conformance_is_shown_and_never_counted():
    ok = V.check_value("megatron_lm_2019", "comm_allreduce_per_layer", 4.0, evidence="conformance")
    bad = V.check_value("megatron_lm_2019", "comm_allreduce_per_layer", 5.0, evidence="conformance")
    assert (ok.verdict, bad.verdict) == ("conforms", "does not conform")
    report = _report(V.check_value("t3_2024", "e2e_train_max", 12.0, evidence="conformance"))
    head = headline(report.reset_index())
    assert (head["reproduced"], head["conforms"], head["conformance"]) == (0, 1, 1)


def test_one_rounding_rule_the_papers_printed_precision():
    # cu_split_ideal prints 1.67: anything that rounds to it agrees, 1.675 is the edge, 1.6751 differs
    check = lambda v: V.check_value("t3_2024", "cu_split_ideal", v, evidence="consistency")  # noqa: E731
    assert check(1.6749).verdict == check(1.665).verdict == "consistent"
    assert check(1.6751).verdict == check(1.6649).verdict == "inconsistent"
    assert "(printed precision)" in check(1.67).tolerance and "0.005" in check(1.67).tolerance
    # a stated tolerance wider than the printed precision is the tolerance: the precision adds nothing
    assert V.check_value("t3_2024", "cu_split_ideal", 1.67, evidence="consistency", rel=0.1).tolerance == "±10%"


def test_a_row_computed_from_a_counted_quantity_is_same_quantity():
    """Amdahl of one simulated op speedup at two step counts is one quantity: it counts once, at the decisive row."""
    null = Null("FLOP-wise", 100.0)
    report = _report(
        V.check_value("t3_2024", "e2e_train_max", 12.0, evidence="simulated", abs=3.0, null=null, basis="op:A"),
        V.check_value("t3_2024", "e2e_infer_max", 15.0, evidence="simulated", abs=3.0, null=null, basis="op:A"),
        V.check_value("t3_2024", "e2e_train_geomean", 10.0, evidence="simulated", abs=2.5, null=null, basis="op:B"),
        # a ratio of two counted quantities restates them; one of an uncounted quantity does not
        V.check_value("t3_2024", "e2e_infer_geomean", 12.0, evidence="predicted", abs=3.0, null=null,
                      basis=("op:A", "op:B")),
        V.check_value("t3_2024", "e2e_train_t3_max", 9.0, evidence="predicted", abs=3.0, null=null,
                      basis=("op:A", "op:C")),
    )
    verdict = report["verdict"].to_dict()
    assert verdict["e2e_train_max"] == "reproduced" and verdict["e2e_train_geomean"] == "reproduced"
    assert verdict["e2e_infer_max"] == "same quantity" and report.loc["e2e_infer_max", "same_as"] == "e2e_train_max"
    assert verdict["e2e_infer_geomean"] == "same quantity"
    assert report.loc["e2e_infer_geomean", "same_as"] == "e2e_train_max;e2e_train_geomean"
    assert verdict["e2e_train_t3_max"] == "reproduced"
    assert headline(report.reset_index())["reproduced"] == 3


def test_a_disagreement_is_never_same_quantity():
    null = Null("none", 100.0)
    report = _report(
        V.check_value("t3_2024", "mca_gain_max", 29.0, evidence="predicted", abs=5.0, null=null, basis="mca"),
        V.check_value("t3_2024", "mca_gain_geomean", 9.5, evidence="predicted", abs=3.25, null=null, basis="mca"),
    )
    # mca_gain_geomean (9.5 against 13) differs: it stays visible, and the agreeing row of its quantity points to it
    assert report.loc["mca_gain_geomean", "verdict"] == "differs"
    assert report.loc["mca_gain_max", "verdict"] == "same quantity"
    assert report.loc["mca_gain_max", "same_as"] == "mca_gain_geomean"
    assert headline(report.reset_index())["reproduced"] == 0


def test_a_decisive_row_counts_before_one_that_is_not():
    report = _report(
        V.check_value("t3_2024", "e2e_train_max", 12.0, evidence="simulated", abs=3.0, null=Null("n", 13.0),
                      basis="q"),
        V.check_value("t3_2024", "e2e_infer_max", 15.0, evidence="simulated", abs=3.0, null=Null("n", 40.0),
                      basis="q"),
    )
    assert report.loc["e2e_infer_max", "verdict"] == "reproduced"
    assert report.loc["e2e_train_max", "verdict"] == "same quantity"


def test_the_report_shows_each_rows_null_and_the_rule():
    report = _report(V.check_value("t3_2024", "e2e_train_max", 12.0, evidence="simulated", abs=3.0,
                                   null=Null("no overlap", 0.0)))
    row = report.loc["e2e_train_max"]
    assert (row["null"], row["null_value"]) == ("no overlap", 0.0)
    text = render_markdown(report.reset_index(), C.CheckSet(pd.DataFrame()), scale="any")
    assert "| no overlap: 0 |" in text and "null model (no effect, linear scaling" in text
    assert "claims reproduced decisively" in text


def test_a_claim_covered_only_in_part_is_not_decidable_and_shows_its_value():
    check = V.not_decidable("t3_2024", "comm_frac_train_large", 20.7, evidence="predicted",
                            reason="the claim includes futuristic models the suite does not have")
    assert (check.verdict, check.reproduced_value) == ("not decidable", 20.7)
    assert check.note == "not decidable: the claim includes futuristic models the suite does not have"
    with pytest.raises(ValueError, match="says why"):
        V.not_decidable("t3_2024", "comm_frac_train_large", 20.7, evidence="predicted", reason=" ")
    head = headline(_report(check).reset_index())
    assert (head["not_decidable"], head["differs"], head["reproduced"]) == (1, 0, 0)


def test_the_printed_precision_is_the_papers_where_the_claims_table_lost_it():
    """results/paper/printed_precision.csv: GNA's tables print two decimals (1.50 stored as "1.5"); ZeRO's Table 2
    prints 0.5T (stored as 500 billion). Every other claim: the claims table's text."""
    from repro.paper import half_last_digit, printed_as

    assert half_last_digit("gna_2025", "t3_cosmos7b_w16x32x48_s1x1x1_sa0_flopwise") == pytest.approx(0.005)
    assert half_last_digit("gna_2025", "t2_flux1dev_4k_w80x80_s1x1_sa0_sim") == pytest.approx(0.005)  # "1.76"
    assert half_last_digit("zero_2019", "t2_mp4_theo_Posgp") == pytest.approx(50.0)
    assert half_last_digit("megatron_lm_2019", "wt103_T0") == 0.5
    # 1.494 (Cosmos' FLOP-wise cell) against the paper's 1.50: outside half a unit of the second decimal
    check = V.check_value("gna_2025", "t3_cosmos7b_w16x32x48_s1x1x1_sa0_flopwise", 1.494, evidence="consistency")
    assert check.verdict == "inconsistent" and check.tolerance == "±0.005 (printed precision)"
    for (paper, claim_id), (text, _) in printed_as().items():  # every entry names a claim and keeps its value
        from repro.paper import paper_value

        assert float(text) * printed_as()[paper, claim_id][1] == pytest.approx(paper_value(paper, claim_id))


def test_several_nulls_any_agreeing_null_makes_the_row_not_decisive():
    """Two naive models an experiment names (a straight line and a geometric one through the same fit inputs): the
    row is reproduced only when both fall outside; the one that decides is shown, the other named in the note."""
    line, geometric = Null("straight line", 20.0), Null("per-doubling", 10.5)
    both = V.check_value("t3_2024", "e2e_train_max", 12.0, evidence="predicted", abs=3.0, null=(line, geometric))
    assert (both.verdict, both.null, both.null_value) == ("agrees, not decisive", "per-doubling", 10.5)
    assert "other nulls: straight line: 20" in both.note
    far = V.check_value("t3_2024", "e2e_train_max", 12.0, evidence="predicted", abs=3.0,
                        null=(Null("a", 30.0), Null("b", 5.0)))
    assert (far.verdict, far.null, far.null_value) == ("reproduced", "b", 5.0)  # the closest is shown
    cond = V.check_condition("t3_2024", "e2e_train_max", "ok", holds=True, tolerance=">= 10", evidence="measured",
                             null=(Null("x", 1.0, holds=False), Null("y", 11.0, holds=True)))
    assert (cond.verdict, cond.null) == ("agrees, not decisive", "y")
    with pytest.raises(ValueError, match="at least one null"):
        V.check_value("t3_2024", "e2e_train_max", 12.0, evidence="predicted", null=())
