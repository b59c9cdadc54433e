"""A GPT built partitioned under stage 3 (ZeRO-Infinity sec. 7.2): the skeleton and blocks of
:mod:`repro.zero.construction` handed to the stage-3 optimizer, so no rank ever holds the whole model."""

from __future__ import annotations

from typing import Any

from repro.dist.comm import CommGroup
from repro.models.gpt import GPTModel
from repro.zero.build import build_zero_optimizer
from repro.zero.construction import BlockMaterializer, gpt_blocks, skeleton


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
