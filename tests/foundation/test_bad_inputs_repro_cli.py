"""Bad input to ``repro list / run / submit / reproduce`` found before any work: exit code 2 and one line naming
the value and the rule; and the valid neighbour of each still works.

The table holds the environment variables the command reads (``REPRO_RESULTS_DIR``, ``REPRO_EXTRA_EXPERIMENTS``),
an empty ``--scale``, and a scale that one of several experiments lacks; each case runs ``repro.cli.main`` in
this process. A reader that leaves early (``repro list | head -1``) needs a real process, and the GPU-count rule
of ``--device cuda`` is held with the CPU stand-in (``REPRO_STANDIN_GPUS``) and a stand-in for the free memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli import main
from repro.experiments import registry
from repro.experiments.base import Experiment, Point, RunContext
from repro.harness import machine_fit
from repro.harness.runner import plan_run, run_experiment
from repro.results import REPO_ROOT
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES, assert_refused, run_in_process

FAKE = REPO_ROOT / "tests" / "experiments" / "fake_experiments.py"
LONG = "r" * 300

#: name -> (argv, environment variables set for the case, a piece of the one line that names the value)
CASES = {
    "env_results_dir_is_a_file": (["list"], {"REPRO_RESULTS_DIR": "{file}"}, "REPRO_RESULTS_DIR: '{file}' is a file"),
    "env_results_dir_blank": (["list"], {"REPRO_RESULTS_DIR": " "}, "REPRO_RESULTS_DIR: ' ' is blank"),
    "env_results_dir_name_too_long": (["list"], {"REPRO_RESULTS_DIR": "{dir}/" + LONG}, "REPRO_RESULTS_DIR: "
                                      "'{dir}/rrr"),
    "env_results_dir_under_a_file": (["run", "mtnlg_layout"], {"REPRO_RESULTS_DIR": "{file}/sub"},
                                     "REPRO_RESULTS_DIR: '{file}/sub' is under {file}"),
    "run_empty_scale": (["run", "mtnlg_layout", "--scale", ""], {}, "unknown scale ''"),
    "list_empty_scale": (["list", "--scale", ""], {}, "unknown scale ''"),
    "submit_empty_scale": (["submit", "mtnlg_layout", "--scale", "", "--dry-run"], {}, "unknown scale ''"),
    "run_second_experiment_lacks_scale": (["run", "mtnlg_layout", "gna_speedup_gpu", "--scale", "ci"], {},
                                          "'gna_speedup_gpu' has no scale 'ci'"),
    "run_second_experiment_lacks_point": (["run", "mtnlg_layout", "parameter_counts", "--point", "analytic-model"],
                                          {}, "'parameter_counts' has no point 'analytic-model'"),
    "reproduce_only_lacks_scale": (["reproduce", "--scale", "node", "--only", "mtnlg_layout"], {},
                                   "'mtnlg_layout' has no scale 'node'"),
    "extra_experiments_missing_file": (["run", "mtnlg_layout"], {"REPRO_EXTRA_EXPERIMENTS": "/nonexistent.py"},
                                       "REPRO_EXTRA_EXPERIMENTS names '/nonexistent.py', which is not a file"),
    "extra_experiments_unknown_module": (["list"], {"REPRO_EXTRA_EXPERIMENTS": "no_such_module_xyz"},
                                         "REPRO_EXTRA_EXPERIMENTS names 'no_such_module_xyz', which was not loaded"),
}


def materialise(values: list[str] | dict[str, str] | str, tmp_path: Path):
    """``values`` with ``{file}`` (an existing file) and ``{dir}`` (a directory) filled in."""
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("")
    fill = dict(file=str(a_file), dir=str(tmp_path))
    if isinstance(values, str):
        return values.format(**fill)
    if isinstance(values, dict):
        return {key: value.format(**fill) for key, value in values.items()}
    return [value.format(**fill) for value in values]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line_before_any_work(name, tmp_path, capsys, monkeypatch):
    argv, env, text = (materialise(part, tmp_path) for part in CASES[name])
    results = tmp_path / "results"
    monkeypatch.delenv("REPRO_EXTRA_EXPERIMENTS", raising=False)
    monkeypatch.setenv("REPRO_RESULTS_DIR", str(results))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert_refused(argv, *run_in_process(main, argv, capsys), text)
    assert not results.exists(), f"{argv}: wrote {sorted(results.rglob('*'))} before refusing"


# --- the valid neighbours -------------------------------------------------------------------------------------

def test_a_usable_or_empty_results_dir_variable_still_works(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("REPRO_EXTRA_EXPERIMENTS", raising=False)
    monkeypatch.setenv("REPRO_RESULTS_DIR", str(tmp_path / "new"))  # missing: created by a command that writes
    assert main(["list"]) == 0
    assert main(["run", "mtnlg_layout", "--scale", "ci"]) == 0
    assert len(list((tmp_path / "new" / "runs" / "mtnlg_layout").glob("*.jsonl"))) == 1
    monkeypatch.setenv("REPRO_RESULTS_DIR", "")  # empty: unset, the default results directory (only read here)
    assert main(["list"]) == 0
    assert capsys.readouterr().err == ""


def test_several_experiments_that_have_the_scale_all_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("REPRO_EXTRA_EXPERIMENTS", raising=False)
    assert main(["--results-dir", str(tmp_path), "run", "mtnlg_layout", "parameter_counts", "--scale", "ci"]) == 0
    assert {p.name for p in (tmp_path / "runs").iterdir()} == {"mtnlg_layout", "parameter_counts"}


def test_an_extra_experiments_file_that_exists_is_loaded(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REPRO_EXTRA_EXPERIMENTS", str(FAKE))
    registry(refresh=True)
    assert main(["--results-dir", str(tmp_path), "list"]) == 0
    out = capsys.readouterr()
    assert "fake_sum" in out.out and out.err == ""


# --- a reader that leaves early: a real process -----------------------------------------------------------------

@pytest.mark.parametrize("argv", [["list"], ["submit", "megatron_weak_scaling_gpu", "--scale", "paper", "--dry-run"]],
                         ids=["list", "submit"])
def test_a_reader_that_left_ends_the_command_quietly(argv, tmp_path):
    """As ``repro ... | head -1`` once the reader has gone: the pipe's reading end is closed before the command
    writes, so every write meets EPIPE (Python ignores SIGPIPE and raises BrokenPipeError instead)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and k != "REPRO_EXTRA_EXPERIMENTS"}
    env.update(PYTHONPATH=str(REPO_ROOT), REPRO_RESULTS_DIR=str(tmp_path))
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "repro", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=env, cwd=tmp_path)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", (proc.returncode, proc.stderr)


# --- --device cuda: a point needing more GPUs than the machine has is set aside before the memory check ------------

def _one_row(point: Point, ctx: RunContext) -> list[dict]:
    return [{"metric": "ranks", "value": float(ctx.world_size), "unit": "count"}]


WIDE = Experiment(name="wide_fake", paper="megatron_lm_2019", title="a small point and an 8-GPU one", run_point=_one_row,
                  points={"node": (Point("small_1gpu", {}, world_size=1, memory_gib=4.0, needs_gpu=True),
                                   Point("big_8gpu", {}, world_size=8, memory_gib=24.0, needs_gpu=True))})


def test_a_point_needing_more_gpus_is_skipped_not_counted_in_the_memory_check(tmp_path, monkeypatch):
    """One GPU and 124.6 GiB free: the 8-rank point (8 x 24 GiB) is skipped for its GPUs, the small one runs."""
    monkeypatch.setenv(machine_fit.STANDIN_ENV, "1")
    monkeypatch.setattr(machine_fit, "available_memory_gib", lambda: 124.6)
    report = run_experiment(WIDE, "node", device="cuda", results=tmp_path)
    status = {o.point: o.status for o in report.outcomes}
    assert status == {"small_1gpu": "ok", "big_8gpu": "skipped"}, report.outcomes
    assert "needs 8 GPUs (one per rank), this machine has 1" in report.outcomes[1].message


def test_a_point_that_will_run_is_still_held_to_the_memory_check(monkeypatch):
    monkeypatch.setenv(machine_fit.STANDIN_ENV, "8")
    monkeypatch.setattr(machine_fit, "available_memory_gib", lambda: 124.6)
    with pytest.raises(ValueError, match=r"'big_8gpu' at scale 'node' needs about 192\.0 GiB"):
        plan_run(WIDE, "node", device="cuda")
