"""One GPT state dict from a checkpoint of ``repro train``, whatever its layout: tp x pp shards, ZeRO or not.

A checkpoint (:mod:`repro.training.checkpoint`) holds one file per rank. With ``zero_stage=0`` the dp-rank-0 file of
each (tp, pp) coordinate carries that pipeline stage's tensor-parallel shard (``extra["model"]``, the names of
:class:`repro.pipeline.stage.GPTStage`); under ZeRO the weights are the fp32 masters in the optimizer states, cut over
dp, and :func:`repro.zero.checkpoint.consolidate_checkpoint` puts them back together per model-parallel rank. Either
way, the tp shards of a stage are merged (:func:`repro.models.sharding.merge_state_dicts`, the inverse of the
sharding the trainer loaded), the stage's local layer numbers become global again (:func:`repro.pipeline.partition.
stage_layers`), and the last stage's copy of the tied word embedding is dropped: the result has the names of a
consolidated GPT (``ReferenceGPT``), which the evaluation harness and the Hugging Face export read. Nothing is
unpickled beyond tensors (``torch.load(weights_only=True)``), and every file is checked against the manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from repro.dist.groups import GridCoord, RankGrid
from repro.models.config import GPTConfig
from repro.models.sharding import merge_state_dicts
from repro.pipeline.partition import stage_layers
from repro.training.checkpoint import find_checkpoint, read_trainer_meta
from repro.zero.checkpoint import CheckpointError, consolidate_checkpoint, verify_checkpoint

#: the last stage's copy of the word embedding (pp > 1): equal to the first stage's, kept once
_OUTPUT_COPY = "output_word_embeddings."


@dataclass
class TrainedGPT:
    """A checkpoint of ``repro train`` as one model: its config, consolidated fp32 weights, and where it came from."""

    path: Path
    config: GPTConfig
    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)
    sha256: str = ""


def is_training_checkpoint(directory: str | os.PathLike) -> bool:
    """A checkpoint ``repro train`` wrote: an ``iter_N`` directory (manifest and trainer.json) or a save directory
    whose newest-pointer names one."""
    path = Path(directory)
    if (path / "manifest.json").is_file() and (path / "trainer.json").is_file():
        return True
    try:
        found = find_checkpoint(path)
    except (CheckpointError, OSError):
        return False
    return found is not None and (found / "trainer.json").is_file()


def _stage_names(state: dict[str, torch.Tensor], layers: range) -> dict[str, torch.Tensor]:
    """A stage's (merged) state with global layer numbers and without the tied copy of the word embedding."""
    out = {}
    for name, tensor in state.items():
        if name.startswith(_OUTPUT_COPY):
            continue
        if name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            name = f"layers.{layers.start + int(index)}.{rest}"
        out[name] = tensor
    return out


def load_trained_gpt(directory: str | os.PathLike) -> TrainedGPT:
    """The newest checkpoint under ``directory`` (or ``directory`` itself) as one consolidated GPT."""
    path = find_checkpoint(directory)
    if path is None:
        raise CheckpointError(f"{directory} holds no checkpoint of repro train (no {Path(directory).name}/"
                              "latest_checkpointed_iteration.txt, no manifest.json)")
    manifest = verify_checkpoint(path)  # every file against its size and sha256
    meta = read_trainer_meta(path)
    config = GPTConfig(**meta["model"])
    tp, pp, dp = meta["tp"], meta["pp"], meta["dp"]
    grid = RankGrid(tp=tp, pp=pp, dp=dp)
    if meta["zero_stage"] > 0:
        by_mp = consolidate_checkpoint(path)  # fp32 masters, per model-parallel rank
    else:
        by_mp = {}
        for pp_rank in range(pp):
            for tp_rank in range(tp):
                name = f"rank{grid.rank(GridCoord(tp_rank, 0, pp_rank)):05d}.pt"
                payload = torch.load(path / name, map_location="cpu", weights_only=True)
                if not isinstance(payload, dict) or not isinstance(payload.get("extra", {}).get("model"), dict):
                    raise CheckpointError(f"corrupt checkpoint {path}: {name} holds no model state")
                by_mp[pp_rank * tp + tp_rank] = payload["extra"]["model"]
    full: dict[str, torch.Tensor] = {}
    for pp_rank in range(pp):
        shards = [by_mp[pp_rank * tp + tp_rank] for tp_rank in range(tp)]
        merged = merge_state_dicts(shards, config) if tp > 1 else dict(shards[0])
        full.update(_stage_names(merged, stage_layers(config.num_layers, pp, pp_rank)))
    digest = ",".join(f"{name}:{entry['sha256'][:16]}" for name, entry in sorted(manifest["files"].items()))
    return TrainedGPT(path=path, config=config, state_dict={k: v.float() for k, v in full.items()},
                      meta={"iteration": meta["iteration"], "tp": tp, "pp": pp, "dp": dp,
                            "zero_stage": meta["zero_stage"], "consumed_samples": meta.get("consumed_samples")},
                      sha256=digest)
