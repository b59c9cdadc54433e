"""The standard errors of evals.stderr are lm-eval's (lm_eval.api.metrics): ``mean_stderr`` in closed form, and the
bootstrap of a perplexity drawing the same resamples as lm-eval's ``bootstrap_stderr`` (same seeds, same numbers)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from evals.stderr import _resample_indices, bootstrap_stderrs, mean_stderr, perplexity_of, perplexity_stderrs

metrics = pytest.importorskip("lm_eval.api.metrics")


def test_the_resamples_are_pythons_random_choices():
    for seed in (0, 1, 31):
        rng = random.Random(seed)
        expected = [rng.choices(range(53), k=53) for _ in range(4)]
        assert (_resample_indices(seed, 53, 4) == np.array(expected)).all()


@pytest.mark.parametrize("n", [2, 7, 300])
def test_bootstrap_and_mean_stderr_equal_lm_evals(n, monkeypatch):
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")  # lm-eval's single-process path: the same resamples as its pool's
    values = (-np.random.default_rng(n).gamma(2.0, 2.0, size=n)).tolist()
    theirs = metrics.bootstrap_stderr(metrics.perplexity, values, iters=3000)
    assert perplexity_stderrs([values], iters=3000)[0] == pytest.approx(theirs, rel=1e-12)
    scores = [float(v > -4.0) for v in values]
    assert mean_stderr(scores) == pytest.approx(metrics.mean_stderr(scores), rel=1e-15)


def test_no_stderr_where_lm_eval_reports_none():
    assert mean_stderr([1.0]) is None and perplexity_stderrs([[-1.0]])[0] is None  # one example
    assert perplexity_stderrs([[-1.0, -2.0]], iters=0) == [None]  # lm-eval's bootstrap_iters 0
    with pytest.raises(ValueError, match="different lengths"):
        bootstrap_stderrs(perplexity_of, [[-1.0, -2.0], [-1.0]])
