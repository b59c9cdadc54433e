"""GPT-2 as Megatron-LM trains it (paper sec. 4 and Fig. 2): pre-LN transformer, learned absolute positions,
tied input/output embeddings, causal self-attention, every linear layer tensor-parallel."""

from __future__ import annotations

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.config import GPTConfig
from repro.models.embedding import Embedding
from repro.models.output import parallel_lm_logits
from repro.models.transformer import TransformerLayer
from repro.tensor_parallel import RNGTracker, gather_from_tensor_parallel, vocab_parallel_cross_entropy


class GPTModel(nn.Module):
    """``forward(input_ids [b, s]) -> logits [b, s, V_padded / tp]`` (this rank's vocabulary shard)."""

    def __init__(
        self, config: GPTConfig, *, tp_group: CommGroup | None = None, rng_tracker: RNGTracker | None = None
    ) -> None:
        super().__init__()
        group = tp_group if tp_group is not None else CommGroup.single("tp")
        config.check_tensor_parallel(group.size)
        self.config, self.tp_group = config, group
        self.embedding = Embedding(config, group=group)
        self.layers = nn.ModuleList(
            TransformerLayer(config, group=group, causal=True, pre_norm=True, rng_tracker=rng_tracker)
            for _ in range(config.num_layers)
        )
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)

    @property
    def padded_vocab_size(self) -> int:
        return self.config.padded_vocab_size(self.tp_group.size)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return parallel_lm_logits(self.hidden_states(input_ids), self.embedding.word_embeddings)

    def zero_external_parameters(self) -> dict[nn.Module, list[nn.Parameter]]:
        """For ZeRO stage 3 (repro/zero/stage3.py): the output layer, tied to the word embedding, is used by the
        model's own forward, outside the embedding that owns it."""
        return {self: [self.embedding.word_embeddings.weight]}

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy [b, s] computed on the vocabulary shards (three all-reduces, no gather)."""
        return vocab_parallel_cross_entropy(self(input_ids), labels, self.tp_group)

    def full_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Gathered logits over the real vocabulary [b, s, vocab_size] (for evaluation)."""
        logits = gather_from_tensor_parallel(self(input_ids), self.tp_group)
        return logits[..., : self.config.vocab_size]
