"""``repro submit --wait`` says what the jobs do while it waits (issue 13), tested without Slurm: stand-in
``sbatch``, ``squeue`` and ``scontrol`` on PATH play back a scripted queue."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from repro.cli import main
from repro.harness import submit as S

SQUEUE = """#!/usr/bin/env python3
import os, sys
folder = os.environ["FAKE_SLURM"]
count_file = os.path.join(folder, "squeue.count")
n = int(open(count_file).read()) if os.path.exists(count_file) else 0
open(count_file, "w").write(str(n + 1))
frames = sorted(f for f in os.listdir(folder) if f.startswith("squeue.") and f[7:].isdigit())
frame = frames[min(n, len(frames) - 1)]
sys.stdout.write(open(os.path.join(folder, frame)).read())
"""
SCONTROL = """#!/usr/bin/env python3
import os, sys
sys.stdout.write(open(os.path.join(os.environ["FAKE_SLURM"], "scontrol.out")).read())
"""
SBATCH = """#!/usr/bin/env python3
import json, os, sys
json.dump(sys.argv[1:], open(os.path.join(os.environ["FAKE_SLURM"], "sbatch.args"), "w"))
print("123")
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder of stand-in Slurm commands; ``play(frames, final)`` scripts squeue's answers (one per call, the
    last repeated) and scontrol's final states."""
    folder = tmp_path / "fake-slurm"
    folder.mkdir()
    for name, text in (("squeue", SQUEUE), ("scontrol", SCONTROL), ("sbatch", SBATCH)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    monkeypatch.setenv("FAKE_SLURM", str(folder))
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    def play(frames: list[str], final: list[tuple[str, str, str]]) -> Path:
        for index, frame in enumerate(frames):
            (folder / f"squeue.{index:03d}").write_text(frame)
        (folder / "scontrol.out").write_text("".join(
            f"JobId={int(task.split('_')[0]) + i} ArrayJobId={task.split('_')[0]} ArrayTaskId={task.split('_')[1]} "
            f"JobState={state} ExitCode={code} StdOut=/logs/repro-x-{task}.out\n"
            for i, (task, state, code) in enumerate(final)))
        return folder

    return play


ARRAY_FRAMES = ["123_[0-1] PENDING\n", "123_0 RUNNING\n123_[1] PENDING\n", "123_1 RUNNING\n", ""]
ARRAY_FINAL = [("123_0", "COMPLETED", "0:0"), ("123_1", "FAILED", "1:0")]


def test_wait_says_every_state_change_of_every_array_task(fake_slurm):
    fake_slurm(ARRAY_FRAMES, ARRAY_FINAL)
    said: list[str] = []
    states = S.wait("123", timeout_s=30, poll_s=0.01, say=said.append)
    changes = [re.sub(r" \(\d+ s\)$", "", line) for line in said]
    assert changes == [
        "job 123_0: submitted -> PENDING", "job 123_1: submitted -> PENDING",
        "job 123_0: PENDING -> RUNNING",
        "job 123_0: RUNNING -> COMPLETED (exit code 0:0)", "job 123_1: PENDING -> RUNNING",
        "job 123_1: RUNNING -> FAILED (exit code 1:0)",
    ], said
    assert [(s.job_id, s.state, s.exit_code) for s in states] == ARRAY_FINAL


class PollClock:
    """``time`` for :mod:`repro.harness.submit` whose seconds pass only in its sleeps, so that what the waiting says
    does not depend on how long the stand-in ``squeue`` takes on a loaded machine (a first answer slower than the
    timeout left no time for a progress line)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_reports_progress_while_nothing_changes_and_stops_at_the_timeout(fake_slurm, monkeypatch):
    fake_slurm(["7 RUNNING\n"], [("7_0", "RUNNING", "0:0")])
    clock = PollClock()
    monkeypatch.setattr(S, "time", clock)
    said: list[str] = []
    states = S.wait("7", timeout_s=0.5, poll_s=0.0625, say=said.append, progress_s=0.125)  # exact in binary
    assert said[0].startswith("job 7: submitted -> RUNNING (")
    summaries = [line for line in said if line.startswith("waiting for job 7: 1 RUNNING (")]
    # polls at 0, 1/16, ..., 7/16 s; the change is said at 0, then nothing changes: a summary at 2/16, 4/16, 6/16
    assert len(summaries) == 3 and all(" s elapsed, timeout 0 s)" in line for line in summaries), said
    assert said[-1].startswith("stopped waiting after") and "`scancel 7` stops it" in said[-1]
    assert [s.state for s in states] == ["RUNNING"]


def test_submit_wait_prints_the_changes_and_logs_under_the_results_dir(fake_slurm, fake_env, capsys, monkeypatch,
                                                                       tmp_path):
    folder = fake_slurm(ARRAY_FRAMES, ARRAY_FINAL)
    monkeypatch.setattr(S, "SLURM_DIR", tmp_path / "slurm")
    code = main(["submit", "fake_sum", "--scale", "ci", "--wait", "--timeout", "60", "--progress-every", "30"])
    out = capsys.readouterr().out
    assert code == 1, out  # one task failed
    assert "waiting for job 123 (state changes as they happen" in out
    assert re.search(r"^job 123_0: PENDING -> RUNNING \(\d+ s\)$", out, re.M), out
    assert "job 123_1: RUNNING -> FAILED (exit code 1:0)" in out
    assert "job 123_1: FAILED, exit code 1:0, log /logs/repro-x-123_1.out" in out
    argv = json.loads((folder / "sbatch.args").read_text())
    assert f"--output={fake_env / 'slurm-logs' / '%x-%A_%a.out'}" in argv  # REPRO_RESULTS_DIR, array log name


def test_elapsed_time_reads_in_words():
    assert [S.format_elapsed(s) for s in (4.2, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]
