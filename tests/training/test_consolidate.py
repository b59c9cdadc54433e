"""A checkpoint of ``repro train`` at any layout is one GPT (issue 34): tp x pp shards merged, ZeRO's masters put
back together, stage-local layer numbers made global, the tied copy dropped (repro/training/consolidate.py).

The model's initialisation does not depend on the layout (each component is drawn from its own seed), so after one
step at a learning rate of 1e-12 every layout must consolidate to the same weights as the one-process run (a wrong
merge or renumbering moves weights by the initialisation's scale, 0.02); ZeRO-1 at dp 2 must equal plain dp 2
exactly, at a real learning rate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.models.reference import ReferenceGPT
from repro.training.consolidate import is_training_checkpoint, load_trained_gpt
from tests.training import forked
from tests.training.forked import ForkedRanks

SHAPE = ["--layers", "4", "--hidden", "32", "--heads", "4", "--micro-batch-size", "2", "--vocab", "256"]


def _train(tmp: Path, name: str, ranks: int, *args: str) -> Path:
    """``repro train`` on ``ranks`` processes (forked, as srun starts them: see tests/training/forked.py)."""
    ckpt = tmp / name
    job = ForkedRanks(tmp, name, ranks, [*SHAPE, "--save", str(ckpt), *args])
    assert job.wait(timeout_s=300) == [0] * ranks, job.all_output()
    return ckpt


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("layouts")
    still = ["--steps", "1", "--lr", "1e-12", "--micro-batches", "2"]
    moving = ["--steps", "2", "--lr", "1e-3", "--micro-batches", "1", "--dp", "2"]
    return {"one": _train(tmp, "one", 1, *still), "tp2pp2": _train(tmp, "tp2pp2", 4, *still, "--tp", "2", "--pp", "2"),
            "dp2": _train(tmp, "dp2", 2, *moving), "zero1": _train(tmp, "zero1", 2, *moving, "--zero-stage", "1")}


def test_every_layout_consolidates_to_the_same_gpt(layouts):
    one = load_trained_gpt(layouts["one"])
    assert ReferenceGPT(one.config).load_state_dict(one.state_dict, strict=True)  # the names of a whole GPT
    split = load_trained_gpt(layouts["tp2pp2"])
    assert split.meta["tp"] == 2 and split.meta["pp"] == 2 and set(split.state_dict) == set(one.state_dict)
    for name, tensor in one.state_dict.items():
        assert split.state_dict[name].shape == tensor.shape, name
        torch.testing.assert_close(split.state_dict[name], tensor, rtol=0, atol=1e-9, msg=name)
    plain, zero = load_trained_gpt(layouts["dp2"]), load_trained_gpt(layouts["zero1"])
    assert zero.meta["zero_stage"] == 1 and set(zero.state_dict) == set(plain.state_dict)
    for name, tensor in plain.state_dict.items():
        torch.testing.assert_close(zero.state_dict[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert any((plain.state_dict[n] - one.state_dict[n]).abs().max() > 1e-4 for n in one.state_dict)  # it trained


def test_a_save_directory_and_one_iteration_are_both_checkpoints(layouts):
    root = layouts["one"]
    assert is_training_checkpoint(root) and is_training_checkpoint(root / "iter_0000001")
    assert load_trained_gpt(root / "iter_0000001").state_dict.keys() == load_trained_gpt(root).state_dict.keys()
    assert not is_training_checkpoint(root.parent)


def test_the_command_line_writes_one_file_torch_loads_back(layouts, tmp_path):
    """``repro consolidate`` (= python -m repro.training.consolidate) on the tp 2 x pp 2 checkpoint: one file,
    read with weights_only=True, whose config builds the GPT its state dict loads into; bad input is one line."""
    out = tmp_path / "gpt.pt"
    done = subprocess.run([sys.executable, "-m", "repro.training.consolidate", str(layouts["tp2pp2"]), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "trained at tp 2 x pp 2 x dp 1" in done.stdout, done.stderr
    payload = torch.load(out, weights_only=True)
    from repro.models import GPTConfig

    model = ReferenceGPT(GPTConfig(**payload["config"]))
    model.load_state_dict(payload["model"], strict=True)
    expected = load_trained_gpt(layouts["tp2pp2"]).state_dict
    assert all(torch.equal(payload["model"][k], v) for k, v in expected.items())
    assert payload["meta"]["iteration"] == 1 and payload["meta"]["tp"] == 2
    for argv, words in (([str(tmp_path / "none"), str(out)], "holds no checkpoint of repro train"),
                        ([str(layouts["one"]), str(tmp_path)], "is a directory; it must name a file")):
        bad = forked.run(["-m", "repro", "consolidate", *argv], timeout=120)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and words in bad.stderr, bad.stderr
