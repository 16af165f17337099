"""Matplotlib figures of a run, a sweep and the seeds' figures, as PNG bytes.

Figures are built with :class:`matplotlib.figure.Figure` and the Agg canvas directly (no
``pyplot``, no global backend switch), so making a report never opens a window or changes a
caller's matplotlib state. Every function returns a ``Figure``; :func:`png_bytes` renders it.

A run's figures take an optional ``twin`` (another :class:`~llmqueue.report.sources.RunData`,
usually the simulated twin of a measured run): it is drawn dashed over the run.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from llmqueue.report import series

# Colours: measured run solid, twin dashed; one colour per quantity.
C_WAIT, C_RUN, C_KV, C_CAP = "#d62728", "#1f77b4", "#2ca02c", "#7f7f7f"
C_PARTS = {"queue": "#d62728", "prefill": "#ff7f0e", "ttft": "#e8590c", "decode": "#1f77b4"}
C_METRIC = {"ttft": "#d62728", "tpot": "#1f77b4", "e2el": "#2ca02c", "queue": "#9467bd"}
C_SLO, C_MU, C_KNEE = "#d62728", "#555555", "#000000"
CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
DPI = 110


def _figure(w: float = 8.0, h: float = 3.6, ncols: int = 1, sharey: bool = False):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, ncols, sharey=sharey)
    axes = list(np.atleast_1d(axes))
    for ax in axes:
        ax.grid(True, alpha=0.3, linewidth=0.6)
        ax.tick_params(labelsize=8)
    return fig, axes


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (no software/date metadata, so reruns give the same bytes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _time_axis(t):
    """Seconds, or minutes / hours for long runs: ``(scale, unit)``."""
    span = float(t[-1] - t[0]) if len(t) else 0.0
    if span > 3 * 3600:
        return 3600.0, "h"
    if span > 600:
        return 60.0, "min"
    return 1.0, "s"


def _warmup(ax, run, scale):
    w = (run.summary or {}).get("warmup_s")
    if isinstance(w, (int, float)) and w > 0:
        ax.axvspan(0, w / scale, color="#cccccc", alpha=0.35, linewidth=0, label="warm-up")


# -- one run ---------------------------------------------------------------------------------------

def queue_figure(run, twin=None):
    """Waiting and running requests over time, with the verdict's "bounded" / "growing" note."""
    fig, (ax,) = _figure()
    q = series.queue_series(run)
    word, detail = series.verdict_note(run.summary)
    if q is None:
        ax.text(0.5, 0.5, "no time series or step records in this run", ha="center", va="center",
                transform=ax.transAxes)
        return fig
    t, w, r, src = q
    scale, unit = _time_axis(t)
    _warmup(ax, run, scale)
    ax.step(t / scale, w, where="post", color=C_WAIT, lw=1.2, label=f"waiting ({run.label})")
    ax.step(t / scale, r, where="post", color=C_RUN, lw=1.2, label=f"running ({run.label})")
    if twin is not None and (tq := series.queue_series(twin)) is not None:
        tt, tw, tr, _ = tq
        ax.step(tt / scale, tw, where="post", color=C_WAIT, lw=1.2, ls="--", alpha=0.8,
                label=f"waiting ({twin.label})")
        ax.step(tt / scale, tr, where="post", color=C_RUN, lw=1.2, ls="--", alpha=0.8,
                label=f"running ({twin.label})")
    ax.set_xlabel(f"time ({unit})", fontsize=9)
    ax.set_ylabel("requests", fontsize=9)
    colour = {"bounded": "#2ca02c", "growing": "#d62728"}.get(word, "#555555")
    ax.set_title(f"Queue length over time: {word}", fontsize=10, color=colour, loc="left", fontweight="bold")
    ax.set_title(detail, fontsize=7.5, color=colour, loc="right")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7.5, loc="best", ncols=2)
    ax.annotate(f"source: {src}", (0, 0), xycoords="figure fraction", xytext=(4, 2), textcoords="offset points",
                fontsize=6.5, color="#777777")
    return fig


def kv_figure(run, twin=None):
    """KV tokens in use over time (per replica) against the capacity ``M``."""
    fig, (ax,) = _figure()
    kv = series.kv_series(run)
    if kv is None:
        ax.text(0.5, 0.5, "no time series or step records in this run", ha="center", va="center",
                transform=ax.transAxes)
        return fig
    t, k, src = kv
    scale, unit = _time_axis(t)
    _warmup(ax, run, scale)
    ax.step(t / scale, k, where="post", color=C_KV, lw=1.2, label=f"KV tokens in use ({run.label})")
    if twin is not None and (tk := series.kv_series(twin)) is not None:
        ax.step(tk[0] / scale, tk[1], where="post", color=C_KV, lw=1.2, ls="--", alpha=0.8,
                label=f"KV tokens in use ({twin.label})")
    cap = series.kv_capacity(run)
    if cap is not None:
        ax.axhline(cap, color=C_CAP, ls="--", lw=1.2, label=f"capacity M = {cap:,.0f} tokens")
        mean = (run.summary or {}).get("kv_utilization")
        if isinstance(mean, (int, float)):
            ax.text(0.99, 0.04, f"mean utilization {100 * mean:.1f}%", transform=ax.transAxes, ha="right",
                    fontsize=8, color="#333333")
        ax.set_ylim(0, cap * 1.12)
        ax.set_title("KV cache in use against capacity", fontsize=10, loc="left")
    else:
        ax.set_ylim(bottom=0)
        ax.set_title("KV cache in use (capacity not recorded in this run)", fontsize=10, loc="left")
    ax.set_xlabel(f"time ({unit})", fontsize=9)
    ax.set_ylabel("tokens per replica", fontsize=9)
    ax.yaxis.set_major_formatter(_thousands())
    ax.legend(fontsize=7.5, loc="center right")
    ax.annotate(f"source: {src}", (0, 0), xycoords="figure fraction", xytext=(4, 2), textcoords="offset points",
                fontsize=6.5, color="#777777")
    return fig


def _thousands():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:,.0f}")


def _ecdf(x):
    x = np.sort(np.asarray(x, dtype=np.float64))
    return x, np.arange(1, len(x) + 1) / len(x)


def cdf_figure(run, twin=None):
    """Empirical CDFs of TTFT, TPOT and E2EL (ms) of finished requests; p99 marked."""
    fig, axes = _figure(w=10.5, h=3.4, ncols=3)
    lat = series.latencies(run)
    tlat = series.latencies(twin) if twin is not None else None
    names = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}
    for ax, m in zip(axes, ("ttft", "tpot", "e2el")):
        x = lat[m] * 1000
        ax.set_title(names[m], fontsize=10, loc="left")
        if not len(x):
            ax.set_xlabel("ms", fontsize=9)
            ax.text(0.5, 0.5, "no finished requests", ha="center", va="center", transform=ax.transAxes)
            continue
        unit = 1000.0 if np.percentile(x, 99) >= 10_000 else 1.0  # seconds for long latencies
        ax.set_xlabel("s" if unit > 1 else "ms", fontsize=9)
        xs, ps = _ecdf(x)
        ax.step(xs / unit, ps, where="post", color=C_METRIC[m], lw=1.4, label=run.label)
        p99 = float(np.percentile(x, 99))
        ax.axvline(p99 / unit, color=C_METRIC[m], ls=":", lw=1)
        ax.text(p99 / unit, 0.16, f" p99 {_ms(p99)}", rotation=90, fontsize=7, color=C_METRIC[m], va="bottom",
                ha="right")
        allx = x
        if tlat is not None and len(tlat[m]):
            tx = tlat[m] * 1000
            txs, tps = _ecdf(tx)
            ax.step(txs / unit, tps, where="post", color="#333333", lw=1.2, ls="--", label=twin.label)
            allx = np.concatenate([x, tx])
        pos = allx[allx > 0]
        if len(pos) and pos.max() / max(pos.min(), 1e-9) > 100:
            ax.set_xscale("log")
            _plain_log_axis(ax.xaxis, pos.min() / unit, pos.max() / unit)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7.5, loc="lower right")
    axes[0].set_ylabel("fraction of requests", fontsize=9)
    return fig


def _ms(v: float) -> str:
    return f"{v / 1000:.3g} s" if v >= 1000 else f"{v:.3g} ms"


def _plain_log_axis(axis, lo: float, hi: float) -> None:
    """Log-axis ticks labelled as plain numbers (0.2, 5, 100, 2000): at 1, 2, 5 x 10^k over up to
    three decades, at powers of ten beyond."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = math.log10(max(hi, 1e-12) / max(lo, 1e-12))
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def decomposition_figure(run, twin=None):
    """Where a request's time goes: mean queue, prefill and decode (bars), and by arrival time."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.5, 3.6), dpi=DPI, layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 2])
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3, linewidth=0.6)
        ax.tick_params(labelsize=8)
    runs = [(run, series.decomposition(run))]
    if twin is not None:
        runs.append((twin, series.decomposition(twin)))
    if runs[0][1] is None:
        for ax in (ax1, ax2):
            ax.text(0.5, 0.5, "no finished requests in the window", ha="center", va="center", transform=ax.transAxes)
        return fig
    labels = []
    for i, (r, d) in enumerate(runs):
        if d is None:
            labels.append(f"{r.label}\n(none finished)")
            continue
        left = 0.0
        for part in d["parts"]:
            v = d["mean"][part]
            ax1.barh(i, v, left=left, height=0.6, color=C_PARTS[part], hatch="//" if i else None, edgecolor="white",
                     label=f"{part}: " + " / ".join(f"{x['mean'][part]:.3g} s" if part in x["mean"] else "-"
                                                    for _, x in runs if x is not None))
            left += v
        ax1.text(left, i, f" {left:.3g} s", va="center", fontsize=7.5)
        labels.append(f"{r.label}\n(n={d['n']:,})")
    ax1.set_yticks(range(len(labels)), labels, fontsize=8)
    ax1.set_xlabel("mean seconds per request (E2EL)", fontsize=9)
    ax1.set_title("Mean latency decomposition", fontsize=10, loc="left")
    h, lab = ax1.get_legend_handles_labels()
    keep = {}
    for hh, ll in zip(h, lab):
        keep.setdefault(ll.split(":")[0], (hh, ll))
    ax1.legend([v[0] for v in keep.values()], [v[1] for v in keep.values()], fontsize=7.5, loc="upper center",
               bbox_to_anchor=(0.5, -0.2), ncols=1, frameon=False)
    ax1.margins(x=0.25)
    ax1.set_ylim(len(labels) - 0.4, -0.6)
    d = runs[0][1]
    t = d["bin_t"]
    scale, unit = _time_axis(t if len(t) > 1 else np.array([0.0, 1.0]))
    ax2.stackplot(t / scale, [d["bin"][p] for p in d["parts"]], colors=[C_PARTS[p] for p in d["parts"]], alpha=0.85,
                  labels=[series.PARTS[p] for p in d["parts"]])
    ax2.set_xlabel(f"arrival time ({unit})", fontsize=9)
    ax2.set_ylabel("mean seconds", fontsize=9)
    ax2.set_title(f"By arrival time ({run.label}, finished requests)", fontsize=10, loc="left")
    ax2.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=3, frameon=False)
    ax2.set_ylim(bottom=0)
    return fig


# -- a sweep ---------------------------------------------------------------------------------------

def _label(key: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in key) or "sweep"


def _groups(sweep):
    """``[(label, [points sorted by rate])]``: one curve per setting of the non-rate parameters."""
    groups: dict = {}
    for p in sweep.points:
        groups.setdefault(p.group(), []).append(p)
    out = []
    for key, pts in groups.items():
        pts = sorted(pts, key=lambda p: (p.rate is None, p.rate if p.rate is not None else 0.0))
        out.append((_label(key), pts))
    return out


def _sweep_curves(sweep) -> dict:
    """``llmqueue sweep``'s curves by label (empty when the sweep wrote none)."""
    from llmqueue.report.sources import group_key

    return {_label(group_key(c.get("group") or {})): c for c in sweep.curves}


@dataclass
class Knee:
    """A curve's knee: where it lies, on which metric, and by which rule."""

    rate: float | None
    throughput: float | None
    metric: str  # "ttft", "tpot" or "e2el" (its p99)
    latency: float | None
    rule: str
    point: object = None  # the sweep point, when the knee is one (Kneedle); None when interpolated
    bracket: list | None = None


KNEEDLE_RULE = ("knee (Kneedle): the point furthest below the chord of p99 TTFT against offered rate, both axes "
                "scaled to [0, 1]: where latency stops staying flat and starts to climb")


def sweep_knees(sweep) -> dict:
    """Knee of each curve: ``{label: Knee}``.

    The sweep's own knee when ``sweep.json`` has curves (``llmqueue sweep``: the rate at which p99
    TTFT first reaches twice its low-load value, interpolated), else Kneedle
    (:func:`llmqueue.report.series.knee_index`) on p99 TTFT (else E2EL, TPOT) against offered rate.
    """
    import re

    curves = _sweep_curves(sweep)
    rule = str(sweep.meta.get("knee_rule") or "the sweep's knee")
    knees = {}
    for label, pts in _groups(sweep):
        c = curves.get(label)
        if c is not None and "knee" in c:
            k = c.get("knee")
            if isinstance(k, dict) and k.get("rate") is not None:
                m = re.fullmatch(r"p99_(ttft|tpot|e2el)_ms", str(c.get("metric", "")))
                knees[label] = Knee(rate=k.get("rate"), throughput=k.get("throughput"),
                                    metric=m.group(1) if m else "", latency=k.get("latency") if m else None,
                                    rule=rule, bracket=k.get("bracket"))
            continue
        for m in ("ttft", "e2el", "tpot"):
            x = [p.rate if p.rate is not None else p.throughput for p in pts]
            y = [p.p99[m][0] for p in pts]
            if sum(v is not None for v in y) >= 3:
                i = series.knee_index([math.nan if v is None else v for v in x],
                                      [math.nan if v is None else v for v in y])
                if i is not None:
                    p = pts[i]
                    knees[label] = Knee(rate=p.rate, throughput=p.throughput, metric=m, latency=p.p99[m][0],
                                        rule=KNEEDLE_RULE if m == "ttft" else KNEEDLE_RULE.replace("TTFT", m.upper()),
                                        point=p)
                break
    return knees


def _slo_for(sweep, metric: str, pts) -> float | None:
    for slo in [sweep.slo] + [p.slo for p in pts]:
        for key in (f"p99_{metric}_ms", f"{metric}_ms"):
            if slo.get(key) is not None:
                return float(slo[key])
    return None


def _mu_values(pts):
    return sorted({round(p.mu, 6) for p in pts if p.mu is not None})


def meets_slo(sweep, p) -> bool | None:
    """Whether a point meets its SLO: the sweep's own judgement (``slo_met``) when it gives one;
    else its p99 latencies within the targets (``p99_X_ms`` or ``X_ms``, compared with the p99)
    and a queue that does not grow. ``None`` when no target is given."""
    if p.slo_met is not None:
        return p.slo_met
    targets = {**sweep.slo, **p.slo}
    checks = []
    for m in ("ttft", "tpot", "e2el"):
        for key in (f"p99_{m}_ms", f"{m}_ms"):
            if key in targets:
                v = p.p99[m][0]
                checks.append(v is not None and v <= targets[key])
                break
    if not checks:
        return None
    return all(checks) and p.stable is not False


def sweep_best_within_slo(sweep) -> dict:
    """Per curve, the point of highest throughput that meets the SLO: ``{label: point}``.

    With ``llmqueue sweep``'s curves: the point at its ``max_rate_meeting_slo`` (the highest rate
    such that it and every lower rate meet the SLO).
    """
    curves = _sweep_curves(sweep)
    best = {}
    for label, pts in _groups(sweep):
        c = curves.get(label)
        if c is not None and "max_rate_meeting_slo" in c:
            r = c.get("max_rate_meeting_slo")
            hit = [p for p in pts if r is not None and p.rate is not None and math.isclose(p.rate, r)]
            if hit:
                best[label] = hit[0]
            continue
        ok = [p for p in pts if meets_slo(sweep, p) and p.throughput is not None]
        if ok:
            best[label] = max(ok, key=lambda p: p.throughput)
    return best


def _legend_below(fig, handles, labels, ncols=4):
    seen, h2, l2 = set(), [], []
    for h, lab in zip(handles, labels):
        if lab and not lab.startswith("_") and lab not in seen:
            seen.add(lab)
            h2.append(h)
            l2.append(lab)
    if h2:
        fig.legend(h2, l2, loc="outside lower center", ncols=min(ncols, len(h2)), fontsize=7.5, frameon=False)


def sweep_latency_figure(sweep):
    """p99 TTFT, TPOT and E2EL against throughput: CIs, SLO lines, theory mu, knee, best point within SLO."""
    from matplotlib.lines import Line2D

    fig, axes = _figure(w=10.5, h=4.0, ncols=3)
    groups = _groups(sweep)
    knees = sweep_knees(sweep)
    best = sweep_best_within_slo(sweep)
    names = {"ttft": "p99 TTFT", "tpot": "p99 TPOT", "e2el": "p99 E2EL"}
    handles, labels = [], []
    for ax, m in zip(axes, ("ttft", "tpot", "e2el")):
        ax.set_title(names[m], fontsize=10, loc="left")
        ax.set_xlabel("throughput (req/s)", fontsize=9)
        ax.set_ylabel("ms", fontsize=9)
        ys_all = []
        for gi, (label, pts) in enumerate(groups):
            c = CYCLE[gi % len(CYCLE)]
            xs = np.array([np.nan if p.throughput is None else p.throughput for p in pts])
            ys = np.array([np.nan if p.p99[m][0] is None else p.p99[m][0] for p in pts])
            ok = np.isfinite(xs) & np.isfinite(ys)
            if not ok.any():
                continue
            ys_all.extend(ys[ok])
            ax.plot(xs[ok], ys[ok], "o-", color=c, lw=1.2, ms=0, label=label)
            for p, x, y in zip(pts, xs, ys):
                if not (np.isfinite(x) and np.isfinite(y)):
                    continue
                ci = p.p99[m][1]
                if ci:
                    ax.errorbar([x], [y], yerr=[[max(y - ci[0], 0)], [max(ci[1] - y, 0)]], color=c, lw=0.9,
                                capsize=2)
                ax.plot([x], [y], "o", ms=5, mfc="white" if p.stable is False else c, mec=c, mew=1.2)
            for mu in _mu_values(pts):
                ax.axvline(mu, color=c if len(groups) > 1 else C_MU, ls="-.", lw=1,
                           label=f"theory mu = {mu:.3g} req/s" + (f" ({label})" if len(groups) > 1 else ""))
            k = knees.get(label)
            if k is not None and k.throughput is not None:
                y = k.point.p99[m][0] if k.point is not None else (k.latency if k.metric == m else None)
                if y is not None:
                    ax.plot([k.throughput], [y], marker="*", ms=13, color=C_KNEE, ls="none", label="knee", zorder=5)
            b = best.get(label)
            if b is not None and b.throughput is not None and b.p99[m][0] is not None:
                ax.plot([b.throughput], [b.p99[m][0]], marker="D", ms=7, color=C_KNEE, ls="none", mfc="none",
                        mew=1.4, label="best within SLO", zorder=5)
        slo = _slo_for(sweep, m, sweep.points)
        if slo is not None:
            ax.axhline(slo, color=C_SLO, ls="--", lw=1.2)
            ax.text(0.02, slo, f"SLO {slo:g} ms", transform=ax.get_yaxis_transform(), color=C_SLO, fontsize=7,
                    va="bottom")
        pos = [v for v in ys_all if v > 0]
        if pos and max(pos) / min(pos) > 100:
            ax.set_yscale("log")
            _plain_log_axis(ax.yaxis, min(pos), max(pos))
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if any(p.stable is False for p in sweep.points):
        handles.append(Line2D([], [], ls="none", marker="o", mfc="white", mec="#555555"))
        labels.append("unstable (queue grew)")
    handles.append(Line2D([], [], color=C_SLO, ls="--"))
    labels.append("SLO" if any(_slo_for(sweep, m, sweep.points) is not None for m in names) else "_")
    _legend_below(fig, handles, labels)
    return fig


def sweep_throughput_figure(sweep):
    """Throughput against offered load, with the y = x line, the theory's mu and the knee."""
    fig, (ax,) = _figure(w=7.0, h=4.0)
    groups = _groups(sweep)
    knees = sweep_knees(sweep)
    best = sweep_best_within_slo(sweep)
    hi = 0.0
    for gi, (label, pts) in enumerate(groups):
        c = CYCLE[gi % len(CYCLE)]
        xs = np.array([np.nan if p.rate is None else p.rate for p in pts])
        ys = np.array([np.nan if p.throughput is None else p.throughput for p in pts])
        ok = np.isfinite(xs) & np.isfinite(ys)
        if not ok.any():
            continue
        hi = max(hi, float(np.nanmax(xs[ok])))
        ax.plot(xs[ok], ys[ok], "-", color=c, lw=1.3, label=label if len(groups) > 1 else "throughput")
        for p, x, y in zip(pts, xs, ys):
            if np.isfinite(x) and np.isfinite(y):
                ax.plot([x], [y], "o", ms=5, mfc="white" if p.stable is False else c, mec=c, mew=1.2)
        for mu in _mu_values(pts):
            ax.axhline(mu, color=c if len(groups) > 1 else C_MU, ls="-.", lw=1, label=f"theory mu = {mu:.3g} req/s")
        for mark, pt, ms, name in (("*", knees.get(label), 13, "knee"), ("D", best.get(label), 7, "best within SLO")):
            if pt is not None and pt.rate is not None and pt.throughput is not None:
                ax.plot([pt.rate], [pt.throughput], marker=mark, ms=ms, color=C_KNEE, ls="none",
                        mfc="none" if mark == "D" else C_KNEE, mew=1.4, label=name, zorder=5)
    if hi > 0:
        ax.plot([0, hi], [0, hi], color="#aaaaaa", lw=1, ls=":", label="throughput = offered load")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("offered load (req/s)", fontsize=9)
    ax.set_ylabel("throughput (req/s)", fontsize=9)
    ax.set_title("Throughput against offered load", fontsize=10, loc="left")
    h, lab = ax.get_legend_handles_labels()
    keep = {}
    for hh, ll in zip(h, lab):
        keep.setdefault(ll, hh)
    ax.legend(list(keep.values()), list(keep), fontsize=7.5, loc="upper left")
    fig.text(0.995, 0.005, "hollow: unstable point", ha="right", va="bottom", fontsize=6.5, color="#777777")
    return fig


# -- the seeds' figures ----------------------------------------------------------------------------

def seed004_queue_figure(runs):
    """Nie et al.'s Figure 2: waiting queue over time, one line per arrival rate.

    ``runs``: ``[(lam, t_s, num_waiting, verdict_word)]``. Left: linear axis as in the paper;
    right: the same on a symmetric-log axis, so the bounded queues of the low rates show.
    """
    fig, axes = _figure(w=10.5, h=4.0, ncols=2)
    for ax, log in zip(axes, (False, True)):
        for i, (lam, t, w, word) in enumerate(runs):
            scale, unit = _time_axis(t)
            ax.plot(t / scale, w, color=CYCLE[i % len(CYCLE)], lw=1.2,
                    label=f"lam = {lam:g} req/s ({word})")
        ax.set_xlabel(f"time ({unit})", fontsize=9)
        ax.set_ylabel("waiting requests", fontsize=9)
        if log:
            ax.set_yscale("symlog", linthresh=10)
            ax.set_title("Same, symmetric-log axis", fontsize=10, loc="left")
        else:
            ax.set_title("Waiting queue length, 1:1 P/D setting", fontsize=10, loc="left")
            ax.yaxis.set_major_formatter(_thousands())
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7.5, loc="upper left")
    return fig


def seed002_tradeoff_figure(table, *, slo_ms: float | None = None, knee_B: int | None = None,
                            best_B: int | None = None):
    """Inference Foundations' Figure 2: throughput against latency over batch size B.

    ``table``: a :class:`llmqueue.theory.batch.BatchTable`. x: capacity ``mu_eff(B) = B / T_svc(B)``
    (the most the server can carry at batch size B); y: mean response time ``E[T]`` and the P99
    estimate ``E[T] + 2.33 sigma_T``; unstable sizes (``mu_eff <= lam``) are left out and named.
    """
    fig, (ax,) = _figure(w=8.0, h=4.3)
    rows = [r for r in table.rows if r.stable and math.isfinite(r.W)]
    bad = [r.B for r in table.rows if not (r.stable and math.isfinite(r.W))]
    x = np.array([r.mu_eff for r in rows])
    w = np.array([r.W * 1000 for r in rows])
    p = np.array([r.P99_normal * 1000 for r in rows])
    ax.plot(x, w, "o-", color=CYCLE[0], lw=1.4, ms=4, label="mean response E[T]")
    ax.plot(x, p, "s--", color=CYCLE[1], lw=1.2, ms=4, label="P99 = E[T] + 2.33 sigma_T")
    for r, xi, yi in zip(rows, x, w):
        ax.annotate(f"B={r.B}", (xi, yi), xytext=(3, -10), textcoords="offset points", fontsize=7, color="#333333")
    ax.axvline(table.lam, color=C_MU, ls=":", lw=1, label=f"arrival rate lam = {table.lam:g} req/s")
    ax.axvline(1 / table.t_req if table.t_req > 0 else np.nan, color=C_MU, ls="-.", lw=1,
               label=f"ceiling 1/t_req = {1 / table.t_req:g} req/s" if table.t_req > 0 else None)
    if slo_ms is not None:
        ax.axhline(slo_ms, color=C_SLO, ls="--", lw=1.2, label=f"SLO {slo_ms:g} ms (P99)")
    if knee_B is not None:
        r = next((r for r in rows if r.B == knee_B), None)
        if r is not None:
            ax.plot([r.mu_eff], [r.W * 1000], marker="*", ms=14, color=C_KNEE, ls="none",
                    label=f"knee: B = {knee_B}", zorder=5)
    if best_B is not None:
        r = next((r for r in rows if r.B == best_B), None)
        if r is not None:
            ax.plot([r.mu_eff], [r.P99_normal * 1000], marker="D", ms=8, mfc="none", mec=C_KNEE, mew=1.5, ls="none",
                    label=f"largest B with P99 within SLO: B = {best_B}", zorder=5)
    ax.set_xlabel("throughput capacity mu_eff(B) = B / T_svc(B)  (req/s)", fontsize=9)
    ax.set_ylabel("latency (ms)", fontsize=9)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else ""))
    ax.set_title(f"Throughput against latency over batch size (lam = {table.lam:g}, T_fixed = "
                 f"{1000 * table.T_fixed:g} ms, t_req = {1000 * table.t_req:g} ms)", fontsize=9.5, loc="left")
    if bad:
        ax.text(0.99, 0.03, f"unstable, not drawn: B = {', '.join(map(str, bad))}", transform=ax.transAxes,
                ha="right", fontsize=7.5, color="#777777")
    ax.legend(fontsize=7.5, loc="upper left")
    return fig
