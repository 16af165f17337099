"""The SLO judgement of a simulated run: does its summary meet latency targets?

:func:`judge`, for targets such as ``{"p99_ttft_ms": 2000, "p99_tpot_ms": 50}``,
says a simulated run *meets* them when all of these hold:

1. for every target, the **upper bound of the 95% confidence interval** of the simulated
   percentile (``p99_ttft_ms_ci``, batch means, :mod:`llmqueue.metrics.ci`) is at most the target:
   the run shows with 97.5% one-sided confidence that the percentile meets it. When the run has
   too few requests for an interval (a p99 interval needs about 10,000 requests in the window),
   the point estimate is judged instead and the judgement's ``basis`` says ``estimate``;
2. the share of arrived requests that ended rejected, timed out, cancelled or in error is at
   most ``1 - p/100`` (1% for p99 targets): those requests never got a latency, and counting only
   the survivors would let an overloaded run that sheds load pass;
3. the queue does not grow (the summary's stability verdict is ``stable``): the percentiles of
   an unstable run depend on its length and have no steady-state meaning.

The capacity search (:mod:`llmqueue.plan.capacity`), the sweep's SLO line
(:mod:`llmqueue.plan.sweep_run`), the planner and its sensitivity table all judge this way.
"""

from __future__ import annotations

from llmqueue.errors import InputError

SLO_RULE = ("a run meets the SLOs when (1) for each target the upper bound of the 95% CI of the simulated "
            "percentile is at most the target (the point estimate when the run is too short for an interval: "
            "basis 'estimate'), (2) at most 1 - p/100 of the arrived requests were rejected, timed out, "
            "cancelled or in error, and (3) the queue does not grow (verdict stable)")


def slo_targets(*, ttft_ms: float | None = None, tpot_ms: float | None = None, e2el_ms: float | None = None,
                itl_ms: float | None = None, percentile: float = 99) -> dict:
    """``{"p99_ttft_ms": ttft_ms, ...}`` for the targets given."""
    from llmqueue._validate import positive
    from llmqueue.metrics.summary import DEFAULT_PERCENTILES, percentile_word

    if percentile not in DEFAULT_PERCENTILES:
        raise InputError("percentile", f"{percentile:g} is not a percentile the summary reports",
                         f"choose one of {', '.join(f'{p:g}' for p in DEFAULT_PERCENTILES)}")
    word = percentile_word(percentile)
    out = {}
    for name, v in (("ttft", ttft_ms), ("tpot", tpot_ms), ("itl", itl_ms), ("e2el", e2el_ms)):
        if v is not None:
            out[f"p{word}_{name}_ms"] = positive(f"slo_{name}_ms", v)
    return out


def scenario_slos(scenario: str) -> dict:
    """A scenario's SLO targets (the global ``slos:`` section) as ``{"p99_ttft_ms": ms, ...}``."""
    from llmqueue.metrics.summary import percentile_word
    from llmqueue.scenario.override import scenario_with

    sc = scenario_with(scenario).scenario
    if sc.slos is None:
        return {}
    out = {}
    for metric, items in sc.slos.slos().items():
        for slo in items:
            out[f"p{percentile_word(slo.percentile)}_{metric}_ms"] = slo.max_s * 1e3
    return out


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def percentile_of(key: str) -> float:
    word = key.split("_", 1)[0][1:]
    return float(word)


def judge(summary: dict, slos: dict) -> dict:
    """Whether a run's summary meets the SLO targets (the rule in the module docstring).

    Returns ``{"meets", "basis" ("ci" | "estimate" | "mixed"), "checks": {target: {...}},
    "failed_share", "stable", "reasons": [...]}``.
    """
    if not slos:
        raise InputError("slo", "no SLO targets given", "give --slo-ttft-ms and/or --slo-tpot-ms")
    checks, reasons, bases = {}, [], set()
    for key, target in slos.items():
        v = summary.get(key)
        ci = summary.get(key + "_ci")
        if v is None:
            checks[key] = {"target": target, "value": None, "ci": None, "bound": None, "basis": None, "ok": False}
            reasons.append(f"{key}: no completed request")
            continue
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and ci[1] is not None:
            bound, basis = float(ci[1]), "ci"
        else:
            bound, basis = float(v), "estimate"
        bases.add(basis)
        ok = bound <= target
        checks[key] = {"target": target, "value": v, "ci": ci, "bound": bound, "basis": basis, "ok": ok}
        if not ok:
            what = "CI upper bound" if basis == "ci" else "estimate"
            reasons.append(f"{key} {what} {_num(bound)} > {_num(target)}")
    p = min(percentile_of(k) for k in slos)
    counts = summary.get("status_counts") or {}
    arrived = summary.get("arrivals") or sum(counts.values())
    from llmqueue.metrics.stability import FAILED_STATUSES

    failed = sum(int(counts.get(s, 0)) for s in FAILED_STATUSES)
    share = failed / arrived if arrived else 0.0
    allowed = 1 - p / 100
    if share > allowed + 1e-12:
        reasons.append(f"{share:.1%} of requests failed (> {allowed * 100:.3g}%)")
    stable = summary.get("stable")
    if stable is False and not str(summary.get("verdict", "")).startswith("overloaded"):
        # (an overloaded run's failures are named above: its allowed share is at most 1 - p/100)
        g = summary.get("queue_growth_per_s")
        reasons.append(f"queue grows {_num(g)} req/s" if isinstance(g, (int, float)) else "queue grows")
    basis = bases.pop() if len(bases) == 1 else ("mixed" if bases else None)
    return {"meets": not reasons, "basis": basis, "checks": checks, "failed_share": share,
            "allowed_failed_share": allowed, "stable": stable, "reasons": reasons}
