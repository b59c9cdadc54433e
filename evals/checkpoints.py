"""repro checkpoints for evaluation: consolidated or sharded by tensor-parallel rank, with a small JSON header.

Layout of a checkpoint directory::

    repro_checkpoint.json   {"format": "repro-checkpoint/1", "architecture": "gpt" | "bert" | "bert_multiple_choice",
                             "config": {...}, "tp_size": p, "files": [...], "meta": {...}}
    model.pt                the consolidated state dict (unpadded vocabulary), when tp_size == 1
    model_tp{r}of{p}.pt     rank r's shard, when saved sharded

Loading at any tp size works from either form: shards of another size are merged, then re-sharded with
:mod:`repro.models.sharding`. The checkpoint hash recorded in result rows is the sha256 over the files' bytes.
A Hugging Face directory (``config.json`` + weights) is recognised and converted by :mod:`evals.hf_convert`, a
Megatron-LM checkpoint (``latest_checkpointed_iteration.txt``, ``mp_rank_XX/model_optim_rng.pt`` shards) by
:mod:`evals.megatron_checkpoint`; :func:`checkpoint_format` tells the three apart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from repro.models import BertConfig, GPTConfig, merge_state_dicts, shard_state_dict

FORMAT = "repro-checkpoint/1"
HEADER = "repro_checkpoint.json"
CONFIG_CLASSES = {"gpt": GPTConfig, "bert": BertConfig, "bert_multiple_choice": BertConfig}


@dataclass(frozen=True)
class LoadedState:
    """A state dict ready for one tp rank, the config it belongs to, and where it came from."""

    architecture: str
    config: GPTConfig | BertConfig
    state_dict: dict[str, torch.Tensor]
    sha256: str
    source: str  # "repro", "repro-train", "huggingface" or "megatron"
    meta: Mapping[str, Any]


def _write_header(directory: Path, architecture: str, config, tp_size: int, files: list[str], meta) -> None:
    header = {
        "format": FORMAT, "architecture": architecture, "config": dataclasses.asdict(config),
        "tp_size": tp_size, "files": files, "meta": dict(meta or {}),
    }
    (directory / HEADER).write_text(json.dumps(header, indent=1, sort_keys=True))


def _check_architecture(architecture: str) -> None:
    if architecture not in CONFIG_CLASSES:
        raise ValueError(f"architecture {architecture!r} is not one of {sorted(CONFIG_CLASSES)}")


def save_consolidated(directory: str | Path, state_dict: Mapping[str, torch.Tensor], *, architecture: str,
                      config, meta: Mapping[str, Any] | None = None) -> Path:
    """Write one tp-independent state dict (vocabulary rows unpadded, as ``merge_state_dicts`` returns)."""
    _check_architecture(architecture)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, directory / "model.pt")
    _write_header(directory, architecture, config, 1, ["model.pt"], meta)
    return directory


def save_shard(directory: str | Path, shard: Mapping[str, torch.Tensor], *, architecture: str, config,
               tp_rank: int, tp_size: int, meta: Mapping[str, Any] | None = None) -> Path:
    """Write tensor-parallel rank ``tp_rank``'s shard; rank 0 also writes the header. Call on every tp rank."""
    _check_architecture(architecture)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"model_tp{tp_rank}of{tp_size}.pt"
    torch.save({k: v.detach().cpu().contiguous() for k, v in shard.items()}, directory / name)
    if tp_rank == 0:
        files = [f"model_tp{r}of{tp_size}.pt" for r in range(tp_size)]
        _write_header(directory, architecture, config, tp_size, files, meta)
    return directory


def read_header(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / HEADER
    if not path.is_file():
        raise ValueError(f"{str(directory)!r} is not a repro checkpoint: {HEADER} is missing")
    header = json.loads(path.read_text())
    if header.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} has format {header.get('format')!r}, expected {FORMAT!r}")
    _check_architecture(header["architecture"])
    return header


def files_sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def load_repro(directory: str | Path, *, expect: str, tp_rank: int = 0, tp_size: int = 1) -> LoadedState:
    """Load a repro checkpoint for rank ``tp_rank`` of ``tp_size``; ``expect`` is the architecture the caller
    builds (a checkpoint of another architecture is refused)."""
    directory = Path(directory)
    header = read_header(directory)
    if header["architecture"] != expect:
        raise ValueError(
            f"checkpoint {str(directory)!r} holds a {header['architecture']!r} model, but a {expect!r} model was "
            "requested; evaluate it with the matching task"
        )
    config = CONFIG_CLASSES[expect](**header["config"])
    paths = [directory / f for f in header["files"]]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"checkpoint {str(directory)!r} is missing files {missing}")
    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    saved_tp = header["tp_size"]
    if saved_tp == tp_size and len(states) > 1:
        state = states[tp_rank]
    else:
        full = states[0] if len(states) == 1 else merge_state_dicts(states, config)
        state = shard_state_dict(full, config, tp_rank, tp_size)  # also pads vocabulary rows for this tp
    return LoadedState(architecture=expect, config=config, state_dict=state, sha256=files_sha256(paths),
                       source="repro", meta=header.get("meta", {}))


FORMATS = ("repro", "repro-train", "huggingface", "megatron")
#: The variable the paper-scale evaluation points read a GPT checkpoint path from (any of the three formats).
CHECKPOINT_ENV = "REPRO_EVAL_CHECKPOINT"
#: The same for the pretrained BERT that RACE finetuning starts from.
BERT_CHECKPOINT_ENV = "REPRO_EVAL_BERT_CHECKPOINT"
