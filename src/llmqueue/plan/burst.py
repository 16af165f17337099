"""The planner's burst bound: a time-varying arrival process outruns a deployment at its peak.

The rate bound ``rho = lam / (R mu) <= rho_max`` uses the *mean* rate ``lam``. A bursty process
(``onoff``, ``piecewise``, ``spike``, ``diurnal``) holds levels above its mean for minutes; a
deployment whose service rate lies between the mean and the peak is stable on average and still
builds a queue during every peak. If a level ``lam_peak > C`` is held for ``T`` seconds, the
backlog grows by ``(lam_peak - C) T`` requests; once that backlog exceeds what the replicas hold
at once, newcomers wait for completions, which come at most at the rate ``C``.

**The bound** is taken on the very arrival path the simulation will serve (the scenario's
request stream for the planner's seed and duration), so it covers every level, window and
random on-period of the process as realised, not a guess at its longest one. With
``C = R mu / rho_max`` as the most requests per second the deployment completes (the rate
bound's own ceiling: a steady ``lam`` above it is already pruned), the fluid backlog at arrival
``i`` follows the Lindley recursion on counts

    ``Q_i = max(0, Q_{i-1} - C (t_i - t_{i-1})) + 1``

(a lower bound on the requests in system: ``Q_i = max_s A(s, t_i] - C (t_i - s)``). At most
``S = R * max_num_seqs`` of them run; request ``i`` cannot start (so gets no first token) before
``Q_i - S`` completions, i.e. it waits at least ``W_i = (Q_i - S) / C``. When more than 1% of the
requests in the measured window (after the warm-up) have ``W_i`` above the p99 TTFT target, the
p99 TTFT exceeds the target (or those requests time out and count as failed) whatever the
simulation does in detail: the configuration is pruned (``burst bound``). With a constant rate
the recursion reproduces the rate bound (``Q`` grows iff ``lam > C``); the burst bound adds
nothing for Poisson arrivals below the ceiling.

Caveat: ``mu`` is a mean-workload capacity, not a hard per-second ceiling; the ``1 / rho_max``
margin on it is what keeps the bound conservative (the planner's tests compare it against an
exhaustive simulation of a bursty space).
"""

from __future__ import annotations

import numpy as np


def fluid_backlog(arrivals: np.ndarray, C: float) -> np.ndarray:
    """``Q_i`` of the recursion above for sorted arrival times ``arrivals`` (s), service rate ``C``:
    ``Q_i - 1`` is the reflected walk ``S_i - min_{k <= i} S_k`` of ``S_i = i - C (t_i - t_0)``."""
    t = np.asarray(arrivals, dtype=np.float64)
    if t.size == 0:
        return np.empty(0)
    s = np.arange(t.size, dtype=np.float64) - C * (t - t[0])
    return s - np.minimum.accumulate(s) + 1.0


def late_share(arrivals: np.ndarray, warmup_s: float, *, C: float, slots: float, wait_s: float) -> float:
    """The share of requests arriving after ``warmup_s`` whose fluid wait ``(Q_i - slots) / C``
    exceeds ``wait_s``."""
    t = np.asarray(arrivals, dtype=np.float64)
    if t.size == 0 or not C > 0:
        return 0.0
    w = (fluid_backlog(t, C) - slots) / C
    m = t >= warmup_s
    return float(np.mean(w[m] > wait_s)) if m.any() else 0.0


def burst_reason(arrivals, warmup_s: float, *, rate_bound: float, rho_max: float, slots: float,
                 ttft_target_ms: float | None, share: float = 0.01) -> str | None:
    """The pruning reason when the burst bound rules the configuration out, else None."""
    if arrivals is None or ttft_target_ms is None or rate_bound is None:
        return None
    C = rate_bound / rho_max
    s = late_share(arrivals, warmup_s, C=C, slots=slots, wait_s=ttft_target_ms / 1e3)
    if s > share:
        return (f"burst bound: {100 * s:.3g}% of requests wait > {ttft_target_ms:g} ms before their first step "
                f"(fluid backlog of the arrival path above R mu / rho_max = {C:.4g} req/s, beyond "
                f"{slots:g} running slots)")
    return None
