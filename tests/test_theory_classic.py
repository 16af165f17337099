"""Tests of llmqueue.theory.classic against textbook values, exact rational arithmetic, and
small seeded Monte Carlo simulations written here (checked within 99% batch-means CIs)."""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from llmqueue.errors import InputError, UnstableError
from llmqueue.theory.classic import (
    QUANTILES,
    erlang_b,
    erlang_c,
    gg1_kingman,
    ggc_allen_cunneen,
    md1,
    mg1,
    mm1,
    mmc,
    mmc_response_quantile,
    mmc_response_tail,
    mmc_wait_quantile,
    mmc_wait_tail,
    mmck,
    mmck_distribution,
)

# --- independent reference formulas ---------------------------------------------------------------


def erlang_b_exact(a: Fraction, c: int) -> Fraction:
    """Erlang B from its definition, (a^c/c!) / sum_{k<=c} a^k/k!, in exact arithmetic."""
    terms = [a**k / math.factorial(k) for k in range(c + 1)]
    return terms[c] / sum(terms)


def erlang_c_exact(a: Fraction, c: int) -> Fraction:
    """Erlang C from the textbook P0 formula (Gross et al. 2008, eq. 2.30), exact."""
    rho = a / c
    top = a**c / math.factorial(c) / (1 - rho)
    p0 = 1 / (sum(a**k / math.factorial(k) for k in range(c)) + top)
    return top * p0


def erlang_c_logspace(a: float, c: int) -> float:
    """Erlang C for large c from log-weights (independent of the library's B recursion)."""
    rho = a / c
    logs = [k * math.log(a) - math.lgamma(k + 1) for k in range(c)]
    logs.append(c * math.log(a) - math.lgamma(c + 1) - math.log1p(-rho))
    m = max(logs)
    z = sum(math.exp(x - m) for x in logs)
    return math.exp(logs[-1] - m) / z


# --- textbook values: M/M/1, M/D/1, M/G/1 ---------------------------------------------------------


def test_mm1_textbook():
    r = mm1(lam=8, mu=10)
    assert r.rho == pytest.approx(0.8)
    assert r.L == pytest.approx(4.0)
    assert r.Lq == pytest.approx(3.2)
    assert r.W == pytest.approx(0.5)
    assert r.Wq == pytest.approx(0.4)
    assert r.P_wait == pytest.approx(0.8)
    assert r.stable is True
    # T ~ Exp(mu - lam): median ln 2 / 2, p99 ln 100 / 2.
    assert r.W_p50 == pytest.approx(math.log(2) / 2)
    assert r.W_p99 == pytest.approx(math.log(100) / 2)
    # P(Wq > t) = rho e^{-(mu-lam) t}: p90 solves 0.8 e^{-2t} = 0.1.
    assert r.Wq_p90 == pytest.approx(math.log(8) / 2)
    assert r.Wq_p50 == pytest.approx(math.log(1.6) / 2)


def test_mm1_little_law_and_seed001():
    r = mm1(lam=3.5, mu=4.0)
    assert r.W == pytest.approx(1 / (4.0 - 3.5))  # seed 001: W = 1/(mu - lam)
    assert r.L == pytest.approx(r.lam * r.W)
    assert r.Lq == pytest.approx(r.lam * r.Wq)
    assert r.W == pytest.approx(r.Wq + 1 / r.mu)


def test_md1_half_of_mm1():
    assert md1(lam=8, mu=10).Wq == pytest.approx(0.2)
    for lam, mu in [(8, 10), (0.3, 1), (99, 100)]:
        assert md1(lam=lam, mu=mu).Wq == pytest.approx(mm1(lam=lam, mu=mu).Wq / 2)
    r = md1(lam=8, mu=10)
    assert r.model == "M/D/1" and r.scv_s == 0
    assert r.W == pytest.approx(0.3) and r.L == pytest.approx(2.4) and r.Lq == pytest.approx(1.6)


def test_mg1_pollaczek_khinchine():
    # scv_s = 1 is M/M/1, scv_s = 0 is M/D/1.
    m = mm1(lam=8, mu=10)
    g = mg1(lam=8, mu=10, scv_s=1)
    for f in ("rho", "L", "Lq", "W", "Wq"):
        assert getattr(g, f) == pytest.approx(getattr(m, f))
    assert mg1(lam=8, mu=10, scv_s=0).Wq == pytest.approx(md1(lam=8, mu=10).Wq)
    # lam E[S^2] / (2 (1 - rho)) with E[S^2] = (1 + scv) / mu^2.
    lam, mu, scv = 0.6, 1.5, 3.0
    es2 = (1 + scv) / mu**2
    assert mg1(lam=lam, mu=mu, scv_s=scv).Wq == pytest.approx(lam * es2 / (2 * (1 - lam / mu)))


# --- M/M/c, Erlang B and C ------------------------------------------------------------------------


def test_mmc_textbook_2_1_3():
    # a = 2, c = 3: B = 4/19 by hand, C = (4/19)/(1 - (2/3)(15/19)) = 4/9, Lq = C rho/(1-rho) = 8/9.
    assert erlang_b_exact(Fraction(2), 3) == Fraction(4, 19)
    assert erlang_c_exact(Fraction(2), 3) == Fraction(4, 9)
    r = mmc(lam=2, mu=1, c=3)
    assert r.a == pytest.approx(2.0)
    assert r.rho == pytest.approx(2 / 3)
    assert r.erlang_b == pytest.approx(4 / 19)
    assert r.P_wait == pytest.approx(4 / 9)
    assert r.Lq == pytest.approx(8 / 9)
    assert r.Wq == pytest.approx(4 / 9)
    assert r.W == pytest.approx(13 / 9)
    assert r.L == pytest.approx(26 / 9)
    assert r.Wq_p50 == 0.0  # 1 - 0.5 >= C = 4/9: more than half do not wait
    assert r.Wq_p90 == pytest.approx(math.log((4 / 9) / 0.1))  # c mu - lam = 1


def test_erlang_b_table_value():
    # Classic Erlang B table: 10 lines offered 5 erlangs block about 1.84% of calls.
    assert erlang_b(lam=5, mu=1, c=10) == pytest.approx(0.018385, abs=5e-6)
    assert erlang_b(lam=5, mu=1, c=10) == pytest.approx(float(erlang_b_exact(Fraction(5), 10)), rel=1e-12)


@pytest.mark.parametrize("a,c", [(0.5, 1), (1.7, 2), (2, 3), (7.5, 10), (19, 20), (0.01, 5), (40, 50)])
def test_mmc_matches_exact_rational_formula(a, c):
    af = Fraction(a).limit_denominator(1000)
    r = mmc(lam=float(af), mu=1.0, c=c)
    C = float(erlang_c_exact(af, c))
    assert r.P_wait == pytest.approx(C, rel=1e-11)
    assert erlang_c(lam=float(af), mu=1.0, c=c) == pytest.approx(C, rel=1e-11)
    assert r.erlang_b == pytest.approx(float(erlang_b_exact(af, c)), rel=1e-11)
    rho = float(af) / c
    assert r.Lq == pytest.approx(C * rho / (1 - rho), rel=1e-11)
    assert r.L == pytest.approx(r.lam * r.W)
    # Scaling time: same a with mu = 4 divides the times by 4, keeps the counts.
    r4 = mmc(lam=4 * float(af), mu=4.0, c=c)
    assert r4.P_wait == pytest.approx(r.P_wait, rel=1e-12)
    assert r4.Wq == pytest.approx(r.Wq / 4, rel=1e-12)
    assert r4.W_p99 == pytest.approx(r.W_p99 / 4, rel=1e-9)


def test_erlang_b_c_consistency():
    for a, c in [(2.0, 3), (9.0, 12), (0.3, 1), (95.0, 100)]:
        B = erlang_b(lam=a, mu=1, c=c)
        C = erlang_c(lam=a, mu=1, c=c)
        assert C == pytest.approx(c * B / (c - a * (1 - B)), rel=1e-12)
        assert B < C < 1
    # c = 1: B = a/(1+a), C = rho.
    assert erlang_b(lam=0.25, mu=1, c=1) == pytest.approx(0.2)
    assert erlang_c(lam=0.25, mu=1, c=1) == pytest.approx(0.25)


@pytest.mark.parametrize("a,c", [(1950.0, 2000), (4990.0, 5000), (100.0, 3000)])
def test_mmc_large_c_is_finite_and_matches_logspace(a, c):
    r = mmc(lam=a, mu=1.0, c=c)
    assert 0.0 <= r.P_wait < 1.0
    assert r.P_wait == pytest.approx(erlang_c_logspace(a, c), rel=1e-9, abs=1e-300)
    for f in ("L", "Lq", "W", "Wq", "W_p99", "Wq_p99"):
        assert math.isfinite(getattr(r, f))


def test_mm1_equals_mmc_with_one_server():
    a, b = mm1(lam=8, mu=10), mmc(lam=8, mu=10, c=1)
    for f in ("rho", "L", "Lq", "W", "Wq", "P_wait", *(f"{w}_p{int(round(p * 100))}" for w in ("W", "Wq")
                                                      for p in QUANTILES)):
        assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-10, abs=1e-15), f


# --- M/M/c wait and response-time distributions ---------------------------------------------------


def test_response_tail_m_m_1_is_exponential():
    r = mmc(lam=3, mu=5, c=1)
    for t in (0.0, 0.1, 0.7, 3.0):
        assert mmc_response_tail(r, t) == pytest.approx(math.exp(-2 * t), rel=1e-12)
        assert mmc_wait_tail(r, t) == pytest.approx(0.6 * math.exp(-2 * t), rel=1e-12)


def _tail_by_quadrature(lam, mu, c, t, n=400_001):
    """P(T > t) = (1-C) e^{-mu t} + C [e^{-d t} + int_0^t d e^{-d s} e^{-mu (t-s)} ds], numerically."""
    C = float(erlang_c_exact(Fraction(lam).limit_denominator(10**6) / Fraction(mu).limit_denominator(10**6), c))
    d = c * mu - lam
    s = np.linspace(0.0, t, n)
    f = d * np.exp(-d * s) * np.exp(-mu * (t - s))
    integral = float(np.sum((f[1:] + f[:-1]) * np.diff(s)) / 2)
    return (1 - C) * math.exp(-mu * t) + C * (math.exp(-d * t) + integral)


@pytest.mark.parametrize("lam,mu,c", [(2, 1, 3), (1, 1, 2), (7, 1, 8), (0.5, 2, 4)])
def test_response_tail_against_quadrature(lam, mu, c):
    # (1, 1, 2) is the limit case c mu - lam == mu.
    for t in (0.3, 1.0, 4.0):
        assert mmc_response_tail(lam=lam, mu=mu, c=c, t=t) == pytest.approx(_tail_by_quadrature(lam, mu, c, t),
                                                                            rel=1e-8)


def test_response_tail_continuous_through_limit_case():
    # c mu - lam == mu exactly (lam = 1, mu = 1, c = 2), and a hair either side.
    t = 1.3
    exact = mmc_response_tail(lam=1.0, mu=1.0, c=2, t=t)
    C = 1 / 3
    assert exact == pytest.approx(math.exp(-t) * (1 + C * t), rel=1e-14)
    for eps in (1e-12, 1e-9, 1e-6):
        for lam in (1.0 - eps, 1.0 + eps):
            assert mmc_response_tail(lam=lam, mu=1.0, c=2, t=t) == pytest.approx(exact, rel=10 * eps + 1e-12)


@pytest.mark.parametrize("lam,mu,c", [(2, 1, 3), (1, 1, 2), (9.5, 1, 10), (0.2, 1, 1), (1950, 1, 2000)])
def test_quantiles_invert_tails(lam, mu, c):
    r = mmc(lam=lam, mu=mu, c=c)
    for p in (0.5, 0.9, 0.95, 0.99, 0.999):
        q = mmc_response_quantile(r, p)
        assert mmc_response_tail(r, q) == pytest.approx(1 - p, rel=1e-9)
        assert q >= 1 / mu * -math.log1p(-p) - 1e-12  # at least the service-time quantile
        qw = mmc_wait_quantile(r, p)
        if 1 - p >= r.P_wait:
            assert qw == 0.0
        else:
            assert mmc_wait_tail(r, qw) == pytest.approx(1 - p, rel=1e-12)
    assert (r.W_p50, r.W_p90, r.W_p95, r.W_p99) == tuple(r.response_quantile(p) for p in QUANTILES)
    assert (r.Wq_p50, r.Wq_p90, r.Wq_p95, r.Wq_p99) == tuple(r.wait_quantile(p) for p in QUANTILES)
    assert r.W_p50 < r.W_p90 < r.W_p95 < r.W_p99


def test_quantile_calling_forms():
    r = mmc(lam=2, mu=1, c=3)
    assert mmc_wait_quantile(r, 0.9) == mmc_wait_quantile(p=0.9, lam=2, mu=1, c=3)
    assert mmc_response_quantile(r, 0.99) == pytest.approx(mmc_response_quantile(p=0.99, lam=2, mu=1, c=3))
    assert r.response_tail(1.0) == mmc_response_tail(r, 1.0) == mmc_response_tail(t=1.0, lam=2, mu=1, c=3)
    m = mm1(lam=8, mu=10)
    assert mmc_response_quantile(m, 0.99) == pytest.approx(math.log(100) / 2, rel=1e-10)
    with pytest.raises(InputError):
        mmc_wait_quantile(r, 0.9, lam=2, mu=1, c=3)  # both a result and parameters
    with pytest.raises(InputError):
        mmc_wait_quantile(p=0.9, lam=2, mu=1)  # c missing
    with pytest.raises(InputError) as e:
        mmc_wait_quantile(md1(lam=1, mu=2), 0.9)  # M/D/1 has no such closed form here
    assert e.value.field == "result"
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(InputError) as e:
            mmc_response_quantile(r, bad)
        assert e.value.field == "p"
    with pytest.raises(InputError) as e:
        mmc_wait_tail(r, -1.0)
    assert e.value.field == "t"
    with pytest.raises(UnstableError):
        mmc_response_quantile(p=0.9, lam=3, mu=1, c=3)


# --- M/M/c/K --------------------------------------------------------------------------------------


@pytest.mark.parametrize("a,c", [(2.0, 3), (5.0, 10), (12.0, 10), (0.1, 1), (300.0, 250)])
def test_mmck_with_K_equal_c_is_erlang_b_loss(a, c):
    r = mmck(lam=a, mu=1.0, c=c, K=c)
    assert r.P_block == pytest.approx(float(erlang_b_exact(Fraction(a), c)), rel=1e-10)
    assert r.P_block == pytest.approx(erlang_b(lam=a, mu=1.0, c=c), rel=1e-10)
    assert r.Lq == 0 and r.Wq == 0 and r.P_wait == 0
    assert r.W == pytest.approx(1.0)  # no waiting: W is one service time
    assert r.L == pytest.approx(a * (1 - r.P_block))  # carried load in erlangs


@pytest.mark.parametrize("rho,K", [(0.5, 4), (0.9, 10), (1.3, 7), (2.0, 3)])
def test_mm1k_closed_form(rho, K):
    pi = mmck_distribution(lam=rho, mu=1.0, c=1, K=K)
    expect = [(1 - rho) * rho**n / (1 - rho ** (K + 1)) for n in range(K + 1)]
    assert pi == pytest.approx(expect, rel=1e-12)
    r = mmck(lam=rho, mu=1.0, c=1, K=K)
    assert r.P_block == pytest.approx(expect[-1], rel=1e-12)
    assert r.P0 == pytest.approx(expect[0], rel=1e-12)
    # Textbook L for M/M/1/K.
    L = rho / (1 - rho) - (K + 1) * rho ** (K + 1) / (1 - rho ** (K + 1))
    assert r.L == pytest.approx(L, rel=1e-10)
    assert r.lam_eff == pytest.approx(rho * (1 - expect[-1]), rel=1e-12)
    assert r.L == pytest.approx(r.lam_eff * r.W, rel=1e-12)


def test_mm1k_at_rho_one_is_uniform():
    pi = mmck_distribution(lam=3.0, mu=3.0, c=1, K=9)
    assert pi == pytest.approx([0.1] * 10, rel=1e-12)
    r = mmck(lam=3.0, mu=3.0, c=1, K=9)
    assert r.L == pytest.approx(4.5) and r.P_block == pytest.approx(0.1)


def test_mmck_tends_to_mmc_as_K_grows():
    for lam, mu, c in [(2, 1, 3), (9, 1, 10), (0.8, 1, 1)]:
        inf = mmc(lam=lam, mu=mu, c=c)
        big = mmck(lam=lam, mu=mu, c=c, K=2000)
        assert big.P_block < 1e-30
        for f in ("L", "Lq", "W", "Wq", "P_wait"):
            assert getattr(big, f) == pytest.approx(getattr(inf, f), rel=1e-9)
        # Finite K converges from below, monotonically.
        Ls = [mmck(lam=lam, mu=mu, c=c, K=K).L for K in (c, c + 5, c + 20, c + 100)]
        assert Ls == sorted(Ls) and Ls[-1] <= inf.L + 1e-12


def test_mmck_large_K_overloaded_no_overflow():
    r = mmck(lam=12, mu=10, c=1, K=10_000)
    assert r.P_block == pytest.approx(1 - 1 / 1.2, rel=1e-9)  # pi_K -> 1 - 1/rho
    assert r.lam_eff == pytest.approx(10.0, rel=1e-9)  # the server carries all it can
    assert all(math.isfinite(getattr(r, f)) for f in ("L", "Lq", "W", "Wq", "P0"))
    r = mmck(lam=1e6, mu=1.0, c=2, K=10)  # blocking very close to 1
    assert r.lam_eff == pytest.approx(2.0, rel=1e-5)
    r = mmck(lam=50, mu=1, c=400, K=10_000)  # mostly empty, tiny tail probabilities
    assert r.P_block == 0.0 or r.P_block < 1e-300
    assert r.L == pytest.approx(50.0, rel=1e-12)


def test_mmck_identities():
    lam, mu, c, K = 7.0, 0.9, 6, 15
    pi = mmck_distribution(lam=lam, mu=mu, c=c, K=K)
    r = mmck(lam=lam, mu=mu, c=c, K=K)
    assert math.fsum(pi) == pytest.approx(1.0, abs=1e-14)
    busy = math.fsum(min(n, c) * p for n, p in enumerate(pi))
    assert r.lam_eff == pytest.approx(mu * busy, rel=1e-12)  # flow balance: carried = served
    assert r.rho_eff == pytest.approx(busy / c, rel=1e-12)
    assert r.L == pytest.approx(r.Lq + busy, rel=1e-12)
    assert r.W == pytest.approx(r.Wq + 1 / mu, rel=1e-12)
    # Detailed balance lam pi_n = min(n+1, c) mu pi_{n+1}.
    for n in range(K):
        assert lam * pi[n] == pytest.approx(min(n + 1, c) * mu * pi[n + 1], rel=1e-12)
    assert r.stable is True and r.rho > 1  # overloaded yet stable: finite capacity


# --- G/G/1 and G/G/c approximations ---------------------------------------------------------------


def test_kingman_special_cases():
    k = gg1_kingman(lam=8, mu=10, scv_a=1, scv_s=1)
    m = mm1(lam=8, mu=10)
    for f in ("rho", "L", "Lq", "W", "Wq"):
        assert getattr(k, f) == pytest.approx(getattr(m, f))
    assert k.exact is True and k.method == "Kingman"
    # Poisson arrivals: Kingman is the P-K formula for any scv_s.
    for scv in (0.0, 0.5, 4.0):
        assert gg1_kingman(lam=3, mu=4, scv_a=1, scv_s=scv).Wq == pytest.approx(mg1(lam=3, mu=4, scv_s=scv).Wq)
    g = gg1_kingman(lam=8, mu=10, scv_a=2, scv_s=0.5)
    assert g.Wq == pytest.approx(0.8 / 0.2 * 1.25 * 0.1)
    assert g.exact is False


def test_allen_cunneen_special_cases():
    for lam, mu, c in [(2, 1, 3), (9, 1, 10), (0.5, 1, 1)]:
        ac = ggc_allen_cunneen(lam=lam, mu=mu, c=c, scv_a=1, scv_s=1)
        m = mmc(lam=lam, mu=mu, c=c)
        for f in ("rho", "L", "Lq", "W", "Wq"):
            assert getattr(ac, f) == pytest.approx(getattr(m, f), rel=1e-12)
        assert ac.exact is True
    ac = ggc_allen_cunneen(lam=2, mu=1, c=3, scv_a=0.5, scv_s=0.0)
    assert ac.Wq == pytest.approx(mmc(lam=2, mu=1, c=3).Wq * 0.25)
    assert ac.exact is False
    # c = 1: Allen-Cunneen is Kingman.
    assert ggc_allen_cunneen(lam=3, mu=4, c=1, scv_a=2, scv_s=3).Wq == pytest.approx(
        gg1_kingman(lam=3, mu=4, scv_a=2, scv_s=3).Wq)


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("call,what", [
    (lambda: mm1(lam=12, mu=10), "M/M/1"),
    (lambda: mm1(lam=10, mu=10), "M/M/1"),
    (lambda: md1(lam=12, mu=10), "M/D/1"),
    (lambda: mg1(lam=12, mu=10, scv_s=2), "M/G/1"),
    (lambda: mmc(lam=3, mu=1, c=3), "M/M/3"),
    (lambda: erlang_c(lam=4, mu=1, c=3), "Erlang C"),
    (lambda: gg1_kingman(lam=12, mu=10, scv_a=1, scv_s=1), "Kingman"),
    (lambda: ggc_allen_cunneen(lam=40, mu=1, c=30, scv_a=1, scv_s=1), "Allen-Cunneen"),
])
def test_unstable_raises(call, what):
    with pytest.raises(UnstableError) as e:
        call()
    msg = str(e.value)
    assert "unstable" in msg and what in msg
    assert e.value.rho >= 1
    assert e.value.field == "lam"
    assert "\n" not in msg


def test_unstable_error_fields():
    with pytest.raises(UnstableError) as e:
        mmc(lam=5, mu=1, c=4)
    assert e.value.rho == pytest.approx(1.25)
    assert e.value.growth_per_s == pytest.approx(1.0)
    assert "grows 1 req/s" in str(e.value)


@pytest.mark.parametrize("field,kwargs", [
    ("lam", dict(lam=0, mu=1)),
    ("lam", dict(lam=-1, mu=1)),
    ("lam", dict(lam=float("nan"), mu=1)),
    ("lam", dict(lam=float("inf"), mu=1)),
    ("lam", dict(lam="fast", mu=1)),
    ("mu", dict(lam=1, mu=0)),
    ("mu", dict(lam=1, mu=-2)),
    ("mu", dict(lam=1, mu=float("nan"))),
])
def test_bad_rates_name_the_field(field, kwargs):
    for fn, extra in [(mm1, {}), (md1, {}), (mg1, dict(scv_s=1)), (mmc, dict(c=2)), (mmck, dict(c=2, K=4)),
                      (gg1_kingman, dict(scv_a=1, scv_s=1)), (ggc_allen_cunneen, dict(c=2, scv_a=1, scv_s=1)),
                      (erlang_b, dict(c=2)), (erlang_c, dict(c=2))]:
        with pytest.raises(InputError) as e:
            fn(**kwargs, **extra)
        assert e.value.field == field, fn.__name__
        assert str(e.value).startswith(f"{field}:")


@pytest.mark.parametrize("field,call", [
    ("c", lambda: mmc(lam=1, mu=1, c=0)),
    ("c", lambda: mmc(lam=1, mu=1, c=2.5)),
    ("c", lambda: mmc(lam=1, mu=1, c=-3)),
    ("c", lambda: mmc(lam=1, mu=1, c=float("nan"))),
    ("c", lambda: mmck(lam=1, mu=1, c=0, K=3)),
    ("K", lambda: mmck(lam=1, mu=1, c=3, K=2)),
    ("K", lambda: mmck(lam=1, mu=1, c=3, K=4.5)),
    ("K", lambda: mmck(lam=1, mu=1, c=3, K=0)),
    ("scv_s", lambda: mg1(lam=1, mu=2, scv_s=-0.1)),
    ("scv_s", lambda: mg1(lam=1, mu=2, scv_s=float("nan"))),
    ("scv_a", lambda: gg1_kingman(lam=1, mu=2, scv_a=-1, scv_s=1)),
    ("scv_a", lambda: ggc_allen_cunneen(lam=1, mu=2, c=2, scv_a=float("inf"), scv_s=1)),
    ("scv_s", lambda: ggc_allen_cunneen(lam=1, mu=2, c=2, scv_a=1, scv_s=-2)),
])
def test_bad_structure_names_the_field(field, call):
    with pytest.raises(InputError) as e:
        call()
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}:")


def test_keyword_only():
    with pytest.raises(TypeError):
        mm1(8, 10)  # type: ignore[misc]


def test_results_frozen_and_json():
    for r in (mm1(lam=8, mu=10), md1(lam=8, mu=10), mg1(lam=1, mu=2, scv_s=0.3), mmc(lam=2, mu=1, c=3),
              mmck(lam=12, mu=10, c=1, K=5), gg1_kingman(lam=1, mu=2, scv_a=2, scv_s=1),
              ggc_allen_cunneen(lam=2, mu=1, c=3, scv_a=1, scv_s=1)):
        d = r.to_dict()
        assert json.loads(json.dumps(d, allow_nan=False)) == d
        for f in ("lam", "mu", "rho", "L", "Lq", "W", "Wq", "stable"):
            assert f in d
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.lam = 1.0  # type: ignore[misc]


def test_module_is_pure_python():
    code = "import sys, llmqueue.theory.classic; print('numpy' in sys.modules, 'scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# --- Monte Carlo ----------------------------------------------------------------------------------
# Batch means: the run (after a warm-up) is cut into 20 equal batches whose means are close to
# independent; the 99% CI is mean +- t_{0.995, 19} * sd / sqrt(20). Seeds are fixed.

T_995_19 = 2.8609346064649794  # scipy.stats.t.ppf(0.995, 19)
N_BATCHES = 20


def batch_ci(x: np.ndarray) -> tuple[float, float]:
    """(mean, half-width of the 99% batch-means confidence interval)."""
    n = len(x) // N_BATCHES * N_BATCHES
    means = np.asarray(x[:n], dtype=float).reshape(N_BATCHES, -1).mean(axis=1)
    return float(means.mean()), T_995_19 * float(means.std(ddof=1)) / math.sqrt(N_BATCHES)


def assert_in_ci(x: np.ndarray, truth: float, label: str) -> None:
    m, h = batch_ci(x)
    assert abs(m - truth) <= h, f"{label}: simulated {m:.5g} +- {h:.3g} (99% CI), theory {truth:.5g}"


def simulate_mmc_fcfs(lam, mu, c, n, seed):
    """FCFS M/M/c, customer by customer: each arrival takes the server that frees first.

    Returns (wait, response) arrays. The heap of server free-times is the sorted workload
    vector of the Kiefer-Wolfowitz recursion in absolute time.
    """
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / lam, n)).tolist()
    services = rng.exponential(1 / mu, n)
    free = [0.0] * c
    wait = np.empty(n)
    for i, (a, s) in enumerate(zip(arrivals, services.tolist())):
        f = free[0]
        start = a if a > f else f
        wait[i] = start - a
        heapq.heapreplace(free, start + s)
    return wait, wait + services


@pytest.mark.parametrize("lam,mu,c,seed", [(2.0, 1.0, 3, 11), (1.0, 1.0, 2, 12)])
def test_mc_mmc_wait_and_quantiles(lam, mu, c, seed):
    r = mmc(lam=lam, mu=mu, c=c)
    warm = 5_000
    wait, resp = simulate_mmc_fcfs(lam, mu, c, 200_000 + warm, seed)
    wait, resp = wait[warm:], resp[warm:]
    assert_in_ci(wait, r.Wq, "Wq")
    assert_in_ci((wait > 0).astype(float), r.P_wait, "P_wait")
    assert_in_ci(resp, r.W, "W")
    for p, q in ((0.9, r.W_p90), (0.99, r.W_p99)):
        exceed = (resp > q).astype(float)
        assert_in_ci(exceed, 1 - p, f"P(T > theoretical p{round(p * 100)})")
        # Distribution-free bracket: the theoretical quantile lies between the empirical
        # quantiles at p -+ the CI half-width of the exceedance fraction.
        _, h = batch_ci(exceed)
        lo, hi = np.quantile(resp, [p - h, p + h])
        assert lo <= q <= hi, f"p{p}: theory {q:.4g} outside empirical [{lo:.4g}, {hi:.4g}]"
    # Wait quantile (p99 > 0 here since C > 0.01).
    exceed = (wait > r.Wq_p99).astype(float)
    assert_in_ci(exceed, 0.01, "P(Wq > theoretical p99)")


def lindley_waits(inter: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Waits of successive customers of a FCFS single-server queue starting empty.

    Lindley: W_{n+1} = max(0, W_n + S_n - A_{n+1}); vectorized as W_n = R_n - min_{k<=n} R_k with
    R the random walk of the increments S_n - A_{n+1}.
    """
    R = np.concatenate([[0.0], np.cumsum(service[:-1] - inter[1:])])
    return R - np.minimum.accumulate(R)


@pytest.mark.parametrize("scv_s,seed", [(0.0, 21), (0.5, 22), (2.0, 23)])
def test_mc_mg1_pollaczek_khinchine(scv_s, seed):
    lam, mu, n, warm = 0.7, 1.0, 1_000_000, 10_000
    rng = np.random.default_rng(seed)
    inter = rng.exponential(1 / lam, n + warm)
    if scv_s == 0:
        service = np.full(n + warm, 1 / mu)
    else:  # gamma with mean 1/mu and SCV 1/shape
        shape = 1 / scv_s
        service = rng.gamma(shape, 1 / (mu * shape), n + warm)
    w = lindley_waits(inter, service)[warm:]
    r = mg1(lam=lam, mu=mu, scv_s=scv_s)
    assert_in_ci(w, r.Wq, f"M/G/1 Wq (scv_s={scv_s})")
    assert_in_ci((w > 0).astype(float), r.P_wait, "M/G/1 P_wait")
    if scv_s == 0:
        assert_in_ci(w, md1(lam=lam, mu=mu).Wq, "M/D/1 Wq")


def simulate_mmck_uniformized(lam, mu, c, K, steps, seed):
    """Jump chain of the uniformized M/M/c/K CTMC (rate lam + c mu per step).

    Each step is an arrival with probability lam/Lambda, independent of the state, so the
    fraction of arrivals that find K present estimates P_block; the state seen at each step is a
    sample of the time-stationary distribution (its mean estimates L).
    Returns (blocked indicator per arrival, state per step).
    """
    rng = np.random.default_rng(seed)
    total = lam + c * mu
    u = (rng.random(steps) * total).tolist()
    n = 0
    blocked, states = [], []
    for x in u:
        states.append(n)
        if x < lam:
            if n == K:
                blocked.append(1.0)
            else:
                blocked.append(0.0)
                n += 1
        elif x < lam + (n if n < c else c) * mu:
            n -= 1
    return np.array(blocked), np.array(states, dtype=float)


@pytest.mark.parametrize("lam,mu,c,K,seed", [(5.0, 1.0, 4, 8, 31), (3.0, 1.0, 4, 6, 32)])
def test_mc_mmck_blocking(lam, mu, c, K, seed):
    r = mmck(lam=lam, mu=mu, c=c, K=K)
    blocked, states = simulate_mmck_uniformized(lam, mu, c, K, 300_000, seed)
    assert_in_ci(blocked[1_000:], r.P_block, "P_block")
    assert_in_ci(states[1_000:], r.L, "L")
