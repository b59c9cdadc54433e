"""Shared fixtures for the evaluation tests: tokenizers and tiny models (``data_dir`` is in tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from evals.repro_lm import ReproCausalLM
from evals_test_models import tiny_gpt


@pytest.fixture(scope="session")
def gpt2_tok(data_dir):
    from repro.text.tokenization import gpt2_tokenizer

    return gpt2_tokenizer(data_dir)


@pytest.fixture(scope="session")
def bert_tok(data_dir):
    from repro.text.tokenization import bert_tokenizer

    return bert_tokenizer(data_dir)


@pytest.fixture(scope="session")
def tiny_lm():
    return ReproCausalLM(tiny_gpt())


@pytest.fixture(autouse=True)
def one_thread():
    """These tests use tiny models; one intra-op thread avoids oversubscription on a shared 2-core machine
    (6x faster here under load). The previous setting is restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
