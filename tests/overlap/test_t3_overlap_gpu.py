"""t3_overlap_gpu: registered and valid, its smoke point runs on spawned gloo ranks through the runner (timings and
exactness), its GPU points declare one node of tp GPUs, and its claims only show communication shares of GPU
rows at tp 8 (never a speedup)."""

import math
from pathlib import Path

import pandas as pd
import pytest

from repro.experiments import registry, validate_experiment
from repro.vocabulary import VERDICTS
from repro.harness.runner import execute_point
from repro.experiments.t3_overlap_gpu import EXPERIMENT, SUBLAYERS, TIMING_METRICS, claims
from repro.paper import load_claims
from repro.results import check_row


def test_registered_and_valid():
    reg = registry()
    assert "t3_overlap_gpu" in reg and validate_experiment(reg.get("t3_overlap_gpu")) == []
    assert set(EXPERIMENT.points) == {"smoke", "node", "paper"}


def test_gpu_points_are_one_node_of_tp_gpus():
    for scale in ("node", "paper"):
        points = EXPERIMENT.points_for(scale)
        assert sorted(p.params["tp"] for p in points) == [2, 4, 8]
        for point in points:
            res = point.resources
            assert point.needs_gpu and res.nodes == 1 and res.gpus_per_node == point.params["tp"]
            assert res.nodes * res.gpus_per_node == point.world_size
            assert {m["name"] for m in point.params["models"]} == {"Mega-GPT-2", "T-NLG"}
            for model in point.params["models"]:  # every split divides: heads/FFN by tp, tokens by tp x chunks
                tokens = model["seq_len"] * model["micro_batch"]
                assert model["hidden"] % point.params["tp"] == 0
                assert all(tokens % (point.params["tp"] * c) == 0 for c in point.params["chunks"])


@pytest.fixture(scope="module")
def smoke_rows(tmp_path_factory):
    (point,) = EXPERIMENT.points_for("smoke")
    assert not point.needs_gpu and point.world_size == 2
    rows = execute_point(EXPERIMENT, point, "smoke", device="cpu", scratch_dir=Path(tmp_path_factory.mktemp("t3")),
                         timeout_s=120)
    for row in rows:
        check_row(row, metrics=EXPERIMENT.metrics)
    return pd.DataFrame(rows)


def test_smoke_rows_are_finite_and_exact(smoke_rows):
    assert set(smoke_rows["sublayer"]) == set(SUBLAYERS)
    assert (smoke_rows["backend"] == "gloo").all() and (smoke_rows["tp"] == 2).all()
    for name in SUBLAYERS:
        mine = smoke_rows[smoke_rows["sublayer"] == name]
        assert set(mine["metric"]) == {*TIMING_METRICS, "max_rel_diff"}
        values = dict(zip(mine["metric"], mine["value"]))
        for metric in ("gemm_ms", "comm_ms", "sequential_ms", "overlapped_ms", "comm_share", "speedup"):
            assert math.isfinite(values[metric])
        assert min(values["gemm_ms"], values["comm_ms"], values["sequential_ms"], values["overlapped_ms"]) > 0
        assert 0 < values["comm_share"] < 100
        assert values["max_rel_diff"] <= 1e-5  # fp32: the chunks sum the same numbers


def test_claims_on_empty_and_smoke_rows(smoke_rows):
    assert claims(pd.DataFrame()) == [] and claims(None) == []
    assert claims(smoke_rows) == []  # CPU rows: t3_overlap's "needs GPU" mapping stands


def test_claims_from_gpu_rows_at_tp8():
    rows = pd.DataFrame([
        dict(metric="comm_share", value=share, unit="%", sublayer=name, tp=8, device_type="cuda",
             gpu="NVIDIA H100 80GB HBM3", model="T-NLG", tokens=8192, num_chunks=chunks)
        for name, share in (("OP", 30.0), ("FC-2", 20.0), ("IP", 36.0), ("FC-1", 25.0), ("FC-2/RS", 90.0))
        for chunks in (2, 4)
    ] + [dict(metric="speedup", value=10.0, unit="%", sublayer="OP", tp=8, device_type="cuda", model="T-NLG",
              tokens=8192, num_chunks=4)])
    checks = {c.claim_id: c for c in claims(rows)}
    known = set(load_claims().query("paper == 't3_2024'")["claim_id"])
    assert set(checks) == {"comm_frac_train", "comm_frac_infer"} <= known
    assert {c.verdict for c in checks.values()} <= set(VERDICTS)
    # a share of a collective beside a GEMM belongs to the hardware (cross_hardware.ABSOLUTE): T3's are of its
    # simulated GPU, which no real GPU is, so the measured share is shown in the note and never compared
    for claim, share in (("comm_frac_train", "36"), ("comm_frac_infer", "30")):
        check = checks[claim]
        assert (check.verdict, check.reproduced_value, check.evidence) == ("not decidable", float(share), "measured")
        assert f"measured on NVIDIA H100 80GB HBM3: {share} %" in check.note and "whole layer's" in check.note
        assert check.hardware == "NVIDIA H100 80GB HBM3 (paper: simulated GPUs)"
    assert claims(rows.assign(tp=4)) == []  # T3's models run at TP 8/16: tp 4 rows decide nothing
