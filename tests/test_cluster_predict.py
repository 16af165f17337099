"""The autoscaler's ``p99_ttft`` metric: the M/M/c (Erlang C) prediction against hand-computed
values, the count it asks for, and a fleet under a step-up in arrivals."""

import math
from array import array

import numpy as np
import pytest

from llmqueue.cluster import simulate_fleet
from llmqueue.cluster.autoscaler import desired_replicas
from llmqueue.cluster.predict import P99Load, predicted_p99, replica_mu, replicas_for_p99
from llmqueue.cluster.spec import Autoscaler, FleetSpec, Pool
from llmqueue.engine import EngineConfig
from llmqueue.engine.options import SimOptions
from llmqueue.errors import InputError
from llmqueue.theory.classic import erlang_c, mmc_wait_quantile
from llmqueue.workload import Workload

ONE = EngineConfig.from_capacity(1 << 30, max_num_seqs=1)


def test_the_prediction_is_the_erlang_c_tail():
    # lam = 2, mu = 1, c = 3: a = 2, B(3, 2) = 4/19, C = B / (1 - rho (1 - B)) = 4/9
    assert erlang_c(lam=2, mu=1, c=3) == pytest.approx(4 / 9, rel=1e-12)
    p99 = predicted_p99(2.0, 1.0, 3)
    # P(W > t) = C exp(-(c mu - lam) t) = 0.01 at t = ln(100 C) / (3 - 2)
    assert p99 == pytest.approx(math.log(400 / 9), rel=1e-12)
    assert 4 / 9 * math.exp(-(3 - 2) * p99) == pytest.approx(0.01, rel=1e-9)
    assert p99 == pytest.approx(mmc_wait_quantile(p=0.99, lam=2, mu=1, c=3), rel=1e-12)
    # lam = 1, mu = 1, c = 2: B(2, 1) = 1/5, C = 1/3; a backlog of 5 drains at c mu - lam = 1
    assert predicted_p99(1.0, 1.0, 2) == pytest.approx(math.log(100 / 3), rel=1e-12)
    assert predicted_p99(1.0, 1.0, 2, 5.0, offset=0.25) == pytest.approx(math.log(100 / 3) + 5.0 + 0.25, rel=1e-12)
    # lam = 20, mu = 10, c = 4: C = 0.1739 (a = 2), d = 20
    c4 = erlang_c(lam=20, mu=10, c=4)
    assert predicted_p99(20.0, 10.0, 4, 40.0) == pytest.approx(math.log(c4 / 0.01) / 20 + 2.0, rel=1e-12)
    # few wait: C <= 0.01 leaves the backlog term alone
    assert erlang_c(lam=1, mu=1, c=6) < 0.01
    assert predicted_p99(1.0, 1.0, 6, 10.0) == pytest.approx(10.0 / 5, rel=1e-12)
    # not stable: c mu <= lam
    assert predicted_p99(2.0, 1.0, 2) == math.inf
    assert predicted_p99(2.0, 1.0, 1, 0.0) == math.inf
    assert predicted_p99(0.5, None, 3, 1.0) == math.inf  # no mu known, work to do
    # no load, no backlog: nothing to wait for, even with no replica
    assert predicted_p99(0.0, None, 0) == 0.0 and predicted_p99(0.0, 1.0, 2, offset=0.1) == 0.1


def test_the_count_is_the_smallest_that_meets_the_target():
    # lam = 2, mu = 1: c = 2 is unstable, c = 3 predicts 3.79 s, c = 4 1.43 s
    assert replicas_for_p99(P99Load(2.0, 1.0, 0.0), 4.0, 1, 10) == 3
    assert replicas_for_p99(P99Load(2.0, 1.0, 0.0), 3.7, 1, 10) == 4
    assert replicas_for_p99(P99Load(2.0, 1.0, 0.0), 3.7, 6, 10) == 6   # min_replicas
    assert erlang_c(lam=2, mu=1, c=7) < 0.01  # from 7 replicas on, the p99 waits nothing
    assert replicas_for_p99(P99Load(2.0, 1.0, 0.0), 1e-6, 1, 10) == 7
    assert replicas_for_p99(P99Load(2.0, 1.0, 1.0), 0.1, 1, 10) == 10  # none meets it (1 / (10 - 2) > 0.1): max
    assert replicas_for_p99(P99Load(2.0, 1.0, 0.0, 0.5), 0.4, 1, 10) == 10  # below the prefill's offset
    assert replicas_for_p99(P99Load(0.0, None, 0.0), 1.0, 0, 10) == 0  # nothing arrives
    mu, Q, target, lo, hi = 3.0, 12.0, 2.0, 1, 40
    prev = 0
    for lam in np.linspace(0.5, 130.0, 60):
        c = replicas_for_p99(P99Load(float(lam), mu, Q, 0.1), target, lo, hi)
        assert c >= prev  # monotone in lam
        prev = c
        pred = predicted_p99(float(lam), mu, c, Q, offset=0.1)
        if c < hi:
            assert pred <= target
        if c > lo:  # one fewer misses it
            assert predicted_p99(float(lam), mu, c - 1, Q, offset=0.1) > target
    assert prev == hi  # 130 req/s needs more than 40 replicas of 3 req/s
    # a longer backlog never asks for fewer
    counts = [replicas_for_p99(P99Load(20.0, 3.0, q), target, lo, hi) for q in (0, 10, 50, 200)]
    assert counts == sorted(counts) and counts[0] < counts[-1]


def test_the_hpa_parts_of_the_rule():
    a = Autoscaler("p", metric="p99_ttft", target=3.6, min_replicas=1, max_replicas=10)
    load = P99Load(2.0, 1.0, 0.0)  # 3.79 s at 3 replicas: within 10 % of 3.6
    assert desired_replicas(a, 3, {"p99_ttft": load}) == 3
    assert desired_replicas(a, 2, {"p99_ttft": load}) == 4  # outside it: the smallest that meets 3.6
    assert desired_replicas(a, 8, {"p99_ttft": load}) == 4
    # in `also`: the largest count any metric asks for
    b = Autoscaler("p", metric="waiting", target=4.0, min_replicas=1, max_replicas=10, also={"p99_ttft": 3.7})
    assert desired_replicas(b, 2, {"waiting": 4.0, "p99_ttft": load}) == 4     # waiting alone: 1
    assert desired_replicas(b, 2, {"waiting": 40.0, "p99_ttft": load}) == 10   # waiting: ceil(40 / 4)


def test_mu_is_the_replicas_theory_capacity():
    # one request at a time, a constant 0.1 s step: prompt 1 + output 1 is one step (mu = 10),
    # output 3 three steps (mu = 10/3); the first token needs one step (the offset)
    mu, off = replica_mu(Pool("p", ONE, 0.1), array("l", [1] * 20), array("l", [1] * 20))
    assert mu == pytest.approx(10.0) and off == pytest.approx(0.1)
    mu, off = replica_mu(Pool("p", ONE, 0.1), array("l", [1] * 20), array("l", [3] * 20))
    assert mu == pytest.approx(10 / 3) and off == pytest.approx(0.1)


def _step_up(autoscale: bool):
    """Poisson 5 req/s, then 25 req/s from t = 60 s; replicas of mu = 10 req/s (one request at a
    time, 0.1 s each); two replicas to start (unstable after the step without more)."""
    reqs = Workload("piecewise:5@0,25@60", prompt="fixed:1", output="fixed:1").generate(seed=3, duration=240)
    scalers = [Autoscaler("p", metric="p99_ttft", target=1.0, interval_s=5.0, provisioning_delay_s=10.0,
                          cooldown_s=300.0, min_replicas=2, max_replicas=8)] if autoscale else []
    spec = FleetSpec(pools=[Pool("p", ONE, 0.1, 2)], autoscalers=scalers)
    return simulate_fleet(spec, reqs, options=SimOptions(seed=5, horizon_s=240))


def test_the_p99_autoscaler_follows_a_step_up_in_arrivals():
    res = _step_up(True)
    ev = res.fleet["scale_events"]
    # nothing before the step (two replicas at rho = 0.25 predict 0.15 s + 0.1 s), then up
    assert ev and ev[0][0] >= 60.0 and ev[0][3] > ev[0][2] == 2
    # lam = 25, mu = 10: three replicas predict 0.6 s (Erlang C 0.70, d = 5) without a backlog;
    # the backlog gathered during the first evaluation's window asks for more
    top = max(e[3] for e in ev)
    assert 3 <= top <= 8
    r = res.requests
    ok = r["status"] == "ok"
    ttft = r["first_token_s"] - r["arrival_s"]
    after = ok & (r["arrival_s"] >= 120.0)
    none = _step_up(False).requests
    ttft0 = none["first_token_s"] - none["arrival_s"]
    after0 = (none["status"] == "ok") & (none["arrival_s"] >= 120.0)
    p99, p99_none = np.percentile(ttft[after], 99), np.percentile(ttft0[after0], 99)
    # two replicas at 25 req/s (rho = 1.25) pile up; the scaled pool serves within the target
    assert p99 < 1.0 and p99_none > 10.0 > 10 * p99
    # same seed, same run
    again = _step_up(True)
    assert again.fleet["scale_events"] == ev
    assert np.array_equal(again.requests["first_token_s"], r["first_token_s"], equal_nan=True)


def test_bad_p99_values_name_the_field():
    with pytest.raises(InputError, match=r"autoscalers\[0\]\.target: must be > 0"):
        FleetSpec(pools=[Pool("a", ONE, 0.1)], autoscalers=[Autoscaler("a", metric="p99_ttft", target=-2.0)])
    with pytest.raises(InputError, match=r"autoscalers\[0\]\.also\.p99_ttft: must be > 0"):
        FleetSpec(pools=[Pool("a", ONE, 0.1)], autoscalers=[Autoscaler("a", also={"p99_ttft": 0})])
    with pytest.raises(InputError, match=r"autoscalers\[0\]\.metric: unknown metric 'p99'.*p99_ttft"):
        FleetSpec(pools=[Pool("a", ONE, 0.1)], autoscalers=[Autoscaler("a", metric="p99")])
