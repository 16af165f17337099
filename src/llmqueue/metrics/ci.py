"""Confidence intervals for steady-state means and quantiles of simulation/measurement output.

Latencies of successive requests are positively correlated (a long queue delays everyone
behind it), so the textbook iid interval ``mean +- t s/sqrt(n)`` is far too narrow. Two standard
remedies (Law, *Simulation Modeling and Analysis*, 5th ed., sec. 9.5; Asmussen & Glynn,
*Stochastic Simulation*, ch. III-IV):

- **Batch means** (:func:`batch_means_ci`): cut the time-ordered observations into ``k``
  contiguous batches (default 20); batch means of long-enough batches are nearly independent
  and normal, so ``t_{k-1}`` applies to their spread. We centre the interval on the overall
  estimate and take its half-width from the spread of the batch estimates,
  ``t_{k-1, (1+level)/2} * sd(batch estimates) / sqrt(k)`` ("sectioning", Asmussen & Glynn
  IV.5), which is the classic batch-means interval for a mean and lets the same recipe serve
  quantiles and weighted means, where the overall estimate is less biased than the average of
  batch estimates.
  For a positive quantity (a latency: ``positive=True``) the interval is taken on the log
  scale of the batch means: ``mean * exp(+- t_{k-1} sd(log batch means) / sqrt(k))``, the
  delta-method twin of the linear interval (the same width to first order when it is narrow)
  that can never reach below zero, however skewed the latencies or few the batches; where a
  batch mean is 0 (a nonnegative quantity such as queueing time, with batches that never
  queued) the log is undefined and the linear interval is cut at 0 (the mean cannot be below).
- **Quantiles** (:func:`batch_quantile_ci`): batch means of the indicator ``x <= q_hat``
  bound the CDF at the estimated quantile, ``p +- h``; the quantile interval is the overall
  empirical quantiles at ``p - h`` and ``p + h`` (inverting the CDF interval; asymmetric, as a
  tail quantile's uncertainty is). The textbook alternative, a t-interval of per-batch
  p-quantiles, is available (``method="batch_quantiles"``) but under-covers in the tail (see
  the function). Tail quantiles need data: we require every batch to expect
  ``min(p, 1-p) * batch_size >= min_tail`` (default 10) observations beyond the quantile and at
  least ``min_batches`` (default 10) batches, shrinking the number of batches as needed; when
  that fails, or ``p + h`` reaches 1, we return ``None``: no interval rather than a fake one.
  So a p99 interval needs at least 10,000 observations, a p99.9 interval 100,000.
- **Independent replications** (:func:`replication_ci`): one estimate per independent run
  (different seeds, each with its own warm-up removed); ``t_{r-1}`` interval of their mean.
  The simplest and most robust choice when runs are cheap.

Limits: batch means assumes each batch is long compared with the output's correlation time
(heavy traffic, rho near 1, needs long runs; coverage falls below nominal when batches are too
short) and that the warm-up transient was removed. Intervals are for the steady-state value
the run estimates, not for a different workload.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from llmqueue._result import Result
from llmqueue._validate import positive_int, probability
from llmqueue.errors import InputError

DEFAULT_LEVEL = 0.95
DEFAULT_BATCHES = 20
MIN_BATCHES = 10
MIN_BATCH_SIZE = 10
MIN_TAIL = 10


@dataclass(frozen=True)
class Interval(Result):
    """A two-sided confidence interval ``[lo, hi]`` around ``estimate``.

    ``method``: ``batch_means``, ``batch_means_log`` (a positive mean, on the log scale),
    ``batch_indicator`` (quantile by inverting the batched CDF),
    ``batch_quantiles`` or ``replications``; ``n``: observations
    (total weight for weighted data, replications for ``replications``); ``batches``: number of
    batches (or replications) whose spread sized the interval.
    """

    estimate: float
    lo: float
    hi: float
    level: float
    method: str
    n: float
    batches: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def as_list(self) -> list[float]:
        return [self.lo, self.hi]

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. ``1000`` for seconds -> ms)."""
        return Interval(self.estimate * factor, self.lo * factor, self.hi * factor, self.level,
                        self.method, self.n, self.batches)


@functools.lru_cache(maxsize=256)
def t_quantile(level: float, df: int) -> float:
    """The two-sided Student-t critical value ``t_{df, (1+level)/2}``."""
    from scipy.special import stdtrit  # much lighter to import than scipy.stats

    return float(stdtrit(df, (1 + level) / 2))


def _interval(center: float, values: np.ndarray, level: float, method: str, n: float) -> Interval:
    k = len(values)
    hw = t_quantile(level, k - 1) * float(np.std(values, ddof=1)) / math.sqrt(k)
    return Interval(float(center), float(center - hw), float(center + hw), level, method, n, k)


def _log_interval(center: float, values: np.ndarray, level: float, method: str, n: float) -> Interval:
    """:func:`_interval` for a positive mean: sectioning on the log scale of the batch estimates
    ``values`` (all > 0), ``center * exp(+- t_{k-1} sd(log values) / sqrt(k))``."""
    k = len(values)
    hw = t_quantile(level, k - 1) * float(np.std(np.log(values), ddof=1)) / math.sqrt(k)
    return Interval(float(center), float(center * math.exp(-hw)), float(center * math.exp(hw)), level, method, n, k)


def _check_data(x, weights):
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.isfinite(x).all():
        raise InputError("x", "holds NaN or inf", "drop unobserved values before computing a CI")
    if weights is None:
        return x, None
    w = np.asarray(weights, dtype=np.float64).ravel()
    if w.shape != x.shape:
        raise InputError("weights", f"length {len(w)} differs from the data's {len(x)}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise InputError("weights", "must be finite and >= 0")
    keep = w > 0
    return x[keep], w[keep]


def _check_common(x, weights, level):
    level = probability("level", level)
    return (*_check_data(x, weights), level)


def _batch_ids(n: int, w: np.ndarray | None, k: int) -> np.ndarray:
    """Contiguous batch index (0..k-1) per observation: equal counts, or equal total weight."""
    if w is None:
        return (np.arange(n) * k) // n
    before = np.cumsum(w) - w  # weight strictly before each observation
    return np.minimum((before * k / w.sum()).astype(np.int64), k - 1)


class OrderedSample:
    """Time-ordered observations ``x`` (optionally weighted, e.g. tokens per step record), sorted
    once so that many quantiles and their intervals cost one sort.

    :meth:`percentile` is ``np.percentile(x, q)`` (numpy's linear interpolation; with weights,
    :func:`weighted_percentile`), the same numbers; :meth:`quantile_cis` is
    :func:`batch_quantile_ci` (the indicator method) for several ``p`` at once. NaN or inf in
    ``x``, or weights that are negative or not finite, are refused; zero weights are dropped.
    """

    def __init__(self, x, weights=None):
        self.x, self.w = _check_data(x, weights)
        self._batches: dict = {}
        if self.w is None:
            self.sorted, self.cum = np.sort(self.x), None
        else:
            order = np.argsort(self.x, kind="stable")
            self.sorted, self.cum = self.x[order], np.cumsum(self.w[order])

    @property
    def total(self) -> float:
        """Observations, or their total weight."""
        return float(len(self.x) if self.w is None else self.w.sum())

    def percentile(self, q):
        """The ``q``-th percentiles (``q`` in percent, scalar or array)."""
        if self.cum is None:
            return np.percentile(self.sorted, q)  # the same order statistics as x's: the same numbers
        return _percentile_of_sorted(self.sorted, self.cum, q)

    def batches(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The contiguous batch index of each observation (:func:`_batch_ids`) and each batch's
        count (weight), for ``k`` batches."""
        if k not in self._batches:
            ids = _batch_ids(len(self.x), self.w, k)
            self._batches[k] = (ids, np.bincount(ids, weights=self.w, minlength=k).astype(np.float64))
        return self._batches[k]

    def quantile_cis(self, ps, *, level: float = DEFAULT_LEVEL, batches: int = DEFAULT_BATCHES,
                     min_batches: int = MIN_BATCHES, min_tail: float = MIN_TAIL) -> list:
        """:func:`batch_quantile_ci` (``method="indicator"``) for each ``p`` in ``ps``: the
        batched CDF at the overall p-quantile, inverted (an :class:`Interval` or None each)."""
        level = probability("level", level)
        batches = positive_int("batches", batches, minimum=2)
        min_batches = positive_int("min_batches", min_batches, minimum=2)
        ps = [probability("p", p) for p in ps]
        total = self.total
        out: list = [None] * len(ps)
        ks = [min(batches, int(total * min(p, 1 - p) // min_tail)) if total > 0 else 0 for p in ps]
        todo = [i for i, k in enumerate(ks) if not (k < min_batches or len(self.x) < k)]
        if not todo:
            return out
        centers = self.percentile(np.array([100.0 * ps[i] for i in todo]))
        bounds = {}
        for i, center in zip(todo, centers):
            p, k = ps[i], ks[i]
            ids, per_batch = self.batches(k)
            below = np.bincount(ids, weights=(self.x <= center) if self.w is None else self.w * (self.x <= center),
                                minlength=k)
            with np.errstate(invalid="ignore", divide="ignore"):  # a batch of zero weight: no interval below
                frac = below / per_batch
            h = t_quantile(level, k - 1) * float(np.std(frac, ddof=1)) / math.sqrt(k)
            if not (0 < p - h and p + h < 1) or h <= 0:
                continue
            bounds[i] = (float(center), p, h, k)
        if bounds:
            qs = self.percentile(100.0 * np.array([v for _, p, h, _ in bounds.values() for v in (p - h, p + h)]))
            for j, (i, (center, _, _, k)) in enumerate(bounds.items()):
                lo, hi = float(qs[2 * j]), float(qs[2 * j + 1])
                out[i] = Interval(center, min(lo, center), max(hi, center), level, "batch_indicator", total, k)
        return out


def weighted_percentile(x, weights, q):
    """``np.percentile(np.repeat(x, weights), q)`` for integer weights, without repeating.

    Linear interpolation between order statistics (numpy's default), so weighted step records
    give exactly the percentiles of the expanded per-token samples. ``q`` in percent (scalar or
    array). Non-integer weights are allowed and interpolate on the same cumulative scale.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    keep = ws > 0
    return _percentile_of_sorted(xs[keep], np.cumsum(ws[keep]), q)


def _percentile_of_sorted(xs: np.ndarray, cum: np.ndarray, q):
    """:func:`weighted_percentile` of the sorted values ``xs`` whose cumulative positive weights
    are ``cum`` (``cum[i]``: the 1-based rank of the last copy of ``xs[i]``)."""
    if len(xs) == 0:
        raise InputError("x", "no observations with positive weight")
    N = cum[-1]
    h = (N - 1) * np.asarray(q, dtype=np.float64) / 100.0  # 0-based fractional rank
    lo = np.floor(h)
    frac = h - lo
    i_lo = np.searchsorted(cum, lo + 1, side="left")  # value at 0-based rank r: first cum > r
    i_hi = np.searchsorted(cum, np.minimum(lo + 2, N), side="left")
    i_lo = np.minimum(i_lo, len(xs) - 1)
    i_hi = np.minimum(i_hi, len(xs) - 1)
    return xs[i_lo] + frac * (xs[i_hi] - xs[i_lo])


def weighted_mean_std(x, weights=None) -> tuple[float, float]:
    """Mean and population standard deviation (``np.std``, ddof=0), optionally weighted."""
    x = np.asarray(x, dtype=np.float64)
    if weights is None:
        return float(np.mean(x)), float(np.std(x))
    w = np.asarray(weights, dtype=np.float64)
    m = float(np.sum(w * x) / np.sum(w))
    return m, float(math.sqrt(max(np.sum(w * (x - m) ** 2) / np.sum(w), 0.0)))


def batch_means_ci(x, *, weights=None, level: float = DEFAULT_LEVEL, batches: int = DEFAULT_BATCHES,
                   min_batches: int = MIN_BATCHES, min_batch_size: float = MIN_BATCH_SIZE,
                   positive: bool = False) -> Interval | None:
    """Batch-means confidence interval for the steady-state mean of time-ordered ``x``.

    ``positive``: the mean is of a nonnegative quantity (a latency); the interval is then never
    below zero: on the log scale of the batch means (``method`` ``batch_means_log``), or, when a
    batch mean is not positive, the linear one cut at 0 (see the module docstring).

    ``weights`` (e.g. tokens per step record) make it a ratio estimator: batches of equal total
    weight, each batch's weighted mean, centred on the overall weighted mean. The number of
    batches is ``batches`` reduced until each holds ``min_batch_size`` observations (weight);
    ``None`` when fewer than ``min_batches`` remain.
    """
    x, w, level = _check_common(x, weights, level)
    batches = positive_int("batches", batches, minimum=2)
    min_batches = positive_int("min_batches", min_batches, minimum=2)
    total = float(len(x) if w is None else w.sum())
    k = min(batches, int(total // min_batch_size)) if total > 0 else 0
    if k < min_batches or len(x) < k:
        return None
    ids = _batch_ids(len(x), w, k)
    if w is None:  # unit weights: the same sums, without building them
        sums = np.bincount(ids, weights=x, minlength=k)
        wsum = np.bincount(ids, minlength=k).astype(np.float64)
        center = float(np.sum(x) / len(x))
    else:
        sums = np.bincount(ids, weights=w * x, minlength=k)
        wsum = np.bincount(ids, weights=w, minlength=k)
        center = float(np.sum(w * x) / np.sum(w))
    if (wsum <= 0).any():
        return None
    means = sums / wsum
    if not positive:
        return _interval(center, means, level, "batch_means", total)
    if (means > 0).all():
        return _log_interval(center, means, level, "batch_means_log", total)
    ci = _interval(center, means, level, "batch_means", total)
    return Interval(ci.estimate, max(ci.lo, 0.0), ci.hi, level, ci.method, ci.n, ci.batches)


def batch_quantile_ci(x, p: float, *, weights=None, level: float = DEFAULT_LEVEL,
                      batches: int = DEFAULT_BATCHES, min_batches: int = MIN_BATCHES,
                      min_tail: float = MIN_TAIL, method: str = "indicator") -> Interval | None:
    """Confidence interval for the steady-state p-quantile of time-ordered ``x``.

    The estimate is the overall sample p-quantile (numpy's linear interpolation, as vLLM
    reports percentiles). ``k`` contiguous batches size the interval, ``k`` being ``batches``
    reduced until every batch expects at least ``min_tail`` observations beyond the quantile
    (``min(p, 1-p) * batch size``); ``None`` when fewer than ``min_batches`` remain.

    ``method="indicator"`` (default): batch means of the indicator ``x <= q_hat`` give a
    t-interval ``p +- h`` for the CDF at the estimate (a mean, so batch means applies exactly
    as for latencies); the quantile interval is ``[Q(p - h), Q(p + h)]`` from the overall
    empirical quantile function: inverting a CDF interval, asymmetric as tail quantiles are.
    ``None`` when ``p +- h`` leaves (0, 1) (the data cannot bound the quantile).

    ``method="batch_quantiles"``: the textbook batch-quantile interval, overall quantile +-
    ``t_{k-1}`` times the standard error of the k batch p-quantiles. It under-covers for tail
    quantiles of correlated output: a batch's p99 is a strongly non-linear function of its
    handful of tail observations, so the batch spread understates the overall estimate's
    error. M/M/1 at rho = 0.8, 200 seeds, 20 batches, nominal 95%: with 19,000 requests the
    batch-quantile p99 interval covered the true p99 in 57% of runs, the indicator interval in
    81% of the runs where it was defined (about half; otherwise ``None``); with 95,000 requests
    92%, with 380,000 95%. For p50 and p90 both methods covered 94-97%.
    """
    x, w, level = _check_common(x, weights, level)
    p = probability("p", p)
    batches = positive_int("batches", batches, minimum=2)
    min_batches = positive_int("min_batches", min_batches, minimum=2)
    if method not in ("indicator", "batch_quantiles"):
        raise InputError("method", f"unknown method {method!r}", "use 'indicator' or 'batch_quantiles'")
    sample = OrderedSample(x, w)
    if method == "indicator":
        return sample.quantile_cis([p], level=level, batches=batches, min_batches=min_batches, min_tail=min_tail)[0]
    total = sample.total
    k = min(batches, int(total * min(p, 1 - p) // min_tail)) if total > 0 else 0
    if k < min_batches or len(x) < k:
        return None
    ids = _batch_ids(len(x), w, k)
    q = 100.0 * p

    def batch_quantile(j):
        sel = ids == j
        return np.percentile(x[sel], q) if w is None else weighted_percentile(x[sel], w[sel], q)

    est = np.array([batch_quantile(j) for j in range(k)])
    return _interval(float(sample.percentile(q)), est, level, "batch_quantiles", total)


def replication_ci(estimates, *, level: float = DEFAULT_LEVEL) -> Interval | None:
    """Student-t interval from independent replications (one estimate per run); ``None`` if < 2."""
    x, _, level = _check_common(estimates, None, level)
    if len(x) < 2:
        return None
    return _interval(float(np.mean(x)), x, level, "replications", len(x))
