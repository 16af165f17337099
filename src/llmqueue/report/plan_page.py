"""The page of a plan directory (``llmqueue plan --out DIR``; ``llmqueue report DIR``).

From ``plan.json`` (:meth:`llmqueue.plan.planner.PlanResult.to_dict`):

- the recommendation: the deployment, its cost per hour and per million output tokens, its
  simulated p99s with their 95% confidence intervals, the theory's load ``rho = lam / rate
  bound``, where the step model came from, how many configurations theory pruned and how many
  were simulated (and resumed from the cache);
- the **frontier** (``plan_frontier``): cost per hour against the simulated p99 TTFT and p99
  TPOT, one point per simulated configuration (filled when it met the SLOs, open when it failed),
  the cost/latency Pareto frontier as a step line, the recommendation as a star, the SLO target
  as a dashed line, and the configurations theory pruned at their single-request latency bound
  (grey crosses: a lower bound, not a simulation; a pruned configuration without one is counted
  in the caption); also written as PNG;
- the **sensitivity** table (the recommendation under +20% traffic, burstier arrivals, a spike, a
  10% slower engine) and its **margin** (the highest rate still meeting the SLOs);
- the frontier's points as a table.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmqueue.errors import InputError
from llmqueue.report import html as H
from llmqueue.report.page import fig, write

PLAN_FILE = "plan.json"
METRICS = (("p99_ttft_ms", "TTFT", "ttft_bound_ms"), ("p99_tpot_ms", "TPOT", "tpot_bound_ms"))


def load_plan(plan_dir) -> dict:
    """``plan.json`` of a plan directory (or the file itself) as a dict."""
    p = Path(plan_dir)
    f = p / PLAN_FILE if p.is_dir() else p
    try:
        d = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise InputError("RUN_OR_SWEEP_DIR", f"cannot read {f}: {e}", "give the --out directory of llmqueue plan")
    if not isinstance(d, dict) or "candidates" not in d:
        raise InputError("RUN_OR_SWEEP_DIR", f"{f} is not a plan (no candidates)", "give the --out directory of "
                         "llmqueue plan")
    return d


def deployment_label(c: dict) -> str:
    who = (f"P:D {c['disaggregate']}" if c.get("disaggregate") else f"{c.get('replicas')} x")
    model = f"{c['model']} on " if c.get("model") else ""
    return (f"{model}{who} {c.get('gpu')} tp{c.get('tensor_parallel_size')}, max_num_seqs {c.get('max_num_seqs')}, "
            f"max_num_batched_tokens {c.get('max_num_batched_tokens')}, {c.get('router')}")


def _sim(c: dict, key: str):
    s = c.get("simulation") or {}
    return s.get(key)


def frontier_points(d: dict) -> dict:
    """The points of the frontier figure by kind: ``met``, ``failed`` (simulated), ``pruned``
    (with a latency bound for ``metric``), and the recommendation."""
    cands = d["candidates"]
    return {"met": [c for c in cands if c["status"] == "simulated" and _sim(c, "meets")],
            "failed": [c for c in cands if c["status"] == "simulated" and not _sim(c, "meets")],
            "pruned": [c for c in cands if c["status"] == "pruned"],
            "recommended": d.get("recommended")}


def frontier_panel(d: dict):
    """The interactive cost / p99 figure (two columns: TTFT, TPOT) and its matplotlib twin."""
    from llmqueue.report import interactive as I

    pts = frontier_points(d)
    fig = I.figure(1, 2, titles=["p99 TTFT (ms)", "p99 TPOT (ms)"], height=440)
    slos = d.get("slos") or {}
    for col, (key, name, bound) in enumerate(METRICS, start=1):
        show = col == 1
        pr = [c for c in pts["pruned"] if c.get(bound) is not None]
        if pr:
            fig.add_scatter(x=[c["cost_per_hour"] for c in pr], y=[c[bound] for c in pr], mode="markers",
                            name="pruned by theory (at its single-request bound)", legendgroup="pruned",
                            showlegend=show, marker=dict(symbol="x-thin", size=8, color="#999999",
                                                         line=dict(width=1.5, color="#999999")),
                            text=[f"{deployment_label(c)}<br>{c.get('reason')}" for c in pr],
                            hovertemplate="$%{x:.2f}/h, bound %{y:.4g} ms<br>%{text}<extra>pruned</extra>",
                            row=1, col=col)
        for kind, colour, symbol, label in (("failed", "#d62728", "circle-open", "simulated, failed the SLOs"),
                                            ("met", "#2ca02c", "circle", "simulated, met the SLOs")):
            cs = [c for c in pts[kind] if _sim(c, key) is not None]
            if not cs:
                continue
            fig.add_scatter(x=[c["cost_per_hour"] for c in cs], y=[_sim(c, key) for c in cs], mode="markers",
                            name=label, legendgroup=kind, showlegend=show,
                            marker=dict(symbol=symbol, size=10, color=colour, line=dict(width=2, color=colour)),
                            text=[f"{deployment_label(c)}<br>{c.get('reason') or 'meets'}" for c in cs],
                            hovertemplate=f"$%{{x:.2f}}/h, p99 {name} %{{y:.4g}} ms<br>%{{text}}<extra></extra>",
                            row=1, col=col)
        front = d.get(f"pareto_cost_vs_{key[:-3]}") or []
        if front:
            fig.add_scatter(x=[p["cost_per_hour"] for p in front], y=[p[key] for p in front], mode="lines",
                            line=dict(shape="hv", color="#1f77b4", width=1.5), name="Pareto frontier (cost, p99)",
                            legendgroup="front", showlegend=show, hoverinfo="skip", row=1, col=col)
        rec = pts["recommended"]
        if rec is not None and _sim(rec, key) is not None:
            fig.add_scatter(x=[rec["cost_per_hour"]], y=[_sim(rec, key)], mode="markers", name="recommended",
                            legendgroup="rec", showlegend=show,
                            marker=dict(symbol="star", size=18, color="#ff7f0e", line=dict(width=1, color="black")),
                            text=[deployment_label(rec)], hovertemplate="%{text}<extra>recommended</extra>",
                            row=1, col=col)
        if key in slos:
            fig.add_hline(y=slos[key], line_dash="dash", line_color="#444444", row=1, col=col,
                          annotation_text=f"SLO {slos[key]:g} ms", annotation_position="top left")
        fig.update_xaxes(title_text="cost (USD/h)", row=1, col=col)
    I.log_buttons(fig, "y", log=True)
    n_pruned = len(pts["pruned"])
    drawn = sum(c.get("ttft_bound_ms") is not None for c in pts["pruned"])
    caption = (f"Cost per hour against the simulated p99 TTFT (left) and p99 TPOT (right) of the "
               f"{len(pts['met']) + len(pts['failed'])} simulated configurations: filled green met the SLOs, open "
               f"red failed them; the star is the recommendation, the blue step line the cost/p99 Pareto frontier, "
               f"the dashed line the SLO target. Grey crosses: {drawn} of the {n_pruned} configurations theory "
               f"pruned, drawn at their single-request latency bound (a lower bound, not a simulation); "
               f"{d.get('not_needed', 0)} configurations were not needed (a cheaper one was verified first).")
    return I.Panel("plan_frontier", "Cost against p99 latency", fig, caption, png=frontier_png(d, pts))


def frontier_png(d: dict, pts: dict):
    """The frontier figure in matplotlib (the PNG twin)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (key, name, bound) in zip(axes, METRICS):
        pr = [c for c in pts["pruned"] if c.get(bound) is not None]
        ax.scatter([c["cost_per_hour"] for c in pr], [c[bound] for c in pr], marker="x", color="#999999",
                   label="pruned (bound)")
        for kind, style in (("failed", dict(facecolors="none", edgecolors="#d62728", label="failed")),
                            ("met", dict(color="#2ca02c", label="met"))):
            cs = [c for c in pts[kind] if _sim(c, key) is not None]
            ax.scatter([c["cost_per_hour"] for c in cs], [_sim(c, key) for c in cs], s=40, **style)
        front = d.get(f"pareto_cost_vs_{key[:-3]}") or []
        if front:
            ax.step([p["cost_per_hour"] for p in front], [p[key] for p in front], where="post", color="#1f77b4",
                    lw=1, label="frontier")
        rec = pts["recommended"]
        if rec is not None and _sim(rec, key) is not None:
            ax.scatter([rec["cost_per_hour"]], [_sim(rec, key)], marker="*", s=250, color="#ff7f0e",
                       edgecolors="black", label="recommended", zorder=5)
        target = (d.get("slos") or {}).get(key)
        if target is not None:
            ax.axhline(target, ls="--", color="#444444", lw=1, label=f"SLO {target:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("cost (USD/h)")
        ax.set_ylabel(f"p99 {name} (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def summary_table(d: dict) -> H.Table:
    t = H.Table(["recommendation", ""])
    rec = d.get("recommended")
    t.add("SLO targets", ", ".join(f"{k} <= {v:g}" for k, v in (d.get("slos") or {}).items()))
    t.add("arrival rate lam (req/s)", d.get("lam"))
    if rec is None:
        t.add("recommended", "none: every simulated survivor of theory failed the SLOs")
    else:
        s = rec.get("simulation") or {}
        t.add("deployment", deployment_label(rec))
        t.add("GPUs", rec.get("gpus"))
        if rec.get("disaggregate"):
            t.add("KV link", f"{H.num(rec.get('kv_link_gbps'))} Gbit/s + {H.num(rec.get('kv_link_latency_ms'))} ms")
        t.add("cost (USD/h)", rec.get("cost_per_hour"))
        t.add("cost per million output tokens (USD)", s.get("cost_per_million_output_tokens"))
        for k in d.get("slos") or {}:
            t.add(f"simulated {k} [95% CI]", H.Raw(H.with_ci(s.get(k), s.get(k + "_ci"))))
        t.add("verdict", str(s.get("verdict", "-")))
        t.add("theory: rho = lam / rate bound", f"{H.num(rec.get('rho'))} (rate bound {H.num(rec.get('rate_bound'))} "
                                                f"req/s, {rec.get('binding')} binds)")
    src = d.get("workload_source") or {}
    if src.get("kind") in ("trace", "fitted workload"):
        t.add("workload", f"{src['kind']} {src.get('path')}" + (f": replays {src['replayed']}" if src.get("replayed")
                                                               else f": arrival {src.get('arrival')}"))
    if len(d.get("models") or ()) > 1:
        t.add("models searched", ", ".join(d["models"]) + " (quality not judged: the cheapest meeting the SLOs wins)")
    t.add("step model", str(d.get("step_model_source") or "-"))
    t.add("configurations", f"{d.get('configurations')}: {d.get('pruned')} pruned by theory, {d.get('simulated')} "
                            f"simulated, {d.get('not_needed')} not needed")
    r = d.get("resumed") or {}
    if r.get("cached"):
        t.add("resumed", f"{r['cached']} of {r.get('points')} points from the cache")
    t.add("wall (s)", d.get("wall_s"))
    t.add("scenario, seed, simulated seconds each", f"{d.get('scenario')}, {d.get('seed')}, {H.num(d.get('duration_s'))}")
    return t


def sensitivity_table(sens: dict, lam) -> H.Table:
    t = H.Table(["case", "p99 TTFT (ms) [95% CI]", "p99 TPOT (ms) [95% CI]", "meets", "failed share", "verdict"])
    for r in sens.get("rows") or []:
        if r.get("refused"):
            t.add(r["case"], "-", "-", "refused", "-", str(r["refused"]))
            continue
        t.add(r["case"], H.Raw(H.with_ci(r.get("p99_ttft_ms"), r.get("p99_ttft_ms_ci"))),
              H.Raw(H.with_ci(r.get("p99_tpot_ms"), r.get("p99_tpot_ms_ci"))), "yes" if r.get("meets") else "no",
              "-" if r.get("failed_share") is None else f"{100 * r['failed_share']:.3g}%", str(r.get("verdict") or "-"))
    m = sens.get("margin_rate")
    t.add("margin", H.Raw(H.esc(f"meets the SLOs up to {H.num(m)} req/s = {H.num(sens.get('margin_factor'))} x lam "
                                f"{H.num(lam)}" if m is not None else "no rate found that meets the SLOs")),
          "", "", "", "")
    return t


def frontier_table(d: dict) -> H.Table:
    t = H.Table(["frontier", "deployment", "cost (USD/h)", "p99 TTFT (ms)", "p99 TPOT (ms)", "meets"])
    for key, name in (("pareto_cost_vs_p99_ttft", "cost vs p99 TTFT"), ("pareto_cost_vs_p99_tpot", "cost vs p99 TPOT")):
        for p in d.get(key) or []:
            t.add(name, deployment_label(p),
                  p.get("cost_per_hour"), p.get("p99_ttft_ms"), p.get("p99_tpot_ms"), "yes" if p.get("meets") else "no")
    return t


def plan_report(plan_dir, out, *, png_dir=None, title: str | None = None):
    """Write the page of the plan in ``plan_dir`` to ``out`` (an ``.html`` path); a
    :class:`~llmqueue.report.page.Report`."""
    d = load_plan(plan_dir)
    panel = frontier_panel(d)
    body = [H.section("Plan", summary_table(d).html(), anchor="plan"),
            H.section(panel.title, fig(panel.name), anchor=panel.name)]
    sens = d.get("sensitivity")
    if sens:
        body.append(H.section("Sensitivity of the recommendation", H.para(
            f"The recommendation simulated with one thing changed each ({H.num(sens.get('duration_s'))} s each); the "
            "margin is the highest arrival rate (the scenario's process rescaled) at which it still meets the SLOs."),
            sensitivity_table(sens, d.get("lam")).html(), anchor="sensitivity"))
    else:
        body.append(H.para("No sensitivity rows: the plan ran with --no-sensitivity (or found no recommendation)."))
    body.append(H.section("Pareto frontier", frontier_table(d).html(), anchor="frontier"))
    src = Path(plan_dir)
    return write("plan", out, png_dir, title or f"llmqueue plan report: {src.resolve().name}",
                 f"plan directory {src} ({d.get('configurations')} configurations)", body, [panel], source=str(src))
