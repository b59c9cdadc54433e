"""One pipeline stage of GPT (MT-NLG sec. 2.4; Megatron, Narayanan et al. 2021 sec. 2.2): the model, cut.

Stage ``r`` of ``p`` holds layers ``[r L/p, (r+1) L/p)``. The first stage also holds the embeddings (word and
position); the last holds the final layer norm and the output layer, whose weight is tied to the word embedding.
With ``p > 1`` the two live on different ranks, so, as in Megatron, the last stage keeps its own copy of the word
embedding (``output_word_embeddings``), initialised identically, and the two copies' gradients are summed over the
embedding group (first + last stage) before every optimizer step (:mod:`repro.pipeline.tied`), so they stay equal.

:func:`cut_to_stage` makes a stage of a :class:`~repro.models.gpt.GPTModel` built on the meta device (the trainer's
``apply_pipeline``); ``init_weights(seed)`` then draws each block from its own seed (``seed`` for the embeddings,
``seed + 1 + l`` for layer ``l``), so the model is the same whatever the pipeline (and, thanks to the full-matrix
initialisation of the parallel layers, tensor) layout. A consolidated state dict (``ReferenceGPT().state_dict()``)
can be loaded instead (:func:`stage_state_dict`).
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from repro.models.config import GPTConfig
from repro.models.gpt import GPTModel
from repro.models.sharding import shard_state_dict
from repro.pipeline.partition import stage_layers
from repro.tensor_parallel import VocabParallelEmbedding

WORD_EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT_EMBEDDING = "output_word_embeddings.weight"
_TIED_COPY = "output_word_embeddings." + WORD_EMBEDDING


def cut_to_stage(model: GPTModel, *, pp_rank: int, pp_size: int) -> GPTModel:
    """Keep, in place, the parts of ``model`` (whole, on the meta device) that stage ``pp_rank`` of ``pp_size``
    holds; the last stage, if not also the first, gets its copy of the word embedding. Parameter names are the
    whole model's, with the layers numbered from 0 on each stage. Returns ``model``."""
    layers = stage_layers(model.config.num_layers, pp_size, pp_rank)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    word = model.embedding.word_embeddings
    if word.weight.device.type != "meta":
        raise ValueError("cut_to_stage cuts a model built on the meta device, before its weights are drawn")
    if last and not first:
        with torch.device("meta"):  # the same shape and init: drawn from the same seed, an exact copy
            model.output_word_embeddings = VocabParallelEmbedding(
                word.num_embeddings, word.embedding_dim, group=word.group, vocab_size=word.vocab_size,
                init_method=word.init_method, dtype=word.weight.dtype)
    model.layers = nn.ModuleList(model.layers[index] for index in layers)
    model.layer_indices = layers
    if not first:
        model.embedding = None
    if not last:
        model.final_layernorm = None
    return model


def stage_state_dict(
    full: Mapping[str, torch.Tensor], config: GPTConfig, *, pp_rank: int, pp_size: int, tp_rank: int = 0,
    tp_size: int = 1,
) -> dict[str, torch.Tensor]:
    """The state dict of stage ``(pp_rank, tp_rank)`` (:func:`cut_to_stage`): global layer indices renumbered locally, the
    word embedding also given to the last stage as ``output_word_embeddings``, then tp-sharded."""
    layers = stage_layers(config.num_layers, pp_size, pp_rank)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    picked: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        if name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            if int(index) in layers:
                picked[f"layers.{int(index) - layers.start}.{rest}"] = tensor
        elif name.startswith("embedding.") and first:
            picked[name] = tensor
        elif name.startswith("final_layernorm.") and last:
            picked[name] = tensor
    if last and not first:
        if WORD_EMBEDDING not in full:
            raise ValueError(f"the consolidated state dict has no {WORD_EMBEDDING!r} to tie the output layer to")
        picked[_TIED_COPY] = full[WORD_EMBEDDING]  # ends like the word embedding: sharded by vocabulary
    shards = shard_state_dict(picked, config, tp_rank, tp_size)
    if last and not first:
        shards[OUTPUT_EMBEDDING] = shards.pop(_TIED_COPY)
    return shards
