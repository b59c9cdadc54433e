"""A run whose loss or gradient norm turns inf or NaN stops with one line and exit code 3, before any later save,
so the last checkpoint is the last good one; ``--on-nan continue`` trains on and counts nan iterations."""

from __future__ import annotations

import json

from tests.training.ranks import Ranks

EXPLODE = ["--steps", "8", "--lr", "1e30", "--lr-warmup-iters", "0"]  # iteration 1 is finite, then it overflows


def test_a_nan_run_stops_naming_the_iteration_and_keeps_the_last_good_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = Ranks(tmp_path, "nan", 2, [*EXPLODE, "--tp", "2", "--save", str(ckpt), "--save-interval", "1"])
    assert job.wait() == [3, 3], job.all_output()
    out = job.output()
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and "iteration 2: " in errors[0], out
    assert " is nan" in errors[0] or " is inf" in errors[0], errors
    assert "the last checkpoint in" in errors[0] and "training done" not in out
    assert "Traceback" not in job.all_output()
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000001"]  # iteration 2 was never saved
    events = [json.loads(line) for line in (ckpt / "log.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in events if e["event"] == "nonfinite"] == [2]
    assert [e["iteration"] for e in events if e["event"] == "iteration"] == [1, 2]


def test_on_nan_continue_trains_on_and_counts(tmp_path):
    job = Ranks(tmp_path, "nan_continue", 1, [*EXPLODE, "--on-nan", "continue"])
    assert job.wait() == [0], job.all_output()
    out = job.output()
    assert "training done" in out
    counts = [int(line.split("number of nan iterations:")[1].split("|")[0]) for line in out.splitlines()
              if "number of nan iterations:" in line]
    assert counts[0] == 0 and counts[-1] == 1 and sum(counts) >= 6, out
