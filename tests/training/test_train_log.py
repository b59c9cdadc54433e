"""What ``repro train`` prints is what a Megatron-LM user's tools read (issue 34): a timestamp, Megatron's
``throughput per GPU (TFLOP/s/GPU)`` key, tokens/s, MFU, the largest rank's peak memory; the resolved arguments
once at the start in Megatron's layout, and the same values in ``DIR/train_args.json`` beside the checkpoints."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.training import forked

#: how Megatron-LM log parsers find an iteration's numbers
MEGATRON_LINE = re.compile(r"^ \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] iteration\s+(\d+)/\s*(\d+) \| consumed samples:"
                           r"\s+(\d+) \| elapsed time per iteration \(ms\): ([\d.]+) \| "
                           r"throughput per (?:GPU|CPU rank) \(TFLOP/s/(GPU|rank)\): ([\d.]+) \|.*\| lm loss: "
                           r"([\d.E+-]+) \|", re.M)


def test_the_log_reads_as_megatrons_and_the_arguments_are_kept(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = subprocess.run([sys.executable, "-m", "repro.training", "--steps", "3", "--layers", "2", "--hidden", "32",
                          "--dp", "2", "--save", str(ckpt)], capture_output=True, text=True, timeout=180)
    # dp 2 on a world of 1 is refused: the arguments are printed only for a run that starts
    assert run.returncode == 2 and "---- arguments ----" not in run.stdout
    run = forked.train(["--steps", "3", "--layers", "2", "--hidden", "32", "--save", str(ckpt), "--micro-batches",
                        "3"], timeout=180)  # forked from a warm server (tests/training/forked.py)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    lines = MEGATRON_LINE.findall(out)
    assert [int(line[1]) for line in lines] == [1, 2, 3] and all(int(line[2]) == 3 for line in lines), out
    assert all(float(line[6]) > 0 for line in lines)
    assert {line[5] for line in lines} == {"rank"}  # a CPU run counts no GPUs: "per CPU rank", not Megatron's "per GPU"
    assert "MFU: n/a" in out  # a CPU has no datasheet peak: not guessed
    assert re.search(r"max RSS \(MiB, largest rank\): [\d.]+ \|", out)
    assert out.count("------------------------ arguments ------------------------") == 1
    assert re.search(r"^  micro_batches \.+ 3$", out, re.M) and re.search(r"^  world_size \.+ 1$", out, re.M)
    kept = json.loads((ckpt / "train_args.json").read_text())
    assert kept["micro_batches"] == 3 and kept["hidden"] == 32 and kept["dp"] == 1 and kept["vocab"] == 256
    assert kept["torch_version"] and kept["repro_version"]
    records = [json.loads(line) for line in (ckpt / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "iteration"]
    assert len(steps) == 3 and all(r["max_memory_mib"] > 0 and r["mfu"] is None for r in steps)


def test_the_closing_line_says_its_loss_is_the_last_iterations_not_the_interval_mean(tmp_path):
    run = forked.train(["--steps", "4", "--layers", "1", "--hidden", "16", "--heads", "2", "--log-interval", "2",
                        "--log-jsonl", str(tmp_path / "log.jsonl")], timeout=180)
    assert run.returncode == 0, run.stderr
    losses = [json.loads(line)["lm_loss"] for line in (tmp_path / "log.jsonl").read_text().splitlines()
              if '"iteration"' in line and '"event": "iteration"' in line]
    last_line = MEGATRON_LINE.findall(run.stdout)[-1]
    assert float(last_line[7]) == pytest.approx((losses[2] + losses[3]) / 2, rel=1e-5)  # the interval's mean
    done = next(line for line in run.stdout.splitlines() if line.startswith("training done"))
    assert done == (f"training done: iteration 4 lm loss {losses[3]:.6E} (iteration 4 alone; the last log line's "
                    f"{(losses[2] + losses[3]) / 2:.6E} is the mean of iterations 3-4)")
