"""Convert between one consolidated state dict and tensor-parallel shards.

The consolidated form is independent of the tensor-parallel size: the vocabulary rows are *unpadded*
(``vocab_size``). Sharding pads them for the target tp (Megatron's 128 x tp rule) and slices each parameter as
the table of :mod:`repro.models.tensor_parallel_plan` splits its module (Megatron sec. 3):

* column-parallel (QKV, FC1) weights and biases: split dim 0;
* row-parallel (attention output, FC2) weights: split dim 1, their biases replicated;
* vocabulary-parallel (word embedding, BERT LM-head bias): padded, then split dim 0;
* everything else (layer norms, positions, pooler, ...): replicated.
"""

from __future__ import annotations

from typing import Mapping

import torch

from repro.models.config import TransformerConfig
from repro.models.tensor_parallel_plan import COLUMN, PARAMETER_SPLITS, ROW, TENSOR_PARALLEL_PLAN

#: parameter-name suffix -> ("column" | "row" | "vocab", dim), from the plan
SPLIT_RULES: dict[str, tuple[str, int]] = {
    f"{path}.{leaf}": (style if style in (COLUMN, ROW) else "vocab", dim)
    for path, style in TENSOR_PARALLEL_PLAN for leaf, dim in PARAMETER_SPLITS[style]
}


def split_rule(name: str) -> tuple[str, int] | None:
    """("column" | "row" | "vocab", dim) for a parameter name, or None when it is replicated."""
    for suffix, rule in SPLIT_RULES.items():
        if name.endswith(suffix):
            return rule
    return None


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] > rows:
        raise ValueError(f"tensor has {tensor.shape[0]} rows, more than the padded vocabulary {rows}")
    pad = torch.zeros((rows - tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, pad], dim=0)


def shard_state_dict(
    full: Mapping[str, torch.Tensor], config: TransformerConfig, tp_rank: int, tp_size: int
) -> dict[str, torch.Tensor]:
    """The state dict tensor-parallel rank ``tp_rank`` of ``tp_size`` loads."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank} is outside [0, tp_size={tp_size})")
    config.check_tensor_parallel(tp_size)
    shards: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        rule = split_rule(name)
        if rule is None:
            shards[name] = tensor.clone()
            continue
        kind, dim = rule
        if kind == "vocab":
            tensor = _pad_rows(tensor[: config.vocab_size], config.padded_vocab_size(tp_size))
        if tensor.shape[dim] % tp_size != 0:
            raise ValueError(f"{name}: dim {dim} of size {tensor.shape[dim]} is not divisible by tp={tp_size}")
        shards[name] = tensor.chunk(tp_size, dim=dim)[tp_rank].clone()
    return shards


def merge_state_dicts(shards: list[Mapping[str, torch.Tensor]], config: TransformerConfig) -> dict[str, torch.Tensor]:
    """Inverse of :func:`shard_state_dict`: one consolidated state dict with unpadded vocabulary rows."""
    if not shards:
        raise ValueError("no shards to merge")
    names = set(shards[0])
    for rank, shard in enumerate(shards[1:], start=1):
        if set(shard) != names:
            raise ValueError(f"shard {rank} has different parameter names than shard 0")
    merged: dict[str, torch.Tensor] = {}
    for name in shards[0]:
        rule = split_rule(name)
        if rule is None:
            merged[name] = shards[0][name].clone()
            continue
        kind, dim = rule
        tensor = torch.cat([shard[name] for shard in shards], dim=dim)
        merged[name] = tensor[: config.vocab_size].clone() if kind == "vocab" else tensor
    return merged
