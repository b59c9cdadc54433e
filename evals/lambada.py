"""LAMBADA (Paperno et al. 2016) zero-shot cloze accuracy, under the three definitions in circulation.

* **strict** (Megatron-LM ``--strict-lambada``, the GPT-2 paper's protocol): the target is the last
  whitespace-separated word; the context is the text before it, stripped, and the word is tokenized as
  ``" " + word``. Correct when greedy decoding reproduces *every* BPE token of the word.
* **non-strict** (Megatron-LM default): the whole passage is tokenized and only its *last BPE token* is predicted;
  a model gets credit for finishing a word whose beginning was given. Higher than strict.
* **lm-eval** (``lambada_openai``): context ``" ".join(text.split(" ")[:-1])``, continuation
  ``" " + text.split(" ")[-1]``; the continuation tokens are ``encode(context + continuation)`` minus the tokens of
  ``encode(context)`` (trailing spaces of the context move to the continuation); correct when greedy.
  Its perplexity is ``exp(-mean log p(continuation))``, a per-word perplexity of the last word.

On the OpenAI file, strict and lm-eval coincide except where the two tokenize the context boundary differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from evals.scoring import CausalLM, ContinuationScore, score_continuations
from repro.text.tokenization import TextTokenizer

DEFINITIONS = ("strict", "nonstrict", "lm_eval")


def strict_request(text: str, tokenizer: TextTokenizer) -> tuple[list[int], list[int]]:
    last_word = text.split()[-1]
    start = text.rfind(last_word)
    return tokenizer.encode(text[:start].strip()), tokenizer.encode(" " + last_word)


def nonstrict_request(text: str, tokenizer: TextTokenizer) -> tuple[list[int], list[int]]:
    tokens = tokenizer.encode(text)
    return tokens[:-1], tokens[-1:]


def encode_pair(context: str, continuation: str, tokenizer: TextTokenizer) -> tuple[list[int], list[int]]:
    """lm-eval's context/continuation split for causal models (trailing context spaces join the continuation;
    an empty context becomes the end-of-document token)."""
    if context == "":
        if tokenizer.eod_id is None:
            raise ValueError("an empty context needs the tokenizer's end-of-document token")
        continuation_ids = tokenizer.encode(continuation)
        if continuation_ids[0] == tokenizer.eod_id:
            return continuation_ids[:1], continuation_ids[1:]
        return [tokenizer.eod_id], continuation_ids
    stripped = context.rstrip()
    if len(stripped) < len(context):
        continuation = context[len(stripped):] + continuation
        context = stripped
    whole = tokenizer.encode(context + continuation)
    context_ids = tokenizer.encode(context)
    return context_ids, whole[len(context_ids):]


def lm_eval_request(text: str, tokenizer: TextTokenizer) -> tuple[list[int], list[int]]:
    words = text.split(" ")
    return encode_pair(" ".join(words[:-1]), " " + words[-1], tokenizer)


_BUILDERS = {"strict": strict_request, "nonstrict": nonstrict_request, "lm_eval": lm_eval_request}


def build_requests(texts: Sequence[str], tokenizer: TextTokenizer, definition: str) -> list[tuple[list[int], list[int]]]:
    if definition not in _BUILDERS:
        raise ValueError(f"LAMBADA definition {definition!r} is not one of {DEFINITIONS}")
    return [_BUILDERS[definition](text, tokenizer) for text in texts]


@dataclass(frozen=True)
class LambadaResult:
    definition: str
    num_examples: int
    num_correct: int
    mean_logprob: float  # mean over examples of log p(target tokens | context)
    num_target_tokens: int
    #: per example: greedy decoding reproduced the target; log p(target | context) (for the standard errors)
    correct: tuple[bool, ...] = field(default=(), compare=False, repr=False)
    logprobs: tuple[float, ...] = field(default=(), compare=False, repr=False)

    @property
    def accuracy(self) -> float:
        return self.num_correct / self.num_examples

    @property
    def perplexity(self) -> float:
        """exp(-mean per-example log-likelihood): lm-eval's ``perplexity`` (per last word for strict/lm_eval)."""
        return math.exp(-self.mean_logprob)


def summarize(definition: str, scores: Sequence[ContinuationScore]) -> LambadaResult:
    return LambadaResult(
        definition=definition,
        num_examples=len(scores),
        num_correct=sum(s.is_greedy for s in scores),
        mean_logprob=math.fsum(s.logprob for s in scores) / len(scores),
        num_target_tokens=sum(s.num_tokens for s in scores),
        correct=tuple(s.is_greedy for s in scores),
        logprobs=tuple(s.logprob for s in scores),
    )


def evaluate_lambada(
    model: CausalLM, tokenizer: TextTokenizer, texts: Sequence[str], *,
    definitions: Sequence[str] = DEFINITIONS, batch_size: int = 16, progress: bool = True,
) -> dict[str, LambadaResult]:
    """Accuracy and last-word perplexity of ``model`` on ``texts`` under each requested definition."""
    if not texts:
        raise ValueError("no LAMBADA passages to evaluate")
    results = {}
    for definition in definitions:
        requests = build_requests(texts, tokenizer, definition)
        scores = score_continuations(model, requests, batch_size=batch_size, pad_id=tokenizer.eod_id or 0,
                                     desc=f"lambada ({definition})", progress=progress)
        results[definition] = summarize(definition, scores)
    return results
