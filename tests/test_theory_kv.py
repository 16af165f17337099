"""Seed 004's KV-memory model: g(s,o), E[g], mu, delta, verdicts, mixes, replicas, b estimators."""

import math

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.theory import kv


def _uniform(lo, hi):
    # Every integer in [lo, hi] once: as a sample this is exactly the discrete uniform pmf.
    return np.arange(lo, hi + 1)


@pytest.mark.parametrize("s,o,chunk", [(1, 0, 512), (10, 10, 512), (512, 1, 512), (513, 7, 512),
                                       (1600, 1600, 512), (1000, 3, 64), (37, 5, 1)])
def test_g_exact_is_the_sum_of_the_step_trajectory(s, o, chunk):
    steps = kv.g_steps(s, o, chunk)
    assert len(steps) == math.ceil(s / chunk) + o
    assert steps[math.ceil(s / chunk) - 1] == s  # prefill ends holding the whole prompt
    assert kv.g_exact(s, o, chunk) == pytest.approx(sum(steps), rel=0, abs=1e-9)


def test_closed_form_equals_exact_when_chunk_divides_prompt_and_differs_otherwise():
    for s in (512, 1024, 2048):
        for o in (1, 100, 1600):
            assert kv.g_closed(s, o, 512) == pytest.approx(kv.g_exact(s, o, 512))
    # s = 600 is one full chunk plus 88 tokens: the step sum is 512 + 600 = 1112, the closed
    # form (1 + 600/512) * 600 / 2 = 651.5625 (seed 004's formula assumes chunk | s).
    assert kv.prefill_work(600, 512, exact=True) == 1112
    assert kv.prefill_work(600, 512, exact=False) == pytest.approx(651.5625)


def test_expected_g_from_marginals_equals_the_brute_force_average_over_all_pairs():
    s, o = _uniform(10, 200), _uniform(1, 50)
    S, O = np.meshgrid(s, o, indexing="ij")
    brute = kv.g_exact(S, O, 64).mean()
    assert kv.expected_g(chunk=64, prompt=s, output=o) == pytest.approx(brute, rel=1e-12)


def test_expected_g_closed_form_by_moments():
    # E[g_closed] = (E[s] + E[s^2]/c + 2 E[o] E[s] + E[o] + E[o^2]) / 2 for independent s, o.
    s, o, c = _uniform(10, 1600), _uniform(10, 1600), 512
    es, es2 = s.mean(), (s.astype(float) ** 2).mean()
    eo, eo2 = o.mean(), (o.astype(float) ** 2).mean()
    want = (es + es2 / c + 2 * eo * es + eo + eo2) / 2
    assert kv.expected_g(chunk=c, prompt=s, output=o, exact=False) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("prompt,output,b,paper_mu", [
    ((10, 1600), (10, 1600), 0.0372, 3.263),   # P/D 1:1
    ((10, 2133), (10, 1066), 0.0430, 3.956),   # P/D 2:1
    ((10, 1066), (10, 2133), 0.0337, 2.902),   # P/D 1:2
])
def test_seed004_table1_theory_column(prompt, output, b, paper_mu):
    r = kv.kv_stability(M=131000, b=b, chunk=512, prompt=_uniform(*prompt), output=_uniform(*output))
    assert r.mu_closed_form == pytest.approx(paper_mu, rel=5e-4)  # the paper's own formula, 3 decimals
    assert r.mu == pytest.approx(paper_mu, rel=5e-3)  # the step-exact sum differs by < 0.1%
    assert r.delta == pytest.approx((prompt[1] + output[1]) / 131000)


def test_verdicts_follow_the_two_theorems():
    r = kv.kv_stability(M=131000, b=0.0372, chunk=512, prompt=_uniform(10, 1600), output=_uniform(10, 1600), lam=1)
    mu, d = r.mu, r.delta
    assert r.verdict == "stable" and r.rho == pytest.approx(1 / mu)
    assert kv.verdict(mu * (1 - d) * 0.999, mu, d) == "stable"
    assert kv.verdict(mu * (1 - d / 2), mu, d) == "indeterminate"
    assert kv.verdict(mu * 1.001, mu, d) == "unstable"
    for lam, want in ((1, "stable"), (3, "stable"), (5, "unstable"), (20, "unstable"), (50, "unstable")):
        assert kv.verdict(lam, mu, d) == want


def test_pairs_keep_correlation():
    rng = np.random.default_rng(0)
    s = rng.integers(10, 1600, size=20000)
    o_corr = s.copy()                       # perfectly correlated
    o_ind = rng.permutation(s)              # same marginal, independent
    g_corr = kv.expected_g(chunk=512, pairs=(s, o_corr))
    g_ind = kv.expected_g(chunk=512, pairs=(s, o_ind))
    # E[o s] = E[s^2] > E[s]^2 when correlated: the correlated workload carries more memory-work.
    gap = (s.astype(float) ** 2).mean() - s.mean() * o_ind.mean()
    assert g_corr - g_ind == pytest.approx(gap, rel=0.05)
    assert g_corr > g_ind


def test_mu_mix_is_harmonic_in_request_shares():
    assert kv.mu_mix([3.956, 2.902], [1, 1]) == pytest.approx(2 / (1 / 3.956 + 1 / 2.902))
    assert kv.mu_mix([2.0], [5]) == 2.0
    # a mix can never beat its fastest workload nor fall below its slowest
    m = kv.mu_mix([1.0, 4.0], [0.3, 0.7])
    assert 1.0 < m < 4.0 and m == pytest.approx(1 / (0.3 / 1 + 0.7 / 4))


def test_replicas_needed():
    # seed 004 8.2: G >= lam / (mu rho)
    assert kv.replicas_needed(10, 3.263, 0.9) == math.ceil(10 / (3.263 * 0.9)) == 4
    assert kv.replicas_needed(2.9367, 3.263, 0.9) == 1  # exactly at the boundary: 2.9367 / 2.9367 = 1
    r = kv.kv_stability(M=131000, b=0.0372, chunk=512, prompt=_uniform(10, 1600), output=_uniform(10, 1600),
                        lam=50, rho_target=0.8)
    assert r.replicas == math.ceil(50 / (r.mu * 0.8))


def test_b_bar_estimators():
    x = np.array([1.0, 2, 3, 4, 5, 6, 7, 8, 9, 100])
    r = kv.b_bar(x, alphas=(0.1,))
    assert r.mean == pytest.approx(14.5) and r.median == pytest.approx(5.5)
    assert r.trimmed["0.1"] == pytest.approx(np.mean([2, 3, 4, 5, 6, 7, 8, 9]))  # one cut from each end


@pytest.mark.parametrize("kwargs,field", [
    (dict(M=0, b=0.03, chunk=512), "M"),
    (dict(M=1000, b=-1, chunk=512), "b"),
    (dict(M=1000, b=float("nan"), chunk=512), "b"),
    (dict(M=1000, b=0.03, chunk=0), "chunk"),
    (dict(M=1000, b=0.03, chunk=512, lam=-2), "lam"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(InputError) as e:
        kv.kv_stability(prompt=_uniform(10, 20), output=_uniform(10, 20), **kwargs)
    assert e.value.field == field


def test_bad_samples_rejected():
    with pytest.raises(InputError):
        kv.expected_g(chunk=512, prompt=[10, float("nan")], output=[5])
    with pytest.raises(InputError):
        kv.expected_g(chunk=512, pairs=([1, 2, 3], [1, 2]))
    with pytest.raises(InputError):
        kv.b_bar([0.1, -0.2])


@pytest.mark.parametrize("s,o,chunk,B", [(1, 0, 512, 16), (100, 10, 256, 32), (256, 1, 256, 32), (513, 7, 512, 16),
                                         (1000, 300, 96, 16), (37, 5, 7, 32), (600, 40, 100, 1)])
def test_g_paged_rounds_each_step_of_the_trajectory_up_to_whole_blocks(s, o, chunk, B):
    brute = sum(B * math.ceil(x / B) for x in kv.g_steps(s, o, chunk))
    assert kv.g_paged(s, o, chunk, B) == brute
    assert kv.g_paged(s, o, chunk, 1) == kv.g_exact(s, o, chunk)
    assert kv.g_paged(s, o, chunk, B) >= kv.g_exact(s, o, chunk)


def test_paged_expected_g_and_mu():
    s, o = _uniform(10, 200), _uniform(1, 50)
    S, O = np.meshgrid(s, o, indexing="ij")
    brute = kv.g_paged(S, O, 256, 32).mean()
    assert kv.expected_g(chunk=256, prompt=s, output=o, block_size=32) == pytest.approx(brute, rel=1e-12)
    tok = kv.kv_stability(M=2016, b=0.04, chunk=256, prompt=s, output=o)
    paged = kv.kv_stability(M=2016, b=0.04, chunk=256, prompt=s, output=o, block_size=32)
    # half a block wasted per request on average: mu drops by about 16 / E[s + o/2]
    assert paged.mu < tok.mu and paged.block_size == 32 and tok.block_size is None
    assert paged.mu == pytest.approx(2016 / (0.04 * brute))
