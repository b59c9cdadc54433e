"""A GPT built partitioned under ZeRO stage 3 (ZeRO-Infinity sec. 7.2): its blocks, in the order
``GPTModel.__init__`` builds them, handed with a skeleton to :mod:`repro.zero.construction` and the stage-3
optimizer, so no rank ever holds the whole model. It lives with the models: ZeRO itself knows no model class."""

from __future__ import annotations

from typing import Any

from torch import nn

from repro.dist.comm import CommGroup
from repro.models.embedding import Embedding
from repro.models.gpt import GPTModel
from repro.models.transformer import TransformerLayer
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
    """GPTModel's pieces in the order ``GPTModel.__init__`` builds them (repro/models/gpt.py)."""
    group = tp_group if tp_group is not None else CommGroup.single("tp")

    def layer() -> nn.Module:
        return TransformerLayer(config, group=group, causal=True, pre_norm=True, rng_tracker=rng_tracker)

    return [
        ("embedding", lambda: Embedding(config, group=group)),
        *[(f"layers.{i}", layer) for i in range(config.num_layers)],
        ("final_layernorm", lambda: nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)),
    ]
