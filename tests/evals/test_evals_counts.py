"""Acceptance counts: WikiText-103 test T_o = 245,566 (Megatron's count), LAMBADA 5,153, RACE 87,866 / 4,887 / 4,934."""

from __future__ import annotations

from repro.text.detokenize import wikitext_detokenize
from evals.loaders import load_lambada, load_race, load_wikitext
from evals.race_data import questions_of
from evals.wikitext import count_original_tokens
from repro.text.wikitext_articles import split_articles


def test_wikitext_counts(data_dir, gpt2_tok):
    text = load_wikitext("test", data_dir).records
    assert count_original_tokens(text) == 245_566  # Megatron-LM paper App. E.1: T_o
    assert count_original_tokens(load_wikitext("valid", data_dir).records) == 217_642
    # GPT-2 BPE after the detokenizer; the paper prints T = 270,329 (one fewer; see README).
    assert len(gpt2_tok.encode(wikitext_detokenize(text))) == 270_330
    articles = split_articles(text)
    assert len(articles) == 60 and "".join(articles) == text


def test_lambada_count(data_dir):
    assert len(load_lambada(data_dir).records) == 5_153


def test_race_counts(data_dir):
    def questions(split, level):
        return len(questions_of(load_race(split, level, data_dir).records, level))

    assert questions("test", "middle") == 1_436
    assert questions("test", "high") == 3_498
    assert questions("dev", "middle") + questions("dev", "high") == 4_887
    assert questions("train", "middle") + questions("train", "high") == 87_866
