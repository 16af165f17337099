"""Arrival processes: when requests arrive.

Each process has ``spec`` (canonical spec string), ``rate`` (long-run mean arrival rate
``lam``, req/s), ``scv`` (squared coefficient of variation of the stationary inter-arrival
time, the ``scv_a`` of Kingman's and Allen-Cunneen's G/G formulas), ``idc`` (asymptotic index of
dispersion of counts, ``lim Var N(t) / E N(t)``: 1 for Poisson), and
``sample_times(rng, n=..., horizon=...)``, which returns sorted absolute arrival times (s,
float64) measured from 0: exactly ``n`` of them, or all those in ``[0, horizon)``.

Renewal processes (``poisson``, ``gamma``, ``deterministic``) start at time 0 with a fresh
inter-arrival: the first arrival is at ``X1``, the k-th at ``X1 + ... + Xk``. Generation is
vectorized (cumulative sums of inter-arrival draws in chunks), and for these the ``horizon``
sample is exactly the prefix of the ``n`` sample drawn from the same generator state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmqueue._validate import nonnegative, positive, positive_int
from llmqueue.errors import InputError
from llmqueue.workload.spec import fmt

_MAX_CHUNK = 1 << 22


def _check_n_horizon(n, horizon) -> tuple[int | None, float | None]:
    if (n is None) == (horizon is None):
        raise InputError("n/horizon", "give exactly one of n (number of arrivals) and horizon (s)")
    if n is not None:
        return positive_int("n", n, minimum=0), None
    return None, positive("horizon", horizon)


def _renewal(draw, rng, n, horizon, expected: float, scv: float) -> np.ndarray:
    """Cumulative sums of ``draw(rng, k)`` inter-arrival times: ``n`` of them or up to ``horizon``."""
    if n is not None:
        return np.cumsum(draw(rng, n))
    parts, t0 = [], 0.0
    while True:
        left = expected * (1 - t0 / horizon)
        k = int(min(_MAX_CHUNK, left + 6 * math.sqrt(left * max(scv, 1.0)) + 16))
        gaps = draw(rng, k)
        gaps[0] += t0  # continue the running sum exactly as one long cumsum would
        t = np.cumsum(gaps)
        if t[-1] >= horizon:
            parts.append(t[: np.searchsorted(t, horizon, side="left")])
            break
        parts.append(t)
        t0 = float(t[-1])
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


class ArrivalProcess:
    """Base class: ``spec``, ``rate``, ``scv``, ``idc`` and ``sample_times``."""

    spec: str
    rate: float

    @property
    def scv(self) -> float:
        raise NotImplementedError

    @property
    def idc(self) -> float:
        raise NotImplementedError

    def sample_times(self, rng: np.random.Generator, *, n: int | None = None,
                     horizon: float | None = None) -> np.ndarray:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.spec


@dataclass(frozen=True)
class Poisson(ArrivalProcess):
    """Poisson arrivals at ``rate`` req/s (``poisson:RATE``): exponential inter-arrivals, scv = idc = 1.

    The M in M/M/1 and M/G/1; the usual model of many independent users (Inference Foundations).
    """

    rate: float

    def __post_init__(self):
        object.__setattr__(self, "rate", positive("rate", self.rate))

    @property
    def spec(self) -> str:
        return f"poisson:{fmt(self.rate)}"

    scv = property(lambda self: 1.0)
    idc = property(lambda self: 1.0)

    def sample_times(self, rng, *, n=None, horizon=None):
        n, horizon = _check_n_horizon(n, horizon)
        scale = 1.0 / self.rate
        return _renewal(lambda r, k: r.exponential(scale, k), rng, n, horizon,
                        self.rate * (horizon or 0.0), 1.0)


#: The largest coefficient of variation of the gaps: scv 1e4 (a gap 100 times the mean is common);
#: beyond it the Gamma shape 1/cv^2 underflows towards 0 and its moments overflow
MAX_CV = 100.0


def check_cv(cv) -> float:
    """The gaps' coefficient of variation ``cv``, in ``(0, MAX_CV]``."""
    cv = positive("cv", cv)
    if cv > MAX_CV:
        raise InputError("cv", f"{cv:g} is above {MAX_CV:g} (the squared cv, {cv * cv:.3g}, would make the Gamma "
                         "shape 1/cv^2 vanish)", f"give cv <= {MAX_CV:g}")
    return cv


@dataclass(frozen=True)
class Gamma(ArrivalProcess):
    """Renewal arrivals with Gamma inter-arrival times (``gamma:RATE:cv=CV``).

    Shape ``k = 1 / cv^2``, scale ``cv^2 / rate``, so the mean gap is ``1 / rate`` and its
    coefficient of variation is ``cv``: ``cv = 1`` is Poisson, ``cv > 1`` bursty, ``cv < 1``
    smoother. ``scv = cv^2``; for a renewal process the asymptotic idc equals the scv (Cox).
    """

    rate: float
    cv: float

    def __post_init__(self):
        object.__setattr__(self, "rate", positive("rate", self.rate))
        object.__setattr__(self, "cv", check_cv(self.cv))

    @property
    def spec(self) -> str:
        return f"gamma:{fmt(self.rate)}:cv={fmt(self.cv)}"

    @property
    def shape(self) -> float:
        return 1.0 / self.cv ** 2

    @property
    def scale(self) -> float:
        return self.cv ** 2 / self.rate

    scv = property(lambda self: self.cv ** 2)
    idc = property(lambda self: self.cv ** 2)

    def sample_times(self, rng, *, n=None, horizon=None):
        n, horizon = _check_n_horizon(n, horizon)
        shape, scale = self.shape, self.scale
        return _renewal(lambda r, k: r.gamma(shape, scale, k), rng, n, horizon,
                        self.rate * (horizon or 0.0), self.scv)


@dataclass(frozen=True)
class Deterministic(ArrivalProcess):
    """Evenly spaced arrivals ``1/rate`` apart (``deterministic:RATE``, alias ``fixed:RATE``).

    The k-th arrival is at exactly ``k / rate`` (k = 1, 2, ...); scv = idc = 0 (the D in D/M/1).
    Uses no random numbers.
    """

    rate: float

    def __post_init__(self):
        object.__setattr__(self, "rate", positive("rate", self.rate))

    @property
    def spec(self) -> str:
        return f"deterministic:{fmt(self.rate)}"

    scv = property(lambda self: 0.0)
    idc = property(lambda self: 0.0)

    def sample_times(self, rng=None, *, n=None, horizon=None):
        n, horizon = _check_n_horizon(n, horizon)
        if n is None:
            k = np.arange(1, int(math.ceil(horizon * self.rate)) + 2, dtype=np.float64) / self.rate
            return k[k < horizon]
        return np.arange(1, n + 1, dtype=np.float64) / self.rate


@dataclass(frozen=True)
class OnOff(ArrivalProcess):
    """Two-state Markov-modulated Poisson process (``onoff:RATE:on=S:off=S[:rate_off=R]``).

    The source alternates between an *on* state (Poisson arrivals at ``rate``) and an *off*
    state (Poisson at ``rate_off``, default 0: the interrupted Poisson process). Periods are
    exponential with means ``on`` and ``off`` seconds. Long-run rate
    ``lam = (rate * on + rate_off * off) / (on + off)``. The process starts in its stationary
    state (on with probability ``on / (on + off)``), so counts are stationary from time 0.

    ``idc = 1 + 2 (rate - rate_off)^2 r1 r2 / ((r1 + r2)^2 (rate r2 + rate_off r1))`` with
    ``r1 = 1/on``, ``r2 = 1/off`` (Heffes & Lucantoni 1986): bursts make counts overdispersed,
    like the Azure code trace (IDC 13 at 1 s, 164 at 60 s). ``scv`` is that of the stationary
    inter-arrival time, a phase-type law with sub-generator ``D0`` and entry vector
    ``pi D1 / lam`` (Neuts); ``E[T^k] = k! phi (-D0)^-k 1``.

    Times are generated by a time change: a unit-rate Poisson stream in "operational time"
    mapped through the inverse of the cumulative intensity of the sampled on/off path.
    """

    rate_on: float
    on: float
    off: float
    rate_off: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "rate_on", positive("rate", self.rate_on))
        object.__setattr__(self, "on", positive("on", self.on))
        object.__setattr__(self, "off", positive("off", self.off))
        object.__setattr__(self, "rate_off", nonnegative("rate_off", self.rate_off))

    @property
    def spec(self) -> str:
        tail = f":rate_off={fmt(self.rate_off)}" if self.rate_off else ""
        return f"onoff:{fmt(self.rate_on)}:on={fmt(self.on)}:off={fmt(self.off)}{tail}"

    @property
    def rate(self) -> float:
        return (self.rate_on * self.on + self.rate_off * self.off) / (self.on + self.off)

    @property
    def idc(self) -> float:
        r1, r2 = 1.0 / self.on, 1.0 / self.off
        l1, l2 = self.rate_on, self.rate_off
        return 1.0 + 2.0 * (l1 - l2) ** 2 * r1 * r2 / ((r1 + r2) ** 2 * (l1 * r2 + l2 * r1))

    @property
    def scv(self) -> float:
        r1, r2 = 1.0 / self.on, 1.0 / self.off
        l1, l2 = self.rate_on, self.rate_off
        d0 = np.array([[-(l1 + r1), r1], [r2, -(l2 + r2)]])
        pi = np.array([r2, r1]) / (r1 + r2)
        phi = pi * np.array([l1, l2])
        phi = phi / phi.sum()
        m = np.linalg.inv(-d0)
        ones = np.ones(2)
        m1 = phi @ m @ ones
        m2 = 2.0 * phi @ m @ m @ ones
        return float(m2 / m1 ** 2 - 1.0)

    def sample_times(self, rng, *, n=None, horizon=None):
        n, horizon = _check_n_horizon(n, horizon)
        rates = np.array([self.rate_on, self.rate_off])
        cycle_work = self.rate_on * self.on + self.rate_off * self.off  # operational time per cycle
        state = 0 if rng.random() < self.on / (self.on + self.off) else 1
        if n is not None:
            if n == 0:
                return np.empty(0)
            tau = np.cumsum(rng.exponential(1.0, n))
            b, lam_b, st = self._path(rng, state, lambda t_end, w_end: w_end > tau[-1],
                                      lambda t_end, w_end: (tau[-1] - w_end) / cycle_work)
        else:
            b, lam_b, st = self._path(rng, state, lambda t_end, w_end: t_end >= horizon,
                                      lambda t_end, w_end: (horizon - t_end) / (self.on + self.off))
            j = np.searchsorted(b, horizon, side="left") - 1
            w_h = lam_b[j] + (horizon - b[j]) * rates[st[j]]
            tau = _renewal(lambda r, k: r.exponential(1.0, k), rng, None, w_h, w_h, 1.0)
        j = np.searchsorted(lam_b, tau, side="right") - 1
        t = b[j] + (tau - lam_b[j]) / rates[st[j]]
        return t if horizon is None else t[t < horizon]

    def _path(self, rng, state, done, cycles_left):
        """Period boundaries ``b``, cumulative intensity at them, and each period's state."""
        rates = np.array([self.rate_on, self.rate_off])
        means = np.array([self.on, self.off])
        bs, ws, sts = [np.zeros(1)], [np.zeros(1)], []
        t_end = w_end = 0.0
        while True:
            k = 2 * int(min(_MAX_CHUNK // 2, 1.2 * max(cycles_left(t_end, w_end), 0.0) + 8))
            st = (state + np.arange(k)) % 2
            dur = rng.exponential(1.0, k) * means[st]
            dur[0] += t_end
            bounds = np.cumsum(dur)
            work = rates[st] * np.diff(bounds, prepend=t_end)
            work[0] += w_end
            wsum = np.cumsum(work)
            bs.append(bounds)
            ws.append(wsum)
            sts.append(st)
            t_end, w_end = float(bounds[-1]), float(wsum[-1])
            if done(t_end, w_end):
                break
        return np.concatenate(bs), np.concatenate(ws), np.concatenate(sts)
