"""How robust the planner's answer is: the recommended deployment under perturbed conditions.

The planner verifies one configuration against one arrival path. Each row here simulates the
same configuration (same seed, same duration, judged by :func:`llmqueue.plan.slo_judge.judge`)
with one thing changed:

- ``+20% traffic``: the arrival process rescaled to ``1.2 lam``, keeping its shape (levels,
  windows, burstiness): the load ``rho`` rises by 20%;
- ``burstier arrivals``: a Gamma renewal process ``gamma:lam:cv=2`` at the same mean rate
  (squared CV 4 against a Poisson stream's 1: by Kingman's approximation roughly 2.5x the mean
  queueing delay of a Poisson stream at the same load);
- ``spike x2 for 15 min``: the stationary stream at ``lam`` with its rate doubled for 900 s
  (``spike:lam:k=2:at=T:for=900``, ``T`` after the warm-up), seed 000's shape: a transient
  overload when ``2 lam > R mu``, whose backlog ``(2 lam - R mu) 900`` drains afterwards;
- ``engine 10% slower``: every step time x 1.1 (the step-time model's ``scaled``): ``mu``
  falls by about 9%, the load rises by 10%.

For a **replayed trace** (``llmqueue plan --trace``) the recorded arrival times are the
workload, so: ``+20% traffic`` replays the same requests with the trace's time axis scaled by
1/1.2 (``workload.trace.rate`` = ``1.2 lam``: every gap 1/1.2 as long, the burst pattern kept);
the burstier-arrivals and spike rows are *refused* (``refused`` says why, no simulation):
replacing the trace's arrival times by a Gamma or spike process would no longer be the trace.
Plan with ``--workload`` (a fitted workload) to vary its arrival process.

The **margin** is the highest rate (the scenario's arrival process rescaled, its shape kept) at
which the configuration still meets the SLOs: :func:`llmqueue.plan.capacity.capacity_search` on
that configuration; ``margin_factor`` = margin / ``lam``.
"""

from __future__ import annotations

SPIKE_S = 900.0
SPEC_ROWS = ("base", "+20% traffic", "burstier arrivals (gamma cv=2)", "spike x2 for 15 min", "engine 10% slower")


def slower_scenario_spec(*, step_scale: float = 1.0, **kw):
    """:func:`llmqueue.spec.scenario_spec` with every step ``step_scale`` times as long (a spec
    factory, module-level so process pools and Ray can run it)."""
    from llmqueue.plan.tipping import scale_steps
    from llmqueue.spec import scenario_spec

    return scale_steps(scenario_spec(**kw), step_scale)


#: Why a replayed trace refuses the rows that replace its arrival process.
TRACE_REFUSAL = ("a replayed trace keeps its recorded arrival times (its burstiness is the trace's own); "
                 "plan with --workload FILE (a fitted workload) to vary the arrival process")


def perturbations(lam: float, warmup_s: float, duration: float) -> list[tuple[str, dict]]:
    """``(row name, overrides)`` of each row (``step_scale`` selects the slower engine)."""
    at = warmup_s + max(0.0, (duration - warmup_s - SPIKE_S) / 2.0)
    return [("base", {}), ("+20% traffic", {"rate": 1.2 * lam}),
            ("burstier arrivals (gamma cv=2)", {"arrival": f"gamma:{lam:g}:cv=2"}),
            ("spike x2 for 15 min", {"arrival": f"spike:{lam:g}:k=2:at={at:g}:for={SPIKE_S:g}"}),
            ("engine 10% slower", {"step_scale": 1.1})]


def sensitivity(scenario: str, config, slos: dict, *, lam: float, warmup_s: float, duration: float, seed: int,
                backend="serial", out_dir=None, margin: bool = True, inputs: dict | None = None) -> dict:
    """The rows (see the module docstring) and the margin for ``config`` (``inputs``: the plan's
    step model and ``M``, :mod:`llmqueue.plan.inputs`)."""
    import time

    from llmqueue.plan.backends import get_backend

    t0 = time.perf_counter()
    own = not hasattr(backend, "map")
    backend = get_backend(backend)
    try:
        return _run(scenario, config, slos, lam, warmup_s, duration, seed, backend, out_dir, margin, t0, inputs or {})
    finally:
        if own:
            backend.close()


def _run(scenario, config, slos, lam, warmup_s, duration, seed, backend, out_dir, margin, t0, inputs) -> dict:
    import time

    from llmqueue.plan.capacity import capacity_search
    from llmqueue.plan.slo_judge import judge
    from llmqueue.plan.sweep_run import run_points
    from llmqueue.spec import scenario_spec

    from llmqueue.scenario.override import scenario_with

    replay = scenario_with(scenario).scenario.workload.trace is not None
    base = {"scenario": scenario, "duration": max(duration, warmup_s + SPIKE_S + 120.0), "seed": seed, **inputs,
            **config.point()}
    rows = []
    pert = perturbations(lam, warmup_s, base["duration"])
    refused = [(n, o) for n, o in pert if replay and "arrival" in o]
    pert = [(n, o) for n, o in pert if (n, o) not in refused]
    plain = [(n, o) for n, o in pert if "step_scale" not in o]
    slow = [(n, o) for n, o in pert if "step_scale" in o]
    pts = run_points(scenario_spec, base, [o for _, o in plain], seeds="common", backend=backend, cache_dir=out_dir)
    pts += run_points(slower_scenario_spec, base, [o for _, o in slow], seeds="common", backend=backend,
                      cache_dir=out_dir)
    for (name, o), p in zip(plain + slow, pts):
        s = p.summary
        j = judge(s, slos)
        row = {"case": name, "overrides": o, "meets": j["meets"], "reasons": j["reasons"], "basis": j["basis"],
               "verdict": s.get("verdict"), "failed_share": j["failed_share"]}
        for k in ("p99_ttft_ms", "p99_tpot_ms"):
            row[k], row[k + "_ci"] = s.get(k), s.get(k + "_ci")
        if replay and "rate" in o:
            row["how"] = "the trace's time axis scaled by 1/1.2 (the same requests, every gap 1/1.2 as long)"
        rows.append(row)
    for name, o in refused:
        rows.append({"case": name, "overrides": o, "meets": None, "refused": TRACE_REFUSAL, "reasons": [],
                     "basis": None, "verdict": None, "failed_share": None, "p99_ttft_ms": None,
                     "p99_ttft_ms_ci": None, "p99_tpot_ms": None, "p99_tpot_ms_ci": None})
    order = {n: i for i, n in enumerate(SPEC_ROWS)}
    rows.sort(key=lambda r: order.get(r["case"], len(order)))
    out = {"duration_s": base["duration"], "rows": rows, "margin_rate": None, "margin_factor": None}
    if margin:
        cap = capacity_search(scenario_spec, {k: v for k, v in base.items()}, slos=slos, backend=backend,
                              out_dir=out_dir, rel_tol=0.05, max_evals=16)
        r = getattr(cap, "rate", None)
        out["margin_rate"] = r
        out["margin_factor"] = None if r is None else r / lam
        out["margin_accepted"] = cap.accepted
    out["wall_s"] = time.perf_counter() - t0
    return out
