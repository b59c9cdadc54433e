"""W&B and TensorBoard for ``repro train`` (issue 34): Megatron's ``--wandb-project`` / ``--wandb-exp-name`` /
``--wandb-save-dir`` and the DeepSpeed config's ``wandb`` and ``tensorboard`` blocks reach the loggers (honoured,
not ignored). W&B is stood in for by a module that records its calls (the real one needs an account or writes a
run directory; ``WANDB_MODE=offline`` is its own business, passed through untouched). The runs are forked from a
warm server (tests/training/forked.py), the stand-in first on their ``sys.path``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.training import forked
from repro.training import argcheck
from repro.training.argcheck import check_args
from repro.training.cli import build_parser, explicit_options

#: a stand-in ``wandb`` package: init() returns a run whose log() and finish() append to $FAKE_WANDB_LOG
STAND_IN = '''
import json, os
def _record(**entry):
    with open(os.environ["FAKE_WANDB_LOG"], "a") as handle:
        handle.write(json.dumps(entry, default=str) + "\\n")
class _Run:
    def log(self, values, step=None):
        _record(call="log", values=values, step=step)
    def finish(self):
        _record(call="finish")
def init(**kwargs):
    _record(call="init", mode=os.environ.get("WANDB_MODE"), **kwargs)
    return _Run()
'''


def _train(tmp: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> list[dict]:
    (tmp / "stub" / "wandb").mkdir(parents=True, exist_ok=True)
    (tmp / "stub" / "wandb" / "__init__.py").write_text(STAND_IN)
    log = tmp / "wandb-calls.jsonl"
    env = {**os.environ, "FAKE_WANDB_LOG": str(log), "WANDB_MODE": "offline"}
    monkeypatch.syspath_prepend(str(tmp / "stub"))  # the forked run takes this sys.path
    run = forked.train(["--steps", "3", "--layers", "2", "--hidden", "32", "--eval-interval", "3", *args],
                       env=env, timeout=180)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_wandb_gets_the_run_its_config_and_every_iteration(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    calls = _train(tmp_path, monkeypatch, "--wandb-project", "repro-test", "--save", str(ckpt))
    init, *logs, finish = calls
    assert init["call"] == "init" and init["project"] == "repro-test" and init["mode"] == "offline"
    assert init["name"] == "ckpt" and init["dir"] == str(ckpt) and init["config"]["hidden"] == 32
    steps = [c["step"] for c in logs if "lm loss" in c["values"]]
    assert steps == [1, 2, 3] and all("learning rate" in c["values"] for c in logs if "lm loss" in c["values"])
    assert any("lm loss validation" in c["values"] and c["step"] == 3 for c in logs)
    assert finish == {"call": "finish"}


def test_the_deepspeed_wandb_block_is_honoured(tmp_path, monkeypatch):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"wandb": {"enabled": True, "project": "from-ds", "group": "g", "team": "t"},
                                  "steps_per_print": 2}))
    calls = _train(tmp_path, monkeypatch, "--deepspeed-config", str(config))
    assert calls[0]["project"] == "from-ds" and calls[0]["group"] == "g" and calls[0]["entity"] == "t"
    assert calls[0]["config"]["log_interval"] == 2  # steps_per_print is the log interval


def test_the_deepspeed_tensorboard_block_sets_the_directory(tmp_path, monkeypatch):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"tensorboard": {"enabled": True, "output_path": str(tmp_path / "tb"),
                                                  "job_name": "run1"}}))
    monkeypatch.setattr(argcheck, "available", lambda module: True)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    argv = ["--steps", "1", "--layers", "2", "--deepspeed-config", str(config)]
    parser = build_parser()
    config = check_args(parser.parse_args(argv), explicit_options(parser, argv))
    assert config.logging.tensorboard_dir == str(tmp_path / "tb" / "run1")
