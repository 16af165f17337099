"""Classic closed-form queueing models: M/M/1, M/D/1, M/G/1, M/M/c, M/M/c/K, G/G/1, G/G/c.

Every model here is a single FCFS station in steady state. ``lam`` is the arrival
rate (req/s), ``mu`` the service rate of one server (req/s, so the mean service
time is ``1/mu``), ``c`` the number of servers, ``K`` the capacity of the whole
system (in service plus waiting), ``scv_a``/``scv_s`` the squared coefficients of
variation of inter-arrival and service times. ``rho = lam / (c mu)`` is the
utilization of one server. Results use the same symbols: ``L`` (mean number in
system), ``Lq`` (mean number waiting), ``W`` (mean time in system, the response
time), ``Wq`` (mean wait before service), related by Little's law ``L = lam W``,
``Lq = lam Wq`` and ``W = Wq + 1/mu``.

Exact models (Poisson arrivals):

- :func:`mm1` M/M/1, with the waiting and response time distributions.
- :func:`mg1` M/G/1 by the Pollaczek-Khinchine mean-value formula; :func:`md1` is ``scv_s = 0``.
- :func:`mmc` M/M/c (Erlang C), with tails and quantiles of the wait and the response time
  (:func:`mmc_wait_tail`, :func:`mmc_response_tail`, :func:`mmc_wait_quantile`,
  :func:`mmc_response_quantile`); :func:`erlang_b` and :func:`erlang_c` on their own.
- :func:`mmck` M/M/c/K (finite capacity, arrivals to a full system are blocked), with
  :func:`mmck_distribution` for the stationary distribution.

Approximations (general arrivals):

- :func:`gg1_kingman` Kingman's G/G/1 formula (exact when arrivals are Poisson).
- :func:`ggc_allen_cunneen` the Allen-Cunneen G/G/c formula (exact for M/M/c).

Sources: L. Kleinrock, *Queueing Systems, Vol. 1: Theory* (1975), ch. 3 and 5;
D. Gross, J. Shortle, J. Thompson, C. Harris, *Fundamentals of Queueing Theory*
(4th ed., 2008), ch. 2, 3, 6; J.F.C. Kingman, "The single server queue in heavy
traffic" (1961); A.O. Allen, *Probability, Statistics, and Queueing Theory* (2nd
ed., 1990); W. Whitt, "Approximations for the GI/G/m queue" (1993). The seeds
use M/M/1 ``W = 1/(mu - lam)`` (the Continuous Batching essay) and the P-K wait (Inference Foundations).

A steady-state quantity of a queue with ``rho >= 1`` (all models but M/M/c/K,
which is always stable) raises :class:`~llmqueue.errors.UnstableError`.
Pure Python (``math`` only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmqueue._result import Result
from llmqueue._validate import nonnegative, positive, positive_int, probability
from llmqueue.errors import InputError, UnstableError

__all__ = [
    "MM1Result", "MG1Result", "MMcResult", "MMcKResult", "GGApproxResult",
    "mm1", "md1", "mg1", "mmc", "mmck", "mmck_distribution", "gg1_kingman", "ggc_allen_cunneen",
    "erlang_b", "erlang_c",
    "mmc_wait_tail", "mmc_response_tail", "mmc_wait_quantile", "mmc_response_quantile",
    "QUANTILES",
]

#: The percentiles reported in :class:`MM1Result` and :class:`MMcResult` (``Wq_p50`` ... ``W_p99``).
QUANTILES = (0.50, 0.90, 0.95, 0.99)


# --- helpers --------------------------------------------------------------------------------------

def _rates(lam, mu) -> tuple[float, float]:
    return positive("lam", lam), positive("mu", mu)


def _require_stable(lam: float, mu: float, c: int, what: str) -> float:
    rho = lam / (c * mu)
    if rho >= 1.0:
        raise UnstableError(rho=rho, growth_per_s=lam - c * mu, what=what, field="lam")
    return rho


def _one_minus_exp_over(x: float) -> float:
    """``(1 - e^{-x}) / x`` for ``x >= 0``, accurate near 0 (value 1 at 0)."""
    if x == 0.0:
        return 1.0
    return -math.expm1(-x) / x


# --- result objects -------------------------------------------------------------------------------

class _WaitDistribution:
    """Tail and quantile methods shared by M/M/1 and M/M/c results (FCFS, Poisson, exponential)."""

    def wait_tail(self, t: float) -> float:
        """``P(Wq > t)``."""
        return mmc_wait_tail(self, t)

    def response_tail(self, t: float) -> float:
        """``P(T > t)`` for the response time ``T = Wq + S``."""
        return mmc_response_tail(self, t)

    def wait_quantile(self, p: float) -> float:
        """The ``p``-quantile of the wait ``Wq`` (s)."""
        return mmc_wait_quantile(self, p)

    def response_quantile(self, p: float) -> float:
        """The ``p``-quantile of the response time ``T`` (s)."""
        return mmc_response_quantile(self, p)


@dataclass(frozen=True)
class MM1Result(_WaitDistribution, Result):
    """M/M/1 in steady state.

    ``P_wait = rho`` is the probability that an arrival waits; ``Wq_pXX`` and ``W_pXX`` are
    percentiles of the wait and of the response time (s).
    """

    lam: float
    mu: float
    rho: float
    L: float
    Lq: float
    W: float
    Wq: float
    P_wait: float
    stable: bool
    Wq_p50: float
    Wq_p90: float
    Wq_p95: float
    Wq_p99: float
    W_p50: float
    W_p90: float
    W_p95: float
    W_p99: float
    c: int = 1
    model: str = "M/M/1"


@dataclass(frozen=True)
class MG1Result(Result):
    """M/G/1 (or M/D/1) in steady state by Pollaczek-Khinchine.

    ``scv_s`` is the squared coefficient of variation of the service time (0 deterministic, 1
    exponential); ``P_wait = rho`` (Poisson arrivals see the server busy with probability rho).
    """

    model: str
    lam: float
    mu: float
    scv_s: float
    rho: float
    L: float
    Lq: float
    W: float
    Wq: float
    P_wait: float
    stable: bool


@dataclass(frozen=True)
class MMcResult(_WaitDistribution, Result):
    """M/M/c in steady state (Erlang C).

    ``a = lam/mu`` is the offered load in erlangs, ``P_wait`` the Erlang C probability that an
    arrival waits, ``erlang_b`` the Erlang B blocking probability of the same ``c`` and ``a``
    (the loss system M/M/c/c), ``Wq_pXX`` and ``W_pXX`` percentiles of the wait and of the
    response time (s).
    """

    lam: float
    mu: float
    c: int
    a: float
    rho: float
    P_wait: float
    erlang_b: float
    L: float
    Lq: float
    W: float
    Wq: float
    stable: bool
    Wq_p50: float
    Wq_p90: float
    Wq_p95: float
    Wq_p99: float
    W_p50: float
    W_p90: float
    W_p95: float
    W_p99: float
    model: str = "M/M/c"


@dataclass(frozen=True)
class MMcKResult(Result):
    """M/M/c/K in steady state (finite capacity ``K``; arrivals finding ``K`` present are lost).

    ``rho = lam/(c mu)`` is the offered utilization (may exceed 1); ``P_block`` the probability
    that an arrival is blocked (``pi_K``, by PASTA); ``lam_eff = lam (1 - P_block)`` the carried
    throughput; ``rho_eff = lam_eff/(c mu)`` the carried utilization of a server; ``P0`` the
    probability the system is empty; ``P_wait`` the probability that an *admitted* request waits.
    ``W`` and ``Wq`` are the times of admitted requests (``L = lam_eff W``).
    """

    lam: float
    mu: float
    c: int
    K: int
    a: float
    rho: float
    P0: float
    P_block: float
    lam_eff: float
    rho_eff: float
    P_wait: float
    L: float
    Lq: float
    W: float
    Wq: float
    stable: bool
    model: str = "M/M/c/K"


@dataclass(frozen=True)
class GGApproxResult(Result):
    """A G/G/1 or G/G/c approximation of the mean wait (``method`` names it).

    ``exact`` is True where the approximation coincides with an exact model (Poisson arrivals
    for Kingman: M/G/1; Poisson arrivals and exponential service for Allen-Cunneen: M/M/c, and
    with ``c = 1`` any M/G/1).
    """

    model: str
    method: str
    lam: float
    mu: float
    c: int
    scv_a: float
    scv_s: float
    rho: float
    L: float
    Lq: float
    W: float
    Wq: float
    stable: bool
    exact: bool


# --- M/M/1, M/G/1, M/D/1 --------------------------------------------------------------------------

def mm1(*, lam: float, mu: float) -> MM1Result:
    """M/M/1: Poisson arrivals at ``lam``, exponential service at ``mu``, one server, FCFS.

    ``W = 1/(mu - lam)`` (the Continuous Batching essay), ``L = rho/(1 - rho)``, ``Wq = rho/(mu - lam)``. The response
    time is exponential, ``T ~ Exp(mu - lam)``; the wait is 0 with probability ``1 - rho`` and
    ``P(Wq > t) = rho exp(-(mu - lam) t)`` (Kleinrock 1975, sec. 3.2; Gross et al. 2008,
    sec. 2.2). Raises UnstableError when ``lam >= mu``.

    Example: ``mm1(lam=8, mu=10)`` gives rho 0.8, L 4, W 0.5 s, Wq 0.4 s.
    """
    lam, mu = _rates(lam, mu)
    rho = _require_stable(lam, mu, 1, "M/M/1 mean waiting time")
    d = mu - lam
    W = 1.0 / d
    Wq = rho / d
    wq = [math.log(rho / (1.0 - p)) / d if 1.0 - p < rho else 0.0 for p in QUANTILES]
    w = [-math.log1p(-p) / d for p in QUANTILES]
    return MM1Result(
        lam=lam, mu=mu, rho=rho, L=lam * W, Lq=lam * Wq, W=W, Wq=Wq, P_wait=rho, stable=True,
        Wq_p50=wq[0], Wq_p90=wq[1], Wq_p95=wq[2], Wq_p99=wq[3],
        W_p50=w[0], W_p90=w[1], W_p95=w[2], W_p99=w[3],
    )


def mg1(*, lam: float, mu: float, scv_s: float) -> MG1Result:
    """M/G/1 by the Pollaczek-Khinchine mean-value formula.

    Poisson arrivals at ``lam``; one FCFS server; i.i.d. service times of any distribution with
    mean ``1/mu`` and squared coefficient of variation ``scv_s = Var[S] mu^2``. Then

        Wq = rho (1 + scv_s) / 2 * (1/mu) / (1 - rho) = lam E[S^2] / (2 (1 - rho))

    (Pollaczek 1930, Khinchine 1932; Kleinrock 1975, sec. 5.6; Inference Foundations). ``scv_s = 1`` is
    M/M/1, ``scv_s = 0`` is M/D/1. Raises UnstableError when ``lam >= mu``.
    """
    lam, mu = _rates(lam, mu)
    scv_s = nonnegative("scv_s", scv_s)
    return _mg1(lam, mu, scv_s, "M/G/1")


def md1(*, lam: float, mu: float) -> MG1Result:
    """M/D/1: Poisson arrivals, constant service time ``1/mu``, one FCFS server.

    Pollaczek-Khinchine with ``scv_s = 0``: ``Wq = rho / (2 mu (1 - rho))``, half the M/M/1 wait
    at the same ``lam`` and ``mu`` (Kleinrock 1975, sec. 5.6). Raises UnstableError when
    ``lam >= mu``.
    """
    lam, mu = _rates(lam, mu)
    return _mg1(lam, mu, 0.0, "M/D/1")


def _mg1(lam: float, mu: float, scv_s: float, model: str) -> MG1Result:
    rho = _require_stable(lam, mu, 1, f"{model} mean waiting time")
    Wq = rho * (1.0 + scv_s) / 2.0 / mu / (1.0 - rho)
    W = Wq + 1.0 / mu
    return MG1Result(model=model, lam=lam, mu=mu, scv_s=scv_s, rho=rho, L=lam * W, Lq=lam * Wq,
                     W=W, Wq=Wq, P_wait=rho, stable=True)


# --- Erlang B / C and M/M/c -----------------------------------------------------------------------

MAX_STATES = 1_000_000
"""The most servers ``c`` and the largest capacity ``K`` the models take. The Erlang B recursion
is O(c) and the M/M/c/K distribution O(K) in pure Python: a million take about a second (and
the distribution some 100 MB); 1e9 would take many minutes or exhaust memory. No serving
deployment has a million servers, and an M/M/c/K with K in the millions is M/M/c."""


def _servers(name: str, x) -> int:
    """A count of servers or states: a whole number from 1 to :data:`MAX_STATES`."""
    n = positive_int(name, x)
    if n > MAX_STATES:
        raise InputError(name, f"{n:,} is more than the {MAX_STATES:,} the closed forms take (their work grows "
                         f"with {name}, about a second a million: some {n / MAX_STATES:,.0f} s here)", f"give at most {MAX_STATES:,}"
                         + (" (with rho < 1, M/M/c is the limit of a large K)" if name == "K" else ""))
    return n


def _erlang_b(a: float, c: int) -> float:
    # B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1)): stable for any c (no factorials, no overflow).
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def _erlang_c(a: float, c: int) -> float:
    b = _erlang_b(a, c)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def erlang_b(*, lam: float, mu: float, c: int) -> float:
    """Erlang B: the blocking probability of the loss system M/M/c/c (also M/G/c/c).

    Offered load ``a = lam/mu`` erlangs on ``c`` servers with no waiting room; by PASTA the
    fraction of arrivals lost is ``B(c, a) = (a^c/c!) / sum_{k<=c} a^k/k!`` (Erlang 1917),
    computed by the recursion ``B(k) = a B(k-1) / (k + a B(k-1))``. Defined for any load.
    """
    lam, mu = _rates(lam, mu)
    c = _servers("c", c)
    return _erlang_b(lam / mu, c)


def erlang_c(*, lam: float, mu: float, c: int) -> float:
    """Erlang C: the probability that an arrival to M/M/c waits (all ``c`` servers busy).

    ``C = B / (1 - rho (1 - B))`` with ``B`` the Erlang B value and ``rho = lam/(c mu)``
    (Gross et al. 2008, sec. 2.3). Raises UnstableError when ``rho >= 1``.
    """
    lam, mu = _rates(lam, mu)
    c = _servers("c", c)
    _require_stable(lam, mu, c, "the M/M/c waiting probability (Erlang C)")
    return _erlang_c(lam / mu, c)


def mmc(*, lam: float, mu: float, c: int) -> MMcResult:
    """M/M/c (Erlang C): Poisson arrivals at ``lam``, ``c`` identical exponential servers at
    ``mu`` each, unlimited FCFS waiting room.

    With ``a = lam/mu`` and ``rho = a/c < 1``: ``P_wait = C(c, a)`` (Erlang C, computed from the
    Erlang B recursion so ``c`` in the thousands works), ``Lq = C rho/(1 - rho)``,
    ``Wq = C/(c mu - lam)``, ``W = Wq + 1/mu``, ``L = lam W``. The wait is 0 with probability
    ``1 - C`` and ``P(Wq > t) = C exp(-(c mu - lam) t)``; the response time is ``T = Wq + S``
    with ``S ~ Exp(mu)`` independent (Gross et al. 2008, sec. 2.3; Kleinrock 1975, sec. 3.5).
    Raises UnstableError when ``rho >= 1``.

    Example: ``mmc(lam=2, mu=1, c=3)`` gives P_wait 4/9, Lq 8/9, Wq 4/9 s.
    """
    lam, mu = _rates(lam, mu)
    c = _servers("c", c)
    rho = _require_stable(lam, mu, c, f"the M/M/{c} steady state")
    a = lam / mu
    B = _erlang_b(a, c)
    C = B / (1.0 - rho * (1.0 - B))
    d = c * mu - lam
    Wq = C / d
    W = Wq + 1.0 / mu
    wq = [_wait_q(C, d, p) for p in QUANTILES]
    w = [_response_q(mu, d, C, p) for p in QUANTILES]
    return MMcResult(
        lam=lam, mu=mu, c=c, a=a, rho=rho, P_wait=C, erlang_b=B, L=lam * W, Lq=lam * Wq, W=W,
        Wq=Wq, stable=True,
        Wq_p50=wq[0], Wq_p90=wq[1], Wq_p95=wq[2], Wq_p99=wq[3],
        W_p50=w[0], W_p90=w[1], W_p95=w[2], W_p99=w[3],
    )


# --- M/M/c wait and response-time distributions ---------------------------------------------------

def _mmc_params(result, lam, mu, c) -> tuple[float, float, float]:
    """(mu, d = c mu - lam, C) from a result or from keyword parameters."""
    given = [x is not None for x in (lam, mu, c)]
    if result is not None:
        if any(given):
            raise InputError("lam/mu/c", "give either a result or lam, mu and c, not both")
        if not isinstance(result, (MMcResult, MM1Result)):
            raise InputError("result", f"expected an M/M/1 or M/M/c result, got {type(result).__name__}",
                             "pass mmc(...) or mm1(...), or give lam, mu and c")
        return result.mu, result.c * result.mu - result.lam, result.P_wait
    if not all(given):
        raise InputError("lam/mu/c", "give a result from mmc()/mm1() or all of lam, mu and c")
    lam, mu = _rates(lam, mu)
    c = _servers("c", c)
    _require_stable(lam, mu, c, f"the M/M/{c} waiting-time distribution")
    return mu, c * mu - lam, _erlang_c(lam / mu, c)


def _wait_q(C: float, d: float, p: float) -> float:
    q = 1.0 - p
    return math.log(C / q) / d if q < C else 0.0


def _response_tail(mu: float, d: float, C: float, t: float) -> float:
    # P(T > t) = e^{-mu t} + C mu (e^{-mu t} - e^{-d t}) / (d - mu), d = c mu - lam,
    # written as e^{-min(mu, d) t} t (1 - e^{-|d - mu| t}) / (|d - mu| t) so that d == mu (the
    # limit e^{-mu t}(1 + C mu t)) and d close to mu are exact and nothing overflows.
    if t <= 0.0:
        return 1.0
    g = math.exp(-min(mu, d) * t) * t * _one_minus_exp_over(abs(d - mu) * t)
    return min(1.0, math.exp(-mu * t) + C * mu * g)


def _response_q(mu: float, d: float, C: float, p: float) -> float:
    """Smallest t with P(T > t) <= 1 - p, by bisection (the tail is continuous and decreasing)."""
    q = 1.0 - p
    lo, hi = 0.0, 1.0 / min(mu, d)
    while _response_tail(mu, d, C, hi) > q:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _response_tail(mu, d, C, mid) > q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return hi


def mmc_wait_tail(result=None, t: float | None = None, *, lam=None, mu=None, c=None) -> float:
    """``P(Wq > t) = C exp(-(c mu - lam) t)`` for M/M/c FCFS (``C`` = Erlang C; M/M/1: ``C = rho``).

    Call as ``mmc_wait_tail(mmc(...), t)`` or ``mmc_wait_tail(t=..., lam=..., mu=..., c=...)``.
    """
    mu_, d, C = _mmc_params(result, lam, mu, c)
    t = nonnegative("t", t)
    return C * math.exp(-d * t)


def mmc_response_tail(result=None, t: float | None = None, *, lam=None, mu=None, c=None) -> float:
    """``P(T > t)`` of the M/M/c FCFS response time ``T = Wq + S``, ``S ~ Exp(mu)``:

        P(T > t) = e^{-mu t} + C mu / (c mu - lam - mu) (e^{-mu t} - e^{-(c mu - lam) t})

    (with its limit ``e^{-mu t} (1 + C mu t)`` when ``c mu - lam = mu``; for M/M/1 this is
    ``e^{-(mu - lam) t}``). Same calling forms as :func:`mmc_wait_tail`.
    """
    mu_, d, C = _mmc_params(result, lam, mu, c)
    t = nonnegative("t", t)
    return _response_tail(mu_, d, C, t)


def mmc_wait_quantile(result=None, p: float | None = None, *, lam=None, mu=None, c=None) -> float:
    """The ``p``-quantile of the M/M/c FCFS wait: ``ln(C/(1-p)) / (c mu - lam)``, and 0 when
    ``1 - p >= C`` (at least a fraction ``p`` of arrivals do not wait).

    Call as ``mmc_wait_quantile(mmc(...), 0.99)`` or
    ``mmc_wait_quantile(p=0.99, lam=..., mu=..., c=...)``; ``p`` in (0, 1).
    """
    mu_, d, C = _mmc_params(result, lam, mu, c)
    p = probability("p", p)
    return _wait_q(C, d, p)


def mmc_response_quantile(result=None, p: float | None = None, *, lam=None, mu=None, c=None) -> float:
    """The ``p``-quantile of the M/M/c FCFS response time (wait plus own service), solved from
    :func:`mmc_response_tail` by bisection to relative precision 1e-13. Same calling forms as
    :func:`mmc_wait_quantile`.
    """
    mu_, d, C = _mmc_params(result, lam, mu, c)
    p = probability("p", p)
    return _response_q(mu_, d, C, p)


# --- M/M/c/K --------------------------------------------------------------------------------------

def _mmck_check(lam, mu, c, K) -> tuple[float, float, int, int]:
    lam, mu = _rates(lam, mu)
    c = _servers("c", c)
    K = _servers("K", K)
    if K < c:
        raise InputError("K", f"must be >= c = {c} (got {K})",
                         "K is the total capacity: requests in service plus waiting")
    return lam, mu, c, K


def _mmck_pi(lam: float, mu: float, c: int, K: int) -> list[float]:
    # Birth-death chain: pi_n proportional to a^n/n! (n <= c), a^c/c! rho^(n-c) (n > c).
    # Log weights, then normalize by log-sum-exp: no overflow for any K or load.
    a = lam / mu
    la, lr = math.log(a), math.log(a / c)
    logw = [n * la - math.lgamma(n + 1) for n in range(c + 1)]
    top = logw[c]
    logw.extend(top + (n - c) * lr for n in range(c + 1, K + 1))
    m = max(logw)
    w = [math.exp(x - m) for x in logw]
    z = math.fsum(w)
    return [x / z for x in w]


def mmck_distribution(*, lam: float, mu: float, c: int, K: int) -> list[float]:
    """Stationary distribution ``[pi_0, ..., pi_K]`` of the number in an M/M/c/K system.

    ``pi_n`` is proportional to ``a^n/n!`` for ``n <= c`` and ``a^c/c! (a/c)^(n-c)`` for
    ``c < n <= K`` (``a = lam/mu``; Gross et al. 2008, sec. 2.5), normalized in log space so
    ``K`` of 10^4 and more neither overflows nor underflows to NaN.
    """
    return _mmck_pi(*_mmck_check(lam, mu, c, K))


def mmck(*, lam: float, mu: float, c: int, K: int) -> MMcKResult:
    """M/M/c/K: Poisson arrivals at ``lam``, ``c`` exponential servers at ``mu``, FCFS, and room
    for ``K >= c`` requests in total (in service plus waiting); an arrival that finds ``K``
    present is blocked and lost (load shedding, Inference Foundations' M/G/c/K with exponential service).

    ``P_block = pi_K`` (PASTA), carried throughput ``lam_eff = lam (1 - P_block)``,
    ``L = sum n pi_n``, ``Lq = sum (n - c) pi_n``, and ``W = L/lam_eff``, ``Wq = Lq/lam_eff``
    for admitted requests (Little's law on the admitted stream; Gross et al. 2008, sec. 2.5).
    Always stable, for any ``rho = lam/(c mu)``. ``K = c`` is the Erlang loss system
    (``P_block`` = Erlang B); ``K -> infinity`` with ``rho < 1`` tends to M/M/c.
    """
    lam, mu, c, K = _mmck_check(lam, mu, c, K)
    pi = _mmck_pi(lam, mu, c, K)
    admitted = math.fsum(pi[:K])  # 1 - P_block, accurate even when P_block is close to 1
    lam_eff = lam * admitted
    L = math.fsum(n * x for n, x in enumerate(pi))
    Lq = math.fsum((n - c) * pi[n] for n in range(c + 1, K + 1))
    P_wait = math.fsum(pi[c:K]) / admitted
    return MMcKResult(
        lam=lam, mu=mu, c=c, K=K, a=lam / mu, rho=lam / (c * mu), P0=pi[0], P_block=pi[K],
        lam_eff=lam_eff, rho_eff=lam_eff / (c * mu), P_wait=P_wait, L=L, Lq=Lq,
        W=L / lam_eff, Wq=Lq / lam_eff, stable=True,
    )


# --- G/G/1 and G/G/c approximations ---------------------------------------------------------------

def gg1_kingman(*, lam: float, mu: float, scv_a: float, scv_s: float) -> GGApproxResult:
    """G/G/1 mean wait by Kingman's heavy-traffic approximation (an approximation, not exact).

    Renewal arrivals at ``lam`` with inter-arrival SCV ``scv_a``; i.i.d. service with mean
    ``1/mu`` and SCV ``scv_s``; one FCFS server:

        Wq ~= (rho / (1 - rho)) * ((scv_a + scv_s) / 2) * (1/mu)

    (Kingman 1961). It is asymptotically exact as ``rho -> 1`` and exact whenever arrivals are
    Poisson (``scv_a = 1``: it is then the Pollaczek-Khinchine formula, M/M/1 for
    ``scv_s = 1`` too). Raises UnstableError when ``rho >= 1``.
    """
    lam, mu = _rates(lam, mu)
    scv_a = nonnegative("scv_a", scv_a)
    scv_s = nonnegative("scv_s", scv_s)
    rho = _require_stable(lam, mu, 1, "the G/G/1 mean waiting time (Kingman)")
    Wq = rho / (1.0 - rho) * (scv_a + scv_s) / 2.0 / mu
    W = Wq + 1.0 / mu
    return GGApproxResult(model="G/G/1", method="Kingman", lam=lam, mu=mu, c=1, scv_a=scv_a,
                          scv_s=scv_s, rho=rho, L=lam * W, Lq=lam * Wq, W=W, Wq=Wq, stable=True,
                          exact=scv_a == 1.0)


def ggc_allen_cunneen(*, lam: float, mu: float, c: int, scv_a: float, scv_s: float) -> GGApproxResult:
    """G/G/c mean wait by the Allen-Cunneen approximation (an approximation, not exact).

    Renewal arrivals at ``lam`` (SCV ``scv_a``), ``c`` identical FCFS servers with i.i.d. service
    of mean ``1/mu`` (SCV ``scv_s``):

        Wq ~= Wq(M/M/c) * (scv_a + scv_s) / 2

    (Allen 1990; Whitt 1993 discusses its accuracy). Exact for M/M/c (``scv_a = scv_s = 1``) and,
    with ``c = 1`` and Poisson arrivals, equal to Pollaczek-Khinchine. Raises UnstableError when
    ``rho >= 1``.
    """
    lam, mu = _rates(lam, mu)
    c = _servers("c", c)
    scv_a = nonnegative("scv_a", scv_a)
    scv_s = nonnegative("scv_s", scv_s)
    rho = _require_stable(lam, mu, c, f"the G/G/{c} mean waiting time (Allen-Cunneen)")
    C = _erlang_c(lam / mu, c)
    Wq = C / (c * mu - lam) * (scv_a + scv_s) / 2.0
    W = Wq + 1.0 / mu
    exact = (scv_a == 1.0 and scv_s == 1.0) or (c == 1 and scv_a == 1.0)
    return GGApproxResult(model=f"G/G/{c}", method="Allen-Cunneen", lam=lam, mu=mu, c=c,
                          scv_a=scv_a, scv_s=scv_s, rho=rho, L=lam * W, Lq=lam * Wq, W=W, Wq=Wq,
                          stable=True, exact=exact)
