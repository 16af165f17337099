"""What the closed forms predict for a simulated run: capacity bounds beside the simulation and,
where the run is exactly a textbook queue, its mean response time.

:func:`theory_for` is the ``theory`` section of ``llmqueue simulate`` (and of every run
directory's ``summary.json``) for one replica, or for a fleet of replicas of one engine (each
replica's share ``lam / c`` of the arrivals):

- ``mu_kv``: Nie et al.'s KV-memory capacity ``M / (b E[g])`` (``b`` the mean step time);
- ``mu_seqs``: the slot bound ``max_num_seqs / (b E[steps per request])`` (Little's law on the
  running set: at most ``max_num_seqs`` requests hold a slot, each for its steps);
- ``mu_tokens``: the token-budget bound ``max_num_batched_tokens / (b E[s + o - 1])``;
- ``mu = min`` of the three, and which one binds, with the verdict for the arrival rate (the
  mean over the run) and, for a time-varying arrival, for its peak (:mod:`llmqueue.theory.judged`);
- for one request at a time (``max_num_seqs = 1``), Poisson arrivals and fixed lengths: the
  replica is an M/G/1 queue with service time = the request's steps, and the
  Pollaczek-Khinchine mean response time is given beside the simulated one
  (:func:`mg1_prediction`); ``c`` such replicas behind a central queue, one exponential step per
  request, are M/M/c (Erlang C, :func:`mmc_prediction`).

The closed forms themselves are in :mod:`llmqueue.theory.replica` and
:mod:`llmqueue.theory.classic`; this module reads the run's inputs (engine knobs, step-time model,
workload) to choose and feed them, so it sits above the engine and the workload (CONTRIBUTING.md).
"""

from __future__ import annotations

import numpy as np

from llmqueue.engine.step_model import constant_step
from llmqueue.knobs import load_registry
from llmqueue.engine.step_time import parse_step_time
from llmqueue.theory.classic import mmc
from llmqueue.theory.judged import judge_peak, peak_rate
from llmqueue.theory.replica import one_at_a_time, replica_capacity, saturated_capacity
from llmqueue.workload.arrivals import Poisson
from llmqueue.workload.lengths import Fixed


def theory_for(spec, requests, steps: dict | None = None) -> dict:
    """Closed-form capacity bounds and, where exact, the queueing-model prediction
    (:mod:`llmqueue.theory.replica`) for what was simulated: ``spec`` a
    :class:`~llmqueue.simulate.SimSpec`, ``requests`` its stream, ``steps`` the step records.

    ``b`` is the step time when it is constant (noise has mean one); otherwise the step-time model's
    price of a step at the capacity point (:func:`~llmqueue.theory.replica.saturated_capacity`: the
    run's own mean step, ``b_mean_simulated``, depends on its load), or, where no fixed point is
    found, the mean duration of the simulated steps.
    """
    cfg = spec.engine
    model = spec.step_time
    out: dict = {}
    fleet = spec.fleet
    replicas = spec.replicas
    if fleet is not None:
        pools = fleet.pools
        if len(pools) > 1 or fleet.disaggregation is not None:
            out = {"note": "a fleet of several pools: judged pool by pool (below)"}
            peak = _peak(spec, requests)
            if peak is not None:
                out["peak"] = peak
            return out
        cfg, model, replicas = pools[0].config, parse_step_time(pools[0].step_time), max(pools[0].replicas, 1)
    b = constant_step(model)
    if b is not None:
        out["b_source"] = "step-time model"  # noise factors have mean one
    else:
        if not steps or not len(steps["duration_s"]):
            return {"note": "no steps were simulated"}
        k = steps["steps"] if "steps" in steps else np.ones(len(steps["duration_s"]))
        b = float(np.sum(steps["duration_s"]) / np.sum(k))
        out["b_source"] = "mean simulated step (Nie et al.'s b-bar)"
    wl = spec.workload
    dists = _length_dists(wl)
    lam = _arrival_rate(wl, requests, spec.duration_s)
    if lam is not None and replicas > 1:
        lam = lam / replicas  # each replica's share (every router spreads the load evenly)
        out["per_replica"] = f"lam / {replicas} replicas" + (
            " (the pool's starting count)" if fleet is not None and (fleet.autoscalers or fleet.faults) else "")
    if dists is None:
        s = np.asarray(requests.prompt_tokens, dtype=np.float64)
        o = np.asarray(requests.output_tokens, dtype=np.float64)
    else:
        s, o = _samples(dists, requests)
    kw = dict(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
              prompt_tokens=s, output_tokens=o, M=None if spec.kv_unlimited else cfg.capacity_tokens,
              lam=lam, prompt=(dists or {}).get("prompt"), output=(dists or {}).get("output"))
    cap = None
    if out["b_source"] != "step-time model":
        # a composition-dependent step: price it at the capacity point, not at this run's load
        cap = saturated_capacity(model.base, **kw)
        if cap is not None:
            out["b_mean_simulated"] = b
            out["b_source"] = "the step-time model at the capacity point (saturation)"
            b = cap.b
    if cap is None:
        cap = replica_capacity(b=b, **kw)
    out.update(b=b, lam=lam)
    if cap.mu_kv is not None:
        out.update(delta=cap.delta, E_g=cap.E_g, mu_kv=cap.mu_kv)
    out.update(mu_seqs=cap.mu_seqs, mu_tokens=cap.mu_tokens, mu=cap.mu, binding=cap.binding)
    if lam is not None:
        out.update(rho=cap.rho, verdict=cap.verdict)
        judge_peak(out, _peak(spec, requests), replicas)
    mg1 = None if fleet is not None else (
        mg1_prediction(spec, lam, b) if spec.replicas == 1 else mmc_prediction(spec, lam, b))
    if mg1 is not None:
        out["mg1"] = mg1
    return out


def mmc_prediction(spec, lam, b) -> dict | None:
    """A central queue before c replicas serving one request at a time, one exponential step each
    (prompt and output of one token), Poisson arrivals: exactly M/M/c (Erlang C). None when the
    run is not that queue."""
    cfg = spec.engine
    wl = spec.workload
    if (not getattr(load_registry("llmqueue.cluster.routers:ROUTERS").get(spec.router), "central", False)
            or cfg.max_num_seqs != 1 or wl is None or lam is None
            or getattr(spec.step_time, "noise", "none") != "exp" or not isinstance(getattr(wl, "arrival", None), Poisson)):
        return None
    p, o = getattr(wl, "prompt", None), getattr(wl, "output", None)
    if not (isinstance(p, Fixed) and isinstance(o, Fixed)) or p.mean() > cfg.max_num_batched_tokens or o.mean() != 1:
        return None
    c = spec.replicas
    if lam * c >= c / b:
        return {"model": f"M/M/{c}", "mu": 1 / b, "rho": lam * b, "stable": False}
    r = mmc(lam=lam * c, mu=1 / b, c=c)
    return {"model": f"M/M/{c} (central queue, one request at a time)", "mu": 1 / b, "rho": r.rho,
            "P_wait": r.P_wait, "mean_e2el_ms": r.W * 1e3, "mean_queue_ms": r.Wq * 1e3}


def _length_dists(wl):
    if wl is None:
        return None
    joint = getattr(wl, "joint", None)
    if joint is not None:
        return dict(pairs=(np.asarray(joint.prompts), np.asarray(joint.outputs)))
    p, o = getattr(wl, "prompt", None), getattr(wl, "output", None)
    if p is not None and o is not None and hasattr(p, "pmf") and hasattr(o, "pmf"):
        return dict(prompt=p, output=o)
    return None


def _samples(dists, requests):
    if "pairs" in dists:
        return (np.asarray(dists["pairs"][0], dtype=np.float64), np.asarray(dists["pairs"][1], dtype=np.float64))
    sv, sp = dists["prompt"].pmf()
    ov, op = dists["output"].pmf()
    # exact expectations over the pmfs, expressed as weighted samples
    rng = np.random.default_rng(0)
    n = 200_000
    return (rng.choice(np.asarray(sv, dtype=np.float64), n, p=sp), rng.choice(np.asarray(ov, dtype=np.float64), n, p=op))


def _peak(spec, requests) -> dict | None:
    wl = spec.workload
    return peak_rate(getattr(wl, "arrival", None) if wl is not None else None, requests.arrival_s, spec.duration_s)


def _arrival_rate(wl, requests, horizon_s: float | None = None) -> float | None:
    """``lam``: the process's long-run rate; for a time-varying one the mean over the simulated
    horizon ``Lambda(H) / H`` (a one-off spike's long-run rate is its base rate, which would hide
    the spike); for a trace, the arrivals counted."""
    from llmqueue.workload.nonstationary import TimeVarying

    arrival = getattr(wl, "arrival", None) if wl is not None else None
    if isinstance(arrival, TimeVarying) and horizon_s:
        return float(arrival.cumulative(np.asarray([float(horizon_s)]))[0]) / float(horizon_s)
    rate = getattr(arrival, "rate", None)
    if rate:
        return float(rate)
    a = np.asarray(requests.arrival_s)
    return (len(a) - 1) / (a[-1] - a[0]) if len(a) > 1 and a[-1] > a[0] else None


def mg1_prediction(spec, lam, b) -> dict | None:
    """One request at a time with fixed lengths and Poisson arrivals is exactly M/G/1
    (:func:`~llmqueue.theory.replica.one_at_a_time`: ``k`` steps of step time ``b`` and step SCV
    ``scv_step`` per request; M/M/1 when ``k = 1`` and the steps are exponential). None when the
    run is not that queue."""
    cfg = spec.engine
    wl = spec.workload
    model = spec.step_time
    if cfg.max_num_seqs != 1 or wl is None or lam is None or getattr(model, "drift_sd", 0) > 0:
        return None
    if not isinstance(getattr(wl, "arrival", None), Poisson):
        return None
    p, o = getattr(wl, "prompt", None), getattr(wl, "output", None)
    if not (isinstance(p, Fixed) and isinstance(o, Fixed)):
        return None
    noise = getattr(model, "noise", "none")
    scv_step = {"none": 0.0, "exp": 1.0}.get(noise, getattr(model, "noise_cv", 0.0) ** 2)
    r = one_at_a_time(lam=lam, b=b, prompt_tokens=int(p.mean()), output_tokens=int(o.mean()),
                      chunk=min(cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold or 10**18), scv_step=scv_step)
    if not r.stable:
        return {"model": "M/G/1", "mu": r.mu, "rho": r.rho, "stable": False}
    return {"model": "M/G/1 (one request at a time)", "service_steps": r.service_steps, "scv_s": r.scv_s, "mu": r.mu,
            "rho": r.rho, "mean_e2el_ms": r.mean_e2el_ms, "mean_queue_ms": r.mean_queue_ms}
