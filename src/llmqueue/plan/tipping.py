"""Tipping under the engine's run-to-run speed spread, for a planned or searched deployment.

``simulate --margin`` and ``validate --margin`` search one replica's distance to the preemption
cliff (:mod:`llmqueue.margin`). A plan or a capacity answer is a whole deployment (replicas behind
a router, pools, P/D) judged against SLO targets, so here the same idea runs on the deployment
itself, through the sweep machinery (any backend, the same seed): the engine's step time is
multiplied by a factor ``f`` (every step ``f`` times as long: ``mu`` falls by ``1/f``) and two
cliffs are searched by bisection,

- ``slo``: the smallest ``f`` at which the deployment no longer meets its SLO targets
  (:func:`llmqueue.plan.slo_judge.judge`, the rule the answer was found with);
- ``preemption``: the smallest ``f`` at which any replica preempts (recomputation: the KV-bound
  engine's thrashing state, seed 004's cliff).

Where the deployment already fails (or preempts) at ``f = 1``, the search runs below one: the
largest ``f < 1`` at which it would not. With the engine's speed on a run modelled as
``S = exp(sigma Z)`` (:func:`llmqueue.margin.tip_probability`), the probability of tipping is
``P(S > f) = 1 - Phi(ln f / sigma)``. The bracket is ``[exp(-4 sigma), exp(4 sigma)]``: beyond it
the probability is below 3e-5 (or above 1 - 3e-5), said as a bound; ``steps`` halvings narrow the
cliff to ``8 sigma / 2**steps`` on the log scale (5 halvings at sigma 7 %: 1.8 %, a few points of
probability). Each factor is one simulation of the deployment; the two searches share their
factors' simulations where they coincide.
"""

from __future__ import annotations

import importlib
import math

REACH = 4.0   # the bracket's half-width, in sigmas of ln S
STEPS = 5     # bisection halvings per cliff


def scale_steps(spec, step_scale: float):
    """``spec`` with every step ``step_scale`` times as long (the engine's and each fleet pool's
    step-time model, :meth:`scaled`)."""
    if step_scale != 1.0:
        spec.step_time = spec.step_time.scaled(step_scale)
        for p in spec.fleet.pools if spec.fleet is not None else ():  # a P:D split: both pools
            p.step_time = p.step_time.scaled(step_scale)
    return spec


def scaled_spec(*, factory: str, step_scale: float = 1.0, **kw):
    """The SimSpec of the factory named ``factory`` (``module:name``, :func:`factory_name`) with
    every step ``step_scale`` times as long (module-level, so process pools and Ray can run it)."""
    mod, name = factory.split(":", 1)
    return scale_steps(getattr(importlib.import_module(mod), name)(**kw), float(step_scale))


def preempted(summary: dict) -> bool | None:
    """Whether a simulated point preempted anyone (None: a summary without the count)."""
    n = summary.get("preemptions")
    return None if n is None else n > 0


def speed_tipping(factory, params: dict, *, slos: dict, spread: float, source: str, backend=None,
                  steps: int = STEPS) -> dict:
    """The two cliffs and their tipping probabilities for the deployment ``factory(**params)``
    (the module docstring). ``params``: the point's full keywords, seed included. Returns
    ``{"spread", "spread_source", "slo": {...}, "preemption": {...}, "simulations"}``, each cliff
    ``{"at_calibrated_speed", "cliff_speed_factor", "probability", "bound"}``."""
    from llmqueue.plan.points import factory_name
    from llmqueue.plan.slo_judge import judge
    from llmqueue.plan.sweep_run import run_points

    sigma = float(spread)
    if not (sigma > 0 and math.isfinite(sigma)):
        from llmqueue.errors import InputError

        raise InputError("speed_spread", f"must be a positive fraction (got {spread!r})", "e.g. 0.07 for 7 %")
    base = {**params, "factory": factory_name(factory)}
    seen: dict[float, dict] = {}

    def run(factors) -> None:
        new = [f for f in dict.fromkeys(factors) if f not in seen]
        if not new:
            return
        pts = run_points(scaled_spec, base, [{"step_scale": f} for f in new], seeds="common", backend=backend)
        for f, p in zip(new, pts):
            seen[f] = {"meets": judge(p.summary, slos)["meets"], "preempts": preempted(p.summary)}

    def fails(kind: str, f: float) -> bool | None:
        r = seen[f]
        return (not r["meets"]) if kind == "slo" else r["preempts"]

    lo, hi = math.exp(-REACH * sigma), math.exp(REACH * sigma)
    run([1.0])
    kinds = ["slo"] + (["preemption"] if seen[1.0]["preempts"] is not None else [])
    # each cliff's bracket: (last factor that holds, first that fails), searched above or below 1
    br = {}
    for k in kinds:
        br[k] = [lo, 1.0] if fails(k, 1.0) else [1.0, hi]
    run([b[0] if fails(k, 1.0) else b[1] for k, b in br.items()])
    out: dict = {"spread": sigma, "spread_source": source}
    live = []
    for k in kinds:
        a, b = br[k]
        edge = a if fails(k, 1.0) else b
        if fails(k, 1.0) and fails(k, edge):      # fails even at the fastest engine searched
            out[k] = _cliff(False, lo, sigma, ">=")
        elif not fails(k, 1.0) and not fails(k, edge):  # holds even at the slowest
            out[k] = _cliff(True, hi, sigma, "<=")
        else:
            live.append(k)
    for _ in range(steps):
        if not live:
            break
        mids = {k: math.sqrt(br[k][0] * br[k][1]) for k in live}
        run(list(mids.values()))
        for k, m in mids.items():
            if fails(k, m):
                br[k][1] = m
            else:
                br[k][0] = m
    for k in live:
        out[k] = _cliff(not fails(k, 1.0), br[k][1], sigma, "")
    out["simulations"] = len(seen)
    return out


def _cliff(holds: bool, f: float, sigma: float, bound: str) -> dict:
    from llmqueue.margin import tip_probability

    return {"at_calibrated_speed": "holds" if holds else "fails", "cliff_speed_factor": f,
            "probability": tip_probability(f, sigma), "bound": bound}


def tipping_lines(t: dict) -> list[str]:
    """Printed lines: one per cliff, after the verdict at the calibrated speed."""
    what = {"slo": ("meets the SLOs", "miss the SLOs"), "preemption": ("no preemption", "tip it into preemption")}
    out = []
    for k in ("slo", "preemption"):
        c = t.get(k)
        if not c:
            continue
        state = what[k][0] if c["at_calibrated_speed"] == "holds" else ("misses the SLOs" if k == "slo" else "preempts")
        f = c["cliff_speed_factor"]
        where = {"<=": f"no cliff up to x{f:.3g} the step time", ">=": f"still at x{f:.3g} the step time"}.get(
            c["bound"], f"the cliff at x{f:.3g} the step time")
        out.append(f"{state} at the modelled speed; {share_text(c['probability'], c['bound'])} of engine speeds "
                   f"(run-to-run spread {100 * t['spread']:.3g} %, {t['spread_source']}) {what[k][1]} "
                   f"({where}; {t['simulations']} simulations)")
    return out


def share_text(p: float, bound: str = "") -> str:
    """A probability as a share of runs: ``37 %``, ``< 1 %`` / ``> 99 %`` at the ends (a bound
    from a cliff outside the search reads "under" / "over")."""
    if p < 0.01:
        return "under 1 %" if bound or p < 0.005 else "1 %"
    if p > 0.99:
        return "over 99 %" if bound or p > 0.995 else "99 %"
    return f"{100 * p:.0f} %"
