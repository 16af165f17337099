"""Token-length distributions: the prompt length ``s`` and output length ``o`` of a request.

Every distribution is over positive integers (token counts >= 1) and offers:

- ``spec``: its canonical spec string (``parse_length(d.spec)`` rebuilds it, except for an
  in-memory :class:`Empirical`);
- ``sample(rng, n)``: ``n`` int64 draws, by inverse transform ``quantile(rng.random(n))``. One
  uniform per request means two distributions driven by the same stream are coupled
  monotonically (common random numbers: request ``i`` keeps its quantile when the
  distribution changes);
- ``support()``: ``(lo, hi)``, ``hi`` None when unbounded;
- ``pmf()``: ``(values int64, probs float64)``, the exact distribution that ``sample`` draws
  from (for unbounded forms, truncated as documented on the class);
- ``mean()``, ``second_moment()``, ``var()``, ``std()``, ``scv()``: exact, from closed forms
  (``fixed``, ``uniform``) or exact sums over the pmf. These give E[s], E[s^2] for the P-K
  formula and E[g(s, o)] of Nie et al. 2026.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue._validate import finite, positive, positive_int
from llmqueue.errors import InputError
from llmqueue.workload.spec import fmt

#: Largest pmf a distribution may hold (values, each 24 bytes with probabilities and cdf).
MAX_SUPPORT = 1 << 21
#: Longest token count a distribution may give (100 M tokens, far beyond any context served): keeps
#: sums of lengths and their squares in int64 and float64
MAX_TOKENS = 10**8
#: Tail mass dropped from each side of an unbounded normal/lognormal pmf.
TAIL = 1e-12


def tokens(name: str, x, *, whole: bool = True):
    """A token count (a whole number, or with ``whole=False`` a mean or sd of one: a positive
    number) in ``[1, MAX_TOKENS]``."""
    v = positive_int(name, x) if whole else positive(name, x)
    if v > MAX_TOKENS:
        raise InputError(name, f"{v:.3g} tokens is above the {MAX_TOKENS:.0e} a length may hold",
                         f"give at most {MAX_TOKENS:.0e} tokens (the longest context served)")
    return v


def as_tokens(name: str, values) -> np.ndarray:
    """``values`` as a non-empty 1-d int64 array of token counts (whole numbers >= 1)."""
    v = np.asarray(values)
    if v.ndim != 1 or v.size == 0:
        raise InputError(name, f"need a non-empty 1-d array of token counts (got shape {v.shape})")
    if v.dtype.kind in "iu":
        if v.min() < 1:
            raise InputError(name, f"token counts must be >= 1 (got {v.min()})")
        if v.max() > MAX_TOKENS:
            raise InputError(name, f"token counts must be at most {MAX_TOKENS:.0e} (got {v.max()})")
        return v.astype(np.int64)
    try:
        vf = v.astype(np.float64)
    except (TypeError, ValueError):
        raise InputError(name, "token counts must be numbers") from None
    ok = np.isfinite(vf) & (vf >= 1) & (vf == np.floor(vf)) & (vf <= MAX_TOKENS)
    if not ok.all():
        raise InputError(name, f"token counts must be whole numbers from 1 to {MAX_TOKENS:.0e} "
                         f"(got {v[np.argmin(ok)]!r})")
    return vf.astype(np.int64)


class LengthDist:
    """Base class of token-length distributions (see the module docstring for the interface)."""

    spec: str

    def support(self) -> tuple[int, int | None]:
        raise NotImplementedError

    def pmf(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def quantile(self, u) -> np.ndarray:
        """The smallest value ``v`` with ``P(X <= v) > u``, for ``u`` in [0, 1), as int64."""
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` independent draws (int64), one ``rng.random()`` each."""
        n = positive_int("n", n, minimum=0)
        return self.quantile(rng.random(n))

    def mean(self) -> float:
        raise NotImplementedError

    def second_moment(self) -> float:
        raise NotImplementedError

    def var(self) -> float:
        raise NotImplementedError

    def std(self) -> float:
        return math.sqrt(self.var())

    def scv(self) -> float:
        """Squared coefficient of variation ``var / mean^2``."""
        return self.var() / self.mean() ** 2

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class Fixed(LengthDist):
    """Every request has exactly ``n`` tokens (``fixed:N``)."""

    def __init__(self, n: int):
        self.n = tokens("n", n)
        self.spec = f"fixed:{self.n}"

    def support(self):
        return (self.n, self.n)

    def pmf(self):
        return np.array([self.n], dtype=np.int64), np.array([1.0])

    def quantile(self, u):
        return np.full(np.shape(u), self.n, dtype=np.int64)

    def mean(self):
        return float(self.n)

    def second_moment(self):
        return float(self.n * self.n)

    def var(self):
        return 0.0


class Uniform(LengthDist):
    """Integers ``lo..hi``, both included, equally likely (``uniform:LO:HI``).

    Nie et al.'s synthetic experiments use Uniform(10, 1600) for both prompt and output.
    Closed forms with ``w = hi - lo + 1``: mean ``(lo + hi) / 2``, variance ``(w^2 - 1) / 12``,
    ``E[s^2] = (S(hi) - S(lo - 1)) / w`` with ``S(m) = m (m + 1) (2m + 1) / 6``.
    """

    def __init__(self, lo: int, hi: int):
        self.lo = tokens("lo", lo)
        self.hi = tokens("hi", hi)
        if self.hi < self.lo:
            raise InputError("hi", f"must be >= lo (got lo = {self.lo} > hi = {self.hi})",
                             f"swap them: uniform:{self.hi}:{self.lo}")
        self.spec = f"uniform:{self.lo}:{self.hi}"

    @property
    def width(self) -> int:
        return self.hi - self.lo + 1

    def support(self):
        return (self.lo, self.hi)

    def pmf(self):
        if self.width > MAX_SUPPORT:
            raise InputError("hi", f"uniform:{self.lo}:{self.hi} has {self.width} values, more "
                             f"than an explicit pmf may hold ({MAX_SUPPORT})")
        return np.arange(self.lo, self.hi + 1, dtype=np.int64), np.full(self.width, 1.0 / self.width)

    def quantile(self, u):
        k = np.floor(np.asarray(u, dtype=np.float64) * self.width).astype(np.int64)
        return self.lo + np.minimum(k, self.width - 1)

    def mean(self):
        return (self.lo + self.hi) / 2

    def second_moment(self):
        def s(m):
            return m * (m + 1) * (2 * m + 1) // 6
        return (s(self.hi) - s(self.lo - 1)) / self.width

    def var(self):
        return (self.width ** 2 - 1) / 12


class Discrete(LengthDist):
    """A distribution given by its pmf over positive integers; the base of the tabulated ones.

    Sampling is inverse transform: ``np.searchsorted`` of uniforms in the cumulative
    probabilities, so ``sample`` draws from exactly ``pmf()``. Moments are exact sums over it.
    """

    def __init__(self, values, probs, *, spec: str | None = None):
        v = as_tokens("values", values)
        p = np.asarray(probs, dtype=np.float64)
        if v.shape != p.shape:
            raise InputError("probs", f"need one probability per value (got {p.shape} for {v.shape})")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or not p.sum() > 0:
            raise InputError("probs", "must be finite, >= 0, and not all 0")
        keep = p > 0
        v, p = v[keep], p[keep]
        if np.any(np.diff(v) <= 0):
            order = np.argsort(v, kind="stable")
            v, p = v[order], p[order]
            if np.any(np.diff(v) == 0):
                uv, inv = np.unique(v, return_inverse=True)
                p = np.bincount(inv, weights=p)
                v = uv
        p = p / p.sum()
        cdf = np.cumsum(p)
        cdf[-1] = 1.0
        for a in (v, p, cdf):
            a.setflags(write=False)
        self._values, self._probs, self._cdf = v, p, cdf
        vf = v.astype(np.float64)
        self._mean = float(np.dot(vf, p))
        self._var = float(np.dot((vf - self._mean) ** 2, p))
        self.spec = spec if spec is not None else f"discrete:<{v.size} values>"

    def support(self):
        return (int(self._values[0]), int(self._values[-1]))

    def pmf(self):
        return self._values, self._probs

    def quantile(self, u):
        i = np.searchsorted(self._cdf, np.asarray(u, dtype=np.float64), side="right")
        return self._values[np.minimum(i, self._values.size - 1)]

    def mean(self):
        return self._mean

    def second_moment(self):
        return self._var + self._mean ** 2

    def var(self):
        return self._var


class Geometric(Discrete):
    """Token counts with a constant stop probability per token: ``geometric:mean=M[:max=B]``.

    ``P(K = k) = (1 - q)^(k - 1) q`` for ``k >= 1``, ``q = 1/M`` (an output that ends with the
    EOS token's chance ``q`` at every step, independently: the memoryless law). With a constant
    step time ``delta`` and one token a step, a request's service ``K delta`` is close to
    exponential with mean ``M delta`` (its squared CV is ``1 - q``): the M/M/c server of the
    classic queues, on the engine. ``max=`` conditions on ``K <= B``; without it the pmf stops at
    the 1 - 1e-12 quantile, which changes no moment beyond about 1e-11 relative.
    """

    def __init__(self, mean: float, *, max: int | None = None):
        m = tokens("mean", mean, whole=False)
        self.m = m
        q = 1.0 / m
        if max is not None:
            hi = tokens("max", max)
        elif q >= 1.0:
            hi = 1
        else:
            hi = int(math.ceil(1 + math.log(TAIL) / math.log1p(-q)))
        if hi > MAX_SUPPORT:
            raise InputError("mean", f"{fmt(m)} is too long a mean: the pmf would span more than {MAX_SUPPORT} values",
                             "give max= (the longest output served)")
        k = np.arange(1, hi + 1, dtype=np.float64)
        p = np.exp((k - 1) * math.log1p(-q)) * q if q < 1.0 else np.ones(1)
        super().__init__(k.astype(np.int64), p,
                         spec=f"geometric:mean={fmt(m)}" + ("" if max is None else f":max={hi}"))


class Empirical(Discrete):
    """Resampling (with replacement) of observed token counts (``empirical:PATH[:column=NAME]``).

    The pmf is the observed frequencies (``weights`` optionally weight each value). From a
    file, see :mod:`llmqueue.workload.tables` for the formats and the known column names: when
    the file has several columns and none is named, the known prompt or output column is used
    for the fields ``prompt`` and ``output``.
    """

    def __init__(self, values, weights=None, *, spec: str | None = None):
        v = as_tokens("values", values)
        w = np.ones(v.size) if weights is None else np.asarray(weights, dtype=np.float64)
        self.n_obs = int(v.size)
        super().__init__(v, w, spec=spec if spec is not None else f"empirical:<{v.size} values>")

    @classmethod
    def from_file(cls, path: str, column: str | None = None, *, role: str | None = None) -> "Empirical":
        from llmqueue.workload.tables import read_table

        table = read_table(path)
        col = table.resolve(column, role)
        values = table.tokens(col)
        spec = f"empirical:{path}" if len(table.names) == 1 else f"empirical:{path}:column={col}"
        return cls(values, spec=spec)


class _Rounded(Discrete):
    """A continuous law rounded to the nearest integer and conditioned on ``[lo, hi]``."""

    def _build(self, lo, hi, spec: str):
        from scipy.special import ndtr, ndtri

        self.lo = tokens("min", lo)
        self.hi = None if hi is None else tokens("max", hi)
        if self.hi is not None and self.hi < self.lo:
            raise InputError("max", f"must be >= min (got min = {self.lo} > max = {self.hi})")
        a = self.lo
        q_lo = self._x(float(ndtri(TAIL)))
        if math.isfinite(q_lo) and a < math.floor(q_lo) and (self.hi is None or math.floor(q_lo) <= self.hi):
            a = math.floor(q_lo)
        above = float(ndtr(-self._z(a - 0.5)))
        if not above > 0:
            raise InputError("min", f"leaves no probability mass (P(X >= {a}) underflows to 0); "
                             "lower min= or move the mean")
        q_hi = self._x(-float(ndtri(TAIL * above)))
        b = self.hi if self.hi is not None else math.inf
        if math.isfinite(q_hi):
            b = min(b, math.ceil(q_hi))
        if not math.isfinite(b) or b - a + 1 > MAX_SUPPORT:
            reach = f"{q_hi:.3g}" if math.isfinite(q_hi) else "beyond 1e308"
            raise InputError("max", f"is needed: without it the pmf would span {a}..{reach} "
                             f"tokens (to the 1-{TAIL:g} quantile), more than {MAX_SUPPORT} values",
                             "e.g. max=131072, the longest context served")
        k = np.arange(a, int(b) + 1, dtype=np.float64)
        zl, zh = self._z(k - 0.5), self._z(k + 0.5)
        p = np.where(zl > 0, ndtr(-zl) - ndtr(-zh), ndtr(zh) - ndtr(zl))
        if not p.sum() > 0:
            rng_txt = f"[{self.lo}, {self.hi}]" if self.hi is not None else f">= {self.lo}"
            raise InputError("min/max", f"bounds {rng_txt} hold no probability mass",
                             "widen min=/max= or move the mean")
        super().__init__(k.astype(np.int64), p, spec=spec)

    def _z(self, x):
        raise NotImplementedError

    def _x(self, z: float) -> float:
        raise NotImplementedError

    def support(self):
        return (self.lo, self.hi)


def _bounds(lo: int, hi: int | None) -> str:
    return ("" if lo == 1 else f":min={lo}") + ("" if hi is None else f":max={hi}")


class Normal(_Rounded):
    """Normal(``mean``, ``sd``) token counts, rounded to integers and conditioned on [min, max].

    ``normal:mean=M:sd=S[:min=A][:max=B]`` (``min`` defaults to 1). ``mean``/``sd`` are those of
    the normal before rounding and truncation. Truncation is *conditioning* (rejection of
    values outside the bounds), not clipping, so the realized mean differs slightly from
    ``mean=`` when a bound cuts into the distribution; ``mean()``, ``var()`` and ``pmf()`` report
    the realized distribution exactly. ``P(K = k) = Phi((k + 0.5 - M) / S) - Phi((k - 0.5 - M) / S)``
    renormalized over the kept values. Without ``max=``, the pmf stops at the 1 - 1e-12
    quantile of the conditioned law (and, when ``min`` lies further out, starts at the 1e-12
    quantile), which changes no moment beyond about 1e-11 relative.
    """

    def __init__(self, mean: float, sd: float, *, min: int = 1, max: int | None = None):
        self.mu = tokens("mean", mean, whole=False)
        self.sigma = tokens("sd", sd, whole=False)
        self._build(min, max, f"normal:mean={fmt(self.mu)}:sd={fmt(self.sigma)}" + _bounds(
            tokens("min", min), None if max is None else tokens("max", max)))

    def _z(self, x):
        return (x - self.mu) / self.sigma

    def _x(self, z):
        return self.mu + self.sigma * z


class LogNormal(_Rounded):
    """Lognormal token counts, rounded to integers and conditioned on [min, max].

    ``lognormal:mean=M:sd=S[:min=A][:max=B]`` gives the mean and sd of the token count itself
    (before rounding and truncation): ``sigma^2 = ln(1 + S^2 / M^2)``, ``mu = ln M - sigma^2 / 2``.
    ``lognormal:mu=MU:sigma=SIG`` gives the parameters of its log instead. Truncation is
    conditioning, so the realized mean differs slightly from ``mean=`` when a bound cuts the
    tail; ``mean()``, ``var()`` and ``pmf()`` report the realized distribution exactly. Without
    ``max=`` the pmf stops at the 1 - 1e-12 quantile; heavy tails (large S/M) then need ``max=``
    to keep the pmf under ``MAX_SUPPORT`` values.
    """

    def __init__(self, mean: float | None = None, sd: float | None = None, *, mu: float | None = None,
                 sigma: float | None = None, min: int = 1, max: int | None = None):
        if (mean is None) != (sd is None) or (mu is None) != (sigma is None) or \
                (mean is None) == (mu is None):
            raise InputError("mean/sd", "give mean= and sd= (of the token count) or mu= and sigma= "
                             "(of its log), one pair")
        if mean is not None:
            m, s = tokens("mean", mean, whole=False), tokens("sd", sd, whole=False)
            self.sigma = math.sqrt(math.log1p((s / m) ** 2))
            self.mu = math.log(m) - self.sigma ** 2 / 2
            head = f"lognormal:mean={fmt(m)}:sd={fmt(s)}"
        else:
            self.mu, self.sigma = finite("mu", mu), positive("sigma", sigma)
            if self.mu > math.log(MAX_TOKENS) or self.sigma > math.log(MAX_TOKENS):
                bad = "mu" if self.mu > math.log(MAX_TOKENS) else "sigma"
                raise InputError(bad, f"{getattr(self, bad):g} is above ln({MAX_TOKENS:.0e}) = "
                                 f"{math.log(MAX_TOKENS):.3g}, the longest log-length",
                                 "give mu= and sigma= of the log of the token count")
            head = f"lognormal:mu={fmt(self.mu)}:sigma={fmt(self.sigma)}"
        self._build(min, max, head + _bounds(tokens("min", min),
                                             None if max is None else tokens("max", max)))

    def _z(self, x):
        return (np.log(x) - self.mu) / self.sigma

    def _x(self, z):
        try:
            return math.exp(self.mu + self.sigma * z)
        except OverflowError:
            return math.inf
