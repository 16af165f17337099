"""Little's-law check on a run: does the time-average number in system equal ``lam * W``?

Estimators over the measurement window ``[t0, t1]`` (``t0 = warmup_s``, ``T = t1 - t0``):

- ``L``: time-average number of requests in system, ``(1/T) int_{t0}^{t1} N(t) dt`` with
  ``N(t) = #{i : a_i <= t < d_i}`` (``a`` = ``arrival_s``, ``d`` = ``finish_s``). Computed exactly
  as ``sum_i |[a_i, d_i) & [t0, t1)| / T``: every request counts for the part of its stay inside
  the window, including requests that arrived before ``t0`` and those still present at ``t1``;
  a request still in the system when the run stopped (``finish_s`` NaN) stays until ``t1``.
  Every status counts (a rejection is a stay of length ``finish_s - arrival_s``, ~0).
- ``lam``: arrivals in ``[t0, t1)`` divided by ``T``.
- ``W``: mean sojourn ``d_i - a_i`` of the requests that arrived in ``[t0, t1)`` and finished
  (at any time, also after ``t1``; those still in flight have no sojourn and are counted in
  ``in_flight``).

Edge effects: ``L * T = lam * T * W + (carry-in) - (carry-out)``, where carry-in is the time
requests that arrived before ``t0`` spend in the window and carry-out the time window arrivals
spend after ``t1``. In a stable system both are O(L * W), so the relative gap
``|L - lam W| / L`` is O(W / T) and vanishes on long runs. A gap of more than a few percent
means the run is too short for its latencies, the warm-up was not removed, or the records are
inconsistent (e.g. a time series that disagrees with the request log). It is not a stability
test: Little's law is a sample-path identity, and even an overloaded FCFS queue started empty
keeps ``L ~ lam W`` over ``[0, t1]`` (fluid limit: both equal ``(lam - mu) t1 / 2``) with ``W``
taken over the finished requests; use :mod:`llmqueue.metrics.stability` for that.

If a time series is given, ``L_timeseries`` (time-average ``num_waiting + num_running`` summed
over replicas, sample-and-hold) is an independent measurement of ``L`` (for a real server, from
its /metrics), compared with ``lam * W`` as ``gap_timeseries``.

Source: J. D. C. Little, "A proof for the queuing formula L = lambda W", Oper. Res. 9 (1961);
the finite-horizon identity as in Stidham (1974) / El-Taha & Stidham, *Sample-Path Analysis of
Queueing Systems* (1999).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmqueue._result import Result
from llmqueue.metrics._common import StepFunction, window


@dataclass(frozen=True)
class LittleCheck(Result):
    """``L`` (time-average number in system), ``lam`` (arrival rate), ``W`` (mean sojourn, s),
    ``lam_W``, ``gap = |L - lam W| / L``; counts and window; optional time-series ``L``."""

    L: float
    lam: float
    W: float
    lam_W: float
    gap: float
    t0: float
    t1: float
    arrivals: int
    finished: int
    in_flight: int
    throughput: float
    L_timeseries: float | None = None
    gap_timeseries: float | None = None


def in_system_integral(arrival_s, finish_s, t0: float, t1: float) -> float:
    """``int_{t0}^{t1} N(t) dt``: total time requests spend in system inside the window.

    A NaN finish means "still in system" (counted to ``t1``).
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    d = np.asarray(finish_s, dtype=np.float64)
    d = np.where(np.isnan(d), np.inf, d)
    overlap = np.minimum(d, t1) - np.maximum(a, t0)
    return float(np.sum(np.clip(overlap, 0.0, None)))


def little_check(requests, *, warmup_s: float = 0.0, horizon_s: float | None = None,
                 timeseries=None) -> LittleCheck:
    """Little's law, ``L = lam W``, checked on ``requests`` over ``[warmup_s, horizon_s]``.

    See the module docstring for the estimators. ``horizon_s`` defaults to the last observed
    event in the records; give the run's stop time when requests were in flight then.
    """
    t0, t1 = window(requests, warmup_s, horizon_s)
    T = t1 - t0
    a = requests["arrival_s"]
    d = requests["finish_s"]
    L = in_system_integral(a, d, t0, t1) / T
    arrived = (a >= t0) & (a < t1)
    done = arrived & np.isfinite(d)
    n_arr = int(arrived.sum())
    lam = n_arr / T
    W = float(np.mean(d[done] - a[done])) if done.any() else float("nan")
    lam_W = lam * W
    gap = abs(L - lam_W) / L if L > 0 and np.isfinite(lam_W) else float("nan")
    departures = int(np.sum(np.isfinite(d) & (d >= t0) & (d <= t1)))
    L_ts = gap_ts = None
    if timeseries is not None and len(timeseries):
        f = StepFunction.from_samples(timeseries["t_s"],
                                      timeseries["num_waiting"] + timeseries["num_running"],
                                      timeseries["replica"])
        L_ts = f.mean(t0, t1)
        gap_ts = abs(L_ts - lam_W) / L_ts if L_ts > 0 and np.isfinite(lam_W) else float("nan")
    return LittleCheck(L=L, lam=lam, W=W, lam_W=lam_W, gap=gap, t0=t0, t1=t1, arrivals=n_arr,
                       finished=int(done.sum()), in_flight=int(n_arr - done.sum()),
                       throughput=departures / T, L_timeseries=L_ts, gap_timeseries=gap_ts)
