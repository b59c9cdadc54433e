"""Integration with a real Slurm: the one-node cluster of ``slurm/local/start.sh`` (CI starts it; skipped when
no Slurm controller answers). Experiments go through ``repro submit``'s sizing, sbatch, the shared launcher,
srun and torchrun; their rows must appear with the job id, and failures must come back as failures with their
exit code and log, never as a hang."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from repro.experiments import registry
from repro.harness import submit as S
from repro.results import load_rows
from tests.slurm.local_slurm import skip_without_local_slurm

pytestmark = pytest.mark.slurm

FAKE = Path(__file__).resolve().parents[1] / "experiments" / "fake_experiments.py"
#: Fast real experiments, the first registered one is submitted beside the fake ones.
REAL = ("zero_memory_tables", "parameter_counts", "mtnlg_layout", "zero_infinity_model", "megatron_weak_scaling")
WAIT_S = 170.0


skip_without_local_slurm()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Submit everything first (the jobs run side by side), then wait for each."""
    tmp = tmp_path_factory.mktemp("slurm")
    results = tmp / "results"
    old = os.environ.get("REPRO_EXTRA_EXPERIMENTS")
    os.environ["REPRO_EXTRA_EXPERIMENTS"] = str(FAKE)
    reg = registry(refresh=True)
    real = next((name for name in REAL if name in reg), "fake_huge")
    env = {"REPRO_RESULTS_DIR": str(results), "REPRO_EXTRA_EXPERIMENTS": str(FAKE)}
    gpu_node = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True).stdout.strip()
    plans = {
        "fake_sum": (S.plan(reg.get("fake_sum"), "ci", slurm_dir=tmp, log_dir=tmp / "logs"), env),
        real: (S.plan(reg.get(real), "ci", slurm_dir=tmp, log_dir=tmp / "logs"), env),
        "fake_fail": (S.plan(reg.get("fake_fail"), "ci", slurm_dir=tmp, log_dir=tmp / "logs"), env),
        "srun_launcher": (S.plan(reg.get("fake_sum"), "ci", slurm_dir=tmp, log_dir=tmp / "logs", array=False),
                          {**env, "REPRO_LAUNCHER": "srun"}),
    }
    if gpu_node in ("", "(null)"):
        plans["fake_gpu"] = (S.plan(reg.get("fake_gpu"), "ci", slurm_dir=tmp, log_dir=tmp / "logs",
                                    cpu=True), env)  # cpu: ask for no GPUs; the launcher then refuses
    ids = {key: S.submit(plan, env=extra) for key, (plan, extra) in plans.items()}
    states = {key: S.wait(job_id, timeout_s=WAIT_S, poll_s=0.5) for key, job_id in ids.items()}
    yield {"ids": ids, "states": states, "results": results, "real": real}
    for job_id in ids.values():
        subprocess.run(["scancel", job_id], capture_output=True)
    if old is None:
        os.environ.pop("REPRO_EXTRA_EXPERIMENTS", None)
    else:
        os.environ["REPRO_EXTRA_EXPERIMENTS"] = old
    registry(refresh=True)


def _describe(states) -> str:
    return "; ".join(s.describe() for s in states)


def test_two_experiments_finish_and_their_rows_carry_the_job_id(jobs):
    for key in ("fake_sum", jobs["real"], "srun_launcher"):
        states = jobs["states"][key]
        assert states and all(s.ok for s in states), f"{key}: {_describe(states)}"
    rows = load_rows(jobs["results"], latest_only=False)
    fake = rows[rows.experiment == "fake_sum"]
    array_id = jobs["ids"]["fake_sum"]
    from_array = fake[fake["prov_job_id"].astype(str).str.startswith(f"{array_id}_")]
    values = {(r.point, r.metric): r.value for r in from_array.itertuples()}
    assert values == {("n3", "triangle"): 6.0, ("n4_ws2", "triangle"): 10.0, ("n4_ws2", "rank_sum"): 3.0}
    assert set(from_array["prov_job_id"]) == {f"{array_id}_0", f"{array_id}_1"}
    assert set(from_array.loc[from_array.point == "n4_ws2", "prov_launcher"]) == {"torchrun"}
    by_srun = fake[fake["prov_job_id"].astype(str) == jobs["ids"]["srun_launcher"]]
    assert set(by_srun.loc[by_srun.point == "n4_ws2", "prov_launcher"]) == {"srun"}
    assert by_srun.loc[by_srun.metric == "rank_sum", "value"].tolist() == [3.0]
    real = rows[rows.experiment == jobs["real"]]
    assert len(real) > 0 and set(real["prov_job_id"].astype(str)) == {jobs["ids"][jobs["real"]]}


def test_a_failing_job_is_reported_failed_with_exit_code_and_log(jobs):
    (state,) = jobs["states"]["fake_fail"]
    assert state.state == "FAILED" and state.exit_code.startswith("1:"), state.describe()
    log = Path(state.log_path)
    assert log.exists() and "fake failure in point boom" in log.read_text()


def test_a_gpu_point_without_gpus_fails_early(jobs):
    if "fake_gpu" not in jobs["states"]:
        pytest.skip("this Slurm node has GPUs")
    (state,) = jobs["states"]["fake_gpu"]
    assert state.state == "FAILED" and state.exit_code.startswith("3:"), state.describe()
    assert "needs GPUs but this allocation has none" in Path(state.log_path).read_text()
