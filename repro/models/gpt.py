"""GPT-2 as Megatron-LM trains it (paper sec. 4 and Fig. 2): pre-LN transformer, learned absolute positions,
tied input/output embeddings, causal self-attention. The one GPT of the suite: the plain 1-GPU baseline, every
pipeline stage of the trainer and the ZeRO-partitioned model are this module with steps applied to it.

Built plain, on the meta device (no storage, no random numbers), then given its steps, then materialized
(torchtitan's order): ``GPTModel(config)`` is the model with no step applied; ``GPTModel(config, tp_group=...)``
applies :func:`~repro.models.tensor_parallel_plan.apply_tensor_parallel`; the trainer applies its steps one by one
(:mod:`repro.training.parallelize`). :meth:`GPTModel.init_weights` draws the weights of the blocks the model holds,
in the order of :meth:`GPTModel.blocks`, which is the order an ordinary constructor would draw them in.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.config import GPTConfig
from repro.models.embedding import Embedding
from repro.models.output import parallel_lm_logits
from repro.models.tensor_parallel_plan import apply_tensor_parallel
from repro.models.transformer import TransformerLayer
from repro.tensor_parallel import (
    RNGTracker, VocabParallelEmbedding, gather_from_tensor_parallel, vocab_parallel_cross_entropy,
)


@contextlib.contextmanager
def seeded(seed: int):
    """Draw from a fixed seed without disturbing the caller's (CPU) generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class GPTModel(nn.Module):
    """``forward(input_ids [b, s]) -> logits [b, s, V_padded / tp]`` (this rank's vocabulary shard).

    A pipeline stage (:func:`repro.training.parallelize.apply_pipeline`) holds some of the parts: ``embedding`` on
    the first stage, ``layers`` ``layer_indices`` of the model's, ``final_layernorm`` and the output layer on the last,
    where, apart from the first, the output layer multiplies by a copy of the word embedding of its own
    (``output_word_embeddings``). A stage's computation is :meth:`hidden_states` then, on the last, :meth:`output_loss`.
    With ``norm_in_loss`` set, the final layer norm runs in :meth:`logits` instead of :meth:`hidden_states`, so that a
    compiled loss region holds it with the output layer and the cross-entropy (the trainer's ``apply_compile``).
    """

    def __init__(
        self, config: GPTConfig, *, tp_group: CommGroup | None = None, rng_tracker: RNGTracker | None = None
    ) -> None:
        super().__init__()
        self.config, self.tp_group = config, CommGroup.single("tp")
        # where the caller builds (a torch.device context, or the CPU): a new tensor's device, as torch < 2.5's
        # get_default_device ignores the context
        device = torch.empty(0).device
        with torch.device("meta"):
            self.embedding = Embedding(config, group=self.tp_group)
            self.layers = nn.ModuleList(TransformerLayer(config, group=self.tp_group, causal=True, pre_norm=True)
                                        for _ in range(config.num_layers))
            self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        #: the last pipeline stage's copy of the word embedding (None unless the model is such a stage)
        self.register_module("output_word_embeddings", None)
        #: global indices of the layers this model holds (all of them, until a pipeline step cuts it)
        self.layer_indices = range(config.num_layers)
        #: whether the final layer norm runs in :meth:`logits` (see the class docstring)
        self.norm_in_loss = False
        if tp_group is not None or rng_tracker is not None:
            apply_tensor_parallel(self, tp_group if tp_group is not None else self.tp_group, rng_tracker)
        self.to_empty(device=device)
        self.init_weights()

    def blocks(self) -> list[tuple[str, nn.Module]]:
        """The parts this model holds, by name, in the order an ordinary constructor builds (and draws) them."""
        parts = [("embedding", self.embedding), *((f"layers.{i}", layer) for i, layer in enumerate(self.layers)),
                 ("final_layernorm", self.final_layernorm), ("output_word_embeddings", self.output_word_embeddings)]
        return [(name, part) for name, part in parts if part is not None]

    def block_seed(self, name: str, seed: int) -> int:
        """The seed block ``name`` draws from under :meth:`init_weights` ``(seed)``: the word embedding (and its
        last-stage copy) from ``seed``, layer ``l`` of the model from ``seed + 1 + l``."""
        if name.startswith("layers."):
            return seed + 1 + self.layer_indices[int(name.split(".")[1])]
        return seed

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Draw every weight this model holds. ``seed=None``: block after block from the default generator, as the
        constructor of an ordinary module would; a seed: each block from a seed of its own (:meth:`block_seed`), so
        that a block's weights do not depend on which others this rank holds (pipeline parallelism) and the model
        is the same whatever the layout. On the meta device nothing is drawn."""
        for name, block in self.blocks():
            with contextlib.nullcontext() if seed is None else seeded(self.block_seed(name, seed)):
                block.reset_parameters()

    @property
    def is_first(self) -> bool:
        """Whether this model takes token ids (holds the embedding)."""
        return self.embedding is not None

    @property
    def is_last(self) -> bool:
        """Whether this model ends in the output layer (holds the final layer norm)."""
        return self.final_layernorm is not None

    @property
    def padded_vocab_size(self) -> int:
        return self.config.padded_vocab_size(self.tp_group.size)

    def tied_embedding(self) -> VocabParallelEmbedding | None:
        """The word embedding the output layer multiplies by here: the embedding's, or the last stage's copy (None
        on a middle pipeline stage)."""
        if self.embedding is not None:
            return self.embedding.word_embeddings
        return self.output_word_embeddings

    def hidden_states(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids [b, s] (or the previous stage's hidden [b, s, h]) -> [b, s, h], final-layer-normed where the
        model ends (unless ``norm_in_loss``)."""
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x) if self.final_layernorm is not None and not self.norm_in_loss else x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """:meth:`hidden_states`' output [b, s, h] -> this tp rank's logits shard [b, s, V_padded / tp]."""
        if self.final_layernorm is None:
            raise RuntimeError("this model has no output layer: only the last pipeline stage holds one")
        if self.norm_in_loss:
            hidden = self.final_layernorm(hidden)
        return parallel_lm_logits(hidden, self.tied_embedding())

    def output_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy [b, s] of :meth:`hidden_states`' output, on the vocabulary shards (three
        all-reduces, no gather): the last pipeline stage's loss."""
        return vocab_parallel_cross_entropy(self.logits(hidden), labels, self.tp_group)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.logits(self.hidden_states(input_ids))

    def zero_external_parameters(self) -> dict[nn.Module, list[nn.Parameter]]:
        """For ZeRO stage 3 (repro/zero/stage3.py): the output layer, tied to the word embedding, is used by the
        model's own forward, outside the embedding that owns it."""
        tied = self.tied_embedding()
        return {self: [tied.weight]} if tied is not None else {}

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy [b, s] computed on the vocabulary shards (three all-reduces, no gather). Through
        the module's call, so that ZeRO-3's hooks gather the tied output weight around it."""
        return vocab_parallel_cross_entropy(self(input_ids), labels, self.tp_group)

    def full_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Gathered logits over the real vocabulary [b, s, vocab_size] (for evaluation)."""
        logits = gather_from_tensor_parallel(self(input_ids), self.tp_group)
        return logits[..., : self.config.vocab_size]
