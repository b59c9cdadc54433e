"""The shared scorer: batching and padding change nothing, and a uniform model gives the analytic values."""

from __future__ import annotations

import math

import pytest
import torch

from evals import lambada, wikitext
from evals.loaders import load_lambada, load_wikitext
from evals.scoring import FunctionLM, score_continuations
from repro.text.wikitext_articles import split_articles


def test_batching_and_padding_do_not_change_scores(tiny_lm):
    generator = torch.Generator().manual_seed(0)
    requests = []
    for _ in range(13):
        n_ctx, n_cont = (int(x) for x in torch.randint(1, 30, (2,), generator=generator))
        tokens = torch.randint(0, 50257, (n_ctx + n_cont,), generator=generator).tolist()
        requests.append((tokens[:n_ctx], tokens[n_ctx:]))
    one = score_continuations(tiny_lm, requests, batch_size=1, progress=False)
    many = score_continuations(tiny_lm, requests, batch_size=5, pad_id=7, progress=False)
    for a, b in zip(one, many):
        assert a.num_tokens == b.num_tokens and a.is_greedy == b.is_greedy
        assert a.logprob == pytest.approx(b.logprob, rel=1e-12, abs=1e-12)


def test_scores_equal_direct_log_softmax(tiny_lm):
    context, continuation = [464, 3290, 318], [257, 1588, 13]
    score = score_continuations(tiny_lm, [(context, continuation)], progress=False)[0]
    ids = torch.tensor([context + continuation[:-1]])
    logprobs = torch.log_softmax(tiny_lm.full_logits(ids)[0], dim=-1)
    expected = sum(float(logprobs[len(context) - 1 + i, t]) for i, t in enumerate(continuation))
    assert score.logprob == pytest.approx(expected, rel=1e-12)
    greedy = all(int(logprobs[len(context) - 1 + i].argmax()) == t for i, t in enumerate(continuation))
    assert score.is_greedy == greedy


def test_truncation_and_bad_requests(tiny_lm):
    long_context = list(range(200))
    score = score_continuations(tiny_lm, [(long_context, [5, 6])], progress=False)[0]  # max_length 64: left-cut
    assert score.num_tokens == 2
    with pytest.raises(ValueError, match="max_length=64"):
        score_continuations(tiny_lm, [([1], list(range(65)))], progress=False)
    with pytest.raises(ValueError, match="at least one token"):
        score_continuations(tiny_lm, [([1], [])], progress=False)


class UniformLM:
    """Equal logits everywhere: log p = -log V for every token."""

    vocab_size = 50257

    def __init__(self, max_length: int = 128) -> None:
        self.max_length = max_length

    def logits(self, input_ids, keep):
        return torch.zeros(int(keep.sum()), self.vocab_size, dtype=torch.float64)


def uniform_lm(max_length: int = 128) -> UniformLM:
    return UniformLM(max_length)


def test_function_lm_adapts_full_logits():
    model = FunctionLM(lambda ids: torch.zeros(*ids.shape, 300), vocab_size=256, max_length=16)
    score = score_continuations(model, [([1, 2], [3])], progress=False)[0]
    assert score.logprob == pytest.approx(-math.log(256))
    with pytest.raises(ValueError, match="fewer than vocab_size=512"):
        FunctionLM(lambda ids: torch.zeros(*ids.shape, 300), vocab_size=512, max_length=16).logits(
            torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))


def test_uniform_model_wikitext_analytic(data_dir, gpt2_tok):
    text = load_wikitext("test", data_dir).records
    model = uniform_lm()
    prefix = 1200
    meg = wikitext.evaluate_megatron(model, gpt2_tok, text, wikitext.WindowConfig(seq_len=128, stride=32),
                                     max_tokens=prefix, batch_size=64, progress=False)
    log_v = math.log(50257)
    assert meg.token_perplexity == pytest.approx(50257, rel=1e-9)
    assert meg.adjusted_perplexity == pytest.approx(
        math.exp(log_v * (meg.num_tokenized - 1) / (meg.num_original - 1)), rel=1e-9)
    pages = split_articles(text)[:1]
    doc = wikitext.evaluate_documents(model, gpt2_tok, pages, batch_size=64, progress=False)
    words = sum(len(__import__("re").split(r"\s+", p)) for p in pages)
    nbytes = sum(len(p.encode()) for p in pages)
    assert doc.num_words == words
    assert doc.word_perplexity == pytest.approx(math.exp(doc.num_tokens * log_v / words), rel=1e-9)
    assert doc.bits_per_byte == pytest.approx(doc.num_tokens * math.log2(50257) / nbytes, rel=1e-9)


def test_uniform_model_lambada_analytic(data_dir, gpt2_tok):
    texts = load_lambada(data_dir).records[:200]
    results = lambada.evaluate_lambada(uniform_lm(max_length=256), gpt2_tok, texts, batch_size=50, progress=False)
    for definition, result in results.items():
        requests = lambada.build_requests(texts, gpt2_tok, definition)
        # argmax of equal logits is token 0 ("!"): correct only when every target token is 0
        expected_correct = sum(all(t == 0 for t in cont) for _, cont in requests)
        assert result.num_correct == expected_correct == 0
        mean_tokens = sum(len(cont) for _, cont in requests) / len(requests)
        assert result.perplexity == pytest.approx(50257 ** mean_tokens, rel=1e-9)
