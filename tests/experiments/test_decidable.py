"""Claims are decided only where they can be (issue 26): a claim one scale alone can decide
(``Experiment.decided_at``) is "not decidable" at another, and takes its verdict from that scale's rows where they
exist, the report saying which scale each verdict came from."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from repro import claims as C
from repro import verdicts as V
from repro.experiments import registry, validate_experiment
from repro.experiments.base import Experiment, Point
from repro.vocabulary import ClaimCheck, Null
from repro.results import REPO_ROOT


def _claims(rows) -> list[ClaimCheck]:
    value = float(rows["value"].iloc[-1]) if len(rows) else None
    far = Null("far off", 1e9)
    return [V.check_value("zero_2019", "K_adam", value, evidence="measured", null=far),
            V.check_value("zero_2019", "t2_mp1_theo_Pos", 7.6 if value else None, evidence="derived", abs=0.05,
                          null=far)]


EXP = Experiment(name="big", paper="zero_2019", title="t", points={"ci": (Point("a"),), "paper": (Point("a"),)},
                 run_point=lambda p, c: [], claims=_claims, decided_at={"K_adam": "paper"})


def _rows(*scaled: tuple[str, float]) -> pd.DataFrame:
    return pd.DataFrame([dict(experiment="big", scale=scale, point="a", run_id=scale, metric="m", value=value,
                              unit="-") for scale, value in scaled])


def test_a_scale_that_cannot_decide_says_which_can():
    checks = C.collect_checks([EXP], _rows(("ci", 3.0)), scale="ci").checks.set_index("claim_id")
    assert checks.loc["K_adam", "verdict"] == "not decidable"
    assert "scale ci cannot decide this claim; scale paper can (repro run big --scale paper)" in \
        checks.loc["K_adam", "note"]
    assert checks.loc["t2_mp1_theo_Pos", "verdict"] == "reproduced"  # decided at every scale


def test_the_deciding_scale_gives_the_verdict_and_is_named():
    rows = _rows(("ci", 3.0), ("paper", 12.0))
    checks = C.collect_checks([EXP], rows[rows.scale == "ci"], scale="ci", all_rows=rows).checks
    row = checks.set_index("claim_id").loc["K_adam"]
    assert (row["verdict"], row["scale"], row["reproduced_value"]) == ("reproduced", "paper", 12.0)
    assert row["note"].startswith("decided at scale paper (scale ci cannot decide it)")
    assert checks.set_index("claim_id").loc["t2_mp1_theo_Pos", "scale"] == "ci"
    assert validate_experiment(EXP) == []
    bad = Experiment(**{**EXP.__dict__, "decided_at": {"K_adam": "node"}})
    assert "decided at scale 'node', which it does not declare" in "\n".join(validate_experiment(bad))


def test_a_fresh_ci_run_keeps_the_paper_scale_verdict(tmp_path):
    """``repro reproduce --scale ci`` on a clone: the ci point of zero_infinity_model_scale trains a model smaller
    than memory by design; finetune_1T_one_dgx2 keeps the committed paper-scale run's verdict."""
    from repro.harness.reproduce import make_claims

    shutil.copytree(REPO_ROOT / "results" / "runs", tmp_path / "runs")
    ci = {"experiment": "zero_infinity_model_scale", "scale": "ci", "point": "nvme", "run_id": "29990101T000000Z-ci",
          "tier": "nvme", "provenance": {"device": "cpu"}}
    lines = [dict(ci, metric="model_state_over_memory", value=0.0004, unit="x")]
    lines += [dict(ci, metric="loss", value=loss, unit="nats", step=step) for step, loss in enumerate((7.0, 6.0))]
    path = tmp_path / "runs" / "zero_infinity_model_scale" / "29990101T000000Z-ci.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = make_claims(registry(), tmp_path, "ci").report.set_index("claim_id")
    row = report.loc["finetune_1T_one_dgx2"]
    assert (row["verdict"], row["scale"]) == ("reproduced", "paper")
    assert float(row["reproduced_value"]) > 1.0
