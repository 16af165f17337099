"""Tests of llmqueue.metrics.ci: coverage of the intervals on exact M/M/1 output (closed-form
truth), honest None for too little data, weighted percentiles equal to expanded samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _queue_sim import mm1_times

from llmqueue.errors import InputError
from llmqueue.metrics.ci import (
    batch_means_ci,
    batch_quantile_ci,
    replication_ci,
    t_quantile,
    weighted_percentile,
)


def _response_times(lam, mu, n, seed, warm=0.05):
    a, s, f = mm1_times(lam, mu, n, seed)
    return (f - a)[int(warm * n):]


def test_t_quantile_textbook_values():
    assert t_quantile(0.95, 19) == pytest.approx(2.093, abs=1e-3)
    assert t_quantile(0.99, 9) == pytest.approx(3.250, abs=1e-3)


def test_coverage_over_50_seeds():
    """M/M/1, rho = 0.7: response time T ~ Exp(mu - lam), so E[T] = 1/(mu - lam) and the
    p-quantile is -ln(1-p)/(mu - lam). Nominal 95% intervals must cover 85-100% of 50 runs."""
    lam, mu, n = 0.7, 1.0, 20_000
    d = mu - lam
    truths = {"mean": 1 / d, 0.5: math.log(2) / d, 0.9: math.log(10) / d}
    hits = dict.fromkeys(truths, 0)
    for seed in range(50):
        x = _response_times(lam, mu, n, seed)
        ci = batch_means_ci(x)
        hits["mean"] += ci.contains(truths["mean"])
        for p in (0.5, 0.9):
            hits[p] += batch_quantile_ci(x, p).contains(truths[p])
    for key, h in hits.items():
        assert 0.85 <= h / 50 <= 1.0, (key, h)


def test_p99_coverage_on_longer_runs():
    """p99 needs long runs: M/M/1, rho = 0.5, 40,000 requests, 50 seeds."""
    lam, mu, n = 0.5, 1.0, 40_000
    truth = math.log(100) / (mu - lam)
    hits = defined = 0
    for seed in range(100, 150):
        ci = batch_quantile_ci(_response_times(lam, mu, n, seed), 0.99)
        if ci is not None:
            defined += 1
            hits += ci.contains(truth)
            assert ci.lo <= ci.estimate <= ci.hi
    assert defined >= 45
    assert hits / defined >= 0.85


def test_too_few_observations_give_none():
    x = _response_times(0.5, 1.0, 3000, seed=1)
    assert batch_means_ci(x[:50]) is None            # fewer than 10 batches of 10
    assert batch_means_ci(x[:200]) is not None
    assert batch_quantile_ci(x, 0.99) is None        # 29 tail observations < 10 batches x 10
    assert batch_quantile_ci(x, 0.999) is None
    assert batch_quantile_ci(x, 0.5) is not None
    assert replication_ci([1.0]) is None


def test_interval_fields_and_methods():
    x = _response_times(0.5, 1.0, 20_000, seed=2)
    ci = batch_means_ci(x, batches=20)
    assert ci.method == "batch_means" and ci.batches == 20 and ci.n == len(x)
    assert ci.estimate == pytest.approx(np.mean(x)) and ci.lo < ci.estimate < ci.hi
    q = batch_quantile_ci(x, 0.9)
    assert q.estimate == pytest.approx(np.percentile(x, 90)) and q.method == "batch_indicator"
    bq = batch_quantile_ci(x, 0.9, method="batch_quantiles")
    assert bq.method == "batch_quantiles" and bq.estimate == q.estimate
    assert ci.scaled(1000).lo == pytest.approx(1000 * ci.lo)
    assert ci.to_dict()["level"] == 0.95
    with pytest.raises(InputError):
        batch_means_ci([1.0, np.nan])
    with pytest.raises(InputError):
        batch_quantile_ci(x, 1.0)


def test_replication_ci_is_student_t():
    est = [4.9, 5.3, 5.0, 4.7, 5.1]
    ci = replication_ci(est, level=0.95)
    hw = t_quantile(0.95, 4) * np.std(est, ddof=1) / math.sqrt(5)
    assert ci.estimate == pytest.approx(np.mean(est))
    assert ci.hi - ci.estimate == pytest.approx(hw)


def test_weighted_equals_expanded():
    rng = np.random.default_rng(7)
    for _ in range(100):
        n = int(rng.integers(1, 40))
        x = rng.normal(size=n).round(2)
        w = rng.integers(0, 6, size=n)
        if w.sum() == 0:
            continue
        q = np.concatenate([[0, 100], rng.uniform(0, 100, 5)])
        np.testing.assert_allclose(weighted_percentile(x, w, q), np.percentile(np.repeat(x, w), q))
    # weighted batch means with integer weights estimate the mean of the expanded samples
    x = rng.exponential(size=2000)
    w = rng.integers(1, 5, size=2000)
    ci = batch_means_ci(x, weights=w)
    assert ci.estimate == pytest.approx(np.mean(np.repeat(x, w)))
    assert ci.n == w.sum()
