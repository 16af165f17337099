"""Little's law, ``L = lam * W``.

Holds for any stable system in steady state, whatever the arrival and service
distributions and the discipline (Little 1961). It needs no assumption beyond
stationarity, which makes it the one-line consistency check on any serving
measurement: requests in flight equal arrival rate times time in system.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmqueue._result import Result
from llmqueue._validate import positive
from llmqueue.errors import InputError


@dataclass(frozen=True)
class LittleResult(Result):
    """``L`` mean number in system, ``lam`` throughput (req/s), ``W`` mean time in system (s)."""

    L: float
    lam: float
    W: float


def little(*, L: float | None = None, lam: float | None = None, W: float | None = None) -> LittleResult:
    """Solve ``L = lam * W`` for whichever one of the three is not given.

    Example (the Queueing System essay): ``little(lam=900, W=0.120).L == 108`` requests in flight.
    """
    given = {k: v for k, v in (("L", L), ("lam", lam), ("W", W)) if v is not None}
    if len(given) != 2:
        raise InputError("L/lam/W", f"give exactly two of L, lam, W (got {sorted(given) or 'none'})")
    vals = {k: positive(k, v) for k, v in given.items()}
    if "L" not in vals:
        return LittleResult(L=vals["lam"] * vals["W"], lam=vals["lam"], W=vals["W"])
    if "lam" not in vals:
        return LittleResult(L=vals["L"], lam=vals["L"] / vals["W"], W=vals["W"])
    return LittleResult(L=vals["L"], lam=vals["lam"], W=vals["L"] / vals["lam"])
