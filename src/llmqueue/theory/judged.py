"""What the closed forms judge, and why a verdict can differ from the simulation's.

The capacity bounds of :mod:`llmqueue.theory.prediction` compare one arrival rate ``lam`` with
``mu``. A long-run mean can hide what overloads a deployment, so the theory section also says:

- **the peak**: for a time-varying arrival (a spike, a daily cycle, piecewise rates) the largest
  rate held over a window of :data:`PEAK_WINDOW_S` seconds, ``lam_peak = max_t (Lambda(t + W) -
  Lambda(t)) / W`` from the process's own cumulative intensity ``Lambda``; for an on/off source
  the on state's rate (held for an exponential period of mean ``on``); for arrivals with no
  single process (a replayed trace, per-class streams) the busiest window of the arrivals.
  ``rho_peak = lam_peak / mu``: a queue fed at ``rho_peak >= 1`` grows at ``lam_peak - mu``
  while the peak lasts, whatever the mean;
- **retries**: each retry is a new arrival, so the offered load is ``A lam`` with ``A`` the
  attempts per user request (:func:`llmqueue.metrics.fleet.retry_amplification`, measured on the
  simulated records: the closed forms have no model of when a client gives up);
- **per pool** (:func:`pool_theory`): a fleet of several pools is judged pool by pool, each with
  its own engine, step-time model and replicas, fed the arrivals the simulated routing sent it;
  a P/D fleet as a tandem (:mod:`llmqueue.theory.pd`: prefill pool, KV link, decode pool);
- **why they differ** (:func:`reconcile`): when the theory's verdict on the mean says stable and
  the simulation says overloaded or unstable (or the reverse), the reasons found on the same
  screen (the peak, the retries, a pool, the clients' timeouts), never a silent contradiction.
"""

from __future__ import annotations

import math

import numpy as np

PEAK_WINDOW_S = 60.0   # the window over which a peak rate must hold to be judged (s)


def peak_rate(arrival, arrival_s, horizon_s: float | None, window_s: float = PEAK_WINDOW_S) -> dict | None:
    """The peak arrival rate (req/s) over a ``window_s`` window within ``[0, horizon_s]``, with
    where it is: ``{"lam_peak", "t0", "t1", "source"}``; None for a stationary process (Poisson,
    Gamma, deterministic: the mean is the rate at every time) or too few arrivals."""
    from llmqueue.workload.arrivals import OnOff
    from llmqueue.workload.nonstationary import TimeVarying

    a = np.asarray(arrival_s, dtype=np.float64)
    H = float(horizon_s) if horizon_s is not None else (float(a[-1]) if len(a) else 0.0)
    if not H > 0:
        return None
    W = min(window_s, H)
    if isinstance(arrival, OnOff):
        return {"lam_peak": float(arrival.rate_on), "t0": None, "t1": None,
                "source": f"the on state (exponential periods of mean {arrival.on:g} s)"}
    if isinstance(arrival, TimeVarying):
        t = np.linspace(0.0, H - W, max(2, min(20_000, int(math.ceil((H - W) / (W / 8))) + 1)))
        starts = getattr(arrival, "starts", None)
        if starts is not None:   # piecewise: a window beginning at a level's start holds it longest
            s = np.asarray(starts, dtype=np.float64)
            t = np.unique(np.concatenate([t, s[(s >= 0) & (s <= H - W)]]))
        r = (np.asarray(arrival.cumulative(t + W)) - np.asarray(arrival.cumulative(t))) / W
        k = int(np.argmax(r))
        return {"lam_peak": float(r[k]), "t0": float(t[k]), "t1": float(t[k] + W),
                "source": f"the busiest {W:g}-s window of the rate function"}
    if arrival is not None or len(a) < 20:
        return None
    # no single process (a trace, per-class streams): the busiest window, counted
    j = np.searchsorted(a, a + W, side="left") - np.arange(len(a))
    j[a + W > H] = 0
    k = int(np.argmax(j))
    if j[k] <= 0:
        return None
    return {"lam_peak": float(j[k]) / W, "t0": float(a[k]), "t1": float(a[k] + W),
            "source": f"the busiest {W:g}-s window of the arrivals"}


def judge_peak(out: dict, peak: dict | None, replicas: int) -> None:
    """Add the peak's figures to a theory section ``out`` (which holds ``mu``): ``lam_peak`` (per
    replica, as ``lam``), ``rho_peak`` and ``verdict_peak``."""
    if peak is None or not out.get("mu"):
        return
    lam_p = peak["lam_peak"] / max(replicas, 1)
    rho = lam_p / out["mu"]
    where = peak["source"] + (f", t = {peak['t0']:.0f}-{peak['t1']:.0f} s" if peak.get("t0") is not None else "")
    out.update(lam_peak=lam_p, rho_peak=rho, peak_source=where,
               verdict_peak="stable" if rho < 1 else f"overloaded while the peak lasts (queue grows "
                                                     f"{(lam_p - out['mu']) * max(replicas, 1):.3g} req/s)")


def judge_retries(out: dict, amplification: float | None) -> None:
    """The offered load with retries: ``rho_offered = A rho`` (``A`` attempts per user request)."""
    if amplification is None or not amplification > 1.005 or out.get("rho") is None:
        return
    out.update(retry_amplification=amplification, rho_offered=out["rho"] * amplification)
    if out.get("rho_peak") is not None:
        out["rho_peak_offered"] = out["rho_peak"] * amplification


def _stable(v) -> bool:
    return isinstance(v, str) and v.startswith("stable")


def reconcile(theory: dict, summary: dict) -> str | None:
    """One line saying why the theory's verdict and the simulation's differ, or None when they
    agree. Reasons looked for, in order: the peak (``rho_peak >= 1``), the retries' offered load,
    a pool over its capacity, the clients' timeouts (failures while every rho is below one: the
    wait's tail, not its mean, passes the client's patience), a run too short for a queue that
    theory says grows."""
    sim = str(summary.get("verdict") or "")
    th = theory.get("verdict")
    bad_sim = sim.startswith(("overloaded", "unstable"))
    if th is None or th.startswith("indeterminate"):
        return None
    if _stable(th) == (not bad_sim):
        return None
    reasons = []
    if _stable(th):
        if (theory.get("rho_peak") or 0) >= 1:
            reasons.append(f"theory's 'stable' judges the mean rate; at the peak ({theory.get('peak_source')}) "
                           f"rho is {theory['rho_peak']:.3g}")
        if (theory.get("rho_offered") or 0) >= 1 or (theory.get("rho_peak_offered") or 0) >= 1:
            reasons.append(f"retries ({theory['retry_amplification']:.3g} attempts per request) raise the offered "
                           f"rho to {theory.get('rho_offered', 0):.3g}"
                           + (f" ({theory['rho_peak_offered']:.3g} at the peak)" if theory.get("rho_peak_offered")
                              else ""))
        for name, p in (theory.get("pools") or {}).items():
            if p.get("rho") is not None and (p["rho"] >= 1 or (p.get("rho_peak") or 0) >= 1):
                reasons.append(f"pool {name} at rho {p['rho']:.3g}" + (
                    f" ({p['rho_peak']:.3g} at the peak)" if p.get("rho_peak") is not None else ""))
        counts = summary.get("status_counts") or {}
        if not reasons and counts.get("timeout"):
            reasons.append(f"{counts['timeout']} requests timed out with every rho below one: the wait's tail "
                           "(not its mean, which the bounds judge) passes the clients' timeout")
        if not reasons:
            reasons.append("the bounds judge the long-run rate against capacity; this run's failures "
                           "(" + ", ".join(f"{k} {v}" for k, v in counts.items() if v and k != "ok")
                           + ") come from transients they do not model")
        return "; ".join(reasons)
    if th.startswith("unstable") or th.startswith("overloaded"):
        return ("theory's rho >= 1 makes the queue grow without bound, but slowly: the simulated horizon "
                "ended before it showed (a longer --duration will)")
    return None


def pools_verdict(pools: dict) -> str:
    """The fleet's verdict from its pools' (or stages'): stable when every one is, else the
    worst one named with its rho."""
    judged = {n: p for n, p in pools.items() if p.get("rho") is not None}
    if not judged:
        return "indeterminate (no pool could be judged)"
    name, worst = max(judged.items(), key=lambda kv: kv[1]["rho"])
    if worst["rho"] < 1:
        return f"stable (every pool below rho 1; the highest: {name} at {worst['rho']:.3g})"
    return f"unstable: pool {name} at rho {worst['rho']:.3g}"


def pool_theory(spec, requests, recs: dict, *, warmup_s: float, horizon_s: float | None) -> dict | None:
    """Per-pool closed forms for a fleet of several pools (``spec.fleet``): each pool ``p`` is
    judged as ``c_p`` replicas of its own engine with ``lam_p`` = the attempts the simulated
    routing sent it in the window, over the window, and the prompt and output lengths those
    requests asked for; a P/D fleet as the tandem of :mod:`llmqueue.theory.pd`. ``recs``: the
    simulated request records' columns. None for one pool."""
    fleet = spec.fleet
    if fleet is None or (len(fleet.pools) < 2 and fleet.disaggregation is None) or "pool" not in recs:
        return None
    arr = np.asarray(recs["arrival_s"], dtype=np.float64)
    t1 = float(horizon_s) if horizon_s is not None else (float(arr.max()) if len(arr) else 0.0)
    t0 = min(float(warmup_s or 0.0), t1)
    span = t1 - t0
    if not span > 0:
        return None
    ids = np.asarray(requests.request_id)
    order = np.argsort(ids, kind="stable")
    pos = order[np.clip(np.searchsorted(ids[order], np.asarray(recs["request_id"])), 0, len(ids) - 1)]
    s_all = np.asarray(requests.prompt_tokens, dtype=np.float64)[pos]
    o_all = np.asarray(requests.output_tokens, dtype=np.float64)[pos]
    pool_col = np.asarray(recs["pool"]).astype(str)
    inwin = (arr >= t0) & (arr < t1)
    if fleet.disaggregation is not None:
        return _pd_theory(spec, s_all[inwin], o_all[inwin], float(inwin.sum()) / span)
    out = {}
    for p in fleet.pools:
        m = inwin & (pool_col == p.name)
        n = int(m.sum())
        if n == 0:
            out[p.name] = {"lam": 0.0, "note": "no requests routed here in the window"}
            continue
        out[p.name] = _one_pool(p, s_all[m], o_all[m], n / span, spec.kv_unlimited)
    return out


def _one_pool(pool, s, o, lam_pool: float, kv_unlimited: bool) -> dict:
    from llmqueue.engine.step_model import constant_step
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.theory.replica import replica_capacity, saturated_capacity

    cfg, model, c = pool.config, parse_step_time(pool.step_time), max(pool.replicas, 1)
    lam = lam_pool / c
    kw = dict(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens, prompt_tokens=s,
              output_tokens=o, M=None if kv_unlimited else cfg.capacity_tokens, lam=lam)
    b = constant_step(model)
    cap = replica_capacity(b=b, **kw) if b is not None else saturated_capacity(model.base, **kw)
    if cap is None:
        return {"lam": lam, "replicas": c, "note": "no capacity point found for this step-time model"}
    return {"lam": lam, "replicas": c, "b": cap.b, "mu": cap.mu, "binding": cap.binding, "rho": cap.rho,
            "verdict": cap.verdict}


def _pd_theory(spec, s, o, lam: float) -> dict:
    """The tandem's stations for a P/D fleet at total arrival rate ``lam``."""
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.theory import pd

    d = spec.fleet.disaggregation
    pools = {p.name: p for p in spec.fleet.pools}
    P, D = pools[d.prefill], pools[d.decode]
    out = {}
    q = float(np.mean(o > 1)) if len(o) else 0.0
    for name, pool, role in ((d.prefill, P, "prefill"), (d.decode, D, "decode")):
        cfg = pool.config
        base = parse_step_time(pool.step_time).base
        M = math.inf if spec.kv_unlimited else float(cfg.capacity_tokens)
        if role == "prefill":
            cap = pd.prefill_capacity(base, M=M, max_num_seqs=cfg.max_num_seqs,
                                      max_num_batched_tokens=cfg.max_num_batched_tokens, prompt_tokens=s,
                                      long_prefill_token_threshold=cfg.long_prefill_token_threshold)
            lam_st = lam / max(pool.replicas, 1)
        else:
            cap = pd.decode_capacity(base, M=M, max_num_seqs=cfg.max_num_seqs,
                                     max_num_batched_tokens=cfg.max_num_batched_tokens, prompt_tokens=s,
                                     output_tokens=o)
            lam_st = q * lam / max(pool.replicas, 1)
        if cap is None:
            out[name] = {"lam": lam_st, "replicas": pool.replicas, "stage": role, "note": "no capacity point found"}
            continue
        rho = lam_st / cap.mu
        out[name] = {"lam": lam_st, "replicas": pool.replicas, "stage": role, "b": cap.b, "mu": cap.mu,
                     "binding": cap.binding, "rho": rho, "verdict": "stable" if rho < 1 else "unstable"}
    kvb = P.kv_bytes_per_token
    if kvb and not math.isinf(d.kv_link_gbps):
        cap_l = pd.link_capacity(gbps=d.kv_link_gbps, kv_bytes_per_token=kvb, prompt_tokens=s, output_tokens=o)
        if cap_l and not math.isinf(cap_l):
            rho = q * lam / cap_l
            out["KV link"] = {"lam": q * lam, "stage": "transfer", "mu": cap_l, "rho": rho,
                              "verdict": "stable" if rho < 1 else "unstable"}
    return out


def jackson_tandem(spec) -> dict | None:
    """The P/D fleet as a Jackson tandem where that is exact: Poisson arrivals at ``lam``, one
    prompt step and one decode step per request (a prompt within the token budget, two output
    tokens), one request at a time (``max_num_seqs`` 1) with exponential steps of mean ``b`` on
    both pools, each pool one replica or ``c`` behind a central queue. Each station is then M/M/c
    (Erlang C, :func:`llmqueue.theory.classic.mmc`; M/M/1 for one replica) and, by Burke's
    theorem, feeds the next a Poisson stream; the link is an M/D/1 server of service
    ``S = beta s / r`` plus its latency (a pure delay when ``S`` is negligible). Mean E2EL
    ``= W_P + (Wq_L + S + latency) + W_D``. Returns ``{"model", "mean_e2el_ms", "stations"}``,
    or None when the fleet is not that network (batching stations have no such closed form;
    their capacities are the pools' rows)."""
    from llmqueue.cluster.routers import ROUTERS
    from llmqueue.engine.step_model import constant_step
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.theory.classic import mmc
    from llmqueue.theory.pd import link_rate
    from llmqueue.workload.arrivals import Poisson
    from llmqueue.workload.lengths import Fixed

    d, wl = spec.fleet.disaggregation, spec.workload
    arrival = getattr(wl, "arrival", None) if wl is not None else None
    p, o = getattr(wl, "prompt", None), getattr(wl, "output", None)
    if not (isinstance(arrival, Poisson) and isinstance(p, Fixed) and isinstance(o, Fixed) and o.mean() == 2):
        return None
    lam, s = float(arrival.rate), float(p.mean())
    pools = {x.name: x for x in spec.fleet.pools}
    stations, total = {}, 0.0
    for name in (d.prefill, d.decode):
        pool = pools[name]
        model = parse_step_time(pool.step_time)
        b = constant_step(model)
        c = max(pool.replicas, 1)
        router = pool.router
        central = getattr(ROUTERS.get(router) if isinstance(router, str) else router, "central", False)
        if (b is None or getattr(model, "noise", "none") != "exp" or pool.config.max_num_seqs != 1
                or s > pool.config.max_num_batched_tokens or (c > 1 and not central)):
            return None
        if lam >= c / b:
            return {"model": "Jackson tandem", "stable": False, "note": f"pool {name}: lam >= c / b"}
        r = mmc(lam=lam, mu=1.0 / b, c=c)
        stations[name] = {"model": f"M/M/{c}", "mean_ms": r.W * 1e3}
        total += r.W
    S = pools[d.prefill].kv_bytes_per_token * s / link_rate(d.kv_link_gbps)
    if lam * S >= 1:
        return {"model": "Jackson tandem", "stable": False, "note": "KV link: lam S >= 1"}
    link = lam * S * S / (2 * (1 - lam * S)) + S + d.kv_link_latency_ms / 1e3
    stations["KV link"] = {"model": "M/D/1 + latency", "mean_ms": link * 1e3}
    total += link
    return {"model": "Jackson tandem (prefill -> KV link -> decode)", "mean_e2el_ms": total * 1e3,
            "stations": stations}


def indeterminate_text(theory: dict, margin: dict | None) -> str | None:
    """For a theory verdict of "indeterminate" (``lam`` inside seed 004's gap ``[mu (1 - delta),
    mu]``, where the theorems decide nothing: a path may or may not preempt), the line that says
    so with the gap and names what decides it: the simulator's margin verdict (``--margin``), or
    how to get it. None for any other verdict."""
    if theory.get("verdict") != "indeterminate" or not theory.get("mu"):
        return None
    mu, d = theory["mu"], theory.get("delta") or 0.0
    text = (f"indeterminate: lam {theory.get('lam', float('nan')):.4g} lies inside seed 004's gap "
            f"[mu (1 - delta), mu] = [{mu * (1 - d):.4g}, {mu:.4g}] req/s, which the theorems do not decide")
    if margin is None:
        return text + "; the simulator decides it: --margin 0.1 measures this path's distance to the cliff"
    return text + f"; the simulator's margin: {margin.get('regime')}"


def with_patience(theory: dict, patience: dict, *, max_num_seqs: int) -> None:
    """Erlang A beside the verdict when the clients are impatient (``theory["abandonment"]``).

    One replica whose capacity binds at ``max_num_seqs`` is ``c = max_num_seqs`` servers, each
    serving at ``mu_seqs / c`` (a slot holds one request for its whole service); with every
    class's clients exponentially patient with one mean ``1/theta``, the queue is M/M/c+M
    (:func:`llmqueue.theory.abandonment.erlang_a`): stable at any load, the excess leaving.
    Another binding (the KV cache, the token budget) or another patience law: a note, no figure."""
    laws = {(p.law.kind, p.law.a) for p in patience.values()}
    lam, mu, binding = theory.get("lam"), theory.get("mu_seqs"), theory.get("binding")
    if len(laws) != 1 or next(iter(laws))[0] != "exp" or not lam or not mu or binding != "max_num_seqs":
        theory["abandonment"] = {"note": "the clients' patience bounds the queue (those not served in time leave); "
                                 "Erlang A applies with one exponential patience and max_num_seqs binding"}
        return
    from llmqueue.theory.abandonment import erlang_a

    theta = 1.0 / next(iter(laws))[1]
    c = int(max_num_seqs)
    r = erlang_a(lam=lam, mu=mu / c, c=c, theta=theta)
    theory["abandonment"] = {"model": f"M/M/{c}+M (Erlang A: {c} slots at mu_seqs / {c}, patience exp mean "
                                      f"{1 / theta:g} s)", "c": c, "mu": mu / c, "theta": theta,
                             "P_abandon": r.P_abandon, "Wq_s": r.Wq, "P_wait": r.P_wait,
                             "verdict": f"stable with abandonment: {100 * r.P_abandon:.3g} % of arrivals leave, "
                                        f"mean wait {r.Wq:.3g} s"}
