"""``simulate_fleet``: N identical replicas on one clock behind a router.

Every arriving request is routed when it arrives, from the replicas' states at that moment: the
fleet advances every replica to the arrival (a step in progress stays in progress), asks the
router, and submits the request to the chosen replica. With the central router the gateway
holds a FCFS queue instead and dispatches its head whenever a replica has a free sequence slot:
the fleet then also advances the replicas from one step end to the next while the queue is not
empty, and a request dispatched at ``t`` reaches its replica at ``t`` (``dispatched_s``).

Each replica draws its step-time noise and drift from its own stream (seed, replica index), so
replicas are independent servers. Records carry the replica index.
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

from llmqueue.cluster.routers import router as make_router
from llmqueue.engine.limits import check_run_size
from llmqueue.engine.replica import Replica
from llmqueue.engine.run import SimResult, _concat_steps, request_columns
from llmqueue.engine.stream import RequestStream
from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS
from llmqueue.errors import InputError


def view(rep, max_num_seqs: int) -> dict:
    """What a router may read of a replica: waiting (arrived, not running), running, free KV blocks."""
    arrived = sum(1 for e in rep._arrivals if e[0] <= rep.clock)
    running = len(rep.running) if rep._pending is not None and rep._pending[1] == rep._exact_end else len(rep.order)
    return {"num_waiting": len(rep.waiting) + arrived, "num_running": running, "kv_blocks_free": rep.free,
            "max_num_seqs": max_num_seqs}


def simulate_fleet(config, step_time, requests, *, replicas: int, router="random", seed: int = 0,
                   horizon_s: float | None = None, sample_dt: float = 1.0) -> SimResult:
    """Simulate ``replicas`` replicas of ``config`` behind ``router`` (a name or an object) serving
    ``requests``; returns the records of all of them (``replica`` column), as :func:`llmqueue.engine.simulate`."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise InputError("replicas", f"must be a whole number >= 1 (got {replicas!r})")
    t0 = time.perf_counter()
    rt = make_router(router, seed)
    done: list = []
    reps = []
    for i in range(replicas):
        reps.append(Replica(config, step_time, seed=int(np.random.SeedSequence(seed, spawn_key=(31, i)).generate_state(1)[0]),
                            on_finish=lambda r, i=i: done.append((i, r)), sample_dt=sample_dt))
    where: dict = {}
    seqs = config.max_num_seqs
    central = getattr(rt, "central", False)
    gateway: deque = deque()
    horizon = math.inf if horizon_s is None else horizon_s

    def views():
        return [view(rep, seqs) for rep in reps]

    def advance(t):
        for rep in reps:
            rep.advance(t)

    def dispatch(t):
        while gateway:
            i = rt.route(gateway[0], views())
            if i is None:
                return
            r = gateway.popleft()
            where[r.seq] = i
            reps[i].submit(r, at=t)
            reps[i].advance(t)  # its step begins now

    stream = RequestStream(requests, class_priority=config.class_priority)
    check_run_size(last_arrival_s=float(stream.arrival_s[-1]) if stream.n else 0.0, horizon_s=horizon_s,
                   sample_dt=sample_dt)
    t_last = 0.0
    for r in [*stream.requests(), None]:
        a = horizon if r is None else min(r.arrival_time, horizon)
        if central:
            while gateway:  # step ends until the arrival: each may free a slot
                nxt = [x for x in (rep.next_event_time() for rep in reps) if x > t_last]
                t_e = min(nxt) if nxt else math.inf
                if t_e > a:
                    break
                advance(t_e)
                t_last = t_e
                dispatch(t_e)
        if r is None or r.arrival_time > horizon:
            break
        advance(a)
        t_last = max(t_last, a)
        if central:
            gateway.append(r)
            dispatch(a)
        else:
            i = rt.route(r, views())
            where[r.seq] = i
            reps[i].submit(r)
    advance(horizon)
    left = [(i, q) for i, rep in enumerate(reps) for q in rep.in_system()]
    for _, q in left:
        q.outcome = "unfinished"
    rows = sorted([*done, *left], key=lambda x: x[1].seq)
    req = request_columns([q for _, q in rows])
    req["replica"] = np.asarray([i for i, _ in rows], dtype=np.int64)
    steps = [rep.step_columns() for rep in reps]
    ts = [rep.timeseries_columns() for rep in reps]
    for i, (s, x) in enumerate(zip(steps, ts)):
        s["replica"][:] = i
        x["replica"][:] = i
    fin = req["finish_s"]
    return SimResult(requests=req, steps=_concat_steps(steps, STEP_FIELDS), timeseries=_concat_steps(ts, TS_FIELDS),
                     horizon_s=horizon if horizon < math.inf else (float(np.nanmax(fin)) if np.isfinite(fin).any() else 0.0),
                     wall_s=time.perf_counter() - t0, num_steps=sum(rep.steps_taken for rep in reps),
                     capacity_tokens=config.capacity_tokens)
