"""The client's checks of itself: did it send on schedule? And of the server: did it stream
what ``max_tokens`` asked? (``summary["client"]``)

Scheduling lag (actual - intended send, before any concurrency wait) percentiles and its trend
over the run (drift), and a test of the realized inter-arrival gaps against what the schedule
promised: a two-sample Kolmogorov-Smirnov test for random gaps, the constant gap itself for
deterministic ones, nothing for all-at-once (:func:`arrival_check`); :func:`peak_concurrency`,
vLLM's ``max_concurrent_requests``.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue.errors import InputError

LAG_TOLERANCE_MS = 2.0


def schedule_kind(intended) -> str:
    """What a schedule of send times promises: ``all at once`` (every time equal: vLLM's
    ``--request-rate inf``), ``constant gaps`` (deterministic arrivals, every gap equal to within
    1e-9 of the mean gap) or ``random gaps`` (a sampled process, e.g. Poisson or Gamma)."""
    a = np.sort(np.asarray(intended, dtype=np.float64))
    if len(a) < 2 or np.ptp(a) == 0:
        return "all at once"
    g = np.diff(a)
    if len(g) >= 2 and np.ptp(g) <= 1e-9 * max(float(g.mean()), 1e-12):
        return "constant gaps"
    return "random gaps"


def arrival_check(intended, realized, *, lag_tolerance_ms: float | None = None, alpha: float = 0.01) -> dict:
    """Did the client send on schedule? ``intended`` and ``realized`` send times (s) of the same requests.

    Judges only what the schedule promises (``schedule``, :func:`schedule_kind`):

    - ``lag_ms``: percentiles of the scheduling lag ``realized - intended`` (mean, p50, p90, p99,
      p99.9, max); ``late_over_1ms`` / ``late_over_10ms``: fractions; ``lag_trend_ms_per_s``: the
      least-squares slope of the lag against the intended time (a client falling behind drifts);
      reported always, judged (p99 lag <= ``lag_tolerance_ms``, default 2 ms) except for a
      schedule ``all at once``, which promises no send times: its lag is how long the client took
      to send everything, not lateness;
    - random gaps: ``ks_gaps``, a two-sample Kolmogorov-Smirnov test of the realized inter-arrival
      gaps against the intended ones (``statistic`` D, ``pvalue``), and the p99 of the per-gap
      error ``|realized gap - intended gap|``; the gaps fail when the test rejects at level
      ``alpha`` and the p99 gap error exceeds the tolerance (a KS test on many gaps detects any
      jitter at all);
    - constant gaps: no KS test (the intended gaps are one value, so any jitter at all gives
      D = 1): ``gap_check``, the realized gaps against that value, failing when their p99 error
      exceeds the tolerance;
    - all at once: no gap test (there are no gaps to keep).

    ``arrivals_ok`` is true when every judged check passes.
    """
    tol = LAG_TOLERANCE_MS if lag_tolerance_ms is None else float(lag_tolerance_ms)
    a = np.asarray(intended, dtype=np.float64)
    r = np.asarray(realized, dtype=np.float64)
    if a.shape != r.shape:
        raise InputError("realized", f"needs one time per intended time ({r.shape} vs {a.shape})")
    kind = schedule_kind(a)
    out: dict = {"requests": int(len(a)), "schedule": kind}
    order = np.argsort(a, kind="stable")
    a, r = a[order], r[order]
    lag = r - a
    if len(lag):
        out["lag_ms"] = {"mean": 1e3 * float(lag.mean()),
                         **{f"p{_pw(q)}": 1e3 * float(np.percentile(lag, q)) for q in (50, 90, 99, 99.9)},
                         "max": 1e3 * float(lag.max())}
        out["late_over_1ms"] = float(np.mean(lag > 1e-3))
        out["late_over_10ms"] = float(np.mean(lag > 1e-2))
        out["lag_trend_ms_per_s"] = (1e3 * float(np.polyfit(a, lag, 1)[0])
                                     if len(a) > 2 and np.ptp(a) > 0 else None)
    else:
        out["lag_ms"] = None
    ks = gaps = None
    if len(a) >= 3 and kind != "all at once":
        ga = np.diff(a)
        gr = np.diff(np.sort(r))
        err = np.abs(np.diff(r) - ga)
        common = {"n": int(len(ga)), "mean_gap_intended_ms": 1e3 * float(ga.mean()),
                  "mean_gap_realized_ms": 1e3 * float(gr.mean()), "p99_gap_error_ms": 1e3 * float(np.percentile(err, 99))}
        if kind == "random gaps":
            stat, pvalue = ks_2samp(ga, gr)
            ks = {"statistic": stat, "pvalue": pvalue, **common}
        else:
            gaps = {"gap_ms": 1e3 * float(ga.mean()), **common}
    out["ks_gaps"] = ks
    out["gap_check"] = gaps
    problems = []
    p99 = out["lag_ms"]["p99"] if out["lag_ms"] else None
    if kind != "all at once" and p99 is not None and p99 > tol:
        problems.append(f"p99 scheduling lag {p99:.2f} ms > {tol:g} ms")
    if ks is not None and ks["pvalue"] < alpha and ks["p99_gap_error_ms"] > tol:
        problems.append(f"realized inter-arrival gaps differ from the intended ones (KS D = "
                        f"{ks['statistic']:.3f}, p = {ks['pvalue']:.2g})")
    if gaps is not None and gaps["p99_gap_error_ms"] > tol:
        problems.append(f"realized gaps differ from the constant {gaps['gap_ms']:.3g} ms by "
                        f"{gaps['p99_gap_error_ms']:.2f} ms at p99 (> {tol:g} ms)")
    out["arrivals_ok"] = not problems
    if problems:
        out["verdict"] = "client fell behind: " + "; ".join(problems)
    elif kind == "all at once":
        out["verdict"] = "ok: all sent at once (no send times promised)"
    else:
        out["verdict"] = "ok: sent on schedule"
    out["rule"] = {
        "random gaps": f"ok when p99 lag <= {tol:g} ms and the realized gaps pass a KS two-sample test against the "
                       f"intended ones at {alpha:g} (or differ from them by <= {tol:g} ms at p99: a KS test on many "
                       "gaps flags any jitter)",
        "constant gaps": f"ok when p99 lag <= {tol:g} ms and the realized gaps differ from the constant gap by "
                         f"<= {tol:g} ms at p99 (no KS test: the intended gaps are one value)",
        "all at once": "nothing judged: the schedule sends everything at once and promises no send times "
                       "(the lag says how long sending took)",
    }[kind]
    return out


def ks_2samp(x, y) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov test of realized against intended gaps: ``(D, p)``,
    two-sided, asymptotic p-value (``scipy.stats.ks_2samp``, imported when a run ends)."""
    from scipy.stats import ks_2samp as _ks

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size == 0 or y.size == 0:
        return math.nan, math.nan
    r = _ks(x, y, method="asymp")
    return float(r.statistic), float(r.pvalue)


def peak_concurrency(start, end) -> int:
    """The most intervals ``[start, end)`` open at once (an end before a start at the same time)."""
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    m = np.isfinite(start) & np.isfinite(end)
    t = np.concatenate([start[m], end[m]])
    d = np.concatenate([np.ones(int(m.sum()), dtype=np.int64), -np.ones(int(m.sum()), dtype=np.int64)])
    if not len(t):
        return 0
    order = np.lexsort((d, t))
    return int(max(0, np.cumsum(d[order]).max()))


def _pw(q) -> str:
    return str(int(q)) if int(q) == q else str(q)


def client_checks(recs, sched, closed_loop: bool, over_asked: tuple | None = None) -> dict:
    """The client's checks of a run's records ``recs`` (one row per attempt), ``sched`` the time
    each attempt's send began (before any wait for a concurrency slot): the first attempts' lag
    and gaps (:func:`arrival_check`), the retries' lag, and with a concurrency cap
    (``closed_loop``) the wait for a slot. ``over_asked``: ``(count, ratio, (request, got,
    asked))``, the ok attempts that streamed more output tokens than their ``max_tokens`` and the
    worst of them (:class:`~llmqueue.bench.sender.Sender`): a server that ignores ``max_tokens``
    serves a different workload from the one asked (more decode per request), so the verdict
    names it (``max_tokens_ok`` false) while the records keep the server's counts."""
    arr = recs["arrival_s"]
    first = recs["attempt"] == 1
    out = arrival_check(arr[first], sched[first])
    out["attempts"] = int(len(arr))
    k, ratio, worst = over_asked if over_asked is not None and over_asked[0] else (0, 0.0, None)
    n_ok = int((recs["status"] == "ok").sum())
    out["over_max_tokens"] = {"attempts": int(k), "of_ok": n_ok, "max_ratio": float(ratio),
                              **({"worst": {"request_id": int(worst[0]), "output_tokens": int(worst[1]),
                                            "max_tokens": int(worst[2])}} if worst else {})}
    out["max_tokens_ok"] = not k
    if k:
        out["verdict"] = (f"server streamed more tokens than max_tokens in {k} of {n_ok} ok attempts (up to "
                          f"{ratio:.3g}x: request {worst[0]} got {worst[1]} for {worst[2]}); "
                          + out["verdict"].replace("ok: ", "", 1))
    if (~first).any():
        lag = sched[~first] - arr[~first]
        out["retry_lag_ms"] = {"p50": 1e3 * float(np.percentile(lag, 50)),
                               "p99": 1e3 * float(np.percentile(lag, 99)), "max": 1e3 * float(lag.max())}
    wait = recs["dispatched_s"] - sched
    if closed_loop and np.isfinite(wait).any():
        w = wait[np.isfinite(wait)]
        out["client_queue_ms"] = {"mean": 1e3 * float(w.mean()), "p50": 1e3 * float(np.percentile(w, 50)),
                                  "p99": 1e3 * float(np.percentile(w, 99)), "max": 1e3 * float(w.max())}
    return out
