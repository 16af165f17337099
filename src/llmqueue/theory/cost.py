"""Cost and operations arithmetic: tokens per dollar, cost per million tokens, error budgets, replicas.

The Serving Systems course, section 7 (cost modelling): hardware price turns time into dollars; a
deployment that costs ``C_hour`` dollars per hour and completes ``Q`` tokens per
second yields

    tokens / $ = 3600 Q / C_hour,        $ / 1M tokens = C_hour * 1e6 / (3600 Q),

and idle capacity raises the effective cost: the hours are paid whether or not
the capacity is used, so at utilization ``u`` (fraction of the ``Q`` tokens/s
capacity actually used) the cost per token is divided by ``u``.

The Serving Systems course, section 9.3 (error budget): an SLO target ``slo_target`` (e.g. 0.999 of
requests good) allows ``(1 - slo_target) N`` bad requests among the ``N`` requests
of a window. (The seed's own formulas were lost in extraction apart from the
tokens-per-dollar one; these are the standard SRE definitions.)

Replicas: ``c = ceil(lam / (mu rho_target))`` servers of rate ``mu`` keep the
per-replica utilization ``rho = lam / (c mu)`` at or below ``rho_target``
(the same sizing rule as Inference Foundations' target-utilization headroom).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from llmqueue._result import Result
from llmqueue._validate import nonnegative, positive, probability
from llmqueue.errors import InputError

__all__ = [
    "TokenCost", "token_cost", "tokens_per_dollar", "dollars_per_million_tokens",
    "ErrorBudget", "error_budget", "ReplicaCount", "replicas_for_utilization",
]

# Most replicas :func:`replicas_for_utilization` counts: its rounding tolerance (1e-12 relative)
# keeps the count exact only below about 1e11, and no deployment comes near a billion.
MAX_REPLICAS = 1e9


# --- tokens per dollar --------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenCost(Result):
    """Token economics of one deployment.

    ``Q`` tokens/s at full load, ``C_hour`` $/hour, ``u`` utilization (fraction of ``Q`` used);
    ``tokens_per_dollar = 3600 Q / C_hour`` and ``dollars_per_Mtok = C_hour 1e6 / (3600 Q)`` at
    full load; ``tokens_per_dollar_eff = u * tokens_per_dollar`` and
    ``dollars_per_Mtok_eff = dollars_per_Mtok / u`` at utilization ``u`` (idle capacity is paid for);
    ``dollars_per_token_eff`` the same per token.
    """

    Q: float
    C_hour: float
    u: float
    tokens_per_dollar: float
    dollars_per_Mtok: float
    tokens_per_dollar_eff: float
    dollars_per_Mtok_eff: float
    dollars_per_token_eff: float


def tokens_per_dollar(*, Q: float, C_hour: float) -> float:
    """``3600 Q / C_hour``: tokens bought by one dollar at ``Q`` tokens/s and ``C_hour`` $/hour (the Serving Systems course, 7.2)."""
    return 3600.0 * positive("Q", Q) / positive("C_hour", C_hour)


def dollars_per_million_tokens(*, Q: float, C_hour: float, u: float = 1.0) -> float:
    """``C_hour 1e6 / (3600 Q u)``: dollars per million tokens at utilization ``u`` (the Serving Systems course, 7.3-7.4)."""
    u = probability("u", u, open_high=False)
    return positive("C_hour", C_hour) * 1e6 / (3600.0 * positive("Q", Q) * u)


def token_cost(*, Q: float, C_hour: float, u: float = 1.0) -> TokenCost:
    """Tokens per dollar and dollars per million tokens, at full load and at utilization ``u`` in (0, 1].

    Example: 2,500 tokens/s on an $8/hour deployment gives 1,125,000 tokens/$ and
    $0.889 per million tokens; at 50% utilization, $1.78 per million.
    """
    Q = positive("Q", Q)
    C_hour = positive("C_hour", C_hour)
    u = probability("u", u, open_high=False)
    tpd = 3600.0 * Q / C_hour
    dpm = C_hour * 1e6 / (3600.0 * Q)
    return TokenCost(Q=Q, C_hour=C_hour, u=u, tokens_per_dollar=tpd, dollars_per_Mtok=dpm,
                     tokens_per_dollar_eff=tpd * u, dollars_per_Mtok_eff=dpm / u,
                     dollars_per_token_eff=C_hour / (3600.0 * Q * u))


# --- error budget ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ErrorBudget(Result):
    """SLO error budget over one window.

    ``slo_target``: fraction of requests that must be good; ``N``: requests in the window
    (given, or ``lam * window``); ``lam`` (req/s) and ``window`` (s) when known;
    ``allowed = (1 - slo_target) N`` bad requests; ``downtime = (1 - slo_target) window``
    seconds of full outage the budget covers (when the window is known).
    With observed ``bad`` requests: ``burned = bad / allowed`` (fraction of the budget spent,
    > 1 when overspent), ``remaining = allowed - bad`` (negative when overspent) and
    ``exhausted = bad >= allowed``; all ``None`` without ``bad``.
    """

    slo_target: float
    N: float
    lam: float | None
    window: float | None
    allowed: float
    downtime: float | None
    bad: float | None
    burned: float | None
    remaining: float | None
    exhausted: bool | None


def error_budget(*, slo_target: float, N: float | None = None, lam: float | None = None,
                 window: float | None = None, bad: float | None = None) -> ErrorBudget:
    """Allowed bad requests ``(1 - slo_target) N`` in a window, and how much of it ``bad`` has used.

    Give the window's request count ``N``, or an arrival rate ``lam`` (req/s) and a window
    length ``window`` (s), so ``N = lam window``. ``window`` may also accompany ``N``
    (then ``lam = N / window``). Example: 99.9% over 1,000,000 requests allows 1,000 bad
    requests; 250 observed burn 25% and leave 750.
    """
    slo_target = probability("slo_target", slo_target)
    if N is not None and lam is not None:
        raise InputError("N", "give either a request count or a rate and a window, not both")
    if window is not None:
        window = positive("window", window)
    if N is not None:
        N = positive("N", N)
        if window is not None:
            lam = N / window
    elif lam is not None:
        lam = positive("lam", lam)
        if window is None:
            raise InputError("window", "a rate needs a window length", "give the window length in seconds")
        N = lam * window
    else:
        raise InputError("N", "the number of requests in the window is missing",
                         "give a request count, or a rate and a window length")
    # 1 - slo_target from the decimal the user wrote (0.999 -> 0.001 exactly, not 0.0010000000000000009)
    miss = float(1 - Decimal(repr(slo_target)))
    allowed = miss * N
    downtime = None if window is None else miss * window
    burned = remaining = exhausted = None
    if bad is not None:
        bad = nonnegative("bad", bad)
        if bad > N * (1 + 1e-12):
            raise InputError("bad", f"{bad:g} bad requests exceed the {N:g} requests in the window")
        burned = bad / allowed
        remaining = allowed - bad
        exhausted = bad >= allowed * (1 - 1e-12)
    return ErrorBudget(slo_target=slo_target, N=N, lam=lam, window=window, allowed=allowed, downtime=downtime,
                       bad=bad, burned=burned, remaining=remaining, exhausted=exhausted)


# --- replicas -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplicaCount(Result):
    """Replicas for a target utilization.

    ``lam`` req/s offered, ``mu`` req/s per replica, ``rho_target``; ``a = lam / mu`` offered load
    (replicas' worth of work); ``c = ceil(lam / (mu rho_target))`` replicas; ``rho = lam / (c mu)``
    the resulting per-replica utilization (``<= rho_target``); ``c_stable`` the fewest replicas
    with ``rho < 1``.
    """

    lam: float
    mu: float
    rho_target: float
    a: float
    c: int
    rho: float
    c_stable: int


def replicas_for_utilization(*, lam: float, mu: float, rho_target: float = 0.75) -> ReplicaCount:
    """``c = ceil(lam / (mu rho_target))`` replicas and the utilization ``lam / (c mu)`` they run at.

    Load is assumed to split evenly across replicas. Example: 300 req/s, 100 req/s per replica,
    target 0.7: ``c = ceil(4.29) = 5``, ``rho = 0.6``; at least 4 replicas are needed for stability.
    """
    lam = positive("lam", lam)
    mu = positive("mu", mu)
    rho_target = probability("rho_target", rho_target)
    a = lam / mu
    x = a / rho_target
    if x > MAX_REPLICAS:
        raise InputError("lam", f"lam / (mu rho_target) = {x:.4g} replicas is over the limit of {MAX_REPLICAS:.0e}: "
                         "counts that large are not exact in double precision, and no deployment has them",
                         "check the units of lam and mu (both per second)")
    c = max(1, math.ceil(x * (1 - 1e-12)))
    while lam / (c * mu) > rho_target * (1 + 1e-12):
        c += 1
    c_stable = math.floor(a) + 1
    while lam >= c_stable * mu:
        c_stable += 1
    while c_stable > 1 and lam < (c_stable - 1) * mu:
        c_stable -= 1
    return ReplicaCount(lam=lam, mu=mu, rho_target=rho_target, a=a, c=c, rho=lam / (c * mu), c_stable=c_stable)
