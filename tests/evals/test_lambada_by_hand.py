"""LAMBADA's three definitions on two passages and a bigram model small enough to score by hand.

The last word of one passage is two sub-tokens (" hedge" + "hog"): the model gets its second right and its first
wrong. Strict (Megatron ``--strict-lambada``) needs every sub-token of the word, so it fails that passage; non-strict
predicts only the passage's last token, so it passes; lm-eval's split scores the same two sub-tokens as strict. The
expected accuracies and log-likelihoods below are written out from the model's table, not computed by the harness.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from evals.lambada import evaluate_lambada
from evals.scoring import FunctionLM
from repro.text.tokenization import TextTokenizer

#: reads no data through datasets or lm_eval: runs without them (tests/evals/conftest.py), not again in
#: test_evals_without_datasets.py
pytestmark = pytest.mark.datasets_free

VOCAB = ["<eod>", "the", " cat", " saw", " a", " hedge", "hog", " dog"]
ID = {piece: index for index, piece in enumerate(VOCAB)}
V = len(VOCAB)


class _LongestMatch:
    """A stand-in for a ``tokenizers`` backend: greedy longest match over :data:`VOCAB` (enough for these texts)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> SimpleNamespace:
        ids, at = [], 0
        while at < len(text):
            piece = max((p for p in VOCAB if text.startswith(p, at)), key=len)
            ids.append(ID[piece])
            at += len(piece)
        return SimpleNamespace(ids=ids)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return V


TOKENIZER = TextTokenizer(name="toy", backend=_LongestMatch(), eod_id=0)

#: the bigram model's logits: the row of the previous token; every entry not listed is 0
TABLE = torch.zeros(V, V)
TABLE[ID[" a"], ID[" dog"]] = 2.0  # after " a" the model expects " dog" ...
TABLE[ID[" a"], ID[" hedge"]] = 1.0  # ... and " hedge" less
TABLE[ID[" hedge"], ID["hog"]] = 3.0  # after " hedge", "hog"
MODEL = FunctionLM(lambda ids: TABLE[ids], vocab_size=V, max_length=16)
TEXTS = ["the cat saw a hedgehog", "the cat saw a dog"]


def test_strict_needs_every_sub_token_of_the_last_word():
    assert TOKENIZER.encode(" hedgehog") == [ID[" hedge"], ID["hog"]]  # the stand-in splits the word as intended
    results = evaluate_lambada(MODEL, TOKENIZER, TEXTS, batch_size=1, progress=False)
    log_z_a = math.log(math.exp(2) + math.exp(1) + (V - 2))  # normaliser of the row after " a"
    log_z_hedge = math.log(math.exp(3) + (V - 1))
    hedgehog = (1 - log_z_a) + (3 - log_z_hedge)  # log p(" hedge" | " a") + log p("hog" | " hedge")
    dog = 2 - log_z_a
    # strict and lm-eval: " hedge" is not the greedy choice after " a" (" dog" is): 1 of 2, two sub-tokens scored
    for definition in ("strict", "lm_eval"):
        result = results[definition]
        assert (result.num_correct, result.num_examples, result.num_target_tokens) == (1, 2, 3), definition
        assert result.correct == (False, True) and result.accuracy == 0.5
        assert result.logprobs == pytest.approx((hedgehog, dog), rel=1e-6)
        assert result.perplexity == pytest.approx(math.exp(-(hedgehog + dog) / 2), rel=1e-6)
    # non-strict: only the last token ("hog" after " hedge", the greedy choice; " dog" after " a")
    nonstrict = results["nonstrict"]
    assert (nonstrict.num_correct, nonstrict.num_target_tokens, nonstrict.correct) == (2, 2, (True, True))
    assert nonstrict.logprobs == pytest.approx((3 - log_z_hedge, dog), rel=1e-6)
