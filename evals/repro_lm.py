"""repro's GPT as a :class:`evals.scoring.CausalLM`: hidden states once, the output head only where scored.

At tensor-parallel size p the tied output layer yields this rank's vocabulary shard ``[N, V_padded/p]``; the
shards are all-gathered (Megatron's ``parallel_output=False`` path used for accuracy) and the padding columns are
dropped, so every rank sees the same ``[N, vocab_size]`` logits and computes the same numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evals.scoring import token_scores
from repro.models import GPTModel
from repro.tensor_parallel import gather_from_tensor_parallel


class ReproCausalLM:
    """Wraps a :class:`repro.models.GPTModel` (any tp size; call on every rank of its tp group)."""

    def __init__(self, model: GPTModel, *, max_length: int | None = None) -> None:
        self.model = model.eval()
        self.vocab_size = model.config.vocab_size
        positions = model.config.max_position_embeddings
        if max_length is not None and not 1 <= max_length <= positions:
            raise ValueError(f"max_length={max_length} must be in [1, max_position_embeddings={positions}]")
        self.max_length = max_length or positions

    def _selected_hidden(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        hidden = self.model.hidden_states(input_ids.to(device))  # [B, S, h]
        return hidden[keep.to(device)]  # [N, h]: only the scored positions meet the output head

    def _head(self, selected: torch.Tensor) -> torch.Tensor:
        """[n, h] -> [n, vocab_size]: the tied output layer (Megatron sec. 3) on this rank's vocabulary rows,
        gathered over tp; padding columns are sliced off, so they need no masking."""
        shard = F.linear(selected, self.model.embedding.word_embeddings.weight)  # [n, V_padded / tp]
        full = gather_from_tensor_parallel(shard, self.model.tp_group)  # [n, V_padded]
        return full[:, : self.vocab_size]

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self._head(self._selected_hidden(input_ids, keep)).cpu()

    @torch.no_grad()
    def score_tokens(self, input_ids: torch.Tensor, keep: torch.Tensor, target: torch.Tensor,
                     chunk_rows: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p(target), greedy hit) per scored position, the output head applied ``chunk_rows`` rows at a
        time so memory stays at chunk_rows x V logits however many positions a batch scores."""
        selected = self._selected_hidden(input_ids, keep)
        logprobs, greedy = [], []
        for begin in range(0, selected.shape[0], chunk_rows):
            lp, hit = token_scores(self._head(selected[begin: begin + chunk_rows]),
                                   target[begin: begin + chunk_rows])
            logprobs.append(lp)
            greedy.append(hit)
        return torch.cat(logprobs), torch.cat(greedy)

    @torch.no_grad()
    def full_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, S, vocab_size] logits of every position (for parity checks)."""
        keep = torch.ones(input_ids.shape, dtype=torch.bool)
        return self.logits(input_ids, keep).view(*input_ids.shape, self.vocab_size)
