"""The local runner: rows with provenance, distributed points on local ranks, no silent overwrites, clear errors."""

from __future__ import annotations

import json

import pytest

from repro import results as R
from repro.experiments import Registry
from repro.experiments.base import Experiment, Point
from repro.harness.machine_fit import NeedsGPU, check_memory, resolve_device
from repro.harness.runner import run_experiment


def test_rows_values_and_provenance(fake_registry: Registry, fake_env):
    report = run_experiment(fake_registry.get("fake_sum"), "ci")
    assert report.ok and [o.status for o in report.outcomes] == ["ok", "ok"]
    rows = R.load_rows(fake_env)
    values = {(r.point, r.metric): r.value for r in rows.itertuples()}
    # 1+2+3, 1+2+3+4, and the all-reduce of rank+1 over 2 ranks: 1+2
    assert values == {("n3", "triangle"): 6.0, ("n4_ws2", "triangle"): 10.0, ("n4_ws2", "rank_sum"): 3.0}
    record = json.loads(report.path.read_text().splitlines()[0])
    prov = record["provenance"]
    assert prov["config"] == {"n": 3} and prov["world_size"] == 1
    assert prov["torch_version"] and prov["git_commit"] and prov["date"] and prov["device"].startswith("cpu")
    assert "job_id" in prov and prov["job_id"] is None
    assert report.path == fake_env / "runs" / "fake_sum" / f"{report.run_id}.jsonl"
    assert set(rows.columns) >= {"experiment", "scale", "point", "run_id", "metric", "value", "unit", "n",
                                 "prov_git_commit", "prov_torch_version", "prov_job_id", "prov_date"}


def test_rerun_keeps_earlier_rows_and_force_replaces_them(fake_registry: Registry, fake_env, monkeypatch):
    exp = fake_registry.get("fake_sum")
    monkeypatch.setenv("REPRO_FAKE_MARKER", "first")
    first = run_experiment(exp, "ci", points=["n3"])
    monkeypatch.setenv("REPRO_FAKE_MARKER", "second")
    second = run_experiment(exp, "ci", points=["n3"])
    assert first.path != second.path and first.path.exists() and second.path.exists()
    assert second.earlier == (first.path,)
    newest = R.load_rows(fake_env)
    assert list(newest.loc[newest.metric == "marker", "text"]) == ["second"]
    everything = R.load_rows(fake_env, latest_only=False)
    assert sorted(everything.loc[everything.metric == "marker", "text"]) == ["first", "second"]
    monkeypatch.setenv("REPRO_FAKE_MARKER", "third")
    third = run_experiment(exp, "ci", points=["n3"], force=True)
    assert set(third.replaced) == {first.path, second.path}
    assert R.run_files(fake_env, "fake_sum") == [third.path]


def test_force_keeps_runs_of_other_points(fake_registry: Registry, fake_env):
    exp = fake_registry.get("fake_sum")
    both = run_experiment(exp, "ci")
    one = run_experiment(exp, "ci", points=["n3"], force=True)
    assert one.replaced == () and both.path.exists()  # the earlier run also holds n4_ws2


def test_failing_point_is_reported_and_others_run(fake_registry: Registry, fake_env):
    report = run_experiment(fake_registry.get("fake_fail"), "ci")
    assert not report.ok
    (outcome,) = report.outcomes
    assert outcome.status == "failed" and "fake failure in point boom" in outcome.message
    assert report.path is None


def test_memory_estimate_is_checked_before_starting(fake_registry: Registry, fake_env):
    with pytest.raises(ValueError, match=r"needs about 1000000\.0 GiB .* available.*--scale ci"):
        run_experiment(fake_registry.get("fake_huge"), "paper")
    assert not (fake_env / "runs").exists()
    with pytest.raises(ValueError, match=r"needs about 8\.0 GiB \(4 rank\(s\) x 2 GiB\)"):
        check_memory("e", "paper", Point("p", world_size=4, memory_gib=2.0), available_gib=4.0)


def test_gpu_points_need_a_gpu_unless_cpu_is_asked(fake_registry: Registry, fake_env):
    gpu = fake_registry.get("fake_gpu")
    with pytest.raises(NeedsGPU, match=r"needs 1 GPU\(s\); this machine has 0.*--device cpu"):
        resolve_device("auto", gpu.points["ci"][0], experiment="fake_gpu", cuda_devices=0)
    assert resolve_device("cpu", gpu.points["ci"][0], cuda_devices=0) == "cpu"
    assert resolve_device("auto", Point("p", world_size=2), cuda_devices=1) == "cpu"
    with pytest.raises(ValueError, match="needs 2 GPU"):
        resolve_device("cuda", Point("p", world_size=2), cuda_devices=1)
    skipped = run_experiment(gpu, "ci", skip_needs_gpu=True, device="auto")
    if skipped.outcomes[0].status == "needs GPU":  # CPU machine
        assert skipped.path is None
    on_cpu = run_experiment(gpu, "ci", device="cpu")
    assert R.load_rows(fake_env)["value"].tolist() == [0.0]
    assert on_cpu.ok


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"value": 1, "unit": "x"}, "lacks \\['metric'\\]"),
        ({"metric": "m", "value": 1, "unit": "x", "run_id": "r"}, "reserves"),
        ({"metric": "other", "value": 1, "unit": "x"}, "not among the declared metrics"),
    ],
)
def test_bad_rows_are_rejected(fake_env, row, message):
    exp = Experiment(name="bad_rows", paper="zero_2019", title="t",
                     points={"ci": (Point("a"),), "paper": (Point("a"),)},
                     run_point=lambda p, c: [row], metrics=("m",))
    report = run_experiment(exp, "ci")
    assert not report.ok
    assert __import__("re").search(message, report.outcomes[0].message)
