"""Standard errors of the evaluation metrics, computed as lm-eval computes them (lm_eval/api/metrics.py,
``stderr_for_metric``), so a number and its error bar mean what they mean in lm-eval's ``Value ± Stderr`` table.

* A metric that is a mean over examples (an accuracy: lm-eval's ``mean`` aggregation) has a closed form,
  ``mean_stderr``: the sample standard deviation (n - 1) over the square root of n.
* A perplexity over examples, ``exp(-mean log-likelihood)`` (lm-eval's ``perplexity`` aggregation: LAMBADA's), is
  bootstrapped: lm-eval draws ``iters`` = 100,000 resamples of the n per-example log-likelihoods, in chunks of 1,000
  whose resamples come from ``random.Random(chunk)``'s ``choices``, and reports the sample standard deviation of the
  resampled perplexities. :func:`bootstrap_stderr` draws the very same resamples (numpy's legacy Mersenne Twister,
  given the state Python's seeding makes, yields the same 53-bit doubles as Python's ``random``), vectorised: the
  same number to rounding, in a fraction of the time.
* lm-eval computes no standard error for a token- or byte-weighted perplexity or for bits per byte (its
  ``weighted_perplexity`` and ``bits_per_byte`` aggregations; WikiText's metrics): None here, "N/A" in the table, as
  there; nor does Megatron's token-weighted WikiText perplexity have one. Counts have none either.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

#: lm-eval's default ``bootstrap_iters`` (lm_eval.evaluator.simple_evaluate), and its chunk of resamples per seed
BOOTSTRAP_ITERS = 100_000
BOOTSTRAP_CHUNK = 1000


def sample_stddev(values: Sequence[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def mean_stderr(values: Sequence[float]) -> float | None:
    """lm-eval's ``mean_stderr``: sample standard deviation / sqrt(n); None for fewer than 2 values (lm-eval's
    "N/A")."""
    if len(values) < 2:
        return None
    return sample_stddev(values) / math.sqrt(len(values))


def _resample_indices(seed: int, size: int, count: int) -> np.ndarray:
    """The indices ``random.Random(seed).choices(range(size), k=size)`` draws ``count`` times in a row:
    ``floor(random() * size)`` per draw, ``random()`` being MT19937's 53-bit double (two 32-bit outputs)."""
    import random

    _, state, _ = random.Random(seed).getstate()  # Python's seeding of the Mersenne Twister, taken as it is
    generator = np.random.RandomState()
    generator.set_state(("MT19937", np.array(state[:-1], dtype=np.uint32), state[-1], 0, 0.0))
    return np.floor(generator.random_sample((count, size)) * size).astype(np.int64)


def bootstrap_stderr(statistic: Callable[[np.ndarray], np.ndarray], values: Sequence[float], *,
                     iters: int = BOOTSTRAP_ITERS) -> float | None:
    """lm-eval's ``bootstrap_stderr``: the sample standard deviation of ``statistic`` over ``iters`` resamples
    (``iters // 1000`` chunks of 1,000, chunk ``i`` drawn from ``random.Random(i)``). ``statistic`` maps a
    [..., resamples, n] array to one value per resample. None for fewer than 2 values or ``iters`` < 1000."""
    return bootstrap_stderrs(statistic, [values], iters=iters)[0]


def bootstrap_stderrs(statistic: Callable[[np.ndarray], np.ndarray], columns: Sequence[Sequence[float]], *,
                      iters: int = BOOTSTRAP_ITERS) -> list[float | None]:
    """:func:`bootstrap_stderr` of several equally long columns at once (LAMBADA's three definitions score the same
    passages): lm-eval's resamples depend only on n and the seeds, so each is drawn once for all of them."""
    lengths = {len(column) for column in columns}
    if len(lengths) != 1:
        raise ValueError(f"columns of different lengths {sorted(lengths)}: bootstrap them one at a time")
    size = lengths.pop()
    if size < 2 or iters < BOOTSTRAP_CHUNK:
        return [None] * len(columns)
    data = np.asarray(columns, dtype=np.float64)  # [columns, n]
    replicates = [statistic(data[:, _resample_indices(chunk, size, BOOTSTRAP_CHUNK)])  # [columns, 1000]
                  for chunk in range(iters // BOOTSTRAP_CHUNK)]
    return [sample_stddev(row.tolist()) for row in np.concatenate(replicates, axis=-1)]


def perplexity_of(logprobs: np.ndarray) -> np.ndarray:
    """lm-eval's ``perplexity`` aggregation, exp(-mean log-likelihood), over the last axis."""
    return np.exp(-logprobs.mean(axis=-1))


def perplexity_stderrs(columns: Sequence[Sequence[float]], *, iters: int = BOOTSTRAP_ITERS) -> list[float | None]:
    """The bootstrapped standard errors lm-eval reports beside perplexities over examples (LAMBADA's), one per
    column of per-example log-likelihoods."""
    return bootstrap_stderrs(perplexity_of, columns, iters=iters)
