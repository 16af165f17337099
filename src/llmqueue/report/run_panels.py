"""The interactive figures of a run report, each with a caption that says what it draws.

:func:`run_panels` returns the panels that have data and, for each one left out, why
(a run without KV records gets no KV panel, a run of one request class no per-class panel):

- ``queue``: waiting and running requests over time (PNG: ``queue.png``).
- ``kv``: KV tokens in use per replica against the capacity M (PNG: ``kv.png``).
- ``latency_time``: p50 and p99 of TTFT, TPOT and E2EL by arrival time.
- ``tokens_time``: output tokens per second over time.
- ``cdf``: CDFs of TTFT, TPOT and E2EL (PNG: ``cdf.png``).
- ``ccdf``: their tails, ``P(X >= x)`` on log-log axes.
- ``classes``: latency CDFs per request class.
- ``decomposition``: queue, prefill and decode time per request (PNG: ``decomposition.png``).
- a fleet's run (``pools.parquet``): replicas over time, queue depth per pool and class, and the
  spike recovery (:mod:`llmqueue.report.fleet_panels`; none of them, and no note, for other runs).

A twin (the simulated twin of a measured run) is drawn dashed where it has the same quantity.
"""

from __future__ import annotations

import numpy as np

from llmqueue.report import figures as F
from llmqueue.report import interactive as I
from llmqueue.report import series

METRICS = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}
LIGHT = {"ttft": "#f4a3a3", "tpot": "#9ec5e8", "e2el": "#9fd89f"}
C_TWIN = "#444444"


def run_panels(run, twin=None, *, step=None) -> tuple[list, list]:
    """``(panels, left_out)``: the figures of ``run`` that have data, and ``"name: why"`` for the rest.

    ``step``: called after each of the :data:`MAKERS` (a progress bar)."""
    panels, left_out = [], []
    for make in MAKERS:
        p = make(run, twin)
        (left_out if isinstance(p, str) else panels).append(p)
        if step is not None:
            step()
    from llmqueue.report.fleet_panels import fleet_panels

    panels += fleet_panels([run] + ([twin] if twin is not None else []))  # a fleet's runs only
    return panels, left_out


def _twin_note(twin, drawn: bool) -> str:
    return f" Dashed: {twin.label} ({twin.path})." if twin is not None and drawn else ""


def _warm(fig, run, scale) -> str:
    shaded = I.shade_warmup(fig, (run.summary or {}).get("warmup_s"), scale)
    return " Shaded: warm-up, left out of the statistics." if shaded else ""


def _line(t, y, *, name, color, dash=None, width=1.5, shape="hv", unit="", fmt=".4g", opacity=1.0, group=None):
    import plotly.graph_objects as go

    return go.Scatter(x=I.arr(t), y=I.arr(y), mode="lines", name=name, line=dict(color=color, dash=dash, width=width,
                      shape=shape), opacity=opacity, legendgroup=group,
                      hovertemplate=f"%{{y:{fmt}}}{unit}<extra>{name}</extra>")


# -- over time -------------------------------------------------------------------------------------

def queue_panel(run, twin=None):
    """Waiting and running requests over time, titled with the verdict ("bounded", "growing")."""
    q = series.queue_series(run)
    if q is None:
        return "queue length over time: the run has no time series, step or request records"
    t, w, r, src = q
    word, detail = series.verdict_note(run.summary)
    scale, unit = I.time_scale(t)
    fig = I.figure(hovermode="x unified")
    fig.add_trace(_line(t / scale, w, name=f"waiting ({run.label})", color=F.C_WAIT, fmt=".0f"))
    fig.add_trace(_line(t / scale, r, name=f"running ({run.label})", color=F.C_RUN, fmt=".0f"))
    tq = series.queue_series(twin) if twin is not None else None
    if tq is not None:
        fig.add_trace(_line(tq[0] / scale, tq[1], name=f"waiting ({twin.label})", color=F.C_WAIT, dash="dash",
                            fmt=".0f"))
        fig.add_trace(_line(tq[0] / scale, tq[2], name=f"running ({twin.label})", color=F.C_RUN, dash="dash",
                            fmt=".0f"))
    warm = _warm(fig, run, scale)
    colour = {"bounded": "#2ca02c", "growing": "#d62728"}.get(word, "#555555")
    fig.update_layout(title=dict(text=f"Queue length over time: {word}", font_color=colour, x=0, xanchor="left"))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="requests", rangemode="tozero")
    I.log_buttons(fig, "y")
    caption = (f"Waiting and running requests over time, summed over replicas, from the {src} ({word}: {detail})."
               f"{warm}{_twin_note(twin, tq is not None)}")
    return I.Panel("queue", "Queue length", fig, caption, png=F.queue_figure(run, twin))


def kv_panel(run, twin=None):
    """KV tokens in use per replica over time, and the capacity ``M`` when the run records it."""
    kv = series.kv_series(run)
    if kv is None:
        return ("KV cache over time: the run records no KV usage (no time series or step records, or only zeros "
                "without a known capacity)")
    t, k, src = kv
    scale, unit = I.time_scale(t)
    fig = I.figure(hovermode="x unified")
    fig.add_trace(_line(t / scale, k, name=f"KV tokens in use ({run.label})", color=F.C_KV, fmt=",.0f"))
    tk = series.kv_series(twin) if twin is not None else None
    if tk is not None:
        fig.add_trace(_line(tk[0] / scale, tk[1], name=f"KV tokens in use ({twin.label})", color=F.C_KV,
                            dash="dash", fmt=",.0f"))
    warm = _warm(fig, run, scale)
    cap = series.kv_capacity(run)
    text = f"KV tokens held per replica (block-rounded) over time, from the {src}"
    if cap is not None:
        fig.add_hline(y=cap, line=dict(color=F.C_CAP, dash="dot", width=1.5),
                      annotation_text=f"capacity M = {cap:,.0f} tokens", annotation_position="top left")
        fig.update_yaxes(range=[0, cap * 1.12])
        text += (", against the capacity M (dotted line): a queue that grows while the cache stays near M is "
                 "memory-bound (Nie et al. 2026)")
    mean = (run.summary or {}).get("kv_utilization")
    if isinstance(mean, (int, float)):
        text += f". Mean utilization in the window: {100 * mean:.1f}%"
    fig.update_layout(title=dict(text="KV cache in use" + (" against capacity" if cap is not None else ""), x=0))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="tokens per replica", tickformat=",.0f", rangemode="tozero")
    caption = f"{text}.{warm}{_twin_note(twin, tk is not None)}"
    return I.Panel("kv", "KV cache", fig, caption, png=F.kv_figure(run, twin))


def latency_time_panel(run, twin=None):
    """p50 and p99 of TTFT, TPOT and E2EL of the finished requests, by arrival time (ms)."""
    lt = series.latency_over_time(run)
    if lt is None:
        return "latency over time: fewer than 5 finished requests"
    tl = series.latency_over_time(twin) if twin is not None else None
    scale, unit = I.time_scale(lt["t"])
    fig = I.figure(3, 1, titles=list(METRICS.values()), height=640, shared_x=True, hovermode="x unified")
    values = []
    for row, (m, name) in enumerate(METRICS.items(), start=1):
        for data, lab, dash in ((lt, run.label, None), (tl, twin.label if twin is not None else "", "dash")):
            if data is None:
                continue
            for q, color, width in (("p50", LIGHT[m], 1.6), ("p99", F.C_METRIC[m], 1.8)):
                y = data[m][q] * 1000
                values.append(y)
                fig.add_trace(_line(data["t"] / scale, y, name=f"{name} {q} ({lab})", color=color, dash=dash,
                                    width=width, shape="linear", unit=" ms", fmt=".4g"), row=row, col=1)
        fig.update_yaxes(title_text="ms", row=row, col=1)
    warm = _warm(fig, run, scale)
    fig.update_xaxes(title_text=f"arrival time ({unit})", row=3, col=1)
    I.log_buttons(fig, "y", log=I.wide(np.concatenate(values)))
    word = series.verdict_note(run.summary)[0]
    caption = (f"p50 (light) and p99 (dark) of TTFT, TPOT and E2EL of the finished requests by arrival time, in "
               f"{lt['width']:.3g} s bins (a bin with fewer than 5 values is left out)."
               + (" Requests still in flight at the end are not drawn: the curves stop at the last arrivals that "
                  "finished." if word in ("growing", "overloaded") else "")
               + f"{warm}{_twin_note(twin, tl is not None)}")
    return I.Panel("latency_time", "Latency over time", fig, caption)


def tokens_time_panel(run, twin=None):
    """Output tokens per second over time (all replicas), from the request records."""
    rate = series.output_rate(run)
    if rate is None:
        return "tokens per second over time: no finished request produced a token"
    tr = series.output_rate(twin) if twin is not None else None
    scale, unit = I.time_scale(rate["t"])
    fig = I.figure(hovermode="x unified")
    fig.add_trace(_line(rate["t"] / scale, rate["tokens_per_s"], name=f"output tokens/s ({run.label})",
                        color=F.C_RUN, fmt=",.4g"))
    if tr is not None:
        fig.add_trace(_line(tr["t"] / scale, tr["tokens_per_s"], name=f"output tokens/s ({twin.label})",
                            color=F.C_RUN, dash="dash", fmt=",.4g"))
    warm = _warm(fig, run, scale)
    fig.update_layout(title=dict(text="Output tokens per second", x=0))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero")
    caption = (f"Output tokens per second over time, all replicas, in {rate['width']:.3g} s bins, from the finished "
               "requests' records: each request's first token at its first-token time and its other tokens spread "
               f"evenly up to its finish (the records keep no per-token times).{warm}"
               f"{_twin_note(twin, tr is not None)}")
    return I.Panel("tokens_time", "Tokens per second over time", fig, caption)


# -- distributions ---------------------------------------------------------------------------------

def _unit(x_ms) -> tuple[float, str]:
    """Seconds when the p99 reaches 10 s, else milliseconds."""
    return (1000.0, "s") if len(x_ms) and np.percentile(x_ms, 99) >= 10_000 else (1.0, "ms")


def _dist_figure(run, twin, *, tail: bool):
    """CDFs (``tail=False``) or CCDFs of the three latencies: ``(fig, metrics drawn, twin drawn)``."""
    import plotly.graph_objects as go

    lat = series.latencies(run)
    tlat = series.latencies(twin) if twin is not None else None
    drawn = [m for m in METRICS if len(lat[m])]
    if not drawn:
        return None, [], False
    fig = I.figure(1, len(drawn), titles=[METRICS[m] for m in drawn], height=400)
    twin_drawn = False
    for col, m in enumerate(drawn, start=1):
        x = lat[m] * 1000
        div, unit = _unit(x)
        curves = [(x, run.label, F.C_METRIC[m], None)]
        if tlat is not None and len(tlat[m]):
            curves.append((tlat[m] * 1000, twin.label, C_TWIN, "dash"))
            twin_drawn = True
        for xs, lab, color, dash in curves:
            v, p = series.ecdf_points(xs)
            n = len(xs)
            y = (1 - p + 1 / n) if tail else p  # tail: P(X >= x), down to 1/N at the largest value
            what = "share at least this" if tail else "share at most this"
            fig.add_trace(go.Scatter(x=I.arr(v / div), y=I.arr(y), mode="lines", name=f"{METRICS[m]} ({lab})",
                                     line=dict(color=color, dash=dash, width=1.6, shape="hv" if not tail else "vh"),
                                     hovertemplate=f"%{{x:.4g}} {unit}: {what} %{{y:.4g}}<extra>{METRICS[m]} "
                                                   f"({lab}, n={n:,})</extra>"), row=1, col=col)
        if tail:
            fig.add_hline(y=0.01, line=dict(color="#888888", dash="dot", width=1), row=1, col=col)
        else:  # a trace, not a shape with a label: it stays put when the axis turns log
            p99 = float(np.percentile(x, 99)) / div
            fig.add_trace(go.Scatter(x=[p99, p99], y=[0, 1], mode="lines", name=f"p99 {METRICS[m]} = {p99:.4g} {unit}",
                                     line=dict(color=F.C_METRIC[m], dash="dot", width=1.2),
                                     hovertemplate=f"p99 {p99:.4g} {unit}<extra>{run.label}</extra>"), row=1, col=col)
        fig.update_xaxes(title_text=unit, row=1, col=col)
    fig.update_yaxes(title_text="fraction of requests at least x" if tail else "fraction of requests", row=1, col=1)
    return fig, drawn, twin_drawn


def cdf_panel(run, twin=None):
    """Empirical CDFs of TTFT, TPOT and E2EL (finished requests in the window), p99 marked."""
    fig, drawn, twin_drawn = _dist_figure(run, twin, tail=False)
    if fig is None:
        return "latency CDFs: no finished request in the measurement window"
    fig.update_yaxes(range=[0, 1.02])
    lat = series.latencies(run)
    I.log_buttons(fig, "x", log=I.wide(np.concatenate([lat[m] for m in drawn])))
    word = series.verdict_note(run.summary)[0]
    names = ", ".join(METRICS[m] for m in drawn)
    caption = (f"Empirical CDFs of {names} of the finished requests arriving in the measurement window; dotted "
               f"vertical line: {run.label}'s p99 (its value in the legend)."
               + (" In an overloaded run these describe the survivors." if word in ("growing", "overloaded") else "")
               + _twin_note(twin, twin_drawn))
    return I.Panel("cdf", "Latency distributions", fig, caption, png=F.cdf_figure(run, twin))


def ccdf_panel(run, twin=None):
    """The tails: the share of requests at least as slow as x, on log-log axes."""
    fig, drawn, twin_drawn = _dist_figure(run, twin, tail=True)
    if fig is None:
        return "tail CCDFs: no finished request in the measurement window"
    I.log_buttons(fig, "xy", log=True)
    names = ", ".join(METRICS[m] for m in drawn)
    caption = (f"Tails of {names}: the share of the finished requests in the window whose latency is at least x, on "
               "log-log axes (the last point is 1/N at the slowest request); dotted horizontal line: 1%, where a "
               "curve crosses it is its p99. A straight line is a power-law (heavy) tail, a curve that bends "
               f"down a light one.{_twin_note(twin, twin_drawn)}")
    return I.Panel("ccdf", "Tail latency", fig, caption)


def class_panel(run, twin=None):
    """Latency CDFs per request class (when the finished requests carry more than one class)."""
    import plotly.graph_objects as go

    classes = {c: lat for c, lat in series.class_latencies(run).items() if len(lat["e2el"]) or len(lat["ttft"])}
    if not classes:
        return "latency by class: no finished request in the measurement window"
    if len(classes) == 1:
        return f"latency by class: the finished requests in the window are all of one class ({next(iter(classes))})"
    drawn = [m for m in METRICS if any(len(lat[m]) for lat in classes.values())]
    fig = I.figure(1, len(drawn), titles=[METRICS[m] for m in drawn], height=400)
    for col, m in enumerate(drawn, start=1):
        allx = np.concatenate([lat[m] for lat in classes.values()]) * 1000
        div, unit = _unit(allx)
        for i, (c, lat) in enumerate(classes.items()):
            if not len(lat[m]):
                continue
            v, p = series.ecdf_points(lat[m] * 1000)
            fig.add_trace(go.Scatter(x=I.arr(v / div), y=I.arr(p), mode="lines", name=f"{c} (n={len(lat[m]):,})",
                                     legendgroup=c, showlegend=col == 1,
                                     line=dict(color=F.CYCLE[i % len(F.CYCLE)], width=1.6, shape="hv"),
                                     hovertemplate=f"%{{x:.4g}} {unit}: share at most this %{{y:.4g}}"
                                                   f"<extra>{METRICS[m]} ({c})</extra>"), row=1, col=col)
        fig.update_xaxes(title_text=unit, row=1, col=col)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    I.log_buttons(fig, "x", log=I.wide(np.concatenate([lat[m] for lat in classes.values() for m in drawn])))
    caption = (f"Empirical CDFs of {', '.join(METRICS[m] for m in drawn)} per request class ({len(classes)} classes: "
               f"{', '.join(classes)}), finished requests arriving in the measurement window; the legend gives each "
               "class's count.")
    return I.Panel("classes", "Latency by class", fig, caption)


# -- where the time goes ---------------------------------------------------------------------------

def decomposition_panel(run, twin=None):
    """Mean queue / prefill / decode time per request (bars) and the same by arrival time (areas)."""
    import plotly.graph_objects as go

    d = series.decomposition(run)
    if d is None:
        return "latency decomposition: no finished request in the measurement window"
    td = series.decomposition(twin) if twin is not None else None
    fig = I.figure(1, 2, titles=["Mean per request", f"By arrival time ({run.label})"], widths=[1, 2], height=400)
    runs = [(run, d, "")] + ([(twin, td, "/")] if td is not None else [])
    shown = set()
    for r, dd, hatch in runs:
        for part in dd["parts"]:
            fig.add_trace(go.Bar(x=[dd["mean"][part]], y=[f"{r.label} (n={dd['n']:,})"], orientation="h",
                                 name=series.PARTS[part], legendgroup=part, showlegend=part not in shown,
                                 marker=dict(color=F.C_PARTS[part], pattern_shape=hatch),
                                 hovertemplate=f"{part}: %{{x:.4g}} s<extra>{r.label}</extra>"), row=1, col=1)
            shown.add(part)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="mean seconds per request (E2EL)", row=1, col=1)
    scale, unit = I.time_scale(d["bin_t"] if len(d["bin_t"]) > 1 else np.array([0.0, 1.0]))
    for part in d["parts"]:
        fig.add_trace(go.Scatter(x=I.arr(d["bin_t"] / scale), y=I.arr(d["bin"][part]), mode="lines",
                                 stackgroup="parts", name=series.PARTS[part], legendgroup=part,
                                 showlegend=part not in shown,
                                 line=dict(color=F.C_PARTS[part], width=0.5),
                                 hovertemplate=f"{part}: %{{y:.4g}} s<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text=f"arrival time ({unit})", row=1, col=2)
    fig.update_yaxes(title_text="mean seconds", rangemode="tozero", row=1, col=2)
    if "queue" in d["parts"]:
        split = ("split into queue (arrival to the first scheduled step), prefill (to the first token) and decode (to "
                 "the last token)")
    else:
        split = ("split into TTFT and decode (to the last token): the records do not say when the server first "
                 "scheduled a request, so queue and prefill cannot be told apart")
    caption = (f"Each finished request's end-to-end latency (arriving in the measurement window) {split}. Left: the "
               "mean per request" + (f", {run.label} and {twin.label} (hatched)" if td is not None else "")
               + f"; right: the mean by arrival time ({run.label}, {len(d['bin_t'])} bins), stacked.")
    return I.Panel("decomposition", "Where the time goes", fig, caption, png=F.decomposition_figure(run, twin))


#: The panels of a run, in the page's order.
MAKERS = (queue_panel, kv_panel, latency_time_panel, tokens_time_panel, cdf_panel, ccdf_panel, class_panel,
          decomposition_panel)
