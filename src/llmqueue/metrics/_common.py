"""Shared helpers: the measurement window and piecewise-constant (step) functions of time."""

from __future__ import annotations

import math

import numpy as np

from llmqueue._validate import nonnegative
from llmqueue.errors import InputError


def run_end(requests) -> float:
    """The last observed event in the records: the latest finite ``finish_s``,
    ``first_token_s``, ``first_scheduled_s``, or arrival of a request that finished.

    Arrivals of requests with no finish (in flight at the stop, or arriving after it, as the
    engine records them) do not extend it, since the records do not say when the run stopped;
    give ``horizon_s`` for that. If nothing ever finished, the latest arrival.
    """
    if len(requests) == 0:
        return 0.0
    fin = requests["finish_s"]
    done = np.isfinite(fin)
    if not done.any():
        return float(np.max(requests["arrival_s"]))
    ends = [float(np.max(fin[done])), float(np.max(requests["arrival_s"][done]))]
    for col in ("first_token_s", "first_scheduled_s"):
        x = requests[col]
        x = x[np.isfinite(x)]
        if len(x):
            ends.append(float(np.max(x)))
    return max(ends)


def window(requests, warmup_s: float = 0.0, horizon_s: float | None = None) -> tuple[float, float]:
    """The measurement window ``[t0, t1]``: ``t0 = warmup_s``, ``t1 = horizon_s`` or
    :func:`run_end`."""
    t0 = nonnegative("warmup_s", warmup_s)
    if horizon_s is None:
        t1 = run_end(requests)
    else:
        t1 = nonnegative("horizon_s", horizon_s)
    if not t1 > t0:
        raise InputError("warmup_s" if horizon_s is None else "horizon_s",
                         f"the measurement window [{t0:g}, {t1:g}] s is empty",
                         "use a warm-up shorter than the run (or a later horizon)")
    return t0, t1


class StepFunction:
    """A right-continuous piecewise-constant function of time: ``v0`` before ``times[0]``,
    then ``values[i]`` on ``[times[i], times[i+1])``. Built from jumps (``from_jumps``) or
    from sample-and-hold series (``from_samples``)."""

    def __init__(self, times: np.ndarray, values: np.ndarray, v0: float = 0.0):
        self.times = np.asarray(times, dtype=np.float64)
        self.values = np.asarray(values, dtype=np.float64)
        self.v0 = float(v0)

    @classmethod
    def from_jumps(cls, times, jumps, v0: float = 0.0) -> StepFunction:
        times = np.asarray(times, dtype=np.float64)
        order = np.argsort(times, kind="stable")
        return cls(times[order], v0 + np.cumsum(np.asarray(jumps, dtype=np.float64)[order]), v0)

    @classmethod
    def from_samples(cls, t, v, groups=None) -> StepFunction:
        """Sum over groups (replicas) of sample-and-hold series; each group's first sample
        also holds backwards in time."""
        t = np.asarray(t, dtype=np.float64)
        v = np.asarray(v, dtype=np.float64)
        if len(t) == 0:
            return cls(np.zeros(0), np.zeros(0), 0.0)
        groups = np.zeros(len(t), dtype=np.int64) if groups is None else np.asarray(groups)
        order = np.lexsort((t, groups))
        t, v, g = t[order], v[order], groups[order]
        first = np.ones(len(t), dtype=bool)
        first[1:] = g[1:] != g[:-1]
        jumps = np.empty(len(t))
        jumps[0] = 0.0
        jumps[1:] = v[1:] - v[:-1]
        jumps[first] = 0.0
        v0 = float(v[first].sum())
        return cls.from_jumps(t, jumps, v0)

    def pieces(self, a: float, b: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Segments ``[start, end)`` covering ``[a, b]`` and the value on each."""
        i = np.searchsorted(self.times, a, side="right")
        j = np.searchsorted(self.times, b, side="left")
        va = self.values[i - 1] if i > 0 else self.v0
        starts = np.concatenate([[a], self.times[i:j]])
        ends = np.concatenate([self.times[i:j], [b]])
        vals = np.concatenate([[va], self.values[i:j]])
        return starts, ends, vals

    def integral(self, a: float, b: float) -> float:
        s, e, v = self.pieces(a, b)
        return float(np.sum(v * (e - s)))

    def mean(self, a: float, b: float) -> float:
        return self.integral(a, b) / (b - a)

    def ols_slope(self, a: float, b: float) -> float:
        """Least-squares slope of the function on ``[a, b]`` in continuous time:
        ``int (t - m)(f - fbar) dt / int (t - m)^2 dt`` with ``m = (a + b) / 2``, exact for a
        step function (each piece contributes ``v ((e - m)^2 - (s - m)^2) / 2``)."""
        s, e, v = self.pieces(a, b)
        m = (a + b) / 2
        num = float(np.sum(v * ((e - m) ** 2 - (s - m) ** 2))) / 2
        return num / ((b - a) ** 3 / 12)


def finite_or_none(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None
