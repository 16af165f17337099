"""The batch-service model of Inference Foundations: ``T_svc(B) = T_fixed + t_req * B``.

A server runs requests in batches of ``B``. A batch takes

    T_svc(B) = T_fixed + t_req * B                       (Inference Foundations, equation 1)

seconds (``T_fixed``: per-pass overhead such as weight loading; ``t_req``: marginal
time per request), so the server's capacity is ``mu_eff(B) = B / T_svc(B)`` req/s,
rising towards ``1 / t_req``. With Poisson arrivals at ``lam`` req/s, Inference Foundations
treats each batch as one "super-request" of an M/D/1 queue whose arrival rate is
``lam / B`` and whose utilization is ``rho = lam * T_svc / B``; the
Pollaczek-Khinchine formula then gives the mean wait of a batch in the queue

    E[W] = lam * T_svc^2 / (2 B (1 - rho)),

and a request's mean response time is

    E[T] = E[W] + E[T_batch] + T_svc,   E[T_batch] = B / (2 lam)

(the mean time spent accumulating into a batch; with dynamic batching capped at
``B_max`` requests and ``T_max`` seconds it is ``B_max / (2 lam)`` when
``lam * T_max >= B_max`` and ``T_max / 2`` otherwise).

Naming. The library keeps the project's symbols: ``Wq`` is the seed's E[W]
(the wait of a batch in the queue), ``T_batch`` its E[T_batch], ``W`` its E[T]
(the whole response time) and ``L = lam * W`` the mean number of requests in the
system (Little's law). Times are in seconds, rates per second.

Also here:

- ``b_min_stability``: the smallest batch with ``mu_eff(B) > lam``,
  ``B_min = T_fixed lam / (1 - t_req lam)`` (Inference Foundations, step 2);
- ``b_min_target``: the smallest batch with ``rho <= rho_target``,
  ``B_min = lam T_fixed / (rho_target - lam t_req)`` (Inference Foundations, equation 2);
- ``choose_batch_size``: the five-step decision (largest ``B`` whose P99 meets the SLO);
- ``batch_action``: the recommended action of Inference Foundations' Table 2;
- a REFINEMENT of the seed's queue (``erlang_batch_wait``): batches that wait to be
  full are not a Poisson stream, they form an Erlang-B renewal stream, and the
  batch queue is E_B/D/1. Results of the refinement carry the suffix ``_refined``
  and never replace the seed's numbers.

Only the standard library is used (``math``, ``cmath``), so the CLI stays fast.
"""

from __future__ import annotations

import cmath
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from llmqueue._result import Result
from llmqueue._validate import nonnegative, positive, positive_int, probability
from llmqueue.errors import InputError

__all__ = [
    "Z_P99", "EXP_P99", "ACTIONS",
    "service_time", "BatchMin", "b_min_stability", "b_min_target", "accumulation_delay",
    "erlang_batch_wait", "BatchRow", "batch_row", "batch_action",
    "BatchDecision", "candidate_sizes", "choose_batch_size", "BatchTable", "batch_table",
]

#: z-value used by Inference Foundations for the normal-approximation P99: ``E[T] + 2.33 sigma_T``.
Z_P99 = 2.33
#: ``-ln(0.01)``: P99 of an exponential response time is ``-ln(0.01) E[T]`` (the seed's "4.6 E[T]").
EXP_P99 = math.log(100.0)

#: Inference Foundations, Table 2, in order of precedence, then "ok".
ACTIONS = (
    "increase batch size or add replicas",       # B < B_min: unstable
    "reduce batch size or add replicas",         # P99 > SLO
    "consider reducing replicas to save cost",   # rho < 0.5
    "add replicas for headroom",                 # rho > 0.85
    "ok",
)

_P99_METHODS = ("normal", "exponential")


# --- basic model ----------------------------------------------------------------------------------

def _model(lam, T_fixed, t_req) -> tuple[float, float, float]:
    return positive("lam", lam), positive("T_fixed", T_fixed), nonnegative("t_req", t_req)


def service_time(*, T_fixed: float, t_req: float, B: float) -> float:
    """``T_svc(B) = T_fixed + t_req * B`` (seconds; Inference Foundations, equation 1)."""
    T_fixed = positive("T_fixed", T_fixed)
    t_req = nonnegative("t_req", t_req)
    B = positive("B", B)
    return T_fixed + t_req * B


@dataclass(frozen=True)
class BatchMin(Result):
    """Smallest batch size meeting ``criterion``: ``B_min`` from the closed form, ``B_min_int`` rounded up.

    ``rho_target`` is ``None`` for the stability bound (criterion ``mu_eff(B) > lam``, i.e. ``rho < 1``).
    """

    B_min: float
    B_min_int: int
    criterion: str
    rho_target: float | None
    lam: float
    T_fixed: float
    t_req: float


def _round_up(raw: float, ok) -> int:
    """Smallest integer ``n >= 1`` with ``ok(n)``, starting from ``ceil(raw)`` and correcting rounding error."""
    n = max(1, math.ceil(raw - 1e-12 * max(1.0, abs(raw))))
    while not ok(n):
        n += 1
    while n > 1 and ok(n - 1):
        n -= 1
    return n


def b_min_stability(*, lam: float, T_fixed: float, t_req: float) -> BatchMin:
    """Smallest batch size with ``mu_eff(B) = B / T_svc(B) > lam`` (Inference Foundations, step 2).

    ``B_min = T_fixed lam / (1 - t_req lam)``; any smaller batch gives ``rho >= 1`` and
    an unbounded queue. Since ``mu_eff`` never exceeds ``1 / t_req``, no batch size is
    stable when ``lam * t_req >= 1``: that raises :class:`InputError`. ``B_min_int`` is the
    smallest integer strictly above the bound (at ``B = B_min`` exactly, ``mu_eff = lam``).
    """
    lam, T_fixed, t_req = _model(lam, T_fixed, t_req)
    if lam * t_req >= 1:
        raise InputError("lam", f"no batch size is stable: lam*t_req = {lam * t_req:.4g} >= 1 "
                                f"(capacity mu_eff(B) < 1/t_req = {1 / t_req:.4g} req/s for every B)",
                         "lower the arrival rate or add replicas")
    raw = T_fixed * lam / (1 - t_req * lam)
    n = _round_up(raw, lambda b: lam * (T_fixed + t_req * b) < b)
    return BatchMin(B_min=raw, B_min_int=n, criterion="mu_eff(B) > lam", rho_target=None,
                    lam=lam, T_fixed=T_fixed, t_req=t_req)


def b_min_target(*, lam: float, T_fixed: float, t_req: float, rho_target: float = 0.75) -> BatchMin:
    """Smallest batch size with utilization ``rho = lam T_svc(B) / B <= rho_target`` (Inference Foundations, equation 2).

    ``B_min = lam T_fixed / (rho_target - lam t_req)``. Needs ``rho_target > lam t_req``:
    ``rho`` falls with ``B`` towards ``lam t_req`` but never below it, so otherwise no
    batch size reaches the target (:class:`InputError`). Inference Foundations' worked example:
    ``lam=100, T_fixed=0.05, t_req=0.0005, rho_target=0.75`` gives 7.14, rounded up to 8.
    """
    lam, T_fixed, t_req = _model(lam, T_fixed, t_req)
    rho_target = probability("rho_target", rho_target)
    floor_ = lam * t_req
    if rho_target <= floor_:
        fix = (f"raise rho_target above {floor_:.4g}, or lower the arrival rate / add replicas" if floor_ < 1
               else "no batch size is even stable (lam*t_req >= 1): lower the arrival rate or add replicas")
        raise InputError("rho_target", f"no batch size reaches utilization {rho_target:g}: rho(B) falls towards "
                                       f"lam*t_req = {floor_:.4g} as B grows but never below it", fix)
    raw = lam * T_fixed / (rho_target - floor_)
    n = _round_up(raw, lambda b: lam * (T_fixed + t_req * b) / b <= rho_target * (1 + 1e-12))
    return BatchMin(B_min=raw, B_min_int=n, criterion="rho(B) <= rho_target", rho_target=rho_target,
                    lam=lam, T_fixed=T_fixed, t_req=t_req)


def accumulation_delay(*, lam: float, B: float, T_max: float | None = None) -> float:
    """Mean time a request spends waiting for its batch to form, ``E[T_batch]`` (Inference Foundations).

    Without a timeout: ``B / (2 lam)`` (Inference Foundations, Table 1). With dynamic batching capped at
    ``B`` (= ``B_max``) requests and ``T_max`` seconds: ``B / (2 lam)`` if ``lam T_max >= B``
    (the batch fills) else ``T_max / 2`` (the timeout fires). The factor 1/2 is the mean
    position of a request arriving uniformly in the batch window.
    """
    lam = positive("lam", lam)
    B = positive("B", B)
    if T_max is None:
        return B / (2 * lam)
    T_max = positive("T_max", T_max)
    return B / (2 * lam) if lam * T_max >= B else T_max / 2


# --- refinement: E_B/D/1 ------------------------------------------------------------------------

def _excess_poisson(m: float, k: int, tol: float, budget: list) -> float:
    """``E[(N - k)^+]`` for ``N ~ Poisson(m)``, ``m < k``: sum of positive terms, started in log space."""
    i = k + 1
    p = math.exp(-m + i * math.log(m) - math.lgamma(i + 1))
    s = 0.0
    j = 1
    while p > 0.0:
        t = j * p
        s += t
        budget[0] -= 1
        r = (j + 1) / j * m / (i + 1)   # ratio of the next term to this one (decreasing)
        if r < 1 and t * r / (1 - r) <= tol * s:
            break
        if budget[0] <= 0:
            raise _BudgetExceeded
        i += 1
        j += 1
        p *= m / i
    return s


class _BudgetExceeded(Exception):
    pass


def _wait_spitzer(lam: float, T: float, B: int, tol: float = 1e-13, budget: int | None = None) -> float:
    """``E[W] = sum_n (1/n) E[(n T - A_n)^+]``, ``A_n ~ Gamma(n B, lam)`` (Spitzer's identity).

    For ``X ~ Gamma(k, lam)`` and ``c > 0``: ``E[(c - X)^+] = c P(X <= c) - (k/lam) P_{k+1}(X <= c)``
    and ``P(X <= c) = P(N >= k)`` with ``N ~ Poisson(lam c)``, which collapses to
    ``E[(c - X)^+] = E[(N - k)^+] / lam``: a sum of positive terms, free of cancellation.
    """
    left = [budget if budget is not None else 10**9]
    total = 0.0
    prev = None
    n = 0
    while True:
        n += 1
        term = _excess_poisson(lam * n * T, n * B, tol, left) / (lam * n)
        total += term
        if term == 0.0:
            return total
        if prev is not None and term < prev:
            r = term / prev
            if term * r / (1 - r) <= tol * total:
                return total
        prev = term
        if left[0] <= 0:
            raise _BudgetExceeded


def _wait_roots(lam: float, T: float, B: int) -> float:
    """The E_B/D/1 mean wait from the roots of ``z^B = exp(-lam T (1 - z))`` inside the unit disc.

    Wiener-Hopf factorisation of Lindley's equation for Erlang-B interarrivals (phase rate
    ``lam``) and deterministic service ``T`` gives
    ``E[W] = ((lam T)^2 - B(B-1)) / (2 lam (B - lam T)) + (1/lam) sum_j 1/(1 - z_j)``
    over the ``B - 1`` roots ``z_j = w_j exp(-rho (1 - z_j))``, ``w_j = exp(2 pi i j / B)``,
    ``j = 1..B-1`` (``rho = lam T / B``). Exact like Spitzer's series, and fast in heavy traffic,
    but it cancels when the wait is tiny, so it is the fallback rather than the default.
    """
    rho = lam * T / B
    acc = 0.0
    for j in range(1, B):
        w = cmath.exp(2j * math.pi * j / B)
        z = w * math.exp(-rho)
        for _ in range(200):                   # Newton on z - w exp(-rho (1 - z))
            e = w * cmath.exp(-rho * (1 - z))
            dz = (z - e) / (1 - rho * e)
            z -= dz
            if abs(dz) < 1e-15:
                break
        acc += (1 / (1 - z)).real
    a = lam * T
    return max(0.0, (a * a - B * (B - 1)) / (2 * lam * (B - a)) + acc / lam)


def erlang_batch_wait(*, lam: float, T_svc: float, B: int, method: str = "auto") -> float:
    """REFINEMENT: exact mean wait of a full batch in the queue when batches wait until full.

    Requests arrive as a Poisson stream at ``lam``; every ``B`` consecutive requests form a
    batch, dispatched when its ``B``-th request arrives, to one FIFO server with deterministic
    service ``T_svc``. Batch interarrival times are then Gamma(``B``, ``lam``) (Erlang-B), not
    exponential, so the batch queue is E_B/D/1 rather than the M/D/1 that Inference Foundations' formula
    assumes; it waits less, since its arrivals are more regular (scv ``1/B`` instead of 1).

    ``method``: ``"spitzer"`` sums Spitzer's identity
    ``E[W] = sum_{n>=1} (1/n) E[(n T_svc - A_n)^+]``, ``A_n ~ Gamma(n B, lam)``, until the
    geometric tail is below ``1e-13`` relative; ``"roots"`` uses the root formula (see
    ``_wait_roots``); ``"auto"`` (default) runs Spitzer's series and falls back to the roots
    when the series needs many terms (heavy traffic). Both are exact; they agree to ~1e-10.

    Returns ``math.inf`` when ``rho = lam T_svc / B >= 1``. B = 1 reproduces M/D/1.
    """
    lam = positive("lam", lam)
    T_svc = positive("T_svc", T_svc)
    B = positive_int("B", B)
    if method not in ("auto", "spitzer", "roots"):
        raise InputError("method", f"unknown method {method!r}", "use 'auto', 'spitzer' or 'roots'")
    if lam * T_svc >= B:
        return math.inf
    if method == "roots":
        return _wait_roots(lam, T_svc, B)
    if method == "spitzer":
        return _wait_spitzer(lam, T_svc, B)
    try:
        return _wait_spitzer(lam, T_svc, B, budget=20_000)
    except _BudgetExceeded:
        return _wait_roots(lam, T_svc, B)


# --- one batch size -------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchRow(Result):
    """Inference Foundations' model at one batch size ``B`` (seconds, req/s), plus the E_B/D/1 refinement.

    ``B_eff``: requests per batch actually served (``B``, or ``max(1, lam T_max)`` when a
    timeout ``T_max`` fires first). ``T_svc = T_fixed + t_req B_eff``; ``mu_eff = B_eff / T_svc``;
    ``rho = lam T_svc / B_eff``; ``stable = rho < 1``.
    Seed model: ``Wq`` = E[W], the batch queue wait (M/D/1 on batches, P-K formula);
    ``T_batch`` = E[T_batch]; ``W`` = E[T] = ``Wq + T_batch + T_svc``; ``L = lam W``;
    ``sigma_T`` the model's standard deviation of the response time (or the user's sigma);
    ``P99_normal = W + 2.33 sigma_T``; ``P99_exponential = -ln(0.01) W`` (about 4.6 W).
    Refinement (E_B/D/1, batches that wait to be full; NaN when a timeout shortens batches):
    ``Wq_refined``; ``T_batch_refined = (B - 1) / (2 lam)``; ``W_refined``; ``L_refined``.
    ``action``: Inference Foundations Table 2 for this state (see :func:`batch_action`).
    Unstable rows carry ``math.inf`` waits (JSON null), never an error.
    """

    B: int
    B_eff: float
    T_svc: float
    mu_eff: float
    rho: float
    stable: bool
    Wq: float
    T_batch: float
    W: float
    L: float
    sigma_T: float
    P99_normal: float
    P99_exponential: float
    Wq_refined: float
    T_batch_refined: float
    W_refined: float
    L_refined: float
    action: str


def _sigma_model(lam: float, T: float, B: float, Wq: float, T_batch: float) -> float:
    """Standard deviation of the response time under the seed's model (see :func:`batch_row`)."""
    lam_b = lam / B
    rho = lam_b * T
    var_wq = Wq * Wq + lam_b * T ** 3 / (3 * (1 - rho))   # Takacs: M/D/1 waiting-time variance
    var_batch = T_batch * T_batch / 3                       # U(0, 2 E[T_batch])
    return math.sqrt(var_wq + var_batch)


def batch_action(*, B: float, B_min: float, rho: float, P99: float | None = None,
                 slo: float | None = None) -> str:
    """Inference Foundations, Table 2: the first matching row's action.

    ``B < B_min`` (or ``rho >= 1``) -> "increase batch size or add replicas" (unstable);
    ``P99 > slo`` -> "reduce batch size or add replicas" (skipped unless both are given);
    ``rho < 0.5`` -> "consider reducing replicas to save cost"; ``rho > 0.85`` -> "add replicas
    for headroom"; otherwise "ok".
    """
    if B < B_min or rho >= 1:
        return ACTIONS[0]
    if P99 is not None and slo is not None and P99 > slo:
        return ACTIONS[1]
    if rho < 0.5:
        return ACTIONS[2]
    if rho > 0.85:
        return ACTIONS[3]
    return ACTIONS[4]


def _p99_method(p99: str) -> str:
    if p99 not in _P99_METHODS:
        raise InputError("p99", f"unknown P99 approximation {p99!r}", "use 'normal' or 'exponential'")
    return p99


def _row(lam, T_fixed, t_req, B, T_max, sigma, slo, p99, B_min) -> BatchRow:
    inf, nan = math.inf, math.nan
    if T_max is not None and lam * T_max < B:
        B_eff = max(1.0, lam * T_max)
        T_batch = T_max / 2
        timeout = True
    else:
        B_eff = float(B)
        T_batch = B / (2 * lam)
        timeout = False
    T = T_fixed + t_req * B_eff
    rho = lam * T / B_eff
    stable = rho < 1
    if stable:
        Wq = lam * T * T / (2 * B_eff * (1 - rho))
        W = Wq + T_batch + T
        sig = sigma if sigma is not None else _sigma_model(lam, T, B_eff, Wq, T_batch)
        p99_n, p99_e = W + Z_P99 * sig, EXP_P99 * W
    else:
        Wq = W = sig = p99_n = p99_e = inf
    if timeout:
        Wq_r = T_batch_r = W_r = nan
    else:
        T_batch_r = (B - 1) / (2 * lam)
        Wq_r = erlang_batch_wait(lam=lam, T_svc=T, B=B) if stable else inf
        W_r = Wq_r + T_batch_r + T
    action = batch_action(B=B_eff, B_min=B_min, rho=rho, P99=p99_n if p99 == "normal" else p99_e, slo=slo)
    return BatchRow(B=B, B_eff=B_eff, T_svc=T, mu_eff=B_eff / T, rho=rho, stable=stable, Wq=Wq, T_batch=T_batch,
                    W=W, L=lam * W, sigma_T=sig, P99_normal=p99_n, P99_exponential=p99_e,
                    Wq_refined=Wq_r, T_batch_refined=T_batch_r, W_refined=W_r, L_refined=lam * W_r,
                    action=action)


def _stability_bound(lam: float, T_fixed: float, t_req: float) -> float:
    return T_fixed * lam / (1 - t_req * lam) if lam * t_req < 1 else math.inf


def _options(T_max, sigma, slo, p99):
    T_max = None if T_max is None else positive("T_max", T_max)
    sigma = None if sigma is None else nonnegative("sigma", sigma)
    slo = None if slo is None else positive("slo", slo)
    return T_max, sigma, slo, _p99_method(p99)


def batch_row(*, lam: float, T_fixed: float, t_req: float, B: int, T_max: float | None = None,
              sigma: float | None = None, slo: float | None = None, p99: str = "normal") -> BatchRow:
    """Inference Foundations' batch-service model at batch size ``B`` (one row of its Table 1).

    ``T_max``: dynamic-batching timeout (s); ``B`` is then the cap ``B_max`` and, when
    ``lam T_max < B``, the timeout fires first: ``E[T_batch] = T_max / 2`` and batches hold
    ``B_eff = max(1, lam T_max)`` requests on average (Inference Foundations' ``E[B]``), at which the
    service time, utilization and queue wait are evaluated (a mean-value approximation).

    Standard deviation ``sigma_T`` of the response time (for the P99 ``E[T] + 2.33 sigma_T``),
    assuming, as the seed's mean does: batches reach the queue as a Poisson stream at
    ``lam / B_eff`` with deterministic service ``T_svc`` (M/D/1), so the waiting-time variance
    is Takacs' ``Var(W) = E[W]^2 + lam_b E[S^3] / (3 (1 - rho))`` with ``E[S^3] = T_svc^3``;
    a request's accumulation wait is uniform on ``(0, 2 E[T_batch])`` (the seed's factor 1/2),
    variance ``E[T_batch]^2 / 3``; service adds no variance; the parts are independent.
    ``sigma``, if given (s), replaces the model's ``sigma_T``. ``slo`` (s) and ``p99``
    (``"normal"`` or ``"exponential"``) only feed the row's Table 2 ``action``.

    Inference Foundations, Table 1 (``lam=100, T_fixed=0.05, t_req=0.0005``): ``B=8`` gives
    ``T_svc=0.054, rho=0.675, Wq=0.0561, W=0.1501``; ``B=1, 4`` are unstable.
    """
    lam, T_fixed, t_req = _model(lam, T_fixed, t_req)
    B = positive_int("B", B)
    T_max, sigma, slo, p99 = _options(T_max, sigma, slo, p99)
    return _row(lam, T_fixed, t_req, B, T_max, sigma, slo, p99, _stability_bound(lam, T_fixed, t_req))


# --- the five-step decision -------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchDecision(Result):
    """Inference Foundations' five-step batch-size decision for a P99 SLO.

    ``B_min``/``B_min_int``: the stability bound (step 2); ``rows``: the candidates (step 3-4);
    ``B_slo_normal``/``B_slo_exponential``: largest candidate whose P99 by that approximation
    is ``<= slo`` (``None`` if none); ``B_slo``: the one for ``p99_method`` (step 5);
    ``B_mean_opt``: the stable candidate with the lowest mean response ``W`` (the M/D/1-on-batches model);
    ``B_mean_opt_refined``: the same under the E_B/D/1 refinement; ``B_action`` and
    ``action``: Table 2 at ``B_slo``, or, when no candidate meets the SLO, at the candidate
    with the lowest P99.
    """

    slo: float
    p99_method: str
    B_min: float
    B_min_int: int | None
    candidates: tuple[int, ...]
    rows: tuple[BatchRow, ...]
    B_slo: int | None
    B_slo_normal: int | None
    B_slo_exponential: int | None
    B_mean_opt: int | None
    B_mean_opt_refined: int | None
    B_action: int | None
    action: str


def _argmin(rows: Sequence[BatchRow], key) -> int | None:
    best = None
    for r in rows:
        v = key(r)
        if math.isfinite(v) and (best is None or v < key(best)):
            best = r
    return None if best is None else best.B


def _decide(rows: Sequence[BatchRow], slo: float, p99: str, B_min: float, B_min_int: int | None) -> BatchDecision:
    def largest(attr):
        ok = [r.B for r in rows if r.stable and getattr(r, attr) <= slo]
        return max(ok) if ok else None

    attr = "P99_normal" if p99 == "normal" else "P99_exponential"
    b_n, b_e = largest("P99_normal"), largest("P99_exponential")
    b_slo = b_n if p99 == "normal" else b_e
    if b_slo is not None:
        at = next(r for r in rows if r.B == b_slo)
    else:
        finite = [r for r in rows if math.isfinite(getattr(r, attr))]
        at = min(finite, key=lambda r: getattr(r, attr)) if finite else (rows[-1] if rows else None)
    action = (batch_action(B=at.B_eff, B_min=B_min, rho=at.rho, P99=getattr(at, attr), slo=slo)
              if at is not None else ACTIONS[0])
    return BatchDecision(
        slo=slo, p99_method=p99, B_min=B_min,
        B_min_int=B_min_int,
        candidates=tuple(r.B for r in rows), rows=tuple(rows), B_slo=b_slo, B_slo_normal=b_n,
        B_slo_exponential=b_e, B_mean_opt=_argmin(rows, lambda r: r.W),
        B_mean_opt_refined=_argmin(rows, lambda r: r.W_refined),
        B_action=None if at is None else at.B, action=action)


def _sizes(name: str, sizes: Iterable) -> list[int]:
    try:
        items = list(sizes)
    except TypeError:
        raise InputError(name, f"expected a list of batch sizes, got {sizes!r}") from None
    if not items:
        raise InputError(name, "no batch sizes given")
    return sorted({positive_int(name, b) for b in items})


MAX_CANDIDATES = 20_000
"""The most batch sizes one table or decision takes: each row costs some 50 microseconds and
5 KB (the E_B/D/1 refinement), so 20,000 rows take about a second and 100 MB. A B_max of 10^7
over B_min = 6 would ask for 1.7 million rows (minutes, gigabytes) that nobody reads."""


def candidate_sizes(*, B_min: int, B_max: int) -> list[int]:
    """Inference Foundations step 3: ``{B_min, 2 B_min, 3 B_min, ...} <= B_max``, plus ``B_max`` itself.

    Just ``[B_max]`` when ``B_max < B_min`` (every allowed size is unstable). At most
    :data:`MAX_CANDIDATES` sizes (an :class:`InputError` names the B_max that fits).
    """
    B_min_int = positive_int("B_min", B_min)
    B_max = positive_int("B_max", B_max)
    if B_max < B_min_int:
        return [B_max]
    n = B_max // B_min_int + 1
    if n > MAX_CANDIDATES:
        raise InputError("b_max", f"{B_max:,} gives {n:,} candidate batch sizes (the multiples of B_min = "
                         f"{B_min_int} up to it), more than the {MAX_CANDIDATES:,} a table takes",
                         f"give at most {B_min_int * (MAX_CANDIDATES - 1):,}, or list --sizes")
    out = list(range(B_min_int, B_max + 1, B_min_int))
    if out[-1] != B_max:
        out.append(B_max)
    return out


def choose_batch_size(*, lam: float, T_fixed: float, t_req: float, slo: float, B_max: int | None = None,
                      candidates: Sequence[int] | None = None, T_max: float | None = None,
                      sigma: float | None = None, p99: str = "normal") -> BatchDecision:
    """Inference Foundations' decision framework: the largest batch size whose P99 meets ``slo`` (seconds).

    1. the service model ``T_svc(B) = T_fixed + t_req B`` (given);
    2. ``B_min`` for stability (:func:`b_min_stability`);
    3. candidates ``{B_min, 2 B_min, ..., B_max}`` (integer ``B_min``; ``B_max`` included), or
       ``candidates`` if given, with ``E[T]`` from the seed's model (:func:`batch_row`);
    4. P99 by both approximations: ``"normal"`` ``E[T] + 2.33 sigma_T`` (model sigma, or
       ``sigma``), and ``"exponential"`` ``-ln(0.01) E[T]``;
    5. ``B = max{B : P99(B) <= slo}`` with the ``p99`` approximation.

    When every batch size is unstable (``lam t_req >= 1``) the candidates (or ``[B_max]``)
    are all reported unstable and the action says to add replicas.
    """
    lam, T_fixed, t_req = _model(lam, T_fixed, t_req)
    slo = positive("slo", slo)
    T_max, sigma, slo, p99 = _options(T_max, sigma, slo, p99)
    B_min = _stability_bound(lam, T_fixed, t_req)
    B_min_int = None if math.isinf(B_min) else b_min_stability(lam=lam, T_fixed=T_fixed, t_req=t_req).B_min_int
    if candidates is not None:
        sizes = _sizes("candidates", candidates)
        if B_max is not None:
            B_max = positive_int("B_max", B_max)
            sizes = [b for b in sizes if b <= B_max]
            if not sizes:
                raise InputError("B_max", f"no candidate batch size is <= B_max = {B_max}")
    elif B_max is not None:
        B_max = positive_int("B_max", B_max)
        sizes = [B_max] if B_min_int is None else candidate_sizes(B_min=B_min_int, B_max=B_max)
    else:
        raise InputError("B_max", "the candidate batch sizes are missing", "give B_max or a list of candidates")
    rows = [_row(lam, T_fixed, t_req, b, T_max, sigma, slo, p99, B_min) for b in sizes]
    return _decide(rows, slo, p99, B_min, B_min_int)


# --- the whole table --------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchTable(Result):
    """Inference Foundations' Table 1 for a list of batch sizes, the two ``B_min`` bounds and (with an SLO) the decision.

    ``B_mean_opt``/``B_mean_opt_refined``: the size with the lowest finite mean response time
    under the seed's model / the E_B/D/1 refinement (``None`` if none is stable).
    """

    lam: float
    T_fixed: float
    t_req: float
    rho_target: float
    T_max: float | None
    slo: float | None
    sigma: float | None
    p99_method: str
    b_min_stability: BatchMin
    b_min_target: BatchMin
    rows: tuple[BatchRow, ...]
    B_mean_opt: int | None
    B_mean_opt_refined: int | None
    decision: BatchDecision | None


def batch_table(*, lam: float, T_fixed: float, t_req: float, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
                rho_target: float = 0.75, T_max: float | None = None, sigma: float | None = None,
                slo: float | None = None, p99: str = "normal") -> BatchTable:
    """Evaluate Inference Foundations' model at each batch size in ``sizes`` (sorted, duplicates dropped).

    Raises :class:`InputError` when ``rho_target <= lam t_req`` (no batch size reaches the
    target utilization; this includes every case where no batch size is stable). With ``slo``
    (s), runs the decision (:func:`choose_batch_size`) over the same sizes.
    Inference Foundations, Table 1: ``batch_table(lam=100, T_fixed=0.05, t_req=0.0005, sizes=[1, 4, 8, 16, 32])``.
    """
    lam, T_fixed, t_req = _model(lam, T_fixed, t_req)
    sizes = _sizes("sizes", sizes)
    T_max, sigma, slo, p99 = _options(T_max, sigma, slo, p99)
    target = b_min_target(lam=lam, T_fixed=T_fixed, t_req=t_req, rho_target=rho_target)
    stab = b_min_stability(lam=lam, T_fixed=T_fixed, t_req=t_req)
    rows = [_row(lam, T_fixed, t_req, b, T_max, sigma, slo, p99, stab.B_min) for b in sizes]
    decision = _decide(rows, slo, p99, stab.B_min, stab.B_min_int) if slo is not None else None
    return BatchTable(lam=lam, T_fixed=T_fixed, t_req=t_req, rho_target=target.rho_target, T_max=T_max, slo=slo,
                      sigma=sigma, p99_method=p99, b_min_stability=stab, b_min_target=target, rows=tuple(rows),
                      B_mean_opt=_argmin(rows, lambda r: r.W),
                      B_mean_opt_refined=_argmin(rows, lambda r: r.W_refined), decision=decision)
