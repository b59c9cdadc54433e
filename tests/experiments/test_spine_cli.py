"""The `repro` command end to end on the fake experiments: list, run, submit errors, reproduce (figures, claims,
changes), and the clear errors for bad input."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from repro.cli import main
from repro.experiments import Registry
from repro.harness import submit as S
from repro.harness.reproduce import make_figures, reproduce
from repro.paper import load_claims
from repro.testing import needs

FIGURE_PACKAGES = needs("matplotlib", "seaborn")  # repro.figures imports them (and is imported only to draw)


def test_list_and_run(fake_env, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"fake_sum\s+megatron_lm_2019\s+ci\s+2\s+1-2\s+1\s+-\s+no\s+60 s\s+not run", out), out
    assert re.search(r"^\s+paper\s+2\s+1-2\s+1\s+-\s+no\s+10 s\*\s+not run$", out, re.M)  # fake_sum's paper row
    assert re.search(r"fake_gpu\s+gna_2025\s+ci\s+1\s+1\s+1\s+1\s+all", out)
    assert main(["run", "fake_sum", "--scale", "ci", "--point", "n3"]) == 0
    out = capsys.readouterr().out
    assert "fake_sum: ok" in out and "run 20" in out
    assert main(["run", "fake_sum", "--point", "n3"]) == 0
    assert "kept 1 earlier run(s)" in capsys.readouterr().out
    assert main(["run", "fake_sum", "--point", "n3", "--force"]) == 0
    assert "--force replaced 2 earlier run(s)" in capsys.readouterr().out
    assert main(["run", "fake_fail"]) == 1
    assert "fake failure in point boom" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "nope"], "unknown experiment 'nope'"),
        (["run", "fake_sum", "--scale", "huge"], "unknown scale 'huge'; scales are ci, smoke, node, paper"),
        (["run", "fake_sum", "--point", "zz"], "no point 'zz'"),
        (["run", "fake_huge", "--scale", "paper"], "needs about 1000000.0 GiB"),
        (["run", "fake_gpu"], "needs 1 GPU(s)"),
        (["claims", "--scale", "tiny"], "unknown scale 'tiny'"),
        pytest.param(["figures", "--only", "nope"], "unknown figure(s) ['nope']", marks=FIGURE_PACKAGES),
    ],
)
def test_bad_input_is_a_clear_error(fake_env, capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_submit_without_slurm_is_a_clear_error(fake_env, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    monkeypatch.setattr(S, "SLURM_DIR", tmp_path)
    assert main(["submit", "fake_sum", "--scale", "ci"]) == 2
    assert "`sbatch` is not on PATH" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written before the check


def test_submit_sizes_the_job_and_asks_gpus_only_when_needed(fake_registry: Registry, tmp_path):
    logs = tmp_path / "logs"
    job = S.plan(fake_registry.get("fake_sum"), "ci", slurm_dir=tmp_path, log_dir=logs)
    assert "--array=0-1" in job.argv and "--ntasks-per-node=2" in job.argv  # ci: one job holding both points
    assert not [a for a in job.argv if a.startswith("--gpu")] and job.argv[-2:] == (str(tmp_path / "fake_sum.sbatch"), "ci")
    assert (tmp_path / "fake_sum.sbatch").exists() and logs.is_dir()
    gpu = S.plan(fake_registry.get("fake_gpu"), "paper", slurm_dir=tmp_path, log_dir=logs)
    assert "--gpus-per-node=1" in gpu.argv  # derived: one GPU per rank
    assert not [a for a in S.plan(fake_registry.get("fake_gpu"), "paper", slurm_dir=tmp_path, log_dir=logs,
                                  cpu=True).argv if a.startswith("--gpu")]
    small, wide = S.plans(fake_registry.get("fake_sum"), "paper", gpus_per_node=1, slurm_dir=tmp_path, log_dir=logs)
    assert small.points == ("n100",) and "--array=0" in small.argv and "--nodes=1" in small.argv
    assert wide.points == ("n200_ws2",) and "--nodes=2" in wide.argv and "--gpus-per-node=1" in wide.argv
    with pytest.raises(ValueError, match="--nodes 1 is too few"):
        S.plans(fake_registry.get("fake_sum"), "paper", gpus_per_node=1, nodes=1, slurm_dir=tmp_path, log_dir=logs)
    with pytest.raises(ValueError, match="needs 2 jobs"):
        S.plan(fake_registry.get("fake_sum"), "paper", slurm_dir=tmp_path, log_dir=logs)


def test_submit_dry_run_prints_every_job(fake_env, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm needed
    assert main(["submit", "fake_sum", "--scale", "paper", "--time", "2:00:00", "--dry-run"]) == 0
    *lines, note = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["sbatch command (1 point(s)", "sbatch command (1 point(s)"]
    assert all("--time=02:00:00" in line and "--parsable" in line for line in lines)
    # the lines name slurm/fake_sum.sbatch, which no one has written: said, with the command that writes it
    assert note.startswith("note: ") and "fake_sum.sbatch does not exist yet (--dry-run writes nothing)" in note
    assert note.endswith("repro submit fake_sum --scale paper --write-only")


def test_submit_throttles_an_array(fake_env, capsys, monkeypatch, tmp_path):
    """Slurm's array throttle (--array=0-3%2) as repro submit --max-parallel N (an --sbatch-arg=--array is refused,
    naming it)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["submit", "fake_sum", "--scale", "ci", "--dry-run", "--max-parallel", "1"]) == 0
    assert "--array=0-1%1 " in capsys.readouterr().out
    assert main(["submit", "fake_sum", "--scale", "ci", "--dry-run", "--sbatch-arg=--array=0-1%1"]) == 2
    assert "--max-parallel" in capsys.readouterr().err


@FIGURE_PACKAGES
def test_reproduce_runs_everything_then_figures_and_claims(fake_registry: Registry, fake_env, monkeypatch):
    import matplotlib.image as mpimg

    from repro.figures import FIGURES

    subset = Registry()
    for name in ("fake_sum", "fake_gpu"):
        subset.add(fake_registry.get(name), "fake")
    lines: list[str] = []
    first = reproduce(subset, "ci", root=fake_env, say=lines.append)
    assert first.ok, "\n".join(lines)
    text = "\n".join(lines)
    assert "[1/2] fake_gpu" in text and "[2/2] fake_sum" in text and "need a GPU" in text
    assert "experiments:" in text and "ci target < 1200 s" in text
    for name in FIGURES:
        png, svg = fake_env / "figures" / f"{name}.png", fake_env / "figures" / f"{name}.svg"
        assert mpimg.imread(png).shape[0] > 200 and svg.read_text().lstrip().startswith("<?xml")
    assert (fake_env / "figures" / "fake_sum_own.txt").read_text() == f"3 rows, {len(load_claims())} paper claims\n"
    report = pd.read_csv(fake_env / "claims.csv")
    assert {"paper", "claim_id", "paper_value", "reproduced_value", "tolerance", "verdict", "command"} <= set(
        report.columns)
    assert report.set_index("claim_id").loc["gpt2_1p5B_fp16_weights", "verdict"] == "reproduced"
    assert report.set_index("claim_id").loc["K_adam", "verdict"] == "differs"
    assert "fake_sum" in (fake_env / "claims.md").read_text()
    assert "claims: 1 of " in text and "reproduced decisively" in text  # the terminal prints claims.md's headline
    assert not list(fake_env.glob("claims-*"))  # a --scale ci reproduction writes the report of every scale
    # a second reproduction with a changed value reports the change
    monkeypatch.setenv("REPRO_FAKE_MARKER", "changed")
    lines.clear()
    second = reproduce(subset, "ci", root=fake_env, force=True, say=lines.append, only=["fake_sum"],
                       figures=["gna_speedup_gpu"])  # any one figure: the cheapest (0.4 s; claims_overview 6 s)
    assert second.value_changes is not None and "marker" in set(second.value_changes["metric"])
    assert len(list((fake_env / "runs" / "fake_sum").glob("*.jsonl"))) == 1  # --force replaced the first run


@FIGURE_PACKAGES
def test_figures_are_deterministic_and_mark_missing_runs(fake_registry: Registry, fake_env):
    first = make_figures(fake_registry, fake_env, "ci", names=["gna_speedup"])
    svg = first.files["gna_speedup"][1].read_text()
    second = make_figures(fake_registry, fake_env, "ci", names=["gna_speedup"])
    assert not first.errors and second.files["gna_speedup"][1].read_text() == svg
    assert "not yet" in svg  # gna_simulator has no rows here
    assert json.dumps(sorted(first.files)) == '["gna_speedup"]'


def test_forwarded_subcommands_hand_over_their_arguments(capsys):
    import pytest

    from repro.cli import main

    for name in ("eval", "train", "zero-report"):
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        assert f"usage: repro {name} " in capsys.readouterr().out  # named as the user typed it (issue 13)
