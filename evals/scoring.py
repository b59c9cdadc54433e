"""Batched, padded log-likelihood scoring of continuations: the one numerical kernel every harness shares.

Each request is a pair (context tokens, continuation tokens). The model reads ``(context + continuation)[:-1]``
and the last ``len(continuation)`` positions are scored against the continuation -- the form of both Megatron's
zero-shot windows (a pad mask over the labels) and lm-eval's ``loglikelihood`` requests. Requests are sorted by
length (longest first) so a batch holds similar lengths, right-padded (a causal model never looks right, so padding
cannot change a scored position), and only the scored positions are sent through the output head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
from tqdm.auto import tqdm


class CausalLM(Protocol):
    """What the harnesses need from a model: its real vocabulary size, its context length, and logits.

    ``logits(input_ids[B,S], keep[B,S] bool) -> [N, vocab_size]``: the logits of the kept positions in row-major
    order (``N = keep.sum()``), over the unpadded vocabulary. Models may skip the output head elsewhere.
    A model may also offer ``score_tokens(input_ids, keep, target[N]) -> (logprob[N], greedy[N])`` to score
    without materialising all N x V logits at once (:class:`evals.repro_lm.ReproCausalLM` does).
    """

    vocab_size: int
    max_length: int

    def logits(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor: ...


class FunctionLM:
    """Adapts a plain ``logits_fn(input_ids[B,S]) -> logits[B,S,V']`` (``V' >= vocab_size``) to :class:`CausalLM`."""

    def __init__(self, logits_fn, *, vocab_size: int, max_length: int) -> None:
        self.logits_fn = logits_fn
        self.vocab_size = vocab_size
        self.max_length = max_length

    def logits(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        full = self.logits_fn(input_ids)  # [B, S, V']
        if full.shape[-1] < self.vocab_size:
            raise ValueError(f"logits_fn returned {full.shape[-1]} logits per position, fewer than "
                             f"vocab_size={self.vocab_size}")
        return full[keep][:, : self.vocab_size]


@dataclass(frozen=True)
class ContinuationScore:
    """Sum of log p(continuation | context), its token count, and whether greedy decoding reproduces it."""

    logprob: float
    num_tokens: int
    is_greedy: bool


def truncate_left(context: Sequence[int], continuation: Sequence[int], max_length: int) -> list[int]:
    """Model input for one request: ``(context + continuation)[:-1]`` keeping at most ``max_length`` tokens
    from the right (lm-eval's truncation; a continuation longer than ``max_length`` is an error)."""
    if not continuation:
        raise ValueError("a continuation must have at least one token to score")
    if len(continuation) > max_length:
        raise ValueError(f"continuation of {len(continuation)} tokens exceeds the model's max_length={max_length}")
    if not context:
        raise ValueError("a context must have at least one token (use the end-of-document token as a prefix)")
    whole = list(context) + list(continuation)
    return whole[-(max_length + 1):][:-1]


def token_scores(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) = logit[target] - logsumexp(logits) and whether target is the argmax, per row of [N, V]
    (computed in at least float32; the N x V log-softmax is never materialised)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    target = target.to(logits.device)
    logprob = logits.gather(-1, target[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logprob, logits.argmax(dim=-1) == target


@torch.no_grad()
def score_continuations(
    model: CausalLM,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_size: int = 8,
    pad_id: int = 0,
    desc: str = "scoring",
    progress: bool = True,
) -> list[ContinuationScore]:
    """Score every ``(context, continuation)`` request; results come back in request order."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    inputs = [truncate_left(ctx, cont, model.max_length) for ctx, cont in requests]
    order = sorted(range(len(requests)), key=lambda i: (-len(inputs[i]), i))
    results: list[ContinuationScore | None] = [None] * len(requests)
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc=desc, disable=not progress, unit="batch"):
        width = len(inputs[batch[0]])
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        keep = torch.zeros((len(batch), width), dtype=torch.bool)
        targets: list[int] = []
        for row, index in enumerate(batch):
            tokens, continuation = inputs[index], requests[index][1]
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            keep[row, len(tokens) - len(continuation): len(tokens)] = True
            targets.extend(continuation)
        target = torch.tensor(targets, dtype=torch.long)  # [N], N = number of scored tokens in the batch
        if hasattr(model, "score_tokens"):
            token_logprob, greedy = model.score_tokens(ids, keep, target)
        else:
            token_logprob, greedy = token_scores(model.logits(ids, keep), target)
        token_logprob, greedy = token_logprob.cpu(), greedy.cpu()
        offset = 0
        for index in batch:
            count = len(requests[index][1])
            results[index] = ContinuationScore(
                logprob=float(token_logprob[offset: offset + count].sum(dtype=torch.float64)),
                num_tokens=count,
                is_greedy=bool(greedy[offset: offset + count].all()),
            )
            offset += count
    return results  # type: ignore[return-value]
