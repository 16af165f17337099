"""Time-varying arrivals: counts per window against Poisson(integrated rate), time-rescaled gaps
against Exp(1) / Gamma / H2 (Brown et al. 2002), fixed-count sampling, specs and validation.

Each check is also shown to reject a wrong model, so it can fail."""

import math

import numpy as np
import pytest
from scipy import stats

from llmqueue.errors import InputError
from llmqueue.workload import Diurnal, Piecewise, Spike, Workload, parse_arrival
from llmqueue.workload.nonstationary import h2_balanced

SEEDS = [0, 1, 2, 3, 4]
P_MIN = 1e-3  # acceptance level of each goodness-of-fit check (per seed)

NHPP = [
    "piecewise:5@0,20@300,0@450,8@600:period=900",
    "piecewise:2,9,4,0.5:window=250",
    "diurnal:mean=10:amp=0.8:period=600:phase=100",
    "diurnal:mean=6:amp=1:period=400",
    "spike:5:k=2:at=1200:for=600",
    "spike:4:k=0:at=100:for=200:period=500",
]


def rescaled_gaps(proc, t):
    """Time-rescaling: Lambda(t_i) - Lambda(t_i-1), from Lambda(0) = 0."""
    return np.diff(proc.cumulative(t), prepend=0.0)


def counts_chi2(proc, t, horizon, width):
    """Pearson chi-square of counts in [k w, (k+1) w) bins against Poisson(Lambda of the bin),
    bins with expectation >= 5 (others pooled), and its p-value (no parameters estimated)."""
    edges = np.arange(0.0, horizon + 1e-9, width)
    obs = np.histogram(t, edges)[0].astype(float)
    exp = np.diff(proc.cumulative(edges))
    big = exp >= 5
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    keep = e > 0
    chi2 = float(np.sum((o[keep] - e[keep]) ** 2 / e[keep]))
    return chi2, float(stats.chi2.sf(chi2, keep.sum()))


def h2_cdf(cv):
    p1, r1, r2 = h2_balanced(cv)
    return lambda x: 1 - p1 * np.exp(-r1 * x) - (1 - p1) * np.exp(-r2 * x)


# -- the non-homogeneous Poisson process ----------------------------------------------------------

@pytest.mark.parametrize("spec", NHPP)
@pytest.mark.parametrize("seed", SEEDS)
def test_nhpp_counts_per_window_are_poisson_of_the_integrated_rate(spec, seed):
    a = parse_arrival(spec)
    t = a.sample_times(np.random.default_rng(seed), horizon=3000.0)
    _, p = counts_chi2(a, t, 3000.0, 30.0)
    assert p > P_MIN


@pytest.mark.parametrize("spec", NHPP)
@pytest.mark.parametrize("seed", SEEDS)
def test_nhpp_rescaled_gaps_are_exponential(spec, seed):
    a = parse_arrival(spec)
    t = a.sample_times(np.random.default_rng(seed), n=4000)
    assert stats.kstest(rescaled_gaps(a, t), "expon").pvalue > P_MIN


def test_nhpp_count_dispersion_is_one():
    # variance / mean of (count - Lambda) over many windows: 1 for Poisson counts
    a = parse_arrival("piecewise:5@0,20@300,0@450,8@600:period=900")
    t = a.sample_times(np.random.default_rng(11), horizon=90_000.0)
    edges = np.arange(0.0, 90_000.0 + 1e-9, 50.0)
    obs = np.histogram(t, edges)[0]
    exp = np.diff(a.cumulative(edges))
    keep = exp > 0
    z2 = (obs[keep] - exp[keep]) ** 2 / exp[keep]
    # mean of z^2 is 1 with standard error sqrt(2 / m) for Poisson counts with large means
    assert abs(z2.mean() - 1) < 4 * math.sqrt(2 / keep.sum()) + 0.02


def test_checks_reject_the_wrong_model():
    # the same data judged against a homogeneous Poisson process with the same mean rate
    a = parse_arrival("diurnal:mean=10:amp=0.8:period=600")
    flat = parse_arrival("piecewise:10@0")
    t = a.sample_times(np.random.default_rng(0), horizon=3000.0)
    assert counts_chi2(a, t, 3000.0, 30.0)[1] > P_MIN
    assert counts_chi2(flat, t, 3000.0, 30.0)[1] < 1e-6
    assert stats.kstest(rescaled_gaps(flat, t), "expon").pvalue < 1e-6
    # a spike at the wrong time is rejected by the counts
    s = parse_arrival("spike:5:k=2:at=1200:for=600")
    wrong = parse_arrival("spike:5:k=2:at=600:for=600")
    ts = s.sample_times(np.random.default_rng(1), horizon=3000.0)
    assert counts_chi2(wrong, ts, 3000.0, 30.0)[1] < 1e-6
    # an NHPP is not a modulated Gamma process and vice versa
    g = parse_arrival("diurnal:mean=10:amp=0.8:period=600:cv=2")
    tg = g.sample_times(np.random.default_rng(2), n=4000)
    assert stats.kstest(rescaled_gaps(g, tg), "expon").pvalue < 1e-6
    tn = a.sample_times(np.random.default_rng(2), n=4000)
    assert stats.kstest(rescaled_gaps(a, tn), "gamma", args=(0.25, 0, 4.0)).pvalue < 1e-6


def test_seed_000_noon_launch_doubles_arrivals():
    # "at noon, one product surface launches a feature and request arrivals briefly double"
    a = parse_arrival("spike:50:k=2:at=43200:for=900")
    t = a.sample_times(np.random.default_rng(3), horizon=86400.0)
    before = np.count_nonzero((t >= 43200 - 900) & (t < 43200))
    during = np.count_nonzero((t >= 43200) & (t < 43200 + 900))
    after = np.count_nonzero((t >= 43200 + 900) & (t < 43200 + 1800))
    for c, lam in ((before, 50 * 900), (during, 100 * 900), (after, 50 * 900)):
        assert abs(c - lam) < 5 * math.sqrt(lam)
    assert a.rate == 50.0  # a one-off spike does not change the long-run rate
    assert float(a.cumulative(86400.0)) == pytest.approx(50 * 86400 + 50 * 900)


# -- the modulated Gamma and H2 processes ---------------------------------------------------------

@pytest.mark.parametrize("spec", ["piecewise:5@0,20@300,0@450,8@600:period=900:cv=2",
                                  "diurnal:mean=10:amp=0.8:period=600:cv=0.5",
                                  "spike:5:k=3:at=100:for=100:period=400:cv=1.7"])
@pytest.mark.parametrize("seed", SEEDS)
def test_modulated_gamma_rescaled_gaps_are_gamma(spec, seed):
    a = parse_arrival(spec)
    k = 1 / a.cv ** 2
    x = rescaled_gaps(a, a.sample_times(np.random.default_rng(seed), n=4000))
    assert stats.kstest(x, "gamma", args=(k, 0, 1 / k)).pvalue > P_MIN
    assert abs(x.mean() - 1) < 5 * a.cv / math.sqrt(x.size)


@pytest.mark.parametrize("seed", SEEDS)
def test_modulated_h2_rescaled_gaps_are_hyperexponential(seed):
    a = parse_arrival("piecewise:5@0,20@300,8@600:period=900:cv=3:gaps=h2")
    x = rescaled_gaps(a, a.sample_times(np.random.default_rng(seed), n=4000))
    assert stats.kstest(x, h2_cdf(3.0)).pvalue > P_MIN
    assert stats.kstest(x, "gamma", args=(1 / 9, 0, 9)).pvalue < 1e-6  # not the Gamma with that cv


def test_h2_balanced_moments():
    for cv in (1.0, 1.5, 3.0, 7.0):
        p1, r1, r2 = h2_balanced(cv)
        m1 = p1 / r1 + (1 - p1) / r2
        m2 = 2 * (p1 / r1 ** 2 + (1 - p1) / r2 ** 2)
        assert m1 == pytest.approx(1.0) and m2 - 1 == pytest.approx(cv ** 2)
        assert p1 / r1 == pytest.approx((1 - p1) / r2)  # balanced means
    with pytest.raises(InputError):
        h2_balanced(0.5)


def test_modulated_gamma_count_dispersion():
    # Var N / E N of counts in long windows tends to cv^2 (renewal counts in operational time)
    a = parse_arrival("piecewise:40@0,10@500:period=1000:cv=2")
    assert a.idc == 4.0
    t = a.sample_times(np.random.default_rng(5), horizon=400_000.0)
    edges = np.arange(0.0, 400_000.0 + 1e-9, 500.0)
    obs = np.histogram(t, edges)[0]
    exp = np.diff(a.cumulative(edges))
    assert np.mean((obs - exp) ** 2) / np.mean(exp) == pytest.approx(4.0, rel=0.15)


# -- moments --------------------------------------------------------------------------------------

def test_long_run_rates():
    assert parse_arrival("piecewise:5@0,20@300,0@450,8@600:period=900").rate == pytest.approx(
        (5 * 300 + 20 * 150 + 0 + 8 * 300) / 900)
    assert parse_arrival("piecewise:5@0,20@300").rate == 20.0  # the last rate holds forever
    assert parse_arrival("diurnal:mean=7:amp=0.3").rate == 7.0
    spike = parse_arrival("spike:4:k=3:at=10:for=20:period=100")
    assert spike.rate == pytest.approx((4 * 80 + 12 * 20) / 100)
    t = spike.sample_times(np.random.default_rng(0), horizon=20_000.0)
    assert abs(t.size - 5.6 * 20_000) < 5 * math.sqrt(5.6 * 20_000)


@pytest.mark.parametrize("spec", ["diurnal:mean=50:amp=0.6:period=2000",
                                  "diurnal:mean=50:amp=0.6:period=2000:cv=1.5",
                                  "piecewise:20,60,5:window=1000:period=3000:cv=0.7"])
def test_gap_scv_slow_variation(spec):
    a = parse_arrival(spec)
    if a.__class__ is Diurnal:
        assert a.scv == pytest.approx((1 + a.cv ** 2) / math.sqrt(1 - 0.36) - 1)
    x = np.diff(a.sample_times(np.random.default_rng(9), horizon=60_000.0))
    assert x.var() / x.mean() ** 2 == pytest.approx(a.scv, rel=0.05)
    assert x.mean() == pytest.approx(1 / a.rate, rel=0.02)


def test_scv_is_infinite_when_the_rate_touches_zero():
    assert math.isinf(parse_arrival("piecewise:5,0:window=10:period=20").scv)
    assert math.isinf(parse_arrival("diurnal:mean=5:amp=1").scv)
    assert parse_arrival("spike:5:k=2:at=10:for=10:cv=2").scv == pytest.approx(4.0)


@pytest.mark.parametrize("spec", ["piecewise:5,20,0,8:window=30:period=120",
                                  "piecewise:5,20,0,8:window=30:period=120:cv=2",
                                  "piecewise:5,20,0.1,8.3:window=30:period=120:counts=fixed",
                                  "diurnal:mean=10:amp=0.9:period=300"])
@pytest.mark.parametrize("bin_s", [30.0, 17.0])
def test_expected_bin_idc_matches_simulation(spec, bin_s):
    a = parse_arrival(spec)
    horizon = 6000.0
    m = int(horizon // bin_s)
    vals = []
    for seed in range(40):
        t = a.sample_times(np.random.default_rng(seed), horizon=horizon)
        c = np.bincount((t // bin_s).astype(int), minlength=m)[:m]
        vals.append(c.var() / c.mean())
    assert np.mean(vals) == pytest.approx(a.expected_bin_idc(bin_s, horizon), rel=0.08)


# -- counts=fixed ---------------------------------------------------------------------------------

def test_fixed_counts_are_exact_every_period():
    a = parse_arrival("piecewise:1.5,3,0,0.25:window=20:period=80:counts=fixed")
    assert a.window_counts()[0].tolist() == [30, 60, 0, 5] and a.idc == 0.0
    for seed in SEEDS:
        t = a.sample_times(np.random.default_rng(seed), horizon=800.0)
        assert np.bincount((t // 20).astype(int), minlength=40).tolist() == [30, 60, 0, 5] * 10
        assert np.all(np.diff(t) >= 0) and t[-1] < 800.0


def test_fixed_counts_with_fractional_expectation_round_with_the_right_mean():
    a = parse_arrival("piecewise:0.26,1:window=10:period=20:counts=fixed")
    whole, frac = a.window_counts()
    assert whole.tolist() == [2, 10] and frac == pytest.approx([0.6, 0.0])
    t = a.sample_times(np.random.default_rng(0), horizon=20 * 5000.0)
    c = np.bincount((t // 10).astype(int), minlength=10_000)
    assert set(c[0::2].tolist()) == {2, 3} and set(c[1::2].tolist()) == {10}
    assert abs(c[0::2].mean() - 2.6) < 5 * math.sqrt(0.24 / 5000)


@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_counts_positions_are_poisson_conditioned(seed):
    # given its count, a Poisson window's points are uniform order statistics
    a = parse_arrival("piecewise:2,0.5:window=10:period=20:counts=fixed")
    t = a.sample_times(np.random.default_rng(seed), horizon=20 * 200.0)
    u = (t % 10.0) / 10.0
    assert stats.kstest(u, "uniform").pvalue > P_MIN


@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_counts_gamma_spacings_are_dirichlet(seed):
    # K points from K+1 Gamma(k) gaps rescaled to the window: the first spacing is Beta(k, K k)
    a = parse_arrival("piecewise:0.4:window=10:period=10:cv=2:counts=fixed")  # K = 4 per window
    t = a.sample_times(np.random.default_rng(seed), horizon=10 * 3000.0)
    first = (t.reshape(-1, 4)[:, 0] % 10.0) / 10.0
    assert stats.kstest(first, "beta", args=(0.25, 1.0)).pvalue > P_MIN
    assert stats.kstest(first, "beta", args=(1.0, 4.0)).pvalue < 1e-6  # not uniform order statistics


def test_fixed_counts_survive_tiny_gaps():
    # Gamma gaps with cv = 7 fall below the running sum's resolution; no arrival may leave its window
    a = parse_arrival("piecewise:3,0,12.5:window=60:period=156:cv=7:counts=fixed")
    for seed in SEEDS:
        t = a.sample_times(np.random.default_rng(seed), horizon=156.0)
        assert np.bincount(np.minimum((t // 60).astype(int), 2), minlength=3).tolist() == [180, 0, 450]


# -- n versus horizon, reproducibility ------------------------------------------------------------

@pytest.mark.parametrize("spec", ["piecewise:5@0,20@300,0@450,8@600:period=900:cv=2",
                                  "spike:5:k=2:at=100:for=60:gaps=h2:cv=2",
                                  "piecewise:1.5,3,0,0.25:window=20:period=80:counts=fixed:cv=0.5"])
def test_horizon_sample_is_a_prefix_of_the_n_sample(spec):
    a = parse_arrival(spec)
    t = a.sample_times(np.random.default_rng(3), n=5000)
    h = a.sample_times(np.random.default_rng(3), horizon=float(t[3210]))
    assert np.array_equal(h, t[:3210])


def test_diurnal_horizon_prefix_and_inverse_accuracy():
    a = parse_arrival("diurnal:mean=10:amp=1:period=600:phase=37")
    t = a.sample_times(np.random.default_rng(3), n=5000)
    h = a.sample_times(np.random.default_rng(3), horizon=float(t[3210]))
    assert h.size == 3210 and np.allclose(h, t[:3210], rtol=0, atol=1e-8)
    w = np.random.default_rng(0).uniform(0, 1e5, 10_000)
    assert np.allclose(a.cumulative(a.inverse_cumulative(w)), w, rtol=0, atol=1e-7)
    assert np.all(np.diff(t) >= 0)


@pytest.mark.parametrize("spec", NHPP + ["piecewise:1,2:window=5:period=10:counts=fixed"])
def test_n_and_horizon_semantics(spec):
    a = parse_arrival(spec)
    t = a.sample_times(np.random.default_rng(1), n=3000)
    assert t.size == 3000 and t.dtype == np.float64 and np.all(np.diff(t) >= 0) and t[0] >= 0
    assert a.sample_times(np.random.default_rng(1), n=0).size == 0
    for bad in ({}, {"n": 5, "horizon": 1.0}, {"n": -1}, {"horizon": 0.0}, {"horizon": math.nan}):
        with pytest.raises(InputError):
            a.sample_times(np.random.default_rng(1), **bad)


def test_works_in_a_workload():
    w = Workload("spike:5:k=2:at=100:for=50", prompt="uniform:10:100", output="fixed:8")
    r = w.generate(0, duration=300.0)
    assert w.rate == 5.0 and r.arrival_s[-1] < 300.0
    assert abs(len(r) - 1750) < 5 * math.sqrt(1750)
    assert w.generate(0, duration=300.0) == r


# -- specs and validation -------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    "piecewise:5@0,10@3600,5@4200",
    "piecewise:5@0,10@3600,5@4200:period=86400:cv=2",
    "piecewise:1,2.5,0:window=60:period=180:cv=3:gaps=h2:counts=fixed",
    "diurnal:mean=5:amp=0.5:period=86400",
    "diurnal:mean=5:amp=0.5:period=3600:phase=900:cv=0.5",
    "spike:5:k=2:at=3600:for=600",
    "spike:5:k=0:at=0:for=60:period=600:cv=2:gaps=h2",
])
def test_canonical_specs_round_trip(spec):
    a = parse_arrival(spec)
    assert a.spec == spec and parse_arrival(a.spec) == a and hash(parse_arrival(spec)) == hash(a)


def test_spec_forms_and_constructors_agree():
    assert parse_arrival("spike:5:k=2:at=3600:for=600") == Spike(5, 2, 3600, 600)
    assert parse_arrival("spike:5:2:3600:600") == Spike(5, 2, 3600, 600)
    assert parse_arrival("diurnal:5:0.5") == Diurnal(5, 0.5, period=86400)
    assert parse_arrival("diurnal:5:0.5:3600:10") == Diurnal(5, 0.5, period=3600, phase=10)
    assert parse_arrival("piecewise:5@0,10@60") == Piecewise([(0, 5), (60, 10)])
    assert parse_arrival("piecewise:5,10:window=60").spec == Piecewise.from_rates([5, 10], 60).spec
    assert parse_arrival("PIECEWISE:5@0:CV=2").cv == 2.0
    d = parse_arrival("diurnal:mean=10:amp=0.5:period=400:phase=100")
    assert float(d.rate_at(200.0)) == pytest.approx(15.0)  # peak at phase + P/4
    assert float(d.rate_at(400.0)) == pytest.approx(5.0)
    p = parse_arrival("piecewise:5@0,20@300,0@450:period=600")
    assert p.rate_at([0, 299.9, 300, 449, 450, 599, 600, 900]).tolist() == [5, 5, 20, 20, 0, 0, 5, 20]
    assert float(p.cumulative(1200.0)) == pytest.approx(2 * (1500 + 3000))
    assert p.inverse_cumulative(np.array([1500.0, 2500.0, 4500.0 + 1000.0])).tolist() == pytest.approx(
        [300.0, 350.0, 800.0])


BAD = [
    ("piecewise:5@10", "first window must start at 0"),
    ("piecewise:5@0,3@0", "increase strictly"),
    ("piecewise:5@0,-3@10", "rate must be >= 0"),
    ("piecewise:5,0:window=10", "last rate must be > 0"),
    ("piecewise:0,0:window=10:period=20", "no arrivals"),
    ("piecewise:5@0,6@100:period=50", "beyond the last window start"),
    ("piecewise:5,6", "needs RATE@START"),
    ("piecewise:5@0,6@100:window=10", "plain rates"),
    ("piecewise:5@0,,6@100", "empty item"),
    ("piecewise:5@0:counts=fixed", "needs period="),
    ("piecewise:5@0:counts=sometimes:period=10", "counts must be one of"),
    ("piecewise:5@0:cv=0.5:gaps=h2", "cv must be >= 1 for gaps=h2"),
    ("piecewise:5k@0", "suffixes are ambiguous"),
    ("diurnal:mean=5", "missing amp"),
    ("diurnal:mean=5:amp=1.5", "amp must be <= 1"),
    ("diurnal:mean=5:amp=0.5:period=0", "period must be > 0"),
    ("diurnal:mean=5:amp=0.5:gaps=pareto", "gaps must be one of"),
    ("spike:5:k=2:at=10", "missing for"),
    ("spike:5:k=2:at=10:for=0", "for must be > 0"),
    ("spike:5:k=-1:at=10:for=5", "k must be >= 0"),
    ("spike:5:k=2:at=10:for=60:period=30", "period must be >= at + for"),
    ("spike:5:k=2:at=10:for=60:peak=3", "unknown key 'peak'"),
    ("weibull:5", "valid: deterministic, fixed, gamma, onoff, poisson; time-varying: diurnal, "
                  "piecewise, spike"),
]


@pytest.mark.parametrize("spec,fragment", BAD)
def test_bad_specs_name_the_field(spec, fragment):
    for field in ("arrival", "rate"):
        with pytest.raises(InputError) as e:
            parse_arrival(spec, field)
        assert e.value.field == field
        assert str(e.value).startswith(f"{field}: cannot parse {spec!r}")
        assert fragment in str(e.value), str(e.value)
