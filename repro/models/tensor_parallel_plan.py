"""Tensor parallelism as a step applied to a built model (Megatron-LM, Shoeybi et al. 2019, sec. 3).

GPT and BERT are built plain (tensor-parallel layers over a group of one, which are ``nn.Linear`` and
``nn.Embedding`` in all but name); :func:`apply_tensor_parallel` then splits the submodules the table names over the
tensor-parallel group, each by the rule of sec. 3:

=============================  ==========  ==========================================================================
submodule                      split       Megatron sec. 3
=============================  ==========  ==========================================================================
``embedding.word_embeddings``  vocabulary  input embedding: rows split by vocabulary, ``g`` sums the partial lookups
``attention.qkv``              column      self-attention (Fig. 3b): Q, K and V split by heads, ``f`` before
``attention.dense``            row         the output projection, ``g`` after it
``mlp.fc1``                    column      MLP (Fig. 3a): ``A`` of ``GeLU(X A) B``, ``f`` before
``mlp.fc2``                    row         ``B``, ``g`` after it
``lm_head``                    vocab bias  BERT's output bias, split as the logits it is added to
=============================  ==========  ==========================================================================

A column split cuts the weight's rows and the bias; a row split the weight's columns (its bias is added once, after
the reduction, and stays whole); a vocabulary split the (padded) rows.

The output layer needs no row: it is tied to the word embedding and multiplies by its vocabulary shard
(:func:`repro.models.output.parallel_lm_logits`). Dropout inside the split regions draws per-rank masks from the
tracker of sec. 3's last paragraph (:class:`~repro.tensor_parallel.RNGTracker`), which the step hands to every
attention block. The same table cuts a consolidated state dict into this rank's shards (:mod:`repro.models.sharding`).

The step runs on a model built on the meta device (no storage, no random numbers drawn); ``init_weights`` then
materializes only this rank's shards, each drawn as the full matrix and sliced, so the weights are the same at every
tensor-parallel size and no rank ever holds the whole model.
"""

from __future__ import annotations

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.config import TransformerConfig
from repro.models.transformer import ParallelSelfAttention
from repro.tensor_parallel import ColumnParallelLinear, RNGTracker, RowParallelLinear, VocabParallelEmbedding

COLUMN, ROW, VOCAB, VOCAB_BIAS = "column", "row", "vocab", "vocab bias"

#: (submodule path, split): the table above
TENSOR_PARALLEL_PLAN: tuple[tuple[str, str], ...] = (
    ("embedding.word_embeddings", VOCAB),
    ("attention.qkv", COLUMN),
    ("attention.dense", ROW),
    ("mlp.fc1", COLUMN),
    ("mlp.fc2", ROW),
    ("lm_head", VOCAB_BIAS),
)

#: what a split cuts: (parameter of the submodule, dimension cut)
PARAMETER_SPLITS: dict[str, tuple[tuple[str, int], ...]] = {
    COLUMN: (("weight", 0), ("bias", 0)), ROW: (("weight", 1),), VOCAB: (("weight", 0),), VOCAB_BIAS: (("bias", 0),),
}


def _matches(name: str, path: str) -> bool:
    return name == path or name.endswith("." + path)


def _split(module: nn.Module, style: str, group: CommGroup, config: TransformerConfig) -> nn.Module:
    """``module`` (a layer over a group of one, on the meta device) rebuilt over ``group``, holding one shard."""
    if style == VOCAB_BIAS:  # the module stays; its bias becomes the shard of the padded vocabulary
        shard = config.padded_vocab_size(group.size) // group.size
        module.bias = nn.Parameter(torch.empty(shard, dtype=module.bias.dtype))
        return module
    dtype = module.weight.dtype
    if style == COLUMN:
        return ColumnParallelLinear(module.in_features, module.out_features, group=group,
                                    bias=module.bias is not None, init_method=module.init_method, dtype=dtype)
    if style == ROW:
        return RowParallelLinear(module.in_features, module.out_features, group=group,
                                 bias=module.bias is not None, init_method=module.init_method, dtype=dtype)
    return VocabParallelEmbedding(config.padded_vocab_size(group.size), module.embedding_dim, group=group,
                                  vocab_size=module.vocab_size, init_method=module.init_method, dtype=dtype)


def apply_tensor_parallel(model: nn.Module, tp_group: CommGroup, rng_tracker: RNGTracker | None = None) -> None:
    """Split, in place, every submodule :data:`TENSOR_PARALLEL_PLAN` names over ``tp_group`` (Megatron sec. 3) and
    give every attention block ``rng_tracker`` for its dropout. ``model`` (GPT or BERT, built plain, on the meta
    device) keeps its parameter names; its ``tp_group`` becomes ``tp_group``."""
    config: TransformerConfig = model.config
    config.check_tensor_parallel(tp_group.size)
    if any(p.device.type != "meta" for p in model.parameters()):
        raise ValueError("apply_tensor_parallel splits a model built on the meta device (with torch.device('meta')),"
                         " before its weights are drawn: a built model's weights would be drawn twice")
    model.tp_group = tp_group
    with torch.device("meta"):
        for name, module in list(model.named_modules()):
            for path, style in TENSOR_PARALLEL_PLAN:
                if _matches(name, path):
                    owner, _, leaf = name.rpartition(".")
                    setattr(model.get_submodule(owner), leaf, _split(module, style, tp_group, config))
    for module in model.modules():
        if isinstance(module, ParallelSelfAttention):
            module.rng_tracker = rng_tracker
