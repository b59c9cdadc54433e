"""One pipeline stage of GPT (MT-NLG sec. 2.4; Megatron, Narayanan et al. 2021 sec. 2.2).

Stage ``r`` of ``p`` holds layers ``[r L/p, (r+1) L/p)``. The first stage also holds the embeddings (word and
position); the last holds the final layer norm and the output layer, whose weight is tied to the word embedding.
With ``p > 1`` the two live on different ranks, so, as in Megatron, the last stage keeps its own copy of the word
embedding (``output_word_embeddings``), initialised identically, and the two copies' gradients are summed over the
embedding group (first + last stage) before every optimizer step (:mod:`repro.pipeline.tied`), so they stay equal.

Each component is initialised from its own seed (``seed`` for the embeddings, ``seed + 1 + l`` for layer ``l``),
so the model is the same whatever the pipeline (and, thanks to the full-matrix initialisation of the parallel
layers, tensor) layout. A consolidated state dict (``ReferenceGPT().state_dict()``) can be loaded instead.
"""

from __future__ import annotations

import contextlib
from typing import Mapping

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.config import GPTConfig
from repro.models.embedding import Embedding
from repro.models.output import parallel_lm_logits
from repro.models.sharding import shard_state_dict
from repro.models.transformer import TransformerLayer
from repro.pipeline.partition import stage_layers
from repro.tensor_parallel import RNGTracker, VocabParallelEmbedding, vocab_parallel_cross_entropy
from repro.tensor_parallel.layers import normal_init

WORD_EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT_EMBEDDING = "output_word_embeddings.weight"
_TIED_COPY = "output_word_embeddings." + WORD_EMBEDDING


@contextlib.contextmanager
def _seeded(seed: int):
    """Build under a fixed seed without disturbing the caller's generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class GPTStage(nn.Module):
    """``forward(x) -> hidden [b, s, h]``: token ids on the first stage, the previous stage's hidden otherwise;
    the last stage's output is already final-layer-normed, ready for :meth:`loss`, unless ``norm_in_loss`` is set:
    then :meth:`logits` (and so :meth:`loss`) applies the final layer norm, so that a compiled loss region holds it
    with the output layer and the cross-entropy (the trainer's ``apply_compile``), where eager code between two
    compiled regions ran it on its own."""

    def __init__(
        self,
        config: GPTConfig,
        *,
        pp_rank: int = 0,
        pp_size: int = 1,
        tp_group: CommGroup | None = None,
        seed: int = 0,
        rng_tracker: RNGTracker | None = None,
    ) -> None:
        super().__init__()
        group = tp_group if tp_group is not None else CommGroup.single("tp")
        config.check_tensor_parallel(group.size)
        self.config, self.tp_group = config, group
        self.pp_rank, self.pp_size = pp_rank, pp_size
        self.layer_indices = stage_layers(config.num_layers, pp_size, pp_rank)
        self.embedding = self.output_word_embeddings = self.final_layernorm = None
        #: whether the final layer norm runs in :meth:`logits` instead of :meth:`forward` (see the class docstring)
        self.norm_in_loss = False
        if self.is_first:
            with _seeded(seed):
                self.embedding = Embedding(config, group=group)
        layers = []
        for index in self.layer_indices:
            with _seeded(seed + 1 + index):
                layers.append(TransformerLayer(config, group=group, causal=True, pre_norm=True, rng_tracker=rng_tracker))
        self.layers = nn.ModuleList(layers)
        if self.is_last:
            self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
            if not self.is_first:  # same seed, same draws: an exact copy of the first stage's word embedding
                with _seeded(seed):
                    self.output_word_embeddings = VocabParallelEmbedding(
                        config.padded_vocab_size(group.size), config.hidden_size, group=group,
                        vocab_size=config.vocab_size, init_method=normal_init(config.init_std),
                    )

    @property
    def is_first(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def tied_embedding(self) -> VocabParallelEmbedding | None:
        """This stage's copy of the word embedding that the output layer uses (None on middle stages)."""
        if self.is_first:
            return self.embedding.word_embeddings
        return self.output_word_embeddings

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            x = self.embedding(x)  # [b, s] ids -> [b, s, h]
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x) if self.is_last and not self.norm_in_loss else x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[b, s, h] (:meth:`forward`'s output) -> this tp rank's logits shard [b, s, V_padded / tp] (last stage
        only)."""
        if not self.is_last:
            raise RuntimeError(f"stage {self.pp_rank} of {self.pp_size} has no output layer; only the last stage")
        if self.norm_in_loss:
            hidden = self.final_layernorm(hidden)
        return parallel_lm_logits(hidden, self.tied_embedding())

    def loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy [b, s], computed on the vocabulary shards."""
        return vocab_parallel_cross_entropy(self.logits(hidden), labels, self.tp_group)

    def load_consolidated(self, full: Mapping[str, torch.Tensor]) -> None:
        """Load this stage's (tp-sharded) slice of a consolidated GPT state dict (``ReferenceGPT`` names)."""
        self.load_state_dict(stage_state_dict(full, self.config, pp_rank=self.pp_rank, pp_size=self.pp_size,
                                              tp_rank=self.tp_group.rank, tp_size=self.tp_group.size))


def stage_state_dict(
    full: Mapping[str, torch.Tensor], config: GPTConfig, *, pp_rank: int, pp_size: int, tp_rank: int = 0,
    tp_size: int = 1,
) -> dict[str, torch.Tensor]:
    """The state dict of :class:`GPTStage` ``(pp_rank, tp_rank)``: global layer indices renumbered locally, the
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
