"""``repro train --load`` of a checkpoint whose files pass their sha256 but do not fit this run (repro.training.
checkpoint_fit): a tp-2 shard inside a one-process checkpoint, a trainer.json that disagrees with its shards, fp16
weights in place of fp32, non-finite weights, a model config that lacks a key, a layout of dp=0, a rank file that
pickles a shell command. Each is one line naming the file and the key (no load_state_dict traceback, nothing
loaded); the untouched checkpoint beside them loads. The loader runs in this process, as every rank runs it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch

from repro.dist import init_parallel
from repro.models import GPTConfig
from repro.training.checkpoint import load_training_checkpoint, save_training_checkpoint
from repro.training.data import SyntheticSamples
from repro.training.trainer import PipelineTrainer, TrainSettings
from repro.zero.checkpoint import CheckpointError

CONFIG = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16)
ITER = "iter_0000001"
RANK = f"{ITER}/rank00000.pt"


def _trainer(zero_stage: int = 0, config: GPTConfig = CONFIG) -> PipelineTrainer:
    return PipelineTrainer(config, init_parallel(), TrainSettings(steps=2, micro_batches=2, micro_batch_size=2,
                                                                  seq_len=16, zero_stage=zero_stage))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[int, Path]:
    """One-step checkpoints of one process, without ZeRO and with ZeRO-1."""
    out = {}
    for stage in (0, 1):
        trainer = _trainer(stage)
        trainer.step(SyntheticSamples(vocab_size=64, seq_len=16, seed=0).batch(0, 4))
        out[stage] = save_training_checkpoint(tmp_path_factory.mktemp(f"z{stage}") / "c", trainer).parent
    return out


def _rehash(root: Path) -> None:
    """The manifest vouches for the rank file as it now is (a file that passes its sha256 and is still wrong)."""
    manifest = json.loads((root / ITER / "manifest.json").read_text())
    data = (root / RANK).read_bytes()
    manifest["files"]["rank00000.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (root / ITER / "manifest.json").write_text(json.dumps(manifest))


def _payload(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        payload = torch.load(root / RANK, weights_only=True)
        change(payload)
        torch.save(payload, root / RANK)
        _rehash(root)
    return apply


def _model(change: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda payload: change(payload["extra"]["model"])


def _tp2_shard(model: dict) -> None:
    """What a tp-2 rank holds of the fused QKV and the MLP's first layer: half of the rows."""
    for name in [n for n in model if "attention.qkv" in n or "mlp.fc1" in n]:
        model[name] = model[name][: model[name].shape[0] // 2].clone()


def _trainer_json(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        meta = json.loads((root / ITER / "trainer.json").read_text())
        change(meta)
        (root / ITER / "trainer.json").write_text(json.dumps(meta))
    return apply


class _Shell:
    def __reduce__(self):
        return (os.system, ("true",))


def _set(key: str, value) -> Callable[[dict], None]:
    return lambda tree: tree.__setitem__(key, value)


QKV = "layers.0.attention.qkv.weight"
#: name -> (ZeRO stage of the checkpoint, how its files are changed, words the one line must hold; None: accepted)
CASES: dict[str, tuple[int, Callable[[Path], None], str | None]] = {
    "untouched": (0, lambda root: None, None),
    "untouched_zero1": (1, lambda root: None, None),
    "tp2_shard_in_one_process_checkpoint": (0, _payload(_model(_tp2_shard)), f"{QKV!r} as shape (48, 32) float32, "
                                            "this run's model needs shape (96, 32) float32"),
    "fp16_weights": (0, _payload(_model(lambda m: m.update({k: v.half() for k, v in m.items()}))), "float16"),
    "weights_nan": (0, _payload(_model(lambda m: m[QKV].fill_(float("nan")))), f"{QKV!r} holds non-finite values"),
    "weights_inf": (0, _payload(_model(lambda m: m[QKV].fill_(float("inf")))), "holds non-finite values"),
    "weights_huge_but_finite": (0, _payload(_model(lambda m: m[QKV].fill_(1e30))), None),
    "weight_missing": (0, _payload(_model(lambda m: m.pop(QKV))), f"lacks {QKV!r}"),
    "weight_unexpected": (0, _payload(_model(_set("extra.weight", torch.zeros(2)))), "'extra.weight'"),
    "zero_master_nan": (1, _payload(lambda p: p["optimizer"]["buckets"][0]["state"]["master"].fill_(float("nan"))),
                        "holds non-finite values"),
    "zero_master_short": (1, _payload(lambda p: p["optimizer"]["buckets"][0]["state"].__setitem__(
        "master", torch.zeros(7))), "master weights is shape (7,) float32"),
    "adam_moment_of_another_shape": (0, _payload(lambda p: p["optimizer"]["torch"]["state"][0].__setitem__(
        "exp_avg", torch.zeros(3))), "'exp_avg' of parameter 0 is shape (3,)"),
    "rng_state_of_another_shape": (0, _payload(lambda p: p["extra"]["rng"].__setitem__("torch", torch.zeros(3))),
                                   "its random generator state holds 'torch'"),
    "iteration_negative": (0, _payload(lambda p: p["extra"].__setitem__("iteration", -4)), "iteration=-4"),
    "iteration_disagrees_with_trainer_json": (0, _payload(lambda p: p["extra"].__setitem__("iteration", 7)),
                                              "saved at iteration 7, its trainer.json says 1"),
    "trainer_json_hidden_differs": (0, _trainer_json(lambda m: m["model"].__setitem__("hidden_size", 64)),
                                    "hidden_size 64 in it, 32 in this run"),
    # trainer.json edited to say hidden 64, loaded by a run of hidden 64: its shards (hidden 32) are named
    "trainer_json_disagrees_with_its_shards": (0, _trainer_json(lambda m: m["model"].__setitem__("hidden_size", 64)),
                                               "its model state holds 'embedding.word_embeddings.weight' as shape "
                                               "(128, 32) float32, this run's model needs shape (128, 64)"),
    "trainer_json_lacks_a_model_key": (0, _trainer_json(lambda m: m["model"].pop("num_layers")),
                                       "num_layers absent in it, 2 in this run"),
    "trainer_json_dp_zero": (0, _trainer_json(_set("dp", 0)), "trainer.json has dp=0; it must be an integer >= 1"),
    "trainer_json_tp_negative": (0, _trainer_json(_set("tp", -1)), "trainer.json has tp=-1"),
    "trainer_json_stage_9": (0, _trainer_json(_set("zero_stage", 9)), "zero_stage=9; ZeRO stages are 0 to 3"),
    "rank_file_pickles_a_shell_command": (0, lambda root: (torch.save({"x": _Shell()}, root / RANK), _rehash(root)),
                                          "it pickles posix.system"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_checkpoint_that_does_not_fit_is_one_line(name, saved, tmp_path):
    stage, change, words = CASES[name]
    root = tmp_path / "c"
    shutil.copytree(saved[stage], root)
    change(root)
    hidden = 64 if name == "trainer_json_disagrees_with_its_shards" else CONFIG.hidden_size
    trainer = _trainer(stage, GPTConfig(**{**CONFIG.__dict__, "hidden_size": hidden}))
    before = {k: v.clone() for k, v in trainer.stage.state_dict().items()}
    if words is None:
        assert load_training_checkpoint(root, trainer) == root / ITER and trainer.iteration == 1
        return
    with pytest.raises(CheckpointError) as refused:
        load_training_checkpoint(root, trainer)
    line = str(refused.value)
    assert "\n" not in line and words in line, line
    assert "weights_only" not in line and "Re-running" not in line, line  # never torch's advice to turn it off
    assert trainer.iteration == 0 and all(torch.equal(v, before[k]) for k, v in trainer.stage.state_dict().items())
