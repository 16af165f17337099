"""The numbers behind the plots, computed from records (no plotting here).

- :func:`queue_series`: waiting and running requests over time (the time series, else steps,
  else the request records).
- :func:`kv_series`: KV tokens in use over time, and the capacity ``M`` when the run says it.
- :func:`latencies`: TTFT, TPOT, E2EL and queue time of finished requests (vLLM definitions);
  :func:`class_latencies` the same per request class.
- :func:`latency_over_time`: p50 and p99 of each latency by arrival-time bin.
- :func:`output_rate`: output tokens per second over time, from the request records.
- :func:`ecdf_points`: an empirical CDF thinned for plotting, keeping the tail.
- :func:`decomposition`: each finished request's time split into queue (arrival to first
  scheduled step), prefill (first scheduled step to first token: TTFT minus queue) and decode
  (first token to the last: E2EL minus TTFT); means overall and by arrival-time bin.
- :func:`verdict_note`: "bounded" or "growing" from the stability verdict.
- :func:`knee_index`: the knee of a rising curve (Kneedle), :func:`elasticity_knee` (log-log slope 1).
"""

from __future__ import annotations

import math

import numpy as np

MAX_POINTS = 4000  # time series longer than this are resampled (sample-and-hold) for plotting


def _sum_over_replicas(t, cols, replica):
    """Sample-and-hold totals over replicas on the union of the sample times."""
    t = np.asarray(t, dtype=np.float64)
    reps = np.unique(replica)
    if len(reps) <= 1:
        o = np.argsort(t, kind="stable")
        return t[o], [np.asarray(c, dtype=np.float64)[o] for c in cols]
    grid = np.unique(t)
    totals = [np.zeros(len(grid)) for _ in cols]
    for r in reps:
        m = replica == r
        o = np.argsort(t[m], kind="stable")
        tr = t[m][o]
        idx = np.searchsorted(tr, grid, side="right") - 1
        ok = idx >= 0
        for tot, c in zip(totals, cols):
            tot[ok] += np.asarray(c, dtype=np.float64)[m][o][idx[ok]]
    return grid, totals


def _resample(t, cols, n: int = MAX_POINTS):
    """At most ``n`` points: the held value at a uniform grid (keeps the shape of long series)."""
    if len(t) <= n:
        return t, cols
    grid = np.linspace(t[0], t[-1], n)
    idx = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(t) - 1)
    return grid, [c[idx] for c in cols]


def queue_series(run):
    """``(t_s, waiting, running, source)`` summed over replicas, or ``None`` without data."""
    ts = run.timeseries
    if ts is not None and len(ts):
        t, (w, r) = _sum_over_replicas(ts["t_s"], [ts["num_waiting"], ts["num_running"]], ts["replica"])
        src = "time series"
    elif run.steps is not None and len(run.steps):
        st = run.steps
        t, (w, r) = _sum_over_replicas(st["start_s"] + st["duration_s"], [st["num_waiting"], st["num_running"]],
                                       st["replica"])
        src = "step records"
    elif run.requests is not None and len(run.requests):
        t, w, r = _queue_from_requests(run)
        src = "request records"
    else:
        return None
    t, (w, r) = _resample(t, [w, r])
    return t, w, r, src


def _queue_from_requests(run):
    """Waiting (arrived, not yet first scheduled, else not yet a first token) and running (then to
    the finish) counted from the request records; a request still in flight stays to the end."""
    rq = run.requests
    a = np.asarray(rq["arrival_s"], dtype=np.float64)
    start = np.asarray(rq["first_scheduled_s"], dtype=np.float64)
    start = np.where(np.isfinite(start), start, np.asarray(rq["first_token_s"], dtype=np.float64))
    fin = np.asarray(rq["finish_s"], dtype=np.float64)
    end = float(np.nanmax(np.concatenate([a, fin[np.isfinite(fin)], start[np.isfinite(start)]])))
    h = (run.summary or {}).get("horizon_s")
    if isinstance(h, (int, float)) and math.isfinite(h):
        end = max(end, float(h))
    fin = np.where(np.isfinite(fin), fin, end)
    start = np.where(np.isfinite(start), np.minimum(start, fin), fin)  # never started: waited to the end
    t = np.unique(np.concatenate([a, start, fin, [end]]))
    count = lambda x: np.searchsorted(np.sort(x), t, side="right")  # noqa: E731 - events at or before t
    return t, (count(a) - count(start)).astype(np.float64), (count(start) - count(fin)).astype(np.float64)


def kv_capacity(run) -> float | None:
    """KV capacity ``M`` (tokens per replica) as the run, its engine or its validation says."""
    s = run.summary or {}
    for v in (s.get("kv_capacity_tokens"), (s.get("theory") or {}).get("M")):
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    eng = s.get("engine") or {}
    if eng.get("num_gpu_blocks") and eng.get("block_size"):
        return float(eng["num_gpu_blocks"] * eng["block_size"])
    cal = (run.validate or {}).get("calibration") or {}
    v = cal.get("capacity_tokens")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def kv_series(run):
    """``(t_s, kv_tokens_per_replica, source)``: mean over replicas, or ``None`` without data."""
    ts = run.timeseries
    if ts is not None and len(ts):
        t, (kv,) = _sum_over_replicas(ts["t_s"], [ts["kv_tokens"]], ts["replica"])
        n, src = len(np.unique(ts["replica"])), "time series"
    elif run.steps is not None and len(run.steps):
        st = run.steps
        t, (kv,) = _sum_over_replicas(st["start_s"] + st["duration_s"], [st["kv_tokens"]], st["replica"])
        n, src = len(np.unique(st["replica"])), "step records"
    else:
        return None
    if not np.any(kv) and kv_capacity(run) is None:
        return None  # all zeros and no capacity: the server did not report its cache (bench without M)
    t, (kv,) = _resample(t, [kv])
    return t, kv / max(n, 1), src


def _window_mask(run):
    s = run.summary or {}
    a = run.requests["arrival_s"]
    m = run.requests["status"] == "ok"
    t0 = s.get("warmup_s")
    t1 = s.get("horizon_s")
    if isinstance(t0, (int, float)):
        m &= a >= t0
    if isinstance(t1, (int, float)):
        m &= a < t1
    return m


def latencies(run) -> dict:
    """Finished (``ok``) requests arriving in the summary's window: seconds, per metric.

    Keys ``ttft``, ``tpot``, ``e2el``, ``queue`` (NaN dropped) and ``arrival`` (for
    ``ttft``/``e2el``/``queue`` order).
    """
    d = run.requests.derived()
    m = _window_mask(run)
    out = {}
    for k in ("ttft", "tpot", "e2el", "queue"):
        x = d[f"{k}_s"][m]
        out[k] = x[np.isfinite(x)]
    return out


def class_latencies(run) -> dict:
    """``{class: latencies(run) restricted to that class}`` for the classes with finished requests."""
    d = run.requests.derived()
    m = _window_mask(run)
    cls = np.asarray(run.requests["class"]).astype(str)
    out = {}
    for c in np.unique(cls[m]):
        mc = m & (cls == c)
        lat = {k: d[f"{k}_s"][mc] for k in ("ttft", "tpot", "e2el", "queue")}
        out[str(c)] = {k: v[np.isfinite(v)] for k, v in lat.items()}
    return out


def _arrival_bins(t0: float, t1: float, n: int, per_bin: int) -> np.ndarray:
    """Bin edges over ``[t0, t1]``: at most 60 bins, about ``per_bin`` requests each."""
    k = int(min(60, max(1, n // per_bin)))
    return np.linspace(t0, t1 + 1e-9 * max(1.0, abs(t1)), k + 1)


def latency_over_time(run, *, per_bin: int = 25, min_n: int = 5) -> dict | None:
    """p50 and p99 of TTFT, TPOT and E2EL (seconds) of the finished requests by arrival time.

    Every finished (``ok``) request counts, warm-up included (the plot shades it). Arrival
    times are cut into at most 60 equal bins of about ``per_bin`` requests; a bin with fewer
    than ``min_n`` values of a metric gets NaN. Returns ``{"t": bin centres, "width": s,
    metric: {"p50": ..., "p99": ..., "n": counts}}`` or ``None`` without finished requests.
    """
    d = run.requests.derived()
    ok = np.asarray(run.requests["status"]) == "ok"
    a = np.asarray(run.requests["arrival_s"], dtype=np.float64)[ok]
    if len(a) < min_n:
        return None
    edges = _arrival_bins(float(a.min()), float(a.max()), len(a), per_bin)
    which = np.clip(np.searchsorted(edges, a, side="right") - 1, 0, len(edges) - 2)
    out = {"t": (edges[:-1] + edges[1:]) / 2, "width": float(edges[1] - edges[0])}
    for k in ("ttft", "tpot", "e2el"):
        x = d[f"{k}_s"][ok]
        p50, p99, n = (np.full(len(edges) - 1, np.nan) for _ in range(3))
        for b in range(len(edges) - 1):
            v = x[(which == b) & np.isfinite(x)]
            n[b] = len(v)
            if len(v) >= min_n:
                p50[b], p99[b] = np.percentile(v, [50, 99])
        out[k] = {"p50": p50, "p99": p99, "n": n}
    return out


def output_rate(run, *, bins: int = 120) -> dict | None:
    """Output tokens per second over time, from the finished requests' records.

    Each finished (``ok``) request's first token counts at ``first_token_s`` and its other
    ``output_tokens - 1`` tokens are spread evenly from there to ``finish_s`` (the records keep
    no per-token times); the rate is the tokens falling in each of ``bins`` equal bins over the
    bin's width. Returns ``{"t": bin centres, "width": s, "tokens_per_s": ...}`` or ``None``
    without a finished request that produced a token.
    """
    rq = run.requests
    ok = np.asarray(rq["status"]) == "ok"
    t1 = np.asarray(rq["first_token_s"], dtype=np.float64)[ok]
    f = np.asarray(rq["finish_s"], dtype=np.float64)[ok]
    n = np.asarray(rq["output_tokens"], dtype=np.float64)[ok]
    keep = np.isfinite(t1) & np.isfinite(f) & (n >= 1)
    t1, f, n = t1[keep], np.maximum(f[keep], t1[keep]), n[keep]
    if not len(t1):
        return None
    lo, hi = float(t1.min()), float(f.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    width = float(edges[1] - edges[0])
    first = np.histogram(t1, bins=edges)[0].astype(np.float64)
    span = f - t1
    spread = span > 0
    rate = np.where(spread, (n - 1) / np.where(spread, span, 1.0), 0.0)
    # tokens up to x of a request decoding at rate r on [s, e]: r (min(x, e) - s)+; cumulate with sorted sums
    cum = _ramp_sum(edges, t1[spread], rate[spread]) - _ramp_sum(edges, f[spread], rate[spread])
    instant = n - 1  # a request whose last token came with its first: all of them at first_token_s
    first += np.histogram(t1[~spread], bins=edges, weights=instant[~spread])[0]
    tokens = first + np.diff(cum)
    return {"t": (edges[:-1] + edges[1:]) / 2, "width": width, "tokens_per_s": tokens / width}


def _ramp_sum(x, s, r):
    """``sum_i r_i max(x - s_i, 0)`` at each ``x``."""
    o = np.argsort(s)
    s, r = s[o], r[o]
    R = np.concatenate([[0.0], np.cumsum(r)])
    S = np.concatenate([[0.0], np.cumsum(r * s)])
    k = np.searchsorted(s, x, side="right")
    return x * R[k] - S[k]


def ecdf_points(x, n: int = 600):
    """``(x_sorted, F)`` of the empirical CDF, thinned to about ``n`` points for plotting.

    Keeps points evenly spread in probability and, for a tail plot, log-spaced from the top
    (``1 - F`` down to ``1/N``), so a CCDF on log axes keeps its shape. ``F`` at the i-th smallest
    of N values is ``i / N``.
    """
    x = np.sort(np.asarray(x, dtype=np.float64))
    N = len(x)
    if N == 0:
        return x, x
    if N > n:
        even = np.linspace(0, N - 1, n // 2).round().astype(np.int64)
        tail = N - np.unique(np.geomspace(1, N, n // 2).round().astype(np.int64))
        idx = np.unique(np.concatenate([even, tail, [0, N - 1]]))
    else:
        idx = np.arange(N)
    return x[idx], (idx + 1) / N


#: Parts of a request's latency, in order, with their legend text.
PARTS = {"queue": "queue (arrival to first scheduled step)", "prefill": "prefill (TTFT - queue)",
         "ttft": "TTFT (queue + prefill: the client cannot separate them)", "decode": "decode (E2EL - TTFT)"}


def decomposition(run, bins: int = 30) -> dict | None:
    """Per-request queue / prefill / decode times of finished requests (seconds).

    Returns ``{"parts": [names], "mean": {part: s}, "n": N, "bin_t": centres, "bin": {part: means},
    "bin_n": counts}``, or ``None`` with no finished request. Prefill here is TTFT minus the
    queue time (it includes waits between chunks of a chunked prefill and any recompute after a
    preemption before the first token). A measured run whose records do not say when a request
    was first scheduled (``first_scheduled_s`` NaN: the client cannot see it) is split into TTFT
    and decode only.
    """
    d = run.requests.derived()
    m = _window_mask(run)
    q, ttft, e2el = d["queue_s"][m], d["ttft_s"][m], d["e2el_s"][m]
    a = run.requests["arrival_s"][m]
    base = np.isfinite(ttft) & np.isfinite(e2el)
    if not base.any():
        return None
    with_queue = base & np.isfinite(q)
    if with_queue.sum() >= 0.5 * base.sum():
        ok = with_queue
        parts = {"queue": q[ok], "prefill": np.clip(ttft[ok] - q[ok], 0, None)}
    else:
        ok = base
        parts = {"ttft": ttft[ok]}
    parts["decode"] = np.clip(e2el[ok] - ttft[ok], 0, None)
    a = a[ok]
    edges = np.linspace(a.min(), a.max() + 1e-9, max(1, min(bins, len(a))) + 1)
    which = np.clip(np.searchsorted(edges, a, side="right") - 1, 0, len(edges) - 2)
    counts = np.bincount(which, minlength=len(edges) - 1)
    keep = counts > 0
    binned = {k: (np.bincount(which, weights=v, minlength=len(edges) - 1)[keep] / counts[keep])
              for k, v in parts.items()}
    return {"parts": list(parts), "mean": {k: float(np.mean(v)) for k, v in parts.items()}, "n": int(len(a)),
            "bin_t": ((edges[:-1] + edges[1:]) / 2)[keep], "bin": binned, "bin_n": counts[keep]}


def verdict_note(summary: dict | None) -> tuple[str, str]:
    """``(word, detail)``: ``"bounded"``, ``"growing"``, ``"overloaded"`` (requests failed),
    ``"failing SLOs"`` or ``"undecided"``, with the verdict text."""
    s = summary or {}
    verdict = str(s.get("verdict") or "")
    stable = s.get("stable")
    g = s.get("queue_growth_per_s")
    trend = f" (queue trend {g:+.3g} req/s)" if isinstance(g, (int, float)) else ""
    if verdict.startswith("overloaded"):
        return "overloaded", verdict
    if stable is True:
        if verdict.startswith("failing SLOs"):
            return "failing SLOs", verdict + trend
        return "bounded", "stable" + trend
    if stable is False:
        return "growing", verdict or "unstable"
    return "undecided", verdict or "no stability verdict in summary.json"


def knee_index(x, y, *, min_gap: float = 0.05) -> int | None:
    """Index of the knee of a rising, convex curve ``y(x)`` (Kneedle; Satopaa et al. 2011).

    Both axes are scaled to [0, 1]; the knee is the point furthest below the chord from the
    first to the last point, i.e. where ``y`` stops staying flat and starts to climb (for a
    latency-against-load curve: the last load before latency takes off). ``None`` for fewer
    than three points or when no point lies ``min_gap`` (scaled) below the chord (a straight
    or concave curve has no knee).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    idx = np.flatnonzero(ok)
    if len(idx) < 3:
        return None
    o = idx[np.argsort(x[idx], kind="stable")]
    xs, ys = x[o], y[o]
    xr, yr = xs[-1] - xs[0], ys.max() - ys.min()
    if xr <= 0 or yr <= 0:
        return None
    xn = (xs - xs[0]) / xr
    yn = (ys - ys.min()) / yr
    chord = yn[0] + (yn[-1] - yn[0]) * xn
    gap = chord - yn
    k = int(np.argmax(gap))
    return int(o[k]) if gap[k] >= min_gap and not math.isclose(gap[k], 0.0) else None


def elasticity_knee(x, y, *, threshold: float = 1.0) -> int | None:
    """Index of the last point before latency grows faster than throughput, in relative terms.

    Points sorted by ``x`` (throughput); between neighbours the elasticity is
    ``ln(y2 / y1) / ln(x2 / x1)``: the percentage rise in ``y`` (latency) per percent of ``x``.
    The knee is the first point whose step to the next has elasticity ``>= threshold`` (default
    1: beyond it, 1% more throughput costs more than 1% more latency), i.e. where the curve turns
    steeper than 45 degrees on log-log axes. Scale-free, and unlike Kneedle it does not depend on
    where the curve is cut off. ``None`` with fewer than two positive points or no such step.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0))
    if len(ok) < 2:
        return None
    o = ok[np.argsort(x[ok], kind="stable")]
    lx, ly = np.log(x[o]), np.log(y[o])
    for i in range(len(o) - 1):
        dx = lx[i + 1] - lx[i]
        if dx > 0 and (ly[i + 1] - ly[i]) / dx >= threshold:
            return int(o[i])
    return None
