"""Fit a workload model to a trace, write it as a spec file, and read it back.

``fit_workload(trace)`` fits:

(a) **Arrivals**: the rate over time, piecewise constant in ``window_s`` windows (the maximum
    likelihood rate of each window is its count over its width), and, inside the windows, a
    renewal law measured on the *time-rescaled* gaps ``Lambda(t_i) - Lambda(t_i-1)`` (which
    remove the rate profile, Brown et al. 2002): their squared CV is tested against 1, the value
    for Poisson arrivals (``z = (scv - 1) / sqrt(4 / n)``, the asymptotic null variance of the
    sample scv of exponential gaps). Poisson when the test does not reject at ``alpha``,
    otherwise a renewal law with the measured CV: Gamma, or, when it fits the gaps better (larger
    likelihood, same number of parameters), the balanced-means hyperexponential H2, the gap law
    of on/off bursts (the Azure code trace: log-likelihood -2755 against Gamma's -13216).
    Burst structure is thus kept at two scales: within a window in the gap law, at the minute
    scale in the rate profile (idle windows have rate 0). The diagnostics compare the IDC of
    the source and of the model at a sub-window scale and note when bursts shorter than the
    window remain (a smaller ``window_s`` then resolves them). The result is a
    ``piecewise:...:window=W:period=SPAN[:cv=CV][:gaps=h2]`` process of
    :mod:`llmqueue.workload.nonstationary`.

    ``counts="fixed"`` (the default) conditions on the window counts: each window of each
    period receives exactly the trace's count, placed by the renewal law. ``counts="random"``
    gives the unconditioned process (Poisson/renewal counts around each window's rate, which
    can run past the trace with fresh counts). Its window counts carry sampling noise of
    variance ``cv^2 lam_j w`` on top of the rate profile, so the raw window rates would
    overstate the dispersion of counts (IDC) by about ``cv^2``; the rates are therefore shrunk
    towards the mean rate by ``s = sqrt(1 - cv^2 mean(c) / var(c))``, the variance-matching
    ("constrained Bayes", Louis 1984) estimate, which keeps the expected IDC of ``window_s``
    bins and the total count. Even so one regenerated hour has few windows (60): the IDC of a
    random-counts sample scatters by 5-15 % around its mean, which is why the default conditions
    on the counts.

    Timestamps quantized to ticks (the Mooncake conversation trace: 90 % of gaps 0, the rest
    ~3 s) would make every gap test reject; ties are detected (share of zero gaps >= 30 % and
    the non-zero gaps on multiples of one tick) and spread uniformly at random over their tick
    (seeded) before the gaps are measured. Window counts use the recorded times.

(b) **Lengths**: by default the empirical joint ``(prompt, output)`` distribution, resampled
    as whole observed pairs (correlation and tails kept, Nie et al. 2026). Sampling is *balanced*
    (Davison, Hinkley and Schechtman 1986): successive random permutations of all the pairs,
    so a regenerated trace as long as the source has exactly its length distribution, in a new
    order. ``lengths="lognormal"`` fits a lognormal to each marginal by maximum likelihood on
    ``log(tokens)``, conditioned on the observed ``[min, max]``, and reports the
    Kolmogorov-Smirnov distance to the data (prompt and output are then independent: the
    correlation is lost and reported).

``FittedWorkload.save(path)`` writes a YAML spec (``format``, ``source``, ``arrival`` spec,
``lengths`` joint-file reference or ``prompt``/``output`` specs, ``duration_s``,
``diagnostics``) and, for empirical lengths, the pairs as ``<stem>.pairs.csv`` beside it,
referenced by a relative path. ``load_fitted(path)`` reads it back; ``generate(seed, n=... or
duration=...)`` regenerates traffic (the source's span when neither is given).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmqueue._result import Result
from llmqueue._validate import positive, positive_int, probability
from llmqueue.errors import InputError
from llmqueue.workload.joint import JointLengths
from llmqueue.workload.stats import MAX_BINS

FORMAT = "llmqueue-fitted-workload/1"
LENGTH_MODELS = ("empirical", "lognormal")
COUNT_MODES = ("fixed", "random")
SAMPLING = ("balanced", "iid")

__all__ = ["fit_workload", "load_fitted", "FittedWorkload", "ArrivalFit", "LengthFit", "BalancedPairs",
           "FORMAT"]


# -- results -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArrivalFit(Result):
    """What the arrival fit found. ``renewal`` is ``poisson``, ``gamma`` or ``h2`` (the gap law
    with the larger likelihood, ``loglik_gamma``/``loglik_h2``, when Poisson is rejected);
    ``cv`` is the renewal CV used (1 for Poisson), ``cv_measured``
    the CV of the time-rescaled gaps, ``scv_z``/``scv_pvalue`` the test of ``scv = 1``;
    ``rate_shrinkage`` the factor ``s`` applied to the window rates' deviations (1: none);
    ``tick_s`` the detected timestamp quantum (None: none)."""

    window_s: float
    windows: int
    period_s: float
    counts: str
    renewal: str
    cv: float
    cv_measured: float
    scv_z: float
    scv_pvalue: float
    alpha: float
    loglik_gamma: float | None
    loglik_h2: float | None
    n_gaps: int
    tick_s: float | None
    frac_zero_gaps: float
    rate_shrinkage: float
    idle_windows: int
    lam: float
    rate_min: float
    rate_max: float
    peak_to_mean: float


@dataclass(frozen=True)
class LengthFit(Result):
    """What the length fit found: the model, the pairs, the prompt/output correlation, and for
    lognormal marginals the parameters of the log and the Kolmogorov-Smirnov distance (with its
    asymptotic p-value, approximate: the parameters were estimated and the data are integers)."""

    model: str
    sampling: str | None
    pairs: int
    distinct_pairs: int
    correlation: float
    zero_lengths_clipped: int
    prompt_mu: float | None = None
    prompt_sigma: float | None = None
    prompt_ks: float | None = None
    prompt_ks_pvalue: float | None = None
    output_mu: float | None = None
    output_sigma: float | None = None
    output_ks: float | None = None
    output_ks_pvalue: float | None = None


class BalancedPairs(JointLengths):
    """Joint lengths resampled in balanced epochs: each epoch is a random permutation of all the
    observed pairs (the balanced bootstrap of Davison, Hinkley and Schechtman 1986).

    Every sampled pair was observed, as with :class:`JointLengths`, and each request's pair is
    marginally uniform over the observations; but ``n = k * N`` draws hold every pair exactly
    ``k`` times, so the length quantiles of a regenerated trace do not scatter (with replacement
    the p99 of 12,000 draws from a heavy-tailed trace moves by +-4 %)."""

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        n = positive_int("n", n, minimum=0)
        size = len(self)
        reps = -(-n // size) if n else 0
        if reps == 0:
            idx = np.empty(0, dtype=np.int64)
        else:
            idx = rng.permuted(np.tile(np.arange(size), (reps, 1)), axis=1).ravel()[:n]
        return self.prompts[idx], self.outputs[idx]


# -- the fitted workload -------------------------------------------------------------------------

class FittedWorkload:
    """A workload fitted to a trace: ``arrival`` process, ``joint`` pairs or ``prompt``/``output``
    distributions, ``duration_s`` (the source's span, the default length of :meth:`generate`),
    ``source`` (dict), ``arrival_fit``/``length_fit`` (dicts of the fit's diagnostics),
    ``source_stats``/``model_stats`` (the statistics compared), ``notes`` and ``path`` (the spec
    file, once saved or loaded)."""

    def __init__(self, arrival, *, joint=None, prompt=None, output=None, duration_s: float,
                 source: dict | None = None, arrival_fit: dict | None = None,
                 length_fit: dict | None = None, source_stats: dict | None = None,
                 model_stats: dict | None = None, notes: list | None = None, path=None):
        from llmqueue.workload.generate import Workload

        self.workload = Workload(arrival, prompt=prompt, output=output, joint=joint)
        self.duration_s = positive("duration_s", duration_s)
        self.source = dict(source or {})
        self.arrival_fit = dict(arrival_fit or {})
        self.length_fit = dict(length_fit or {})
        self.source_stats = dict(source_stats or {})
        self.model_stats = dict(model_stats or {})
        self.notes = list(notes or [])
        self.path = None if path is None else Path(path)
        self.pairs_path = None

    arrival = property(lambda self: self.workload.arrival)
    joint = property(lambda self: self.workload.joint)
    prompt = property(lambda self: self.workload.prompt)
    output = property(lambda self: self.workload.output)

    @property
    def rate(self) -> float:
        """Long-run arrival rate ``lam`` of the fitted process (req/s)."""
        return self.workload.rate

    def generate(self, seed, *, n: int | None = None, duration: float | None = None):
        """``n`` requests, or those arriving in ``[0, duration)``; the source's span when neither
        is given. Seeding as :meth:`Workload.generate <llmqueue.workload.generate.Workload.generate>`."""
        if n is None and duration is None:
            duration = self.duration_s
        return self.workload.generate(seed, n=n, duration=duration)

    def _lengths_doc(self, pairs_name: str | None) -> dict:
        if self.joint is not None:
            name = pairs_name if pairs_name is not None else self.joint.spec.partition(":")[2]
            return {"lengths": f"joint:{name}",
                    "length_sampling": "balanced" if isinstance(self.joint, BalancedPairs) else "iid"}
        return {"prompt": self.prompt.spec, "output": self.output.spec}

    def to_dict(self, pairs_name: str | None = None) -> dict:
        """The spec file's content as a dict (JSON-ready; infinities and NaN as None)."""
        from llmqueue._result import _plain

        doc = {"format": FORMAT, "source": self.source, "arrival": self.arrival.spec,
               **self._lengths_doc(pairs_name), "duration_s": self.duration_s,
               "diagnostics": {"arrival": self.arrival_fit, "lengths": self.length_fit,
                               "source_stats": self.source_stats, "model_stats": self.model_stats,
                               "notes": self.notes}}
        return _plain(doc)

    def save(self, path) -> Path:
        """Write the spec file ``path`` (YAML) and, for empirical lengths, ``<stem>.pairs.csv``
        beside it (the pairs sorted, one ``prompt_tokens,output_tokens`` row each). Returns the
        spec's path; ``pairs_path`` gives the pairs file's (None for lognormal lengths)."""
        import yaml

        from llmqueue._files import staged, write_atomic

        p = Path(os.fspath(path))
        p.parent.mkdir(parents=True, exist_ok=True)
        pairs_name = None
        self.pairs_path = None
        if self.joint is not None:
            pairs_name = f"{p.stem}.pairs.csv"
            pp = p.parent / pairs_name
            s, o = self.joint.prompts, self.joint.outputs
            order = np.lexsort((o, s))
            with staged(pp) as tmp, open(tmp, "w", encoding="utf-8") as f:
                f.write("prompt_tokens,output_tokens\n")
                np.savetxt(f, np.stack([s[order], o[order]], axis=1), fmt="%d", delimiter=",")
            self.pairs_path = pp
        doc = self.to_dict(pairs_name)
        head = ("# llmqueue fitted workload: load with llmqueue.workload.load_fitted(path)\n"
                "# paths are relative to this file\n")
        write_atomic(p, head + yaml.safe_dump(doc, sort_keys=False, width=float("inf"), allow_unicode=True))
        self.path = p
        return p

    def __repr__(self) -> str:
        lengths = self.joint.spec if self.joint is not None else f"{self.prompt.spec}, {self.output.spec}"
        return (f"FittedWorkload(arrival {self.arrival.spec[:60]}..., lengths {lengths}, "
                f"{self.duration_s:g} s)")


# -- fitting -------------------------------------------------------------------------------------

MAX_WINDOWS = 1_000_000
"""The most rate windows a fit makes: the model holds (and writes) one rate per window, and a
window far shorter than the gaps between requests holds none. A week at 1 s windows is 604,800."""


def fit_workload(trace, *, window_s: float = 60.0, lengths: str = "empirical", counts: str = "fixed",
                 sampling: str = "balanced", alpha: float = 0.01, seed: int = 0) -> FittedWorkload:
    """Fit an arrival model and a length model to ``trace`` (see the module docstring).

    ``trace``: a :class:`~llmqueue.workload.trace.Trace` or a trace file path (read with
    :func:`llmqueue.workload.traces.load_trace`). ``window_s``: the rate window (s).
    ``lengths``: ``empirical`` (joint pairs) or ``lognormal`` (marginals). ``counts``: ``fixed``
    (each window gets the trace's count) or ``random`` (Poisson/renewal counts, shrunk rates).
    ``sampling``: ``balanced`` or ``iid`` resampling of the pairs. ``alpha``: level of the
    Poisson test of the rescaled gaps. ``seed``: for spreading quantized timestamps only.
    """
    window_s = positive("window_s", window_s)
    lengths = _choice("lengths", lengths, LENGTH_MODELS)
    counts = _choice("counts", counts, COUNT_MODES)
    sampling = _choice("sampling", sampling, SAMPLING)
    alpha = probability("alpha", alpha)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError("seed", f"must be a non-negative integer (got {seed!r})")
    source_path = None
    if isinstance(trace, (str, os.PathLike)):
        from llmqueue.workload.traces import load_trace

        source_path = os.fspath(trace)
        trace = load_trace(trace)
    for attr in ("arrival_s", "prompt_tokens", "output_tokens"):
        if not hasattr(trace, attr):
            raise InputError("trace", f"expected a Trace or a trace file path (got {type(trace).__name__})")
    t = np.asarray(trace.arrival_s, dtype=np.float64)
    s = np.asarray(trace.prompt_tokens)
    o = np.asarray(trace.output_tokens)
    if t.ndim != 1 or t.size < 2 or s.shape != t.shape or o.shape != t.shape:
        raise InputError("trace", f"needs at least 2 requests with one prompt and one output length "
                         f"each (got {t.size})")
    if not np.all(np.isfinite(t)):
        raise InputError("trace", "has non-finite arrival times")
    if np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, s, o = t[order], s[order], o[order]
    t = t - t[0]
    if not t[-1] > 0:
        raise InputError("trace", "all requests arrive at the same time: no rate to fit")
    rng = np.random.default_rng(seed)
    notes: list[str] = []

    if t[-1] / window_s > MAX_WINDOWS:
        raise InputError("window_s", f"{window_s:g} s windows over the trace's {t[-1]:.4g} s make "
                         f"{t[-1] / window_s:.3g} windows, more than the {MAX_WINDOWS:,} a fitted rate holds",
                         f"give --window-s {t[-1] / MAX_WINDOWS:.3g} or more")
    arrival, afit, td = _fit_arrivals(t, window_s, counts, alpha, rng, notes)
    joint, prompt, output, lfit = _fit_lengths(s, o, lengths, sampling, notes)

    src = {"path": source_path if source_path is not None else str(getattr(trace, "source", "") or ""),
           "requests": int(t.size), "span_s": float(t[-1]),
           "repairs": [str(r) for r in getattr(trace, "repairs", []) or []]}
    sub = _sub_window(window_s, afit.tick_s)
    bins = sorted(b for b in {1.0, sub, 60.0, window_s} if t[-1] / b <= MAX_BINS)  # diagnostics: too fine ones left out
    sstats = _stream_stats(t, s, o, bins)
    if afit.tick_s is not None:
        sstats["idc_dequantized"] = {_key(b): _idc(td, b) for b in bins}
    fw = FittedWorkload(arrival, joint=joint, prompt=prompt, output=output, duration_s=afit.period_s,
                        source=src, arrival_fit=afit.to_dict(), length_fit=lfit.to_dict(),
                        source_stats=sstats, notes=notes)
    fw.model_stats = _model_stats(fw, bins)
    src_sub = (sstats.get("idc_dequantized") or sstats["idc"]).get(_key(sub))
    mod_sub = fw.model_stats.get("idc", {}).get(_key(sub))
    if src_sub is not None and mod_sub is not None and src_sub > 1.25 * mod_sub and src_sub > mod_sub + 1:
        fw.notes.append(f"bursts shorter than the window: the source's IDC({sub:g} s) is {src_sub:.3g}, "
                     f"the model's {mod_sub:.3g}; a smaller window_s (e.g. {sub:g}) resolves them")
    return fw


def _choice(name: str, value, options) -> str:
    v = str(value).strip().lower() if isinstance(value, str) else value
    if v not in options:
        raise InputError(name, f"must be one of {', '.join(options)} (got {value!r})")
    return v


def _sig(x: float, digits: int) -> float:
    return float(f"{x:.{digits}g}")


def _detect_tick(t: np.ndarray) -> float | None:
    """The timestamp quantum when ties dominate and the other gaps sit on multiples of one tick."""
    g = np.diff(t)
    if g.size < 10 or np.mean(g == 0) < 0.3:
        return None
    nz = g[g > 0]
    if nz.size < 5:
        return None
    q = float(np.median(nz))
    k = np.maximum(np.round(nz / q), 1.0)
    if np.mean(np.abs(nz - k * q) <= 0.02 * q) < 0.9:
        return None
    return q


def _spread_random(t: np.ndarray, tick: float, rng) -> np.ndarray:
    """Requests sharing a time ``T`` moved uniformly at random over ``[T, T + w)``, ``w`` the tick
    or the gap to the next distinct time if shorter; sorted."""
    uniq, inv = np.unique(t, return_inverse=True)
    width = np.full(uniq.size, tick)
    if uniq.size > 1:
        width[:-1] = np.minimum(tick, np.diff(uniq))
    return np.sort(uniq[inv] + width[inv] * rng.random(t.size))


def _fit_arrivals(t, w, counts, alpha, rng, notes):
    from llmqueue.workload.nonstationary import Piecewise

    n = t.size
    period = round(float(t[-1]), 6)
    m_full = int(period // w)
    rem = period - m_full * w
    m = m_full + 1 if rem > 1e-6 else max(m_full, 1)
    widths = np.full(m, w)
    widths[-1] = period - (m - 1) * w
    idx = np.minimum((t // w).astype(np.int64), m - 1)
    c = np.bincount(idx, minlength=m).astype(np.float64)
    raw = c / widths
    lam_bar = n / period

    tick = _detect_tick(t)
    td = t
    if tick is not None:
        td = _spread_random(t, tick, rng)
        notes.append(f"timestamps are quantized to ~{tick:.4g} s ticks ({np.mean(np.diff(t) == 0):.0%} "
                     "of gaps are 0): ties were spread uniformly at random over their tick to "
                     "measure the gaps; window counts use the recorded times")
    # time-rescaled gaps under the windows' maximum-likelihood rates
    cum = np.concatenate([[0.0], np.cumsum(c[:-1])])
    j = np.clip((td // w).astype(np.int64), 0, m - 1)
    big_l = cum[j] + raw[j] * (td - j * w)
    g = np.diff(big_l)
    g = g[g >= 0]
    mean_g = float(g.mean())
    cv_hat = float(g.std()) / mean_g if mean_g > 0 else math.nan
    scv = cv_hat ** 2
    z = (scv - 1.0) * math.sqrt(g.size) / 2.0
    pval = math.erfc(abs(z) / math.sqrt(2.0))
    poisson = pval >= alpha
    cv = 1.0 if poisson else _sig(cv_hat, 4)
    ll_gamma, ll_h2 = _gap_logliks(g / mean_g, cv) if not poisson else (None, None)
    gaps = "h2" if ll_h2 is not None and ll_h2 > ll_gamma else "gamma"

    shrink = 1.0
    if counts == "fixed":
        rates = raw
    else:
        full = c[np.isclose(widths, w)]
        if full.size >= 2 and full.var() > 0:
            shrink = math.sqrt(min(1.0, max(0.0, 1.0 - cv ** 2 * full.mean() / full.var())))
        else:
            shrink = 0.0
        rates = lam_bar + shrink * (raw - lam_bar)
        notes.append(f"counts=random: window rates shrunk by s = {shrink:.3g} towards the mean rate "
                     f"so that Poisson/renewal count noise does not inflate the IDC({w:g} s)")
    rates = np.array([_sig(r, 7) for r in rates])
    arrival = Piecewise.from_rates(rates, w, period=period, cv=cv, gaps=gaps, counts=counts)
    idle = int(np.sum(c == 0))
    if idle:
        notes.append(f"{idle} of {m} windows have no arrivals (rate 0)")
    fit = ArrivalFit(window_s=w, windows=m, period_s=period, counts=counts,
                     renewal="poisson" if poisson else gaps, cv=cv, cv_measured=cv_hat, scv_z=z,
                     scv_pvalue=pval, alpha=alpha, loglik_gamma=ll_gamma, loglik_h2=ll_h2,
                     n_gaps=int(g.size), tick_s=tick,
                     frac_zero_gaps=float(np.mean(np.diff(t) == 0)), rate_shrinkage=shrink,
                     idle_windows=idle, lam=arrival.rate, rate_min=float(rates.min()),
                     rate_max=float(rates.max()), peak_to_mean=float(raw.max() / lam_bar))
    return arrival, fit, td


def _gap_logliks(x: np.ndarray, cv: float) -> tuple[float, float | None]:
    """Log-likelihoods of unit-mean gaps ``x`` under Gamma(``1/cv^2``, ``cv^2``) and, for
    ``cv > 1``, the balanced-means H2 with that cv (None otherwise). Both laws have the one
    parameter ``cv`` once the mean is fixed, so the larger likelihood is the better fit (and
    the smaller AIC). Gaps of 0 are taken as 1e-12 of the mean (Gamma's density is infinite there)."""
    from scipy.special import gammaln

    from llmqueue.workload.nonstationary import h2_balanced

    x = np.maximum(x, 1e-12)
    k = 1.0 / cv ** 2
    ll_g = float(np.sum(k * math.log(k) - gammaln(k) + (k - 1) * np.log(x) - k * x))
    if cv <= 1:
        return ll_g, None
    p1, r1, r2 = h2_balanced(cv)
    ll_h = float(np.sum(np.log(p1 * r1 * np.exp(-r1 * x) + (1 - p1) * r2 * np.exp(-r2 * x))))
    return ll_g, ll_h


def _ks_discrete(x: np.ndarray, dist) -> tuple[float, float]:
    """Kolmogorov-Smirnov distance between the sample ``x`` and the integer distribution
    ``dist`` (both CDFs are step functions on the integers), and its asymptotic p-value."""
    from scipy.stats import kstwo

    vals, cnt = np.unique(x, return_counts=True)
    emp = np.cumsum(cnt) / x.size
    emp_left = emp - cnt / x.size
    sv, p = dist.pmf()
    cdf = np.cumsum(p)

    def model_cdf(v):
        i = np.searchsorted(sv, v, side="right") - 1
        return np.where(i >= 0, cdf[np.maximum(i, 0)], 0.0)

    d = max(float(np.max(np.abs(emp - model_cdf(vals)))),
            float(np.max(np.abs(emp_left - model_cdf(vals - 1)))))
    return d, float(kstwo.sf(d, x.size))


def _fit_lognormal(x: np.ndarray):
    from llmqueue.workload.lengths import Fixed, LogNormal

    lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        return Fixed(lo), None, None
    ln = np.log(x.astype(np.float64))
    mu, sigma = _sig(float(ln.mean()), 6), _sig(float(ln.std()), 6)
    return LogNormal(mu=mu, sigma=sigma, min=lo, max=hi), mu, sigma


def _fit_lengths(s, o, model, sampling, notes):
    s = np.asarray(s).astype(np.int64)
    o = np.asarray(o).astype(np.int64)
    zeros = int(np.sum(s < 1) + np.sum(o < 1))
    if zeros:
        notes.append(f"{zeros} lengths of 0 tokens were counted as 1 (the models need >= 1)")
        s, o = np.maximum(s, 1), np.maximum(o, 1)
    sf, of = s.astype(np.float64), o.astype(np.float64)
    ds, do = sf - sf.mean(), of - of.mean()
    den = math.sqrt(float(ds @ ds) * float(do @ do))
    corr = float(ds @ do) / den if den > 0 else math.nan
    distinct = int(np.unique(np.stack([s, o], axis=1), axis=0).shape[0])
    if model == "empirical":
        cls = BalancedPairs if sampling == "balanced" else JointLengths
        order = np.lexsort((o, s))  # the order the pairs file holds, so a reloaded fit samples alike
        joint = cls(s[order], o[order], spec=f"joint:<{s.size} pairs>")
        return joint, None, None, LengthFit("empirical", sampling, int(s.size), distinct, corr, zeros)
    pd, pmu, psig = _fit_lognormal(s)
    od, omu, osig = _fit_lognormal(o)
    pk, pp = _ks_discrete(s, pd)
    ok, op = _ks_discrete(o, od)
    if not math.isnan(corr) and abs(corr) > 0.1:
        notes.append(f"lognormal marginals are independent: the prompt/output correlation "
                     f"{corr:.3g} of the trace is lost (lengths=empirical keeps it)")
    fit = LengthFit("lognormal", None, int(s.size), distinct, corr, zeros, pmu, psig, pk, pp,
                    omu, osig, ok, op)
    return None, pd, od, fit


# -- statistics compared in the diagnostics ------------------------------------------------------

def _key(b: float) -> str:
    return f"{b:g}s"


def _sub_window(window_s: float, tick: float | None) -> float:
    b = _sig(window_s / 6.0, 3)
    return max(b, 2 * tick) if tick is not None else b


def _idc(t: np.ndarray, b: float) -> float | None:
    """Variance / mean of counts in ``b``-second bins from the first arrival, the last partial
    bin dropped (the traces README's definition)."""
    idx = ((t - t[0]) // b).astype(np.int64)
    nb = int(idx.max())
    c = np.bincount(idx, minlength=nb + 1)[:nb]
    if c.size < 2 or c.mean() == 0:
        return None
    return float(c.var() / c.mean())


def _stream_stats(t, s, o, bins) -> dict:
    g = np.diff(t)
    out = {"mean_rate": (t.size - 1) / float(t[-1] - t[0]), "iat_cv": float(g.std() / g.mean()),
           "idc": {_key(b): _idc(t, b) for b in bins}}
    for name, x in (("prompt", s), ("output", o)):
        x = np.asarray(x, dtype=np.float64)
        p50, p99 = np.percentile(x, [50, 99])
        out[name] = {"mean": float(x.mean()), "p50": float(p50), "p99": float(p99)}
    return out


def _model_stats(fw: FittedWorkload, bins) -> dict:
    """The fitted model's long-run rate ``lam`` and the statistics of one regenerated trace
    (seed 0, the source's span), measured as the source's are."""
    r = fw.generate(0)
    t = np.asarray(r.arrival_s)
    out = {"lam": fw.arrival.rate, "regenerated_seed": 0, "requests": int(t.size)}
    if t.size >= 2 and t[-1] > t[0]:
        out.update(_stream_stats(t, r.prompt_tokens, r.output_tokens, bins))
    return out


# -- reading back --------------------------------------------------------------------------------

def _resolve_path_spec(spec, base: Path, field: str, forms):
    """Split a file spec (``joint:PATH...``/``empirical:PATH...``) and make PATH absolute from ``base``."""
    from llmqueue.workload.spec import split_spec

    form, v = split_spec(spec, field, forms, "length source")
    p = Path(v["path"])
    if not p.is_absolute():
        p = base / p
    return form, v, str(p)


def load_fitted(path) -> FittedWorkload:
    """Read a spec file written by :meth:`FittedWorkload.save` into a :class:`FittedWorkload`.

    Relative file references (the pairs) are taken from the spec file's directory."""
    from llmqueue._files import load_yaml
    from llmqueue.workload.lengths import Empirical
    from llmqueue.workload.parse import JOINT_FORMS, LENGTH_FORMS, parse_arrival, parse_length

    p = Path(os.fspath(path))
    if not p.is_file():
        raise InputError("spec", f"{str(p)!r} does not exist or is not a file")
    doc = load_yaml("spec", p, what="spec file")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError("spec", f"{str(p)!r} is not a fitted workload file (needs format: {FORMAT})",
                         "write one with `llmqueue workload fit TRACE -o SPEC.yaml`")
    if "arrival" not in doc:
        raise InputError("spec", f"{str(p)!r} has no arrival: entry")
    arrival = parse_arrival(doc["arrival"], "arrival")
    base = p.parent
    joint = prompt = output = None
    if "lengths" in doc:
        _, v, fp = _resolve_path_spec(doc["lengths"], base, "lengths", JOINT_FORMS)
        joint = JointLengths.from_file(fp, v.get("prompt"), v.get("output"))
        sampling = doc.get("length_sampling", "iid")
        if _choice("length_sampling", sampling, SAMPLING) == "balanced":
            joint = BalancedPairs(joint.prompts, joint.outputs, spec=joint.spec)
    else:
        if "prompt" not in doc or "output" not in doc:
            raise InputError("spec", f"{str(p)!r} needs lengths: (joint pairs) or prompt: and output:")
        dists = []
        for field in ("prompt", "output"):
            spec = doc[field]
            if isinstance(spec, str) and spec.strip().lower().startswith("empirical:"):
                _, v, fp = _resolve_path_spec(spec, base, field, LENGTH_FORMS)
                dists.append(Empirical.from_file(fp, v.get("column"), role=field))
            else:
                dists.append(parse_length(spec, field))
        prompt, output = dists
    diag = doc.get("diagnostics") or {}
    duration = doc.get("duration_s") or (doc.get("source") or {}).get("span_s")
    if duration is None:
        raise InputError("spec", f"{str(p)!r} has no duration_s: entry")
    return FittedWorkload(arrival, joint=joint, prompt=prompt, output=output, duration_s=duration,
                          source=doc.get("source"), arrival_fit=diag.get("arrival"),
                          length_fit=diag.get("lengths"), source_stats=diag.get("source_stats"),
                          model_stats=diag.get("model_stats"), notes=diag.get("notes"), path=p)
