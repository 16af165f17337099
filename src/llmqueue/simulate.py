"""Simulate one replica end to end: workload -> engine -> records -> summary, with theory beside.

:func:`run_simulation` is what ``llmqueue simulate`` (and later sweeps) call. It generates the
request stream, runs the fast replica simulator, summarises the records with
:func:`llmqueue.metrics.summarize` and computes the closed-form predictions that apply:

- ``mu_kv``: Nie et al.'s KV-memory capacity ``M / (b E[g])`` (``b`` the mean step time);
- ``mu_seqs``: the slot bound ``max_num_seqs / (b E[steps per request])`` (Little's law on the
  running set: at most ``max_num_seqs`` requests hold a slot, each for its steps);
- ``mu_tokens``: the token-budget bound ``max_num_batched_tokens / (b E[s + o - 1])``;
- ``mu = min`` of the three, and which one binds, with the verdict for the arrival rate;
- for one request at a time (``max_num_seqs = 1``), Poisson arrivals and fixed lengths: the
  replica is an M/G/1 queue with service time = the request's steps, and the
  Pollaczek-Khinchine mean response time is given beside the simulated one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmqueue.engine.options import SimOptions
from llmqueue.engine.config import EngineConfig
from llmqueue.engine.run import SimResult, simulate
from llmqueue.engine.step_time import StepTimeModel
from llmqueue.errors import InputError

UNLIMITED_KV_TOKENS = 1 << 40


@dataclass
class SimSpec:
    """Everything one simulation needs.

    ``workload``: a :class:`llmqueue.workload.Workload`, a ``ClassMix``-like object with
    ``generate(seed, n=, duration=)``, or ready ``requests`` (a ``RequestArrays``).
    ``num_requests`` or ``duration_s`` bounds the stream (and ``duration_s`` is the horizon).
    """

    engine: EngineConfig
    step_time: StepTimeModel
    workload: object = None
    requests: object = None
    num_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0
    warmup_s: float = 0.0
    slos: dict | None = None
    options: SimOptions = field(default_factory=SimOptions)
    kv_unlimited: bool = False
    notes: list = field(default_factory=list)
    predictor_cv: float = 0.0  # srpt: predicted output = true output x lognormal noise (mean 1, this CV)
    replicas: int = 1          # a fleet of this many replicas of ``engine`` on one clock
    router: str = "random"     # how the fleet routes (llmqueue.cluster.routers)
    # pools, lanes, P/D, gateway, autoscalers, faults (llmqueue.cluster.spec.FleetSpec): from a
    # scenario's deployment.pools or --disaggregate; None: ``replicas`` x ``engine`` as above
    fleet: object = None


def spec_from_scenario(scenario, *, seed: int | None = None, duration_s: float | None = None,
                       num_requests: int | None = None) -> SimSpec:
    """A :class:`SimSpec` from a validated :class:`llmqueue.scenario.Scenario`.

    With ``deployment.replicas > 1`` the whole stream is served by that many replicas on one
    clock behind a uniform random router (:func:`llmqueue.cluster.simulate_fleet`).
    """
    run = scenario.run
    seed = run.seed if seed is None else seed
    if duration_s is not None and run.warmup_s >= duration_s:
        raise InputError("duration", f"{duration_s:g} s is not longer than the scenario's warm-up ({run.warmup_s:g} s)",
                         "give a longer --duration")
    if duration_s is not None or num_requests is not None:
        run = run.model_copy(update={"duration_s": duration_s, "num_requests": num_requests})
        scenario = scenario.model_copy(update={"run": run})
    requests = scenario.requests(seed)
    d = scenario.deployment
    notes = list(scenario.notes)
    if d.replicas > 1:
        notes.append(f"{d.replicas} replicas on one clock behind a uniform random router (each request "
                     "routed as it arrives; retries routed afresh)")
    engine, step_time = scenario.engine()
    mix = scenario.mix
    slos = _slo_targets(mix.slos)
    ttft = {c.name: c.client.ttft_timeout_s for c in mix.classes if c.client.ttft_timeout_s is not None}
    opts = SimOptions(seed=seed, timeout_s=mix.timeouts(), ttft_timeout_s=ttft, retry=mix.retry_function(seed, requests))
    spec = SimSpec(engine=engine, step_time=step_time, requests=requests,
                   workload=_single_class_workload(mix), seed=seed, warmup_s=run.warmup_s, slos=slos,
                   duration_s=run.duration_s, num_requests=run.num_requests, options=opts, replicas=d.replicas,
                   fleet=scenario.fleet)
    spec.notes = notes
    return spec


def _single_class_workload(mix):
    """The class's Workload when the mix has one class (for the closed-form side), else None."""
    classes = getattr(mix, "classes", [])
    if len(classes) != 1:
        return None
    c = classes[0]
    from llmqueue.workload import Workload

    try:
        arrival = mix.arrival if getattr(c, "arrival", None) is None else c.arrival
        if getattr(c, "joint", None) is not None:
            return Workload(arrival, joint=c.joint)
        return Workload(arrival, prompt=c.prompt, output=c.output)
    except Exception:  # the closed forms are a side dish: no workload, no theory
        return None


def _slo_targets(per_class: dict) -> dict | None:
    """Scenario SLOs ({class: (SLO, ...)}) as metrics targets {class: {"p99_ttft_ms": ...}}."""
    out = {}
    for cls, slos in per_class.items():
        t = {}
        for slo in slos:
            p = slo.percentile
            word = str(int(p)) if int(p) == p else str(p)
            t[f"p{word}_{slo.metric}_ms"] = slo.max_s * 1e3
        if t:
            out[cls] = t
    return out or None


@dataclass
class SimOutcome:
    result: SimResult
    summary: dict
    theory: dict
    records: object  # RequestRecords
    stream: object = None  # the intended request stream (RequestArrays)


def generate_requests(spec: SimSpec):
    if spec.requests is not None:
        return spec.requests
    if spec.workload is None:
        raise InputError("workload", "no workload given", "give --arrival, --prompt and --output, or a scenario")
    if spec.num_requests is None and spec.duration_s is None:
        raise InputError("num_requests", "give --num-requests N or --duration SECONDS")
    return spec.workload.generate(spec.seed, n=spec.num_requests, duration=spec.duration_s)


def theory_for(spec: SimSpec, requests, steps: dict | None = None) -> dict:
    """Closed-form capacity bounds and, where exact, the queueing-model prediction
    (:mod:`llmqueue.theory.replica`) for what was simulated.

    ``b`` is the step time when it is constant (noise has mean one); otherwise the step-time model's
    price of a step at the capacity point (:func:`~llmqueue.theory.replica.saturated_capacity`: the
    run's own mean step, ``b_mean_simulated``, depends on its load), or, where no fixed point is
    found, the mean duration of the simulated steps.
    """
    from llmqueue.engine.step_time import constant_step, parse_step_time
    from llmqueue.theory.replica import replica_capacity, saturated_capacity

    cfg = spec.engine
    model = spec.step_time
    out: dict = {}
    fleet = spec.fleet
    replicas = spec.replicas
    if fleet is not None:
        pools = fleet.pools
        if len(pools) > 1 or fleet.disaggregation is not None:
            return {"note": "a fleet of several pools: the closed forms are per replica of one engine (see the "
                            "per-pool table)"}
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
    lam = _arrival_rate(wl, requests)
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
    mg1 = None if fleet is not None else (
        _mg1_prediction(spec, lam, b) if spec.replicas == 1 else _mmc_prediction(spec, lam, b))
    if mg1 is not None:
        out["mg1"] = mg1
    return out


def _mmc_prediction(spec: SimSpec, lam, b) -> dict | None:
    """A central queue before c replicas serving one request at a time, one exponential step each
    (prompt and output of one token), Poisson arrivals: exactly M/M/c (Erlang C)."""
    from llmqueue.theory.classic import mmc

    cfg = spec.engine
    wl = spec.workload
    if (spec.router != "central" or cfg.max_num_seqs != 1 or wl is None or lam is None
            or getattr(spec.step_time, "noise", "none") != "exp" or type(getattr(wl, "arrival", None)).__name__ != "Poisson"):
        return None
    p, o = getattr(wl, "prompt", None), getattr(wl, "output", None)
    if type(p).__name__ != "Fixed" or type(o).__name__ != "Fixed" or p.mean() > cfg.max_num_batched_tokens or o.mean() != 1:
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


def _arrival_rate(wl, requests) -> float | None:
    arrival = getattr(wl, "arrival", None) if wl is not None else None
    rate = getattr(arrival, "rate", None)
    if rate:
        return float(rate)
    a = np.asarray(requests.arrival_s)
    return (len(a) - 1) / (a[-1] - a[0]) if len(a) > 1 and a[-1] > a[0] else None


def _mg1_prediction(spec: SimSpec, lam, b) -> dict | None:
    """One request at a time with fixed lengths and Poisson arrivals is exactly M/G/1."""
    from llmqueue.theory.replica import one_at_a_time

    cfg = spec.engine
    wl = spec.workload
    model = spec.step_time
    if cfg.max_num_seqs != 1 or wl is None or lam is None or getattr(model, "drift_sd", 0) > 0:
        return None
    arrival = getattr(wl, "arrival", None)
    if type(arrival).__name__ != "Poisson":
        return None
    p, o = getattr(wl, "prompt", None), getattr(wl, "output", None)
    if type(p).__name__ != "Fixed" or type(o).__name__ != "Fixed":
        return None
    noise = getattr(model, "noise", "none")
    scv_step = {"none": 0.0, "exp": 1.0}.get(noise, getattr(model, "noise_cv", 0.0) ** 2)
    r = one_at_a_time(lam=lam, b=b, prompt_tokens=int(p.mean()), output_tokens=int(o.mean()),
                      chunk=min(cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold or 10**18), scv_step=scv_step)
    if not r.stable:
        return {"model": "M/G/1", "mu": r.mu, "rho": r.rho, "stable": False}
    return {"model": "M/G/1 (one request at a time)", "service_steps": r.service_steps, "scv_s": r.scv_s, "mu": r.mu,
            "rho": r.rho, "mean_e2el_ms": r.mean_e2el_ms, "mean_queue_ms": r.mean_queue_ms}


def run_simulation(spec: SimSpec, *, progress: bool = False, margin: float | None = None) -> SimOutcome:
    """Generate, simulate, summarise; returns the records, the summary and the theory. ``margin``:
    also measure the run's distance to the preemption cliff (:mod:`llmqueue.plan.margin`: the
    same arrivals re-simulated with a slower engine and with more traffic); a run within
    ``1 + margin`` of it is judged "metastable". The decisions of the engine steps
    ``spec.options.explain`` asks for are kept (``result.explained``, ``summary["explained"]``; one replica)."""
    from llmqueue.metrics import summarize
    from llmqueue.records import RequestRecords, StepRecords, TimeSeries

    if margin is not None and (spec.fleet is not None or spec.replicas > 1):
        raise InputError("margin", "is measured on one replica", "drop --margin, or --replicas / the fleet")
    if spec.options.explain and (spec.fleet is not None or spec.replicas > 1):
        raise InputError("explain", "explains the steps of one replica", "drop --explain, or --replicas / the fleet")
    requests = generate_requests(spec)
    opts = spec.options
    if spec.engine.policy == "srpt" and opts.predicted_output is None and spec.predictor_cv > 0:
        rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(13,)))
        s2 = math.log1p(spec.predictor_cv ** 2)
        noise = rng.lognormal(-s2 / 2, math.sqrt(s2), len(requests))
        opts.predicted_output = np.asarray(requests.output_tokens, dtype=np.float64) * noise
    if spec.duration_s is not None and opts.horizon_s is None:
        opts.horizon_s = spec.duration_s
    bar = None
    if progress:
        bar = _progress_bar(opts.horizon_s if opts.horizon_s is not None else
                            (float(requests.arrival_s[-1]) if len(requests) else 0.0))
        opts.progress = bar.update_to
    try:
        if spec.fleet is not None:
            res = _simulate_fleet_spec(spec, requests, opts)
        elif spec.replicas > 1:
            res = _simulate_fleet(spec, requests, opts)
        else:
            res = simulate(spec.engine, spec.step_time, requests, options=opts)
    finally:
        if bar is not None:
            bar.close()
    recs = RequestRecords.from_columns(res.requests)
    steps = StepRecords.from_columns(res.steps)
    ts = TimeSeries.from_columns(res.timeseries)
    summary = summarize(recs, steps=steps, timeseries=ts, warmup_s=spec.warmup_s, horizon_s=res.horizon_s,
                        slos=spec.slos, kv_capacity=None if spec.kv_unlimited else spec.engine.capacity_tokens)
    if res.stopped_early_s is not None:
        H = spec.duration_s if spec.duration_s is not None else opts.horizon_s
        summary["stopped_early_s"] = res.stopped_early_s
        summary["verdict"] = (f"{summary.get('verdict')} (stopped early at {res.stopped_early_s:.0f} s of {H:g} s: "
                              "the queue grew by a tenth of the arrivals or more, slice after slice)")
    summary["wall_s"] = res.wall_s
    summary["simulated_requests_per_wall_s"] = len(requests) / res.wall_s if res.wall_s > 0 else None
    summary["engine_steps"] = res.num_steps
    cfg = spec.engine
    if not spec.kv_unlimited:
        summary["kv_capacity_tokens"] = cfg.capacity_tokens
    summary["engine"] = {"max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
                         "block_size": cfg.block_size, "enable_chunked_prefill": cfg.enable_chunked_prefill,
                         "num_gpu_blocks": None if spec.kv_unlimited else cfg.num_kv_blocks}
    summary["step_time"] = spec.step_time.spec
    if res.reject_reasons:
        from collections import Counter

        # e.g. {"prompt+output 2100 exceeds the KV cache (2000 tokens)": 3}, grouped by kind
        kinds = Counter(r.split(" ")[0] if r[:1].isdigit() else _reason_kind(r) for r in res.reject_reasons.values())
        summary["reject_reasons"] = dict(kinds)
    ps = pool_series(res)
    if ps is not None or "pool" in recs:
        from llmqueue.metrics.fleet import fleet_summary

        summary["fleet"] = fleet_summary(recs, ps, warmup_s=spec.warmup_s, horizon_s=res.horizon_s, slos=spec.slos,
                                         **fleet_accounts(spec))
    theory = theory_for(spec, requests, res.steps)
    if margin is not None:
        from llmqueue.plan.margin import margin_verdict, regime_margin

        m = regime_margin(spec, requests, margin=margin)
        summary["regime_margin"] = m
        said = margin_verdict(m)
        if said is not None and str(summary.get("verdict", "")).startswith("stable"):
            summary["verdict"] = said
    if spec.notes:
        summary["notes"] = list(spec.notes)
    if res.explained:
        summary["explained"] = [e.to_dict() for e in res.explained]
    return SimOutcome(result=res, summary=summary, theory=theory, records=recs, stream=requests)


def fleet_accounts(spec) -> dict:
    """What :func:`llmqueue.metrics.fleet.fleet_summary` needs beyond the records, from the spec:
    ``pool_costs`` and ``pool_quality`` from ``spec.fleet.pools`` (each pool's ``name``,
    ``cost_per_replica_hour``, ``quality``), ``prefill_pool`` (a P/D fleet's), and ``spike`` (``(t0, t1)`` s) from ``spec.spike`` or
    ``spec.fleet.spike``; whatever the spec lacks is left out."""
    out: dict = {}
    fleet = getattr(spec, "fleet", None)
    pools = getattr(fleet, "pools", None) or []
    d = getattr(fleet, "disaggregation", None)
    if d is not None:
        out["prefill_pool"] = d.prefill
    if pools:
        out["pool_costs"] = {p.name: float(p.cost_per_replica_hour) for p in pools
                             if getattr(p, "cost_per_replica_hour", None) is not None}
        out["pool_quality"] = {p.name: float(p.quality) for p in pools if getattr(p, "quality", None) is not None}
    spike = getattr(spec, "spike", None)
    if spike is None:
        spike = getattr(fleet, "spike", None)
    if spike is None:  # a workload whose arrivals burst once (spike:RATE:k=K:at=T:for=D, K > 1)
        from llmqueue.workload.nonstationary import Spike

        arr = getattr(getattr(spec, "workload", None), "arrival", None)
        if isinstance(arr, Spike) and arr.k > 1 and arr.period is None:
            spike = (arr.at, arr.at + arr.duration)
    if spike is not None:
        out["spike"] = (float(spike[0]), float(spike[1]))
    return out


def _simulate_fleet(spec: SimSpec, requests, opts):
    """``spec.replicas`` replicas behind ``spec.router`` (:func:`llmqueue.cluster.simulate_fleet`)."""
    from llmqueue.cluster import simulate_fleet

    if opts.early_stop:
        raise InputError("early_stop", "a fleet does not stop early yet", "drop --early-stop, or --replicas")
    return simulate_fleet(spec.engine, spec.step_time, requests, replicas=spec.replicas, router=spec.router,
                          options=opts)


def _simulate_fleet_spec(spec: SimSpec, requests, opts):
    """``spec.fleet`` (a :class:`~llmqueue.cluster.spec.FleetSpec`: pools, lanes, P/D, gateway,
    autoscalers, faults) serving ``requests``."""
    from llmqueue.cluster import simulate_fleet

    if opts.early_stop:
        raise InputError("early_stop", "a fleet does not stop early yet", "drop --early-stop")
    return simulate_fleet(spec.fleet, requests, options=opts)


def _reason_kind(reason: str) -> str:
    """Group reasons that differ only in their numbers."""
    import re

    return re.sub(r"\d+(\.\d+)?", "N", reason)


def _progress_bar(total_s: float):
    from tqdm import tqdm

    class _Bar(tqdm):
        def update_to(self, t):
            self.update(max(0.0, min(t, self.total or t) - self.n))

    return _Bar(total=round(total_s, 3) if total_s else None, unit="sim-s", unit_scale=False, mininterval=0.5,
                leave=False, dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} sim-s [{elapsed}<{remaining}]")


def write_outcome(out: SimOutcome, directory) -> None:
    """Write ``requests.parquet``, ``steps.parquet``, ``timeseries.parquet``, ``summary.json`` and, for
    a fleet with a pools series (``SimResult.pools``), ``pools.parquet``. A fleet's optional record
    columns (``pool``, ``lane``, ``model``, ...; the time series' ``pool``) are written with them."""
    from llmqueue.records import StepRecords, TimeSeries, write_run

    write_run(directory, requests=out.records, steps=StepRecords.from_columns(out.result.steps),
              timeseries=TimeSeries.from_columns(out.result.timeseries),
              summary={**out.summary, "theory": out.theory}, pools=pool_series(out.result))
    if out.stream is not None:
        write_workload(out.stream, Path(directory) / "workload.parquet")


def pool_series(res):
    """The result's pools series as a :class:`~llmqueue.records.PoolSeries`, or None (no fleet, or no rows)."""
    pools = getattr(res, "pools", None)
    if pools is None:
        return None
    from llmqueue.records import PoolSeries

    ps = pools if isinstance(pools, PoolSeries) else PoolSeries.from_columns(pools)
    return ps if len(ps) else None


def write_workload(requests, path) -> None:
    """The intended request stream (what a run was asked to serve) as ``workload.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = requests.to_columns()
    pq.write_table(pa.table({k: (np.asarray(v).astype(str) if k == "class" else np.asarray(v)) for k, v in cols.items()}),
                   path)
