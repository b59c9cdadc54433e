"""Tiny GPT models for the evaluation tests (imported by the tests of this folder, which pytest puts on sys.path)."""

from __future__ import annotations

import torch

from repro.models import GPTConfig, GPTModel


def tiny_gpt_config(max_positions: int = 64) -> GPTConfig:
    return GPTConfig(vocab_size=50257, hidden_size=16, num_layers=2, num_attention_heads=2,
                     max_position_embeddings=max_positions, hidden_dropout=0.0, attention_dropout=0.0)


# " story", " book", " together": last words of LAMBADA passages 11, 18 and 15.
BOOSTED_TOKENS = (1621, 1492, 1978)


def sharpen(word_embeddings: torch.Tensor) -> None:
    """Make a random GPT's predictions far from uniform: scale the (tied) embeddings, and make a few tokens'
    embeddings much longer, so they win the argmax wherever the hidden state points their way and greedy decoding
    sometimes hits a LAMBADA word (accuracy strictly between 0 and 1)."""
    with torch.no_grad():
        word_embeddings.mul_(40.0)
        word_embeddings[list(BOOSTED_TOKENS)] *= 8.0


def tiny_gpt(seed: int = 2, max_positions: int = 64, dtype=torch.float64) -> GPTModel:
    """A random tiny GPT with the GPT-2 vocabulary and sharpened predictions (see :func:`sharpen`)."""
    torch.manual_seed(seed)
    model = GPTModel(tiny_gpt_config(max_positions))
    sharpen(model.embedding.word_embeddings.weight)
    return model.to(dtype).eval()
