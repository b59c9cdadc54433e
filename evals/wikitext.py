"""Zero-shot WikiText-103 perplexity, under both definitions people quote.

**Megatron-LM** (paper App. E.1, tasks/zeroshot_gpt): the whole test file is detokenized and BPE-encoded as one
stream of ``T`` tokens. Windows of ``seq_len`` tokens start every ``stride`` tokens (Megatron's
``--overlapping-eval``; the paper's "overlap" of 32 is this value); the first window scores all its targets, every
later window only its last ``stride`` targets, so each of the ``T - 1`` targets is scored exactly once with
``seq_len - stride`` or more tokens of context. Reported:

    token perplexity     = exp(L / (T - 1))             L = summed negative log-likelihood
    adjusted perplexity  = exp(L / (T_o - 1))           T_o = len(raw_text.strip().split(" "))  (245,566 for test)

The adjusted value rescales to the original word-level tokens, so it is comparable with word-level models; it is
the number in the Megatron-LM paper's Table 3 (10.81 for 8.3B). Megatron also clamps the exponent at 20; we do not.

**lm-eval** (task ``wikitext``): one request per article; each article is detokenized and scored with disjoint
windows of ``max_length`` tokens, the first prefixed by the end-of-document token (so every token, including the
first, is scored); word perplexity divides by the number of whitespace-separated words of the *original* article
(``len(re.split(r"\\s+", page))``), bits per byte by its UTF-8 bytes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from repro.text.detokenize import wikitext_detokenize
from evals.scoring import CausalLM, score_continuations
from repro.text.tokenization import TextTokenizer

Request = tuple[list[int], list[int]]


def count_original_tokens(raw_text: str) -> int:
    """Megatron's T_o: ``len(text.strip().split(" "))`` over the raw (tokenized) WikiText file."""
    return len(raw_text.strip().split(" "))


@dataclass(frozen=True)
class WindowConfig:
    """Overlapping-window evaluation: ``seq_len`` tokens per window, a new window every ``stride`` tokens.

    ``stride=None`` means ``stride = seq_len`` (disjoint windows). ``overlap = seq_len - stride`` tokens of every
    window after the first are context only.
    """

    seq_len: int = 1024
    stride: int | None = 32

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"seq_len={self.seq_len} must be >= 1")
        if self.stride is not None and not 1 <= self.stride <= self.seq_len:
            raise ValueError(f"stride={self.stride} must be in [1, seq_len={self.seq_len}]")

    @property
    def effective_stride(self) -> int:
        return self.seq_len if self.stride is None else self.stride

    @property
    def overlap(self) -> int:
        return self.seq_len - self.effective_stride


def megatron_windows(tokens: Sequence[int], config: WindowConfig) -> list[Request]:
    """Megatron's windows as (context, scored continuation) requests; they score targets 1..T-1 exactly once.

    Window ``i`` reads ``tokens[i*stride : i*stride + seq_len]``; window 0 scores targets ``1..seq_len``, window
    ``i >= 1`` the targets ``i*stride + seq_len - stride + 1 .. i*stride + seq_len`` (those that exist).
    """
    tokens = list(tokens)
    seq_len, stride = config.seq_len, config.effective_stride
    requests: list[Request] = []
    if len(tokens) < 2:
        return requests
    first_end = min(seq_len, len(tokens) - 1)  # last target index of window 0
    requests.append((tokens[:1], tokens[1: first_end + 1]))
    index = 1
    while True:
        start = index * stride
        first_target = start + seq_len - stride + 1
        last_target = min(start + seq_len, len(tokens) - 1)
        if first_target > len(tokens) - 1:
            break
        requests.append((tokens[start:first_target], tokens[first_target: last_target + 1]))
        index += 1
    return requests


def rolling_windows(tokens: Sequence[int], max_length: int, prefix_id: int) -> list[Request]:
    """lm-eval's ``loglikelihood_rolling`` windows (context length 1, disjoint): every token is scored once.

    The first window predicts ``tokens[:max_length]`` from ``[prefix] + tokens[:max_length-1]``; each following
    window predicts the next ``max_length`` tokens, conditioned on the single token before them (disjoint windows),
    except the last, shorter window, whose context fills the window up to ``max_length`` input tokens.
    """
    tokens = list(tokens)
    requests: list[Request] = []
    if not tokens:
        return requests
    first = min(max_length, len(tokens))
    requests.append(([prefix_id], tokens[:first]))
    done = first
    while done < len(tokens):
        count = min(max_length, len(tokens) - done)
        # a full window has one token of context; the last, shorter one keeps its window full of context
        requests.append((tokens[done + count - max_length - 1: done], tokens[done: done + count]))
        done += count
    return requests


@dataclass(frozen=True)
class MegatronPerplexity:
    nll_sum: float
    num_tokenized: int  # T
    num_original: int  # T_o

    @property
    def token_loss(self) -> float:
        return self.nll_sum / (self.num_tokenized - 1)

    @property
    def token_perplexity(self) -> float:
        return math.exp(self.token_loss)

    @property
    def adjusted_perplexity(self) -> float:
        return math.exp(self.nll_sum / (self.num_original - 1))


def evaluate_megatron(
    model: CausalLM, tokenizer: TextTokenizer, raw_text: str, config: WindowConfig, *,
    batch_size: int = 8, progress: bool = True, max_tokens: int | None = None,
) -> MegatronPerplexity:
    """Megatron-style perplexity of ``raw_text`` (a WikiText file). ``max_tokens`` keeps only a BPE prefix
    (for quick runs; T_o is then scaled by the same fraction of the stream and the result is not the paper's)."""
    if config.seq_len > model.max_length:
        raise ValueError(f"seq_len={config.seq_len} exceeds the model's max_length={model.max_length}")
    if max_tokens is not None and max_tokens < 2:
        raise ValueError(f"max_tokens={max_tokens} must be >= 2 (a perplexity scores the tokens after the first)")
    tokens = tokenizer.encode(wikitext_detokenize(raw_text))
    if len(tokens) < 2:
        raise ValueError(f"the WikiText text holds {len(tokens)} token(s); a perplexity needs at least 2")
    num_original = count_original_tokens(raw_text)
    if max_tokens is not None and max_tokens < len(tokens):
        num_original = max(2, round(num_original * max_tokens / len(tokens)))
        tokens = tokens[:max_tokens]
    scores = score_continuations(model, megatron_windows(tokens, config), batch_size=batch_size,
                                 pad_id=tokenizer.eod_id or 0, desc="wikitext (megatron windows)", progress=progress)
    return MegatronPerplexity(nll_sum=-sum(s.logprob for s in scores), num_tokenized=len(tokens),
                              num_original=num_original)


def count_words(page: str) -> int:
    """lm-eval's word count of an original (tokenized) article: ``len(re.split(r"\\s+", page))``."""
    return len(re.split(r"\s+", page))


@dataclass(frozen=True)
class DocumentPerplexity:
    loglikelihood: float
    num_words: int
    num_bytes: int
    num_tokens: int

    @property
    def word_perplexity(self) -> float:
        return math.exp(-self.loglikelihood / self.num_words)

    @property
    def byte_perplexity(self) -> float:
        return math.exp(-self.loglikelihood / self.num_bytes)

    @property
    def bits_per_byte(self) -> float:
        return -self.loglikelihood / self.num_bytes / math.log(2)


def evaluate_documents(
    model: CausalLM, tokenizer: TextTokenizer, pages: Sequence[str], *, max_length: int | None = None,
    batch_size: int = 8, progress: bool = True,
) -> DocumentPerplexity:
    """lm-eval-style word perplexity / bits per byte over ``pages`` (original WikiText articles)."""
    if tokenizer.eod_id is None:
        raise ValueError(f"tokenizer {tokenizer.name!r} has no end-of-document token for the first window")
    length = max_length or model.max_length
    requests: list[Request] = []
    num_tokens = 0
    for page in pages:
        tokens = tokenizer.encode(wikitext_detokenize(page))
        num_tokens += len(tokens)
        requests.extend(rolling_windows(tokens, length, tokenizer.eod_id))
    scores = score_continuations(model, requests, batch_size=batch_size, pad_id=tokenizer.eod_id,
                                 desc="wikitext (documents)", progress=progress)
    return DocumentPerplexity(
        loglikelihood=sum(s.logprob for s in scores),
        num_words=sum(count_words(p) for p in pages),
        num_bytes=sum(len(p.encode("utf-8")) for p in pages),
        num_tokens=num_tokens,
    )
