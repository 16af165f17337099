"""The interactive figures of a sweep report, each with a caption that says what it draws.

:func:`sweep_panels` returns the panels that have data and, for each one left out, why:

- ``sweep_latency``: p99 latencies against throughput, with CI bars, the SLO, the theory's mu,
  the knee and the best point within the SLO, each only when the sweep gives it (PNG too).
- ``sweep_throughput``: throughput against offered load (PNG too).
- ``sweep_percentiles``: p50 / p90 / p99 latencies against offered load.
- ``sweep_queue``: queue growth, busy fraction and KV utilization against offered load.
- ``sweep_queue_time``: waiting requests over time, one line per point (from the points' run
  directories, ``llmqueue sweep --keep-runs``).
- ``sweep_cdf``: latency CDFs, one line per point (the same run directories).
"""

from __future__ import annotations

import numpy as np

from llmqueue.errors import InputError
from llmqueue.report import figures as F
from llmqueue.report import interactive as I
from llmqueue.report import series, sources

METRICS = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}
KEEP_RUNS = "the sweep kept no run directories (run llmqueue sweep with --keep-runs)"


def sweep_panels(sweep, *, step=None) -> tuple[list, list]:
    """``(panels, left_out)`` of a :class:`~llmqueue.report.sources.SweepData`; ``step``: called after
    reading the points' runs and after each panel (``STEPS`` calls, for a progress bar)."""
    step = step or (lambda: None)
    runs = point_runs(sweep)
    step()
    panels, left_out = [], []
    for make in (latency_panel, throughput_panel, percentiles_panel, queue_load_panel):
        p = make(sweep)
        (left_out if isinstance(p, str) else panels).append(p)
        step()
    for make in (queue_time_panel, cdf_panel):
        p = make(sweep, runs)
        (left_out if isinstance(p, str) else panels).append(p)
        step()
    return panels, left_out


STEPS = 7  # the calls sweep_panels makes to ``step``


def point_runs(sweep) -> list:
    """``[(point, RunData)]`` for the points whose run directory is there and readable."""
    out = []
    for p in sweep.points:
        d = sources.point_run_dir(sweep, p)
        if d is None:
            continue
        try:
            out.append((p, sources.load_run(d, label=point_label(sweep, p))))
        except InputError:
            continue
    return out


def point_label(sweep, p) -> str:
    params = {k: v for k, v in p.params.items() if k not in sources.RATE_KEYS}
    parts = [f"{k}={v}" for k, v in params.items()]
    if p.rate is not None:
        parts.append(f"rate {p.rate:g}")
    return ", ".join(parts) or f"point {sweep.points.index(p)}"


def _colours(n: int) -> list:
    if n <= len(F.CYCLE):
        return F.CYCLE[:n]
    from plotly.colors import sample_colorscale

    return sample_colorscale("Viridis", [i / max(n - 1, 1) for i in range(n)])


def _group_colour(gi: int, groups) -> str:
    return F.CYCLE[gi % len(F.CYCLE)]


def _curves_text(groups) -> str:
    return "one line per setting of " + ", ".join(k for k, _ in groups[0][1][0].group()) if len(groups) > 1 else ""


def _join(items: list) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# -- from sweep.json -------------------------------------------------------------------------------

def latency_panel(sweep):
    """p99 TTFT, TPOT and E2EL against completed throughput."""
    import plotly.graph_objects as go

    groups = F._groups(sweep)
    drawn_metrics = [m for m in METRICS if any(p.p99[m][0] is not None and p.throughput is not None
                                               for p in sweep.points)]
    if not drawn_metrics:
        return "latency against throughput: no point has a p99 latency and a throughput"
    knees, best = F.sweep_knees(sweep), F.sweep_best_within_slo(sweep)
    fig = I.figure(1, len(drawn_metrics), titles=[f"p99 {METRICS[m]}" for m in drawn_metrics], height=420)
    drew = {"ci": False, "unstable": False, "slo": [], "mu": False, "knee": False, "best": False}
    values = []
    for col, m in enumerate(drawn_metrics, start=1):
        for gi, (label, pts) in enumerate(groups):
            c = _group_colour(gi, groups)
            pts = [p for p in pts if p.throughput is not None and p.p99[m][0] is not None]
            if not pts:
                continue
            x = [p.throughput for p in pts]
            y = [p.p99[m][0] for p in pts]
            values += y
            cis = [p.p99[m][1] for p in pts]
            err = None
            if any(cis):
                drew["ci"] = True
                err = dict(type="data", symmetric=False, color=c, thickness=1.2, width=3,
                           array=[max(ci[1] - v, 0) if ci else 0 for ci, v in zip(cis, y)],
                           arrayminus=[max(v - ci[0], 0) if ci else 0 for ci, v in zip(cis, y)])
            unstable = [p.stable is False for p in pts]
            drew["unstable"] |= any(unstable)
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines+markers", name=label if len(groups) > 1 else "p99 latency", legendgroup=label,
                showlegend=col == 1, line=dict(color=c, width=1.5), error_y=err,
                marker=dict(size=8, color=["white" if u else c for u in unstable], line=dict(color=c, width=1.5)),
                customdata=[[p.rate, p.verdict or "-"] for p in pts],
                hovertemplate=(f"p99 {METRICS[m]} %{{y:.4g}} ms at %{{x:.4g}} req/s<br>offered %{{customdata[0]}} "
                               f"req/s, %{{customdata[1]}}<extra>{label}</extra>")), row=1, col=col)
            for mu in F._mu_values(pts):
                drew["mu"] = True
                fig.add_vline(x=mu, line=dict(color=c if len(groups) > 1 else F.C_MU, dash="dashdot", width=1.2),
                              row=1, col=col)
            k = knees.get(label)
            if k is not None and k.throughput is not None:
                ky = k.point.p99[m][0] if k.point is not None else (k.latency if k.metric == m else None)
                if ky is not None:
                    drew["knee"] = True
                    fig.add_trace(go.Scatter(x=[k.throughput], y=[ky], mode="markers", name="knee",
                                             legendgroup="knee", showlegend=not any(t.name == "knee" for t in fig.data),
                                             marker=dict(symbol="star", size=15, color=F.C_KNEE),
                                             hovertemplate=f"knee: rate %{{customdata:.4g}} req/s<extra>{label}</extra>",
                                             customdata=[k.rate]), row=1, col=col)
            b = best.get(label)
            if b is not None and b.throughput is not None and b.p99[m][0] is not None:
                drew["best"] = True
                fig.add_trace(go.Scatter(x=[b.throughput], y=[b.p99[m][0]], mode="markers", name="best within SLO",
                                         legendgroup="best",
                                         showlegend=not any(t.name == "best within SLO" for t in fig.data),
                                         marker=dict(symbol="diamond-open", size=12, color=F.C_KNEE,
                                                     line=dict(width=2)),
                                         hovertemplate=f"best within SLO: rate {b.rate:g} req/s<extra>{label}</extra>"),
                              row=1, col=col)
        slo = F._slo_for(sweep, m, sweep.points)
        if slo is not None:
            drew["slo"].append(METRICS[m])
            fig.add_hline(y=slo, line=dict(color=F.C_SLO, dash="dash", width=1.3), row=1, col=col)
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="SLO", legendgroup="slo",
                                     showlegend=not any(t.name == "SLO" for t in fig.data),
                                     line=dict(color=F.C_SLO, dash="dash")), row=1, col=col)
        fig.update_xaxes(title_text="throughput (req/s)", row=1, col=col)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    I.log_buttons(fig, "y", log=I.wide(values))
    text = [f"p99 {_join([METRICS[m] for m in drawn_metrics])} against completed throughput, one marker per sweep "
            "point" + (f", {_curves_text(groups)}" if len(groups) > 1 else "")]
    if drew["ci"]:
        text.append("bars: the 95% confidence interval of each p99")
    if drew["unstable"]:
        text.append("hollow markers: the queue grew")
    if drew["slo"]:
        text.append(f"dashed horizontal line: the SLO target ({_join(drew['slo'])})")
    if drew["mu"]:
        text.append("dash-dot vertical line: the theory's capacity mu")
    if drew["knee"]:
        text.append("star: the knee (its rule is in the table above)")
    if drew["best"]:
        text.append("open diamond: the highest-throughput point that meets the SLO")
    return I.Panel("sweep_latency", "Latency against throughput", fig, "; ".join(text) + ".",
                   png=F.sweep_latency_figure(sweep))


def throughput_panel(sweep):
    """Completed throughput against offered load, with the diagonal, the theory's mu and the knee."""
    import plotly.graph_objects as go

    groups = F._groups(sweep)
    if not any(p.rate is not None and p.throughput is not None for p in sweep.points):
        return "throughput against offered load: no point has both an offered rate and a throughput"
    knees, best = F.sweep_knees(sweep), F.sweep_best_within_slo(sweep)
    fig = I.figure(height=420)
    drew = {"unstable": False, "mu": False, "knee": False, "best": False}
    hi = 0.0
    for gi, (label, pts) in enumerate(groups):
        c = _group_colour(gi, groups)
        pts = [p for p in pts if p.rate is not None and p.throughput is not None]
        if not pts:
            continue
        hi = max(hi, max(p.rate for p in pts))
        unstable = [p.stable is False for p in pts]
        drew["unstable"] |= any(unstable)
        fig.add_trace(go.Scatter(
            x=[p.rate for p in pts], y=[p.throughput for p in pts], mode="lines+markers",
            name=label if len(groups) > 1 else "throughput", line=dict(color=c, width=1.5),
            marker=dict(size=8, color=["white" if u else c for u in unstable], line=dict(color=c, width=1.5)),
            customdata=[p.verdict or "-" for p in pts],
            hovertemplate=f"%{{y:.4g}} req/s at offered %{{x:.4g}} req/s<br>%{{customdata}}<extra>{label}</extra>"))
        for mu in F._mu_values(pts):
            drew["mu"] = True
            fig.add_hline(y=mu, line=dict(color=c if len(groups) > 1 else F.C_MU, dash="dashdot", width=1.2))
        for mark, pt, name, size in (("star", knees.get(label), "knee", 15),
                                     ("diamond-open", best.get(label), "best within SLO", 12)):
            if pt is not None and pt.rate is not None and pt.throughput is not None:
                drew["knee" if name == "knee" else "best"] = True
                fig.add_trace(go.Scatter(x=[pt.rate], y=[pt.throughput], mode="markers", name=name, legendgroup=name,
                                         showlegend=not any(t.name == name for t in fig.data),
                                         marker=dict(symbol=mark, size=size, color=F.C_KNEE, line=dict(width=2)),
                                         hovertemplate=f"{name}: rate %{{x:.4g}} req/s<extra>{label}</extra>"))
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="throughput = offered load",
                             line=dict(color="#aaaaaa", dash="dot", width=1), hoverinfo="skip"))
    fig.update_xaxes(title_text="offered load (req/s)", rangemode="tozero")
    fig.update_yaxes(title_text="throughput (req/s)", rangemode="tozero")
    text = ["Completed throughput against offered load" + (f", {_curves_text(groups)}" if len(groups) > 1 else ""),
            "it follows the dotted diagonal while the server keeps up and flattens at its capacity"]
    if drew["unstable"]:
        text.append("hollow markers: the queue grew")
    if drew["mu"]:
        text.append("dash-dot horizontal line: the theory's capacity mu")
    if drew["knee"]:
        text.append("star: the knee")
    if drew["best"]:
        text.append("open diamond: the highest-throughput point that meets the SLO")
    return I.Panel("sweep_throughput", "Throughput against offered load", fig, "; ".join(text) + ".",
                   png=F.sweep_throughput_figure(sweep))


def percentiles_panel(sweep):
    """p50, p90 and p99 of TTFT, TPOT and E2EL against offered load, with the SLO where given."""
    import plotly.graph_objects as go

    groups = F._groups(sweep)

    def val(p, q, m):
        return p.p99[m][0] if q == "p99" else p.values.get(f"{q}_{m}_ms")

    drawn = [m for m in METRICS if any(p.rate is not None and val(p, "p99", m) is not None for p in sweep.points)]
    if not drawn:
        return "latency against offered load: no point has an offered rate and a p99 latency"
    qs = [q for q in ("p50", "p90", "p99") if any(val(p, q, m) is not None for p in sweep.points for m in drawn)]
    fig = I.figure(1, len(drawn), titles=list(METRICS[m] for m in drawn), height=420)
    dash = {"p50": "dot", "p90": "dash", "p99": "solid"}
    values, slo_drawn = [], []
    for col, m in enumerate(drawn, start=1):
        for gi, (label, pts) in enumerate(groups):
            c = _group_colour(gi, groups)
            for q in qs:
                pp = [p for p in pts if p.rate is not None and val(p, q, m) is not None]
                if not pp:
                    continue
                y = [val(p, q, m) for p in pp]
                values += y
                name = f"{q}" + (f" ({label})" if len(groups) > 1 else "")
                fig.add_trace(go.Scatter(x=[p.rate for p in pp], y=y, mode="lines+markers", name=name,
                                         legendgroup=name, showlegend=col == 1,
                                         line=dict(color=c, dash=dash[q], width=1.5), marker=dict(size=6),
                                         hovertemplate=f"{q} {METRICS[m]} %{{y:.4g}} ms at offered %{{x:.4g}} req/s"
                                                       f"<extra>{label}</extra>"), row=1, col=col)
        slo = F._slo_for(sweep, m, sweep.points)
        if slo is not None:
            slo_drawn.append(METRICS[m])
            fig.add_hline(y=slo, line=dict(color=F.C_SLO, dash="dash", width=1.3), row=1, col=col)
        fig.update_xaxes(title_text="offered load (req/s)", row=1, col=col)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    I.log_buttons(fig, "y", log=I.wide(values))
    text = (f"{_join(qs)} of {_join([METRICS[m] for m in drawn])} against offered load"
            + (f", {_curves_text(groups)}" if len(groups) > 1 else "")
            + ("; line style: " + ", ".join(f"{q} {'dotted' if dash[q] == 'dot' else dash[q]}" for q in qs)
               if len(qs) > 1 else ""))
    if slo_drawn:
        text += f"; red dashed line: the SLO target ({_join(slo_drawn)})"
    return I.Panel("sweep_percentiles", "Latency against offered load", fig, text + ".")


def queue_load_panel(sweep):
    """The queue's trend (req/s), the busy fraction and KV utilization against offered load."""
    import plotly.graph_objects as go

    groups = F._groups(sweep)
    has = {k: any(p.rate is not None and k in p.values for p in sweep.points)
           for k in ("queue_growth_per_s", "utilization", "kv_utilization")}
    sub = [s for s, ok in (("growth", has["queue_growth_per_s"]),
                           ("use", has["utilization"] or has["kv_utilization"])) if ok]
    if not sub:
        return "queue and utilization against offered load: the points give no queue trend or utilization"
    titles = {"growth": "Queue growth (req/s)", "use": "Busy fraction and KV utilization"}
    fig = I.figure(1, len(sub), titles=[titles[s] for s in sub], height=400)
    for col, s in enumerate(sub, start=1):
        keys = ["queue_growth_per_s"] if s == "growth" else [k for k in ("utilization", "kv_utilization") if has[k]]
        for gi, (label, pts) in enumerate(groups):
            c = _group_colour(gi, groups)
            for k in keys:
                pp = [p for p in pts if p.rate is not None and k in p.values]
                if not pp:
                    continue
                name = {"queue_growth_per_s": "queue growth", "utilization": "busy fraction",
                        "kv_utilization": "KV utilization"}[k] + (f" ({label})" if len(groups) > 1 else "")
                fig.add_trace(go.Scatter(x=[p.rate for p in pp], y=[p.values[k] for p in pp], mode="lines+markers",
                                         name=name, line=dict(color=c, dash="dash" if k == "kv_utilization" else None,
                                                              width=1.5),
                                         hovertemplate=f"%{{y:.4g}} at offered %{{x:.4g}} req/s<extra>{name}</extra>"),
                              row=1, col=col)
        fig.update_xaxes(title_text="offered load (req/s)", row=1, col=col)
        if s == "growth":
            fig.add_hline(y=0, line=dict(color="#888888", width=1), row=1, col=col)
        else:
            fig.update_yaxes(range=[0, 1.05], row=1, col=col)
    text = []
    if "growth" in sub:
        text.append("the waiting queue's trend (req/s) at each point: near zero while the server keeps up, rising "
                    "with the excess load beyond it")
    if "use" in sub:
        use = [n for k, n in (("utilization", "the busy fraction (solid)"), ("kv_utilization", "the mean KV cache "
                              "utilization (dashed)")) if has[k]]
        text.append(f"{_join(use)} against offered load")
    caption = ("Left: " if len(sub) > 1 else "") + text[0] + (f"; right: {text[1]}" if len(text) > 1 else "")
    caption = caption[0].upper() + caption[1:]
    if len(groups) > 1:
        caption += f"; {_curves_text(groups)}"
    return I.Panel("sweep_queue", "Queue and utilization against offered load", fig, caption + ".")


# -- from the points' run directories ---------------------------------------------------------------

def queue_time_panel(sweep, runs):
    """Waiting requests over time, one line per point whose run directory the sweep kept."""
    import plotly.graph_objects as go

    if not runs:
        return f"queue length over time per point: {KEEP_RUNS}"
    fig = I.figure(hovermode="closest", height=440)
    colours = _colours(len(runs))
    longest = max((float(series.queue_series(r)[0][-1]) for _, r in runs), default=1.0)
    scale, unit = I.time_scale(np.array([0.0, longest]))
    for c, (p, r) in zip(colours, runs):
        t, w, _, _ = series.queue_series(r)
        t, (w,) = series._resample(t, [w], n=1000)
        fig.add_trace(go.Scatter(x=I.arr(t / scale), y=I.arr(w), mode="lines", name=r.label,
                                 line=dict(color=c, width=1.4, shape="hv"),
                                 hovertemplate=f"%{{y:.0f}} waiting at %{{x:.4g}} {unit}<extra>{r.label}</extra>"))
    warm = {(r.summary or {}).get("warmup_s") for _, r in runs}
    shaded = len(warm) == 1 and I.shade_warmup(fig, warm.pop(), scale)
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="waiting requests", rangemode="tozero")
    I.log_buttons(fig, "y")
    missing = len(sweep.points) - len(runs)
    caption = (f"Waiting requests over time (summed over replicas), one line per point ({len(runs)} of "
               f"{len(sweep.points)} points" + (f"; {missing} kept no run directory" if missing else "")
               + "): a bounded queue stays flat, an unstable one climbs. On the log axis an empty queue (0) is not "
               "drawn." + (" Shaded: warm-up." if shaded else ""))
    return I.Panel("sweep_queue_time", "Queue length over time per point", fig, caption)


def cdf_panel(sweep, runs):
    """Empirical CDFs of TTFT, TPOT and E2EL, one line per point with a kept run directory."""
    import plotly.graph_objects as go

    if not runs:
        return f"latency CDFs per point: {KEEP_RUNS}"
    lats = [(p, r, series.latencies(r)) for p, r in runs]
    drawn = [m for m in METRICS if any(len(lat[m]) for _, _, lat in lats)]
    if not drawn:
        return "latency CDFs per point: no point's run has a finished request in its window"
    fig = I.figure(1, len(drawn), titles=[METRICS[m] for m in drawn], height=440)
    colours = _colours(len(lats))
    allv = []
    for col, m in enumerate(drawn, start=1):
        x_all = np.concatenate([lat[m] for _, _, lat in lats]) * 1000
        allv.append(x_all)
        div, unit = (1000.0, "s") if len(x_all) and np.percentile(x_all, 99) >= 10_000 else (1.0, "ms")
        for c, (p, r, lat) in zip(colours, lats):
            if not len(lat[m]):
                continue
            v, q = series.ecdf_points(lat[m] * 1000, n=300)
            fig.add_trace(go.Scatter(x=I.arr(v / div), y=I.arr(q), mode="lines", name=r.label, legendgroup=r.label,
                                     showlegend=col == 1, line=dict(color=c, width=1.4, shape="hv"),
                                     hovertemplate=f"%{{x:.4g}} {unit}: share at most this %{{y:.3g}}"
                                                   f"<extra>{r.label} (n={len(lat[m]):,})</extra>"), row=1, col=col)
        fig.update_xaxes(title_text=unit, row=1, col=col)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    I.log_buttons(fig, "x", log=I.wide(np.concatenate(allv)))
    caption = (f"Empirical CDFs of {_join([METRICS[m] for m in drawn])} of each point's finished requests arriving "
               f"in its measurement window, one line per point ({len(runs)} of {len(sweep.points)} points).")
    return I.Panel("sweep_cdf", "Latency CDFs per point", fig, caption)
