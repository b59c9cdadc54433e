"""The GPT built partitioned under ZeRO stage 3 (ZeRO-Infinity sec. 7.2): :class:`~repro.models.gpt.GPTModel` on the
meta device as the skeleton, its own blocks (:meth:`GPTModel.blocks`, in the order its weights are drawn) built for
real one at a time by :mod:`repro.zero.construction` when the stage-3 optimizer asks for them, so no rank ever holds
the whole model. It lives with the models: ZeRO itself knows no model class."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.gpt import GPTModel
from repro.tensor_parallel import RNGTracker
from repro.zero.build import build_zero_optimizer
from repro.zero.construction import BlockFactory, BlockMaterializer, skeleton


def build_partitioned_gpt(
    config, zero_config, *, dp_group: CommGroup, tp_group: CommGroup | None = None, rng_tracker=None,
    **optimizer_kwargs: Any,
):
    """(model, stage-3 optimizer) for a GPT built partitioned: equal to ``GPTModel(config)`` under the same seed
    followed by ``build_zero_optimizer``, without ever holding more than one block whole."""
    if zero_config.stage != 3:
        raise ValueError(f"partitioned construction needs stage 3 (partitioned parameters), got {zero_config.stage}")
    model = skeleton(lambda: GPTModel(config, tp_group=tp_group, rng_tracker=rng_tracker))
    materializer = BlockMaterializer(model, gpt_blocks(config, tp_group=tp_group, rng_tracker=rng_tracker))
    optimizer = build_zero_optimizer(model, zero_config, dp_group=dp_group, tp_group=tp_group,
                                     materializer=materializer, **optimizer_kwargs)
    return model, optimizer


def gpt_blocks(config, *, tp_group: CommGroup | None = None, rng_tracker=None) -> list[tuple[str, BlockFactory]]:
    """GPTModel's blocks in construction order, each a factory that draws a real copy of it on the default device
    (its values are those the ordinary constructor draws there, when the factories are called in order)."""
    with torch.device("meta"):
        model = GPTModel(config, tp_group=tp_group, rng_tracker=rng_tracker)
    return [(name, lambda block=block: materialized(block)) for name, block in model.blocks()]


def materialized(block: nn.Module) -> nn.Module:
    """A copy of the meta ``block`` with storage on the default device and its weights drawn
    (``reset_parameters``); its process groups and RNG tracker are shared with ``block``, not copied."""
    shared = {id(value): value for module in block.modules() for value in vars(module).values()
              if isinstance(value, (CommGroup, RNGTracker))}
    real = copy.deepcopy(block, memo=shared).to_empty(device=torch.empty(0).device)
    real.reset_parameters()
    return real
