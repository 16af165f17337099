"""Client behaviour: deadlines, the pure retry decision, the backoff schedule, retry amplification."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.workload import ClientBehavior, RetryPolicy, jitter_uniform, retry_amplification
from llmqueue.workload.client import RETRYABLE, STATUSES, retry_success_probability


def test_statuses_match_the_record_schema():
    from llmqueue.records.schema import STATUSES as RECORD_STATUSES

    assert STATUSES == RECORD_STATUSES
    assert set(RETRYABLE) == {"rejected", "timeout", "error"}


def test_defaults_never_retry_and_never_time_out():
    c = ClientBehavior()
    assert c.timeout_s is None and c.retry.max_attempts == 1
    assert c.deadline(3.0) == math.inf and c.ttft_deadline(3.0) == math.inf
    for s in STATUSES:
        assert c.decide(1, 1, s, 5.0, seed=0) is None


def test_deadlines_are_measured_from_the_attempts_send_time():
    c = ClientBehavior(timeout_s=30, ttft_timeout_s=4)
    assert c.deadline(10.0) == 40.0 and c.ttft_deadline(10.0) == 14.0
    assert c.bind(1).deadline(2.5) == 32.5


def test_backoff_schedule_without_jitter():
    c = ClientBehavior(retry=RetryPolicy(max_attempts=10, backoff_s=0.5, multiplier=2, cap_s=8, jitter=0))
    t_end = 100.0
    delays = [c.decide(7, k, "error", t_end, seed=3) - t_end for k in range(1, 10)]
    assert delays == pytest.approx([0.5, 1, 2, 4, 8, 8, 8, 8, 8])
    # multiplier 1: a constant backoff
    c1 = ClientBehavior(retry=RetryPolicy(max_attempts=4, backoff_s=2, multiplier=1, jitter=0))
    assert [c1.decide(0, k, "rejected", 0.0, seed=0) for k in (1, 2, 3)] == [2, 2, 2]
    # a huge attempt number saturates at the cap instead of overflowing
    big = RetryPolicy(max_attempts=10 ** 6, backoff_s=1, multiplier=10, cap_s=30, jitter=0)
    assert big.base_delay(5000) == 30


def test_jitter_shrinks_the_delay_within_its_fraction():
    pol = RetryPolicy(max_attempts=5, backoff_s=1, multiplier=2, cap_s=60, jitter=0.25)
    c = ClientBehavior(retry=pol)
    for rid in range(500):
        for k in (1, 2, 3, 4):
            d = c.decide(rid, k, "timeout", 10.0, seed=11) - 10.0
            base = pol.base_delay(k)
            assert 0.75 * base < d <= base


def test_full_jitter_is_uniform_on_zero_to_delay():
    c = ClientBehavior(retry=RetryPolicy(max_attempts=2, backoff_s=4, jitter=1.0))
    d = np.array([c.decide(rid, 1, "error", 0.0, seed=5) for rid in range(20_000)])
    assert d.min() >= 0 and d.max() < 4
    # mean of U(0, 4) is 2 with sd 4/sqrt(12); 4.5 standard errors
    assert abs(d.mean() - 2.0) < 4.5 * (4 / math.sqrt(12)) / math.sqrt(d.size)


def test_jitter_uniform_is_a_deterministic_uniform():
    from scipy import stats

    u = np.array([jitter_uniform(42, rid, 1) for rid in range(20_000)])
    assert np.all((u >= 0) & (u < 1))
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # consecutive attempts and consecutive seeds are uncorrelated
    v = np.array([jitter_uniform(42, rid, 2) for rid in range(20_000)])
    w = np.array([jitter_uniform(43, rid, 1) for rid in range(20_000)])
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.03 and abs(np.corrcoef(u, w)[0, 1]) < 0.03
    assert jitter_uniform(42, 7, 1) == jitter_uniform(42, 7, 1)
    assert jitter_uniform(42, np.int64(7), np.int64(1)) == jitter_uniform(42, 7, 1)


def test_decide_is_pure_in_any_call_order():
    """The simulator and the benchmark see outcomes in different orders; the answers must not change."""
    c = ClientBehavior(retry=RetryPolicy(max_attempts=4, jitter=0.5))
    calls = [(rid, k, s, 10.0 + rid * 0.1) for rid in range(200) for k in (1, 2, 3)
             for s in ("rejected", "timeout", "error")]
    first = {x: c.decide(*x, seed=9) for x in calls}
    shuffled = calls[:]
    random.Random(1).shuffle(shuffled)
    second = {x: c.decide(*x, seed=9) for x in shuffled}
    assert first == second
    bound = c.bind(9)
    assert all(bound.decide(*x) == first[x] for x in calls[:50])
    # a different seed changes the jitter draws
    assert any(c.decide(*x, seed=10) != first[x] for x in calls)
    # an equal behaviour built separately decides the same (no hidden state)
    assert ClientBehavior(retry=RetryPolicy(max_attempts=4, jitter=0.5)).decide(*calls[0], seed=9) == first[calls[0]]


def test_max_attempts_and_retry_on_are_respected():
    c = ClientBehavior(retry=RetryPolicy(max_attempts=3, retry_on=("rejected",), jitter=0))
    assert c.decide(1, 1, "rejected", 0.0, seed=0) == 0.5
    assert c.decide(1, 2, "rejected", 0.0, seed=0) == 1.0
    assert c.decide(1, 3, "rejected", 0.0, seed=0) is None  # the third attempt was the last
    assert c.decide(1, 4, "rejected", 0.0, seed=0) is None
    for s in ("ok", "cancelled", "timeout", "error"):
        assert c.decide(1, 1, s, 0.0, seed=0) is None
    assert RetryPolicy(retry_on="timeout").retry_on == ("timeout",)
    assert RetryPolicy(retry_on=["error", "rejected", "error"]).retry_on == ("rejected", "error")


def test_a_run_of_attempts_never_exceeds_max_attempts():
    c = ClientBehavior(retry=RetryPolicy(max_attempts=5, backoff_s=0.1, jitter=1.0)).bind(0)
    for rid in range(300):
        t, k = 0.0, 1
        while True:
            nxt = c.decide(rid, k, "error", t + 1.0)
            if nxt is None:
                break
            assert nxt >= t + 1.0
            t, k = nxt, k + 1
        assert k == 5


@pytest.mark.parametrize("kwargs,field", [
    (dict(max_attempts=0), "max_attempts"),
    (dict(retry_on=("ok",)), "retry_on"),
    (dict(retry_on=("cancelled",)), "retry_on"),
    (dict(retry_on=("late",)), "retry_on"),
    (dict(backoff_s=-1), "backoff_s"),
    (dict(multiplier=0.5), "multiplier"),
    (dict(cap_s=0), "cap_s"),
    (dict(jitter=1.5), "jitter"),
    (dict(jitter=float("nan")), "jitter"),
])
def test_retry_policy_errors_name_the_field(kwargs, field):
    with pytest.raises(InputError) as e:
        RetryPolicy(**kwargs)
    assert e.value.field == field


def test_decide_rejects_bad_arguments():
    c = ClientBehavior(retry=RetryPolicy(max_attempts=3))
    with pytest.raises(InputError, match="status"):
        c.decide(1, 1, "late", 0.0, seed=0)
    with pytest.raises(InputError, match="attempt"):
        c.decide(1, 0, "error", 0.0, seed=0)
    with pytest.raises(InputError, match="t_end"):
        c.decide(1, 1, "error", float("nan"), seed=0)
    with pytest.raises(InputError, match="request_id"):
        c.decide(1.5, 1, "error", 0.0, seed=0)
    with pytest.raises(InputError, match="timeout_s"):
        ClientBehavior(timeout_s=0)


def test_retry_amplification_closed_form():
    assert retry_amplification(0.0, 5) == 1.0
    assert retry_amplification(1.0, 5) == 5.0
    assert retry_amplification(0.5, 1) == 1.0
    assert retry_amplification(0.5, 3) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert retry_amplification(0.2, 4) == pytest.approx(1 + 0.2 + 0.04 + 0.008)
    assert retry_success_probability(0.5, 3) == pytest.approx(0.875)
    with pytest.raises(InputError):
        retry_amplification(1.2, 3)


@pytest.mark.parametrize("p,n", [(0.1, 3), (0.3, 3), (0.5, 4), (0.8, 5)])
def test_retry_amplification_matches_a_monte_carlo_of_decide(p, n):
    """Each attempt fails with probability p; the client's decide() drives the retries."""
    retry_on = ("rejected", "timeout", "error")
    client = ClientBehavior(retry=RetryPolicy(max_attempts=n, retry_on=retry_on, jitter=1.0)).bind(2024)
    rng = np.random.default_rng(7)
    N = 20_000
    attempts = np.empty(N)
    ok = np.zeros(N, dtype=bool)
    for rid in range(N):
        t, k = 0.0, 1
        while True:
            failed = rng.random() < p
            status = retry_on[rng.integers(3)] if failed else "ok"
            t_end = t + 1.0
            nxt = client.decide(rid, k, status, t_end)
            if nxt is None:
                ok[rid] = not failed
                break
            t, k = nxt, k + 1
        attempts[rid] = k
    mean = retry_amplification(p, n)
    # the variance of the truncated geometric count, from its pmf
    pmf = np.array([p ** (j - 1) * (1 - p) for j in range(1, n)] + [p ** (n - 1)])
    var = float(np.dot(pmf, np.arange(1, n + 1) ** 2)) - mean ** 2
    assert abs(attempts.mean() - mean) < 4.5 * math.sqrt(var / N)
    s = retry_success_probability(p, n)
    assert abs(ok.mean() - s) < 4.5 * math.sqrt(s * (1 - s) / N)
    assert attempts.max() <= n
