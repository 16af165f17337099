"""The seeds' figures as reports.

- :func:`seed004_figure2`: Nie et al.'s Figure 2. The 1:1 P/D setting (M = 131,000 tokens, step
  time b = 0.0372 s, chunk 512, prompt and output uniform on 10..1600) simulated at
  lam = 1, 3, 5, 20, 50 req/s for 3600 s; the waiting queue over time, one line per rate. The
  closed form puts capacity at mu = M / (b E[g]) = 3.26 req/s, so the queue stays bounded at
  1 and 3 and grows roughly linearly (at about lam - mu) at 5, 20 and 50.
- :func:`seed002_figure2`: Inference Foundations' Figure 2. The batch-service model
  ``T_svc(B) = T_fixed + t_req B`` at lam = 100 req/s, T_fixed = 50 ms, t_req = 0.5 ms
  (:func:`llmqueue.theory.batch.batch_table`): throughput capacity against latency as the batch
  size grows, with the SLO line and the knee.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue.report import html as H
from llmqueue.report import interactive as I
from llmqueue.report.page import Report, fig, write

SEED004_RATES = (1.0, 3.0, 5.0, 20.0, 50.0)
SEED004_SETTING = {"capacity_tokens": 131000, "step_time": 0.0372, "chunk": 512,
                   "prompt": "uniform:10:1600", "output": "uniform:10:1600"}
SEED002_SETTING = {"lam": 100.0, "T_fixed": 0.050, "t_req": 0.0005}
SEED002_SIZES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def simulate_seed004(*, rates=SEED004_RATES, duration_s: float = 3600.0, seed: int = 1, warmup_s: float = 300.0,
                     progress: bool = False):
    """Simulate the 1:1 setting at each rate: ``[(lam, t_s, num_waiting, summary, theory)]``.

    ``progress``: one bar on stderr over all the rates, in simulated seconds, naming the rate that runs.
    """
    from llmqueue._progress import SimSeconds
    from llmqueue.engine.config import EngineConfig
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.simulate import SimSpec, run_simulation
    from llmqueue.workload import Workload

    from llmqueue.workload.generate import check_stream_size

    st = SEED004_SETTING
    for lam in sorted(rates, reverse=True):  # every rate's stream size before the first simulation
        check_stream_size(n=None, duration=duration_s, rate=lam)
    out = []
    bar = SimSeconds(len(rates), duration_s, desc="kv-stability-figure", enabled=progress)
    try:
        for i, lam in enumerate(rates):
            spec = SimSpec(engine=EngineConfig.from_capacity(st["capacity_tokens"], max_num_batched_tokens=st["chunk"]),
                           step_time=parse_step_time(st["step_time"]),
                           workload=Workload(f"poisson:{lam:g}", prompt=st["prompt"], output=st["output"]),
                           duration_s=duration_s, seed=seed, warmup_s=min(warmup_s, duration_s / 4))
            spec.options.progress = bar.callback(f"lam = {lam:g} req/s ({i + 1} of {len(rates)})")
            o = run_simulation(spec)
            bar.done()
            ts = o.result.timeseries
            t = np.asarray(ts["t_s"], dtype=np.float64)
            w = np.asarray(ts["num_waiting"], dtype=np.float64)
            out.append((float(lam), t, w, o.summary, o.theory))
    finally:
        bar.close()
    return out


def seed004_figure2(out, *, png_dir=None, rates=SEED004_RATES, duration_s: float = 3600.0, seed: int = 1,
                    progress: bool = False) -> Report:
    """Write Nie et al.'s Figure 2 as a report (one figure, ``kv_stability_figure.png``); ``progress``:
    a bar on stderr over the simulations."""
    from llmqueue.report.figures import seed004_queue_figure
    from llmqueue.report.series import verdict_note

    runs = simulate_seed004(rates=rates, duration_s=duration_s, seed=seed, progress=progress)
    lines = [(lam, t, w, verdict_note(s)[0]) for lam, t, w, s, _ in runs]
    mu = runs[0][4].get("mu_kv") if runs else None
    t = H.Table(["lam (req/s)", "theory rho = lam / mu", "queue", "verdict (simulated)", "throughput (req/s)",
                 "waiting at end", "p99 TTFT (ms)"])
    for lam, tt, w, s, th in runs:
        t.add(lam, th.get("rho"), verdict_note(s)[0], str(s.get("verdict", "-")), s.get("request_throughput"),
              int(w[-1]) if len(w) else None, H.Raw(H.with_ci(s.get("p99_ttft_ms"), s.get("p99_ttft_ms_ci"))))
    st = SEED004_SETTING
    setting = (f"M = {st['capacity_tokens']:,} tokens, b = {st['step_time']} s, chunk {st['chunk']}, prompt "
               f"{st['prompt']}, output {st['output']}, Poisson arrivals, {duration_s:g} s per rate, seed {seed}")
    body = [
        H.para(f"Nie et al. 2026 (Nie, Si and Zhou), Figure 2: waiting queue length under different arrival rates, 1:1 P/D "
               f"setting, in simulation. {setting}. Closed-form capacity mu = M / (b E[g]) = "
               f"{H.num(mu)} req/s: the queue should stay bounded below it and grow above it.", cls="verdict"),
        H.section("Waiting queue over time", fig("kv_stability_figure"), anchor="figure"),
        H.section("Per rate", t.html(), anchor="rates"),
    ]
    figs = [I.Panel("kv_stability_figure", "Waiting queue over time", seed004_plot(lines),
                    "Waiting requests over time, one line per arrival rate lam (the verdict in the legend), linear "
                    "axis as in the paper, where the bounded queues at the low rates lie on the floor; the log "
                    "button shows them (an empty queue, 0, is not drawn on it).",
                    png=seed004_queue_figure(lines))]
    return write("kv-stability-figure", out, png_dir, "Nie et al. 2026, Figure 2: queue length against time",
                 setting, body, figs, source="simulation")


def seed002_figure2(out, *, png_dir=None, lam: float = SEED002_SETTING["lam"],
                    T_fixed: float = SEED002_SETTING["T_fixed"], t_req: float = SEED002_SETTING["t_req"],
                    slo_ms: float | None = 300.0, sizes=SEED002_SIZES) -> Report:
    """Write Inference Foundations' Figure 2 as a report (one figure, ``batch_figure.png``).

    The knee: on the frontier (the stable sizes at or above the mean-latency optimum, where a
    larger batch buys throughput with latency), the last size before 1% more capacity costs more
    than 1% more mean latency (:func:`llmqueue.report.series.elasticity_knee` on (mu_eff, E[T])):
    Inference Foundations' "throughput gains diminish while latency continues to increase". With ``slo_ms``,
    the SLO-constrained optimum (Inference Foundations, step 5: the largest B with P99 within the SLO) is
    reported beside it.
    """
    from llmqueue.report.figures import seed002_tradeoff_figure
    from llmqueue.report.series import elasticity_knee
    from llmqueue.theory.batch import batch_table

    table = batch_table(lam=lam, T_fixed=T_fixed, t_req=t_req, sizes=sizes,
                        slo=None if slo_ms is None else slo_ms / 1000.0)
    rows = [r for r in table.rows if r.stable and math.isfinite(r.W)]
    best = table.B_mean_opt
    tail = [r for r in rows if best is None or r.B >= best]
    k = elasticity_knee([r.mu_eff for r in tail], [r.W for r in tail])
    knee_B = tail[k].B if k is not None else None
    t = H.Table(["B", "T_svc (ms)", "mu_eff (req/s)", "rho", "E[T] (ms)", "P99 (ms)", "action (Inference Foundations Table 2)"])
    for r in table.rows:
        t.add(r.B, 1000 * r.T_svc, r.mu_eff, r.rho, 1000 * r.W if math.isfinite(r.W) else None,
              1000 * r.P99_normal if math.isfinite(r.P99_normal) else None, r.action)
    dec = table.decision
    facts = H.Table(["", ""])
    facts.add("B_min (stability, mu_eff > lam)", f"{table.b_min_stability.B_min:.3g} -> {table.b_min_stability.B_min_int}")
    facts.add("B_min (rho <= 0.75)", f"{table.b_min_target.B_min:.3g} -> {table.b_min_target.B_min_int}")
    facts.add("lowest mean latency at B", best if best is not None else "-")
    facts.add("knee at B (1% throughput costs 1% latency)", knee_B if knee_B is not None else "-")
    if dec is not None:
        facts.add(f"largest B with P99 <= {slo_ms:g} ms", dec.B_slo if dec.B_slo is not None else "none")
    setting = f"lam = {lam:g} req/s, T_fixed = {1000 * T_fixed:g} ms, t_req = {1000 * t_req:g} ms"
    body = [
        H.para("Inference Foundations, Figure 2: the operating region of batching. A larger batch raises the throughput capacity "
               "mu_eff(B) = B / (T_fixed + t_req B) towards 1/t_req, but each request waits for its batch to fill "
               "(B / (2 lam)) and for a longer pass, so latency has a knee rather than a floor. "
               f"{setting}; M/D/1 on batches (Inference Foundations' model).", cls="verdict"),
        H.section("Throughput against latency", fig("batch_figure"), anchor="figure"),
        H.section("Batch sizes", f'<div class="cols">{t.html()}{facts.html()}</div>', anchor="table"),
    ]
    best_B = dec.B_slo if dec is not None else None
    plot, drawn = seed002_plot(table, slo_ms=slo_ms, knee_B=knee_B, best_B=best_B)
    caption = ("Each point is one batch size B (hover for B): x its capacity mu_eff(B), y the mean response time "
               "E[T] and the P99 estimate E[T] + 2.33 sigma_T, on a log axis; dotted vertical line: the arrival rate "
               "lam, dash-dot: the ceiling 1/t_req")
    caption += "".join(text for key, text in (("slo", f"; dashed: the SLO ({slo_ms:g} ms, P99)"),
                                              ("knee", f"; star: the knee (B = {knee_B})"),
                                              ("best", f"; open diamond: the largest B whose P99 meets the SLO "
                                                       f"(B = {best_B})")) if key in drawn)
    bad = [r.B for r in table.rows if not (r.stable and math.isfinite(r.W))]
    caption += (f". Sizes that cannot keep up with lam are left out (B = {', '.join(map(str, bad))})." if bad else ".")
    figs = [I.Panel("batch_figure", "Throughput against latency", plot, caption,
                    png=seed002_tradeoff_figure(table, slo_ms=slo_ms, knee_B=knee_B, best_B=best_B))]
    return write("batch-figure", out, png_dir, "Inference Foundations, Figure 2: throughput against latency",
                 setting, body, figs, source="llmqueue.theory.batch")


def seed004_plot(runs):
    """Interactive Figure 2 of Nie et al.: waiting requests over time, one line per rate.

    ``runs``: ``[(lam, t_s, num_waiting, verdict_word)]``; a linear/log button for the y axis.
    """
    import plotly.graph_objects as go

    from llmqueue.report.figures import CYCLE
    from llmqueue.report.series import _resample

    fig = I.figure(height=440)
    scale, unit = I.time_scale(runs[0][1] if runs else np.array([0.0, 1.0]))
    for i, (lam, t, w, word) in enumerate(runs):
        t, (w,) = _resample(np.asarray(t, dtype=np.float64), [np.asarray(w, dtype=np.float64)], n=1500)
        name = f"lam = {lam:g} req/s ({word})"
        fig.add_trace(go.Scatter(x=I.arr(t / scale), y=I.arr(w), mode="lines", name=name,
                                 line=dict(color=CYCLE[i % len(CYCLE)], width=1.5),
                                 hovertemplate=f"%{{y:,.0f}} waiting at %{{x:.4g}} {unit}<extra>{name}</extra>"))
    fig.update_layout(title=dict(text="Waiting queue length, 1:1 P/D setting", x=0))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="waiting requests", tickformat=",.0f", rangemode="tozero")
    I.log_buttons(fig, "y")
    return fig


def seed002_plot(table, *, slo_ms=None, knee_B=None, best_B=None):
    """Interactive Figure 2 of Inference Foundations: ``(figure, {"slo", "knee", "best"} drawn)``."""
    import plotly.graph_objects as go

    from llmqueue.report.figures import C_KNEE, C_MU, C_SLO, CYCLE

    rows = [r for r in table.rows if r.stable and math.isfinite(r.W)]
    fig = I.figure(height=460)
    x = [r.mu_eff for r in rows]
    B = [r.B for r in rows]
    for name, y, colour, dash, sym in (("mean response E[T]", [1000 * r.W for r in rows], CYCLE[0], None, "circle"),
                                       ("P99 = E[T] + 2.33 sigma_T", [1000 * r.P99_normal for r in rows], CYCLE[1],
                                        "dash", "square")):
        fig.add_trace(go.Scatter(x=x, y=y, customdata=B, mode="lines+markers", name=name,
                                 line=dict(color=colour, dash=dash, width=1.6), marker=dict(symbol=sym, size=7),
                                 hovertemplate="B = %{customdata}: %{y:.4g} ms at %{x:.4g} req/s"
                                               f"<extra>{name}</extra>"))
    fig.add_vline(x=table.lam, line=dict(color=C_MU, dash="dot", width=1.2))
    if table.t_req > 0:
        fig.add_vline(x=1 / table.t_req, line=dict(color=C_MU, dash="dashdot", width=1.2))
    drawn = set()
    if slo_ms is not None:
        fig.add_hline(y=slo_ms, line=dict(color=C_SLO, dash="dash", width=1.3))
        drawn.add("slo")
    for key, b, col, sym, name in (("knee", knee_B, "W", "star", "knee"),
                                   ("best", best_B, "P99_normal", "diamond-open", "largest B with P99 within SLO")):
        r = next((r for r in rows if r.B == b), None) if b is not None else None
        if r is not None:
            drawn.add(key)
            fig.add_trace(go.Scatter(x=[r.mu_eff], y=[1000 * getattr(r, col)], mode="markers", name=f"{name}: B = {b}",
                                     marker=dict(symbol=sym, size=15 if sym == "star" else 12, color=C_KNEE,
                                                 line=dict(width=2)),
                                     hovertemplate=f"{name}: B = {b}<extra></extra>"))
    fig.update_layout(title=dict(text=f"lam = {table.lam:g}, T_fixed = {1000 * table.T_fixed:g} ms, t_req = "
                                      f"{1000 * table.t_req:g} ms", x=0))
    fig.update_xaxes(title_text="throughput capacity mu_eff(B) = B / T_svc(B) (req/s)")
    fig.update_yaxes(title_text="latency (ms)")
    I.log_buttons(fig, "y", log=True)
    return fig, drawn
