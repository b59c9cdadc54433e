"""More bad input to ``repro train`` and ``python -m repro.dist.torchrun``, refused before any work with exit code 2
and one line naming the value (or, for the launch and the run's end, the one line and exit code the run promises),
and the valid neighbour of each fix still accepted.

Cases that ``check_args`` finds run in this process (the trainer replaced by a failure, or by a stub that returns
0 for an accepted neighbour); cases that need a process group, a launch or a signal run as real processes: forked
from a warm server (tests/training/forked.py), the non-finite loss's from a new interpreter, torchrun's as torchrun.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import repro.training.cli as train_cli
from repro.cli import main
from repro.dist.torchrun_agent import HeldStream, suite_exit_code
from repro.training.corpus import FORMAT, FORMAT_VERSION
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES, assert_refused, one_line, run_in_process
from tests.training import forked

SMALL = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "16", "--micro-batch-size", "2",
         "--micro-batches", "1"]
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29613"}

#: name -> (options, text the line must hold, environment)
REFUSED = {
    "master_addr_empty": ([], "MASTER_ADDR=''", {**TORCHRUN, "MASTER_ADDR": ""}),
    "world_size_huge": ([], "WORLD_SIZE=99999999999999999999", {**TORCHRUN, "WORLD_SIZE": "99999999999999999999"}),
    "rank_huge": ([], "RANK=4294967296", {**TORCHRUN, "RANK": "4294967296", "WORLD_SIZE": "4294967297"}),
    "local_rank_huge": ([], "LOCAL_RANK=99999999999999999999", {**TORCHRUN, "LOCAL_RANK": "99999999999999999999"}),
    "micro_batches_huge": (["--micro-batches", "1000000000000"], "--micro-batches 1000000000000", {}),
    "ds_accumulation_huge": (["--deepspeed-config", "{ds_accumulation}"], "1000000000000", {}),
    "ds_train_batch_huge": (["--deepspeed-config", "{ds_train_batch}"], "GiB of host memory", {}),
    "ds_long_number": (["--deepspeed-config", "{ds_long_number}"], "{ds_long_number} holds a number", {}),
    "ds_deep": (["--deepspeed-config", "{ds_deep}"], "{ds_deep} nests", {}),
    "ds_offload_stage_0": (["--deepspeed-config", "{ds_offload_stage_0}"], "needs zero_optimization.stage >= 1", {}),
    "ds_bf16_and_bfloat16": (["--deepspeed-config", "{ds_bf16_and_bfloat16}"], "bf16 and bfloat16", {}),
    "corpus_understated_max": (["--data", "{understated}"], "token id 300", {}),
    "corpus_index_directory": (["--data", "{index_dir}"], "is a directory", {}),
    "corpus_sha_not_hex": (["--data", "{bad_sha}"], "bin_sha256 'zz'", {}),
    "timeout_tiny": (["--timeout-s", "1e-300"], "--timeout-s 1e-300 must be at least 1 s", {}),
    "watchdog_tiny": (["--watchdog-s", "0.5"], "--watchdog-s 0.5 must be at least 1 s", {}),
    "log_is_corpus_index": (["--data", "{good}", "--log-jsonl", "{good}.idx.json"], "--log-jsonl {good}.idx.json",
                            {}),
    "log_is_corpus_bin": (["--data", "{good}", "--log-jsonl", "{good}.bin"], "--log-jsonl {good}.bin", {}),
    "log_is_valid_corpus": (["--data", "{good}", "--valid-data", "{good}", "--eval-interval", "1", "--log-jsonl",
                             "{good}.bin"], "--log-jsonl {good}.bin", {}),
    "log_is_ds_config": (["--deepspeed-config", "{ds_empty}", "--log-jsonl", "{ds_empty}"],
                         "--log-jsonl {ds_empty}", {}),
    "log_is_pointer": (["--load", "{ckpt}", "--save", "{ckpt}", "--steps", "3", "--log-jsonl",
                        "{ckpt}/latest_checkpointed_iteration.txt"], "lies in the checkpoint directory", {}),
    "log_in_iteration_dir": (["--log-jsonl", "{ckpt}/iter_0000001/trainer.json"], "inside the checkpoint", {}),
    "save_in_iteration_dir": (["--load", "{ckpt}/iter_0000001", "--save", "{ckpt}/iter_0000001", "--steps", "3"],
                              "--save {ckpt}/iter_0000001 is inside the checkpoint", {}),
    "tensorboard_in_iteration_dir": (["--tensorboard-dir", "{ckpt}/iter_0000001/tb"], "--tensorboard-dir", {}),
    "eval_interval_without_valid_corpus": (["--data", "{good}", "--eval-interval", "1"],
                                           "--eval-interval 1 needs --valid-data", {}),
    "eval_iters_huge": (["--eval-interval", "1", "--eval-iters", "1000000000000"],
                        "--eval-iters 1000000000000 must be at most", {}),
    "lr_decay_iters_constant": (["--lr-decay-iters", "2"], "--lr-decay-iters 2 has no effect", {}),
    "min_lr_constant": (["--min-lr", "0.0001"], "--min-lr 0.0001 has no effect", {}),
    "wandb_name_alone": (["--wandb-exp-name", "x"], "--wandb-exp-name 'x' has no effect", {}),
    "wandb_dir_alone": (["--wandb-save-dir", "/proc/x"], "--wandb-save-dir '/proc/x' has no effect", {}),
}
#: valid neighbours of the fixes: accepted by the start checks
ACCEPTED = {
    "steps_twice_same": ["--steps", "3", "--train-iters", "3"],
    # an option given twice keeps the last value (argparse, Megatron-LM; launch.sh appends --load on a requeue)
    "precision_twice_last_wins": ["--precision", "fp16", "--precision", "fp32"],
    "steps_then_train_iters": ["--steps", "3", "--train-iters", "2"],
    "log_beside_corpus": ["--data", "{good}", "--log-jsonl", "{tmp}/log.jsonl"],
    "log_default_name_in_save": ["--load", "{ckpt}", "--save", "{ckpt}", "--steps", "3", "--log-jsonl",
                                 "{ckpt}/log.jsonl"],
    "ds_offload_stage_1": ["--deepspeed-config", "{ds_offload_stage_1}"],
    "timeout_one_second": ["--timeout-s", "1", "--watchdog-s", "1"],
    "min_lr_with_decay": ["--lr-decay-style", "cosine", "--min-lr", "0.0001", "--lr-decay-iters", "2"],
    "eval_interval_synthetic": ["--eval-interval", "1", "--eval-iters", "100000"],
    "eval_interval_with_valid_corpus": ["--data", "{good}", "--valid-data", "{good}", "--eval-interval", "1"],
    "resume_iteration_dir_of_save": ["--load", "{ckpt}/iter_0000001", "--save", "{ckpt}", "--steps", "3"],
}
CONFIGS = {
    "ds_accumulation": {"gradient_accumulation_steps": 10**12},
    "ds_train_batch": {"train_batch_size": 10**30},
    "ds_offload_stage_0": {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
    "ds_offload_stage_1": {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
    "ds_bf16_and_bfloat16": {"bf16": {"enabled": False}, "bfloat16": {"enabled": True}},
    "ds_empty": {},
}


def write_corpus(prefix: Path, tokens: list[int], **fields) -> str:
    """A corpus as the corpus tool lays it out (uint16 .bin, JSON index), its index changed by ``fields``."""
    data = np.asarray(tokens, dtype="<u2").tobytes()
    Path(f"{prefix}.bin").write_bytes(data)
    index = {"format": FORMAT, "version": FORMAT_VERSION, "dtype": "<u2", "num_tokens": len(tokens),
             "num_documents": 1, "eod_id": 0, "vocab_size": 256, "max_token_id": max(tokens),
             "bin_sha256": hashlib.sha256(data).hexdigest(), **fields}
    Path(f"{prefix}.idx.json").write_text(json.dumps(index))
    return str(prefix)


def _train(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
           timeout: float = 120, interpreter: bool = False) -> subprocess.CompletedProcess:
    """``python -m repro.training ARGV`` without the test's launch variables: forked from a warm server
    (tests/training/forked.py), or, with ``interpreter``, a new interpreter (for what it prints as it starts)."""
    environ = {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}, **(env or {})}
    if not interpreter:
        return forked.train(argv, env=environ, cwd=cwd, timeout=timeout)
    return subprocess.run([sys.executable, "-m", "repro.training", *argv], capture_output=True, text=True,
                          env=environ, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A finished run of one iteration: ``c/iter_0000001``, its pointer, train_args.json and log.jsonl."""
    ckpt = tmp_path_factory.mktemp("ckpt") / "c"
    proc = _train([*SMALL, "--steps", "1", "--save", str(ckpt)])
    assert proc.returncode == 0, proc.stderr
    return ckpt


@pytest.fixture
def values(tmp_path: Path, checkpoint: Path) -> dict[str, str]:
    found = {"tmp": str(tmp_path), "ckpt": str(checkpoint)}
    for name, config in CONFIGS.items():
        found[name] = str(tmp_path / f"{name}.json")
        Path(found[name]).write_text(json.dumps(config))
    found["ds_long_number"] = str(tmp_path / "long.json")
    Path(found["ds_long_number"]).write_text('{"train_batch_size": ' + "9" * 5000 + "}")
    found["ds_deep"] = str(tmp_path / "deep.json")
    Path(found["ds_deep"]).write_text("[" * 100000 + "]" * 100000)
    found["good"] = write_corpus(tmp_path / "good", list(range(1, 200)) * 3)
    found["understated"] = write_corpus(tmp_path / "understated", [1, 2, 300] * 100, max_token_id=10)
    found["bad_sha"] = write_corpus(tmp_path / "bad_sha", list(range(1, 200)) * 3, bin_sha256="zz")
    found["index_dir"] = str(tmp_path / "x")
    (tmp_path / "x.idx.json").mkdir()
    return found


@pytest.fixture
def launch_env(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    from repro.training import argcheck

    monkeypatch.setattr(argcheck, "available", lambda module: True)  # tensorboard / wandb need not be installed
    return monkeypatch


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_in_one_line(name, values, capsys, launch_env):
    options, text, env = REFUSED[name]
    for variable, value in env.items():
        launch_env.setenv(variable, value)
    launch_env.setattr(train_cli, "run_fail_fast", lambda *a, **k: pytest.fail(f"{name} was accepted"))
    base = SMALL[:-2] if "--deepspeed-config" in options else SMALL  # the file's batch keys, not --micro-batches
    argv = ["train", *base, *(arg.format(**values) for arg in options)]
    if "--steps" not in options and "--train-iters" not in options:
        argv += ["--steps", "2"]
    assert_refused(argv, *run_in_process(main, argv, capsys), text.format(**values))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_valid_neighbour_accepted(name, values, capsys, launch_env):
    launch_env.setattr(train_cli, "run_fail_fast", lambda *a, **k: 0)
    options = [arg.format(**values) for arg in ACCEPTED[name]]
    argv = ["train", *SMALL, *options, *([] if "--steps" in options else ["--steps", "2"])]
    code, err = run_in_process(main, argv, capsys)
    assert code == 0, err


# ---- real processes ---------------------------------------------------------------------------------------------

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_load_and_a_finished_run_write_nothing_into_save(checkpoint, tmp_path):
    import shutil

    ckpt = tmp_path / "c"
    shutil.copytree(checkpoint, ckpt)
    before = _snapshot(ckpt)
    refused = _train([*SMALL, "--vocab", "128", "--steps", "3", "--load", str(ckpt), "--save", str(ckpt)])
    assert refused.returncode == 2 and "holds a different model" in one_line(refused.stderr), refused.stderr
    assert _snapshot(ckpt) == before  # train_args.json kept the run's own settings
    done = _train([*SMALL, "--steps", "1", "--load", str(ckpt), "--save", str(ckpt)])
    assert done.returncode == 0 and "nothing left to train" in done.stdout, done.stderr
    assert _snapshot(ckpt) == before


def test_a_pointer_that_is_not_text_is_named(checkpoint, tmp_path):
    import shutil

    ckpt = tmp_path / "c"
    shutil.copytree(checkpoint, ckpt)
    (ckpt / "latest_checkpointed_iteration.txt").write_bytes(b"\xff\xfe")
    proc = _train([*SMALL, "--steps", "3", "--load", str(ckpt)])
    assert_refused(["--load", str(ckpt)], proc.returncode, proc.stderr, "latest_checkpointed_iteration.txt")
    assert "iteration number" in proc.stderr


def test_a_master_addr_that_does_not_resolve_is_one_line_and_124():
    started = time.monotonic()
    proc = _train([*SMALL, "--steps", "1", "--timeout-s", "2"],
                  env={**TORCHRUN, "MASTER_ADDR": "no such host", "MASTER_PORT": "29612"})
    assert proc.returncode == 124, proc.stderr
    assert "MASTER_ADDR='no such host' did not resolve" in one_line(proc.stderr)
    assert time.monotonic() - started < 60


def test_a_nonfinite_loss_is_one_line_on_stderr():
    proc = _train([*SMALL, "--steps", "2", "--lr", "1e308"], interpreter=True)  # all its stderr, from the start
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "exit code 3" in one_line(proc.stderr)


def test_a_preemption_during_a_validation_stops_it(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    log, errors = tmp_path / "out.log", tmp_path / "err.log"
    proc = forked.Forked(["-m", "repro.training", *SMALL, "--steps", "3", "--eval-interval", "1", "--eval-iters",
                          "100000", "--save", str(tmp_path / "c")], out=log, err=errors, env=environ)
    try:
        deadline = time.monotonic() + 120
        # the first iteration is done: the validation (100,000 batches) runs now
        while "iteration 1/3" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text() + errors.read_text()
            time.sleep(0.1)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    out, err = log.read_text(), errors.read_text()
    assert proc.returncode == 75, out + err
    assert "cut short by a preemption" in out and (tmp_path / "c" / "iter_0000001").is_dir(), out


@pytest.mark.parametrize("options, code, text", [
    (["--lr", "-1"], 2, "argument --lr: '-1'"),  # printed by rank 0 only
    (["--pp", "2"], 2, "fewer than the pipeline stages"),  # found after the process group exists
], ids=["option", "setup"])
def test_torchrun_passes_the_rank_code_and_line_out(options, code, text):
    environ = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    proc = subprocess.run([sys.executable, "-m", "repro.dist.torchrun", "--nproc-per-node", "2", "-m",
                           "repro.training", *SMALL, "--steps", "2", *options], capture_output=True, text=True,
                          env=environ, timeout=180)
    lines = [line for line in proc.stderr.splitlines() if "repro" in line or "Traceback" in line]
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and text in lines[0], proc.stderr
    assert "ChildFailedError" not in proc.stderr and "exitcode" not in proc.stderr, proc.stderr


# ---- the agent's rules ------------------------------------------------------------------------------------------

def test_suite_exit_code_rules():
    assert suite_exit_code({0: (1.0, 2), 1: (1.0, -15)}) == 2  # the other rank stopped by the agent
    assert suite_exit_code({0: (2.0, 124), 1: (1.0, 3)}) == 3  # the first to fail
    assert suite_exit_code({0: (1.0, 2), 1: (1.0, 1)}) is None  # a traceback somewhere: torchrun's report
    assert suite_exit_code({0: (1.0, -11)}) is None
    assert suite_exit_code({}) is None


def test_held_stream_passes_lines_until_the_agent_reports():
    real = io.StringIO()
    held = HeldStream(real)
    held.write("banner\nW1128 17:30:41.109000 1212 site-packages/torch/distributed/run.py:874] OMP\n")
    held.write("E1128 17:30:41.174000 1212 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] "
               "failed\nTraceback (most recent call last):\n")
    assert real.getvalue().count("\n") == 2 and "failed" not in real.getvalue()
    held.drop()
    held.write("after\n")
    held.release()
    assert real.getvalue().endswith("after\n")
