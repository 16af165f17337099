"""Tests of llmqueue.metrics.little: exact integrals on hand-made windows, and L = lam W on long
M/M/c runs (Kiefer-Wolfowitz) against Erlang C."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _queue_sim import erlang_c_mean_response, mm1_times, mmc_times, records_from_times, table

from llmqueue.errors import InputError
from llmqueue.metrics.little import in_system_integral, little_check


def test_window_edges_by_hand():
    """Window [10, 20]. Stays inside the window (hand-computed):
    A arrives 5, leaves 15 (straddles t0): 5 s in window, not an arrival of the window.
    B arrives 12, leaves 25 (straddles t1): 8 s; an arrival; sojourn 13.
    C arrives 14, leaves 16: 2 s; sojourn 2.
    D arrives 18, in flight at the stop (NaN finish): 2 s (to t1); an arrival without sojourn.
    E arrives 25 and F (2 -> 8) lie outside the window.
    L = 17/10, lam = 3/10, W = (13 + 2)/2 = 7.5."""
    r = table([
        {"arrival_s": 5.0, "finish_s": 15.0},
        {"arrival_s": 12.0, "finish_s": 25.0},
        {"arrival_s": 14.0, "finish_s": 16.0},
        {"arrival_s": 18.0, "finish_s": np.nan, "status": "unfinished"},
        {"arrival_s": 25.0, "finish_s": 26.0},
        {"arrival_s": 2.0, "finish_s": 8.0},
    ])
    assert in_system_integral(r["arrival_s"], r["finish_s"], 10.0, 20.0) == pytest.approx(17.0)
    c = little_check(r, warmup_s=10.0, horizon_s=20.0)
    assert c.L == pytest.approx(1.7)
    assert c.lam == pytest.approx(0.3)
    assert c.W == pytest.approx(7.5)
    assert c.lam_W == pytest.approx(2.25)
    assert c.gap == pytest.approx(abs(1.7 - 2.25) / 1.7)
    assert (c.arrivals, c.finished, c.in_flight) == (3, 2, 1)
    assert c.throughput == pytest.approx(2 / 10)  # A (15) and C (16) leave inside the window


def test_default_horizon_is_last_event():
    r = table([{"arrival_s": 0.0, "finish_s": 4.0}, {"arrival_s": 1.0, "finish_s": 2.0}])
    c = little_check(r)
    assert (c.t0, c.t1) == (0.0, 4.0)
    assert c.L == pytest.approx(5 / 4) and c.lam_W == pytest.approx(0.5 * 2.5)
    with pytest.raises(InputError, match="window"):
        little_check(r, warmup_s=10.0)


def test_long_stable_mmc_run_gap_under_2_percent():
    lam, mu, c, n = 3.2, 1.0, 4, 60_000
    a, s, f = mmc_times(lam, mu, c, n, seed=11)
    recs = records_from_times(a, s, f)
    chk = little_check(recs, warmup_s=float(a[n // 20]), horizon_s=float(a[-1]))
    assert chk.gap < 0.02
    # and the estimates agree with Erlang C: L = lam W (theory) within a loose Monte Carlo band
    W = erlang_c_mean_response(lam, mu, c)
    assert chk.W == pytest.approx(W, rel=0.1)
    assert chk.L == pytest.approx(lam * W, rel=0.1)


def test_timeseries_L_is_compared():
    """A time series sampled from the exact M/M/1 path gives an independent L."""
    a, s, f = mm1_times(0.6, 1.0, 20_000, seed=12)
    recs = records_from_times(a, s, f)
    grid = np.arange(0.0, a[-1], 0.5)
    n_sys = np.searchsorted(np.sort(a), grid, side="right") - np.searchsorted(np.sort(f), grid,
                                                                              side="right")
    from llmqueue.records import TimeSeries

    ts = TimeSeries.from_columns(t_s=grid, replica=np.zeros(len(grid), int),
                                 num_waiting=np.maximum(n_sys - 1, 0),
                                 num_running=np.minimum(n_sys, 1), kv_tokens=np.zeros(len(grid), int))
    chk = little_check(recs, warmup_s=1000.0, horizon_s=float(a[-1]), timeseries=ts)
    assert chk.L_timeseries == pytest.approx(chk.L, rel=0.02)
    assert chk.gap_timeseries < 0.03


def test_overloaded_run_with_requests_in_flight():
    """rho = 1.3 stopped at H: many requests in flight. L counts them up to H; W is over the
    finished ones. Fluid limit of FCFS from empty: N(t) = (lam - mu) t, so L = (lam - mu) H / 2;
    a request arriving at a waits (lam - mu) a / mu and finishes by H iff a <= H mu / lam, so
    W = (lam - mu) H / (2 lam) and lam W = L: the identity survives overload."""
    lam, mu, H = 1.3, 1.0, 4000.0
    a, s, f = mm1_times(lam, mu, 8000, seed=13)
    recs = records_from_times(a, s, f, horizon=H)
    chk = little_check(recs, horizon_s=H)
    assert chk.in_flight > 500 and chk.finished + chk.in_flight == chk.arrivals
    assert chk.L * H == pytest.approx(
        in_system_integral(recs["arrival_s"], recs["finish_s"], 0.0, H))
    assert chk.L == pytest.approx((lam - mu) * H / 2, rel=0.15)
    assert chk.W == pytest.approx((lam - mu) * H / (2 * lam), rel=0.15)
    assert math.isfinite(chk.gap) and chk.gap < 0.1
    assert chk.throughput == pytest.approx(mu, rel=0.05)
