"""The T3 experiment module: its exactness point on two real ranks, and its claims mapping."""

import pandas as pd
import pytest

from repro.dist import spawn
from repro.experiments.base import RunContext
from repro.vocabulary import VERDICTS
from repro.experiments.t3_overlap import EXPERIMENT, TIMING_METRICS, claims, run_point
from repro.paper import load_claims


def _run_point_rank(rank, ws, point, tmp_path):
    return run_point(point, RunContext("ci", rank, ws, "cpu", tmp_path))


def _run(point_name, tmp_path):
    point = EXPERIMENT.point_named("ci", point_name)
    return spawn(_run_point_rank, point.world_size, point, tmp_path)[0]


def test_exactness_point_rows(tmp_path):
    rows = pd.DataFrame(_run("exactness_tp2", tmp_path))
    assert set(rows["sublayer"]) == {"OP", "FC-2", "IP", "FC-1", "transformer layer"}
    assert (rows[rows["metric"] == "max_rel_err"]["value"] <= 1e-5).all()
    assert (rows[rows["metric"] == "bytes_ratio"]["value"] == 1.0).all()
    assert (rows[rows["metric"] == "calls_ratio"]["value"] == 3.0).all()  # 48 tokens in 3 chunks
    checks = {c.claim_id: c for c in claims(rows)}
    # the list of sublayers is the suite's configuration (issue 26): never counted; exact, but not yet timed
    assert (checks["sublayers"].verdict, checks["sublayers"].evidence) == ("not counted", "configuration")
    assert "differs from the paper's value" in checks["sublayers"].note


def test_claims_with_timing_rows_and_without_rows():
    paper_ids = set(load_claims().query("paper == 't3_2024'")["claim_id"])
    for rows in (pd.DataFrame(), None):
        empty = claims(rows)
        assert {c.claim_id for c in empty} <= paper_ids
        assert {c.verdict for c in empty} <= set(VERDICTS)
    timing = [{"metric": m, "value": 10.0, "unit": u, "sublayer": s, "tp": 2, "num_chunks": 4}
              for s in ("OP", "FC-2", "IP", "FC-1") for m, (_, _, u) in TIMING_METRICS.items()]
    exact = [{"metric": "max_rel_err", "value": 0.0, "unit": "relative", "sublayer": s, "tp": 2, "num_chunks": 4}
             for s in ("OP", "FC-2", "IP", "FC-1")]
    checks = {c.claim_id: c for c in claims(pd.DataFrame(timing + exact))}
    assert (checks["sublayers"].verdict, checks["sublayers"].evidence) == ("not counted", "configuration")
    assert "equals the paper's value" in checks["sublayers"].note
    assert checks["sublayers"].reproduced_value == "OP;FC-2;FC-1;IP"
    assert "geomean +10.0%" in checks["sublayers"].note  # the CPU analogue, beside the measured claim
    assert set(checks) == {"sublayers"}  # every speedup, share and data-movement claim is t3_simulator's


def test_points_declare_what_they_run():
    for scale in ("ci", "paper"):
        for point in EXPERIMENT.points_for(scale):
            assert point.params["kind"] in ("exactness", "timing")
            assert point.world_size in (2, 4)
    with pytest.raises(ValueError, match="kind='bogus'"):
        run_point(EXPERIMENT.points_for("ci")[0].__class__("x", {"kind": "bogus"}), None)
