"""Impatient clients: M/M/c+M (Erlang A), the queue whose waiting customers abandon.

Poisson arrivals at ``lam``, ``c`` exponential servers at ``mu`` each, FCFS, and every waiting
customer's patience exponential with mean ``1/theta``: a customer not yet in service when its
patience runs out leaves (an abandonment: the LLM client that closes the stream before its first
token). In service it stays. Palm (1943) and Garnett, Mandelbaum and Reiman, "Designing a call
center with impatient customers" (2002), who named it Erlang A; Gross et al. (2008), sec. 2.9.

The number in system is a birth-death chain: births at ``lam``, deaths at ``min(n, c) mu +
max(n - c, 0) theta``. Its stationary law ``pi`` is summed here directly (the terms fall faster than
geometrically once ``(n - c) theta`` passes ``lam``, so the sum is exact to double precision), and
for every ``theta > 0`` it exists whatever the load: abandonment makes an overloaded queue stable
(``rho = lam / (c mu) >= 1`` is a result, not an error). With ``q = E[(N - c)^+]`` the mean number
waiting:

- ``P_wait = P(N >= c)`` (an arrival sees the time average: PASTA);
- ``P_abandon = theta q / lam`` (abandonments per second over arrivals per second);
- ``Wq = q / lam``: the mean time an arrival waits before service or abandonment (Little's law
  on the waiting room);
- the served customers' own wait ``Wq_served`` and the abandoners' ``Wq_abandoned``, by
  following a tagged arrival that finds ``n >= c``: at queue position ``j`` (``j - 1`` ahead of it
  in the queue) it moves up at ``c mu + (j - 1) theta`` (a service ends, or one ahead leaves) and
  abandons at ``theta``; each stage lasts ``Exp(c mu + j theta)`` whichever event ends it, so
  ``P(served | j0) = prod_j (c mu + (j - 1) theta) / (c mu + j theta)`` and its expected wait
  given served is the sum of those stages' means. (This route and Little's law give the same
  ``Wq``; the tests check that.)

``theta = 0`` is M/M/c (Erlang C), and needs ``rho < 1``. Pure Python (``math`` only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmqueue._result import Result
from llmqueue._validate import nonnegative, positive, positive_int
from llmqueue.errors import InputError, UnstableError

__all__ = ["ErlangAResult", "erlang_a", "erlang_a_distribution"]

_TAIL = 1e-17   # stop summing once a term (relative to the largest) is below this, and falling


@dataclass(frozen=True)
class ErlangAResult(Result):
    """M/M/c+M in steady state (see the module docstring for each symbol)."""

    lam: float
    mu: float
    c: int
    theta: float
    a: float                  # offered load lam / mu (erlangs)
    rho: float                # offered utilization lam / (c mu): may exceed 1
    P_wait: float             # an arrival finds all c servers busy
    P_abandon: float          # an arrival leaves before service
    throughput: float         # lam (1 - P_abandon), served per second
    utilization: float        # carried: throughput / (c mu)
    L: float                  # mean number in system
    Lq: float                 # mean number waiting
    Wq: float                 # mean wait of an arrival (until service or abandonment), s
    Wq_served: float          # mean wait of those served, s
    Wq_abandoned: float       # mean time to abandonment of those who leave, s
    W_served: float           # mean time in system of those served, s
    stable: bool = True


def _check(lam, mu, c, theta) -> tuple[float, float, int, float]:
    lam = positive("lam", lam)
    mu = positive("mu", mu)
    c = positive_int("c", c)
    theta = nonnegative("theta", theta)
    if theta == 0 and lam >= c * mu:
        raise UnstableError(rho=lam / (c * mu), growth_per_s=lam - c * mu,
                            what=f"the M/M/{c} steady state without abandonment (theta = 0)", field="lam")
    return lam, mu, c, theta


def erlang_a_distribution(*, lam: float, mu: float, c: int, theta: float) -> list[float]:
    """The stationary distribution ``pi[n]`` of the number in an M/M/c+M system, summed until
    the tail is below double precision."""
    lam, mu, c, theta = _check(lam, mu, c, theta)
    logs = [0.0]
    n = 0
    while True:
        n += 1
        death = min(n, c) * mu + max(n - c, 0) * theta
        logs.append(logs[-1] + math.log(lam / death))
        # past the mode (terms falling) and negligible: stop
        if n > c and lam < death and logs[-1] - max(logs) < math.log(_TAIL):
            break
        if n > 10_000_000:
            raise InputError("theta", "the queue's tail falls too slowly to sum (theta too small for this load)",
                             "give a larger theta (a shorter mean patience)")
    top = max(logs)
    w = [math.exp(x - top) for x in logs]
    s = math.fsum(w)
    return [x / s for x in w]


def erlang_a(*, lam: float, mu: float, c: int, theta: float) -> ErlangAResult:
    """M/M/c+M (Erlang A): ``c`` servers at ``mu``, Poisson arrivals at ``lam``, exponential
    patience of rate ``theta`` (mean ``1/theta`` s) while waiting. See the module docstring.

    Example: ``erlang_a(lam=10, mu=1, c=10, theta=1)``: rho = 1, yet stable; with ``theta = mu``
    the number in system is Poisson(10) (M/M/inf: everyone leaves at rate 1, served or not), so an
    arrival waits with probability P(N >= 10) = 0.542 and abandons with probability 0.125.
    """
    lam, mu, c, theta = _check(lam, mu, c, theta)
    pi = erlang_a_distribution(lam=lam, mu=mu, c=c, theta=theta)
    P_wait = math.fsum(pi[c:])
    Lq = math.fsum((n - c) * p for n, p in enumerate(pi) if n > c)
    L = math.fsum(n * p for n, p in enumerate(pi))
    Wq = Lq / lam
    P_ab = theta * Lq / lam
    # a tagged arrival that finds n >= c waits at positions j = n - c + 1, ..., 1
    served = wait_served = 0.0
    for n in range(c, len(pi)):
        if pi[n] == 0.0:
            continue
        ps, stages = 1.0, 0.0
        for j in range(n - c + 1, 0, -1):
            out = c * mu + j * theta
            ps *= (c * mu + (j - 1) * theta) / out
            stages += 1.0 / out
        served += pi[n] * ps
        wait_served += pi[n] * ps * stages
    P_served = (1.0 - P_wait) + served
    Wq_served = wait_served / P_served
    Wq_ab = (Wq - wait_served) / P_ab if P_ab > 0 else 0.0
    thr = lam * (1.0 - P_ab)
    return ErlangAResult(lam=lam, mu=mu, c=c, theta=theta, a=lam / mu, rho=lam / (c * mu), P_wait=P_wait,
                         P_abandon=P_ab, throughput=thr, utilization=thr / (c * mu), L=L, Lq=Lq, Wq=Wq,
                         Wq_served=Wq_served, Wq_abandoned=Wq_ab, W_served=Wq_served + 1.0 / mu)
