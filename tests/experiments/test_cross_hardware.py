"""The cross-hardware rule (repro.cross_hardware) and the GPU runs read by the claims report.

An H200's 35.0 % of peak must not "reproduce" a V100's 30 % with nothing saying two GPUs were compared: absolute
quantities are compared only on the paper's class of GPU (on another, the value is shown with both GPUs named, "not
decidable"); normalised ones anywhere, named and counted apart.
"""

from __future__ import annotations

import pandas as pd
import pytest

from repro import claims as C
from repro import verdicts as V
from repro.claims_render import OTHER_HARDWARE, headline, summary
from repro.vocabulary import Null
from repro.cross_hardware import ABSOLUTE, ESTIMATE, NORMALISED, compare, gpu_class, hardware_label
from repro.experiments.base import Experiment, Point
from repro.vocabulary import ClaimCheck
from repro.results import REPO_ROOT

PAPER = "megatron_lm_2019"


@pytest.mark.parametrize("name,cls", [("NVIDIA H200", "H200"), ("Tesla V100-SXM2-32GB", "V100"),
                                      ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA GB200", "GB200"),
                                      ("NVIDIA B200", "B200"), ("NVIDIA H100 80GB HBM3", "H100"), ("cpu", None),
                                      (None, None)])
def test_gpu_classes_are_read_from_device_names(name, cls):
    assert gpu_class(name) == cls


def test_an_absolute_quantity_on_another_gpu_is_shown_not_compared_and_names_both():
    check = compare(PAPER, "baseline_tflops_1gpu", 345.9, gpu="NVIDIA H200", kind=ABSOLUTE, rel=0.1, unit=" TFLOP/s",
                    null=Null("plain", 350.0), basis="e:tflops")
    assert (check.verdict, check.reproduced_value, check.evidence) == ("not decidable", 345.9, "measured")
    assert check.hardware == "NVIDIA H200 (paper: V100)" and check.basis == "e:tflops"
    assert "on the paper's V100 only; measured on NVIDIA H200: 345.9 TFLOP/s" in check.note
    checks = C.CheckSet(pd.DataFrame([{**check.__dict__, "device": "cuda (NVIDIA H200 x1)", "experiment": "e",
                                       "scale": "node", "rows": 1}]))
    report = C.build_report(checks)
    assert headline(report)["other_hardware"] == 0  # shown, never counted, not even apart
    assert summary(report).loc[PAPER, "not decidable"] == 1
    on_v100 = compare(PAPER, "baseline_tflops_1gpu", 38.0, gpu="Tesla V100-SXM3-32GB", kind=ABSOLUTE, rel=0.1,
                      null=Null("far off", 1e9))
    assert (on_v100.verdict, on_v100.hardware) == ("reproduced", "")


def test_a_normalised_quantity_on_another_gpu_is_compared_named_and_counted_apart():
    check = compare(PAPER, "baseline_pct_peak", 35.0, gpu="NVIDIA H200", kind=NORMALISED, abs=5,
                    null=Null("far off", 1e9))
    assert check.verdict == "reproduced" and check.hardware == "NVIDIA H200 (paper: V100)"
    assert check.note.startswith("on other hardware: NVIDIA H200 (paper: V100)")
    assert hardware_label(PAPER, "Tesla V100-SXM2-32GB") == ""
    checks = C.CheckSet(pd.DataFrame([{**check.__dict__, "device": "cuda (NVIDIA H200 x1)", "experiment": "e",
                                       "scale": "node", "rows": 1}]))
    report = C.build_report(checks)
    head = headline(report)
    assert (head["other_hardware"], head["other_hardware_agree"]) == (1, 1)
    row = report[report["claim_id"] == "baseline_pct_peak"].iloc[0]
    assert row["hardware"] == "NVIDIA H200 (paper: V100)"
    assert summary(report).loc[PAPER, OTHER_HARDWARE] == 1 and summary(report).loc[PAPER, "reproduced"] == 0


def test_an_estimate_is_never_measured_evidence_and_no_gpu_decides_nothing():
    with pytest.raises(ValueError, match="not itself measured evidence"):
        compare("gna_2025", "flux_e2e_concl", 1.4, gpu="NVIDIA H200", kind=ESTIMATE, evidence="measured")
    estimate = compare("gna_2025", "flux_e2e_concl", 1.41, gpu="NVIDIA H200", kind=ESTIMATE, evidence="predicted",
                       rel=0.1)
    assert estimate.evidence == "predicted" and estimate.hardware == "NVIDIA H200 (paper: B200)"
    stand_in = compare(PAPER, "baseline_pct_peak", 12.0, gpu=None, kind=NORMALISED, abs=5)
    assert stand_in.verdict == "needs GPU" and "CPU stand-in" in stand_in.note
    with pytest.raises(ValueError, match="kind="):
        compare(PAPER, "baseline_pct_peak", 1.0, gpu="NVIDIA H200", kind="relative")


def test_a_claim_takes_its_value_from_the_most_decisive_scale_that_has_one():
    """Paper-scale rows without this claim's point, node-scale rows with it: the node value speaks, and says so;
    a claim no scale gives a value keeps the most decisive scale's verdict."""
    def claims(rows):
        value = rows["value"].iloc[0] if len(rows) and (rows["point"] == "one_gpu").any() else None
        return [V.check_value(PAPER, "baseline_pct_peak", value, evidence="measured", abs=5),
                V.not_run(PAPER, "baseline_tflops_1gpu", evidence="measured")]

    exp = Experiment(name="e", paper=PAPER, title="t", points={"ci": (Point("one_gpu", {}),)},
                     run_point=lambda point, ctx: [], claims=claims)
    rows = pd.DataFrame([{"experiment": "e", "scale": "paper", "point": "many_gpus", "metric": "m", "value": 1.0},
                         {"experiment": "e", "scale": "node", "point": "one_gpu", "metric": "m", "value": 31.0},
                         {"experiment": "e", "scale": "smoke", "point": "one_gpu", "metric": "m", "value": 99.0}])
    got = C.collect_checks([exp], rows)
    by_id = {r["claim_id"]: r for r in got.checks.to_dict("records")}
    assert (by_id["baseline_pct_peak"]["reproduced_value"], by_id["baseline_pct_peak"]["scale"]) == (31.0, "node")
    assert by_id["baseline_tflops_1gpu"]["scale"] == "paper" and got.scales["e"] == "paper"


def test_the_committed_report_reads_the_h200_runs_under_the_rule():
    report = pd.read_csv(REPO_ROOT / "results" / "claims.csv", keep_default_na=False, na_values=[""])
    row = report.set_index("claim_id").loc
    share = row["baseline_pct_peak"]
    assert share["verdict"] in ("reproduced", "differs") and share["hardware"] == "NVIDIA H200 (paper: V100)"
    assert share["evidence"] == "measured" and share["scale"] == "node"
    assert "the tokens/s of the plain GPT compiled whole in the same run" in share["note"]  # one session, both
    tflops = row["baseline_tflops_1gpu"]  # TFLOP/s are absolute: the H200's value is shown, GPUs named, not compared
    assert (tflops["verdict"], tflops["evidence"], tflops["hardware"]) == (
        "not decidable", "measured", "NVIDIA H200 (paper: V100)")
    assert float(tflops["reproduced_value"]) > 100 and "megatron_weak_scaling (not counted)" in tflops["note"]
    assert "96 B s l h^2" in share["note"] and "72 B s l h^2" in share["note"]  # the FLOP convention, both shares
    gna = report[report["hardware"].fillna("").str.contains("paper: B200")]
    assert len(gna) == 8 and set(gna["evidence"]) == {"predicted"}
    markdown = (REPO_ROOT / "results" / "claims.md").read_text()
    assert "## Measured on GPUs" in markdown and "NVIDIA H200 (paper: B200)" in markdown


def test_claim_checks_keep_their_hardware_through_another_scale():
    """A verdict decided at another scale (decided_at) keeps the GPUs it names."""
    check = ClaimCheck(PAPER, "baseline_pct_peak", 35.0, "+-5", "reproduced", "n", "measured", "", "H200 (paper: V100)")
    exp = Experiment(name="e", paper=PAPER, title="t", points={"ci": (Point("p", {}),)},
                     run_point=lambda point, ctx: [], claims=lambda rows: [check], decided_at={
                         "baseline_pct_peak": "node"})
    rows = pd.DataFrame([{"experiment": "e", "scale": "ci", "point": "p", "metric": "m", "value": 1.0},
                         {"experiment": "e", "scale": "node", "point": "p", "metric": "m", "value": 1.0}])
    out, _ = C._decided_elsewhere(exp, [check], "ci", rows)
    assert out[0].hardware == "H200 (paper: V100)"
