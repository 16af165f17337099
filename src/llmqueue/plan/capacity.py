"""SLO-bounded capacity: the highest arrival rate at which one deployment meets latency targets.

A rate meets the targets when :func:`~llmqueue.plan.slo_judge.judge` says its simulated run does
(the rule is in :mod:`llmqueue.plan.slo_judge`).

**The search** (:func:`capacity_search`) simulates the base point at its own rate (the probe),
takes the closed-form capacity ``mu`` of that run as the first upper bracket (the theory's
stability boundary; ``mu`` is checked, not trusted: if it meets the SLO the bracket doubles
until a rate fails) and narrows the bracket ``[lo, hi]`` (``lo`` the highest rate found to meet
the SLO, ``hi`` the lowest rate above it found to fail; ``lo = 0`` until a rate meets) by
k-section: each round simulates ``workers`` rates evenly spaced inside the bracket at once, on
the backend (bisection with one worker). It stops when ``hi - lo <= rel_tol * lo``. Every rate
is simulated with the same seed (common random numbers: the same arrival uniforms rescaled in
time, the same lengths), which makes the judgement close to monotone in the rate, as bisection
needs.

**The answer** is ``lo``, with two confirming simulations, judged the same way: at the answer
(the search's own run there) and at ``confirm_factor`` (1.1) times it. If the latter meets the
SLO after all (a non-monotone judgement), it becomes the new ``lo`` and the search goes on, so
the returned rate meets the SLO and 10% more does not. Uncertainty: the bracket ``[lo, hi]``
and its relative width, and the percentiles with their confidence intervals at the answer;
``replications`` further runs at the answer with fresh seeds show how much the answer depends
on the sampled workload (a bursty workload such as the ``chat`` scenario's on/off arrivals,
which vary over minutes, needs runs many times longer than its periods for a seed-independent
answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmqueue.errors import InputError
from llmqueue.plan.slo_judge import SLO_RULE, judge


@dataclass
class Evaluation:
    """One simulated rate of the search: the judgement and the point behind it."""

    rate: float
    meets: bool
    judgement: dict
    point: object  # PointResult

    def brief(self) -> dict:
        s = self.point.summary
        out = {"rate": self.rate, "meets": self.meets, "reasons": self.judgement["reasons"],
               "basis": self.judgement["basis"], "request_throughput": s.get("request_throughput"),
               "verdict": s.get("verdict"), "failed_share": self.judgement["failed_share"],
               "theory_mu": self.point.theory.get("mu"), "key": self.point.key}
        for k, c in self.judgement["checks"].items():
            out[k] = c["value"]
            out[k + "_ci"] = c["ci"]
        return out


@dataclass
class CapacityResult:
    """What :func:`capacity_search` returns (``rate`` None when no rate meets the SLO)."""

    rate: float | None
    lo: float
    hi: float | None
    slos: dict
    converged: bool
    confirm: dict
    evaluations: list[Evaluation]
    theory_mu: float | None
    replications: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        """The acceptance: the answer meets the SLO and ``confirm_factor`` x the answer does not."""
        c = self.confirm
        return bool(c) and c["at_rate"]["meets"] and not c["above"]["meets"]

    def to_dict(self) -> dict:
        from llmqueue.plan.points import jsonable

        width = (self.hi - self.lo) if self.hi is not None else None
        return jsonable({
            "rate": self.rate, "bracket": [self.lo, self.hi], "bracket_width": width,
            "bracket_rel_width": width / self.lo if width is not None and self.lo > 0 else None,
            "converged": self.converged, "accepted": self.accepted, "slos": self.slos, "slo_rule": SLO_RULE,
            "theory_mu": self.theory_mu, "confirm": self.confirm,
            "replications": self.replications,
            "evaluations": [e.brief() for e in sorted(self.evaluations, key=lambda e: e.rate)],
            **self.meta})


def capacity_search(factory, base: dict, *, slos: dict, rel_tol: float = 0.02, confirm_factor: float = 1.1,
                    lo: float | None = None, hi: float | None = None, max_evals: int = 60,
                    replications: int = 0, backend="local", workers: int | None = None,
                    address: str | None = None, out_dir=None, progress: bool = False,
                    target: dict | None = None, speed_spread: tuple | None = None) -> CapacityResult:
    """The highest arrival rate whose simulation meets ``slos`` (see the module docstring).

    ``factory``/``base``: as for :func:`llmqueue.plan.sweep_run.sweep`; every rate uses ``base``'s
    seed. ``lo``/``hi``: an initial bracket (``lo`` must meet and ``hi`` fail; otherwise the
    search moves them). ``out_dir``: the point cache (``points/``), shared with sweeps.
    ``target``: ``{"url", "model"}`` of an OpenAI-compatible server: each rate is then measured
    there (:func:`llmqueue.plan.sweep_run.bench_point`, one run at a time) instead of simulated,
    and judged by the same rule; no theory bound exists, so the bracket doubles until a rate fails.
    ``speed_spread``: ``(spread, source)``: at the answer, the probability that the engine's
    run-to-run speed spread makes it miss the SLOs or preempt (:mod:`llmqueue.plan.tipping`;
    ``meta["tipping"]``; simulated deployments only).
    """
    from llmqueue._validate import positive, positive_int
    from llmqueue.plan.backends import get_backend
    from llmqueue.plan.points import base_rate, derive_seed, factory_name, jsonable
    from llmqueue.plan.sweep_run import RunStats, base_seed, run_points

    if not slos:
        raise InputError("slo_ttft_ms", "no SLO targets", "give --slo-ttft-ms and/or --slo-tpot-ms (or a scenario "
                         "with slos:)")
    positive("rel_tol", rel_tol)
    if confirm_factor <= 1 + rel_tol:
        raise InputError("confirm_factor", f"must exceed 1 + rel_tol = {1 + rel_tol:g} (got {confirm_factor:g})",
                         "the bracket must be narrower than the confirmation step")
    positive_int("max_evals", max_evals)
    positive_int("replications", replications, minimum=0)
    stats = RunStats()
    on_server = {} if target is None else {"target": target}
    if target is not None:
        backend, workers = "serial", None  # one real server: its rates run one after another
    own = not hasattr(backend, "map")
    be = get_backend(backend, workers=workers, address=address)
    evals: dict[float, Evaluation] = {}
    base = {k: v for k, v in base.items() if k != "rate"}
    seed = base.get("seed")
    if seed is None:
        seed = base_seed(factory, base)
    base = {**base, "seed": seed}

    def run(rates) -> int:
        rates = list(dict.fromkeys(float(r) for r in rates if float(r) not in evals))
        if not rates:
            return 0
        if len(evals) + len(rates) > max_evals + 2:
            raise _Budget()
        bar.total = max(bar.total or 0, bar.n + len(rates))
        bar.refresh()
        pts = run_points(factory, base, [{"rate": r} for r in rates], seeds="common", backend=be, cache_dir=out_dir,
                         stats=stats, bar=bar, **on_server)
        for r, p in zip(rates, pts):
            j = judge(p.summary, slos)
            evals[r] = Evaluation(r, j["meets"], j, p)
        lo_, hi_ = bracket()
        left = _evals_left(lo_, hi_, width=max(1, be.workers), rel_tol=rel_tol, replications=replications)
        bar.total = min(bar.n + left, max_evals + 2 + replications)
        bar.set_postfix_str(f"bracket [{lo_:.4g}, {'?' if hi_ is None else f'{hi_:.4g}'}] req/s")
        return len(rates)

    def bracket():
        meet = [r for r, e in evals.items() if e.meets]
        lo_ = max(meet) if meet else 0.0
        fail = [r for r, e in evals.items() if not e.meets and r > lo_]
        return lo_, (min(fail) if fail else None)

    from llmqueue._progress import bar as progress_bar

    # one bar over the whole search: its total is the simulations run plus an estimate of those
    # still to come (the rounds left to narrow the bracket, the confirmation, the replications)
    guess = 1 + _evals_left(1.0, None, width=max(1, be.workers), rel_tol=rel_tol, replications=replications)
    bar = progress_bar(guess, desc="capacity", unit="sim", enabled=progress,
                       bar_format="{l_bar}{bar}| {n}/{total} sims (estimated) [{elapsed}<{remaining}]{postfix}")
    converged = False
    mu = None
    confirm: dict = {}
    reps: list = []
    try:
        r0 = float(lo) if lo is not None else base_rate(factory, base)
        try:
            run([r0] + ([float(hi)] if hi is not None else []))
            mu = evals[r0].point.theory.get("mu")
            converged = _search(run, bracket, evals, mu=mu, r0=r0, width=max(1, be.workers), rel_tol=rel_tol,
                                confirm_factor=confirm_factor)
        except _Budget:
            pass
        lo_, hi_ = bracket()
        if lo_ > 0:
            try:
                run([lo_ * confirm_factor])
            except _Budget:
                pass
            lo_, hi_ = bracket()
            up = lo_ * confirm_factor
            if up in evals:
                confirm = {"at_rate": evals[lo_].brief(), "above": evals[up].brief(), "factor": confirm_factor}
            if replications:
                bar.total = bar.n + replications
                bar.set_postfix_str(f"replications at {lo_:.4g} req/s")
                pts = run_points(factory, base, [{"rate": lo_, "seed": derive_seed(seed, {"replication": i})}
                                                 for i in range(1, replications + 1)],
                                 backend=be, cache_dir=out_dir, stats=stats, bar=bar, **on_server)
                for p in pts:
                    j = judge(p.summary, slos)
                    reps.append(Evaluation(lo_, j["meets"], j, p).brief() | {"seed": p.seed})
        tipped = None
        if speed_spread is not None and target is None and lo_ > 0:
            from llmqueue.plan.sweep_run import point_params
            from llmqueue.plan.tipping import speed_tipping

            bar.set_postfix_str(f"engine speed spread at {lo_:.4g} req/s")
            params, _ = point_params(factory, base, {"rate": lo_}, "common")
            tipped = speed_tipping(factory, params, slos=slos, spread=speed_spread[0], source=speed_spread[1],
                                   backend=be)
        described = be.describe()
    finally:
        bar.close()
        if own:
            be.close()
    non_mono = sorted(r for r, e in evals.items() if not e.meets and r < lo_)
    meta = {"factory": factory_name(factory), "base": jsonable(base), "seed": seed, "rel_tol": rel_tol,
            "backend": described, "simulations": stats.ran, "cached": stats.cached, "wall_s": stats.wall_s,
            "non_monotone_failures_below": non_mono,
            "replications_meeting": sum(r["meets"] for r in reps) if reps else None,
            "search": "k-section on the rate, common random numbers (the base seed at every rate)",
            "target": target, "measured": target is not None}
    if tipped is not None:
        meta["tipping"] = tipped
    return CapacityResult(rate=lo_ if lo_ > 0 else None, lo=lo_, hi=hi_, slos=dict(slos), converged=converged,
                          confirm=confirm, evaluations=list(evals.values()), theory_mu=mu, replications=reps,
                          meta=meta)


def _search(run, bracket, evals, *, mu, r0, width, rel_tol, confirm_factor) -> bool:
    """Narrow the bracket until it is within ``rel_tol`` and ``confirm_factor`` x lo fails."""
    while True:
        lo_, hi_ = bracket()
        if hi_ is None:
            # no failing rate above lo yet: the theory's mu when doubling would reach it, else doubling
            top = max(evals)
            cands = [top * 2 ** (j + 1) for j in range(width)]
            if mu and top * (1 + rel_tol) < mu <= cands[-1] and mu not in evals:
                cands = [mu] + [top + (mu - top) * (j + 1) / width for j in range(width - 1)]
        elif lo_ > 0 and hi_ - lo_ <= rel_tol * lo_:
            up = lo_ * confirm_factor
            if up in evals and not evals[up].meets:
                return True
            cands = [up]  # if it meets, it is the new lo and the search goes on above it
        elif lo_ == 0 and hi_ <= r0 * 1e-3:
            return False  # nothing meets, even at a thousandth of the first rate
        else:
            # k-section; the theory's mu (an upper bound on the stable rates) goes in first
            cands = [mu] if mu and lo_ < mu < hi_ and mu not in evals else []
            top = cands[0] if cands else hi_
            k = width - len(cands)
            cands += [lo_ + (top - lo_) * (j + 1) / (k + 1) for j in range(k)]
        if not run(cands):
            return False


def _evals_left(lo: float, hi: float | None, *, width: int, rel_tol: float, replications: int) -> int:
    """A guess of the simulations a search still runs, for its progress bar: the k-section rounds
    (``width`` rates each, cutting the bracket ``width + 1`` ways) until it is within ``rel_tol``,
    one confirmation above it, and the replications. Without a failing rate yet, one more
    widening round and then a bracket as wide as its lower end; with no rate meeting yet, two
    rounds to find one first."""
    per_round = math.log(width + 1)
    if hi is None or lo <= 0:
        rounds = (1 if hi is None else 2) + math.ceil(math.log(1 / rel_tol) / per_round)
    else:
        rounds = max(0, math.ceil(math.log(max((hi - lo) / (rel_tol * lo), 1.0)) / per_round))
    return rounds * width + 1 + replications


class _Budget(Exception):
    """The search used up ``max_evals`` simulations."""
