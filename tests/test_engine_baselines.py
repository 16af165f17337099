"""Baselines: seed 002's dynamic batching against the exact E_B/D/1 model, and static batching."""

import math

import numpy as np
import pytest

from llmqueue.engine.baselines import dynamic_batching, static_batching
from llmqueue.engine import EngineConfig, simulate
from llmqueue.theory.batch import erlang_batch_wait
from llmqueue.workload import Workload

LAM, T_FIXED, T_REQ = 100.0, 0.050, 0.0005


def _batch_means_ci(x, batches=30):
    """Mean and a 99% batch-means half-width for a time-ordered series."""
    x = np.asarray(x)
    m = len(x) // batches
    means = x[: m * batches].reshape(batches, m).mean(axis=1)
    from scipy.stats import t as student

    hw = student.ppf(0.995, batches - 1) * means.std(ddof=1) / math.sqrt(batches)
    return means.mean(), hw


@pytest.mark.parametrize("B,seed002_ms", [(8, 150.1), (16, 154.5), (32, 234.6)])
def test_dynamic_batching_matches_erlang_b_d_1_not_the_seed(B, seed002_ms):
    reqs = Workload(f"poisson:{LAM}", prompt="fixed:1", output="fixed:1").generate(seed=B, n=120_000)
    r = dynamic_batching(reqs, B_max=B, T_fixed=T_FIXED, t_req=T_REQ)
    e2e = (r.requests["finish_s"] - r.requests["arrival_s"])[5_000:]
    mean, hw = _batch_means_ci(e2e)
    t_svc = T_FIXED + T_REQ * B
    exact = erlang_batch_wait(lam=LAM, T_svc=t_svc, B=B) + (B - 1) / (2 * LAM) + t_svc
    assert abs(mean - exact) < hw + 1e-4, (mean, hw, exact)
    # the seed's M/D/1-on-batches value is outside the interval (it is an approximation)
    assert abs(mean - seed002_ms / 1e3) > hw


@pytest.mark.parametrize("B", [1, 4])
def test_dynamic_batching_small_batches_are_unstable(B):
    reqs = Workload(f"poisson:{LAM}", prompt="fixed:1", output="fixed:1").generate(seed=1, duration=60)
    r = dynamic_batching(reqs, B_max=B, T_fixed=T_FIXED, t_req=T_REQ, horizon_s=60)
    served = (r.requests["status"] == "ok").sum()
    rate = served / 60
    mu_eff = B / (T_FIXED + T_REQ * B)
    assert rate == pytest.approx(mu_eff, rel=0.05)  # the server runs flat out at mu_eff < lam
    ts = r.timeseries
    late, early = ts["num_waiting"][ts["t_s"] > 40].mean(), ts["num_waiting"][ts["t_s"] < 20].mean()
    assert late > early + 10 * (LAM - mu_eff)  # the queue keeps growing, ~ (lam - mu_eff) per second


def test_static_batching_head_of_line_blocking():
    """Same heterogeneous workload and arrival rate: continuous batching keeps p99 low where
    static batching (slots held until the longest request of the batch ends) does not."""
    reqs = Workload("poisson:2", prompt="uniform:10:200", output="lognormal:mean=100:sd=150:max=2000").generate(seed=5, n=3000)
    step = "linear:c0=0.01:decode=1e-4"
    st = static_batching(reqs, B=16, step_time=step)
    cb = simulate(EngineConfig.from_capacity(500_000, max_num_seqs=16), step, reqs)
    def p99(r):
        return np.percentile(r.requests["finish_s"] - r.requests["arrival_s"], 99)
    assert (st.requests["status"] == "ok").all() and (cb.requests["status"] == "ok").all()
    assert p99(st) > 2 * p99(cb)
    # each static request streams its tokens: first token after the batch's prefill step
    assert (st.requests["first_token_s"] < st.requests["finish_s"]).any()
    assert (st.requests["output_tokens"] == reqs.output_tokens).all()
