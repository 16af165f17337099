"""Tests of llmqueue.metrics.stability on exact M/M/1 runs: stable at rho = 0.8, unstable at
rho = 1.3 with growth lam - mu inside its interval, and too-short runs."""

from __future__ import annotations

import numpy as np
import pytest
from _queue_sim import mm1_times, records_from_times

from llmqueue.metrics.stability import in_system, stability_verdict
from llmqueue.records import TimeSeries


def _timeseries(a, f, horizon, dt=1.0):
    """num_waiting / num_running sampled every dt from the exact M/M/1 path."""
    grid = np.arange(0.0, horizon, dt)
    fin = np.where(np.isnan(f), np.inf, f)
    n_sys = np.searchsorted(np.sort(a), grid, side="right") - np.searchsorted(np.sort(fin), grid,
                                                                              side="right")
    return TimeSeries.from_columns(t_s=grid, replica=np.zeros(len(grid), int),
                                   num_waiting=np.maximum(n_sys - 1, 0),
                                   num_running=np.minimum(n_sys, 1),
                                   kv_tokens=np.zeros(len(grid), int))


def test_stable_at_rho_08():
    a, s, f = mm1_times(0.8, 1.0, 40_000, seed=21)
    recs = records_from_times(a, s, f)
    v = stability_verdict(recs, warmup_s=500.0, horizon_s=float(a[-1]))
    assert v.verdict == "stable" and v.stable is True
    assert v.growth_ci[0] <= 0.0 <= v.growth_ci[1]
    assert abs(v.growth_per_s) < v.threshold_per_s
    assert v.arrival_rate == pytest.approx(0.8, rel=0.03)
    assert v.source.startswith("requests")


def test_unstable_at_rho_13_growth_is_lam_minus_mu():
    lam, mu, H = 1.3, 1.0, 6000.0
    a, s, f = mm1_times(lam, mu, int(lam * H * 1.2), seed=22)
    recs = records_from_times(a, s, f, horizon=H)
    assert recs.in_flight().sum() > 1000
    v = stability_verdict(recs, horizon_s=H)
    assert v.stable is False and v.verdict.startswith("unstable: queue grows")
    lo, hi = v.growth_ci
    assert lo <= lam - mu <= hi
    assert v.growth_per_s == pytest.approx(lam - mu, abs=0.05)
    assert v.rate_gap_ci[0] <= lam - mu <= v.rate_gap_ci[1]
    assert v.departure_rate == pytest.approx(mu, rel=0.05)
    # the same from a sampled time series (e.g. a server's /metrics)
    f_obs = recs["finish_s"]
    vt = stability_verdict(recs, timeseries=_timeseries(recs["arrival_s"], f_obs, H), horizon_s=H)
    assert vt.stable is False and vt.source.startswith("timeseries")
    assert vt.growth_ci[0] <= lam - mu <= vt.growth_ci[1]


def test_stable_from_timeseries():
    a, s, f = mm1_times(0.8, 1.0, 40_000, seed=23)
    H = float(a[-1])
    v = stability_verdict(records_from_times(a, s, f), timeseries=_timeseries(a, f, H),
                          warmup_s=500.0, horizon_s=H)
    assert v.verdict == "stable"


def test_insufficient_data():
    a, s, f = mm1_times(0.8, 1.0, 60, seed=24)
    v = stability_verdict(records_from_times(a, s, f))
    assert v.verdict == "insufficient data" and v.stable is None and v.growth_ci is None


def test_in_system_count_is_exact():
    a = np.array([0.0, 1.0, 2.0])
    f = np.array([3.0, 1.5, np.nan])
    from _queue_sim import table

    r = table([{"arrival_s": x, "finish_s": y, "status": "ok" if y == y else "unfinished"}
               for x, y in zip(a, f)])
    N = in_system(r)
    assert N.integral(0.0, 4.0) == pytest.approx(3.0 + 0.5 + 2.0)
    assert N.pieces(2.5, 2.6)[2][0] == 2  # requests 0 and 2 in system at t = 2.5
