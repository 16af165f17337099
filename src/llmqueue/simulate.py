"""Simulate a replica or a fleet end to end: workload -> engine -> records -> summary, with theory beside.

:func:`run_simulation` is what ``llmqueue simulate``, sweeps, the planner and validation call. It
generates the request stream, runs the fast replica simulator (one replica, ``replicas`` of one
engine behind a router, or a fleet of pools: :func:`llmqueue.cluster.simulate_fleet`), summarises
the records with :func:`llmqueue.metrics.summarize` (and a fleet's per-pool accounts with
:func:`llmqueue.metrics.fleet.fleet_summary`) and computes the closed-form predictions that apply
(:func:`llmqueue.theory.prediction.theory_for`: the capacity bounds ``mu_kv``, ``mu_seqs``,
``mu_tokens`` and the binding one, and the M/G/1 or M/M/c mean response where the run is exactly
that queue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmqueue.engine.options import SimOptions, StopRun
from llmqueue.engine.config import EngineConfig
from llmqueue.engine.run import SimResult, simulate
from llmqueue.engine.step_time import StepTimeModel
from llmqueue.errors import InputError
from llmqueue.knobs import BY_NAME
from llmqueue.theory.judged import indeterminate_text, reconcile
from llmqueue.theory.prediction import theory_for

UNLIMITED_KV_TOKENS = 1 << 40


@dataclass
class SimSpec:
    """Everything one simulation needs: the engine of one replica, or of ``replicas`` behind
    ``router``, or a ``fleet``; the step-time model; the workload; the run's options.

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
    router: str = BY_NAME["router"].default  # how the fleet routes (llmqueue.cluster.routers)
    # pools, lanes, P/D, gateway, autoscalers, faults (llmqueue.cluster.spec.FleetSpec): from a
    # scenario's deployment.pools or --disaggregate; None: ``replicas`` x ``engine`` as above
    fleet: object = None


def spec_from_scenario(scenario, *, seed: int | None = None, duration_s: float | None = None,
                       num_requests: int | None = None, router: str = BY_NAME["router"].default) -> SimSpec:
    """A :class:`SimSpec` from a validated :class:`llmqueue.scenario.Scenario`.

    With ``deployment.replicas > 1`` the whole stream is served by that many replicas on one
    clock behind ``router`` (:func:`llmqueue.cluster.simulate_fleet`; ``--router``, uniform random
    by default); with ``deployment.pools``, by the scenario's fleet (each pool behind its own router).
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
        from llmqueue.cluster.routers import Random

        behind = "a uniform random router" if router == Random.name else f"the {router} router"
        notes.append(f"{d.replicas} replicas on one clock behind {behind} (each request "
                     "routed as it arrives; retries routed afresh)")
    engine, step_time = scenario.engine()
    mix = scenario.mix
    slos = _slo_targets(mix.slos)
    ttft = {c.name: c.client.ttft_timeout_s for c in mix.classes if c.client.ttft_timeout_s is not None}
    opts = SimOptions(seed=seed, timeout_s=mix.timeouts(), ttft_timeout_s=ttft, patience=mix.patience(seed),
                      retry=mix.retry_function(seed, requests))
    spec = SimSpec(engine=engine, step_time=step_time, requests=requests,
                   workload=_single_class_workload(mix), seed=seed, warmup_s=run.warmup_s, slos=slos,
                   duration_s=run.duration_s, num_requests=run.num_requests, options=opts, replicas=d.replicas,
                   router=router, fleet=scenario.fleet)
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


class CtrlC:
    """Ctrl-C (SIGINT) during a simulation, turned into a stop between two engine steps.

    Used around :func:`run_simulation` (``interrupt=``) and the writing of its outcome: the first
    SIGINT only sets ``asked``; the run's progress callback, called between steps, then raises
    :class:`~llmqueue.engine.options.StopRun`, and the run ends there as at a horizon (its records
    whole up to that simulated time, the requests still in the system ``unfinished``); the outcome
    is marked interrupted. A second SIGINT raises ``KeyboardInterrupt`` at once. Outside the main
    thread (where no signal arrives) it installs nothing."""

    def __init__(self) -> None:
        self.asked = False
        self._old = None

    def __enter__(self) -> CtrlC:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - a signal handler's signature
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __exit__(self, *exc) -> bool:
        if self._old is not None:
            import signal

            signal.signal(signal.SIGINT, self._old)
            self._old = None
        return False


def generate_requests(spec: SimSpec):
    if spec.requests is not None:
        return spec.requests
    if spec.workload is None:
        raise InputError("workload", "no workload given", "give --arrival, --prompt and --output, or a scenario")
    if spec.num_requests is None and spec.duration_s is None:
        raise InputError("num_requests", "give --num-requests N or --duration SECONDS")
    return spec.workload.generate(spec.seed, n=spec.num_requests, duration=spec.duration_s)


def check_prompts_fit(engine, requests) -> None:
    """Without chunked prefill a prompt is prefilled in one step, so a prompt longer than the
    per-step token budget ``max_num_batched_tokens`` can never be scheduled: under FCFS it blocks
    every request behind it and the run serves nothing (vLLM refuses such a configuration at
    start-up: its budget must cover ``max_model_len``). One line saying what to change; prompts
    that ``max_model_len`` rejects at arrival are not scheduled and do not count."""
    if engine.enable_chunked_prefill or not len(requests):
        return
    s = np.asarray(requests.prompt_tokens, dtype=np.int64)
    o = np.asarray(requests.output_tokens, dtype=np.int64)
    b = engine.max_num_batched_tokens
    stuck = (s > b) & ((engine.max_model_len == 0) | (s + o <= engine.max_model_len))
    if stuck.any():
        longest = int(s[stuck].max())
        raise InputError("max_num_batched_tokens",
                         f"{int(stuck.sum())} of {len(s)} prompts are longer than the per-step token budget "
                         f"max_num_batched_tokens={b} (the longest {longest} tokens) and chunked prefill is off: "
                         "they can never be scheduled and would block the queue",
                         f"enable chunked prefill (--enable-chunked-prefill) or raise --max-num-batched-tokens "
                         f"to at least {longest}")


def run_simulation(spec: SimSpec, *, progress: bool = False, margin: float | None = None,
                   interrupt: CtrlC | None = None, speed_spread: tuple | None = None) -> SimOutcome:
    """Generate, simulate, summarise; returns the records, the summary and the theory.

    The stream is served by one replica of ``spec.engine``, by ``spec.replicas`` of them behind
    ``spec.router``, or by ``spec.fleet`` (pools, lanes, P/D, gateway, autoscalers, faults), all on
    one clock; a fleet's summary adds its per-pool accounts (``summary["fleet"]``). ``margin``:
    also measure the run's distance to the preemption cliff (:mod:`llmqueue.margin`: the
    same arrivals re-simulated with a slower engine and with more traffic; one replica only); a
    run within ``1 + margin`` of it is judged "metastable". The decisions of the engine steps
    ``spec.options.explain`` asks for are kept (``result.explained``, ``summary["explained"]``; one
    replica). ``interrupt``: a :class:`CtrlC` whose Ctrl-C ends the run between two steps; the
    outcome then covers the simulated time up to there (``summary["interrupted_s"]``, a note).
    ``speed_spread``: ``(spread, source)``, with ``margin``: the probability that the engine's
    run-to-run speed spread tips the run (:func:`llmqueue.margin.tipping`, from the margin search)."""
    from llmqueue.metrics import summarize
    from llmqueue.records import RequestRecords, StepRecords, TimeSeries

    if margin is not None and (spec.fleet is not None or spec.replicas > 1):
        raise InputError("margin", "is measured on one replica", "drop --margin, or --replicas / the fleet")
    if spec.options.explain and (spec.fleet is not None or spec.replicas > 1):
        raise InputError("explain", "explains the steps of one replica", "drop --explain, or --replicas / the fleet")
    requests = generate_requests(spec)
    if spec.fleet is None:
        check_prompts_fit(spec.engine, requests)
    opts = spec.options
    from llmqueue.engine.policies import SRPT

    if spec.engine.policy == SRPT.name and opts.predicted_output is None and spec.predictor_cv > 0:
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
    if interrupt is not None:
        opts.progress = _stoppable(opts.progress, interrupt)
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
    notes = list(spec.notes)
    if interrupt is not None and interrupt.asked and res.interrupted_s is None:
        res.interrupted_s = res.horizon_s  # Ctrl-C after the last step: the run is whole
    if res.interrupted_s is not None:
        H = spec.duration_s if spec.duration_s is not None else opts.horizon_s
        t = res.interrupted_s
        summary["interrupted_s"] = t
        summary["verdict"] = f"{summary.get('verdict')} (interrupted at simulated t = {t:.1f} s)"
        notes.append(f"interrupted at simulated t = {t:.1f} s" + (f" of {H:g} s" if H is not None else "")
                          + " (Ctrl-C): the records and the summary cover what was simulated up to then; "
                          "requests still in the system are unfinished")
        margin = None  # no more simulations after a Ctrl-C
    summary["wall_s"] = res.wall_s
    if "preemptions" in res.requests:  # over the whole run: any recomputation is the KV-bound engine's cliff
        summary["preemptions"] = int(np.sum(res.requests["preemptions"]))
    tier = getattr(res, "kv_tier", None)
    if tier:  # the host KV tier's account (a fleet: its replicas' summed)
        summary["kv_tier"] = tier
    hits = _prefix_hit_rate(res.requests, tier) if spec.engine.enable_prefix_caching or tier else None
    if hits:
        summary["prefix_hit_rate"] = hits
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
        from llmqueue.metrics.fleet import reason_kind

        kinds = Counter(reason_kind(r) for r in res.reject_reasons.values())
        summary["reject_reasons"] = dict(kinds)
    ps = pool_series(res)
    if ps is not None or "pool" in recs:
        from llmqueue.metrics.fleet import fleet_summary

        summary["fleet"] = fleet_summary(recs, ps, warmup_s=spec.warmup_s, horizon_s=res.horizon_s, slos=spec.slos,
                                         **fleet_accounts(spec))
        if res.reject_reasons:
            from llmqueue.metrics.fleet import refusals

            summary["fleet"]["refused"] = refusals(recs, res.reject_reasons, warmup_s=spec.warmup_s,
                                                   horizon_s=res.horizon_s)
    theory = judge_fleet(theory_for(spec, requests, res.steps), spec, requests, recs, res.horizon_s)
    if spec.options.patience and spec.fleet is None and spec.replicas == 1:
        from llmqueue.theory.judged import with_patience

        with_patience(theory, spec.options.patience, max_num_seqs=spec.engine.max_num_seqs)
    if margin is not None:
        from llmqueue.margin import margin_verdict, regime_margin

        m = regime_margin(spec, requests, margin=margin)
        if speed_spread is not None:  # (spread, source): the probability the engine's speed tips it
            from llmqueue.margin import tipping

            m["tipping"] = tipping(m, *speed_spread)
        summary["regime_margin"] = m
        said = margin_verdict(m)
        if said is not None and str(summary.get("verdict", "")).startswith("stable"):
            summary["verdict"] = said
    why = reconcile(theory, summary)
    if why:
        theory["why_they_differ"] = why
    said = indeterminate_text(theory, summary.get("regime_margin"))
    if said:
        theory["verdict_detail"] = said
    if notes:
        summary["notes"] = notes
    if res.explained:
        summary["explained"] = [e.to_dict() for e in res.explained]
    return SimOutcome(result=res, summary=summary, theory=theory, records=recs, stream=requests)


def judge_fleet(theory: dict, spec, requests, recs, horizon_s) -> dict:
    """The theory section with what the simulated records add: the retries' offered load
    (attempts per user request) and, for a fleet of several pools, each pool's closed forms fed
    the arrivals the simulated routing sent it (:mod:`llmqueue.theory.judged`)."""
    from llmqueue.metrics.fleet import retry_amplification
    from llmqueue.theory.judged import jackson_tandem, judge_retries, pool_theory, pools_verdict

    cols = {k: recs[k] for k in ("request_id", "arrival_s", "class")}
    amp = retry_amplification(cols, warmup_s=spec.warmup_s, horizon_s=horizon_s).get("amplification")
    judge_retries(theory, amp)
    if "pool" in recs.columns:
        pools = pool_theory(spec, requests, {k: recs[k] for k in ("request_id", "arrival_s", "pool")},
                            warmup_s=spec.warmup_s, horizon_s=horizon_s)
        if pools:
            peak, lam = theory.pop("peak", None), None
            if peak is not None:
                a = np.asarray(requests.arrival_s, dtype=np.float64)
                H = horizon_s or (float(a[-1]) if len(a) else 0.0)
                lam = len(a) / H if H else None
            for p in pools.values():
                if peak is not None and lam and p.get("rho") is not None:
                    p["rho_peak"] = p["rho"] * peak["lam_peak"] / lam
                judge_retries(p, amp)
            theory["pools"] = pools
            theory["verdict"] = pools_verdict(pools)
            tandem = jackson_tandem(spec) if spec.fleet.disaggregation is not None else None
            if tandem is not None:
                theory["tandem"] = tandem
            if peak is not None:
                theory["peak_source"] = peak["source"]
    return theory


def _stoppable(progress, interrupt: CtrlC):
    """The run's progress callback (``progress``, or none), raising StopRun once ``interrupt`` is asked."""

    def tick(t: float) -> None:
        if progress is not None:
            progress(t)
        if interrupt.asked:
            raise StopRun(t)

    return tick


def fleet_accounts(spec) -> dict:
    """What :func:`llmqueue.metrics.fleet.fleet_summary` needs beyond the records, from the spec:
    ``pool_costs`` and ``pool_quality`` from ``spec.fleet.pools`` (each pool's ``name``,
    ``cost_per_replica_hour``, ``quality``), ``degrade_quality`` (the gateway's caps' quality
    factors, by the records' ``degraded`` value), ``prefill_pool`` (a P/D fleet's), and ``spike`` (``(t0, t1)`` s) from ``spec.spike`` or
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
    g = getattr(fleet, "gateway", None)
    if g is not None and g.degrade:
        out["degrade_quality"] = {d.label: float(d.quality) for d in g.degrade if d.max_tokens is not None}
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

    from llmqueue._files import staged

    cols = requests.to_columns()
    with staged(path) as tmp:
        pq.write_table(pa.table({k: (np.asarray(v).astype(str) if k == "class" else np.asarray(v))
                                 for k, v in cols.items()}), tmp)


def _prefix_hit_rate(q: dict, tier: dict | None) -> dict | None:
    """The prefix cache's hit rate by tier: prompt tokens served from the GPU's cache and (with a
    host KV tier holding prefix units) from the host tier, over the prompt tokens of the requests
    scheduled, at their first admission as the records' ``cached_prompt_tokens`` count them (vLLM's
    ``prefix_cache_hits`` and ``external_prefix_cache_hits`` over their queries). None when no
    prefix was served from anywhere and no tier holds units."""
    host = (tier or {}).get("first_admission_hit_tokens")
    sched = np.isfinite(np.asarray(q["first_scheduled_s"], dtype=float))
    cached = float(np.sum(np.asarray(q["cached_prompt_tokens"])[sched]))
    queried = float(np.sum(np.asarray(q["prompt_tokens"])[sched]))
    if not queried or (not cached and host is None):
        return None
    out = {"gpu": (cached - (host or 0)) / queried}
    if host is not None:
        out["host"] = host / queried
    return out
