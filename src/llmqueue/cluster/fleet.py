"""``simulate_fleet``: N identical replicas on one clock behind a router.

Every arriving request is routed when it arrives, from the replicas' states at that moment: the
fleet advances every replica to the arrival (a step in progress stays in progress), asks the
router, and submits the request to the chosen replica. With the central router the gateway
holds a FCFS queue instead and dispatches its head whenever a replica has a free sequence slot:
the fleet then also advances the replicas from one step end to the next while the queue is not
empty, and a request dispatched at ``t`` reaches its replica at ``t`` (``dispatched_s``).

Each replica draws its step-time noise and drift from its own stream (seed, replica index; replica
0 the single replica's, so that a fleet of one is that replica), so replicas are independent servers. Records carry the replica index.

The client is the single replica's (:class:`~llmqueue.engine.options.SimOptions`): its timeouts
(from arrival, per class) are kept by the replica holding the request, and an attempt that failed
comes back as a new arrival at the time the retry policy gives, routed afresh. Prefix hashes and
SRPT predictions travel with the requests. A request that can never run (longer than
``max_model_len`` or the KV cache) is rejected on arrival, as a replica would. Not yet: deadlines
in the central gateway's queue, and retries together with a bounded waiting room (its rejections
come at a replica's step boundary, after later arrivals were routed); both are refused in one line.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque

import numpy as np

from llmqueue.cluster.routers import router as make_router
from llmqueue.engine.limits import check_run_size
from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS, SimOptions
from llmqueue.engine.replica import Replica
from llmqueue.engine.admission import reject_reason
from llmqueue.engine.request import Request, RequestStatus
from llmqueue.engine.run import SimResult, _concat_steps, request_columns
from llmqueue.engine.stream import RequestStream
from llmqueue.errors import InputError


class _NoQueue:
    """An empty waiting room: :func:`reject_reason` against it names only what can never run."""

    def __len__(self):
        return 0

    def count(self, class_name):
        return 0


_NO_QUEUE = _NoQueue()


def view(rep, max_num_seqs: int) -> dict:
    """What a router may read of a replica: waiting (arrived, not running), running, free KV blocks."""
    arrived = sum(1 for e in rep._arrivals if e[0] <= rep.clock)
    running = len(rep.running) if rep._pending is not None and rep._pending[1] == rep._exact_end else len(rep.order)
    return {"num_waiting": len(rep.waiting) + arrived, "num_running": running, "kv_blocks_free": rep.free,
            "max_num_seqs": max_num_seqs}


def simulate_fleet(config, step_time, requests, *, replicas: int, router="random", seed: int | None = None,
                   horizon_s: float | None = None, sample_dt: float | None = None,
                   options: SimOptions | None = None) -> SimResult:
    """Simulate ``replicas`` replicas of ``config`` behind ``router`` (a name or an object) serving
    ``requests``; returns the records of all of them (``replica`` column), as :func:`llmqueue.engine.simulate`.
    ``options``: the run's client and recording options (timeouts, retries, prefix hashes, ...);
    ``seed`` / ``horizon_s`` / ``sample_dt`` given here take precedence over theirs."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise InputError("replicas", f"must be a whole number >= 1 (got {replicas!r})")
    opt = options or SimOptions()
    seed = opt.seed if seed is None else seed
    horizon_s = opt.horizon_s if horizon_s is None else horizon_s
    sample_dt = opt.sample_dt if sample_dt is None else sample_dt
    t0 = time.perf_counter()
    rt = make_router(router, seed)
    central = getattr(rt, "central", False)
    if central and (opt.timeout_s or opt.ttft_timeout_s):
        raise InputError("router", "the central gateway's queue keeps no client deadlines yet",
                         "use another --router, or drop the client timeouts")
    retry = opt.retry
    if retry is not None and (config.max_waiting or config.class_max_waiting):
        # a full waiting room rejects at the replica's next step boundary, after the fleet has
        # routed later arrivals: the retry would come back late
        raise InputError("max_waiting", "a fleet cannot combine a bounded waiting room with client retries yet",
                         "drop the waiting-room limit or the retries (one replica models both)")
    done: list = []
    again: list = []  # retried attempts not yet arrived: (time, seq, request)
    stream = RequestStream(requests, class_priority=config.class_priority, predicted_output=opt.predicted_output,
                           hash_ids=opt.hash_ids if config.enable_prefix_caching else None)
    n_stream = stream.n
    n_retries = [0]

    def finished(i, r):
        done.append((i, r))
        if r.outcome != "ok" and retry is not None:
            t_next = retry(r.request_id, r.attempt, r.outcome, r.finish_time)
            if t_next is not None:
                a = Request(r.request_id, float(t_next), r.num_prompt_tokens, r.max_tokens, class_name=r.class_name,
                            priority=r.priority, attempt=r.attempt + 1, hash_ids=r.hash_ids,
                            predicted_output_tokens=r.predicted_output_tokens, seq=n_stream + n_retries[0])
                n_retries[0] += 1
                heapq.heappush(again, (a.arrival_time, a.seq, a))

    reps = []
    for i in range(replicas):
        # replica 0 draws the single replica's streams (a fleet of one is the replica), the others their own
        rs = seed if i == 0 else int(np.random.SeedSequence(seed, spawn_key=(31, i)).generate_state(1)[0])
        reps.append(Replica(config, step_time, seed=rs,
                            on_finish=lambda r, i=i: finished(i, r), sample_dt=sample_dt,
                            hash_block_tokens=opt.hash_block_tokens, timeout_s=opt.timeout_s,
                            ttft_timeout_s=opt.ttft_timeout_s))
    seqs = config.max_num_seqs
    gateway: deque = deque()
    horizon = math.inf if horizon_s is None else horizon_s

    from llmqueue.cluster.view import PoolView

    everyone = list(range(replicas))

    def views():
        vs = [view(rep, seqs) for rep in reps]
        return PoolView("default", reps, [v["num_waiting"] + v["num_running"] for v in vs], everyone, config)

    def advance(t):
        for rep in reps:
            rep.advance(t)

    def dispatch(t):
        while gateway:
            i = rt.route(gateway[0], views())
            if i is None:
                return
            r = gateway.popleft()
            reps[i].submit(r, at=t)
            reps[i].advance(t)  # its step begins now

    check_run_size(last_arrival_s=float(stream.arrival_s[-1]) if stream.n else 0.0, horizon_s=horizon_s,
                   sample_dt=sample_dt)
    deadlines_on = reps[0]._deadlines_on  # the same on every replica
    it = iter(stream.requests())
    head = next(it, None)
    t_last = 0.0

    def next_deadline() -> float:
        """When a replica next ends an attempt by a client deadline (then its retry may come before
        the next arrival): a deadline after the clock, or the end of the step in progress that
        processes one already passed."""
        best = math.inf
        for rep in reps:
            d = rep._next_deadline()
            if d <= t_last:
                d = rep._pending[0] if rep._pending is not None else math.inf
            best = min(best, d)
        return best

    while True:
        t_arr = min(head.arrival_time if head is not None else math.inf, again[0][0] if again else math.inf)
        if deadlines_on:
            t_dl = next_deadline()
            if t_dl < t_arr and t_dl <= horizon:
                advance(t_dl)
                t_last = max(t_last, t_dl)
                continue
        a = min(t_arr, horizon)
        if central:
            while gateway:  # step ends until the arrival: each may free a slot
                nxt = [x for x in (rep.next_event_time() for rep in reps) if x > t_last]
                t_e = min(nxt) if nxt else math.inf
                if t_e > a:
                    break
                advance(t_e)
                t_last = t_e
                dispatch(t_e)
        if t_arr == math.inf or t_arr > horizon:
            break  # no arrival left, and no client gives up before the horizon: nothing to route
        if head is not None and head.arrival_time <= t_arr:  # the stream's first at equal times
            r, head = head, next(it, None)
        else:
            r = heapq.heappop(again)[2]
        advance(a)
        t_last = max(t_last, a)
        if central:
            gateway.append(r)
            dispatch(a)
        else:
            i = rt.route(r, views())
            why = reject_reason(config, r, _NO_QUEUE)  # one that can never run: refused on arrival
            if why is None:
                reps[i].submit(r)
            else:
                r.status = RequestStatus.FINISHED
                r.outcome, r.finish_time, r.reason = "rejected", r.arrival_time, why
                finished(i, r)
    for rep in reps:  # the rest is each replica's own: run it out (to the horizon, or until idle)
        rep.run(horizon)
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
