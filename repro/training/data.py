"""Token batches for the small training runs: a learnable synthetic stream, and how a batch is cut up.

A global batch ``[B, s + 1]`` (inputs are the first ``s`` tokens, labels the last ``s``) is split first across the
data-parallel ranks (rank ``d`` takes rows ``[d B/dp, (d+1) B/dp)``) and then into ``m`` micro-batches of ``B / (dp
m)`` rows each, the layout of Megatron / MT-NLG (global batch = micro-batch x m x dp, MT-NLG sec. 2.4: 1920).
"""

from __future__ import annotations

import torch


def synthetic_tokens(
    *, vocab_size: int, seq_len: int, batch_size: int, steps: int, seed: int = 0, noise: float = 0.1
) -> torch.Tensor:
    """``[steps, batch, seq_len + 1]`` int64 tokens from a fixed random successor map: each token is followed by
    ``successor[token]`` with probability ``1 - noise``, by a uniform token otherwise. A model can learn it, so the
    loss falls from ``ln V`` towards the noise floor; the same seed gives the same stream on every rank."""
    for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len), ("batch_size", batch_size),
                        ("steps", steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise={noise} must lie in [0, 1]")
    generator = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab_size, generator=generator)
    tokens = torch.empty(steps, batch_size, seq_len + 1, dtype=torch.long)
    tokens[..., 0] = torch.randint(vocab_size, (steps, batch_size), generator=generator)
    for t in range(1, seq_len + 1):
        follow = successor[tokens[..., t - 1]]
        random = torch.randint(vocab_size, (steps, batch_size), generator=generator)
        keep = torch.rand(steps, batch_size, generator=generator) >= noise
        tokens[..., t] = torch.where(keep, follow, random)
    return tokens


def local_micro_batches(
    batch: torch.Tensor, *, dp_rank: int, dp_size: int, num_micro_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This data-parallel rank's ``(input_ids, labels)`` micro-batches of a global batch ``[B, s + 1]``."""
    if batch.dim() != 2 or batch.shape[1] < 2:
        raise ValueError(f"a batch must be [batch, seq + 1] tokens with seq >= 1, got shape {tuple(batch.shape)}")
    rows = batch.shape[0]
    if rows % (dp_size * num_micro_batches) != 0:
        raise ValueError(
            f"global batch {rows} is not divisible by dp x micro-batches = {dp_size} x {num_micro_batches}: "
            "every rank and micro-batch needs the same number of sequences"
        )
    per_rank = rows // dp_size
    mine = batch[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    return [(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()) for chunk in mine.chunk(num_micro_batches)]
