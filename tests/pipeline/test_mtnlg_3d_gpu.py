"""mtnlg_3d_gpu: registered and valid, its smoke points run on spawned gloo ranks through the runner, its GPU
points declare cluster resources that match their ranks, and its claims never decide from a proxy."""

import math
from pathlib import Path

import pandas as pd
import pytest

from repro.experiments import registry, validate_experiment
from repro.vocabulary import VERDICTS
from repro.experiments.mtnlg_3d_gpu import (
    EXPERIMENT, GLOBAL_BATCH, NODES_DP, PP, claims, full_micro_batches, matched_micro_batches,
)
from repro.harness.runner import execute_point
from repro.paper import load_claims
from repro.pipeline.schedule import bubble_fraction
from repro.results import check_row

CLAIM_IDS = {f"{kind}_{n}n" for n in NODES_DP for kind in ("tflops", "iter_time")}


def test_registered_and_valid():
    reg = registry()
    assert "mtnlg_3d_gpu" in reg and validate_experiment(reg.get("mtnlg_3d_gpu")) == []
    assert set(EXPERIMENT.points) == {"smoke", "node", "paper"}
    known = set(load_claims().query("paper == 'mt_nlg_2022'")["claim_id"])
    assert CLAIM_IDS <= known


def test_gpu_points_resources_and_layout():
    for scale in ("node", "paper"):
        for point in EXPERIMENT.points_for(scale):
            p, res = point.params, point.resources
            assert point.needs_gpu and res is not None and res.gpus_per_node == 8
            assert res.nodes * res.gpus_per_node == point.world_size == p["tp"] * p["pp"] * p["dp"]
            assert p["tp"] == 8 and p["hidden"] == 20480 and p["heads"] == 128 and p["micro_batch_size"] == 1
            assert p["layers"] == 3 * p["pp"]  # 105 / 35 layers per stage, as in the 530B layout
    full = {p.name: p for p in EXPERIMENT.points_for("paper") if p.params["kind"] == "full"}
    assert sorted(full) == ["530b_280n", "530b_350n", "530b_420n"]
    for nodes, dp in NODES_DP.items():
        point = full[f"530b_{nodes}n"]
        assert point.resources.nodes == nodes and point.params["dp"] == dp and point.params["pp"] == PP
        assert point.params["micro_batches"] * dp == GLOBAL_BATCH
    for point in EXPERIMENT.points_for("paper"):
        if point.params["kind"] == "proxy":  # bubble within 3 points of the 530B layout's at the same nodes
            nodes = point.params["target_nodes"]
            target = bubble_fraction(PP, full_micro_batches(nodes))
            assert abs(bubble_fraction(point.params["pp"], point.params["micro_batches"]) - target) < 0.03
            assert point.params["dp"] == 1 and point.resources.nodes == point.params["pp"]


def test_matched_micro_batches():
    assert matched_micro_batches(2, 280) == 7 and matched_micro_batches(4, 280) == 21
    with pytest.raises(ValueError, match="no bubble"):
        matched_micro_batches(1, 280)


@pytest.fixture(scope="module")
def smoke_rows(tmp_path_factory):
    frames = []
    for point in EXPERIMENT.points_for("smoke"):
        assert not point.needs_gpu and point.world_size == 4
        rows = execute_point(EXPERIMENT, point, "smoke", device="cpu",
                             scratch_dir=Path(tmp_path_factory.mktemp(point.name)), timeout_s=120)
        for row in rows:
            check_row(row, metrics=EXPERIMENT.metrics)
        frames.append(pd.DataFrame(rows).assign(point=point.name))
    return pd.concat(frames, ignore_index=True)


def test_smoke_points_run_and_rows_are_finite(smoke_rows):
    assert set(smoke_rows["layout"]) == {"2x2x1", "1x2x2"}
    for layout, rows in smoke_rows.groupby("layout"):
        metrics = dict(zip(rows["metric"], rows["value"]))
        assert {"iteration_s", "tokens_per_s", "model_tflops_per_gpu", "bubble_share"} <= set(metrics)
        assert all(math.isfinite(v) for v in metrics.values())
        assert metrics["iteration_s"] > 0 and metrics["model_tflops_per_gpu"] > 0
        assert metrics["bubble_share"] == pytest.approx(1 / 8)  # pp 2, 7 micro-batches
        assert (rows["device_type"] == "cpu").all() and rows["gpu"].isna().all()


def _assert_valid(checks):
    assert {c.claim_id for c in checks} == CLAIM_IDS
    assert {c.verdict for c in checks} <= set(VERDICTS)


def test_claims_on_empty_and_smoke_rows(smoke_rows):
    for rows in (pd.DataFrame(), None):
        checks = claims(rows)
        _assert_valid(checks)
        assert {c.verdict for c in checks} == {"needs GPU"}
    checks = {c.claim_id: c for c in claims(smoke_rows)}
    _assert_valid(checks.values())
    assert all(c.verdict == "needs GPU" and c.reproduced_value is None for c in checks.values())
    assert "toy smoke run" in checks["tflops_280n"].note and "not the claim" in checks["tflops_280n"].note


def _gpu_rows(kind, gpu, memory, tflops, iteration_s, nodes=280, layout="8x35x8"):
    common = dict(kind=kind, target_nodes=nodes, layout=layout, device_type="cuda", gpu=gpu, gpu_memory_gib=memory)
    return [dict(metric="model_tflops_per_gpu", value=tflops, **common),
            dict(metric="iteration_s", value=iteration_s, **common),
            dict(metric="bubble_share", value=0.125, **common)]


def test_claims_verdict_only_from_the_530b_layout_on_a100_80gb():
    a100 = pd.DataFrame(_gpu_rows("full", "NVIDIA A100-SXM4-80GB", 79.2, 124.0, 61.0))
    checks = {c.claim_id: c for c in claims(a100)}
    assert checks["tflops_280n"].verdict == "reproduced" and checks["tflops_280n"].reproduced_value == 124.0
    assert checks["iter_time_280n"].verdict == "reproduced"
    assert checks["tflops_350n"].verdict == "needs GPU"
    h100 = {c.claim_id: c for c in claims(pd.DataFrame(_gpu_rows("full", "NVIDIA H100 80GB HBM3", 79.1, 200, 38)))}
    assert h100["tflops_280n"].verdict == "needs GPU" and "H100" in h100["tflops_280n"].note
    proxy = pd.DataFrame(_gpu_rows("proxy", "NVIDIA A100-SXM4-80GB", 79.2, 126.0, 2.0, layout="8x2x1"))
    checks = {c.claim_id: c for c in claims(proxy)}
    assert checks["tflops_280n"].verdict == "needs GPU" and "proxy" in checks["tflops_280n"].note
    assert "126" in checks["tflops_280n"].note
