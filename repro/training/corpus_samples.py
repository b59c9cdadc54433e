"""Training samples cut from a flat token stream: contiguous windows, reshuffled every epoch (Megatron's GPTDataset).

The stream of ``T`` tokens holds ``n = (T - 1) // s`` non-overlapping windows of ``s`` inputs; window ``w`` reads
``tokens[w s : w s + s + 1]`` (one extra token, so the labels are the inputs shifted by one). Documents are already
joined by end-of-document tokens, so a window may span two documents, as in Megatron-LM.

Sample ``i`` belongs to epoch ``e = i // n`` and is window ``perm_e[i % n]``, where ``perm_e`` is a permutation of
``range(n)`` determined by ``(seed, e)`` alone; epoch 0 is shuffled too. So ``sample(i)`` depends only on ``i``, the
seed, ``s`` and the tokens, never on how many steps a run takes or where it resumed.

The permutation sorts SplitMix64 hashes (Steele, Lea and Flood 2014) of the window numbers rather than drawing from a
library random generator, whose streams may change between numpy or torch versions; the order is arithmetic.
"""

from __future__ import annotations

import numpy as np
import torch

_U64 = np.uint64


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's output function: a bijection of uint64 that spreads every input bit over every output bit."""
    values = values + _U64(0x9E3779B97F4A7C15)  # numpy arrays wrap around on uint64 overflow, as intended
    values = (values ^ (values >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> _U64(27))) * _U64(0x94D049BB133111EB)
    return values ^ (values >> _U64(31))


def epoch_permutation(length: int, *, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(length)`` (int64) fixed by ``(seed, epoch)``: windows sorted by a keyed hash.

    The keys are distinct (a bijection applied to distinct values), so the sort has no ties to break.
    """
    for name, value in (("length", length), ("seed", seed), ("epoch", epoch)):
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name}={value!r} must be a non-negative integer")
    key = _splitmix64(_splitmix64(np.array([seed], dtype=_U64)) ^ np.array([epoch], dtype=_U64))
    return np.argsort(_splitmix64(np.arange(length, dtype=_U64) ^ key), kind="stable")


class CorpusSamples:
    """``len()`` windows of ``seq_len + 1`` tokens; ``sample(i)`` for any ``i >= 0`` (epochs wrap around).

    ``tokens`` is any 1-D integer array (a read-only memmap of a corpus .bin); nothing is copied until a sample is read.
    ``vocab_size`` (the tokenizer's) is carried for the trainer, as the synthetic source carries its own.
    """

    def __init__(self, tokens: np.ndarray, *, seq_len: int, seed: int = 0, vocab_size: int | None = None,
                 name: str = "tokens") -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len={seq_len!r} must be a positive integer")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative integer")
        if tokens.ndim != 1:
            raise ValueError(f"{name}: tokens must be a 1-D array, got shape {tokens.shape}")
        if (tokens.shape[0] - 1) // seq_len < 1:
            raise ValueError(f"{name} holds {tokens.shape[0]} tokens, fewer than seq_len + 1 = {seq_len + 1}: "
                             "not one sample; use a shorter seq_len or a larger corpus")
        self.tokens, self.seq_len, self.seed, self.vocab_size, self.name = tokens, seq_len, seed, vocab_size, name
        self._length = (tokens.shape[0] - 1) // seq_len
        self._permutations: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self._length

    def permutation(self, epoch: int) -> np.ndarray:
        """Window order of ``epoch``; the two most recent epochs are kept (a batch may straddle an epoch end)."""
        if epoch not in self._permutations:
            if len(self._permutations) >= 2:
                self._permutations.pop(min(self._permutations))
            self._permutations[epoch] = epoch_permutation(self._length, seed=self.seed, epoch=epoch)
        return self._permutations[epoch]

    def windows(self, indices: np.ndarray) -> np.ndarray:
        """The window number of each sample index (int64 array of indices >= 0)."""
        if indices.size and int(indices.min()) < 0:
            raise IndexError(f"sample index {int(indices.min())} is negative; indices start at 0")
        epochs, positions = np.divmod(indices, self._length)
        out = np.empty_like(indices)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            out[chosen] = self.permutation(int(epoch))[positions[chosen]]
        return out

    def sample(self, index: int) -> torch.Tensor:
        """Tokens ``[seq_len + 1]`` (int64) of sample ``index``: inputs are ``[:-1]``, labels ``[1:]``."""
        return self.batch(index, 1)[0]

    def batch(self, start: int, count: int) -> torch.Tensor:
        """Samples ``start .. start + count - 1`` stacked: ``[count, seq_len + 1]`` int64."""
        if not isinstance(start, (int, np.integer)) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"batch(start={start!r}, count={count!r}) needs integers with count >= 0")
        windows = self.windows(np.arange(start, start + count, dtype=np.int64))
        positions = windows[:, None] * self.seq_len + np.arange(self.seq_len + 1)  # [count, seq_len + 1]
        return torch.from_numpy(np.asarray(self.tokens[positions], dtype=np.int64))

    def __repr__(self) -> str:
        return f"CorpusSamples({self.name!r}, seq_len={self.seq_len}, seed={self.seed}, len={self._length})"
