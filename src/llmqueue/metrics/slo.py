"""SLOs: vLLM's request goodput and per-class SLO attainment with confidence intervals.

Targets are a dict in milliseconds, of two kinds:

- **per-request thresholds** ``{"ttft_ms": 2000, "tpot_ms": 100, "e2el_ms": 30000}`` (vLLM's
  ``--goodput ttft:2000 tpot:100``; the bare names ``ttft``/``tpot``/``e2el`` are accepted, and
  ``queue_ms``). A request is *good* when it finished ``ok`` and meets every threshold.
  As in vLLM, a request with one output token has ``tpot = 0`` for this test, and a NaN time
  (e.g. no first token) fails.
- **aggregate targets** ``{"p99_ttft_ms": 2000, "mean_tpot_ms": 50, "median_e2el_ms": ...}``
  (also ``p99.9_...``, and ``itl``): a statistic of the ``ok`` requests, estimated with a
  confidence interval; ``verdict`` is ``met`` when the whole interval is at or below the
  target, ``violated`` when it is all above, ``inconclusive`` when it straddles. Without an
  interval (too little data) the verdict follows the point estimate and ``ci`` is None.

Per-class targets: a dict of class name -> targets dict (``"*"`` applies to classes not named);
classes without targets have none to miss.

Goodput (vLLM ``request_goodput``): good requests that finished in the window, per second of
window. Attainment: good requests / requests that arrived in the window and ended (all but
those in flight when the run stopped, ``finish_s`` NaN), so rejections, timeouts,
cancellations and errors count as misses; its
interval is a batch-means interval of the good/miss indicator in arrival order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from llmqueue._validate import nonnegative
from llmqueue.errors import InputError
from llmqueue.metrics._common import finite_or_none, window
from llmqueue.metrics.ci import (
    DEFAULT_LEVEL,
    batch_means_ci,
    batch_quantile_ci,
    weighted_mean_std,
    weighted_percentile,
)

PER_REQUEST = ("ttft", "tpot", "e2el", "queue")
AGGREGATE_METRICS = ("ttft", "tpot", "e2el", "queue", "itl")
_AGG = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)_([a-z0-9]+)_ms$")


def parse_targets(targets: Mapping) -> tuple[dict[str, float], dict[str, tuple[str, str, float]]]:
    """Split a targets dict into per-request thresholds ``{metric: ms}`` and aggregate targets
    ``{key: (statistic, metric, ms)}``, validating names and values."""
    if not isinstance(targets, Mapping):
        raise InputError("slos", f"expected a dict of targets in ms (got {type(targets).__name__})")
    per: dict[str, float] = {}
    agg: dict[str, tuple[str, str, float]] = {}
    for key, val in targets.items():
        v = nonnegative(f"slos.{key}", val)
        name = str(key)
        bare = name[:-3] if name.endswith("_ms") else name
        if bare in PER_REQUEST:
            per[bare] = v
            continue
        m = _AGG.match(name if name.endswith("_ms") else name + "_ms")
        if m and m.group(2) in AGGREGATE_METRICS:
            stat = m.group(1)
            if stat.startswith("p") and not 0 < float(stat[1:]) < 100:
                raise InputError(f"slos.{key}", "percentile must be in (0, 100)")
            agg[f"{stat}_{m.group(2)}_ms"] = (stat, m.group(2), v)
            continue
        raise InputError(f"slos.{key}", "unknown SLO",
                         "use ttft_ms/tpot_ms/e2el_ms/queue_ms (per request) or e.g. p99_ttft_ms, "
                         "mean_tpot_ms, median_e2el_ms (aggregate)")
    return per, agg


def _is_per_class(slos: Mapping) -> bool:
    return bool(slos) and all(isinstance(v, Mapping) for v in slos.values())


def _class_targets(slos: Mapping, classes) -> dict[str, tuple[dict, dict]]:
    if _is_per_class(slos):
        parsed = {c: parse_targets(t) for c, t in slos.items()}
        default = parsed.get("*", ({}, {}))
        return {c: parsed.get(c, default) for c in classes}
    both = parse_targets(slos)
    return {c: both for c in classes}


def per_request_metrics_s(requests) -> dict[str, np.ndarray]:
    """Per-request values used by per-request SLOs, in seconds (vLLM's goodput conventions:
    ``tpot`` is 0 for requests with at most one output token)."""
    d = requests.derived()
    tpot = np.where(requests["output_tokens"] > 1, d["tpot_s"], 0.0)
    return {"ttft": d["ttft_s"], "tpot": tpot, "e2el": d["e2el_s"], "queue": d["queue_s"]}


def good_mask(requests, slos: Mapping) -> np.ndarray:
    """True for ``ok`` requests meeting every per-request threshold of their class."""
    vals = per_request_metrics_s(requests)
    cls = requests["class"]
    good = requests["status"] == "ok"
    for c, (per, _agg) in _class_targets(slos, np.unique(cls)).items():
        sel = cls == c
        for metric, ms in per.items():
            with np.errstate(invalid="ignore"):
                good[sel] &= vals[metric][sel] <= ms / 1000.0  # NaN compares False
    return good


def has_per_request(slos: Mapping) -> bool:
    """Whether any per-request threshold is given (vLLM computes goodput only then)."""
    if _is_per_class(slos):
        return any(parse_targets(t)[0] for t in slos.values())
    return bool(parse_targets(slos)[0])


def goodput_targets(slos: Mapping) -> Mapping:
    """The per-request thresholds that decide which requests are *good*: the per-request ones
    when any is given (vLLM's ``--goodput``); else each aggregate target's threshold applied to
    every request (``p99_ttft_ms: 2000`` counts a request with TTFT <= 2 s as good, as
    DistServe's goodput does), per class; ITL targets have no per-request value and are left out."""
    if has_per_request(slos):
        return slos

    def per(targets: Mapping) -> dict:
        out = {}
        for stat, metric, ms in parse_targets(targets)[1].values():
            if metric in PER_REQUEST:
                key = f"{metric}_ms"
                out[key] = min(out.get(key, ms), ms)
        return out

    if _is_per_class(slos):
        return {c: per(t) for c, t in slos.items()}
    return per(slos)


def request_goodput(requests, slos: Mapping, *, warmup_s: float = 0.0,
                    horizon_s: float | None = None) -> float | None:
    """Goodput: good requests (:func:`goodput_targets`) finishing in the window, per second;
    vLLM's ``request_goodput`` when per-request thresholds are given.

    ``None`` when no target applies to a single request (only ITL targets).
    """
    targets = goodput_targets(slos)
    if not has_per_request(targets):
        return None
    t0, t1 = window(requests, warmup_s, horizon_s)
    fin = requests["finish_s"]
    with np.errstate(invalid="ignore"):
        in_win = (fin >= t0) & (fin <= t1)
    return float(np.sum(good_mask(requests, targets) & in_win)) / (t1 - t0)


def _aggregate(stat: str, x: np.ndarray, w: np.ndarray | None, level: float):
    """Point estimate and interval (seconds) of a statistic of time-ordered samples."""
    if len(x) == 0:
        return None, None
    if stat == "mean":
        return weighted_mean_std(x, w)[0], batch_means_ci(x, weights=w, level=level, positive=True)
    q = 50.0 if stat == "median" else float(stat[1:])
    est = float(np.percentile(x, q)) if w is None else float(weighted_percentile(x, w, q))
    return est, batch_quantile_ci(x, q / 100.0, weights=w, level=level)


def _verdict(value, ci, target_s):
    if value is None:
        return None
    if ci is not None:
        if ci.hi <= target_s:
            return "met"
        if ci.lo > target_s:
            return "violated"
        return "inconclusive"
    return "met" if value <= target_s else "violated"


class _Data:
    """Per-request values and masks shared by the attainment computations."""

    def __init__(self, requests, slos, t0, t1, itl):
        self.requests = requests
        self.vals = per_request_metrics_s(requests)
        self.good = good_mask(requests, goodput_targets(slos))  # what goodput counts
        self.a = requests["arrival_s"]
        self.arrived = (self.a >= t0) & (self.a < t1)
        self.ok = requests["status"] == "ok"
        self.itl = itl

    def samples(self, metric: str, sel):
        """Time-ordered samples (s) and weights of a metric over ok arrivals in ``sel``."""
        if metric == "itl":
            if self.itl is None or sel is not None:
                return np.zeros(0), None
            return np.asarray(self.itl[0], dtype=np.float64), self.itl[1]
        m = self.arrived & self.ok
        if sel is not None:
            m &= sel
        if metric == "tpot":
            m &= self.requests["output_tokens"] > 1
        order = np.argsort(self.a[m], kind="stable")
        v = self.vals[metric][m][order]
        return v[np.isfinite(v)], None

    def attain(self, sel, per: dict, agg: dict, level: float, with_attainment: bool) -> dict:
        base = self.arrived if sel is None else self.arrived & sel
        ended = base & np.isfinite(self.requests["finish_s"])
        idx = np.flatnonzero(ended)
        idx = idx[np.argsort(self.a[idx], kind="stable")]
        ind = self.good[idx].astype(np.float64)
        out: dict = {"requests": int(len(idx)), "in_flight": int((base & ~ended).sum()),
                     "good": int(ind.sum())}
        if with_attainment:
            out["attainment"] = float(ind.mean()) if len(ind) else None
            ci = batch_means_ci(ind, level=level) if len(ind) else None
            out["attainment_ci"] = ci.as_list() if ci else None
        for metric, ms in per.items():
            with np.errstate(invalid="ignore"):
                hit = self.ok[idx] & (self.vals[metric][idx] <= ms / 1000.0)
            out[f"{metric}_ms"] = {"target": ms,
                                   "attainment": float(hit.mean()) if len(hit) else None}
        for key, (stat, metric, ms) in agg.items():
            x, w = self.samples(metric, sel)
            value, ci = _aggregate(stat, x, w, level)
            out[key] = {"target": ms,
                        "value": None if value is None else finite_or_none(1000 * value),
                        "ci": ci.scaled(1000).as_list() if ci else None,
                        "verdict": _verdict(value, ci, ms / 1000.0)}
        return out


def slo_attainment(requests, slos: Mapping, *, warmup_s: float = 0.0,
                   horizon_s: float | None = None, level: float = DEFAULT_LEVEL,
                   itl=None) -> dict:
    """SLO attainment overall and per class, with confidence intervals.

    Returns ``{"targets": ..., "overall": {...}, "by_class": {class: {...}}}``. Each entry holds
    ``requests`` (arrivals in the window that ended), ``in_flight``, ``good`` (within every
    threshold of :func:`goodput_targets`: what goodput counts); with per-request
    thresholds, ``attainment`` (fraction good) and ``attainment_ci`` and, per threshold,
    ``{"target", "attainment"}``; per aggregate target (``p99_ttft_ms``...) ``{"target",
    "value", "ci", "verdict"}``, all in ms. ``overall`` judges each request by its own class's
    thresholds and evaluates the aggregate targets of a global target dict. ``itl``: optional
    ``(samples_s, weights)`` for ITL targets (evaluated overall only: step records do not say
    which class a token belongs to).
    """
    t0, t1 = window(requests, warmup_s, horizon_s)
    cls = requests["class"]
    classes = [str(c) for c in np.unique(cls)]
    targets = _class_targets(slos, classes)
    data = _Data(requests, slos, t0, t1, itl)
    any_per = has_per_request(slos)
    per_class = _is_per_class(slos)
    overall_per, overall_agg = ({}, {}) if per_class else parse_targets(slos)
    result = {
        "targets": {c: dict(t) for c, t in slos.items()} if per_class else dict(slos),
        "overall": data.attain(None, overall_per, overall_agg, level, any_per),
        "by_class": {},
    }
    for c in classes:
        per, agg = targets[c]
        result["by_class"][c] = data.attain(cls == c, per, agg, level, bool(per))
    return result


def slo_verdict_rows(slo: dict | None) -> list:
    """``(label, text)`` rows of the per-class SLO verdicts of a summary's ``slo`` (each aggregate
    target: value, target, interval and met / violated / inconclusive; the good share)."""
    rows = []
    for cls, d in ((slo or {}).get("by_class") or {}).items():
        for key, v in d.items():
            if not isinstance(v, dict) or "target" not in v:
                continue
            val = "-" if v.get("value") is None else f"{v['value']:,.1f}"
            ci = v.get("ci")
            ci_txt = f" [{ci[0]:,.1f}, {ci[1]:,.1f}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else ""
            t = v["target"]
            tt = f"{t:,.0f}" if t >= 100 else f"{t:g}"
            rows.append((f"{cls}: {key}", f"{val}{ci_txt} vs {tt}: {v.get('verdict') or 'no data'}"))
        if d.get("requests"):
            rows.append((f"{cls}: requests within every target", f"{d.get('good', 0)} of {d['requests']}"))
    return rows
