"""The 9-minute GPU command (``python -m repro.gpu_session``): its limits fit the deadline, its CPU rehearsal runs
every part through the same code (limits stretched on a busy CPU), and a part stopped mid-way keeps the variants it finished."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repro import gpu_session as G
from repro.results import read_run

from repro.experiments.megatron_weak_scaling_gpu import runnable_variants
from repro.gpu_plans import PLANS
from repro.optional import torch_version

#: the toy GPT of the smoke point ``toy_1rank`` is compiled in one worker: why, in
#: tests/gpu_path/test_gpu_path_experiment.py
pytestmark = pytest.mark.xdist_group("toy-gpt-compile")

PARTS = ["provenance", "megatron_1gpu", "gna", "cuda_tests"]


@pytest.mark.parametrize("rehearse,deadline", [(False, 540), (True, 170)])
def test_limits_add_up_to_the_deadline(tmp_path, rehearse, deadline):
    from repro.experiments import registry

    parts = G.plan(tmp_path, rehearse=rehearse, run_id="r")
    assert [p.name for p in parts] == PARTS  # in order of value
    default = G.REHEARSAL_DEADLINE_S if rehearse else G.DEFAULT_DEADLINE_S
    assert default == deadline
    megatron = parts[1]  # repro and the plain GPT in one process: one point that alternates them
    argv = list(megatron.argv)
    point = registry().get("megatron_weak_scaling_gpu").point_named(argv[argv.index("--scale") + 1],
                                                                    argv[argv.index("--point") + 1])
    assert point.params["variants"] == ["repro", "plain_compiled"] and point.params["repetitions"] >= 3


@pytest.mark.parametrize("rehearse", [False, True])
@pytest.mark.parametrize("name", PLANS)
def test_every_plan_fits_its_deadline_and_names_real_points(tmp_path, name, rehearse):
    """Each plan is its own command within 9 minutes (170 s rehearsed), and every point it names is declared."""
    from repro.experiments import registry

    parts = G.plan(tmp_path, rehearse=rehearse, run_id="r", name=name)
    assert parts[0].name == "provenance"
    assert sum(p.limit_s for p in parts) <= (170 if rehearse else 540)
    assert all(0 < p.min_s <= p.limit_s for p in parts)
    reg = registry()
    for part in parts:
        argv = list(part.argv)
        if "--point" not in argv:
            continue
        experiment = next(a for a in argv if a in reg.names())
        scale = argv[argv.index("--scale") + 1]
        for i, arg in enumerate(argv):
            if arg == "--point":
                reg.get(experiment).point_named(scale, argv[i + 1])  # raises for an undeclared point


def _rows(out: Path, experiment: str) -> list[dict]:
    return [r for path in sorted((out / "results" / "runs" / experiment).glob("*.jsonl")) for r in read_run(path)]


def test_rehearsal_runs_every_part(tmp_path):
    """Every part of the headline plan runs on the CPU at toy size. Its limits stretch on a busy machine
    (REHEARSAL_SLACK), so this checks the code, never the machine's speed: no wall-time bound here."""
    out = tmp_path / "session"
    proc = subprocess.run([sys.executable, "-m", "repro.gpu_session", "--rehearse", "--out", str(out)],
                          cwd=G.REPO, capture_output=True, text=True,
                          timeout=G.REHEARSAL_DEADLINE_S * G.REHEARSAL_SLACK + 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcomes = [json.loads(line) for line in (out / "session.jsonl").read_text().splitlines()]
    assert [o["part"] for o in outcomes] == PARTS
    flex = torch_version() >= (2, 5)  # GNA's part compiles FlexAttention: on older torch it is skipped, saying so
    assert all(o["status"] == ("ok" if flex or o["part"] != "gna" else "skipped") for o in outcomes), outcomes
    assert flex or "needs torch >= 2.5 (FlexAttention)" in outcomes[PARTS.index("gna")]["note"]
    assert json.loads((out / "provenance.json").read_text())["standin"] is True
    megatron = _rows(out, "megatron_weak_scaling_gpu")
    assert {r["variant"] for r in megatron} == set(runnable_variants(["repro", "plain_compiled"]))
    assert len({r["run_id"] for r in megatron}) == 1  # repro and the plain GPT compare within one run
    summaries = [r for r in megatron if r["metric"] == "tokens_per_s"]
    assert summaries and all(r["value_min"] <= r["value"] <= r["value_max"] and r["repetitions"] >= 3
                             for r in summaries)
    assert all(r["provenance"]["device"].startswith("cpu") for r in megatron)  # the stand-in computes on the CPU
    assert not flex or {r["point"] for r in _rows(out, "gna_speedup_gpu")} >= {"toy2d_w16x16_s8x16_fwd"}
    assert (out / "tests-cuda.xml").exists() and (out / "summary.txt").exists()
    tests = re.match(r"(\d+) passed, 0 failed, (\d+) skipped", outcomes[PARTS.index("cuda_tests")]["note"])
    assert tests and int(tests[1]) + int(tests[2]) > 0, outcomes  # the GPU path's marked tests ran (or skipped)


@pytest.mark.skipif(torch_version() < (2, 5), reason="compiled layers need torch >= 2.5: the part has no compiled "
                    "variant to stop after")
def test_a_part_stopped_mid_way_keeps_the_variants_it_finished(tmp_path):
    """Stop the 1-GPU part as its time limit would, once the compiled variant's first rows exist (its setup, before
    the plain GPT is built): they are in the results folder, the plain GPT's (not yet measured) are not, and the part
    says it was stopped."""
    out = tmp_path / "session"
    stopped = "20261128T000000.000000Z-5709ed"
    part = G.plan(out, rehearse=True, run_id=stopped)[1]
    runs = out / "results" / "runs" / "megatron_weak_scaling_gpu"

    def compiled_variant_written() -> bool:
        return any(r.get("variant") == "repro" for path in runs.glob("*.jsonl") for r in read_run(path))

    outcome = G.run_part(part, out=out, limit_s=170, env=G.session_env(out), stop_when=compiled_variant_written,
                         poll_s=0.02)
    assert outcome.status == "timed out", (outcome, (out / "logs" / "megatron_1gpu.log").read_text())
    rows = _rows(out, "megatron_weak_scaling_gpu")
    assert {r["variant"] for r in rows} == {"repro"}
    assert {r["metric"] for r in rows} >= {"setup_s"}
    assert all(r["run_id"] == stopped and r["provenance"]["config"]["variants"] == ["repro", "plain_compiled"]
               for r in rows)


def test_too_little_time_left_skips_a_part_saying_so(tmp_path):
    # nothing runs before it, so a busy machine cannot eat the deadline (the provenance part once took 4.4 s of 4)
    outcomes = G.run_session(tmp_path, deadline_s=4, rehearse=True, parts=["megatron_1gpu"],
                             say=lambda _: None, slack=1.0)
    assert [o.status for o in outcomes] == ["skipped"]
    assert "needs at least 30 s" in outcomes[0].note


def test_a_part_needing_more_gpus_than_the_machine_has_is_skipped(tmp_path, monkeypatch):
    """The node plan's 2-8 GPU part on a 1-GPU machine is skipped, saying so, not failed (as on the H200 on
    2026-11-28, where it ran and failed); its rehearsal's own stand-in of 2 GPUs runs it."""
    monkeypatch.setenv("REPRO_STANDIN_GPUS", "1")
    node = {p.name: p for p in G.plan(tmp_path, rehearse=False, run_id="r", name="node")}
    assert G._lacking(node["multi_gpu"]) == "needs 2 GPUs or more; this machine has 1"
    assert G._lacking(node["megatron_no_ckpt"]) == ""
    rehearsal = {p.name: p for p in G.plan(tmp_path, rehearse=True, run_id="r", name="node")}
    assert G._lacking(rehearsal["multi_gpu"]) == ""
    outcomes = G.run_session(tmp_path, deadline_s=540, rehearse=False, parts=["multi_gpu"], plan_name="node",
                             say=lambda _: None)
    assert [(o.status, o.note) for o in outcomes] == [("skipped", "needs 2 GPUs or more; this machine has 1")]


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    for args, expected in ((["--part", "warp"], "unknown part(s) 'warp'"), (["--deadline-s", "-1"], "positive")):
        proc = subprocess.run([sys.executable, "-m", "repro.gpu_session", "--rehearse", "--out", str(tmp_path),
                               *args], cwd=G.REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_zero_offload_plan_rehearsed(tmp_path):
    """The ZeRO-Offload command's rehearsal: the same search on the stand-in GPU writes its rows."""
    outcomes = G.run_session(tmp_path, deadline_s=170, rehearse=True, plan_name="zero_offload", say=lambda _: None)
    assert [(o.part, o.status) for o in outcomes] == [("provenance", "ok"), ("zero_offload", "ok")]
    rows = _rows(tmp_path, "zero_gpu")
    assert {r["point"] for r in rows} == {"search_1rank"} and any(r["metric"] == "largest_trained_params_b"
                                                                  for r in rows)


@pytest.mark.skipif(torch_version() < (2, 5), reason="the step is measured with compiled layers (torch >= 2.5)")
def test_perf_plan_rehearsed(tmp_path):
    """The step's anatomy on the CPU at toy size: every section writes rows with provenance; the device-side norm
    and the cross-entropy that saves the logits are measured beside the code they replaced."""
    assert G.main(["--plan", "perf", "--rehearse", "--out", str(tmp_path)]) == 0  # README's command
    outcomes = [json.loads(line) for line in (tmp_path / "session.jsonl").read_text().splitlines()]
    assert [(o["part"], o["status"]) for o in outcomes] == [("provenance", "ok"), ("step_perf", "ok")]
    rows = [json.loads(line) for line in (tmp_path / "step_perf.jsonl").read_text().splitlines()]
    seen = {(r["section"], r["variant"]) for r in rows}
    assert seen == {("step", "repro_compiled_ckpt"), ("grad_norm", "before_fp64_loop_host_sync"),
                    ("grad_norm", "after_foreach_on_device"), ("cross_entropy", "before_fp32_softmax_saved"),
                    ("cross_entropy", "after_logits_saved"), ("recompute", "before_checkpoint_of_compiled"),
                    ("recompute", "after_compiled_checkpoint"), ("recompute", "no_checkpoint")}, seen
    step = {r["metric"]: r["value"] for r in rows if r["section"] == "step"}
    assert step["iteration_s"] > 0 and {"phase_forward_ms", "phase_backward_ms", "phase_optimizer_ms"} <= set(step)
    assert all(r["provenance"]["git_commit"] and r["provenance"]["torch_version"] for r in rows)


@pytest.mark.skipif(torch_version() < (2, 5), reason="the probe's plan needs torch >= 2.5 (compiled layers)")
def test_probe_plan_rehearsed(tmp_path):
    """The probe on the CPU at toy size: every section runs through its code and writes rows to a result run, each
    naming the device (no GPU here: ``gpu`` is None) with provenance."""
    assert G.main(["--plan", "probe", "--rehearse", "--out", str(tmp_path)]) == 0  # README's command
    outcomes = [json.loads(line) for line in (tmp_path / "session.jsonl").read_text().splitlines()]
    assert [(o["part"], o["status"]) for o in outcomes] == [("provenance", "ok"), ("probe", "ok")]
    rows = _rows(tmp_path, "gpu_probe")
    sections = {r["point"] for r in rows}
    assert sections == {"gemm", "sdpa", "step", "optimizer", "variants", "gna"}, sections
    assert all("gpu" in r and r["provenance"]["git_commit"] for r in rows)
    variants = {r["variant"] for r in rows if r["point"] == "variants"}
    assert variants == {"per_parameter_optimizer", "weight_casts_autocast", "final_norm_eager"}
    assert {r["variant"] for r in rows if r["point"] == "optimizer"} >= {"per_parameter_foreach",
                                                                         "flat_multiply_then_step"}
    assert {r["variant"] for r in rows if r["point"] == "gna"} >= {"current", "all_full", "summary"}
