"""Regime margins: how far a run without preemption sits from a KV-bound engine's cliff.

A KV-bound replica has two capacities (Nie et al. 2026): the rate it sustains without preempting
anyone, and ``mu = M / (b E[g])``, the throughput of the thrashing state it falls into once
requests are preempted and recomputed. Between them the outcome sits on a cliff: a slightly
slower engine, or slightly more traffic, and the same arrivals tip into preemption. A verdict of
"stable" there says nothing about how close the cliff is; :func:`regime_margin` measures it by
simulating the same request stream again:

- ``speed_factor``: the smallest factor ``f`` (every step ``f`` times as long: an engine at
  ``1/f`` of the modelled speed) at which the same arrivals see a preemption, found by bisection
  on ``[1, max_factor]``;
- ``rate_factor``: the smallest factor ``k`` (arrival times divided by ``k``: ``k lam``, the
  process's shape kept) at which the unchanged engine preempts; ``k lam`` is the rate sustained
  without preemption.

A run whose ``speed_factor`` or ``rate_factor`` is within ``1 + margin`` is "metastable": a
``margin`` error in the calibration or the forecast crosses the cliff. Each bisection assumes
that preemption, once it appears, stays as the engine slows or the load grows; the simulations
reuse the run's seed, so the answer is reproducible.
"""

from __future__ import annotations

import copy
import math

import numpy as np

SIMULATIONS_PER_SEARCH = 7  # bisection steps: [1, 2] to about 1 %


def _rescaled(requests, k: float):
    """The stream with arrival times divided by ``k`` (rate ``k lam``, same shape)."""
    from llmqueue.workload.generate import RequestArrays

    names = np.asarray(requests.classes, dtype=object)[np.asarray(requests.class_index)]
    return RequestArrays(requests.request_id, np.asarray(requests.arrival_s) / k, requests.prompt_tokens,
                         requests.output_tokens, names)


def preemptions(spec, requests, *, speed: float = 1.0, rate: float = 1.0) -> int:
    """Preemptions when ``requests`` (arrival times divided by ``rate``) meet ``spec``'s engine with
    every step ``speed`` times as long; the run's own options (seed, horizon, client), no time
    series."""
    from llmqueue.engine import simulate

    opts = copy.copy(spec.options)
    opts.sample_dt = 0.0
    opts.progress = None
    opts.early_stop = False
    if opts.horizon_s is not None and rate != 1.0:
        opts.horizon_s = opts.horizon_s / rate
    model = spec.step_time.scaled(speed) if speed != 1.0 else spec.step_time
    res = simulate(spec.engine, model, _rescaled(requests, rate) if rate != 1.0 else requests, options=opts)
    return int(np.sum(res.requests["preemptions"]))


def _bisect(preempts, lo: float, hi: float, steps: int) -> tuple[float, float]:
    """Narrow ``[lo, hi]``, where ``preempts(lo) == 0 < preempts(hi)``, by ``steps`` halvings."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if preempts(mid) > 0:
            hi = mid
        else:
            lo = mid
    return lo, hi


def _cliff(preempts, hi: float, steps: int) -> float | None:
    """The smallest x in (1, hi] with ``preempts(x) > 0`` (to ``(hi - 1) / 2**steps``), given none
    at 1; None when there is none at ``hi`` either."""
    return None if preempts(hi) == 0 else _bisect(preempts, 1.0, hi, steps)[1]


def _cliff_below(preempts, lo: float, steps: int) -> float | None:
    """The largest x in [lo, 1) with ``preempts(x) == 0`` (to ``(1 - lo) / 2**steps``), given some
    at 1; None when there are some at ``lo`` too."""
    return None if preempts(lo) > 0 else _bisect(preempts, lo, 1.0, steps)[0]


def regime_margin(spec, requests, *, margin: float = 0.1, max_factor: float = 2.0,
                  steps: int = SIMULATIONS_PER_SEARCH) -> dict:
    """The run's distance to the preemption cliff (see the module docstring). Returns
    ``regime`` (``preempting``: the run already preempts; ``metastable``; ``clear``: no cliff within
    ``1 + margin``), ``speed_factor`` and ``rate_factor`` (None: none up to ``max_factor``),
    ``rate_without_preemption`` (``rate_factor`` x the run's mean arrival rate; for a run already
    preempting, the largest factor below 1 without preemption, searched down to
    ``1 / max_factor``), ``margin``,
    ``simulations`` and ``seed``."""
    if not (isinstance(margin, (int, float)) and 0 < margin < max_factor - 1):
        from llmqueue.errors import InputError

        raise InputError("margin", f"must be between 0 and {max_factor - 1:g} (got {margin!r})")
    n = [0]

    def count(speed=1.0, rate=1.0):
        n[0] += 1
        return preemptions(spec, requests, speed=speed, rate=rate)

    out: dict = {"margin": margin, "max_factor": max_factor, "seed": spec.options.seed}
    base = count()
    arr = np.asarray(requests.arrival_s)
    lam = (len(arr) - 1) / (arr[-1] - arr[0]) if len(arr) > 1 and arr[-1] > arr[0] else None
    if base > 0:
        # already past the cliff: the rate it would sustain without preemption, from below, and
        # the engine speed (a factor below one: faster) at which these arrivals would not preempt
        k = _cliff_below(lambda x: count(rate=x), 1.0 / max_factor, steps)
        g = _cliff_below(lambda x: count(speed=x), 1.0 / max_factor, steps)
        out.update(regime="preempting", preemptions=base, speed_factor=1.0, rate_factor=1.0,
                   rate_without_preemption=None if k is None or lam is None else k * lam,
                   speed_without_preemption=g, simulations=n[0])
        return out
    f = _cliff(lambda x: count(speed=x), max_factor, steps)
    k = _cliff(lambda x: count(rate=x), max_factor, steps)
    near = min(x for x in (f, k, math.inf) if x is not None)
    out.update(regime="metastable" if near <= 1 + margin else "clear", preemptions=0, speed_factor=f,
               rate_factor=k, rate_without_preemption=None if k is None or lam is None else k * lam,
               simulations=n[0])
    return out


DEFAULT_SPEED_SPREAD = 0.07   # run-to-run spread of an engine's speed when none was measured: vLLM's
# CPU build on one server moved about 7 % between runs (issue 36's held-out measurements)


def speed_spread_for(given, step_time=None, calibration: dict | None = None) -> tuple[float, str]:
    """(spread, source) for the tipping probability: ``given`` (``--speed-spread``), else the one
    ``calibration`` (a loaded calibration file) records, else the calibration file's of
    ``--step-time fitted:FILE``, else :data:`DEFAULT_SPEED_SPREAD`, said as a stated default."""
    if given is not None:
        if not (isinstance(given, (int, float)) and 0 <= float(given) < 1):
            from llmqueue.errors import InputError

            raise InputError("speed_spread", f"must be a fraction between 0 and 1 (got {given!r})", "e.g. 0.07 for 7 %")
        return float(given), "--speed-spread"
    if calibration is None and isinstance(step_time, str) and step_time.lower().startswith("fitted:"):
        from llmqueue._files import load_yaml

        path = step_time.split(":", 1)[1]
        calibration = load_yaml("step_time", path, what="calibration file") or {}
        calibration = dict(calibration, speed_spread_source=calibration.get("speed_spread_source") or f"from {path}") \
            if isinstance(calibration, dict) else None
    if isinstance(calibration, dict) and isinstance(calibration.get("speed_spread"), (int, float)):
        return float(calibration["speed_spread"]), calibration.get("speed_spread_source") or "the calibration's"
    return DEFAULT_SPEED_SPREAD, "a stated default (vLLM's CPU build moved about 7 % run to run); --speed-spread sets it"


def tip_probability(f: float, sigma: float) -> float:
    """``P(S > f)`` for the engine's step-time factor ``S = exp(sigma Z)``: the share of runs on
    which an engine whose cliff lies at the step-time factor ``f`` tips over it,
    ``1 - Phi(ln f / sigma)`` (``f > 1``: a cliff above the calibrated speed, ``P < 1/2``)."""
    from scipy.stats import norm

    return float(norm.sf(math.log(f) / sigma)) if sigma > 0 else float(f <= 1.0)


def tipping(m: dict, spread: float, source: str = "") -> dict:
    """The probability that the engine's run-to-run speed spread tips these arrivals over the
    preemption cliff, from the margin search ``m`` (no extra simulation).

    The engine's step-time factor on a given run is modelled as ``S = exp(sigma Z)``, ``Z``
    standard normal, ``sigma = spread`` (a log-scale sd: a speed is a positive factor, and 7 %
    either way is as likely). Preemption is monotone in the slow-down (the margin's premise), so a
    run tips when ``S`` passes the cliff's factor ``f``: ``P = 1 - Phi(ln f / sigma)``. A clear or
    metastable run's ``f`` is its ``speed_factor`` (none up to ``max_factor``: ``P <= 1 - Phi(ln
    max_factor / sigma)``); a preempting run's is the speed below one at which it would not
    preempt (``speed_without_preemption``; none down to ``1 / max_factor``: ``P ~ 1``).
    Returns ``{"probability", "spread", "spread_source", "cliff_speed_factor", "bound"}``
    (``bound``: "<=" or ">=" when the cliff lay outside the search)."""
    sigma = float(spread)
    if m.get("regime") == "preempting":
        f, bound = m.get("speed_without_preemption"), (">=" if m.get("speed_without_preemption") is None else "")
        f = f if f is not None else 1.0 / m.get("max_factor", 2.0)
    else:
        f, bound = m.get("speed_factor"), ("<=" if m.get("speed_factor") is None else "")
        f = f if f is not None else m.get("max_factor", 2.0)
    p = tip_probability(f, sigma)
    return {"probability": p, "spread": sigma, "spread_source": source, "cliff_speed_factor": f, "bound": bound}


def tipping_text(t: dict) -> str:
    """One line: how likely the engine's speed spread tips the run."""
    share = f"{t['bound']}{100 * t['probability']:.0f} %"
    return (f"{share} of engine speeds (run-to-run spread {100 * t['spread']:.3g} %, {t['spread_source']}) "
            f"tip it into preemption (the cliff at x{t['cliff_speed_factor']:.3g} the calibrated step time)")


def margin_verdict(m: dict) -> str | None:
    """The verdict's wording, replacing a "stable" one, for a run near or past the cliff: a
    metastable run, or one whose path already preempts without its queue growing ("at the
    cliff": between the two capacities of a KV-bound engine, seed 004's gap between
    ``mu (1 - delta)`` and ``mu``, where recomputation eats the margin). None for a clear run."""
    if m.get("regime") == "preempting":
        k = m.get("rate_without_preemption")
        return (f"at the cliff: no queue growth on this path, but it preempts ({m.get('preemptions')} "
                "preemptions, recomputed)" + (f"; {k:.4g} req/s is sustained without preemption" if k else ""))
    if m.get("regime") != "metastable":
        return None
    parts = []
    if m.get("speed_factor") is not None:
        parts.append(f"an engine {100 * (m['speed_factor'] - 1):.0f}% slower")
    if m.get("rate_factor") is not None:
        parts.append(f"{100 * (m['rate_factor'] - 1):.0f}% more traffic")
    return f"metastable: {' or '.join(parts)} tips the same arrivals into preemption (margin {100 * m['margin']:g}%)"


def margin_rows(m: dict) -> list[tuple]:
    """The margin as (label, value) rows for a printed table."""
    def factor(x):
        return "none up to x%g" % m["max_factor"] if x is None else f"x{x:.3g}"

    rows = [("preemption regime (margin %g%%)" % (100 * m["margin"]), m["regime"]),
            ("engine slow-down that tips it", factor(m["speed_factor"])),
            ("traffic factor that tips it", factor(m["rate_factor"])),
            ("rate sustained without preemption (req/s)", m["rate_without_preemption"])]
    if m.get("tipping"):
        rows.append(("tipping probability (engine speed spread)", tipping_text(m["tipping"])))
    return rows
