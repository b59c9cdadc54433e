"""Vocabulary-parallel embedding (Megatron-LM sec. 3, "input embedding").

The embedding matrix ``E [V, h]`` is split along the vocabulary: rank i owns rows ``[i V/p, (i+1) V/p)``. Each rank
looks up the tokens it owns, writes zeros for the others, and ``g`` (all-reduce) sums the partial lookups.
The vocabulary is padded so that it splits evenly and each shard is GEMM-friendly: to a multiple of
``make_divisible_by x tp`` (128 x tp in Megatron; 50,257 -> 51,200 at tp=8, sec. 5.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro.dist.comm import CommGroup
from repro.tensor_parallel.layers import InitMethod, group_or_single, divide, normal_init
from repro.tensor_parallel.mappings import reduce_from_tensor_parallel


def vocab_range(padded_vocab_size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """[start, end) of the vocabulary rows owned by ``tp_rank``."""
    per_rank = divide(padded_vocab_size, tp_size, "padded vocabulary size")
    return tp_rank * per_rank, (tp_rank + 1) * per_rank


class VocabParallelEmbedding(nn.Module):
    """Embedding whose rows (the padded vocabulary) are split across the tensor-parallel group.

    ``num_embeddings`` is the padded vocabulary; rows ``>= vocab_size`` (the padding) start at zero.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        group: CommGroup | None = None,
        vocab_size: int | None = None,
        init_method: InitMethod = normal_init(0.02),
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.group = group_or_single(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_size = vocab_size if vocab_size is not None else num_embeddings
        self.start, self.end = vocab_range(num_embeddings, self.group.rank, self.group.size)
        if self.vocab_size > num_embeddings:
            raise ValueError(f"vocab_size={self.vocab_size} exceeds the padded vocabulary {num_embeddings}")
        self.init_method = init_method
        self.weight = nn.Parameter(torch.empty(self.end - self.start, embedding_dim,
                                               dtype=dtype or torch.get_default_dtype()))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """This rank's rows of the full table, drawn in fp32 on the weight's device. Only the real rows are drawn,
        so the weights do not depend on how much padding tp asks for; the padding rows are zero."""
        full = torch.zeros(self.num_embeddings, self.embedding_dim, dtype=torch.float32, device=self.weight.device)
        self.init_method(full[: self.vocab_size])
        self.weight.copy_(full[self.start : self.end])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.start) | (input_ids >= self.end)
        local_ids = (input_ids - self.start).masked_fill(outside, 0)
        partial = F.embedding(local_ids, self.weight)  # [..., h]
        partial = partial.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_parallel(partial, self.group)  # g: sum of the partial lookups
