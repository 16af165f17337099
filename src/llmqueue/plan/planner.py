"""The planner: the cheapest deployment whose simulated p99s meet the SLOs.

**Space** (:mod:`llmqueue.plan.space`): model x GPU type x tensor-parallel size ``tp`` x
pipeline-parallel size ``pp`` x (replicas
``R`` of aggregated serving, or P:D splits with a KV link) x ``max_num_seqs`` x
``max_num_batched_tokens`` x router, for a workload (arrival rate ``lam``, prompt and output
lengths ``s``, ``o``): the scenario's, a replayed trace's or a fitted workload's
(:mod:`llmqueue.plan.workload_source`). The models default to the scenario's one; each
configuration's step model (the roofline of its model on its GPU, ``tp`` and ``pp``) and KV capacity
``M`` follow from its model. A model changes answer quality too, which the planner does not
judge: the cheapest configuration meeting the latency SLOs wins, whatever its model. The step
model is the roofline unless a calibration or a step-time spec replaces it
(:mod:`llmqueue.plan.inputs`).

**Theory first** (:mod:`llmqueue.plan.bounds`): each configuration's cost (USD/h), its rate
bound ``R mu`` and single-request latency bounds. A configuration is *pruned* (it cannot meet
the SLOs, whatever the simulation would say) when

- the model does not fit on ``tp x pp`` GPUs of that type (no KV block left, ``tp`` does not
  divide the heads, or more stages than layers);
- its cost exceeds the budget;
- ``rho = lam / (R mu)`` exceeds the utilization ceiling ``rho_max`` (default 0.95): at or above
  the theory's capacity the queue grows, and just below it the p99 of any finite run is a
  matter of its length;
- its TTFT or TPOT bound (one request alone) already exceeds the p99 target;
- the burst bound (:mod:`llmqueue.plan.burst`): on the arrival path the simulation serves, the
  fluid backlog above ``R mu / rho_max`` makes more than 1% of the measured requests wait longer
  than the p99 TTFT target before their first step (a bursty process whose peak level, held for
  minutes, exceeds what the deployment serves, although its mean does not).

**Simulation second**: the survivors, cheapest first (ties: the larger rate bound first, then
the configuration's fields), are simulated with the fleet simulator (every configuration with
the same seed: common random numbers; the scenario's warm-up excluded; ``duration`` long enough
for a p99 confidence interval, about 10,000 requests in the window) and judged by
:func:`llmqueue.plan.slo_judge.judge`: for each target the **upper bound of the 95% confidence
interval** of the simulated p99 must be within the target (the point estimate when the run gives
no interval: ``basis: estimate``), at most 1% of requests may fail, and the queue must not grow
(stability verdict ``stable``). Simulation stops at the first configuration in that order that
meets the SLOs: every cheaper one was pruned or failed, so it is the cheapest verified
deployment. With a process pool, ``workers`` configurations are simulated per round; those after
the answer in its round are recorded too.

Each configuration ends ``pruned`` (with the reason), ``simulated`` (p99s, CIs, verdict, meets
or why not) or ``not needed`` (a cheaper one was verified first).

With ``sensitivity``, the recommendation is then simulated under perturbed conditions (more
traffic, burstier arrivals, a spike, a slower engine) and its rate margin searched
(:mod:`llmqueue.plan.sensitivity`); the result goes to ``meta["sensitivity"]``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from llmqueue.errors import InputError
from llmqueue.plan.bounds import Workload, gpu_price, replica_theory, try_deployment
from llmqueue.plan.space import Config

PRUNED, SIMULATED, NOT_NEEDED = "pruned", "simulated", "not needed"
RHO_MAX = 0.95
#: requests in the measured window a p99 confidence interval needs (10,000) plus a margin
CI_REQUESTS = 12_000


@dataclass
class Candidate:
    """One configuration and what the planner found out about it."""

    config: Config
    cost_per_hour: float
    rate_bound: float | None = None   # R mu (req/s)
    rho: float | None = None          # lam / (R mu)
    binding: str | None = None
    stations: dict | None = None      # a P:D split's per-station capacities and loads
    ttft_bound_ms: float | None = None
    tpot_bound_ms: float | None = None
    status: str = NOT_NEEDED
    reason: str | None = None
    result: dict | None = None        # the simulation's p99s, CIs, verdict and judgement

    def order(self) -> tuple:
        """Cheapest first; at equal cost the larger rate bound (more headroom) first."""
        return (self.cost_per_hour, -(self.rate_bound or 0.0), self.config)

    @property
    def meets(self) -> bool | None:
        return None if self.result is None else self.result["meets"]

    def to_dict(self) -> dict:
        return {**self.config.knobs(), "gpus": self.config.gpus, "cost_per_hour": self.cost_per_hour,
                "rate_bound": self.rate_bound, "rho": self.rho, "binding": self.binding, "stations": self.stations,
                "ttft_bound_ms": self.ttft_bound_ms, "tpot_bound_ms": self.tpot_bound_ms, "status": self.status,
                "reason": self.reason, "simulation": self.result}


@dataclass
class PlanResult:
    """What :func:`plan` returns: every candidate with its status, the recommendation (None when
    every simulated configuration failed), the inputs and run statistics."""

    candidates: list[Candidate]
    recommended: Candidate | None
    slos: dict
    lam: float
    meta: dict = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.candidates)

    def pareto(self, metric: str = "p99_ttft_ms") -> list[dict]:
        """The simulated configurations on the cost / ``metric`` frontier (none cheaper and faster)."""
        sims = sorted((c for c in self.candidates if c.result is not None and c.result.get(metric) is not None),
                      key=lambda c: (c.cost_per_hour, c.result[metric]))
        out, best = [], math.inf
        for c in sims:
            if c.result[metric] < best:
                best = c.result[metric]
                out.append({**c.config.knobs(), "cost_per_hour": c.cost_per_hour, "p99_ttft_ms": c.result.get("p99_ttft_ms"),
                            "p99_tpot_ms": c.result.get("p99_tpot_ms"), "meets": c.result["meets"]})
        return out

    def to_dict(self) -> dict:
        from llmqueue.plan.slo_judge import SLO_RULE
        from llmqueue.plan.points import jsonable

        rec = self.recommended
        return jsonable({
            "recommended": None if rec is None else rec.to_dict(), "slos": self.slos, "slo_rule": SLO_RULE,
            "lam": self.lam, "configurations": len(self.candidates), "pruned": self.count(PRUNED),
            "simulated": self.count(SIMULATED), "not_needed": self.count(NOT_NEEDED),
            "pareto_cost_vs_p99_ttft": self.pareto(), "pareto_cost_vs_p99_tpot": self.pareto("p99_tpot_ms"),
            **self.meta,
            "candidates": [c.to_dict() for c in sorted(self.candidates, key=Candidate.order)]})


# --- the workload ---------------------------------------------------------------------------------

def scenario_workload(scenario: str, *, seed: int = 0, duration: float | None = None) -> Workload:
    """``lam`` and length samples of the scenario's workload (its request stream for ``seed``).
    ``lam``: the arrival process's long-run rate; for a replayed trace, ``(n - 1) / span`` of the
    replayed requests (the trace's empirical rate)."""
    import numpy as np

    from llmqueue.scenario.override import scenario_with

    o = scenario_with(scenario, duration=duration, seed=seed)
    sc = o.scenario
    if sc.deployment.pools or sc.deployment.disaggregation is not None:
        raise InputError("scenario", "has deployment pools or a P/D split",
                         "the planner sizes one aggregated deployment; plan a scenario without pools")
    if sc.deployment.model is None:
        raise InputError("scenario", "names no deployment.model", "the planner prices GPUs for a model: set one")
    reqs = sc.requests(seed)
    if len(reqs) == 0:
        raise InputError("scenario", "its workload has no requests", "give a longer --duration")
    shared = getattr(reqs, "hash_ids", None) is not None or sc.workload.trace is not None
    lam = float(sc.mix.rate)
    if sc.workload.trace is not None:
        t = np.asarray(reqs.arrival_s, dtype=np.float64)
        span = float(t.max() - t.min()) if len(t) > 1 else 0.0
        if not span > 0:
            raise InputError("trace", "the replayed requests have no time span, so no arrival rate",
                             "give a trace with at least 2 distinct arrival times")
        lam = (len(t) - 1) / span
    return Workload(lam=lam, prompt=np.asarray(reqs.prompt_tokens, dtype=np.float64),
                    output=np.asarray(reqs.output_tokens, dtype=np.float64), shared_prefixes=shared,
                    arrivals=np.sort(np.asarray(reqs.arrival_s, dtype=np.float64)),
                    warmup_s=float(sc.run.warmup_s or 0.0))


def default_duration(scenario: str, lam: float) -> float:
    """Long enough for a p99 interval: the warm-up plus ``CI_REQUESTS / lam``, at least the
    scenario's own run length, in whole minutes."""
    from llmqueue.scenario.override import scenario_with

    run = scenario_with(scenario).scenario.run
    need = run.warmup_s + CI_REQUESTS / lam
    return float(max(run.duration_s or 0.0, 60.0 * math.ceil(need / 60.0)))


# --- theory ---------------------------------------------------------------------------------------

def theory(scenario: str, configs: list[Config], wl: Workload, *, slos: dict, rho_max: float = RHO_MAX,
           budget_per_hour: float | None = None, inputs: dict | None = None) -> list[Candidate]:
    """Cost, rate bound and latency bounds of every configuration, and the pruning verdicts
    (see the module docstring). Replica-level closed forms are computed once per model, GPU, ``tp``,
    ``max_num_seqs`` and ``max_num_batched_tokens`` (and model). ``inputs``: the scenario overrides that
    replace the roofline (``step_time``, ``capacity_tokens``; :mod:`llmqueue.plan.inputs`)."""
    from llmqueue.plan.bounds import split_theory

    deploys: dict = {}
    replicas: dict = {}
    splits: dict = {}
    out = []
    for cfg in configs:
        key = (cfg.model, cfg.gpu, cfg.tensor_parallel_size, cfg.pipeline_parallel_size)
        if key not in deploys:
            model = {"model": cfg.model} if cfg.model else {}
            if cfg.pipeline_parallel_size > 1:
                model["pipeline_parallel_size"] = cfg.pipeline_parallel_size
            deploys[key] = try_deployment(scenario, cfg.gpu, cfg.tensor_parallel_size, **model, **(inputs or {}))
        c = Candidate(cfg, gpu_price(cfg.gpu) * cfg.gpus)
        out.append(c)
        dep = deploys[key]
        if isinstance(dep, str):
            n = cfg.tensor_parallel_size * cfg.pipeline_parallel_size
            where = f"{cfg.model} on {n} x {cfg.gpu}: " if cfg.model else ""
            c.status, c.reason = PRUNED, f"does not fit: {where}{dep}"
            continue
        M, st, thr, kv_tok = dep
        if cfg.disaggregated:
            t = split_theory(wl, M, st, prefill_replicas=cfg.prefill_replicas, decode_replicas=cfg.decode_replicas,
                             max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                             long_prefill_token_threshold=thr, kv_bytes_per_token=kv_tok,
                             kv_link_gbps=cfg.kv_link_gbps, kv_link_latency_ms=cfg.kv_link_latency_ms,
                             cache=splits.setdefault(key, {}))
            c.rate_bound, c.binding, c.stations = t.rate_bound, t.binding, t.stations
            c.ttft_bound_ms, c.tpot_bound_ms = t.ttft_ms, t.tpot_ms
            slots = cfg.prefill_replicas * cfg.max_num_seqs
            burst_rate = cfg.prefill_replicas * (t.stations["prefill_mu"] or math.inf)
        else:
            rkey = key + (cfg.max_num_seqs, cfg.max_num_batched_tokens)
            if rkey not in replicas:
                replicas[rkey] = replica_theory(wl, M, st, max_num_seqs=cfg.max_num_seqs,
                                                max_num_batched_tokens=cfg.max_num_batched_tokens,
                                                long_prefill_token_threshold=thr)
            r = replicas[rkey]
            c.rate_bound, c.binding = cfg.replicas * r.mu, r.binding
            c.ttft_bound_ms, c.tpot_bound_ms = r.ttft_ms, r.tpot_ms
            slots, burst_rate = cfg.replicas * cfg.max_num_seqs, c.rate_bound
        c.rho = wl.lam / c.rate_bound
        c.reason = (_prune_reason(c, slos, rho_max, budget_per_hour)
                    or _burst(wl, slos, rho_max, rate=burst_rate, slots=slots))
        if c.reason is not None:
            c.status = PRUNED
    return out


def _prune_reason(c: Candidate, slos: dict, rho_max: float, budget) -> str | None:
    if budget is not None and c.cost_per_hour > budget:
        return f"over budget: ${c.cost_per_hour:.2f}/h > ${budget:g}/h"
    if c.rho > rho_max:
        what = "min(P mu_P, D mu_D / q, link)" if c.config.disaggregated else "R mu"
        return (f"rate bound: rho = lam / ({what}) = {c.rho:.3g} > {rho_max:g} ({what} = {c.rate_bound:.4g} req/s, "
                f"{c.binding} binds)")
    for metric, bound in (("ttft", c.ttft_bound_ms), ("tpot", c.tpot_bound_ms)):
        for key, target in slos.items():
            if key.endswith(f"_{metric}_ms") and bound is not None and bound > target:
                return f"latency bound: one request alone has {metric.upper()} {bound:.4g} ms > {key} {target:g} ms"
    return None


def _burst(wl: Workload, slos: dict, rho_max: float, *, rate: float, slots: int) -> str | None:
    """The burst bound (:mod:`llmqueue.plan.burst`) on each TTFT percentile target: ``rate`` and
    ``slots`` of the replicas that make first tokens (all of them, or a split's prefill pool)."""
    from llmqueue.plan.burst import burst_reason
    from llmqueue.plan.slo_judge import percentile_of

    if math.isinf(rate):
        return None
    for key, target in slos.items():
        if key.endswith("_ttft_ms"):
            r = burst_reason(wl.arrivals, wl.warmup_s, rate_bound=rate, rho_max=rho_max,
                             slots=slots, ttft_target_ms=target,
                             share=1.0 - percentile_of(key) / 100.0)
            if r is not None:
                return r
    return None


def check_possible(cands: list[Candidate], wl: Workload, slos: dict, rho_max: float, budget) -> None:
    """One-line :class:`InputError` when theory rules out every configuration (an empty space,
    a model that fits nowhere, a budget below every candidate, an SLO below every single-request
    latency, a rate no candidate carries)."""
    if not cands:
        raise InputError("gpus", "the configuration space is empty", "give at least one value on every axis")
    fits = [c for c in cands if not (c.reason or "").startswith("does not fit")]
    if not fits:
        raise InputError("gpus", f"the model fits no candidate ({cands[0].reason[len('does not fit: '):]})",
                         "add larger GPUs or tensor-parallel sizes (--gpus, --tp)")
    cheapest = min(fits, key=Candidate.order)
    if budget is not None and cheapest.cost_per_hour > budget:
        raise InputError("budget_per_hour", f"${budget:g}/h is below the cheapest candidate "
                         f"${cheapest.cost_per_hour:.2f}/h ({cheapest.config.label()})",
                         "raise the budget or add cheaper GPUs (--gpus)")
    affordable = [c for c in fits if budget is None or c.cost_per_hour <= budget]
    for metric, what in (("ttft", "prefill"), ("tpot", "decode step")):
        keys = [k for k in slos if k.endswith(f"_{metric}_ms")]
        bounds = [c for c in affordable if getattr(c, f"{metric}_bound_ms") is not None]
        if not keys or not bounds:
            continue
        best = min(bounds, key=lambda c: getattr(c, f"{metric}_bound_ms"))
        b = getattr(best, f"{metric}_bound_ms")
        for k in keys:
            if slos[k] < b:
                word = k.split("_", 1)[0]
                raise InputError(f"slo_{metric}_ms", f"{word} {metric.upper()} {slos[k]:g} ms is below the fastest "
                                 f"single-request {what} {b:.3g} ms on {best.config.gpu} tp{best.config.tensor_parallel_size} "
                                 f"(mean prompt {wl.mean_prompt:.0f} tokens)", "relax the target or add faster GPUs")
    if all(c.status == PRUNED for c in cands):
        top = max(affordable, key=lambda c: c.rate_bound or 0.0)
        if all((c.rho or math.inf) > rho_max for c in affordable):
            raise InputError("replicas", f"no candidate carries lam = {wl.lam:.4g} req/s at rho <= {rho_max:g}: the "
                             f"largest rate bound is {top.rate_bound:.4g} req/s ({top.config.label()})",
                             "allow more replicas (--replicas) or larger GPUs")
        raise InputError("gpus", f"theory rules out all {len(cands)} configurations (budget, rate or latency "
                         "bounds)", "see plan.json for each one's reason; widen the space")


# --- simulation -----------------------------------------------------------------------------------

def simulate_configs(scenario: str, configs: list[Config], slos: dict, *, duration: float, seed: int,
                     backend=None, out_dir=None, bar=None, stats=None, inputs: dict | None = None) -> list[dict]:
    """Simulate each configuration on the fleet simulator (the scenario's workload, ``duration``
    seconds, seed ``seed`` for all; ``inputs``: the step model and ``M`` replacing the roofline)
    and judge it; one brief dict each (p99s with CIs, verdict, ``meets``, ``reasons``,
    throughput, cost per million output tokens)."""
    from llmqueue.plan.slo_judge import judge
    from llmqueue.plan.sweep_run import run_points
    from llmqueue.spec import scenario_spec

    base = {"scenario": scenario, "duration": duration, "seed": seed, **(inputs or {})}
    pts = run_points(scenario_spec, base, [c.point() for c in configs], seeds="common", backend=backend,
                     cache_dir=out_dir, bar=bar, stats=stats)
    out = []
    for cfg, p in zip(configs, pts):
        s = p.summary
        j = judge(s, slos)
        thr = s.get("output_throughput")
        cost = gpu_price(cfg.gpu) * cfg.gpus
        brief = {"meets": j["meets"], "reasons": j["reasons"], "basis": j["basis"], "verdict": s.get("verdict"),
                 "stable": s.get("stable"), "failed_share": j["failed_share"],
                 "request_throughput": s.get("request_throughput"), "output_throughput": thr,
                 "cost_per_million_output_tokens": cost / (thr * 3600) * 1e6 if thr else None,
                 "completed": s.get("completed"), "key": p.key}
        for k in ("p99_ttft_ms", "p99_tpot_ms", *slos):
            brief[k] = s.get(k)
            brief[k + "_ci"] = s.get(k + "_ci")
        out.append(brief)
    return out


def plan(scenario: str | None, *, slos: dict, gpus, tp, replicas, max_num_seqs, max_num_batched_tokens, routers,
         pd_splits=(), kv_link_gbps: float | None = None, kv_link_latency_ms: float | None = None,
         budget_per_hour: float | None = None, duration: float | None = None, seed: int | None = None,
         rho_max: float = RHO_MAX, backend="serial", workers: int | None = None, address: str | None = None,
         out_dir=None, progress: bool = False, sensitivity: bool = False, calibration=None, step_time=None,
         stop_after: int | None = None, models=None, trace=None, workload=None,
         speed_spread: float | None = None, pp=(1,)) -> PlanResult:
    """The cheapest configuration of the space meeting ``slos`` (see the module docstring).

    ``pd_splits``: ``(P, D)`` pairs added to the space beside the aggregated ``replicas``, their
    KV link ``kv_link_gbps`` / ``kv_link_latency_ms`` (default 100 Gbit/s, 0.05 ms).
    ``calibration`` / ``step_time``: a measured step model (and ``M``) in place of the roofline
    (:mod:`llmqueue.plan.inputs`). With ``sensitivity``, also the probability that the engine's
    run-to-run speed spread (``speed_spread``, else the calibration's, else a stated default)
    makes the recommendation miss the SLOs or preempt (:mod:`llmqueue.plan.tipping`,
    ``meta["tipping"]``). ``models``: the model axis (catalog names; default: the
    scenario's model). ``trace`` / ``workload``: the workload in place of the scenario's
    (:mod:`llmqueue.plan.workload_source`; ``scenario`` may then be None). ``out_dir``: the point cache; a rerun with the same one
    simulates only what is not there yet (``meta["resumed"]``). ``stop_after``: raise
    ``KeyboardInterrupt`` after that many simulations (an interrupted plan, for tests)."""
    from llmqueue._progress import bar as progress_bar
    from llmqueue.plan.backends import get_backend
    from llmqueue.plan.space import configurations
    from llmqueue.plan.sweep_run import RunStats, base_seed
    from llmqueue.spec import scenario_spec

    if not slos:
        raise InputError("slo_ttft_ms", "no SLO targets", "give --slo-ttft-p99-ms and/or --slo-tpot-p99-ms")
    if budget_per_hour is not None and not budget_per_hour > 0:
        raise InputError("budget_per_hour", f"must be positive (got {budget_per_hour:g})")
    from llmqueue.plan.inputs import step_inputs
    from llmqueue.plan.space import DEFAULT_KV_LINK_GBPS, DEFAULT_KV_LINK_LATENCY_MS

    t0 = time.perf_counter()
    link = (DEFAULT_KV_LINK_GBPS if kv_link_gbps is None else float(kv_link_gbps),
            DEFAULT_KV_LINK_LATENCY_MS if kv_link_latency_ms is None else float(kv_link_latency_ms))
    if not link[0] > 0:
        raise InputError("kv_link_gbps", f"must be positive (got {link[0]:g})", "e.g. --kv-link-gbps 100")
    if not (link[1] >= 0 and math.isfinite(link[1])):
        raise InputError("kv_link_latency_ms", f"must be >= 0 (got {link[1]:g})")
    from llmqueue.plan.space import model_names
    from llmqueue.plan.workload_source import plan_scenario

    given = scenario
    models = model_names(models) if models is not None else ()
    if (calibration is not None or step_time is not None) and len(models) > 1:
        step_inputs(given or "", calibration=calibration, step_time=step_time, gpus=gpus, tp=tp, models=models)
    src = plan_scenario(scenario, trace=trace, workload=workload, models=models, gpus=gpus, tp=tp,
                        duration=duration)
    scenario, duration = src.scenario, src.duration
    if not models:
        from llmqueue.scenario.override import scenario_with

        models = (str(scenario_with(scenario).scenario.deployment.model),)
    inputs = step_inputs(scenario, calibration=calibration, step_time=step_time, gpus=gpus, tp=tp, models=models)
    seed = base_seed(scenario_spec, {"scenario": scenario}) if seed is None else int(seed)
    wl = scenario_workload(scenario, seed=seed, duration=duration)
    if duration is None:  # the burst bound needs the whole arrival path the simulation serves
        duration = default_duration(scenario, wl.lam)
        wl = scenario_workload(scenario, seed=seed, duration=duration)
    duration = float(duration)
    configs = configurations(gpus=gpus, tp=tp, replicas=replicas, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, routers=routers, pd_splits=pd_splits,
                             kv_link_gbps=link[0], kv_link_latency_ms=link[1], models=models, pp=pp)
    cands = theory(scenario, configs, wl, slos=slos, rho_max=rho_max, budget_per_hour=budget_per_hour,
                   inputs=inputs.overrides)
    check_possible(cands, wl, slos, rho_max, budget_per_hour)
    t_theory = time.perf_counter() - t0
    todo = sorted((c for c in cands if c.status != PRUNED), key=Candidate.order)
    own = not hasattr(backend, "map")
    be = get_backend(backend, workers=workers, address=address)
    width = max(1, be.workers) if be.workers else 1
    stats = RunStats()
    bar = progress_bar(len(todo), desc="plan", unit="sim", enabled=progress)
    rec = None
    try:
        i = 0
        while rec is None and i < len(todo):
            batch = todo[i:i + width]
            i += width
            if stop_after is not None and stats.ran >= stop_after:
                raise KeyboardInterrupt(f"stopped after {stats.ran} simulations")
            briefs = simulate_configs(scenario, [c.config for c in batch], slos, duration=duration, seed=seed,
                                      backend=be, out_dir=out_dir, bar=bar, stats=stats, inputs=inputs.overrides)
            for c, b in zip(batch, briefs):
                c.status, c.result = SIMULATED, b
                c.reason = None if b["meets"] else "; ".join(b["reasons"])
            rec = next((c for c in batch if c.meets), None)
            if rec is None:
                bar.set_postfix_str(f"cheapest tried ${batch[-1].cost_per_hour:.2f}/h")
        sens = tipped = None
        if sensitivity and rec is not None:
            from llmqueue.plan.sensitivity import sensitivity as run_sensitivity

            sens = run_sensitivity(scenario, rec.config, slos, lam=wl.lam, warmup_s=wl.warmup_s, duration=duration,
                                   seed=seed, backend=be, out_dir=out_dir, inputs=inputs.overrides)
            from llmqueue.margin import speed_spread_for
            from llmqueue.plan.sweep_run import point_params
            from llmqueue.plan.tipping import speed_tipping
            from llmqueue.spec import scenario_spec

            spread = speed_spread_for(speed_spread, calibration=_calibration_doc(calibration))
            params, _ = point_params(scenario_spec, {"scenario": scenario, "duration": duration, "seed": seed,
                                                     **inputs.overrides}, rec.config.point(), "common")
            tipped = speed_tipping(scenario_spec, params, slos=slos, spread=spread[0], source=spread[1], backend=be)
        described = be.describe()
    finally:
        bar.close()
        if own:
            be.close()
    meta = {"scenario": given, "plan_scenario": scenario, "workload_source": src.source,
            "workload_notes": src.notes, "models": list(models), "duration_s": duration, "seed": seed, "rho_max": rho_max,
            "budget_per_hour": budget_per_hour, "mean_prompt_tokens": wl.mean_prompt,
            "mean_output_tokens": float(wl.output.mean()), "backend": described,
            "simulations_run": stats.ran, "simulations_cached": stats.cached, "theory_wall_s": t_theory,
            "resumed": {"cached": stats.cached, "points": stats.ran + stats.cached},
            "wall_s": time.perf_counter() - t0, "step_model_source": inputs.source, "step_inputs": inputs.overrides,
            "space": {"models": list(models), "gpus": sorted({c.gpu for c in configs}), "tp": list(tp), "pp": list(pp),
                      "replicas": list(replicas),
                      "pd_splits": [f"{p}:{d}" for p, d in pd_splits],
                      "kv_link_gbps": link[0] if pd_splits else None,
                      "kv_link_latency_ms": link[1] if pd_splits else None,
                      "max_num_seqs": list(max_num_seqs), "max_num_batched_tokens": list(max_num_batched_tokens),
                      "routers": list(routers)}}
    if sens is not None:
        meta["sensitivity"] = sens
    if tipped is not None:
        meta["tipping"] = tipped
    from llmqueue.plan.workload_source import keep_copy

    keep_copy(src, out_dir)
    return PlanResult(cands, rec, dict(slos), wl.lam, meta)


def _calibration_doc(calibration) -> dict | None:
    """The calibration file's fields (its speed spread), or None without one."""
    if calibration is None:
        return None
    from llmqueue.bench.calibrate import load_calibration

    return load_calibration(calibration)
