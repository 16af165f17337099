"""The autoscaler's model-based metric ``p99_ttft``: the replica count whose predicted p99 time to
first token meets a target (seconds), from an M/M/c queue.

A pool of ``c`` replicas is read as M/M/c: arrivals at ``lam`` (req/s), each replica one server
of rate ``mu`` (req/s, its theory capacity), ``rho = lam / (c mu)``. An arrival waits with
probability ``C(c, lam/mu)`` (Erlang C) and then, FCFS, ``P(W > t) = C exp(-(c mu - lam) t)``, so
the p99 of the wait is ``ln(C / 0.01) / (c mu - lam)`` (0 when ``C <= 0.01``). The ``Q`` requests
already waiting (the replicas' queues and the pool's gateway queue) add the time the pool takes
to work them off while arrivals go on, ``Q / (c mu - lam)``: until then arrivals find a queue
(an FCFS arrival now waits about ``Q / (c mu)``, so the term errs long). A first token also needs
the prompt's prefill, ``E[ceil(s / chunk)]`` steps of the step time ``b`` at the capacity point
(``offset``). Infinite when ``c mu <= lam``. The prediction falls with ``c``, so the count asked
for is the smallest in ``[min_replicas, max_replicas]`` that meets the target, ``max_replicas``
when none does.

Each evaluation reads, per pool (:class:`ArrivalWatch`): ``lam`` = the arrivals routed to the pool
since the last evaluation over the time since it (a plain window of one interval; retries
count: they are load); ``mu`` = :func:`~llmqueue.theory.replica.saturated_capacity` of one
replica of the pool's engine at the lengths of the requests routed to it so far (recomputed
when their number has doubled since the last computation: the estimate settles within a few
hundred requests and costs O(log n) computations a run); ``Q`` = requests waiting.

Limits: a continuous-batching replica is not one exponential server. It serves up to
``max_num_seqs`` requests at once, and a request waits only when its slots (or KV) are full, so
below saturation M/M/c overstates the wait (by Erlang C, two replicas at ``rho = 0.7`` wait with
probability 0.58; a batch server with free slots not at all): the rule is conservative, and
near ``rho = 1``, where the queue drains at the replicas' throughput, it is closest. ``mu`` is the
capacity at the lengths the pool has seen (the simulator knows a request's output length when it
arrives; a live autoscaler would read it from finished requests); for the decode pool of a P/D
pair it counts prefill steps that pool does not run (an underestimate). Poisson arrivals are
assumed: bursts within the window are not seen.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from llmqueue.theory.classic import _erlang_b

P99 = "p99_ttft"
QUANTILE = 0.99


@dataclass(frozen=True)
class P99Load:
    """What one evaluation reads: ``lam`` (req/s), ``mu`` (req/s per replica; None when the pool
    has seen no request), ``backlog`` ``Q`` (requests waiting), ``offset`` (s, the prefill's part
    of a first token)."""

    lam: float
    mu: float | None
    backlog: float
    offset: float = 0.0


def predicted_p99(lam: float, mu: float | None, c: int, backlog: float = 0.0, *, offset: float = 0.0,
                  q: float = QUANTILE) -> float:
    """The ``q``-quantile of the time to first token of ``c`` replicas (see the module docstring):
    ``ln(C / (1 - q)) / (c mu - lam)`` (0 when ``C <= 1 - q``) ``+ Q / (c mu - lam) + offset``;
    infinite when ``c mu <= lam`` (``c = 0`` meets any target only with no load and no backlog)."""
    if lam <= 0 and backlog <= 0:
        return offset if c > 0 else 0.0
    if c <= 0 or mu is None or c * mu <= lam:
        return math.inf
    return _p99(lam / mu, c, _erlang_b(lam / mu, c), c * mu - lam, backlog, offset, q)


def replicas_for_p99(load: P99Load, target: float, lo: int, hi: int, *, q: float = QUANTILE) -> int:
    """The smallest ``c`` in ``[lo, hi]`` whose :func:`predicted_p99` is at most ``target``
    (seconds); ``hi`` when none is (a target below the prefill's ``offset`` included), ``lo``
    when there is neither load nor backlog. One pass of the Erlang B recursion: O(hi)."""
    lam, mu, Q, off = load.lam, load.mu, load.backlog, load.offset
    if lam <= 0 and Q <= 0:
        return lo
    if predicted_p99(lam, mu, lo, Q, offset=off, q=q) <= target:
        return lo
    if mu is None or not mu > 0:
        return hi
    a = lam / mu
    b = 1.0  # Erlang B(0)
    for c in range(1, hi + 1):
        b = a * b / (c + a * b)
        if c > lo and c * mu > lam and _p99(a, c, b, c * mu - lam, Q, off, q) <= target:
            return c
    return hi


def _p99(a: float, c: int, b: float, d: float, Q: float, offset: float, q: float) -> float:
    """The prediction from Erlang B ``b`` of ``c`` servers at load ``a``, spare rate ``d = c mu - lam``."""
    C = b / (1.0 - (a / c) * (1.0 - b))  # Erlang C
    tail = 1.0 - q
    wait = math.log(C / tail) / d if C > tail else 0.0
    return wait + Q / d + offset


class ArrivalWatch:
    """One pool's arrivals as the ``p99_ttft`` rule reads them (see the module docstring)."""

    def __init__(self, pool):
        self.pool = pool                       # a :class:`~llmqueue.cluster.spec.Pool`
        self.prompt = array("l")
        self.output = array("l")
        self.last_t = 0.0
        self.last_n = 0
        self.mu: float | None = None
        self.offset = 0.0
        self.mu_n = 0                          # lengths seen at mu's last computation

    def arrive(self, r) -> None:
        self.prompt.append(r.num_prompt_tokens)
        self.output.append(r.max_tokens)

    def read(self, t: float, backlog: float) -> P99Load:
        """``lam`` over the window since the last read, ``mu``, ``Q = backlog``; starts the next window."""
        n = len(self.prompt)
        dt = t - self.last_t
        lam = (n - self.last_n) / dt if dt > 0 else 0.0
        self.last_t, self.last_n = t, n
        if n and n >= 2 * self.mu_n:
            self.mu, self.offset = replica_mu(self.pool, self.prompt, self.output)
            self.mu_n = n
        return P99Load(lam, self.mu, float(backlog), self.offset)


def replica_mu(pool, prompt, output) -> tuple[float, float]:
    """(``mu``, the prefill's offset ``b E[ceil(s / chunk)]``) of one replica of ``pool`` at these
    lengths: the theory capacity as ``llmqueue simulate`` prints it (a constant step, or the
    step-time model priced at the capacity point; a full batch's price where no fixed point is
    found)."""
    import numpy as np

    from llmqueue.engine.step_model import constant_step
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.theory.replica import replica_capacity, saturated_capacity

    cfg = pool.config
    model = parse_step_time(pool.step_time)
    s = np.frombuffer(prompt, dtype=prompt.typecode).astype(np.float64)
    o = np.frombuffer(output, dtype=output.typecode).astype(np.float64)
    M = cfg.capacity_tokens
    kw = dict(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
              prompt_tokens=s, output_tokens=o, M=M)
    b = constant_step(model)
    cap = None
    if b is None:
        cap = saturated_capacity(model.base, **kw)
        if cap is None:
            b = float(model.base(cfg.max_num_batched_tokens, cfg.max_num_seqs, M))
    if cap is None:
        cap = replica_capacity(b=b, **kw)
    prefill_steps = float(np.mean(np.ceil(s / cfg.max_num_batched_tokens)))
    return float(cap.mu), float(cap.b) * prefill_steps
