"""A newcomer's first contact: a bare checkout (the tracked files only, no ``../shared/data`` beside it) runs the
README's first command and exits cleanly, running what needs no data and saying in one line which experiments need
``repro data fetch``; with ``$REPRO_DATA_MIRROR`` set, ``repro reproduce`` fetches the missing data sets instead.
Also how ``repro reproduce`` reports a failing point (its error once, short) and a run over its budget.

The newcomer run takes a reduced ``--only`` subset (one experiment without data, one with): the whole ci scale takes
~20 minutes; the figures and claims it then draws take ~50 s of this test's time either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repro.experiments.base import Experiment, Point
from repro.harness.data_check import set_aside_for_data
from repro.harness.reproduce import Reproduction, _summarise
from repro.harness.runner import SHORT_ERROR_CHARS, PointOutcome, RunReport, short_error
from repro.results import REPO_ROOT
from repro.testing import needs
from tests.readme_blocks import commands

CLEAN = ("REPRO_DATA", "REPRO_DATA_MIRROR", "REPRO_RESULTS_DIR", "REPRO_EXTRA_EXPERIMENTS", "REPRO_ROOT")


def _bare_checkout(where: Path) -> Path:
    """The working tree's files a commit would hold (as they are now, edits included), nothing else: no data, no
    results of runs made here, no ../shared beside it."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                            capture_output=True, check=True).stdout
    checkout = where / "repro"
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            (checkout / name).write_bytes(source.read_bytes())
    return checkout


def _readme_first_command() -> list[str]:
    first = commands()[0]
    command = first.split("&&")[-1].split()  # after `bash scripts/setup.sh &&` (the install)
    assert command[:3] == ["python3", "-m", "repro"], first
    return command[3:]


@needs("matplotlib", "seaborn")  # reproduce draws the figures
def test_a_bare_checkout_runs_the_readme_command_without_data(tmp_path):
    checkout = _bare_checkout(tmp_path)
    assert not (tmp_path / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env["PYTHONPATH"] = str(checkout)
    argv = [sys.executable, "-m", "repro", *_readme_first_command(), "--only", "zero_memory_tables",
            "--only", "eval_race"]
    committed = set((checkout / "results" / "runs").glob("eval_race/*.jsonl"))
    done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    notice = [line for line in done.stdout.splitlines() if line.startswith("data:")]
    assert len(notice) == 1, done.stdout
    assert notice[0].startswith(f"data: eval_race needs race, tokenizers, not in the data directory "
                                f"{tmp_path / 'shared' / 'data'}")
    assert "get the data with `repro data fetch --only race --only tokenizers`" in notice[0]
    assert "zero_memory_tables                    1" in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert set((checkout / "results" / "runs").glob("eval_race/*.jsonl")) == committed  # it did not run at all


def test_a_configured_mirror_fetches_what_the_experiments_need(data_dir, tmp_path, monkeypatch):
    experiment = Experiment("needs_lambada", "p", "t", {"ci": (Point("a", {}),)}, run_point=lambda p, c: [],
                            data=("lambada",))
    monkeypatch.setenv("REPRO_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("REPRO_DATA_MIRROR", raising=False)
    lines: list[str] = []
    assert set_aside_for_data([experiment], say=lines.append) == {
        "needs_lambada": "needs lambada in the data directory (repro data fetch --only lambada)"}
    assert len(lines) == 1 and "data: needs_lambada needs lambada" in lines[0]
    monkeypatch.setenv("REPRO_DATA_MIRROR", data_dir.as_uri())
    lines.clear()
    assert set_aside_for_data([experiment], say=lines.append) == {}
    assert (tmp_path / "data" / "lambada" / "lambada_test.jsonl").is_file()
    assert len(lines) == 1 and lines[0].startswith("data: fetched lambada from $REPRO_DATA_MIRROR")
    assert set_aside_for_data([experiment], say=lines.append) == {} and len(lines) == 1  # there now: silent


def test_a_failed_point_is_one_short_line_and_over_budget_is_not_plain_ok():
    long = "DataError: " + "x" * 600 + "\nTraceback (most recent call last): ..."
    line = short_error(long, "eval_race --scale ci --point counts")
    assert "\n" not in line and len(line) < SHORT_ERROR_CHARS + 80
    assert line.endswith("... (the whole error: repro run eval_race --scale ci --point counts)")
    assert short_error("ValueError: short", "x") == "ValueError: short"
    slow = RunReport("slow_exp", "ci", "r", None, (PointOutcome("a", "ok", 1, 12.0),), 12.0, 10.0)
    fast = RunReport("fast_exp", "ci", "r", None, (PointOutcome("a", "ok", 1, 1.0),), 1.0, 10.0)
    lines: list[str] = []
    _summarise(Reproduction(runs=[slow, fast]), "ci", lines.append)
    assert next(line for line in lines if line.startswith("slow_exp")).endswith("ok, OVER BUDGET by 2.0 s")
    assert next(line for line in lines if line.startswith("fast_exp")).endswith("  ok")
