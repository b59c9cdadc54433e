"""BERT built from the tensor-parallel layers (Megatron-LM sec. 5.3).

Megatron found that the original BERT's layer-norm placement (post-LN, Fig. 7a) makes training of models beyond
BERT-large unstable, and that moving the layer norms inside the residual branches (pre-LN, Fig. 7b, as in GPT-2)
lets 1.3B and 3.9B models train with monotonically falling loss. ``BertConfig.layernorm_placement`` selects either.
"original": LN on the embeddings, LN after each residual sum, no final LN.
"megatron": no LN on the embeddings, LN at the input of each branch, a final LN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.config import BertConfig
from repro.models.embedding import Embedding
from repro.models.output import parallel_lm_logits
from repro.models.tensor_parallel_plan import apply_tensor_parallel
from repro.models.transformer import TransformerLayer
from repro.tensor_parallel import RNGTracker, vocab_parallel_cross_entropy
from repro.tensor_parallel.layers import normal_init


def _linear(in_features: int, out_features: int, std: float) -> nn.Linear:
    layer = nn.Linear(in_features, out_features)
    layer.std = std
    _reset_linear(layer)
    return layer


@torch.no_grad()
def _reset_linear(layer: nn.Linear) -> None:
    """``nn.Linear``'s own initialisation, then BERT's N(0, std) weights and zero bias: the first draw is kept, so
    that a seed gives the weights it always gave."""
    layer.reset_parameters()
    normal_init(layer.std)(layer.weight)
    nn.init.zeros_(layer.bias)


class BertLMHead(nn.Module):
    """Masked-LM head: dense -> GeLU -> LN -> logits tied to the word embedding (+ a vocab-parallel bias)."""

    def __init__(self, config: BertConfig, *, group: CommGroup) -> None:
        super().__init__()
        self.dense = _linear(config.hidden_size, config.hidden_size, config.init_std)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size(group.size) // group.size))
        self.approximate = config.gelu_approximate

    @torch.no_grad()
    def reset_parameters(self) -> None:
        _reset_linear(self.dense)
        self.layernorm.reset_parameters()
        self.bias.zero_()

    def forward(self, sequence_output: torch.Tensor, word_embeddings: nn.Module) -> torch.Tensor:
        """This rank's vocabulary shard of the logits [b, s, V_padded / tp]; ``word_embeddings`` is the tied
        (vocab-parallel) input embedding. A module forward of its own, so that ZeRO stage 3's hooks gather the
        bias and the tied weight around it."""
        x = self.layernorm(F.gelu(self.dense(sequence_output), approximate=self.approximate))
        return parallel_lm_logits(x, word_embeddings, self.bias)


class BertModel(nn.Module):
    """``forward(input_ids, token_type_ids, attention_mask) -> (sequence_output [b, s, h], pooled [b, h])``."""

    def __init__(
        self, config: BertConfig, *, tp_group: CommGroup | None = None, rng_tracker: RNGTracker | None = None
    ) -> None:
        super().__init__()
        self.config, self.tp_group = config, CommGroup.single("tp")
        pre_norm = config.layernorm_placement == "megatron"
        h, eps = config.hidden_size, config.layernorm_epsilon
        device = torch.empty(0).device  # built plain on the meta device, then split and drawn (GPTModel's way)
        with torch.device("meta"):
            self.embedding = Embedding(config, group=self.tp_group, num_tokentypes=config.num_tokentypes)
            self.embedding_layernorm = None if pre_norm else nn.LayerNorm(h, eps=eps)
            self.layers = nn.ModuleList(TransformerLayer(config, group=self.tp_group, causal=False, pre_norm=pre_norm)
                                        for _ in range(config.num_layers))
            self.final_layernorm = nn.LayerNorm(h, eps=eps) if pre_norm else None
            self.pooler = _linear(h, h, config.init_std)
            self.lm_head = BertLMHead(config, group=self.tp_group)
            self.binary_head = _linear(h, 2, config.init_std)  # next-sentence / sentence-order prediction
        if tp_group is not None or rng_tracker is not None:
            apply_tensor_parallel(self, tp_group if tp_group is not None else self.tp_group, rng_tracker)
        self.to_empty(device=device)
        self.init_weights()

    def blocks(self) -> list[tuple[str, nn.Module]]:
        """GPT's blocks (the embedding with token types, the layers) and BERT's heads, in construction order."""
        parts = [("embedding", self.embedding), ("embedding_layernorm", self.embedding_layernorm),
                 *((f"layers.{i}", layer) for i, layer in enumerate(self.layers)),
                 ("final_layernorm", self.final_layernorm), ("pooler", self.pooler), ("lm_head", self.lm_head),
                 ("binary_head", self.binary_head)]
        return [(name, part) for name, part in parts if part is not None]

    @torch.no_grad()
    def init_weights(self) -> None:
        """Draw every weight, block after block from the default generator (:meth:`GPTModel.init_weights`)."""
        for _, block in self.blocks():
            if isinstance(block, nn.Linear):
                _reset_linear(block)
            else:
                block.reset_parameters()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embedding(input_ids, token_type_ids)
        if self.embedding_layernorm is not None:
            x = self.embedding_layernorm(x)
        for layer in self.layers:
            x = layer(x, attention_mask)
        if self.final_layernorm is not None:
            x = self.final_layernorm(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return x, pooled

    def lm_logits(self, sequence_output: torch.Tensor) -> torch.Tensor:
        """Masked-LM logits, this rank's vocabulary shard [b, s, V_padded / tp]."""
        return self.lm_head(sequence_output, self.embedding.word_embeddings)

    def zero_external_parameters(self) -> dict[nn.Module, list[nn.Parameter]]:
        """For ZeRO stage 3 (repro/zero/stage3.py): the masked-LM head uses the word embedding inside its forward."""
        return {self.lm_head: [self.embedding.word_embeddings.weight]}

    def mlm_loss(self, sequence_output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(self.lm_logits(sequence_output), labels, self.tp_group)
