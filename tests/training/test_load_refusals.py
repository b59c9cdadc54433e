"""``--load`` of what repro train cannot resume: one line and exit code 2, naming what the directory is (issue 36).

Another tool's checkpoint (Hugging Face, DeepSpeed, Megatron-LM, the evaluation harness's) is named as such with
what reads it, found before any process group starts; it used to start from scratch ("no checkpoint") or read as
"a save that did not finish". A checkpoint of repro train whose files are structurally wrong (a manifest that is a
list, a rank file holding another object under a matching hash, a trainer.json without its layout) is "corrupt:
<what>", found at the load; these used to be KeyError tracebacks.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import repro.training.cli as train_cli
from repro.cli import main
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES, assert_refused, run_in_process
from tests.training import forked

#: name -> (files to write under the directory: path -> bytes, text the refusal must hold)
FOREIGN = {
    "huggingface": ({"config.json": b'{"model_type": "gpt2"}', "model.safetensors": b"\0" * 8},
                    "is a Hugging Face model directory"),
    "huggingface_bin": ({"config.json": b"{}", "pytorch_model.bin": b"garbage"}, "is a Hugging Face model directory"),
    "deepspeed": ({"latest": b"global_step10", "global_step10/mp_rank_00_model_states.pt": b"x"},
                  "is a DeepSpeed checkpoint"),
    "megatron": ({"latest_checkpointed_iteration.txt": b"10", "iter_0000010/mp_rank_00/model_optim_rng.pt": b"x"},
                 "is a Megatron-LM checkpoint"),
    "megatron_pipeline": ({"iter_0000010/mp_rank_00_000/model_optim_rng.pt": b"x"}, "is a Megatron-LM checkpoint"),
    "evaluation_harness": ({"repro_checkpoint.json": b"{}"}, "evaluation harness"),
}


@pytest.fixture
def launch_env(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_load_of_another_tools_checkpoint_is_named(name, tmp_path, capsys, launch_env):
    files, text = FOREIGN[name]
    for relative, data in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(data)
    launch_env.setattr(train_cli, "run_fail_fast", lambda *a, **k: pytest.fail(f"{name} was accepted"))
    argv = ["train", "--steps", "2", "--layers", "2", "--load", str(tmp_path)]
    assert_refused(argv, *run_in_process(main, argv, capsys), text)


def _train(*args: str, interpreter: bool = False) -> subprocess.CompletedProcess:
    """``python -m repro.training``: forked from a warm server (tests/training/forked.py), or a new interpreter."""
    environ = {k: v for k, v in __import__("os").environ.items() if k not in LAUNCH_VARIABLES}
    argv = ["--layers", "2", "--hidden", "32", *args]
    if not interpreter:
        return forked.train(argv, env=environ, timeout=180)
    return subprocess.run([sys.executable, "-m", "repro.training", *argv], capture_output=True, text=True,
                          timeout=180, env=environ)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    ckpt = tmp_path_factory.mktemp("ckpt") / "c"
    run = _train("--steps", "1", "--save", str(ckpt))
    assert run.returncode == 0, run.stderr
    return ckpt / "iter_0000001"


def _rehash(iteration: Path, name: str) -> None:
    manifest = json.loads((iteration / "manifest.json").read_text())
    data = (iteration / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (iteration / "manifest.json").write_text(json.dumps(manifest))


def _manifest_a_list(iteration: Path) -> None:
    (iteration / "manifest.json").write_text("[1, 2]")


def _rank_file_another_object(iteration: Path) -> None:
    torch.save({"weights": torch.zeros(2)}, iteration / "rank00000.pt")
    _rehash(iteration, "rank00000.pt")  # the hash matches: the file is the one listed, but no trainer wrote it


def _trainer_json_without_layout(iteration: Path) -> None:
    (iteration / "trainer.json").write_text('{"iteration": 1}')


CORRUPT = {
    "manifest_a_list": (_manifest_a_list, "manifest.json holds a JSON list"),
    "rank_file_another_object": (_rank_file_another_object, "rank00000.pt holds no optimizer state"),
    "trainer_json_without_layout": (_trainer_json_without_layout, "trainer.json lacks tp, pp, dp"),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_load_of_a_structurally_wrong_checkpoint_says_corrupt(name, checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(checkpoint.parent, copy)
    spoil, text = CORRUPT[name]
    spoil(copy / "iter_0000001")
    # one case from a new interpreter: the whole of its stderr, from the start, is the one line
    run = _train("--steps", "2", "--load", str(copy), interpreter=name == "manifest_a_list")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "corrupt checkpoint" in run.stderr and text in run.stderr, run.stderr
