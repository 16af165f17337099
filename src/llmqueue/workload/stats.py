"""Statistics of a request stream: arrival rate and burstiness, lengths, E[g], prefix reuse.

Definitions follow the shared traces' ``compute_stats.py`` (its README's tables) exactly:

- ``mean_rate = (n - 1) / span`` (req/s), ``span`` = last minus first arrival;
- ``iat_cv`` = std / mean of the inter-arrival times (population std); ``scv_a = iat_cv**2`` is
  the arrival SCV that G/G/c approximations (Kingman, Allen-Cunneen) take;
- ``idc[b]``, the index of dispersion of counts: variance / mean of the request counts in
  consecutive ``b``-second bins starting at the first arrival (population variance), 1 for a
  Poisson process; ``peak_to_mean[b]`` = max / mean of those counts. The last, partial bin is
  dropped; with fewer than 2 complete bins both are undefined (None in JSON);
- length percentiles use numpy's linear interpolation;
- ``corr``: Pearson correlation of prompt and output lengths;
- ``E_g``: the sample mean of Nie et al.'s lifetime KV memory-work ``g(s, o)`` for the chunk size
  (:func:`llmqueue.theory.kv.expected_g` over the observed pairs, their correlation kept);
- ``prefix_reuse_frac`` (traces with ``hash_ids``): the fraction of prefix blocks that an
  earlier request had already used (a block repeated inside one request counts once it has
  been seen in an earlier request only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from llmqueue._result import Result
from llmqueue._validate import positive, positive_int
from llmqueue.errors import InputError
from llmqueue.workload.trace import Trace

__all__ = ["LengthStats", "TraceStats", "trace_stats", "spec_stats", "arrival_stats", "prefix_reuse"]


@dataclass(frozen=True)
class LengthStats(Result):
    """Summary of token lengths: mean, p50, p90, p99 (linear interpolation), min, max."""

    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float


@dataclass(frozen=True)
class TraceStats(Result):
    """Statistics of a trace or of a generated workload (see the module docstring).

    ``idc`` and ``peak_to_mean`` map a bin width (``"1s"``, ``"60s"``) to the value.
    ``generated`` holds the specs, ``n`` and ``seed`` when the stream was generated from a spec.
    """

    source: str
    n: int
    span_s: float
    mean_rate: float
    iat_cv: float
    scv_a: float
    frac_zero_iat: float
    idc: dict
    peak_to_mean: dict
    prompt: LengthStats
    output: LengthStats
    corr: float
    chunk: int
    E_g: float
    prefix_reuse_frac: float | None = None
    n_classes: int = 1
    generated: dict | None = None
    repairs: tuple = field(default_factory=tuple)


def _bin_key(b: float) -> str:
    return f"{b:g}s"


MAX_BINS = 10_000_000
"""The most count bins one bin width may make over a trace's span: their counts take 8 bytes
each (80 MB at the limit; a day at 10 ms bins is 8.6 million). A width of 1e-9 s over an hour
would ask for 3.6e12 bins (29 TB)."""


def check_bins(name: str, width: float, span: float, fix_flag: str) -> None:
    """Refuse ``width``-second bins that would make more than :data:`MAX_BINS` over ``span``."""
    if span > 0 and span / width > MAX_BINS:
        raise InputError(name, f"{width:g} s bins over the {span:.4g} s span make {span / width:.3g} bins, more "
                         f"than the {MAX_BINS:,} counted at once (8 bytes each)",
                         f"give {fix_flag} {span / MAX_BINS:.3g} or wider")


def arrival_stats(t, bins=(1, 60)) -> dict:
    """Arrival statistics of sorted times ``t`` (s): span, mean rate, IAT CV, IDC and peak/mean
    per bin width, exactly as ``compute_stats.py`` defines them."""
    t = np.asarray(t, dtype=np.float64)
    n = t.size
    out = {"n": int(n), "span_s": math.nan, "mean_rate": math.nan, "iat_cv": math.nan,
           "frac_zero_iat": math.nan, "idc": {}, "peak_to_mean": {}}
    if n >= 2:
        span = float(t[-1] - t[0])
        iat = np.diff(t)
        mean_iat = float(iat.mean())
        out.update(span_s=span, mean_rate=(n - 1) / span if span > 0 else math.nan,
                   iat_cv=float(iat.std()) / mean_iat if mean_iat > 0 else math.nan,
                   frac_zero_iat=float(np.mean(iat == 0)))
    elif n == 1:
        out["span_s"] = 0.0
    for b in bins:
        if n >= 2:
            check_bins("bins", b, float(t[-1] - t[0]), "--bins")
        key = _bin_key(b)
        idc = ptm = math.nan
        if n >= 1:
            idx = ((t - t[0]) // b).astype(np.int64)
            nb = int(idx.max())  # the last bin (holding the last arrival) is partial: dropped
            c = np.bincount(idx, minlength=nb + 1)[:nb]
            if c.size >= 2:
                m = c.mean()
                idc, ptm = float(c.var() / m), float(c.max() / m)
        out["idc"][key], out["peak_to_mean"][key] = idc, ptm
    return out


def length_stats(x) -> LengthStats:
    """Mean, p50, p90, p99 (numpy linear interpolation), min and max of lengths ``x``."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return LengthStats(*([math.nan] * 6))
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return LengthStats(float(x.mean()), float(p50), float(p90), float(p99), float(x.min()), float(x.max()))


def prefix_reuse(hash_ids) -> float:
    """Fraction of prefix blocks (``hash_ids``, one list per request, in arrival order) already
    used by an earlier request. Vectorised: a block is reused when the first request holding its
    id came before the request holding it."""
    lens = np.fromiter((len(h) for h in hash_ids), dtype=np.int64, count=len(hash_ids))
    total = int(lens.sum())
    if total == 0:
        return math.nan
    flat = np.concatenate([np.asarray(h, dtype=np.int64) for h in hash_ids])
    req = np.repeat(np.arange(lens.size), lens)
    _, first, inv = np.unique(flat, return_index=True, return_inverse=True)
    return float(np.count_nonzero(req > req[first][inv]) / total)


def _corr(s: np.ndarray, o: np.ndarray) -> float:
    s, o = s.astype(np.float64), o.astype(np.float64)
    ds, do = s - s.mean(), o - o.mean()
    den = math.sqrt(float(np.dot(ds, ds)) * float(np.dot(do, do)))
    return float(np.dot(ds, do)) / den if den > 0 else math.nan


def trace_stats(trace: Trace, *, chunk: int = 512, bins=(1, 60)) -> TraceStats:
    """Statistics of ``trace`` (see the module docstring for each definition).

    ``chunk``: the prefill chunk size for ``E_g``; ``bins``: bin widths (s) for IDC and peak/mean.
    """
    chunk = positive_int("chunk", chunk)
    bins = tuple(positive("bins", b) for b in bins)
    if not bins:
        raise InputError("bins", "give at least one bin width in seconds")
    n = len(trace)
    if n == 0:
        raise InputError("trace", "has no requests")
    from llmqueue.theory.kv import expected_g

    a = arrival_stats(trace.arrival_s, bins)
    s, o = np.asarray(trace.prompt_tokens), np.asarray(trace.output_tokens)
    reuse = prefix_reuse(trace.hash_ids) if trace.hash_ids is not None else None
    ncls = 1 if trace.class_name is None else int(np.unique(trace.class_name).size)
    return TraceStats(
        source=str(trace.source), n=n, span_s=a["span_s"], mean_rate=a["mean_rate"], iat_cv=a["iat_cv"],
        scv_a=a["iat_cv"] ** 2, frac_zero_iat=a["frac_zero_iat"], idc=a["idc"],
        peak_to_mean=a["peak_to_mean"], prompt=length_stats(s), output=length_stats(o), corr=_corr(s, o),
        chunk=chunk, E_g=expected_g(chunk=chunk, pairs=(s, o)), prefix_reuse_frac=reuse, n_classes=ncls,
        repairs=tuple(trace.repairs))


def spec_stats(arrival, *, prompt=None, output=None, joint=None, n: int = 10_000, seed: int = 0,
               chunk: int = 512, bins=(1, 60)) -> TraceStats:
    """Statistics of ``n`` requests generated (with ``seed``) from a workload spec: an arrival
    process with prompt/output length distributions or joint pairs (objects or spec strings, as
    :class:`~llmqueue.workload.generate.Workload` takes them)."""
    from llmqueue.workload.generate import Workload
    from llmqueue.workload.traces import trace_from_requests

    n = positive_int("num_requests", n)
    w = Workload(arrival, prompt=prompt, output=output, joint=joint)
    reqs = w.generate(seed, n=n)
    specs = w.specs()
    src = " ".join(f"{k}={v}" for k, v in specs.items() if k != "class")
    st = trace_stats(trace_from_requests(reqs, source=src), chunk=chunk, bins=bins)
    import dataclasses

    return dataclasses.replace(st, generated={**specs, "n": n, "seed": seed})
