"""``repro train`` as a user runs it: preemption and resume, corrupt checkpoints, data by position (hung ranks:
test_hangs.py)."""

from __future__ import annotations

import json
import signal
import time

from repro.testing import needs
from tests.training.forked import ForkedRanks  # rank processes forked from a warm server: see forked.py
from tests.training.ranks import iterations

STEPS = ["--steps", "30", "--lr-warmup-iters", "3", "--lr-decay-style", "cosine", "--dropout", "0.1"]


def test_preempted_job_saves_exits_75_and_resumes_to_the_same_losses(tmp_path):
    """pp=2 over 2 processes. USR1 reaches rank 1 only (the ranks agree); both save and exit 75; the rerun with the same
    --save/--load continues and its losses (all 30) equal an uninterrupted run's; the log holds both attempts."""
    straight = ForkedRanks(tmp_path, "straight", 2, [*STEPS, "--pp", "2", "--log-jsonl",
                                                     str(tmp_path / "straight.jsonl")])
    assert straight.wait() == [0, 0], straight.all_output()
    ckpt = tmp_path / "ckpt"
    first = ForkedRanks(tmp_path, "first", 2, [*STEPS, "--pp", "2", "--save", str(ckpt), "--load", str(ckpt)])
    first.wait_for(r" iteration +5/")
    first.procs[1].send_signal(signal.SIGUSR1)
    assert first.wait() == [75, 75], first.all_output()
    # rank 0 did not get the signal: its log names the signal and the rank that did
    assert "received SIGUSR1 on rank 1 of 2: stopping after iteration" in first.output(), first.output()
    assert "exiting with code 75" in first.output()
    preempted = [e for e in map(json.loads, (ckpt / "log.jsonl").read_text().splitlines()) if e["event"] == "preempted"]
    assert [(e["signal"], e["ranks"]) for e in preempted] == [(None, {"1": "SIGUSR1"})], preempted
    second = ForkedRanks(tmp_path, "second", 2, [*STEPS, "--pp", "2", "--save", str(ckpt), "--load", str(ckpt)])
    assert second.wait() == [0, 0], second.all_output()
    assert "resumed from checkpoint" in second.output()
    resumed = iterations(ckpt / "log.jsonl")
    expected = iterations(tmp_path / "straight.jsonl")
    assert [r["iteration"] for r in resumed] == list(range(1, 31))
    assert [r["lm_loss"] for r in resumed] == [r["lm_loss"] for r in expected]
    starts = [line for line in (ckpt / "log.jsonl").read_text().splitlines() if '"event": "start"' in line]
    assert len(starts) == 2


def test_corrupt_shard_on_one_rank_stops_every_rank_naming_the_file(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = ForkedRanks(tmp_path, "save", 2, ["--steps", "2", "--zero-stage", "1", "--save", str(ckpt)])
    assert job.wait() == [0, 0], job.all_output()
    shard = ckpt / "iter_0000002" / "rank00001.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    started = time.monotonic()
    job = ForkedRanks(tmp_path, "load", 2, ["--steps", "4", "--zero-stage", "1", "--load", str(ckpt)])
    codes = job.wait(timeout_s=60)
    elapsed = time.monotonic() - started
    assert all(code != 0 for code in codes), job.all_output()
    assert elapsed < 30, f"{elapsed:.0f} s"
    assert "rank00001.pt" in job.output(1) and "sha256" in job.output(1), job.all_output()
    assert "Traceback" not in job.all_output()


def test_samples_do_not_depend_on_steps_and_validation_loss_falls(tmp_path):
    short = ForkedRanks(tmp_path, "short", 1, ["--steps", "4", "--log-jsonl", str(tmp_path / "short.jsonl")])
    long = ForkedRanks(tmp_path, "long", 1, ["--steps", "40", "--lr", "3e-3", "--eval-interval", "10",
                                             "--log-jsonl", str(tmp_path / "long.jsonl")])
    assert short.wait() == [0] and long.wait() == [0], short.all_output() + long.all_output()
    lr_free = ForkedRanks(tmp_path, "same", 1, ["--steps", "8", "--lr", "3e-3", "--log-jsonl",
                                                str(tmp_path / "s.jsonl")])
    assert lr_free.wait() == [0]
    # the batches of steps 1-4 are the same whatever --steps says: same model, same lr -> same losses
    assert [r["lm_loss"] for r in iterations(tmp_path / "short.jsonl")] != []
    same = [r["lm_loss"] for r in iterations(tmp_path / "s.jsonl")]
    assert same == [r["lm_loss"] for r in iterations(tmp_path / "long.jsonl")][:8]
    rows = [line for line in (tmp_path / "long.jsonl").read_text().splitlines() if '"validation"' in line]
    values = [float(line.split('"lm_loss": ')[1].rstrip("}")) for line in rows]
    assert len(values) == 4 and values[-1] < values[0] - 0.5, values


@needs("datasets", "tokenizers")  # tokenizes WikiText-103 first
def test_training_on_tokenized_wikitext103_lowers_validation_loss(tmp_path, data_dir):
    """The documented worked example, small: train on WikiText-103 valid, validate on WikiText-103 test."""
    from repro.training.corpus import main as corpus_main

    for split in ("valid", "test"):
        assert corpus_main(["--wikitext103", split, "--data-dir", str(data_dir), "--output-prefix",
                            str(tmp_path / split), "--no-progress"]) == 0
    # --vocab 50257: the corpus's GPT-2 ids (Ranks' small --vocab 64 would be refused: every id must be below it)
    job = ForkedRanks(tmp_path, "wt103", 1, ["--data", str(tmp_path / "valid"), "--valid-data",
                                             str(tmp_path / "test"), "--vocab", "50257",
                                             "--steps", "30", "--lr", "3e-3", "--eval-interval", "10", "--eval-iters",
                                             "4", "--log-jsonl", str(tmp_path / "wt.jsonl")])
    assert job.wait(timeout_s=300) == [0], job.all_output()
    rows = [line for line in (tmp_path / "wt.jsonl").read_text().splitlines() if '"validation"' in line]
    values = [float(line.split('"lm_loss": ')[1].rstrip("}")) for line in rows]
    assert len(values) == 3 and values[0] > values[1] > values[2], values
