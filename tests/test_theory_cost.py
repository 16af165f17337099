"""Tests of llmqueue.theory.cost: token economics (seed 003, 7), error budgets (9.3), replicas.
Expected values are computed by hand in the comments."""

from __future__ import annotations

import json
import math

import pytest

from llmqueue.errors import InputError
from llmqueue.theory.cost import (
    dollars_per_million_tokens,
    error_budget,
    replicas_for_utilization,
    token_cost,
    tokens_per_dollar,
)

# --- tokens per dollar ------------------------------------------------------------------------------


def test_tokens_per_dollar_seed_formula():
    # 3600 * 2500 / 8 = 1,125,000 tokens per dollar
    assert tokens_per_dollar(Q=2500, C_hour=8) == pytest.approx(1_125_000)
    # 8 * 1e6 / (3600 * 2500) = 0.8889 $ per million tokens
    assert dollars_per_million_tokens(Q=2500, C_hour=8) == pytest.approx(8 / 9)
    assert dollars_per_million_tokens(Q=2500, C_hour=8, u=0.5) == pytest.approx(16 / 9)


def test_token_cost_full_and_effective():
    r = token_cost(Q=2500, C_hour=8, u=0.5)
    assert r.tokens_per_dollar == pytest.approx(1_125_000)
    assert r.dollars_per_Mtok == pytest.approx(0.888888889)
    assert r.tokens_per_dollar_eff == pytest.approx(562_500)
    assert r.dollars_per_Mtok_eff == pytest.approx(1.777777778)
    assert r.dollars_per_token_eff == pytest.approx(1.777777778e-6)
    # the two views are reciprocal: (tokens/$) * ($/token) = 1
    assert r.tokens_per_dollar * r.dollars_per_Mtok / 1e6 == pytest.approx(1.0)
    assert r.tokens_per_dollar_eff * r.dollars_per_token_eff == pytest.approx(1.0)


def test_token_cost_h100_example():
    # 8 GPUs at $2.50/h = $20/h; 10,000 tokens/s -> 36e6 tokens/h -> 1.8e6 tokens/$, $0.556 per 1M
    r = token_cost(Q=10_000, C_hour=20)
    assert r.u == 1.0
    assert r.tokens_per_dollar == pytest.approx(1.8e6)
    assert r.dollars_per_Mtok == pytest.approx(20 / 36)
    assert r.dollars_per_Mtok_eff == r.dollars_per_Mtok


@pytest.mark.parametrize("kwargs,field", [
    (dict(Q=0, C_hour=8), "Q"),
    (dict(Q=-5, C_hour=8), "Q"),
    (dict(Q=float("nan"), C_hour=8), "Q"),
    (dict(Q=2500, C_hour=0), "C_hour"),
    (dict(Q=2500, C_hour=float("inf")), "C_hour"),
    (dict(Q=2500, C_hour=8, u=0), "u"),
    (dict(Q=2500, C_hour=8, u=1.2), "u"),
    (dict(Q=2500, C_hour=8, u=float("nan")), "u"),
])
def test_token_cost_rejects(kwargs, field):
    with pytest.raises(InputError) as e:
        token_cost(**kwargs)
    assert e.value.field == field


# --- error budget -----------------------------------------------------------------------------------


def test_error_budget_count():
    # 99.9% of 1,000,000 requests: 1,000 may be bad; 250 bad burn 25% and leave 750
    r = error_budget(slo_target=0.999, N=1_000_000, bad=250)
    assert r.allowed == 1000.0
    assert r.burned == pytest.approx(0.25)
    assert r.remaining == pytest.approx(750)
    assert r.exhausted is False
    assert r.lam is None and r.window is None and r.downtime is None


def test_error_budget_rate_window():
    # 100 req/s for 30 days = 259.2M requests; 0.1% = 259,200 bad; 0.1% of 30 days = 2,592 s = 43.2 min
    r = error_budget(slo_target=0.999, lam=100, window=30 * 86400)
    assert r.N == pytest.approx(259_200_000)
    assert r.allowed == pytest.approx(259_200)
    assert r.downtime == pytest.approx(2592) and r.downtime / 60 == pytest.approx(43.2)
    assert r.bad is None and r.burned is None and r.remaining is None and r.exhausted is None
    d = json.loads(json.dumps(r.to_dict()))
    assert d["burned"] is None


def test_error_budget_count_with_window():
    r = error_budget(slo_target=0.99, N=3600, window=3600)
    assert r.lam == pytest.approx(1.0) and r.allowed == pytest.approx(36) and r.downtime == pytest.approx(36)


def test_error_budget_overspent_and_exact():
    r = error_budget(slo_target=0.999, N=1_000_000, bad=1500)
    assert r.burned == pytest.approx(1.5) and r.remaining == pytest.approx(-500) and r.exhausted is True
    r = error_budget(slo_target=0.999, N=1_000_000, bad=1000)
    assert r.burned == pytest.approx(1.0) and r.remaining == pytest.approx(0) and r.exhausted is True
    r = error_budget(slo_target=0.95, N=200, bad=0)
    assert r.allowed == pytest.approx(10) and r.burned == 0 and r.remaining == pytest.approx(10)


@pytest.mark.parametrize("kwargs,field", [
    (dict(slo_target=0.999), "N"),                                  # nothing about the window
    (dict(slo_target=0.999, N=100, lam=1, window=100), "N"),        # both
    (dict(slo_target=0.999, lam=10), "window"),                     # rate without window
    (dict(slo_target=0.999, N=0), "N"),
    (dict(slo_target=0.999, N=-10), "N"),
    (dict(slo_target=0.999, N=float("nan")), "N"),
    (dict(slo_target=0.999, lam=0, window=10), "lam"),
    (dict(slo_target=0.999, lam=10, window=-1), "window"),
    (dict(slo_target=1.0, N=100), "slo_target"),
    (dict(slo_target=0, N=100), "slo_target"),
    (dict(slo_target=float("nan"), N=100), "slo_target"),
    (dict(slo_target=0.999, N=100, bad=-1), "bad"),
    (dict(slo_target=0.999, N=100, bad=101), "bad"),
])
def test_error_budget_rejects(kwargs, field):
    with pytest.raises(InputError) as e:
        error_budget(**kwargs)
    assert e.value.field == field


# --- replicas ---------------------------------------------------------------------------------------


def test_replicas_by_hand():
    # 300 / (100 * 0.7) = 4.29 -> 5 replicas at 300 / 500 = 0.6; 4 are needed for stability
    r = replicas_for_utilization(lam=300, mu=100, rho_target=0.7)
    assert (r.c, r.rho, r.c_stable, r.a) == (5, pytest.approx(0.6), 4, pytest.approx(3.0))
    assert r.rho * r.c * r.mu == pytest.approx(r.lam)


def test_replicas_exact_boundaries():
    # 300 / (100 * 0.75) = 4 exactly: 4 replicas run at exactly 0.75
    r = replicas_for_utilization(lam=300, mu=100, rho_target=0.75)
    assert r.c == 4 and r.rho == pytest.approx(0.75)
    # 3 replicas would run at rho = 1: not stable, so c_stable = 4
    assert r.c_stable == 4
    assert replicas_for_utilization(lam=250, mu=100, rho_target=0.75).c_stable == 3
    assert replicas_for_utilization(lam=0.3, mu=0.1, rho_target=0.75).c == 4


def test_replicas_small_load():
    r = replicas_for_utilization(lam=1, mu=100, rho_target=0.75)
    assert r.c == 1 and r.rho == pytest.approx(0.01) and r.c_stable == 1
    assert replicas_for_utilization(lam=1, mu=100).rho_target == 0.75


@pytest.mark.parametrize("kwargs,field", [
    (dict(lam=0, mu=100, rho_target=0.7), "lam"),
    (dict(lam=float("nan"), mu=100, rho_target=0.7), "lam"),
    (dict(lam=300, mu=-1, rho_target=0.7), "mu"),
    (dict(lam=300, mu=100, rho_target=1.0), "rho_target"),
    (dict(lam=300, mu=100, rho_target=0), "rho_target"),
])
def test_replicas_reject(kwargs, field):
    with pytest.raises(InputError) as e:
        replicas_for_utilization(**kwargs)
    assert e.value.field == field


def test_results_are_frozen_and_plain():
    r = token_cost(Q=1, C_hour=1)
    with pytest.raises(Exception):
        r.Q = 2  # type: ignore[misc]
    assert set(r.to_dict()) >= {"Q", "C_hour", "u", "tokens_per_dollar", "dollars_per_Mtok"}
    assert not any(isinstance(v, float) and math.isnan(v) for v in r.to_dict().values())
