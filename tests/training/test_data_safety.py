"""Data safety of repro train: a run whose loss or gradient norm turns inf or NaN stops with one line and exit code 3
before any later save, naming the newest checkpoint known good (one whose weights gave a finite loss in the step
after it), not merely the newest (``--on-nan continue`` trains on and counts nan iterations); another run's
checkpoint directory is never saved into without loading it."""

from __future__ import annotations

import json

from tests.training.forked import ForkedRanks  # rank processes forked from a warm server: see forked.py

EXPLODE = ["--steps", "8", "--lr", "1e30", "--lr-warmup-iters", "0"]  # iteration 1 is finite, then it overflows


def test_a_nan_run_stops_naming_the_iteration_and_keeps_the_last_good_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = ForkedRanks(tmp_path, "nan", 2, [*EXPLODE, "--tp", "2", "--save", str(ckpt), "--save-interval", "1"])
    assert job.wait() == [3, 3], job.all_output()
    out = job.output()
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and "iteration 2: " in errors[0], out
    assert " is nan" in errors[0] or " is inf" in errors[0], errors
    # iteration 1's checkpoint holds the update that led to the NaN (weights near 1e30, finite): not known good
    assert "no checkpoint is known good" in errors[0] and f"the newest, iteration 1 in {ckpt}, holds the updates" \
        in errors[0] and "training done" not in out
    assert "Traceback" not in job.all_output()
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000001"]  # iteration 2 was never saved
    events = [json.loads(line) for line in (ckpt / "log.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in events if e["event"] == "nonfinite"] == [2]
    assert [e["iteration"] for e in events if e["event"] == "iteration"] == [1, 2]


def test_on_nan_continue_trains_on_and_counts(tmp_path):
    job = ForkedRanks(tmp_path, "nan_continue", 1, [*EXPLODE, "--on-nan", "continue"])
    assert job.wait() == [0], job.all_output()
    out = job.output()
    assert "training done" in out
    counts = [int(line.split("number of nan iterations:")[1].split("|")[0]) for line in out.splitlines()
              if "number of nan iterations:" in line]
    assert counts[0] == 0 and counts[-1] == 1 and sum(counts) >= 6, out


def test_a_checkpoint_directory_belongs_to_one_run(tmp_path):
    """Saving into a directory whose checkpoints this run does not load (a --load typo, another --hidden) would move
    its newest pointer to another model: refused in one line, unless --overwrite-checkpoints; resuming is fine."""
    ckpt = tmp_path / "ckpt"
    assert ForkedRanks(tmp_path, "first", 1, ["--steps", "2", "--save", str(ckpt)]).wait() == [0]
    other = ForkedRanks(tmp_path, "other", 1, ["--steps", "2", "--hidden", "64", "--save", str(ckpt)])
    assert other.wait() == [2], other.all_output()
    lines = [line for line in other.output().splitlines() if line.strip()]
    assert len(lines) == 1 and f"--save {ckpt} holds another run's checkpoints (newest: iteration 2)" in lines[0]
    assert "--overwrite-checkpoints" in lines[0] and (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2\n"
    resumed = ForkedRanks(tmp_path, "resumed", 1, ["--steps", "4", "--save", str(ckpt), "--load", str(ckpt)])
    assert resumed.wait() == [0] and "resumed from checkpoint" in resumed.output(), resumed.all_output()
    forced = ForkedRanks(tmp_path, "forced", 1, ["--steps", "1", "--save", str(ckpt), "--overwrite-checkpoints"])
    assert forced.wait() == [0], forced.all_output()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "1\n"


def test_the_nan_line_names_the_newest_checkpoint_known_good(tmp_path):
    """Three good iterations saved, then a resume at --lr 1e30: iteration 4's checkpoint holds the update that led to
    the NaN at 5; 3 is the newest known good (its weights gave iteration 4's finite loss). Resuming from the named
    checkpoint with a sane --lr trains on."""
    ckpt = tmp_path / "ckpt"
    good = ForkedRanks(tmp_path, "good", 1, ["--steps", "3", "--save", str(ckpt), "--save-interval", "1"])
    assert good.wait() == [0], good.all_output()
    exploded = ForkedRanks(tmp_path, "exploded", 1, ["--steps", "8", "--lr", "1e30", "--save", str(ckpt), "--load",
                                                str(ckpt), "--save-interval", "1"])
    assert exploded.wait() == [3], exploded.all_output()
    errors = [line for line in exploded.output().splitlines() if "error:" in line]
    assert len(errors) == 1 and "iteration 5: lm loss is nan" in errors[0], exploded.output()
    known = ckpt / "iter_0000003"
    assert (f"the newest checkpoint known good is iteration 3, {known} (its weights gave a finite loss at iteration "
            f"4) (the newest, iteration 4, is not" in errors[0]), errors[0]
    assert f"resume from it with --load {known} --save {ckpt}" in errors[0], errors[0]
    assert json.loads((ckpt / "iter_0000004" / "trainer.json").read_text())["known_good"] == 3
    resumed = ForkedRanks(tmp_path, "resumed", 1, ["--steps", "5", "--load", str(known), "--save", str(ckpt)])
    assert resumed.wait() == [0], resumed.all_output()
    assert f"resumed from checkpoint {known} at iteration 3" in resumed.output(), resumed.output()
