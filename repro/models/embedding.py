"""Input embeddings shared by GPT and BERT: vocabulary-parallel word embedding + replicated positions."""

from __future__ import annotations

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.config import TransformerConfig
from repro.tensor_parallel import VocabParallelEmbedding
from repro.tensor_parallel.layers import normal_init


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Refuse ids outside ``[0, vocab_size)`` in one line. On a GPU tensor, reading its min and max blocks the host
    until the GPU has caught up: a training loop checks the host batch before it moves and turns the embedding's
    own check off (:attr:`Embedding.check_ids`), as the trainer does."""
    if input_ids.numel() == 0:
        return
    low, high = torch.aminmax(input_ids)
    if int(low) < 0 or int(high) >= vocab_size:
        raise ValueError(f"token ids must lie in [0, vocab_size={vocab_size}); got [{int(low)}, {int(high)}]")


def embedding_table(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """``nn.Embedding(num_embeddings, embedding_dim)`` with its N(0, 1) draw, except on the meta device (a model
    built there, :func:`repro.training.parallelize.materialize`), where there is nothing to draw: newer torch runs
    ``normal_`` on meta tensors through a Python reference that imports torch._dynamo on its first call (about 2 s
    of CPU in every fresh process that builds a model). Elsewhere the draw is the constructor's own, from the same
    generator, so a seed gives the weights it always gave."""
    table = nn.Embedding(num_embeddings, embedding_dim, _weight=torch.empty(num_embeddings, embedding_dim))
    if not table.weight.is_meta:
        table.reset_parameters()
    return table


class Embedding(nn.Module):
    """word (vocab-parallel) + position (+ token type) embeddings, then dropout (replicated region)."""

    def __init__(self, config: TransformerConfig, *, group: CommGroup, num_tokentypes: int = 0) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.word_embeddings = VocabParallelEmbedding(
            config.padded_vocab_size(group.size), config.hidden_size, group=group,
            vocab_size=config.vocab_size, init_method=normal_init(config.init_std),
        )
        self.position_embeddings = embedding_table(config.max_position_embeddings, config.hidden_size)
        self.init_method = normal_init(config.init_std)
        self.init_method(self.position_embeddings.weight.data)
        self.tokentype_embeddings = None
        if num_tokentypes > 0:
            self.tokentype_embeddings = embedding_table(num_tokentypes, config.hidden_size)
            self.init_method(self.tokentype_embeddings.weight.data)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.max_positions = config.max_position_embeddings
        #: check the ids of every forward (a host sync on a GPU); off where the caller checked them on the host
        self.check_ids = True

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Draw every table again, in the order the constructor draws them: a model built on the meta device and
        materialized gets the numbers an ordinary build gets from the same generator. Each ``nn.Embedding`` draws
        N(0, 1) when it is made and is then drawn again with the GPT-2 init; the first draw is kept, so that a seed
        gives the weights it always gave."""
        self.word_embeddings.reset_parameters()
        for table in (self.position_embeddings, self.tokentype_embeddings):
            if table is not None and not table.weight.is_meta:  # meta: nothing to draw (see embedding_table)
                # drawn in fp32, as the word embeddings: a 16-bit table holds the fp32 build's values
                full = torch.empty(table.weight.shape, dtype=torch.float32, device=table.weight.device)
                nn.init.normal_(full)  # nn.Embedding's own first draw
                self.init_method(full)
                table.weight.copy_(full)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        seq = input_ids.shape[1]
        if seq > self.max_positions:
            raise ValueError(f"sequence length {seq} exceeds max_position_embeddings={self.max_positions}")
        if self.check_ids:
            check_token_ids(input_ids, self.vocab_size)
        positions = torch.arange(seq, device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
        if self.tokentype_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.tokentype_embeddings(token_type_ids)
        return self.dropout(x)
