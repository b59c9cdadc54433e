"""The experiment megatron_weak_scaling_gpu: registered and valid, its GPU points declare what a cluster must give
them, its smoke points run on CPU ranks through the runner (the same code as on GPUs), and its claims turn rows into
verdicts (share of peak compared across GPUs, TFLOP/s only on the paper's V100)."""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from repro.experiments import registry, validate_experiment
from repro.experiments import megatron_weak_scaling_gpu as mod
from repro.harness.runner import execute_point
from repro.paper import load_claims, paper_value
from repro.perfmodel.flops import gpt_flops_per_iteration
from repro.results import REPO_ROOT, check_row, load_rows, read_run
from repro.vocabulary import RESERVED_ROW_KEYS

#: one pytest-xdist group for the test files that compile the smoke point ``toy_1rank``'s toy GPT (~60 C++
#: kernels): tests/gpu_path/test_gpu_path_experiment.py and test_gpu_session.py,
#: tests/experiments/test_readme_gpu_commands.py and tests/foundation/test_optional_imports.py, with the two that
#: compile its layers and step and share many of those kernels (tests/foundation/test_compiled_layers.py,
#: tests/training/test_step_proxies.py). On a fresh machine the first fills TorchInductor's cache and the others
#: read it; run in two workers at once, each paid the ~100 CPU-s of g++ for the same kernels.
pytestmark = pytest.mark.xdist_group("toy-gpt-compile")

EXPERIMENT = mod.EXPERIMENT
PAPER = "megatron_lm_2019"


def test_registered_and_valid():
    reg = registry()
    assert "megatron_weak_scaling_gpu" in reg
    assert reg.get("megatron_weak_scaling_gpu") is EXPERIMENT
    assert not [m for m in reg.errors if m.endswith("megatron_weak_scaling_gpu")]
    assert validate_experiment(EXPERIMENT) == []
    assert set(EXPERIMENT.points) == {"smoke", "node", "paper"}
    assert EXPERIMENT.claims is not None and EXPERIMENT.budget_s["smoke"] > 0


@pytest.mark.parametrize("scale", ["node", "paper"])
def test_gpu_points_need_gpus_and_declare_their_resources(scale):
    points = EXPERIMENT.points_for(scale)
    assert points and len({p.name for p in points}) == len(points)
    for point in points:
        params, res = point.params, point.resources
        assert point.needs_gpu is True, point.name
        assert res is not None, point.name
        assert res.nodes * res.gpus_per_node == point.world_size, (point.name, res)
        assert 1 <= res.gpus_per_node <= 8  # one DGX-class node at most
        assert params["tp"] * params["dp"] == point.world_size, point.name
        assert params["tp"] <= res.gpus_per_node  # tensor parallelism stays inside a node (Megatron sec. 5)
        assert set(params["variants"]) <= set(mod.VARIANTS)
        if any(v.startswith("plain") for v in params["variants"]):
            assert point.world_size == 1  # the plain GPT is the single-GPU reference
    if scale == "paper":
        assert {p.world_size for p in points} >= {1, 2, 4, 8, 64, 128, 256, 512}
        assert {p.name for p in EXPERIMENT.points_for("node")} <= {p.name for p in points}


def test_smoke_points_are_cpu_sized():
    for point in EXPERIMENT.points_for("smoke"):
        assert not point.needs_gpu
        assert point.params["tp"] * point.params["dp"] == point.world_size


def _check_rows(rows, point, device):
    params = point.params
    for row in rows:
        check_row(row, metrics=EXPERIMENT.metrics)
    frame = pd.DataFrame(rows)
    assert set(frame.metric) <= set(EXPERIMENT.metrics)
    assert all(math.isfinite(v) for v in frame.value)
    assert set(frame.variant) == set(mod.runnable_variants(params["variants"]))
    gpus = params["tp"] * params["dp"]
    alternated = params.get("repetitions", 1) > 1
    for variant in mod.runnable_variants(params["variants"]):
        own = frame[frame.variant == variant]
        if alternated:  # A B A B A B: one row per repetition, then the median and range of each quantity
            reps = own[own.metric == "repetition_iteration_s"]
            assert sorted(reps.repetition) == list(range(1, params["repetitions"] + 1))
            summary = own[own.metric == "iteration_s"].iloc[0]
            assert summary.value == pytest.approx(float(reps.value.median()), rel=1e-12)
            assert (summary.value_min, summary.value_max) == (reps.value.min(), reps.value.max())
            assert (own.alternated_with == ",".join(mod.runnable_variants(params["variants"]))).all()
            own = own[own.metric != "repetition_iteration_s"]
        mine = own.set_index("metric").value
        for metric in ("iteration_s", "tokens_per_s", "model_tflops_per_gpu", "setup_s", "loss"):
            assert metric in mine and mine[metric] > 0, (variant, metric)
        assert 0.5 * math.log(params["vocab"]) < mine["loss"] < 2 * math.log(params["vocab"])  # near ln V at the start
        batch = params["micro_batch_size"] * (params["dp"] if variant.startswith("repro") else 1)
        tokens = batch * params["seq_len"]
        assert mine["tokens_per_s"] * mine["iteration_s"] == pytest.approx(tokens, rel=1e-9)
        flops = gpt_flops_per_iteration(batch_size=batch, seq_length=params["seq_len"], num_layers=params["layers"],
                                        hidden_size=params["hidden"], vocab_size=params["vocab"],
                                        activation_recompute=params["checkpointing"])
        assert mine["model_tflops_per_gpu"] * 1e12 * mine["iteration_s"] * gpus == pytest.approx(flops, rel=1e-9)
        if alternated:  # the FLOPs without the recomputation credit: 72 instead of 96 in the layers' term
            executed = gpt_flops_per_iteration(batch_size=batch, seq_length=params["seq_len"],
                                               num_layers=params["layers"], hidden_size=params["hidden"],
                                               vocab_size=params["vocab"], activation_recompute=False)
            assert mine["executed_tflops_per_gpu"] * 1e12 * mine["iteration_s"] == pytest.approx(executed, rel=1e-9)
        if device == "cuda":
            assert "share_of_peak" in mine and "peak_memory_gib" in mine
        else:  # no GPU, no peak: the CPU rows do not pretend to a share of peak
            assert "share_of_peak" not in mine and "peak_memory_gib" not in mine
    assert (frame.gpu.isna().all()) == (device == "cpu")
    if alternated and "plain_compiled" in set(frame.variant):  # the ratio of the medians, its range from the pairs
        ratio = frame[(frame.metric == "tokens_per_s_vs_plain_compiled") & (frame.variant == "repro")]
        if len(ratio):
            medians = frame[frame.metric == "tokens_per_s"].set_index("variant").value
            assert ratio.value.iloc[0] == pytest.approx(medians["repro"] / medians["plain_compiled"], rel=1e-12)
            assert ratio.value_min.iloc[0] <= ratio.value.iloc[0] * (1 + 1e-12)
            assert ratio.value_max.iloc[0] >= ratio.value.iloc[0] * (1 - 1e-12)


@pytest.fixture(scope="module")
def one_standin_gpu(tmp_path_factory):
    """``repro run --device cuda --point toy_1rank_eager --point toy_tp2`` on a machine with 1 GPU (the CPU stand-in
    ``REPRO_STANDIN_GPUS=1``, under which a point that gets cuda runs on the CPU): the process, its results folder
    and its environment. Run once: its skip of toy_tp2 is what the 1-GPU test checks. (toy_1rank, compiled, runs
    under the stand-in in the GPU session's rehearsal: tests/gpu_path/test_gpu_session.py.)"""
    results = tmp_path_factory.mktemp("one_standin_gpu")
    env = {**os.environ, "REPRO_STANDIN_GPUS": "1", "REPRO_RESULTS_DIR": str(results)}
    proc = subprocess.run([sys.executable, "-m", "repro", "run", "megatron_weak_scaling_gpu", "--scale", "smoke",
                           "--device", "cuda", "--point", "toy_1rank_eager", "--point", "toy_tp2"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, results, env


@pytest.mark.parametrize("name", [p.name for p in mod.SMOKE_POINTS])
def test_smoke_points_run_on_cpu(name, readme_gpu_smoke):
    """Each smoke point's rows as the runner wrote them (run_point's rows and the run's columns) from README.md's
    GPU smoke command (every smoke point on CPU ranks; run once for the session: tests/conftest.py)."""
    point = EXPERIMENT.point_named("smoke", name)
    commands, proc, results = readme_gpu_smoke
    assert shlex.split(commands[0])[3:] == ["run", EXPERIMENT.name, "--scale", "smoke"], commands[0]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = (results / "runs" / EXPERIMENT.name).glob("*.jsonl")
    on_disk = [r for r in read_run(path) if r["point"] == name]
    assert on_disk and all(r["provenance"]["device"].startswith("cpu") for r in on_disk)
    rows = [{k: v for k, v in r.items() if k not in RESERVED_ROW_KEYS} for r in on_disk]
    _check_rows(rows, point, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_smoke_single_rank_point_runs_on_cuda(tmp_path):
    point = EXPERIMENT.point_named("smoke", "toy_1rank")
    rows = execute_point(EXPERIMENT, point, "smoke", device="cuda", scratch_dir=Path(tmp_path))
    _check_rows(rows, point, "cuda")


def _checks(rows):
    return {c.claim_id: c for c in mod.claims(rows)}


def test_claims_are_known_ids():
    known = set(zip(*load_claims()[["paper", "claim_id"]].values.T))
    for check in mod.claims(pd.DataFrame()):
        assert (check.paper, check.claim_id) in known


@pytest.mark.parametrize("rows", [pd.DataFrame(), None], ids=["empty", "none"])
def test_claims_without_rows_need_gpus(rows):
    checks = _checks(rows)
    assert {"baseline_tflops_1gpu", "baseline_pct_peak", "fig5_eff_mp_8gpu", "fig5_eff_mpdp_512gpu"} <= set(checks)
    defined = {"fig5_eff_mp_1gpu": 100.0, "t8_strong_1gpu": 1.0}  # the 1-GPU point over itself: configuration
    assert {c: (checks[c].verdict, checks[c].evidence, checks[c].reproduced_value) for c in defined} == {
        c: ("not counted", "configuration", v) for c, v in defined.items()}
    assert all(c.verdict == "needs GPU" and c.reproduced_value is None for k, c in checks.items() if k not in defined)


def _row(metric, value, *, model="1p2B", tp=1, dp=1, variant="repro", checkpointing=True,
         gpu="NVIDIA H100 80GB HBM3"):
    return dict(metric=metric, value=value, unit=mod.UNITS[metric], variant=variant, model=model, tp=tp, dp=dp,
                gpus=tp * dp, precision="bf16", checkpointing=checkpointing, gpu=gpu)


def test_claims_on_a_synthetic_h100_run():
    rows = pd.DataFrame([
        _row("model_tflops_per_gpu", 445.2),
        _row("share_of_peak", 45.0),
        # the no-checkpointing baseline and the eager variant must not be taken for the paper's baseline
        _row("model_tflops_per_gpu", 600.0, checkpointing=False), _row("share_of_peak", 60.6, checkpointing=False),
        _row("model_tflops_per_gpu", 300.0, variant="repro_eager"), _row("share_of_peak", 30.3, variant="repro_eager"),
        _row("model_tflops_per_gpu", 0.95 * 445.2, model="2p5B", tp=2),
    ])
    checks = _checks(rows)
    share = checks["baseline_pct_peak"]
    assert share.verdict == "differs" and share.reproduced_value == 45.0  # |45 - 30| > 5 points
    assert "45.0" in share.note and "NVIDIA H100 80GB HBM3" in share.note
    tflops = checks["baseline_tflops_1gpu"]
    # TFLOP/s is hardware-bound: only a V100 decides the 39 TFLOP/s claim; the H100's value is shown, not compared
    assert (tflops.verdict, tflops.reproduced_value) == ("not decidable", 445.2)
    assert "445.2" in tflops.note and tflops.hardware == "NVIDIA H100 80GB HBM3 (paper: V100)"
    eff = checks["fig5_eff_mp_2gpu"]
    # 95 % measured, paper 95 % +-5: perfect weak scaling (100 %) is within the tolerance too
    assert eff.verdict == "agrees, not decisive" and eff.reproduced_value == pytest.approx(95.0)
    assert (eff.null, eff.null_value) == ("perfect weak scaling", 100.0)
    assert checks["fig5_eff_mp_1gpu"].verdict == "not counted"  # the reference itself: 100 % by definition
    assert checks["fig5_eff_mp_8gpu"].verdict == "needs GPU"  # not run


def test_claims_reproduced_within_tolerance_on_a_v100():
    """On the paper's GPU the baseline is compared with the plain GPT of the same run as its null: decisive only when
    the plain GPT misses the paper's number; without a plain run, not decisive."""
    v100 = "Tesla V100-SXM2-32GB"
    rows = pd.DataFrame([dict(_row("model_tflops_per_gpu", 40.0, gpu=v100), run_id="r"),
                         dict(_row("share_of_peak", 32.0, gpu=v100), run_id="r"),
                         dict(_row("model_tflops_per_gpu", 30.0, gpu=v100, variant="plain_compiled"), run_id="r"),
                         dict(_row("share_of_peak", 24.0, gpu=v100, variant="plain_compiled"), run_id="r")])
    checks = _checks(rows)
    assert paper_value(PAPER, "baseline_tflops_1gpu") == 39 and paper_value(PAPER, "baseline_pct_peak") == 30
    assert checks["baseline_tflops_1gpu"].verdict == "reproduced" and checks["baseline_tflops_1gpu"].reproduced_value == 40.0
    assert checks["baseline_pct_peak"].verdict == "reproduced" and checks["baseline_pct_peak"].reproduced_value == 32.0
    assert checks["baseline_pct_peak"].null_value == 24.0 and "same run" in checks["baseline_pct_peak"].null
    plain_as_good = rows.assign(value=[40.0, 32.0, 39.5, 31.0])  # the plain GPT within the tolerance too
    assert {c.verdict for k, c in _checks(plain_as_good).items() if k.startswith("baseline")} == {
        "agrees, not decisive"}
    rows = pd.DataFrame([_row("model_tflops_per_gpu", 30.0, gpu=v100), _row("share_of_peak", 24.0, gpu=v100)])
    checks = _checks(rows)
    assert checks["baseline_tflops_1gpu"].verdict == "differs" and checks["baseline_pct_peak"].verdict == "differs"


def test_plain_comparison_pairs_the_points_of_one_run():
    """repro's tokens/s over the compiled plain GPT's, from the ``1p2B_1gpu`` and ``1p2B_1gpu_plain`` points of one
    run; a plain GPT of another run is not paired."""
    def row(variant, value, run_id):
        return dict(_row("tokens_per_s", value, variant=variant), run_id=run_id)

    rows = pd.DataFrame([row("repro", 9500.0, "r2"), row("repro_eager", 7000.0, "r2"),
                         row("plain_compiled", 10000.0, "r2"), row("plain_compiled", 5000.0, "r1")])
    assert "0.95x the tokens/s of the plain GPT compiled whole in the same run (r2: 9500 vs 10000" in \
        mod.plain_comparison(rows)
    assert mod.plain_comparison(rows[rows.run_id == "r1"]) == ""
    share = _checks(pd.concat([rows, pd.DataFrame([dict(_row("share_of_peak", 45.0), run_id="r2")])]))
    assert "0.95x" in share["baseline_pct_peak"].note


def test_smoke_on_one_gpu_runs_what_fits_and_skips_the_rest(one_standin_gpu, monkeypatch, capsys):
    """``--device cuda`` on a machine with 1 GPU (the CPU stand-in ``REPRO_STANDIN_GPUS=1``): toy_1rank_eager runs,
    toy_tp2 (2 ranks, one GPU each) is reported as skipped with the reason, and the command succeeds."""
    proc, results, env = one_standin_gpu
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("skip megatron_weak_scaling_gpu/toy_tp2 (2/2, 2 rank(s)): point 'toy_tp2' needs 2 GPUs (one per rank), "
            "this machine has 1 (stand-in: REPRO_STANDIN_GPUS)") in proc.stdout
    rows = load_rows(results)
    assert set(rows["point"]) == {"toy_1rank_eager"} and set(rows["variant"]) == {"repro_eager"}
    assert all(r["provenance"]["device"].startswith("cpu") for r in read_run(next(results.glob("runs/*/*.jsonl"))))
    # no point fits: the same command in this process (the fixture's process has checked the real exit status)
    from repro.cli import main

    for name in ("REPRO_STANDIN_GPUS", "REPRO_RESULTS_DIR"):
        monkeypatch.setenv(name, env[name])
    capsys.readouterr()
    code = main(["run", "megatron_weak_scaling_gpu", "--scale", "smoke", "--device", "cuda", "--point", "toy_tp2"])
    stderr = capsys.readouterr().err
    assert code == 2 and "no chosen point fits this machine's GPUs" in stderr
    assert len(stderr.strip().splitlines()) == 1
