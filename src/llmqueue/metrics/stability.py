"""Stability verdict from a run: is the number in system trending up after warm-up?

A stable queue (rho < 1) fluctuates around a finite level; an unstable one grows on average at
``lam - mu`` requests per second (``mu`` the service capacity), whatever the service-time
distribution. Two estimates of that growth over the window ``[t0, t1]``, ``T = t1 - t0``:

1. **Queue slope** (``growth_per_s``): least-squares slope, in continuous time, of the number in
   system ``N(t)``: from the time series when one is given (``num_waiting + num_running`` summed
   over replicas, sample-and-hold; for a real server, from its /metrics), else from the request
   records (arrivals minus departures, exact). Waiting plus running, not waiting alone: an engine
   without a batch cap admits everyone, so its waiting queue can stay empty while the running
   batch grows.
2. **Rate gap** (``rate_gap_per_s``): arrival rate minus departure rate (requests leaving by any
   status) over the window, from the records.

Confidence intervals, robust to autocorrelation, by batching in time: the window is cut into
``k`` equal sub-windows (``batches``, default 20, fewer when there are fewer than
``min_batch_arrivals`` arrivals per batch); each gives its own slope (and rate gap); the
interval is the overall estimate +- ``t_{k-1} sd / sqrt(k)``. When the queue is unstable, N(t) is
a random walk with drift and the batch estimates are independent, so the interval is right;
when it is stable, N(t) is stationary and the interval is conservative (wider than the overall
slope's true error), which errs towards "stable" only when the data cannot show growth.

Verdict (documented threshold): ``unstable`` when, for either estimate, the whole interval lies
above 0 **and** the estimate exceeds ``rel_threshold`` (default 1%) of the arrival rate: a
significant growth that is not negligible next to the offered load (a queue growing by less
than 1% of arrivals is a slow transient or a near-critical queue, reported as stable with its
growth). ``stable`` otherwise (including a significantly shrinking queue, i.e. a draining
backlog). ``insufficient data`` with fewer than ``min_batches * min_batch_arrivals`` (default
10 x 10 = 100) arrivals in the window.

The verdict of a whole run (:func:`system_verdict`, what ``summarize`` reports) judges more than
the queue: a queue can stay flat because the system throws work away. Judged over the arrival
window only (from warm-up to the last arrival, never over the drain after it, where a backlog
shrinks whatever the load was):

- ``unstable: queue grows X req/s ...`` as above;
- ``overloaded: N% failed (timeout a%, rejected b%)`` when significantly more than
  :data:`FAILED_SHARE_LIMIT` (5%) of the requests arriving in the window were rejected, timed
  out, cancelled or failed (the Wilson interval of the share, at the run's confidence level,
  lies above it): the queue stays bounded only because requests leave unserved (reneging and
  balking);
- ``failing SLOs: N% met them ...`` when SLOs are given and fewer than :data:`GOODPUT_SHARE_LIMIT`
  (50%) of the arrivals were good (finished within every target): goodput has collapsed;
- ``stable`` otherwise. The boolean ``stable`` is False for the first two (the system does not
  serve its offered load), True for the third (the queue is bounded and nothing is dropped; the
  latency targets fail).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmqueue._result import Result
from llmqueue._validate import nonnegative, positive_int, probability
from llmqueue.metrics._common import StepFunction, window
from llmqueue.metrics.ci import DEFAULT_BATCHES, DEFAULT_LEVEL, MIN_BATCHES, t_quantile


@dataclass(frozen=True)
class StabilityVerdict(Result):
    """``verdict`` text; ``stable`` (None if undecided); growth estimates with intervals."""

    verdict: str
    stable: bool | None
    growth_per_s: float
    growth_ci: tuple[float, float] | None
    rate_gap_per_s: float
    rate_gap_ci: tuple[float, float] | None
    arrival_rate: float
    departure_rate: float
    threshold_per_s: float
    source: str
    t0: float
    t1: float
    arrivals: int
    batches: int
    level: float


FAILED_STATUSES = ("rejected", "timeout", "cancelled", "error")
FAILED_SHARE_LIMIT = 0.05   # failed share of arrivals above which a run is overloaded
GOODPUT_SHARE_LIMIT = 0.5   # good share of arrivals below which goodput has collapsed


def _share_low(k: int, n: int, level: float) -> float:
    """Lower end of the Wilson interval of a share ``k / n``."""
    from scipy.stats import binomtest

    return float(binomtest(k, n).proportion_ci(confidence_level=level, method="wilson").low)


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def system_verdict(queue: StabilityVerdict, status_counts: dict, good_share: float | None = None,
                   goodput: float | None = None, level: float = DEFAULT_LEVEL) -> tuple[str, bool | None]:
    """The verdict of a whole run: ``(text, stable)`` from the queue trend ``queue``, the
    statuses of the requests arriving in the window (``status_counts``) and, with SLOs, the share
    of them that were good (``good_share``) and the goodput (req/s). See the module docstring."""
    arrivals = sum(int(v) for v in status_counts.values())
    failed = {k: int(status_counts.get(k, 0)) for k in FAILED_STATUSES if status_counts.get(k)}
    share = sum(failed.values()) / arrivals if arrivals else 0.0
    why = ""
    if share > FAILED_SHARE_LIMIT and _share_low(sum(failed.values()), arrivals, level) > FAILED_SHARE_LIMIT:
        parts = ", ".join(f"{k} {_pct(v / arrivals)}" for k, v in sorted(failed.items(), key=lambda kv: -kv[1]))
        why = f"{_pct(share)} failed ({parts})"
    if queue.stable is False:
        return (queue.verdict + (f"; {why}" if why else ""), False)
    if why:
        return ("overloaded: " + why, False)
    if good_share is not None and arrivals and good_share < GOODPUT_SHARE_LIMIT:
        g = f" (goodput {goodput:.3g} req/s of {queue.arrival_rate:.3g} arriving)" if goodput is not None else ""
        return (f"failing SLOs: {_pct(good_share)} of requests met them{g}", queue.stable)
    return queue.verdict, queue.stable


def _t_ci(center: float, values: np.ndarray, level: float) -> tuple[float, float]:
    k = len(values)
    hw = t_quantile(level, k - 1) * float(np.std(values, ddof=1)) / math.sqrt(k)
    return (center - hw, center + hw)


def in_system(requests) -> StepFunction:
    """``N(t)``, the number of requests in system, from the records (+1 at arrival, -1 at finish;
    requests in flight at the end, ``finish_s`` NaN, never leave)."""
    a = requests["arrival_s"]
    d = requests["finish_s"]
    fin = np.isfinite(d)
    times = np.concatenate([a, d[fin]])
    jumps = np.concatenate([np.ones(len(a)), -np.ones(int(fin.sum()))])
    return StepFunction.from_jumps(times, jumps, 0.0)


def stability_verdict(requests, *, timeseries=None, warmup_s: float = 0.0,
                      horizon_s: float | None = None, level: float = DEFAULT_LEVEL,
                      batches: int = DEFAULT_BATCHES, min_batches: int = MIN_BATCHES,
                      min_batch_arrivals: int = 10, rel_threshold: float = 0.01
                      ) -> StabilityVerdict:
    """Stable or unstable, from the trend of the number in system after warm-up.

    See the module docstring for the estimators, the intervals and the threshold.
    """
    level = probability("level", level)
    batches = positive_int("batches", batches, minimum=2)
    min_batches = positive_int("min_batches", min_batches, minimum=2)
    min_batch_arrivals = positive_int("min_batch_arrivals", min_batch_arrivals)
    rel_threshold = nonnegative("rel_threshold", rel_threshold)
    t0, t1 = window(requests, warmup_s, horizon_s)
    T = t1 - t0
    a = requests["arrival_s"]
    d = requests["finish_s"]
    arrived = (a >= t0) & (a < t1)
    n_arr = int(arrived.sum())
    left = np.isfinite(d) & (d >= t0) & (d <= t1)
    lam = n_arr / T
    dep = int(left.sum()) / T
    if timeseries is not None and len(timeseries):
        f = StepFunction.from_samples(timeseries["t_s"],
                                      timeseries["num_waiting"] + timeseries["num_running"],
                                      timeseries["replica"])
        source = "timeseries: num_waiting + num_running"
    else:
        f = in_system(requests)
        source = "requests: number in system"
    slope = f.ols_slope(t0, t1)
    gap = lam - dep
    threshold = rel_threshold * lam
    k = min(batches, n_arr // min_batch_arrivals)
    common = dict(growth_per_s=slope, rate_gap_per_s=gap, arrival_rate=lam, departure_rate=dep,
                  threshold_per_s=threshold, source=source, t0=t0, t1=t1, arrivals=n_arr,
                  level=level)
    if k < min_batches:
        return StabilityVerdict(verdict="insufficient data", stable=None, growth_ci=None,
                                rate_gap_ci=None, batches=k, **common)
    edges = np.linspace(t0, t1, k + 1)
    slopes = np.array([f.ols_slope(edges[j], edges[j + 1]) for j in range(k)])
    width = T / k
    ja = np.minimum(((a[arrived] - t0) / width).astype(np.int64), k - 1)
    jd = np.minimum(((d[left] - t0) / width).astype(np.int64), k - 1)
    gaps = (np.bincount(ja, minlength=k) - np.bincount(jd, minlength=k)) / width
    growth_ci = _t_ci(slope, slopes, level)
    gap_ci = _t_ci(gap, gaps, level)
    slope_grows = growth_ci[0] > 0 and slope > threshold
    gap_grows = gap_ci[0] > 0 and gap > threshold
    if slope_grows or gap_grows:
        x, (lo, hi) = (slope, growth_ci) if slope_grows else (gap, gap_ci)
        verdict = (f"unstable: queue grows {x:.3g} req/s "
                   f"({100 * level:g}% CI {lo:.3g} to {hi:.3g})")
        stable = False
    else:
        verdict, stable = "stable", True
    return StabilityVerdict(verdict=verdict, stable=stable, growth_ci=growth_ci, rate_gap_ci=gap_ci,
                            batches=k, **common)
