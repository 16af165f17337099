"""Arrival processes: KS tests of inter-arrival laws, rates, dispersion, n/horizon semantics."""

import math

import numpy as np
import pytest
from scipy import stats

from llmqueue.errors import InputError
from llmqueue.workload import Deterministic, Gamma, OnOff, Poisson, parse_arrival

SEEDS = [0, 1, 2, 3, 4]


def gaps(proc, seed, n=3000):
    t = proc.sample_times(np.random.default_rng(seed), n=n)
    return np.diff(t, prepend=0.0)


# -- renewal processes: the inter-arrival law -----------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_poisson_gaps_are_exponential(seed):
    p = Poisson(5.0)
    assert stats.kstest(gaps(p, seed), "expon", args=(0, 1 / 5.0)).pvalue > 0.001


@pytest.mark.parametrize("cv", [2.0, 0.5])
@pytest.mark.parametrize("seed", SEEDS)
def test_gamma_gaps_have_the_right_shape_and_scale(cv, seed):
    g = Gamma(8.0, cv)
    assert g.shape == pytest.approx(1 / cv ** 2) and g.scale == pytest.approx(cv ** 2 / 8.0)
    x = gaps(g, seed)
    assert stats.kstest(x, "gamma", args=(1 / cv ** 2, 0, cv ** 2 / 8.0)).pvalue > 0.001


def test_ks_rejects_the_wrong_law():
    # the check above can fail: bursty gamma gaps are not exponential, even with the right mean
    x = gaps(Gamma(8.0, 2.0), 0)
    assert stats.kstest(x, "expon", args=(0, 1 / 8.0)).pvalue < 1e-6
    y = gaps(Poisson(8.0), 0)
    assert stats.kstest(y, "gamma", args=(0.25, 0, 0.5)).pvalue < 1e-6


def test_gamma_cv_one_is_poisson():
    g = Gamma(3.0, 1.0)
    assert (g.scv, g.idc) == (1.0, 1.0)
    assert stats.kstest(gaps(g, 7), "expon", args=(0, 1 / 3.0)).pvalue > 0.001


@pytest.mark.parametrize("proc", [Poisson(4.0), Gamma(4.0, 3.0), Gamma(4.0, 0.3)])
def test_renewal_gap_mean_and_scv(proc):
    x = gaps(proc, 21, n=200_000)
    assert abs(x.mean() - 1 / proc.rate) < 5 * math.sqrt(proc.scv) / proc.rate / math.sqrt(x.size)
    assert x.var() / x.mean() ** 2 == pytest.approx(proc.scv, rel=0.05)


def test_deterministic_exact_spacing():
    d = Deterministic(4.0)
    t = d.sample_times(np.random.default_rng(0), n=1000)
    assert np.array_equal(t, np.arange(1, 1001) / 4.0)
    assert np.allclose(np.diff(t), 0.25, rtol=0, atol=1e-12)
    assert d.sample_times(n=3).tolist() == [0.25, 0.5, 0.75]
    h = Deterministic(2.0).sample_times(horizon=5.0)
    assert h.tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]  # [0, horizon): 5.0 excluded
    assert (d.scv, d.idc) == (0.0, 0.0)
    assert parse_arrival("fixed:4") == d


# -- n versus horizon ------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["poisson:50", "gamma:50:cv=3", "deterministic:50",
                                  "onoff:100:on=2:off=2", "onoff:80:on=1:off=3:rate_off=5"])
def test_n_and_horizon_semantics(spec):
    a = parse_arrival(spec)
    t = a.sample_times(np.random.default_rng(1), n=5000)
    assert t.size == 5000 and t.dtype == np.float64
    assert np.all(np.diff(t) >= 0) and t[0] >= 0
    h = a.sample_times(np.random.default_rng(1), horizon=200.0)
    assert np.all(h < 200.0) and np.all(np.diff(h) >= 0) and h[0] >= 0
    # count in [0, 200): mean lam*200, variance about idc * lam * 200
    assert abs(h.size - a.rate * 200) < 6 * math.sqrt(max(a.idc, 1.0) * a.rate * 200) + 1
    assert a.sample_times(np.random.default_rng(1), n=0).size == 0
    for bad in ({}, {"n": 5, "horizon": 1.0}, {"n": -1}, {"horizon": 0.0}, {"horizon": math.nan},
                {"n": 2.5}):
        with pytest.raises(InputError):
            a.sample_times(np.random.default_rng(1), **bad)


@pytest.mark.parametrize("spec", ["poisson:7", "gamma:7:cv=4", "gamma:7:cv=0.2"])
def test_renewal_horizon_is_prefix_of_n(spec):
    a = parse_arrival(spec)
    t = a.sample_times(np.random.default_rng(3), n=20_000)
    h = a.sample_times(np.random.default_rng(3), horizon=float(t[12_345]))
    assert h.size == 12_345 and np.array_equal(h, t[:12_345])


def test_horizon_with_many_chunks():
    # a horizon far beyond one chunk's expectation still returns every arrival before it
    g = Gamma(1.0, 10.0)
    h = g.sample_times(np.random.default_rng(5), horizon=50_000.0)
    t = g.sample_times(np.random.default_rng(5), n=h.size + 1)
    assert np.array_equal(h, t[:-1]) and t[-1] >= 50_000.0


# -- on/off (MMPP-2) ------------------------------------------------------------------------------

def mmpp_idc(lam1, lam2, r1, r2, t):
    """Finite-window index of dispersion of a stationary 2-state MMPP (textbook derivation:
    Var N(t) = lam t + 2 s2/a (t - (1 - e^{-a t})/a), rate-process variance s2, decay a)."""
    a = r1 + r2
    p1 = r2 / a
    lam = lam1 * p1 + lam2 * (1 - p1)
    s2 = (lam1 - lam2) ** 2 * p1 * (1 - p1)
    return 1 + 2 * s2 / (a * lam) * (1 - (1 - math.exp(-a * t)) / (a * t))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_onoff_rate_and_dispersion(seed):
    a = OnOff(10.0, on=5.0, off=5.0)
    assert a.rate == 5.0
    assert a.idc == pytest.approx(mmpp_idc(10.0, 0.0, 0.2, 0.2, 1e12), rel=1e-6)
    assert a.idc > 1
    T, w = 40_000.0, 100.0
    t = a.sample_times(np.random.default_rng(seed), horizon=T)
    assert abs(t.size / T - 5.0) < 4 * math.sqrt(a.idc * 5.0 * T) / T
    counts = np.bincount((t // w).astype(int), minlength=int(T / w))
    idc = counts.var(ddof=1) / counts.mean()
    assert idc == pytest.approx(mmpp_idc(10.0, 0.0, 0.2, 0.2, w), rel=0.25)
    assert idc > 5


def test_onoff_long_run_rate_with_rate_off():
    a = parse_arrival("onoff:20:on=30:off=90:rate_off=2")
    assert a.rate == pytest.approx((20 * 30 + 2 * 90) / 120)
    t = a.sample_times(np.random.default_rng(8), n=300_000)
    assert abs(t.size / t[-1] - a.rate) < 4 * math.sqrt(a.idc * a.rate * t[-1]) / t[-1]


@pytest.mark.parametrize("spec", ["onoff:10:on=5:off=5", "onoff:50:on=0.2:off=1:rate_off=3"])
def test_onoff_gap_scv_matches_phase_type_formula(spec):
    a = parse_arrival(spec)
    x = gaps(a, 4, n=300_000)
    assert x.mean() == pytest.approx(1 / a.rate, rel=0.03)
    assert x.var() / x.mean() ** 2 == pytest.approx(a.scv, rel=0.08)
    assert a.scv > 1


def test_onoff_with_equal_rates_is_poisson():
    a = OnOff(6.0, on=2.0, off=3.0, rate_off=6.0)
    assert a.rate == pytest.approx(6.0)
    assert a.scv == pytest.approx(1.0) and a.idc == pytest.approx(1.0)
    assert stats.kstest(gaps(a, 2), "expon", args=(0, 1 / 6.0)).pvalue > 0.001


def test_onoff_interrupted_poisson_gaps_are_not_exponential():
    a = OnOff(10.0, on=5.0, off=5.0)
    # an interrupted Poisson process is a renewal process (every arrival finds it on), so its gap
    # scv (phase-type moments) equals its asymptotic idc (Heffes-Lucantoni): two formulas agree
    assert a.scv == pytest.approx(a.idc, rel=1e-9)
    assert OnOff(3.0, on=0.5, off=7.0).scv == pytest.approx(OnOff(3.0, on=0.5, off=7.0).idc, rel=1e-9)
    assert stats.kstest(gaps(a, 2), "expon", args=(0, 1 / a.rate)).pvalue < 1e-6


def test_specs_and_validation():
    assert parse_arrival("gamma:5:cv=2") == Gamma(5.0, 2.0)
    assert Gamma(5, 2).spec == "gamma:5:cv=2" and Poisson(2.5).spec == "poisson:2.5"
    assert OnOff(20, 30, 90).spec == "onoff:20:on=30:off=90"
    for ctor in (lambda: Poisson(0), lambda: Poisson(math.nan), lambda: Gamma(1, 0),
                 lambda: OnOff(1, 0, 1), lambda: OnOff(1, 1, 1, -1), lambda: Deterministic(-2)):
        with pytest.raises(InputError):
            ctor()
