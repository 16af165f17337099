"""Time-varying arrival processes: piecewise-constant, diurnal (sinusoidal) and spike rates,
with Poisson or Gamma-renewal fine structure.

The model. A rate function ``lam(t) >= 0`` (req/s) with cumulative intensity
``Lambda(t) = int_0^t lam(u) du``. Arrival times are ``T_i = Lambda^-1(tau_i)``, where
``tau_1 < tau_2 < ...`` is a *unit-rate* renewal stream in "operational time" whose gaps have
mean 1 and coefficient of variation ``cv``:

- ``cv = 1`` (the default): ``tau`` is a unit Poisson process and ``T`` is the non-homogeneous
  Poisson process (NHPP) with intensity ``lam(t)``: counts in ``[a, b)`` are
  Poisson(``Lambda(b) - Lambda(a)``), independent over disjoint intervals (Cinlar 1975, the
  time-change theorem; its converse, the time-rescaling theorem of Brown et al. 2002, is what
  the tests check: ``Lambda(T_i) - Lambda(T_i-1)`` are i.i.d. Exp(1)).
- ``cv != 1``: the modulated Gamma process. ``tau`` has Gamma(shape ``1/cv^2``, scale ``cv^2``)
  gaps, a Gamma renewal process whose clock runs at the speed ``lam(t)``: locally it looks
  like ``gamma:lam(t):cv=CV``, and the rescaled gaps ``Lambda(T_i) - Lambda(T_i-1)`` are i.i.d.
  Gamma(``1/cv^2``, ``cv^2``). This is how ServeGen (Xiang et al. 2025) describes its clients:
  Gamma inter-arrivals rescaled to a windowed rate.
- ``cv > 1`` with ``gaps=h2``: the same with two-phase hyperexponential gaps of balanced means
  (:func:`h2_balanced`): short gaps inside bursts, long pauses between them, the gap law of an
  interrupted Poisson (on/off) source. Gamma gaps with a large ``cv`` put most of their mass
  near 0 (shape ``1/cv^2``: at ``cv = 7`` half the gaps are shorter than 1e-13 of the mean),
  i.e. clumps of simultaneous requests; H2 is the better burst model when bursts have a rate.
  (Gaps below the float64 resolution of the running operational time, ~1e-16 of it, become
  ties: a few percent of Gamma gaps at ``cv >= 3``.)

Why a time change rather than thinning (Lewis and Shedler 1979): it is exact for any rate
function without a rate bound, spends one random number per arrival (thinning wastes
``lam_max / lam_mean - 1`` draws per arrival: 90 % of them for a ``k=10`` spike), and it is
the only one of the two that yields the modulated Gamma process (thinning a renewal process
does not give a renewal process). ``Lambda^-1`` is exact (piecewise linear) for ``piecewise``
and ``spike`` and a Newton iteration kept inside a bisection bracket, to 1e-12 of the period,
for ``diurnal``.

Like the renewal processes of :mod:`.arrivals`, the stream starts fresh at time 0, and the
``horizon`` sample is the prefix of the ``n`` sample drawn from the same generator state.

Specs (see :mod:`.parse`)::

    piecewise:RATE@START,RATE@START,...[:period=P]   windows from START s (the first at 0)
    piecewise:RATE,RATE,...:window=W[:period=P]       equal windows of W s
    piecewise:...:period=P:counts=fixed              each window gets its expected count
    diurnal:mean=R:amp=A[:period=86400][:phase=S]    R (1 + A sin(2 pi (t - S) / P))
    spike:RATE:k=K:at=T:for=D[:period=P]             K x RATE in [T, T + D)

each with ``[:cv=CV]`` (Gamma gaps in operational time; 1, the default, is Poisson) and
``[:gaps=h2]`` (hyperexponential gaps instead; ``cv >= 1``). Without ``period=`` the last
window's rate (``piecewise``) or the base rate (``spike``) holds forever; with it the pattern
repeats every ``P`` seconds.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue._validate import finite, nonnegative, positive
from llmqueue.errors import InputError
from llmqueue.workload.arrivals import ArrivalProcess, _check_n_horizon, _renewal, check_cv
from llmqueue.workload.spec import fmt, parse_number


#: How a piecewise rate turns into window counts: ``random`` (Poisson / renewal counts, the
#: default) or ``fixed`` (each window receives its expected count, see :class:`Piecewise`).
COUNTS = ("random", "fixed")
#: A window's expected count within this relative distance of a whole number is that number.
_SNAP = 1e-6
#: Operational-time draws per chunk of periods in ``counts=fixed`` sampling.
_FIXED_CHUNK = 1 << 16


#: Laws of the unit-mean gaps in operational time (``gaps=``): Gamma, or the two-phase
#: hyperexponential with balanced means (bursts); both are exponential at ``cv = 1``.
GAPS = ("gamma", "h2")


def h2_balanced(cv: float) -> tuple[float, float, float]:
    """The unit-mean two-phase hyperexponential with squared CV ``cv^2 >= 1`` and balanced
    means (``p1 / r1 = p2 / r2``; Whitt 1982, Sauer and Chandy 1975): ``(p1, r1, r2)`` with
    ``p1 = (1 + sqrt((cv^2 - 1) / (cv^2 + 1))) / 2``, ``r1 = 2 p1``, ``r2 = 2 (1 - p1)``. A gap is
    Exp(rate ``r1``) with probability ``p1`` (short, inside a burst), else Exp(rate ``r2``) (the
    pause between bursts); ``P(X > x) = p1 e^(-r1 x) + p2 e^(-r2 x)``."""
    c2 = float(cv) ** 2
    if c2 < 1:
        raise InputError("cv", f"must be >= 1 for gaps=h2 (got {cv:g})")
    p1 = 0.5 * (1.0 + math.sqrt((c2 - 1.0) / (c2 + 1.0)))
    return p1, 2.0 * p1, 2.0 * (1.0 - p1)


def _tail(period, cv, gaps="gamma") -> str:
    out = "" if period is None else f":period={fmt(period)}"
    out += "" if cv == 1.0 else f":cv={fmt(cv)}"
    return out + (f":gaps={gaps}" if gaps != "gamma" and cv != 1.0 else "")


class TimeVarying(ArrivalProcess):
    """Base class: a rate function ``lam(t)`` driving a unit-rate Poisson or Gamma renewal stream.

    Subclasses give ``rate_at(t)``, ``cumulative(t)`` (``Lambda``), ``inverse_cumulative(w)``
    (``Lambda^-1``), ``rate`` (long-run mean), ``spec`` and ``_mean_inverse_rate()`` (the time
    average of ``1 / lam``, for ``scv``).
    """

    cv: float = 1.0
    gaps: str = "gamma"

    # -- the rate function ------------------------------------------------------------------------
    def rate_at(self, t) -> np.ndarray:
        raise NotImplementedError

    def cumulative(self, t) -> np.ndarray:
        raise NotImplementedError

    def inverse_cumulative(self, w) -> np.ndarray:
        raise NotImplementedError

    def _mean_inverse_rate(self) -> float:
        raise NotImplementedError

    # -- moments ----------------------------------------------------------------------------------
    @property
    def shape(self) -> float:
        """Shape ``1/cv^2`` of the unit-rate Gamma gaps in operational time (1: Poisson)."""
        return 1.0 / self.cv ** 2

    @property
    def idc(self) -> float:
        """Asymptotic index of dispersion ``lim Var N(t) / E N(t) = cv^2``.

        ``N(t) = N_unit(Lambda(t))`` and a renewal count has ``Var N_unit(s) ~ cv^2 s`` (Cox), so
        the deterministic rate profile adds no variance to the count of a fixed interval. The
        dispersion of counts in b-second bins *across* one trace also holds the profile's
        variation; :meth:`expected_bin_idc` gives that.
        """
        return self.cv ** 2

    @property
    def scv(self) -> float:
        """Squared CV of the inter-arrival time, in the slow-variation approximation.

        When the rate changes slowly compared with the gaps, an arrival at local rate ``lam``
        is followed by a gap with mean ``1/lam`` and second moment ``(1 + cv^2) / lam^2``;
        weighting by arrivals gives ``scv = (1 + cv^2) lam_bar <1/lam> - 1`` with ``<.>`` the
        time average (over a period; the final rate without one). ``math.inf`` when the rate is
        0 on a stretch of time (the gap spanning it dominates; the approximation fails there).
        """
        m = self._mean_inverse_rate()
        if math.isinf(m):
            return math.inf
        return (1.0 + self.cv ** 2) * self.rate * m - 1.0

    def expected_bin_idc(self, bin_s: float, horizon: float) -> float:
        """Expected dispersion (variance / mean) of counts in consecutive ``bin_s`` bins over
        ``[0, horizon)`` (whole bins only, population variance, as the traces README measures
        it): ``(Var_j Lambda_j + cv^2 mean_j Lambda_j) / mean_j Lambda_j`` with ``Lambda_j`` the
        integrated rate of bin ``j``. The ``cv^2 Lambda_j`` count variance is the renewal
        asymptote, good when bins hold many arrivals."""
        bin_s, horizon = positive("bin_s", bin_s), positive("horizon", horizon)
        m = int(horizon // bin_s)
        if m < 2:
            raise InputError("horizon", f"must hold at least 2 whole bins of {bin_s:g} s")
        lam = np.diff(self.cumulative(np.arange(m + 1) * bin_s))
        mean = float(lam.mean())
        return (float(lam.var()) + self.cv ** 2 * mean) / mean

    # -- sampling ---------------------------------------------------------------------------------
    def _unit_gaps(self):
        """``draw(rng, k)``: ``k`` gaps of the unit-rate stream: exponential (``cv = 1``), Gamma
        (shape ``1/cv^2``, scale ``cv^2``) or balanced-means H2 (:func:`h2_balanced`)."""
        cv = self.cv
        if cv == 1.0:
            return lambda r, k: r.exponential(1.0, k)
        if self.gaps == "h2":
            p1, r1, r2 = h2_balanced(cv)

            def draw(r, k):
                # two uniforms per gap, drawn as one block, so chunked draws equal one long draw
                u = r.random((k, 2))
                return -np.log1p(-u[:, 1]) / np.where(u[:, 0] < p1, r1, r2)
            return draw
        shape, scale = 1.0 / cv ** 2, cv ** 2
        return lambda r, k: r.gamma(shape, scale, k)

    def sample_times(self, rng, *, n=None, horizon=None):
        n, horizon = _check_n_horizon(n, horizon)
        draw = self._unit_gaps()
        cv = self.cv
        if n is not None:
            if n == 0:
                return np.empty(0)
            tau = np.cumsum(draw(rng, n))
        else:
            w = float(self.cumulative(horizon))
            if not w > 0:
                return np.empty(0)
            tau = _renewal(draw, rng, None, w, w, cv ** 2)
        t = self.inverse_cumulative(tau)
        return t if horizon is None else t[t < horizon]

    def __eq__(self, other):
        if not isinstance(other, TimeVarying):
            return NotImplemented
        return type(self) is type(other) and self.spec == other.spec

    def __hash__(self):
        return hash((type(self).__name__, self.spec))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


def _check_law(cv, gaps) -> tuple[float, str]:
    cv = check_cv(cv)
    g = str(gaps).strip().lower()
    if g not in GAPS:
        raise InputError("gaps", f"must be one of {', '.join(GAPS)} (got {gaps!r})")
    if g == "h2" and cv < 1:
        raise InputError("cv", f"must be >= 1 for gaps=h2 (got {cv:g}); use gaps=gamma for cv < 1")
    return cv, g


def _check_period(period):
    return None if period is None else positive("period", period)


class Piecewise(TimeVarying):
    """Piecewise-constant rate (``piecewise:RATE@START,...`` or ``piecewise:RATE,...:window=W``).

    ``Piecewise([(0, 5), (3600, 10), (4200, 5)])`` runs at 5 req/s, at 10 from t = 3600 s and at
    5 again from 4200 s on; ``Piecewise.from_rates([5, 10, 5], window_s=600)`` gives equal
    600 s windows. Windows start at strictly increasing times, the first at 0; rates are
    ``>= 0``. With ``period=P`` (``P`` beyond the last start) the pattern repeats every ``P``
    seconds (the last window ends at ``P``) and the long-run rate is ``Lambda(P) / P``;
    without it the last rate holds forever, is the long-run rate and must be ``> 0``.
    ``cv`` is that of the modulated Gamma stream (1: non-homogeneous Poisson).

    ``Lambda`` is piecewise linear, so ``Lambda^-1`` is exact: ``b_j + (w - Lambda(b_j)) / r_j``.

    ``counts="fixed"`` (``:counts=fixed``, needs ``period=``) conditions the process on its
    window counts: window ``j`` of every period receives exactly its expected count
    ``K_j = r_j w_j`` (when that is a whole number, as for a rate fitted to a trace; otherwise
    ``floor(K_j)`` or ``floor(K_j) + 1`` with the right mean, the least variable integer count).
    Inside the window the ``K_j`` arrivals are the interior points of ``K_j + 1`` operational-time
    gaps rescaled to the window: uniform order statistics for ``cv = 1`` (a Poisson process
    conditioned on its count), Dirichlet(``1/cv^2``) spacings otherwise (the Gamma renewal bridge).
    Counts in windows are then the trace's, not Poisson draws around them: what a replay of the
    trace's load profile with fresh within-window timing needs, and why ``fit_workload`` uses
    it by default (:mod:`llmqueue.workload.fit`). Chunks of whole periods are drawn at a time,
    so the ``horizon`` sample is still a prefix of the ``n`` sample.
    """

    def __init__(self, windows, *, period: float | None = None, cv: float = 1.0, gaps: str = "gamma",
                 counts: str = "random", _window: float | None = None):
        try:
            pairs = [(float(s), float(r)) for s, r in windows]
        except (TypeError, ValueError):
            raise InputError("windows", "expected a sequence of (start_s, rate) pairs") from None
        if not pairs:
            raise InputError("windows", "give at least one (start_s, rate) window")
        starts = np.array([nonnegative("start", s) for s, _ in pairs])
        rates = np.array([nonnegative("rate", r) for _, r in pairs])
        if starts[0] != 0:
            raise InputError("windows", f"the first window must start at 0 (got {starts[0]:g})",
                             "add a window RATE@0")
        if np.any(np.diff(starts) <= 0):
            raise InputError("windows", "window starts must increase strictly")
        self.period = _check_period(period)
        self.cv, self.gaps = _check_law(cv, gaps)
        if self.period is not None:
            if not self.period > starts[-1]:
                raise InputError("period", f"must be beyond the last window start {starts[-1]:g} s "
                                 f"(got {self.period:g})")
            ends = np.append(starts[1:], self.period)
            if not np.dot(rates, ends - starts) > 0:
                raise InputError("windows", "rates are all 0: no arrivals ever")
        elif not rates[-1] > 0:
            raise InputError("windows", f"the last rate must be > 0 without period= (got "
                             f"{rates[-1]:g}): it holds forever", "add period=P to repeat the pattern")
        self._starts, self._rates = starts, rates
        ends = np.append(starts[1:], self.period if self.period is not None else math.inf)
        widths = ends - starts
        cum = np.concatenate([[0.0], np.cumsum(rates[:-1] * widths[:-1])])
        self._cum = cum  # Lambda at each window start
        self._total = float(cum[-1] + rates[-1] * widths[-1]) if self.period is not None else math.inf
        for a in (starts, rates, cum):
            a.setflags(write=False)
        self._window = _window
        if counts not in COUNTS:
            raise InputError("counts", f"must be one of {', '.join(COUNTS)} (got {counts!r})")
        if counts == "fixed" and self.period is None:
            raise InputError("counts", "counts=fixed needs period=P (each period gets the same counts)",
                             "add period=P")
        self.counts = counts

    @classmethod
    def from_rates(cls, rates, window_s: float, *, period: float | None = None,
                   cv: float = 1.0, gaps: str = "gamma", counts: str = "random") -> "Piecewise":
        """Equal windows of ``window_s`` seconds with the given rates (``piecewise:R,R,...:window=W``)."""
        w = positive("window", window_s)
        rates = list(rates)
        return cls([(j * w, r) for j, r in enumerate(rates)], period=period, cv=cv, gaps=gaps,
                   counts=counts, _window=w)

    @classmethod
    def from_text(cls, text: str, *, window: float | None = None, period: float | None = None,
                  cv: float = 1.0, gaps: str = "gamma", counts: str = "random") -> "Piecewise":
        """From the spec's window list: ``R@T,R@T,...`` or, with ``window``, ``R,R,...``."""
        items = [x.strip() for x in text.split(",")]
        if any(x == "" for x in items):
            raise InputError("windows", "empty item in the window list (two ',' in a row or a "
                             "trailing ',')")
        try:
            if window is not None:
                if any("@" in x for x in items):
                    raise ValueError("with window=W give plain rates R,R,... (no @START)")
                rates = [parse_number(x, "rate") for x in items]
            else:
                pairs = []
                for x in items:
                    r, at, s = x.partition("@")
                    if not at:
                        raise ValueError(f"window {x!r} needs RATE@START (or give window=W for "
                                         "equal windows)")
                    pairs.append((parse_number(s, "start"), parse_number(r, "rate")))
        except ValueError as e:
            raise InputError("windows", str(e)) from None
        if window is not None:
            return cls.from_rates(rates, window, period=period, cv=cv, gaps=gaps, counts=counts)
        return cls(pairs, period=period, cv=cv, gaps=gaps, counts=counts)

    # -- counts=fixed -----------------------------------------------------------------------------
    def _widths(self) -> np.ndarray:
        return np.append(self._starts[1:], self.period) - self._starts

    def window_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per window of one period: the whole part of its expected count ``rate * width`` and
        the fraction left (0 when the expected count is within 1e-6 relative of a whole number).
        ``counts=fixed`` gives window ``j`` that whole part, plus one with probability the fraction."""
        if self.period is None:
            raise InputError("period", "window counts need a periodic rate (period=P)")
        lam = self._rates * self._widths()
        near = np.round(lam)
        snap = np.abs(lam - near) <= _SNAP * np.maximum(1.0, lam)
        whole = np.where(snap, near, np.floor(lam))
        return whole.astype(np.int64), np.where(snap, 0.0, lam - whole)

    def _sample_fixed(self, rng, draw, n, horizon) -> np.ndarray:
        whole, frac = self.window_counts()
        m = whole.size
        starts, widths = self._starts, self._widths()
        # a constant number of periods per chunk, so n and horizon runs consume the generator alike
        per_chunk = max(1, _FIXED_CHUNK // (int(whole.sum()) + 2 * m))
        parts, got, p0 = [], 0, 0
        while True:
            k = (whole[None, :] + (rng.random((per_chunk, m)) < frac[None, :])).ravel()
            g = draw(rng, int(k.sum()) + k.size)  # k_j + 1 operational-time gaps per window
            ends = np.cumsum(k + 1)
            cs = np.cumsum(g)
            before = np.concatenate([[0.0], cs[ends[:-1] - 1]])
            total = cs[ends - 1] - before
            wid = np.repeat(np.arange(k.size), k + 1)
            total = np.where(total > 0, total, 1.0)
            u = np.minimum((cs - before[wid]) / total[wid], 1.0)
            keep = np.ones(cs.size, dtype=bool)
            keep[ends - 1] = False  # each window's closing point is its end, not an arrival
            j = wid % m
            left = (p0 + wid // m) * self.period + starts[j]
            # gaps below the resolution of the running sum (Gamma with a large cv) can round a
            # point onto its window's end: keep it just inside the window
            t = np.minimum(left + u * widths[j], np.nextafter(left + widths[j], -np.inf))[keep]
            parts.append(t)
            got += t.size
            p0 += per_chunk
            if (n is not None and got >= n) or (horizon is not None and p0 * self.period >= horizon):
                break
        t = np.concatenate(parts)
        return t[:n] if n is not None else t[t < horizon]

    def sample_times(self, rng, *, n=None, horizon=None):
        if self.counts != "fixed":
            return super().sample_times(rng, n=n, horizon=horizon)
        n, horizon = _check_n_horizon(n, horizon)
        if n == 0:
            return np.empty(0)
        return self._sample_fixed(rng, self._unit_gaps(), n, horizon)

    @property
    def idc(self) -> float:
        """``cv^2`` with random counts; 0 with ``counts=fixed`` (every period holds the same
        number of arrivals, up to the rounding of fractional expected counts, so ``Var N(t)``
        stays bounded)."""
        return 0.0 if self.counts == "fixed" else self.cv ** 2

    def expected_bin_idc(self, bin_s: float, horizon: float) -> float:
        """As :meth:`TimeVarying.expected_bin_idc`; with ``counts=fixed`` the count of the part
        ``p`` of a window holding ``K`` arrivals varies as ``cv^2 E[K] p (1 - p)`` (binomial for
        Poisson positions) plus ``p^2 f (1 - f)`` from a fractional expected count."""
        if self.counts != "fixed":
            return super().expected_bin_idc(bin_s, horizon)
        bin_s, horizon = positive("bin_s", bin_s), positive("horizon", horizon)
        nb = int(horizon // bin_s)
        if nb < 2:
            raise InputError("horizon", f"must hold at least 2 whole bins of {bin_s:g} s")
        whole, frac = self.window_counts()
        widths = self._widths()
        end = nb * bin_s
        nper = int(math.ceil(end / self.period))
        wst = (np.arange(nper)[:, None] * self.period + self._starts[None, :]).ravel()
        cuts = np.union1d(np.arange(nb + 1) * bin_s, wst[wst < end])
        lo, hi = cuts[:-1], cuts[1:]
        mid = 0.5 * (lo + hi)
        b = np.minimum((mid // bin_s).astype(np.int64), nb - 1)
        w = np.searchsorted(wst, mid, side="right") - 1
        j = w % whole.size
        p = (hi - lo) / widths[j]
        ek = whole[j] + frac[j]
        mean = np.bincount(b, ek * p, minlength=nb)
        var = np.bincount(b, self.cv ** 2 * ek * p * (1 - p) + p * p * frac[j] * (1 - frac[j]),
                          minlength=nb)
        return (float(mean.var()) + float(var.mean())) / float(mean.mean())

    @property
    def starts(self) -> np.ndarray:
        return self._starts

    @property
    def rates(self) -> np.ndarray:
        return self._rates

    @property
    def window(self) -> float | None:
        """The equal window length, when built from equal windows (``window=``)."""
        return self._window

    @property
    def spec(self) -> str:
        if self._window is not None:
            body = ",".join(fmt(r) for r in self._rates) + f":window={fmt(self._window)}"
        else:
            body = ",".join(f"{fmt(r)}@{fmt(s)}" for s, r in zip(self._starts, self._rates))
        tail = ":counts=fixed" if self.counts == "fixed" else ""
        return f"piecewise:{body}{_tail(self.period, self.cv, self.gaps)}{tail}"

    @property
    def rate(self) -> float:
        if self.period is None:
            return float(self._rates[-1])
        return self._total / self.period

    def _mean_inverse_rate(self) -> float:
        if self.period is None:
            return 1.0 / float(self._rates[-1])
        ends = np.append(self._starts[1:], self.period)
        w = ends - self._starts
        if np.any((self._rates == 0) & (w > 0)):
            return math.inf
        return float(np.sum(w / self._rates)) / self.period

    def _split(self, t):
        t = np.asarray(t, dtype=np.float64)
        if self.period is None:
            return np.zeros_like(t), t
        q = np.floor(t / self.period)
        s = t - q * self.period
        over = s >= self.period
        q, s = np.where(over, q + 1, q), np.where(over, s - self.period, s)
        return q, np.maximum(s, 0.0)

    def rate_at(self, t) -> np.ndarray:
        _, s = self._split(t)
        j = np.searchsorted(self._starts, s, side="right") - 1
        return self._rates[np.maximum(j, 0)]

    def cumulative(self, t) -> np.ndarray:
        q, s = self._split(t)
        j = np.maximum(np.searchsorted(self._starts, s, side="right") - 1, 0)
        inner = self._cum[j] + self._rates[j] * (s - self._starts[j])
        return inner if self.period is None else q * self._total + inner

    def inverse_cumulative(self, w) -> np.ndarray:
        w = np.asarray(w, dtype=np.float64)
        if self.period is None:
            q, r = 0.0, w
        else:
            q = np.floor(w / self._total)
            r = w - q * self._total
            over = r >= self._total
            q, r = np.where(over, q + 1, q), np.where(over, r - self._total, r)
            r = np.maximum(r, 0.0)
        j = np.searchsorted(self._cum, r, side="right") - 1
        j = np.maximum(j, 0)
        rj = self._rates[j]
        # a zero-rate window can only be hit at its start (measure zero); map it to its end
        safe = np.where(rj > 0, rj, 1.0)
        t = np.where(rj > 0, self._starts[j] + (r - self._cum[j]) / safe, self._starts[j])
        return t if self.period is None else q * self.period + t


class Spike(Piecewise):
    """A base rate with a burst: ``k`` times the rate in ``[at, at + for)`` (``spike:RATE:k=K:at=T:for=D``).

    The Queueing System essay's noon launch, where "request arrivals briefly double", is ``spike:R:k=2:at=T:for=D``.
    ``k < 1`` is a dip, ``k = 0`` an outage. Without ``period=`` the spike happens once and the
    long-run rate is the base rate; with ``period=P`` (``>= at + for``) it recurs every ``P``
    seconds (a daily launch at noon: ``at=43200:period=86400``). A piecewise-constant rate,
    so counts and ``Lambda^-1`` are exact.
    """

    def __init__(self, rate: float, k: float, at: float, duration: float, *,
                 period: float | None = None, cv: float = 1.0, gaps: str = "gamma"):
        self.base = positive("rate", rate)
        self.k = nonnegative("k", k)
        self.at = nonnegative("at", at)
        self.duration = positive("for", duration)
        end = self.at + self.duration
        period = _check_period(period)
        if period is not None and period < end:
            raise InputError("period", f"must be >= at + for = {end:g} s (got {period:g})")
        windows = ([(0.0, self.base)] if self.at > 0 else []) + [(self.at, self.base * self.k)]
        if period is None or period > end:
            windows.append((end, self.base))
        super().__init__(windows, period=period, cv=cv, gaps=gaps)

    @property
    def spec(self) -> str:
        return (f"spike:{fmt(self.base)}:k={fmt(self.k)}:at={fmt(self.at)}:for={fmt(self.duration)}"
                f"{_tail(self.period, self.cv, self.gaps)}")


class Diurnal(TimeVarying):
    """Sinusoidal rate ``lam(t) = R (1 + A sin(2 pi (t - phase) / P))``
    (``diurnal:mean=R:amp=A[:period=86400][:phase=S][:cv=CV]``).

    ``R`` is the long-run mean rate, ``0 <= A <= 1`` the relative amplitude, ``P`` the period
    (a day by default); the rate peaks at ``phase + P/4`` (``(1 + A) R``) and bottoms out at
    ``phase + 3P/4``. ``Lambda(t) = R t + R A P / (2 pi) (cos(2 pi phase / P) - cos(2 pi (t -
    phase) / P))``. ``Lambda^-1`` reduces ``w`` modulo ``R P`` and solves within one period by
    Newton's method kept inside a bisection bracket.
    """

    def __init__(self, mean: float, amp: float, *, period: float = 86400.0, phase: float = 0.0,
                 cv: float = 1.0, gaps: str = "gamma"):
        self.mean = positive("mean", mean)
        self.amp = nonnegative("amp", amp)
        if self.amp > 1:
            raise InputError("amp", f"must be <= 1 (got {self.amp:g}): the rate would go negative")
        self.period = positive("period", period)
        self.phase = finite("phase", phase)
        self.cv, self.gaps = _check_law(cv, gaps)
        self._omega = 2 * math.pi / self.period
        self._c0 = math.cos(self._omega * self.phase)

    @property
    def spec(self) -> str:
        ph = f":phase={fmt(self.phase)}" if self.phase else ""
        return (f"diurnal:mean={fmt(self.mean)}:amp={fmt(self.amp)}:period={fmt(self.period)}{ph}"
                f"{_tail(None, self.cv, self.gaps)}")

    @property
    def rate(self) -> float:
        return self.mean

    def _mean_inverse_rate(self) -> float:
        if self.amp >= 1:
            return math.inf
        return 1.0 / (self.mean * math.sqrt(1.0 - self.amp ** 2))

    def rate_at(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        return self.mean * (1.0 + self.amp * np.sin(self._omega * (t - self.phase)))

    def cumulative(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        k = self.mean * self.amp / self._omega
        return self.mean * t + k * (self._c0 - np.cos(self._omega * (t - self.phase)))

    def inverse_cumulative(self, w) -> np.ndarray:
        w = np.asarray(w, dtype=np.float64)
        per = self.mean * self.period
        q = np.floor(w / per)
        r = np.clip(w - q * per, 0.0, per)
        if self.amp == 0:
            return q * self.period + r / self.mean
        x = r / self.mean
        tol = 1e-12 * self.period
        act = np.arange(r.size)  # the points still iterating
        xa, ra = x, r
        lo, hi = np.zeros_like(r), np.full_like(r, self.period)
        for _ in range(200):
            f = self.cumulative(xa) - ra
            lo = np.where(f <= 0, xa, lo)
            hi = np.where(f > 0, xa, hi)
            d = self.rate_at(xa)
            nxt = xa - np.where(d > 0, f / np.where(d > 0, d, 1.0), np.inf)
            nxt = np.where((nxt >= lo) & (nxt <= hi), nxt, 0.5 * (lo + hi))
            go = np.abs(nxt - xa) > tol
            x[act] = nxt
            if not go.any():
                break
            act, xa, ra, lo, hi = act[go], nxt[go], ra[go], lo[go], hi[go]
        return q * self.period + x
