"""The zero_gpu experiment: its declarations, the capacity estimate and search logic (fake memory caps and a fake
clock, no GPU), its smoke points run on CPU ranks through the runner, its rows on disk as they are measured, and
its claim mapping."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from repro import results as R
from repro.experiments import registry, validate_experiment
from repro.experiments import zero_gpu
from repro.harness.runner import execute_point, run_experiment
from repro.experiments import zero_capacity as capacity
from repro.models import GPTConfig
from repro.models.params import count_parameters
from repro.paper import load_claims
from repro.experiments.zero_capacity import MemoryEstimate, estimate_memory, is_out_of_memory, params_per_rank, search_largest
from repro.zero.offload.pinned import PinningError

GIB = 2**30


def test_registered_and_valid():
    experiment = registry(refresh=True).get("zero_gpu")
    assert validate_experiment(experiment) == []
    assert set(experiment.points) == {"smoke", "paper"}
    assert not any(p.needs_gpu for p in experiment.points["smoke"])
    for point in experiment.points["paper"]:
        assert point.needs_gpu and point.resources is not None
        assert point.resources.nodes * point.resources.gpus_per_node == point.world_size
        params = dict(zero_gpu.DEFAULTS, **point.params)
        assert point.world_size % params["tp"] == 0
        names = [s["name"] for s in params["sizes"]]
        assert len(names) == len(set(names)), f"{point.name}: a size is listed twice"
        for size in params["sizes"] + [s for arm in params["arms"] for s in arm.get("sizes", [])]:
            config = zero_gpu.search_config(size, params)  # heads divide hidden; tp divides heads
            config.check_tensor_parallel(params["tp"])
    one = experiment.point_named("paper", "offload_1gpu")
    assert one.world_size == 1 and [a["name"] for a in one.params["arms"]] == ["zero2_cpu", "gpu_only"]
    assert sum(a["time_cap_s"] for a in one.params["arms"]) <= 8 * 60


def test_table4_sizes_have_the_papers_parameter_counts():
    """ZeRO Table 4's configurations (claims t4_fig3_*, t4_fig2_*): 12 l h^2 plus embeddings."""
    params = dict(zero_gpu.DEFAULTS)
    billions = {s["name"]: count_parameters(zero_gpu.search_config(s, params)) / 1e9
                for s in zero_gpu.NOMP_SIZES + zero_gpu.FIG2_SIZES}
    assert billions["l24_h1920"] == pytest.approx(1.16, abs=0.01)
    assert billions["l62_h4096"] == pytest.approx(12.7, abs=0.1)  # the paper's "13B"
    assert billions["l212_h8192"] == pytest.approx(171.1, abs=0.5)


def test_estimate_counts_what_each_stage_and_tier_holds():
    config = GPTConfig(vocab_size=50257, hidden_size=3072, num_layers=72, num_attention_heads=24,
                       max_position_embeddings=1024)
    psi = params_per_rank(config)
    assert psi == count_parameters(config)
    common = dict(micro_batch=4, bucket_numel=1 << 25)
    offload = estimate_memory(config, stage=2, optimizer_tier="cpu", **common)
    resident = estimate_memory(config, stage=2, **common)
    assert offload.host["optimizer"] == 12 * psi and "optimizer" not in offload.device
    assert resident.device["optimizer"] == 12 * psi and resident.host == {}
    assert offload.device["params"] == resident.device["params"] == 2 * psi
    assert resident.device_bytes - offload.device_bytes == pytest.approx(12 * psi)
    paged = estimate_memory(config, stage=3, optimizer_tier="cpu", param_tier="cpu", dp=8, **common)
    assert paged.host["params"] == pytest.approx(2 * psi / 8)
    assert estimate_memory(config, stage=2, dp=4, **common).device["grads"] < resident.device["grads"]
    # the fp32 build peak counts when it exceeds training (stage 3 over many ranks)
    assert "build_excess" in estimate_memory(config, stage=3, dp=64, **common).device
    with pytest.raises(ValueError, match="needs stage 3"):
        estimate_memory(config, stage=2, param_tier="cpu")
    with pytest.raises(ValueError, match="stage=5"):
        estimate_memory(config, stage=5)


def test_one_gpu_plan_on_an_80gb_gpu_with_128gb_of_host_memory():
    """What offload_1gpu will try on the H100: ZeRO-Offload's host memory (12 B/param) is the bound."""
    point = zero_gpu.EXPERIMENT.point_named("paper", "offload_1gpu")
    params = dict(zero_gpu.DEFAULTS, **point.params)

    def estimate(arm, size):
        return estimate_memory(zero_gpu.search_config(size, params), stage=arm["stage"],
                               optimizer_tier=arm["optimizer"],
                               micro_batch=params["micro_batch"], bucket_numel=params["bucket_numel"],
                               device_overhead_bytes=2.5 * GIB)

    offload, gpu_only = params["arms"]
    fits = {s["name"]: estimate(offload, s) for s in offload["sizes"]}
    assert all(e.device_bytes < 78 * GIB for e in fits.values())  # the GPU would hold all of them
    assert fits["l72_h3072"].host_bytes < 0.9 * 115 * GIB < fits["l50_h4096"].host_bytes
    assert estimate(gpu_only, gpu_only["sizes"][3]).device_bytes < 78 * GIB < estimate(
        gpu_only, gpu_only["sizes"][4]).device_bytes


def _estimate(device_gib: float, host_gib: float = 0.0) -> MemoryEstimate:
    return MemoryEstimate({"all": device_gib * GIB}, {"all": host_gib * GIB} if host_gib else {})


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _search(sizes, *, device_cap=10.0, host=10.0, time_cap=100.0, fail_at=None, seconds=1.0, agree=lambda ok: ok):
    """Sizes are (name, params, device GiB, host GiB); a try costs ``seconds`` x params on the fake clock."""
    clock, tried = FakeClock(), []

    def try_size(size):
        tried.append(size[0])
        clock.now += seconds * size[1]
        if fail_at is not None and size[1] >= fail_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"loss": 5.0}

    outcome = search_largest(sizes, params_of=lambda s: s[1], estimate=lambda s: _estimate(s[2], s[3]),
                             device_cap_bytes=device_cap * GIB, host_available_bytes=lambda: host * GIB,
                             try_size=try_size, time_cap_s=time_cap, agree=agree, clock=clock)
    return outcome, tried


SIZES = [("d", 4, 9.0, 0.0), ("a", 1, 2.0, 1.0), ("b", 2, 4.0, 3.0), ("c", 3, 6.0, 9.5), ("e", 5, 11.0, 0.0)]


def test_search_skips_by_estimate_and_reports_the_bracket():
    outcome, tried = _search(SIZES)
    assert tried == ["a", "b", "d"]  # ascending; c needs 9.5 GiB of host > 0.9 x 10, e 11 GiB of device > 10
    decisions = {a.size[0]: a.decision for a in outcome.attempts}
    assert decisions == {"a": "trained", "b": "trained", "c": "skip_host", "d": "trained", "e": "skip_device"}
    assert outcome.largest.size[0] == "d" and outcome.next_larger.size[0] == "e" and outcome.stopped == "estimate"


def test_search_stops_at_the_first_out_of_memory():
    outcome, tried = _search(SIZES, host=100.0, fail_at=3)
    assert tried == ["a", "b", "c"]
    assert [a.decision for a in outcome.attempts] == ["trained", "trained", "failed", "not_reached", "not_reached"]
    assert outcome.attempts[2].error.startswith("out of memory: OutOfMemoryError")
    assert outcome.largest.size[0] == "b" and outcome.next_larger.size[0] == "c" and outcome.stopped == "failed"


def test_search_respects_its_time_cap():
    # a try costs 10 s per parameter unit: a (10 s), b (20 s) fit in 40 s; c would end at 30 + 30 > 40
    outcome, tried = _search(SIZES, host=100.0, device_cap=100.0, time_cap=40.0, seconds=10.0)
    assert tried == ["a", "b"]
    assert [a.decision for a in outcome.attempts[2:]] == ["skip_time"] * 3 and outcome.stopped == "time_cap"
    assert outcome.largest.size[0] == "b"


def test_search_needs_every_rank_to_agree():
    votes = []

    def other_rank_fails_the_second_size(ok):  # votes: a may try, a trained, b may try, b trained
        votes.append(ok)
        return ok and len(votes) != 4

    outcome, tried = _search(SIZES[1:3], host=100.0, agree=other_rank_fails_the_second_size)
    assert tried == ["a", "b"]  # b was tried here, but another rank failed it: no rank counts it
    assert [a.decision for a in outcome.attempts] == ["trained", "failed"]


def test_non_finite_loss_and_errors_are_failures():
    outcome = search_largest([1, 2], params_of=float, estimate=lambda s: _estimate(0), device_cap_bytes=GIB,
                             host_available_bytes=lambda: GIB, time_cap_s=10,
                             try_size=lambda s: {"loss": float("nan")} if s == 2 else {"loss": 1.0})
    assert [a.decision for a in outcome.attempts] == ["trained", "failed"] and "non-finite" in outcome.attempts[1].error
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and is_out_of_memory(PinningError("x"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(ValueError("shape mismatch"))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """Every smoke point run once for this module: ``search_1rank`` through :func:`run_experiment` (its run file,
    and the rows its ``run_point`` returned, which the test of the run file compares), the multi-rank points on
    spawned CPU ranks. Returns (all rows with their point, search_1rank's report, the rows run_point returned)."""
    torch.set_num_threads(2)
    returned = []

    def run_point(point, ctx):
        returned.extend(zero_gpu.run_point(point, ctx))
        return returned

    experiment = dataclasses.replace(zero_gpu.EXPERIMENT, run_point=run_point)
    report = run_experiment(experiment, "smoke", points=["search_1rank"], results=tmp_path_factory.mktemp("results"),
                            device="cpu")
    rows = [dict(row, point="search_1rank") for row in returned]
    for point in zero_gpu.EXPERIMENT.points_for("smoke"):
        if point.name == "search_1rank":
            continue
        got = execute_point(zero_gpu.EXPERIMENT, point, "smoke", device="cpu",
                            scratch_dir=tmp_path_factory.mktemp(point.name), timeout_s=300)
        rows += [dict(row, point=point.name) for row in got]
    return pd.DataFrame(rows), report, returned


@pytest.fixture(scope="module")
def smoke_rows(smoke_run):
    return smoke_run[0]


def _largest(rows, point, arm):
    sel = rows[(rows.metric == "largest_trained_params_b") & (rows.point == point) & (rows.arm == arm)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_smoke_search_finds_the_largest_size_under_fake_caps(smoke_rows):
    offload = _largest(smoke_rows, "search_1rank", "zero2_cpu")
    gpu_only = _largest(smoke_rows, "search_1rank", "gpu_only")
    oom = _largest(smoke_rows, "search_1rank", "zero3_cpu_oom")
    # 10 MiB of "GPU": 16 B/param on the device stops at l2_h96; offloading the 12 B of optimizer states to the
    # 16 MiB host goes to l3_h128, and the host estimate stops l4_h160
    assert (gpu_only.largest_size, gpu_only.next_decision, gpu_only.stopped) == ("l2_h96", "skip_device", "estimate")
    assert (offload.largest_size, offload.next_decision) == ("l3_h128", "skip_host")
    assert (oom.largest_size, oom.next_decision, oom.stopped) == ("l2_h64", "failed", "failed")
    assert "simulated" in oom.next_error
    gain = smoke_rows[(smoke_rows.metric == "offload_gain_x") & (smoke_rows.point == "search_1rank")]
    assert gain.value.iloc[0] == pytest.approx(offload.value / gpu_only.value)
    trained = smoke_rows[(smoke_rows.metric == "loss") & (smoke_rows.point == "search_1rank")]
    assert len(trained) == 3 + 4 + 2 and trained.value.map(lambda v: v == v and abs(v) < 100).all()


def test_smoke_multi_rank_points(smoke_rows):
    for arm in ("zero3_cpu", "stage1"):
        row = _largest(smoke_rows, "search_dp2", arm)
        assert (row.largest_size, row.stopped, row.gpus) == ("l2_h96", "exhausted", 2)
    for arm in ("C1", "C2", "C5"):  # ZeRO-R's checkpoint kinds at tp 2 train every toy size
        row = _largest(smoke_rows, "zero_r_tp2", arm)
        assert (row.largest_size, row.stopped, row.tp) == ("l2_h64", "exhausted", 2)
    losses = smoke_rows[(smoke_rows.point == "zero_r_tp2") & (smoke_rows.metric == "loss")]
    by_arm = losses.groupby("arm").value.apply(list)
    # the same model, data and seed: P_a and P_a+cpu change where checkpoints live, not what is computed
    assert by_arm["C2"] == pytest.approx(by_arm["C1"], rel=1e-3) and by_arm["C5"] == pytest.approx(by_arm["C1"], rel=1e-3)
    throughput = smoke_rows[smoke_rows.point == "throughput_tp2"].set_index("metric")
    assert throughput.loc["tflops_per_gpu", "tp"] == 2 and throughput.loc["step_time_s", "value"] > 0
    assert set(smoke_rows.metric) <= set(zero_gpu.EXPERIMENT.metrics)


def _on_disk(report, point: str) -> list[dict]:
    """The rows of ``point`` in the run file, without what the runner adds to each."""
    added = {"experiment", "scale", "point", "run_id", "provenance"}
    return [{k: v for k, v in record.items() if k not in added} for record in R.read_run(report.path)
            if record["point"] == point]


def test_rows_reach_the_run_file_once_each(smoke_run):
    """Emitted as measured (each attempt, then each arm's summary) and returned: the run file holds the returned
    rows, in their order, each once."""
    _, report, returned = smoke_run
    assert returned
    assert [o.status for o in report.outcomes] == ["ok"] and report.outcomes[0].rows == len(returned)
    on_disk = _on_disk(report, "search_1rank")
    assert on_disk == [json.loads(json.dumps(row)) for row in returned]
    assert {r["metric"] for r in on_disk} >= {"attempt", "loss", "largest_trained_params_b", "offload_gain_x"}


def test_rows_measured_before_a_failure_are_kept(tmp_path, monkeypatch, smoke_rows):
    """A point stopped in its second arm (as by a time limit) keeps the first arm's rows, summary included, and
    the second arm's attempts decided before the stop."""
    torch.set_num_threads(2)
    search_largest, arms = capacity.search_largest, []

    def stopped_in_the_second_arm(sizes, *, on_attempt, **kwargs):
        arms.append(sizes)
        if len(arms) == 1:
            return search_largest(sizes, on_attempt=on_attempt, **kwargs)

        def report_then_stop(attempt):
            on_attempt(attempt)
            raise RuntimeError("stopped after the first attempt of the second arm")

        return search_largest(sizes, on_attempt=report_then_stop, **kwargs)

    monkeypatch.setattr(capacity, "search_largest", stopped_in_the_second_arm)
    report = run_experiment(zero_gpu.EXPERIMENT, "smoke", points=["search_1rank"], results=tmp_path, device="cpu")
    (outcome,) = report.outcomes
    assert outcome.status == "failed" and "stopped after the first attempt" in outcome.message
    assert report.path is not None, "no row reached the run file before the failure"
    kept = _on_disk(report, "search_1rank")
    assert outcome.rows == len(kept) and "kept in" in outcome.message
    first = [r for r in kept if r["arm"] == "zero2_cpu"]
    clean = smoke_rows[(smoke_rows.point == "search_1rank") & (smoke_rows.arm == "zero2_cpu")
                       & (smoke_rows.metric != "offload_gain_x")]  # made when every arm has ended
    assert [(r["metric"], r.get("size")) for r in first] == [
        (m, None if pd.isna(s) else s) for m, s in zip(clean.metric, clean["size"])]
    second = [r for r in kept if r["arm"] == "gpu_only"]
    assert {r["size"] for r in second} == {"l1_h32"} and second[0]["decision"] == "trained"
    assert "largest_trained_params_b" not in {r["metric"] for r in second}
    assert {r["arm"] for r in kept} == {"zero2_cpu", "gpu_only"} and "offload_gain_x" not in {r["metric"] for r in kept}


def test_claims_on_empty_rows_need_a_gpu():
    known = set(zip(load_claims()["paper"], load_claims()["claim_id"]))
    checks = zero_gpu.claims(pd.DataFrame())
    assert checks and all((c.paper, c.claim_id) in known for c in checks)
    # every measurement waits for a GPU; only Fig. 3's declared model, GPU count and batch are shown (configuration)
    assert all(c.verdict == "needs GPU" and c.evidence == "measured" for c in checks if c.evidence != "configuration")
    configuration = {c.claim_id: c for c in checks if c.evidence == "configuration"}
    assert set(configuration) == {"superlinear_model", "superlinear_gpus_max", "largest_batch_superlinear"}
    assert configuration["largest_batch_superlinear"].reproduced_value == 1600  # 4 x 8 micro-batches x 400 / tp 8
    mapped = {c.claim_id for c in checks}
    assert {"fig6_c1", "fig6_c2", "fig6_c4", "fig6_c5", "megatron_max_efficient", "32T_512gpu"} <= mapped


def test_fig6_and_32_node_claims_read_their_points_arms():
    def summary(point, arm, value, above, stage, tp, dp, gpu="Tesla V100-SXM3-32GB", memory=31.7):
        return {"metric": "largest_trained_params_b", "value": value, "point": point, "arm": arm, "gpu": gpu,
                "gpu_memory_gib": memory, "gpus": tp * dp, "stage": stage, "tp": tp, "dp": dp,
                "next_params_b": above, "next_decision": "failed"}

    frame = pd.DataFrame([summary("fig6_400gpu", "C1", 39.8, 49.8, 1, 16, 25),
                          summary("fig6_400gpu", "C2", 49.8, 59.6, 1, 16, 25),
                          summary("offload_32node", "zero3_nvme", 20100.0, 32003.0, 3, 8, 64),
                          summary("megatron_max_16gpu", "stage0", 19.9, 21.7, 0, 16, 1, gpu="NVIDIA H100 80GB HBM3",
                                  memory=79.1)])
    checks = {c.claim_id: c for c in zero_gpu.claims(frame)}
    assert checks["fig6_c1"].verdict == "reproduced"  # 40B in [39.8, 49.8)
    # its null, model states only: 16 x 31.7 GiB / (4 + 12/25) bytes = 122B, far from 40B
    assert checks["fig6_c1"].null_value == pytest.approx(16 * 31.7 * 2**30 / (4 + 12 / 25) / 1e9)
    assert checks["fig6_c2"].verdict == "differs"  # 60B is not below the next size that failed, 59.6B
    assert checks["fig6_c4"].verdict == "needs GPU" and "fig6_400gpu (C4)" in checks["fig6_c4"].note
    assert checks["32T_512gpu"].reproduced_value == pytest.approx(20.1)  # trillions
    assert checks["32T_512gpu"].verdict == "differs"  # 32T: the 32.003T size failed
    assert checks["megatron_max_efficient"].verdict == "needs GPU" and "19.90B" in checks["megatron_max_efficient"].note


def test_partitioned_checkpoints_shrink_the_estimate_by_tp():
    config = GPTConfig(vocab_size=50257, hidden_size=6144, num_layers=88, num_attention_heads=48,
                       max_position_embeddings=1024)
    common = dict(stage=1, tp=16, dp=25, micro_batch=32)
    replicated = estimate_memory(config, **common)
    pa = estimate_memory(config, activation_checkpoints="partitioned", **common)
    pa_cpu = estimate_memory(config, activation_checkpoints="partitioned_cpu", **common)
    checkpoints = 88 * 32 * 1024 * 6144 * 2
    assert replicated.device["activations"] - pa.device["activations"] == pytest.approx(checkpoints * 15 / 16)
    assert pa_cpu.host["activation_checkpoints"] == pytest.approx(checkpoints / 16)
    assert pa_cpu.device["activations"] < pa.device["activations"]
    with pytest.raises(ValueError, match="activation_checkpoints='sparse'"):
        estimate_memory(config, activation_checkpoints="sparse", **common)
    # a stage-3 model built partitioned peaks at one block in fp32, not the model
    whole = estimate_memory(config, stage=3, dp=64, tp=16)
    partitioned = estimate_memory(config, stage=3, dp=64, tp=16, partitioned_build=True)
    assert "build_excess" in whole.device and "build_excess" not in partitioned.device


def test_size_claims_decided_only_on_the_papers_gpu():
    def rows(gpu, memory, value, above):
        return pd.DataFrame([{"metric": "largest_trained_params_b", "value": value, "point": "offload_1gpu",
                              "arm": "gpu_only", "gpu": gpu, "gpu_memory_gib": memory, "gpus": 1, "stage": 2,
                              "dp": 1, "tp": 1, "next_params_b": above, "next_decision": "failed"},
                             {"metric": "largest_tflops_per_gpu", "value": 31.0, "point": "offload_1gpu",
                              "arm": "gpu_only", "gpu": gpu, "gpus": 1}])

    def verdict(frame):
        return {c.claim_id: c for c in zero_gpu.claims(frame)}

    v100 = verdict(rows("Tesla V100-SXM3-32GB", 31.7, 1.16, 1.6))
    assert v100["dp_alone_max"].verdict == "reproduced"  # 1.4B lies in [1.16, 1.6)
    # its null, model states only on the GPU's memory: 16 B/param at N_d = 1, 31.7 GiB / 16 = 2.13B, not within 5 %
    assert v100["dp_alone_max"].null_value == pytest.approx(31.7 * 2**30 / 16 / 1e9)
    assert v100["dp_alone_max"].null_within is False
    assert verdict(rows("Tesla V100-SXM3-32GB", 31.7, 2.49, 4.2))["dp_alone_max"].verdict == "differs"
    h100 = verdict(rows("NVIDIA H100 80GB HBM3", 79.1, 2.49, 4.2))
    assert h100["dp_alone_max"].verdict == "needs GPU" and "2.49B" in h100["dp_alone_max"].note
    assert "1.01B" in h100["dp_alone_max"].note  # 2.49 x 32 / 79: scaled by memory, labelled not a verdict
    assert h100["dp_only_tflops"].verdict == "needs GPU" and "31.0 TFLOP/s" in h100["dp_only_tflops"].note
