"""Buckets: runs of parameters that share one flat buffer layout (see ``partition.py`` for the arithmetic).

A bucket never mixes parameter groups (so one set of hyperparameters applies to its shard) and its runtime
buffers are owned by the stage that uses it: stages 0-2 keep ``flat_param`` whole, stage 3 only while gathered;
stages 0-1 keep ``flat_grad`` whole, stages 2-3 only while a bucket's gradients are being collected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from repro.zero.partition import FlatLayout, Piece, flat_layout, group_into_buckets


def param_shape(param: torch.Tensor) -> torch.Size:
    """A parameter's full shape, also for one built partitioned (construction.py), whose storage is a placeholder
    and whose shape is remembered as ``zero_shape`` (DeepSpeed's ``ds_shape``)."""
    return getattr(param, "zero_shape", param.shape)


def param_numel(param: torch.Tensor) -> int:
    numel = 1
    for size in param_shape(param):
        numel *= int(size)
    return numel


@dataclass(eq=False)
class Bucket:
    index: int
    group_index: int
    params: list[nn.Parameter]
    names: list[str]
    layout: FlatLayout
    rank: int
    flat_param: torch.Tensor | None = None
    flat_grad: torch.Tensor | None = None
    grad_shard: torch.Tensor | None = None
    arrived: set[int] = field(default_factory=set)
    shapes: list[torch.Size] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Stage 3 swaps parameters' storage for empty placeholders, so their shapes are remembered here.
        self.shapes = [param_shape(p) for p in self.params]

    @property
    def key(self) -> str:
        return f"b{self.index}"

    @property
    def shard_range(self) -> tuple[int, int]:
        return self.layout.shard_range(self.rank)

    @property
    def pieces(self) -> list[Piece]:
        return self.layout.pieces(self.rank)

    def param_view(self, flat: torch.Tensor, index: int) -> torch.Tensor:
        """Tensor ``index`` as a view of the flat buffer ``flat``, in its parameter's shape."""
        lo, hi = self.layout.tensor_range(index)
        return flat[lo:hi].view(self.shapes[index])

    def flatten(self, tensors: list[torch.Tensor], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A zero-padded flat copy of ``tensors`` laid out as this bucket."""
        flat = torch.zeros(self.layout.padded_numel, dtype=dtype, device=device)
        for index, tensor in enumerate(tensors):
            lo, hi = self.layout.tensor_range(index)
            flat[lo:hi].copy_(tensor.detach().reshape(-1))
        return flat

    def shard_ranges_excluding(self, excluded: set[int]) -> list[tuple[int, int]] | None:
        """Ranges of this rank's shard that belong to parameters not in ``excluded`` (ids); None = everything."""
        if not excluded:
            return None
        ranges: list[tuple[int, int]] = []
        for piece in self.pieces:
            if id(self.params[piece.index]) in excluded:
                continue
            lo, hi = piece.shard_offset, piece.shard_offset + piece.numel
            if ranges and ranges[-1][1] == lo:  # adjacent counted pieces: one range, one reduction
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
        return ranges


def build_buckets(
    groups: list[list[nn.Parameter]],
    names: dict[int, str],
    *,
    world_size: int,
    rank: int,
    bucket_numel: int,
) -> list[Bucket]:
    """Cut each parameter group into buckets of about ``bucket_numel`` elements, laid out for ``world_size``."""
    buckets: list[Bucket] = []
    position = {id(p): i for i, p in enumerate(p for params in groups for p in params)}
    for group_index, params in enumerate(groups):
        numels = [p.numel() for p in params]
        for indices in group_into_buckets(numels, bucket_numel) if params else []:
            chosen = [params[i] for i in indices]
            buckets.append(Bucket(
                index=len(buckets), group_index=group_index, params=chosen,
                names=[names.get(id(p), f"param{position[id(p)]}") for p in chosen],
                layout=flat_layout([p.numel() for p in chosen], world_size), rank=rank,
            ))
    return buckets
