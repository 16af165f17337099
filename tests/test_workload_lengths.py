"""Token-length distributions: exact moments against closed forms and independent Monte Carlo."""

import math
from pathlib import Path

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.workload import (Discrete, Empirical, Fixed, LogNormal, Normal, Uniform,
                               parse_length)
from llmqueue.workload.lengths import MAX_SUPPORT

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def assert_sample_matches(dist, seed=0, n=200_000):
    """Sample mean and variance lie within 4.5 standard errors of the exact moments."""
    x = dist.sample(np.random.default_rng(seed), n).astype(np.float64)
    v, p = dist.pmf()
    m = dist.mean()
    mu4 = float(np.dot((v - m) ** 4, p))
    var = dist.var()
    assert abs(x.mean() - m) <= 4.5 * math.sqrt(var / n) + 1e-12
    se_var = math.sqrt(max(mu4 - var ** 2, 0.0) / n)
    assert abs(x.var(ddof=1) - var) <= 4.5 * se_var + 1e-9


# -- fixed and uniform: closed forms ------------------------------------------------------------

def test_fixed_moments_and_pmf():
    d = Fixed(512)
    assert d.spec == "fixed:512"
    assert (d.mean(), d.second_moment(), d.var(), d.support()) == (512.0, 512.0 ** 2, 0.0, (512, 512))
    v, p = d.pmf()
    assert v.tolist() == [512] and p.tolist() == [1.0]
    x = d.sample(np.random.default_rng(1), 1000)
    assert x.dtype == np.int64 and np.all(x == 512)


@pytest.mark.parametrize("lo,hi", [(10, 1600), (1, 1), (3, 7), (10, 2133), (1000, 1001)])
def test_uniform_exact_moments(lo, hi):
    d = Uniform(lo, hi)
    n = hi - lo + 1
    # independent truth: exact rational sums with Python integers
    assert d.mean() == (lo + hi) / 2
    assert d.second_moment() == pytest.approx(sum(k * k for k in range(lo, hi + 1)) / n, rel=1e-15)
    assert d.var() == pytest.approx((n * n - 1) / 12, rel=1e-12, abs=1e-12)
    v, p = d.pmf()
    assert v.tolist() == list(range(lo, hi + 1))
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert d.support() == (lo, hi)


def test_uniform_seed004_values():
    # seed 004, P/D 1:1: Uniform(10, 1600) for prompt and output
    d = Uniform(10, 1600)
    assert d.mean() == pytest.approx(805.0)
    assert d.var() == (1591 ** 2 - 1) / 12


def test_uniform_samples_cover_range_and_pass_chi_square():
    from scipy.stats import chisquare

    d = Uniform(1, 20)
    x = d.sample(np.random.default_rng(5), 100_000)
    assert x.min() == 1 and x.max() == 20
    counts = np.bincount(x, minlength=21)[1:]
    assert chisquare(counts).pvalue > 0.001
    assert_sample_matches(Uniform(10, 1600))


def test_uniform_quantile_edges():
    d = Uniform(10, 19)
    u = np.array([0.0, 0.0999, 0.1, 0.5, np.nextafter(1.0, 0)])
    assert d.quantile(u).tolist() == [10, 10, 11, 15, 19]


# -- normal and lognormal: rounded, conditioned ---------------------------------------------------

def test_normal_far_bounds_mean_and_sheppard_variance():
    d = Normal(800, 100)
    # bounds 8 sd away: realized mean is the requested one; rounding adds 1/12 to the variance
    assert d.mean() == pytest.approx(800.0, abs=1e-9)
    assert d.var() == pytest.approx(100 ** 2 + 1 / 12, rel=1e-9)
    v, p = d.pmf()
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert d.support() == (1, None)
    assert_sample_matches(d, seed=3)


def test_normal_truncation_is_conditioning():
    # symmetric bounds keep the mean; an asymmetric lower bound raises it
    assert Normal(500, 100, min=400, max=600).mean() == pytest.approx(500.0, abs=1e-9)
    d = Normal(500, 100, min=500)
    assert d.support() == (500, None)
    # independent truth: round normal draws, reject outside the bounds, average
    rng = np.random.default_rng(11)
    x = np.rint(rng.normal(500, 100, 400_000))
    x = x[x >= 500]
    assert abs(x.mean() - d.mean()) < 4.5 * x.std() / math.sqrt(x.size)
    # continuous truncated-normal mean 500 + 100*phi(0)/(1-Phi(0)) = 579.79; rounding shifts it a bit
    assert d.mean() == pytest.approx(500 + 100 * math.sqrt(2 / math.pi), abs=1.0)
    assert_sample_matches(d, seed=4)
    x = d.sample(np.random.default_rng(2), 10_000)
    assert x.min() >= 500


def test_normal_small_mean_cut_by_min_one():
    d = Normal(3, 5)
    # independent Monte Carlo of round-then-condition on >= 1
    rng = np.random.default_rng(12)
    x = np.rint(rng.normal(3, 5, 1_000_000))
    x = x[x >= 1]
    assert abs(x.mean() - d.mean()) < 4.5 * x.std() / math.sqrt(x.size)
    assert d.mean() > 3  # conditioning on >= 1 cuts the lower tail
    assert d.pmf()[0][0] == 1


def test_lognormal_mean_sd_of_token_count():
    d = LogNormal(mean=600, sd=400)
    assert d.mean() == pytest.approx(600, rel=1e-4)
    assert d.var() == pytest.approx(400 ** 2 + 1 / 12, rel=1e-3)
    s2 = math.log1p((400 / 600) ** 2)
    assert d.sigma == pytest.approx(math.sqrt(s2))
    assert d.mu == pytest.approx(math.log(600) - s2 / 2)
    assert_sample_matches(d, seed=6)


def test_lognormal_mu_sigma_form():
    d = LogNormal(mu=5.0, sigma=0.5)
    assert d.mean() == pytest.approx(math.exp(5.0 + 0.125), rel=1e-4)
    assert parse_length("lognormal:mu=5:sigma=0.5").mean() == d.mean()


def test_lognormal_max_truncation_matches_monte_carlo():
    d = LogNormal(mean=600, sd=900, max=2000)
    assert d.support() == (1, 2000)
    rng = np.random.default_rng(13)
    x = np.rint(rng.lognormal(d.mu, d.sigma, 1_000_000))
    x = x[(x >= 1) & (x <= 2000)]
    assert abs(x.mean() - d.mean()) < 4.5 * x.std() / math.sqrt(x.size)
    assert d.mean() < 600  # the cut tail lowers the realized mean
    assert d.pmf()[0][-1] == 2000


def test_heavy_lognormal_needs_max():
    with pytest.raises(InputError) as e:
        LogNormal(mean=1000, sd=10000)
    assert e.value.field == "max"
    d = LogNormal(mean=1000, sd=10000, max=131072)
    assert d.pmf()[0].size <= MAX_SUPPORT


def test_bounds_without_mass_rejected():
    with pytest.raises(InputError):
        Normal(5000, 10, max=100)
    with pytest.raises(InputError):
        Normal(500, 100, min=700, max=600)


# -- empirical and discrete -----------------------------------------------------------------------

def test_empirical_pmf_and_moments():
    d = Empirical([1, 1, 2, 5])
    v, p = d.pmf()
    assert v.tolist() == [1, 2, 5] and p.tolist() == [0.5, 0.25, 0.25]
    assert d.mean() == pytest.approx(2.25)
    assert d.second_moment() == pytest.approx((1 + 1 + 4 + 25) / 4)
    assert d.support() == (1, 5)
    x = d.sample(np.random.default_rng(0), 100_000)
    assert set(np.unique(x).tolist()) == {1, 2, 5}
    assert abs((x == 1).mean() - 0.5) < 0.01
    assert_sample_matches(d)


def test_discrete_merges_duplicates_and_drops_zeros():
    d = Discrete([5, 3, 5, 9], [0.2, 0.3, 0.5, 0.0])
    v, p = d.pmf()
    assert v.tolist() == [3, 5] and p == pytest.approx([0.3, 0.7])


@pytest.mark.parametrize("values", [[0, 1], [1.5, 2], [], [[1, 2]], [np.nan], [-3]])
def test_empirical_rejects_bad_values(values):
    with pytest.raises(InputError):
        Empirical(values)


def test_empirical_files(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("10\n20\n20\n\n30\n")
    d = parse_length(f"empirical:{plain}")
    assert d.spec == f"empirical:{plain}"
    assert d.mean() == pytest.approx(20.0)

    csvf = tmp_path / "lens.csv"
    csvf.write_text("id,prompt_tokens,output_tokens\na,100,7\nb,300,9\n")
    assert parse_length(f"empirical:{csvf}:column=output_tokens").mean() == pytest.approx(8.0)
    assert parse_length(f"empirical:{csvf}", "prompt").mean() == pytest.approx(200.0)  # known column for the field
    assert parse_length(f"empirical:{csvf}", "output").spec == f"empirical:{csvf}:column=output_tokens"

    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffContextTokens,GeneratedTokens\n5,1\n7,3\n".encode())
    assert parse_length(f"empirical:{bom}", "prompt").mean() == pytest.approx(6.0)  # BOM stripped from the header

    jl = tmp_path / "t.jsonl"
    jl.write_text('{"input_length": 4, "output_length": 2}\n{"input_length": 6, "output_length": 2}\n')
    assert parse_length(f"empirical:{jl}:column=input_length").mean() == pytest.approx(5.0)

    bad = tmp_path / "bad.csv"
    bad.write_text("x\n3\n0\n")
    with pytest.raises(InputError) as e:
        parse_length(f"empirical:{bad}", "output")
    assert e.value.field == "output" and "row 2" in str(e.value)

    with pytest.raises(InputError) as e:
        parse_length(f"empirical:{csvf}:column=nope", "prompt")
    assert "prompt_tokens" in str(e.value)  # lists the columns
    with pytest.raises(InputError) as e:
        parse_length(f"empirical:{csvf}", "lengths")  # several columns, no role: must name one
    assert "column=" in str(e.value)


def test_common_random_numbers_couple_monotonically():
    a = Uniform(10, 1600).sample(np.random.default_rng(9), 10_000)
    b = Uniform(10, 2133).sample(np.random.default_rng(9), 10_000)
    assert np.all(b >= a)
    c = LogNormal(mean=300, sd=200).sample(np.random.default_rng(9), 10_000)
    order = np.lexsort((c, a))  # same uniforms, monotone maps: sorting by a also sorts c
    assert np.all(np.diff(c[order]) >= 0)


@pytest.mark.skipif(not (SHARED / "lengths").is_dir(), reason="../shared/traces not present")
def test_sharegpt_lengths_match_readme():
    f = SHARED / "lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
    s = parse_length(f"empirical:{f}", "prompt")
    o = parse_length(f"empirical:{f}", "output")
    assert s.spec.endswith(":column=num_prefill_tokens")
    assert round(s.mean()) == 2340 and round(o.mean()) == 439  # README: mean 2340 / 439
    assert o.support()[1] == 1024
