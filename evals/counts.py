"""Dataset sizes, counted the way each protocol counts them (no model needed).

The acceptance numbers: WikiText-103 test has T_o = 245,566 original tokens by Megatron's count
(``len(text.strip().split(" "))``) and T = 270,330 GPT-2 BPE tokens after the WikiText detokenizer (the
Megatron-LM paper, App. E.1, prints 270,329; see README); LAMBADA has 5,153 passages; RACE has 87,866 train,
4,887 dev and 4,934 test questions (test: 1,436 middle, 3,498 high).
"""

from __future__ import annotations

from repro.text.detokenize import wikitext_detokenize
from evals.loaders import PathLike, load_lambada, load_race, load_wikitext
from repro.text.tokenization import gpt2_tokenizer
from evals.wikitext import count_original_tokens, count_words
from repro.text.wikitext_articles import split_articles


def dataset_counts(data_dir: PathLike = None) -> list[dict]:
    """Rows ``{"metric", "value", "unit", "dataset", "split", "level", "data_sha256"}`` of every count."""
    rows = []
    tokenizer = gpt2_tokenizer(data_dir)
    for split in ("test", "valid"):
        loaded = load_wikitext(split, data_dir)
        text = loaded.records
        articles = split_articles(text)
        for metric, value in (
            ("original_tokens_megatron", count_original_tokens(text)),
            ("bpe_tokens_detokenized", len(tokenizer.encode(wikitext_detokenize(text)))),
            ("whitespace_words", len(text.split())),
            ("articles", len(articles)),
            ("lm_eval_words", sum(count_words(a) for a in articles)),
            ("utf8_bytes", len(text.encode("utf-8"))),
        ):
            rows.append({"metric": metric, "value": value, "unit": "count", "dataset": "wikitext103",
                         "split": split, "level": "", "data_sha256": loaded.data_sha256})
    lambada = load_lambada(data_dir)
    rows.append({"metric": "examples", "value": len(lambada.records), "unit": "count", "dataset": "lambada",
                 "split": "test", "level": "", "data_sha256": lambada.data_sha256})
    for split in ("train", "dev", "test"):
        for level in ("middle", "high"):
            loaded = load_race(split, level, data_dir)
            for metric, value in (("passages", len(loaded.records)),
                                  ("questions", sum(len(r["questions"]) for r in loaded.records))):
                rows.append({"metric": metric, "value": value, "unit": "count", "dataset": "race", "split": split,
                             "level": level, "data_sha256": loaded.data_sha256})
    return rows
