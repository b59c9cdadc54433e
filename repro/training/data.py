"""Token batches for the small training runs: a learnable synthetic stream, and how a batch is cut up.

A global batch ``[B, s + 1]`` (inputs are the first ``s`` tokens, labels the last ``s``) is split first across the
data-parallel ranks (rank ``d`` takes rows ``[d B/dp, (d+1) B/dp)``) and then into ``m`` micro-batches of ``B / (dp
m)`` rows each, the layout of Megatron / MT-NLG (global batch = micro-batch x m x dp, MT-NLG sec. 2.4: 1920).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from repro.cliargs import SEED_LIMIT


class SyntheticSamples:
    """A learnable synthetic corpus indexed by global sample position: ``sample(i)`` is ``[seq_len + 1]`` tokens.

    Each token is followed by ``successor[token]`` (a fixed random permutation of the vocabulary drawn from
    ``seed``) with probability ``1 - noise``, by a uniform token otherwise, so a model can learn it and the loss falls
    from ``ln V`` towards the noise floor. Sample ``i`` is drawn from a counter-based generator (Philox keyed by
    ``(seed, i)``), so it depends on nothing but ``(i, seed, vocab_size, seq_len, noise)``: not on the number of
    steps, the data-parallel size or which rank asks. Step ``k`` of a run with a global batch of ``B`` sequences
    reads samples ``[k B, (k + 1) B)``, as Megatron's samplers read by consumed samples, so a run split by a
    checkpoint sees the same batches as a straight one. The same protocol (``sample``, ``batch``, ``__len__``) is
    served by the tokenized corpus of :mod:`repro.training.corpus`.
    """

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int = 0, noise: float = 0.1) -> None:
        for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise={noise} must lie in [0, 1]")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
            # Philox's key and torch's generator take 64 bits: a negative or larger seed would wrap onto another
            # seed's stream (-1 and 2**64 - 1 drew the same data)
            raise ValueError(f"seed={seed!r} must be an integer in [0, 2**63)")
        self.vocab_size, self.seq_len, self.seed, self.noise = vocab_size, seq_len, seed, noise
        generator = torch.Generator().manual_seed(seed)
        self.successor = torch.randperm(vocab_size, generator=generator).numpy()

    def __len__(self) -> int:
        return sys.maxsize  # unbounded: every index is a sample

    def batch(self, start: int, count: int) -> torch.Tensor:
        """Samples ``[start, start + count)`` as ``[count, seq_len + 1]`` int64 tokens."""
        if start < 0 or count < 1:
            raise ValueError(f"batch(start={start}, count={count}) needs start >= 0 and count >= 1")
        seq = self.seq_len
        first = np.empty(count, dtype=np.int64)
        random = np.empty((count, seq), dtype=np.int64)
        keep = np.empty((count, seq), dtype=bool)
        for row in range(count):
            rng = np.random.Generator(np.random.Philox(key=[self.seed, start + row]))
            first[row] = rng.integers(self.vocab_size)
            random[row] = rng.integers(self.vocab_size, size=seq)
            keep[row] = rng.random(seq) >= self.noise
        tokens = np.empty((count, seq + 1), dtype=np.int64)
        tokens[:, 0] = first
        for t in range(1, seq + 1):
            tokens[:, t] = np.where(keep[:, t - 1], self.successor[tokens[:, t - 1]], random[:, t - 1])
        return torch.from_numpy(tokens)

    def sample(self, index: int) -> torch.Tensor:
        """Sample ``index`` as ``[seq_len + 1]`` int64 tokens."""
        return self.batch(index, 1)[0]


def synthetic_tokens(
    *, vocab_size: int, seq_len: int, batch_size: int, steps: int, seed: int = 0, noise: float = 0.1
) -> torch.Tensor:
    """``[steps, batch, seq_len + 1]`` int64 tokens: step ``k`` holds samples ``[k batch, (k + 1) batch)`` of
    :class:`SyntheticSamples` (so the first steps do not depend on ``steps``); the same seed gives the same stream on
    every rank."""
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    source = SyntheticSamples(vocab_size=vocab_size, seq_len=seq_len, seed=seed, noise=noise)
    return source.batch(0, steps * batch_size).view(steps, batch_size, seq_len + 1)


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
