"""The pipeline experiments honour the experiment contract and measure what they claim (small points)."""

from pathlib import Path

import pandas as pd

from repro.experiments.base import Point
from repro.harness.runner import execute_point
from repro.experiments import mtnlg_3d_tiny, pipeline_schedule
from repro.paper import load_claims
from repro.results import check_row


def _run(module, point, tmp_path):
    rows = execute_point(module.EXPERIMENT, point, "ci", device="cpu", scratch_dir=Path(tmp_path))
    for row in rows:
        check_row(row, metrics=module.EXPERIMENT.metrics)
    return pd.DataFrame(rows)


def test_declared_points_are_well_formed():
    for module in (mtnlg_3d_tiny, pipeline_schedule):
        for scale in ("ci", "paper"):
            points = module.EXPERIMENT.points_for(scale)
            assert points and len({p.name for p in points}) == len(points)
            for point in points:
                params = point.params
                expected = params.get("tp", 1) * params["pp"] * params.get("dp", 1)
                assert point.world_size == expected and not point.needs_gpu


def test_pipeline_schedule_point(tmp_path):
    rows = _run(pipeline_schedule, pipeline_schedule.EXPERIMENT.point_named("ci", "fixed-pp2-m4"), tmp_path)
    value = lambda metric: rows[rows.metric == metric].value
    assert value("bubble_formula").item() == 0.2 and abs(value("bubble_simulated").item() - 0.2) < 1e-12
    assert len(value("idle_fraction")) == 2
    assert abs(value("idle_fraction_mean").item() - 0.2) <= 0.05


def test_mtnlg_3d_tiny_point_and_claims(tmp_path):
    point = Point("tiny", {**mtnlg_3d_tiny.POINTS["ci"][0].params, "steps": 3}, world_size=4)
    rows = _run(mtnlg_3d_tiny, point, tmp_path)
    assert rows[rows.metric == "max_abs_loss_diff"].value.item() <= 1e-5
    assert len(rows[rows.metric == "loss"]) == 3 == len(rows[rows.metric == "loss_reference"])
    sends = rows[(rows.metric == "comm_calls_per_step") & (rows.kind == "send") & (rows.group == "pp")]
    assert sends.value.item() == point.params["micro_batches"]  # one activation per micro-batch, first stage
    checks = mtnlg_3d_tiny.claims(rows)
    known = set(zip(*load_claims()[["paper", "claim_id"]].values.T))
    assert all((c.paper, c.claim_id) in known for c in checks)
    verdicts = {c.claim_id: c.verdict for c in checks}
    assert verdicts["gpus_per_replica"] == verdicts["dp_280n"] == verdicts["dp_full"] == "consistent"  # printed inputs
    assert verdicts["tflops_280n"] == "needs GPU"
