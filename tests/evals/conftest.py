"""Shared fixtures for the evaluation tests: the verified data directory, tokenizers and tiny models."""

from __future__ import annotations

import pytest
import torch

from evals.data_files import DataError, resolve_data_dir
from evals.repro_lm import ReproCausalLM
from repro.models import GPTConfig, GPTModel


@pytest.fixture(scope="session")
def data_dir():
    try:
        return resolve_data_dir()
    except DataError as err:  # the evaluation data is not part of the repository
        pytest.skip(f"evaluation data not available: {err}")


@pytest.fixture(scope="session")
def gpt2_tok(data_dir):
    from evals.tokenization import gpt2_tokenizer

    return gpt2_tokenizer(data_dir)


@pytest.fixture(scope="session")
def bert_tok(data_dir):
    from evals.tokenization import bert_tokenizer

    return bert_tokenizer(data_dir)


def tiny_gpt_config(max_positions: int = 64) -> GPTConfig:
    return GPTConfig(vocab_size=50257, hidden_size=16, num_layers=2, num_attention_heads=2,
                     max_position_embeddings=max_positions, hidden_dropout=0.0, attention_dropout=0.0)


def tiny_gpt(seed: int = 0, max_positions: int = 64, dtype=torch.float64) -> GPTModel:
    """A random tiny GPT with the GPT-2 vocabulary. Embeddings are scaled up so its predictions are far from
    uniform (greedy hits happen and logprobs vary), which makes parity checks meaningful."""
    torch.manual_seed(seed)
    model = GPTModel(tiny_gpt_config(max_positions))
    with torch.no_grad():
        model.embedding.word_embeddings.weight.mul_(40.0)
    return model.to(dtype).eval()


@pytest.fixture(scope="session")
def tiny_lm():
    return ReproCausalLM(tiny_gpt())
