"""The fleet's figures: replicas over time, queue depth per pool and class, and the spike recovery.

Drawn for runs whose directory holds a pools series (``pools.parquet``, a fleet's
:class:`~llmqueue.records.PoolSeries`); a run without one gets none of them (and no note). Every
panel takes a list of runs and overlays them, labelled by their ``label`` (the directory name in a
comparison report), so that the variants of one experiment (an autoscaler's delay 0 / 2 / 5 min and
none) share one figure:

- ``replicas``: serving and provisioning replicas per pool over time (step lines; PNG ``replicas.png``);
- ``pool_queues``: waiting requests per pool and class over time;
- ``recovery``: the waiting queue (the whole fleet's, or the one pool's) with the spike window
  shaded and where it was back within its pre-spike range marked; the recovery time in the title
  (from ``summary.json``'s ``fleet.recovery``, :func:`llmqueue.metrics.fleet.recovery_time`;
  PNG ``recovery.png``).
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue.report import figures as F
from llmqueue.report import interactive as I

DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
MPL_DASHES = ["-", "--", ":", "-.", (0, (8, 3)), (0, (8, 3, 2, 3))]

TITLES = {"replicas": "Replicas over time", "pool_queues": "Queue depth per pool and class",
          "recovery": "Spike recovery"}


def has_pools(run) -> bool:
    p = getattr(run, "pools", None)
    return p is not None and len(p) > 0


def tracks(run) -> dict:
    from llmqueue.metrics.fleet import pool_tracks

    return pool_tracks(run.pools)


def _line(t, y, *, name, color, dash="solid", group=None, width=1.6, fmt=".0f"):
    import plotly.graph_objects as go

    return go.Scatter(x=I.arr(t), y=I.arr(y), mode="lines", name=name, legendgroup=group,
                      line=dict(color=color, dash=dash, width=width, shape="hv"),
                      hovertemplate=f"%{{y:{fmt}}}<extra>{name}</extra>")


def _runs_with_pools(runs) -> list:
    return [r for r in runs if has_pools(r)]


def _scale(runs) -> tuple[float, str]:
    t = np.concatenate([r.pools["t_s"] for r in runs])
    return I.time_scale(np.array([t.min(), t.max()]))


def _who(runs, r) -> str:
    return f" ({r.label})" if len(runs) > 1 else ""


def fleet_panels(runs, *, png: bool = True) -> list:
    """The fleet panels of ``runs`` (those with a pools series), or ``[]`` when none has one."""
    runs = _runs_with_pools(runs)
    if not runs:
        return []
    out = [replicas_panel(runs, png=png), pool_queue_panel(runs)]
    rec = recovery_panel(runs, png=png)
    if rec is not None:
        out.append(rec)
    return out


def _hue(keys: list, key, run: int) -> int:
    """A line's colour: one per pool (or pool and class) when there are several, else one per run
    (the runs of a comparison then differ in colour as well as in dash)."""
    return (keys.index(key) if len(keys) > 1 else run) % len(F.CYCLE)


def replicas_panel(runs, *, png: bool = True):
    """Serving (solid) and provisioning (dotted) replicas per pool over time: the number of servers
    of each station, as the autoscaler changed it."""
    fig = I.figure(hovermode="x unified")
    scale, unit = _scale(runs)
    pools = list(dict.fromkeys(p for r in runs for p in tracks(r)))
    for k, r in enumerate(runs):
        dash = DASHES[k % len(DASHES)]
        for p, tr in tracks(r).items():
            c = F.CYCLE[_hue(pools, p, k)]
            end = _end(r, tr["t_s"])
            t = np.append(tr["t_s"], end) / scale
            fig.add_trace(_line(t, np.append(tr["replicas"], tr["replicas"][-1]), name=f"{p} serving{_who(runs, r)}",
                                color=c, dash=dash, group=p))
            if tr["provisioning"].any():
                fig.add_trace(_line(t, np.append(tr["provisioning"], tr["provisioning"][-1]),
                                    name=f"{p} provisioning{_who(runs, r)}", color=c, dash="dot", width=1.1, group=p))
    fig.update_layout(title=dict(text=TITLES["replicas"], x=0))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="replicas", rangemode="tozero")
    caption = ("Replicas per pool over time, from the pools series: serving (taking requests) and provisioning "
               "(ordered by the autoscaler, starting, not serving yet; dotted). Each pool is a multi-server station "
               "whose number of servers changes over time.")
    if len(runs) > 1:
        caption += " Runs: " + ", ".join(f"{r.label} ({DASHES[k % len(DASHES)]})" for k, r in enumerate(runs)) + "."
    return I.Panel("replicas", TITLES["replicas"], fig, caption, png=replicas_figure(runs) if png else None)


def _end(run, t) -> float:
    h = (run.summary or {}).get("horizon_s")
    return float(h) if isinstance(h, (int, float)) and h >= t[-1] else float(t[-1])


def pool_queue_panel(runs):
    """Waiting requests per pool and class over time (one line each)."""
    fig = I.figure(hovermode="x unified")
    scale, unit = _scale(runs)
    keys = list(dict.fromkeys((p, c) for r in runs for p, tr in tracks(r).items() for c in tr["classes"]))
    for k, r in enumerate(runs):
        dash = DASHES[k % len(DASHES)]
        for p, tr in tracks(r).items():
            for c, d in tr["classes"].items():
                color = F.CYCLE[_hue(keys, (p, c), k)]
                fig.add_trace(_line(tr["t_s"] / scale, d["num_waiting"], name=f"{p} / {c}{_who(runs, r)}",
                                    color=color, dash=dash, group=f"{p}/{c}"))
    fig.update_layout(title=dict(text=TITLES["pool_queues"], x=0))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="requests waiting", rangemode="tozero")
    I.log_buttons(fig, "y")
    caption = ("Requests waiting per pool and class over time (the replicas' queues and the gateway's), from the pools "
               "series: the queue length L_q of each class at each station.")
    if len(runs) > 1:
        caption += " Runs: " + ", ".join(f"{r.label} ({DASHES[k % len(DASHES)]})" for k, r in enumerate(runs)) + "."
    return I.Panel("pool_queues", TITLES["pool_queues"], fig, caption)


def recovery_of(run) -> list:
    """``[(pool, recovery dict)]`` from the run's ``summary.json`` (``fleet.recovery``, one per pool;
    the whole fleet's ``"all"`` left out: each pool is drawn); ``[]`` without one."""
    rec = ((run.summary or {}).get("fleet") or {}).get("recovery")
    if not isinstance(rec, dict):
        return []
    return [(k, r) for k, r in rec.items() if k != "all" and isinstance(r, dict) and r.get("spike_s")]


def recovery_words(r: dict) -> str:
    if r.get("recovered") is True and isinstance(r.get("recovery_s"), (int, float)):
        return f"{r['recovery_s']:.4g} s"
    if r.get("recovered") is False:
        return "not recovered by the end"
    return "unknown"


def _recovery_title(have) -> str:
    many = len(have) > 1
    parts = []
    for r, recs in have:
        words = ", ".join(f"{p} {recovery_words(rec)}" if len(recs) > 1 else recovery_words(rec) for p, rec in recs)
        parts.append(f"{r.label}: {words}" if many else words)
    return f"{TITLES['recovery']}: " + "; ".join(parts)


def _waiting(run, pool: str):
    tr = tracks(run)[pool]
    return tr["t_s"], tr["num_waiting"]


def _have_recovery(runs) -> list:
    out = []
    for r in runs:
        trs = tracks(r)
        recs = [(p, rec) for p, rec in recovery_of(r) if p in trs]
        if recs:
            out.append((r, recs))
    return out


def recovery_panel(runs, *, png: bool = True):
    """Each pool's waiting queue around the spike: the spike window shaded, the pre-spike range's
    threshold dotted and the moment the queue was back within it (and stayed) marked; the recovery
    times in the title. None when no run's summary holds a recovery (no spike was given)."""
    import plotly.graph_objects as go

    have = _have_recovery(runs)
    if not have:
        return None
    fig = I.figure(hovermode="x unified")
    scale, unit = _scale([r for r, _ in have])
    spikes = []
    pools = list(dict.fromkeys(p for _, recs in have for p, _ in recs))
    for k, (r, recs) in enumerate(have):
        dash = DASHES[k % len(DASHES)]
        for p, rec in recs:
            color = F.CYCLE[_hue(pools, p, k)]
            t, w = _waiting(r, p)
            who = f"{p}{_who(have, r)}"
            fig.add_trace(_line(t / scale, w, name=f"waiting, {who}", color=color, dash=dash, group=who))
            s = tuple(rec["spike_s"])
            if s not in spikes:
                spikes.append(s)
                fig.add_vrect(x0=s[0] / scale, x1=s[1] / scale, fillcolor="#f4a3a3", opacity=0.3, line_width=0,
                              layer="below")
            if isinstance(rec.get("threshold"), (int, float)):
                fig.add_trace(go.Scatter(x=[t[0] / scale, t[-1] / scale], y=[rec["threshold"]] * 2, mode="lines",
                                         name=f"pre-spike range, {who} (<= {rec['threshold']:.3g})", legendgroup=who,
                                         line=dict(color=color, dash="dot", width=1), hoverinfo="skip"))
            at = rec.get("recovered_at_s")
            if rec.get("recovered") and isinstance(at, (int, float)):
                y = float(np.max(w)) if len(w) else 1.0
                fig.add_trace(go.Scatter(x=[at / scale, at / scale], y=[0, y], mode="lines",
                                         name=f"recovered at {at:.4g} s, {who}", legendgroup=who,
                                         line=dict(color=color, dash="dash", width=1.3),
                                         hovertemplate=f"recovered {rec['recovery_s']:.4g} s after the spike"
                                                       f"<extra>{who}</extra>"))
    fig.update_layout(title=dict(text=_recovery_title(have), x=0))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="requests waiting", rangemode="tozero")
    I.log_buttons(fig, "y")
    caption = ("Each pool's waiting queue around the load spike (shaded). During it the arrivals outpace the servers and "
               "work piles up; afterwards it drains at the service rate's excess over the arrivals. Recovery time: "
               "from the spike's end until the queue is back within its pre-spike range (dotted: the maximum over the "
               "window of the spike's length before it, times 1.1 or plus one request) and stays there for the hold "
               "time (dashed: that moment). A queue not back by the end of the run is said to be so.")
    return I.Panel("recovery", TITLES["recovery"], fig, caption, png=recovery_figure(have) if png else None)


def compare_queue_panel(runs):
    """Waiting requests over time of several runs (summed over replicas), one line each; None when no
    run has a queue series."""
    from llmqueue.report import series

    qs = [(r, q) for r in runs if (q := series.queue_series(r)) is not None]
    if not qs:
        return None
    fig = I.figure(hovermode="x unified")
    scale, unit = I.time_scale(np.concatenate([[q[0][0], q[0][-1]] for _, q in qs]))
    for k, (r, q) in enumerate(qs):
        fig.add_trace(_line(q[0] / scale, q[1], name=f"waiting ({r.label})", color=F.CYCLE[k % len(F.CYCLE)]))
    fig.update_layout(title=dict(text="Waiting requests over time", x=0))
    fig.update_xaxes(title_text=f"time ({unit})")
    fig.update_yaxes(title_text="requests waiting", rangemode="tozero")
    I.log_buttons(fig, "y")
    caption = ("Requests waiting over time in each run, summed over replicas (from each run's "
               + ", ".join(sorted({q[3] for _, q in qs})) + ").")
    return I.Panel("queues", "Waiting requests", fig, caption)


# -- static (matplotlib) -----------------------------------------------------------------------------

def replicas_figure(runs):
    """PNG twin of :func:`replicas_panel`."""
    fig, (ax,) = F._figure()
    scale, unit = _scale(runs)
    pools = list(dict.fromkeys(p for r in runs for p in tracks(r)))
    for k, r in enumerate(runs):
        ls = MPL_DASHES[k % len(MPL_DASHES)]
        for p, tr in tracks(r).items():
            c = F.CYCLE[_hue(pools, p, k)]
            t = np.append(tr["t_s"], _end(r, tr["t_s"])) / scale
            ax.step(t, np.append(tr["replicas"], tr["replicas"][-1]), where="post", color=c, ls=ls, lw=1.3,
                    label=f"{p} serving{_who(runs, r)}")
            if tr["provisioning"].any():
                ax.step(t, np.append(tr["provisioning"], tr["provisioning"][-1]), where="post", color=c, ls=":",
                        lw=1.0, alpha=0.8, label=f"{p} provisioning{_who(runs, r)}")
    ax.set_xlabel(f"time ({unit})", fontsize=9)
    ax.set_ylabel("replicas", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.set_title(TITLES["replicas"], fontsize=10, loc="left")
    ax.legend(fontsize=7, loc="best", ncols=2)
    return fig


def recovery_figure(have):
    """PNG twin of :func:`recovery_panel` (``have``: ``(run, [(pool, recovery)])`` pairs)."""
    fig, (ax,) = F._figure()
    scale, unit = _scale([r for r, _ in have])
    spans = set()
    pools = list(dict.fromkeys(p for _, recs in have for p, _ in recs))
    for k, (r, recs) in enumerate(have):
        ls = MPL_DASHES[k % len(MPL_DASHES)]
        for p, rec in recs:
            color = F.CYCLE[_hue(pools, p, k)]
            t, w = _waiting(r, p)
            ax.step(t / scale, w, where="post", color=color, ls=ls, lw=1.2, label=f"waiting, {p}{_who(have, r)}")
            s = tuple(rec["spike_s"])
            if s not in spans:
                spans.add(s)
                ax.axvspan(s[0] / scale, s[1] / scale, color="#f4a3a3", alpha=0.35, linewidth=0)
            if isinstance(rec.get("threshold"), (int, float)):
                ax.axhline(rec["threshold"], color=color, ls=":", lw=0.9)
            at = rec.get("recovered_at_s")
            if rec.get("recovered") and isinstance(at, (int, float)) and math.isfinite(at):
                ax.axvline(at / scale, color=color, ls="--", lw=1.1)
    ax.set_title(_recovery_title(have), fontsize=9, loc="left")
    ax.set_xlabel(f"time ({unit})", fontsize=9)
    ax.set_ylabel("requests waiting", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="best")
    return fig
