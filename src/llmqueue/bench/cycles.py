"""Engine-step cycles: the wall time from one step's start to the next's, the quantity behind
``b`` (Nie et al.'s mean step time in ``mu = M / (b E[g])``), shared by calibration, the speed
comparisons and the profile."""

from __future__ import annotations

import numpy as np


def step_cycles(steps, window: tuple[float, float] | None = None, *, max_gap_s: float | None = None):
    """Engine-step cycles: the wall time from one step's start to the next's, per step.

    A real engine spends time between steps too (scheduling, sampling, output processing: the
    iteration log's elapsed time leaves it out), and Nie et al.'s conservation argument counts
    steps per second, so the representative step time ``b`` is the mean *cycle* while the
    engine is busy. Returns ``(mask, cycles, weights)`` over the step rows: ``cycles[i] =
    (start[i+1] - start[i]) / k[i]`` for a row of ``k`` steps (the simulator's decode stretches),
    kept where the engine went straight on to the next step (the idle part of the gap at most
    ``max_gap_s``, default ``max(5 x the median gap, 5 ms)``) and the step starts in ``window``.
    """
    start = np.asarray(steps["start_s"], dtype=np.float64)
    dur = np.asarray(steps["duration_s"], dtype=np.float64)
    k = np.asarray(steps["steps"], dtype=np.float64) if "steps" in steps else np.ones(len(start))
    n = len(start)
    mask = np.zeros(n, dtype=bool)
    cyc = np.full(n, np.nan)
    if n < 2:
        return mask, cyc, k
    o = np.argsort(start, kind="stable")
    span = np.diff(start[o])
    gap = span - dur[o][:-1]
    if max_gap_s is None:
        max_gap_s = max(5.0 * float(np.median(np.maximum(gap, 0.0))), 0.005)
    ok = (gap <= max_gap_s) & (span > 0)
    cyc[o[:-1]] = span / np.maximum(k[o][:-1], 1.0)
    mask[o[:-1]] = ok
    if window is not None:
        mask &= (start >= window[0]) & (start < window[1])
    return mask, cyc, k
