"""Exact FCFS queue simulations for the records/metrics tests (independent of llmqueue).

M/M/1 by Lindley's recursion in closed form: with ``X_k = sum_{j<k} (S_j - A_{j+1})`` and
``X_0 = 0``, the waiting time is ``W_k = X_k - min_{j<=k} X_j`` (vectorised). M/M/c by the
Kiefer-Wolfowitz recursion (each arrival takes the earliest-free server), a short heap loop.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from llmqueue.records import RequestRecords


def mm1_times(lam: float, mu: float, n: int, seed: int):
    """Arrival, service-start and finish times of ``n`` FCFS M/M/1 customers (empty at 0)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / lam, n)
    service = rng.exponential(1 / mu, n)
    arrival = np.cumsum(gaps)
    x = np.concatenate([[0.0], np.cumsum(service[:-1] - gaps[1:])])
    wait = x - np.minimum.accumulate(x)
    start = arrival + wait
    return arrival, start, start + service


def mmc_times(lam: float, mu: float, c: int, n: int, seed: int):
    """Arrival, start and finish times of ``n`` FCFS M/M/c customers (Kiefer-Wolfowitz)."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / lam, n))
    service = rng.exponential(1 / mu, n)
    free = [0.0] * c
    start = np.empty(n)
    for i in range(n):
        s = max(arrival[i], heapq.heappop(free))
        start[i] = s
        heapq.heappush(free, s + service[i])
    return arrival, start, start + service


def erlang_c_mean_response(lam: float, mu: float, c: int) -> float:
    """Mean time in system of M/M/c from Erlang's C formula."""
    a = lam / mu
    rho = a / c
    top = a**c / math.factorial(c) / (1 - rho)
    p_wait = top / (sum(a**k / math.factorial(k) for k in range(c)) + top)
    return p_wait / (c * mu - lam) + 1 / mu


def records_from_times(arrival, start, finish, *, horizon=None, output_tokens=5,
                       first_token_frac=0.2, classes=("chat",), late=0) -> RequestRecords:
    """Request records for queue customers: prefill is the first ``first_token_frac`` of service.

    With ``horizon``, as the engine records a run stopped there: customers not done by then get
    status ``unfinished`` and NaN times after it (in flight); the engine drops later arrivals,
    but ``late`` of them can be kept (``unfinished``, every time but the arrival NaN).
    """
    arrival, start, finish = (np.asarray(v, dtype=float) for v in (arrival, start, finish))
    if horizon is not None:
        keep = arrival < horizon
        keep[np.flatnonzero(~keep)[:late]] = True
        arrival, start, finish = arrival[keep], start[keep], finish[keep]
    n = len(arrival)
    first_token = start + first_token_frac * (finish - start)
    status = np.full(n, "ok", dtype=object)
    if horizon is not None:
        status[finish > horizon] = "unfinished"
        first_token = np.where(first_token > horizon, np.nan, first_token)
        start = np.where(start > horizon, np.nan, start)
        finish = np.where(finish > horizon, np.nan, finish)
    cls = np.array(classes, dtype=object)[np.arange(n) % len(classes)]
    return RequestRecords.from_columns({
        "request_id": np.arange(n),
        "class": cls,
        "arrival_s": arrival,
        "dispatched_s": arrival,
        "first_scheduled_s": start,
        "first_token_s": first_token,
        "finish_s": finish,
        "prompt_tokens": np.full(n, 100),
        "output_tokens": np.full(n, output_tokens),
        "cached_prompt_tokens": np.zeros(n, dtype=int),
        "status": status,
        "preemptions": np.zeros(n, dtype=int),
        "replica": np.zeros(n, dtype=int),
        "attempt": np.ones(n, dtype=int),
    })


def table(rows: list[dict]) -> RequestRecords:
    """Records from a few hand-written rows (missing fields take neutral defaults)."""
    defaults = {"class": "chat", "dispatched_s": None, "first_scheduled_s": np.nan,
                "first_token_s": np.nan, "prompt_tokens": 10, "output_tokens": 1,
                "cached_prompt_tokens": 0, "status": "ok", "preemptions": 0, "replica": 0,
                "attempt": 1}
    cols: dict[str, list] = {}
    for i, row in enumerate(rows):
        r = {"request_id": i, **defaults, **row}
        if r["dispatched_s"] is None:
            r["dispatched_s"] = r["arrival_s"]
        for k, v in r.items():
            cols.setdefault(k, []).append(v)
    return RequestRecords.from_columns(cols)
