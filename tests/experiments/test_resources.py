"""Resources as data (issue 11): every point's nodes, tasks per node, GPUs, CPUs, memory and time reach the sbatch
files and ``repro submit`` unchanged; overrides are validated; experiments with only smoke/node/paper scales work.

This module is also an experiment module: ``fake_smoke_gpu`` (smoke + node + paper, like the GPU experiments) is
registered through REPRO_EXTRA_EXPERIMENTS by the ``smoke_env`` fixture.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from repro.verdicts import check_value
from repro.cli import main
from repro.experiments import Registry, registry
from repro.harness import submit as S
from repro.experiments.base import Experiment, Point, Resources, RunContext
from repro.harness.reproduce import reproduce, scale_to_run
from repro.harness.resources import (Overrides, jobs_for, parse_time, resource_problems, resources_of,
                                         point_shape)
from repro.harness.sbatch import render, sbatch_path

FAKE = Path(__file__).with_name("fake_experiments.py")
THIS = Path(__file__)


def _toy_point(point: Point, ctx: RunContext) -> list[dict]:
    return [{"metric": "ranks", "value": float(ctx.world_size), "unit": "count"}]


def _toy_claims(rows) -> list:
    """Maps the smoke rows onto a real claim id, so the claims report shows which scale's rows it used."""
    value = float(rows["value"].max()) if len(rows) else None
    return [check_value("zero_2019", "K_adam", value, rel=0.1, note="fake", evidence="measured")]


def _gpu(name: str, world_size: int, nodes: int, gpus: int, *, cpus: int = 8, mem: float = 64, time_min: int = 30):
    return Point(name, {"n": world_size}, world_size=world_size, needs_gpu=True, memory_gib=8.0,
                 resources=Resources(nodes=nodes, gpus_per_node=gpus, cpus_per_task=cpus, mem_gib=mem,
                                     time_min=time_min))


EXPERIMENTS = (
    Experiment(
        name="fake_smoke_gpu",
        paper="megatron_lm_2019",
        title="Fake: a GPU experiment with smoke, node and paper scales only",
        points={
            "smoke": (Point("toy", {"n": 1}), Point("toy_ws2", {"n": 2}, world_size=2, memory_gib=0.75)),
            "node": (_gpu("one_gpu", 1, 1, 1, mem=32), _gpu("eight_gpus", 8, 1, 8, mem=128, time_min=90)),
            "paper": (_gpu("gpus64", 64, 8, 8, mem=200, time_min=240), _gpu("gpus512", 512, 32, 16, cpus=12,
                                                                             mem=900.5, time_min=2 * 24 * 60),
                      _gpu("gpus64_b", 64, 8, 8, mem=200, time_min=240)),
        },
        run_point=_toy_point,
        claims=_toy_claims,
        budget_s={"smoke": 30.0, "paper": 7200.0},
        metrics=("ranks",),
    ),
)


@pytest.fixture
def smoke_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    results = tmp_path / "results"
    monkeypatch.setenv("REPRO_EXTRA_EXPERIMENTS", f"{FAKE},{THIS}")
    monkeypatch.setenv("REPRO_RESULTS_DIR", str(results))
    registry(refresh=True)
    return results


def _commands(text: str) -> list[list[str]]:
    """The sbatch argvs printed by ``repro submit --dry-run`` (or listed in an sbatch file's comments)."""
    return [shlex.split(line[line.index("sbatch --"):]) for line in text.splitlines() if "sbatch --" in line]


def _options(argv: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)


def _indices(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def _hhmmss(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _mismatches(exp: Experiment, scale: str, argvs: list[list[str]]) -> list[str]:
    """Every point of the scale is in exactly one command, whose resources equal the point's declared ones."""
    points = list(exp.points_for(scale))
    problems, seen = [], []
    for argv in argvs:
        opts = _options(argv)
        chosen = _indices(opts["array"]) if "array" in opts else list(range(len(points)))
        seen += chosen
        for index in chosen:
            point = points[index]
            res = resources_of(point, experiment=exp, scale=scale)
            want = {"nodes": str(res.nodes), "ntasks-per-node": str(point.world_size // res.nodes),
                    "cpus-per-task": str(res.cpus_per_task), "mem": f"{math.ceil(res.mem_gib)}G",
                    "time": _hhmmss(res.time_min)}
            if res.gpus_per_node:
                want["gpus-per-node"] = str(res.gpus_per_node)
            got = {key: opts.get(key) for key in [*want, "gpus-per-node"]}
            if point.world_size % res.nodes or got != {"gpus-per-node": None, **want}:
                problems.append(f"{exp.name}/{scale}/{point.name}: declared {want}, command asks {got}")
    if sorted(seen) != list(range(len(points))):
        problems.append(f"{exp.name}/{scale}: commands cover points {sorted(seen)} of {len(points)}")
    return problems


def test_every_node_and_paper_point_is_submitted_with_its_declared_resources(smoke_env, capsys):
    """Table-driven over the registry (the GPU experiments included as they land): ``repro submit EXP --scale S
    --dry-run`` and the sbatch file's listed commands ask, for every node/paper point, exactly its resources."""
    reg = registry()
    assert "fake_smoke_gpu" in reg
    problems, checked = [], 0
    for exp in reg:
        problems += resource_problems(exp)
        listed = _commands(render(exp))
        for scale in ("node", "paper"):
            if scale not in exp.points:
                continue
            assert main(["submit", exp.name, "--scale", scale, "--dry-run"]) == 0
            argvs = _commands(capsys.readouterr().out)
            problems += _mismatches(exp, scale, argvs)
            in_file = [[x for x in a[1:-2] if not x.startswith("--output")] for a in listed if a[-1] == scale]
            for a in listed:  # an array names its log as repro submit does: <job name>-<array job id>_<task>.out
                if any(x.startswith("--array") for x in a) and "--output=results/slurm-logs/%x-%A_%a.out" not in a:
                    problems.append(f"{exp.name}: the listed array command {a} does not name its log %x-%A_%a.out")
            if in_file != [[x for x in a[1:-2] if not x.startswith(("--parsable", "--output"))] for a in argvs]:
                problems.append(f"{exp.name}/{scale}: the sbatch file lists {in_file}, submit runs {argvs}")
            checked += len(exp.points_for(scale))
    assert not problems, "\n".join(problems)
    assert checked >= 5


def test_paper_jobs_group_points_by_shape(smoke_env, capsys):
    assert main(["submit", "fake_smoke_gpu", "--scale", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    first, second = _commands(out)
    assert _options(first)["array"] == "0,2" and _options(second)["array"] == "1"
    assert " ".join(second[1:-2]).startswith(
        "--parsable --array=1 --nodes=32 --ntasks-per-node=16 --gpus-per-node=16 --cpus-per-task=12 --mem=901G "
        "--time=48:00:00")
    assert "2 point(s): gpus64, gpus64_b" in out
    assert main(["submit", "fake_smoke_gpu", "--scale", "paper", "--point", "gpus512", "--dry-run"]) == 0
    (only,) = _commands(capsys.readouterr().out)
    assert _options(only)["array"] == "1"  # the array index picks the point inside the job
    assert main(["submit", "fake_smoke_gpu", "--scale", "paper", "--no-array", "--dry-run"]) == 2
    assert "--no-array" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--time", "90"], {"time": "01:30:00"}),
        (["--time", "5:30"], {"time": "00:06:00"}),
        (["--time", "2-12"], {"time": "60:00:00"}),
        (["--time", "1-00:30:00"], {"time": "24:30:00"}),
        (["--mem", "64G"], {"mem": "64G"}),
        (["--mem", "0"], {"mem": "0"}),
        (["--cpus-per-task", "4"], {"cpus-per-task": "4"}),
        (["--gpus-per-node", "4"], {"nodes": "128", "ntasks-per-node": "4", "gpus-per-node": "4"}),
        (["--nodes", "64", "--gpus-per-node", "8"], {"nodes": "64", "ntasks-per-node": "8"}),
        (["--cpu"], {"gpus-per-node": None, "nodes": "32", "ntasks-per-node": "16"}),
        (["--partition", "gpu,gpu-long"], {"partition": "gpu,gpu-long"}),
    ],
)
def test_valid_overrides_change_only_what_they_name(smoke_env, capsys, extra, expected):
    argv = ["submit", "fake_smoke_gpu", "--scale", "paper", "--point", "gpus512", "--dry-run", *extra]
    assert main(argv) == 0
    (command,) = _commands(capsys.readouterr().out)
    opts = _options(command)
    assert {key: opts.get(key) for key in expected} == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--time", "garbage"], "--time 'garbage' is not a valid time limit: a Slurm time limit is MM, MM:SS"),
        (["--time", "0"], "--time '0' is not a valid time limit"),
        (["--time", "00:00:00"], "must be > 0"),
        (["--time", "1:75"], "--time '1:75'"),
        (["--time", "1-24"], "hours < 24 after a day count"),
        (["--time", "-5"], "--time '-5'"),
        (["--time=UNLIMITED"], "--time 'UNLIMITED'"),
        (["--nodes", "-1"], "--nodes '-1' is not valid: it must be a positive whole number"),
        (["--nodes=0"], "--nodes '0' is not valid"),
        (["--nodes", "two"], "--nodes 'two'"),
        (["--nodes", "3"], "--nodes 3 does not fit point 'gpus64'"),
        (["--nodes", "1"], "--nodes 1 is too few for point 'gpus64'"),
        (["--gpus-per-node", "-2"], "--gpus-per-node '-2' is not valid: it must be a whole number >= 0"),
        (["--cpus-per-task", "0"], "--cpus-per-task '0' is not valid: it must be a positive whole number"),
        (["--mem", "-4"], "--mem '-4' is not valid"),
        (["--mem", "lots"], "GiB per node"),
        (["--partition", "gpu; rm -rf /"], "--partition 'gpu; rm -rf /' is not valid"),
        (["--point", "nope"], "no point 'nope'"),
    ],
)
def test_bad_overrides_are_one_line_exit_2(smoke_env, capsys, monkeypatch, tmp_path, extra, message):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm: the values are checked first, nothing is written
    monkeypatch.setattr(S, "SLURM_DIR", tmp_path)
    assert main(["submit", "fake_smoke_gpu", "--scale", "paper", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("repro: error: ") and message in lines[0], captured.err
    assert list(tmp_path.iterdir()) == []


def test_dry_run_needs_no_slurm_and_writes_nothing(smoke_env, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(S, "SLURM_DIR", tmp_path / "slurm")
    assert main(["submit", "fake_smoke_gpu", "--scale", "node", "--dry-run"]) == 0
    assert len(_commands(capsys.readouterr().out)) == 2
    assert list(tmp_path.iterdir()) == []
    assert main(["submit", "fake_smoke_gpu", "--scale", "node"]) == 2
    assert "`sbatch` is not on PATH" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("45", 45), ("45:30", 46), ("02:00:00", 120), ("100:00:00", 6000), ("1-0", 1440), ("1-2:30", 1590),
     ("2-00:00:01", 2881), (" 7 ", 7)],
)
def test_slurm_time_formats(text, minutes):
    assert parse_time(text) == minutes


def test_resources_of_declared_and_derived():
    exp = EXPERIMENTS[0]
    declared = exp.points["paper"][1]
    assert resources_of(declared) is declared.resources
    cpu = resources_of(Point("c", world_size=4, memory_gib=0.6), experiment=exp, scale="smoke")
    assert cpu == Resources(nodes=1, gpus_per_node=0, cpus_per_task=1, mem_gib=3.0, time_min=10)
    assert resources_of(Point("c"), experiment=exp, scale="paper").time_min == 360  # 3 x the 2 h budget
    assert resources_of(Point("c")).time_min == 30  # no budget known: 3 x 600 s
    gpu64 = resources_of(Point("g", world_size=64, needs_gpu=True, memory_gib=40))
    assert (gpu64.nodes, gpu64.gpus_per_node, gpu64.mem_gib) == (8, 8, 320.0)
    gpu12 = resources_of(Point("g", world_size=12, needs_gpu=True))
    assert (gpu12.nodes, gpu12.gpus_per_node) == (2, 6)  # ranks split evenly, at most 8 per node


def test_resource_problems_name_the_point():
    bad = Experiment(
        name="bad", paper="zero_2019", title="t", run_point=_toy_point,
        points={"smoke": (Point("a"),),
                "paper": (_gpu("split", 6, 4, 8), _gpu("crowded", 16, 1, 8, mem=200), _gpu("small", 8, 1, 8, mem=16),
                          Point("nogpu", world_size=2, needs_gpu=True, resources=Resources(gpus_per_node=0)))})
    problems = "\n".join(resource_problems(bad))
    assert "bad/paper/split: world_size 6 does not split over 4 nodes" in problems
    assert "bad/paper/crowded: 16 ranks per node but 8 GPUs per node" in problems
    assert "bad/paper/small: mem_gib 16 per node is less than 8 rank(s) x memory_gib 8" in problems
    assert "bad/paper/nogpu: needs_gpu but its resources ask for no GPUs" in problems
    with pytest.raises(ValueError, match="do not split evenly"):
        point_shape(bad, "paper", bad.points["paper"][0])


def test_smoke_only_experiment_in_list_sbatch_and_jobs(smoke_env, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "fake_smoke_gpu" in line]
    assert rows and re.search(r"fake_smoke_gpu\s+megatron_lm_2019\s+smoke\s+2\s+1-2\s+1\s+-\s+no\s+30 s", rows[0])
    block = out[out.index("fake_smoke_gpu"):].splitlines()[:3]
    assert re.search(r"node\s+2\s+1-8\s+1\s+1-8\s+all", block[1]) and re.search(
        r"paper\s+3\s+64-512\s+8-32\s+8-16\s+all\s+7200 s", block[2])
    assert main(["list", "--scale", "paper"]) == 0
    assert ("fake_smoke_gpu/paper/gpus512: 512 rank(s), 8 GiB/rank, needs GPU; Slurm: 32 node(s) x 16 task(s), "
            "16 GPU(s)/node, 12 CPU(s)/task, 900.5 GiB/node, 48:00:00 (declared)") in capsys.readouterr().out
    exp = registry().get("fake_smoke_gpu")
    text = render(exp)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    header = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", text, re.M))
    assert header == {"job-name": "repro-fake_smoke_gpu", "nodes": "1", "ntasks-per-node": "2", "cpus-per-task": "1",
                      "mem": "2G", "time": "00:10:00", "output": "results/slurm-logs/%x-%j.out",
                      "signal": "B:USR1@120", "open-mode": "append"}
    assert "\n#SBATCH --requeue\n" in text
    assert 'SCALE="${1:-${REPRO_SCALE:-smoke}}"' in text
    assert ("#     sbatch --array=1 --nodes=32 --ntasks-per-node=16 --gpus-per-node=16 --cpus-per-task=12 --mem=901G "
            "--time=48:00:00 --output=results/slurm-logs/%x-%A_%a.out slurm/fake_smoke_gpu.sbatch paper") in text
    (smoke_job,) = jobs_for(exp, "smoke")
    assert smoke_job.array and smoke_job.shape.tasks_per_node == 2
    (whole,) = jobs_for(exp, "smoke", array=False)
    assert not whole.array and whole.shape.time_min == 10
    assert main(["submit", "fake_smoke_gpu", "--dry-run"]) == 0  # default scale: the CPU one (smoke)
    (command,) = _commands(capsys.readouterr().out)
    assert command[-1] == "smoke" and _options(command)["array"] == "0-1"
    with pytest.raises(ValueError, match="needs 2 jobs"):
        S.plan(exp, "paper", write_files=False)
    assert S.plan(exp, "paper", points=["gpus512"], write_files=False).nodes == 32


def test_sequential_jobs_add_declared_times_and_count_derived_ones_once():
    exp = EXPERIMENTS[0]
    (node,) = jobs_for(exp, "node", ["one_gpu"], overrides=Overrides(gpus_per_node=8))
    assert node.shape.gpus_per_node == 8 and node.shape.mem_gib == 32  # declared memory stays as declared
    mixed = Experiment(name="mixed", paper="zero_2019", title="t", run_point=_toy_point,
                       points={"ci": (_gpu("a", 1, 1, 1, time_min=20), _gpu("b", 1, 1, 1, time_min=25),
                                      Point("c"), Point("d")), "paper": (Point("p"),)})
    (job,) = jobs_for(mixed, "ci", array=False)
    assert job.shape.time_min == 20 + 25 + 30 and not job.array
    (job,) = jobs_for(mixed, "ci")
    assert job.shape.time_min == 30 and job.array_spec() == "0-3"


def test_reproduce_ci_runs_smoke_where_there_is_no_ci(smoke_env):
    reg = registry()
    exp = reg.get("fake_smoke_gpu")
    assert scale_to_run(exp, "ci") == "smoke" and scale_to_run(exp, "paper") == "paper"
    assert scale_to_run(reg.get("fake_sum"), "ci") == "ci"
    subset = Registry()
    subset.add(exp, "fake")
    lines: list[str] = []
    # any one figure: the cheapest (gna_speedup_gpu 0.4 s of CPU, claims_overview 6 s); the claims are what is read
    out = reproduce(subset, "ci", root=smoke_env, say=lines.append, figures=["gna_speedup_gpu"])
    assert out.ok, "\n".join(lines)
    assert "fake_smoke_gpu: 2 point(s) at scale smoke, budget 30 s" in "\n".join(lines)
    assert [r.scale for r in out.runs] == ["smoke"] and len(out.runs[0].outcomes) == 2
    assert out.outputs.checks.scales["fake_smoke_gpu"] == "smoke"  # the claims read the smoke rows
    mine = out.outputs.checks.checks.query("experiment == 'fake_smoke_gpu'")
    assert mine["reproduced_value"].tolist() == [2.0] and mine["scale"].tolist() == ["smoke"]


def test_shipped_sbatch_files_header_never_sized_for_a_gpu_scale():
    """The files in slurm/ have CPU-scale headers; any scale that needs GPUs is listed with its GPU options."""
    for exp in registry(refresh=True):
        text = sbatch_path(exp.name).read_text()
        for scale, points in exp.points.items():
            if any(resources_of(p, experiment=exp, scale=scale).gpus_per_node for p in points):
                assert re.search(rf"^#     sbatch .*--gpus-per-node=\d+ .*slurm/{exp.name}\.sbatch {scale}$", text,
                                 re.M), (exp.name, scale)
