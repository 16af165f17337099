"""The fleet on one clock: pools of replicas behind routers, lanes, P/D, the gateway, autoscalers,
faults (:class:`~llmqueue.cluster.spec.FleetSpec`), simulated event by event.

One heap holds the fleet's events: each replica's next step end (or its next deadline when idle),
KV deliveries, autoscaler evaluations, replicas becoming ready, faults and repairs, samples. A
replica is advanced only at its own events, so an arrival costs the routing decision and one
hand-over, not a pass over the fleet: between its events a replica's state is what it was at the
last one (a step in progress stays in progress), which is what a router sees. At equal times
events come before arrivals, and an arrival at ``t`` joins after the step that starts at ``t``.

An arrival (a first attempt from the stream, or a retry) goes through the gateway: rate limits,
the lane that picks its pool, fallback, degradation (a cap on its ``max_tokens``: the answer cut
short, or another pool; its record's ``degraded`` says which), admission by queue depth or age,
tier shedding. Then the
pool's router picks a replica; with the central router (or while no replica of the pool serves)
the pool's gateway queue holds it (FCFS) and dispatches its head whenever a replica has a free
sequence slot: a request dispatched at ``t`` reaches its replica at ``t`` (``dispatched_s``).

P/D: a request of more than one output token entering the prefill pool is served there for its
prompt and first token (``max_tokens = 1``); its KV (prompt tokens x the pool's
``kv_bytes_per_token``) then crosses the link (a FCFS queue, :mod:`llmqueue.cluster.link`) and
enters the decode pool with its prompt computed and its first token made; its record is the
decode side's, with the first token's times from the prefill side, ``prefill_replica`` and
``kv_transfer_s``.

Each replica draws its step-time noise and drift from its own stream (the first pool's replica
0 the single replica's, so that a fleet of one is that replica). The client is the single
replica's (:class:`~llmqueue.engine.options.SimOptions`): its timeouts (from arrival, per class)
are kept by the replica holding the request, and an attempt that failed comes back as a new
arrival at the time the retry policy gives, routed afresh. A request that can never run on the
chosen pool is rejected on arrival. Refused (one line): client deadlines with the central
router (its gateway queue keeps none yet), and retries with a bounded waiting room (its
rejections come at a replica's step boundary, after later arrivals were routed).
"""

from __future__ import annotations

import heapq
import math
import time
from functools import partial
from typing import Any

import numpy as np

from llmqueue.cluster.autoscaler import desired_replicas, metric_total
from llmqueue.cluster.collect import FleetRecords
from llmqueue.cluster.events import FAULT, KV, READY, REPAIR, REP, SAMPLE, TICK, WAKE, WINDOW
from llmqueue.cluster.gateway import GatewayRuntime, capped, uses_queue_age
from llmqueue.cluster.link import KVLinkQueue
from llmqueue.cluster.predict import P99, ArrivalWatch
from llmqueue.cluster.pool import DOWN, DRAINING, GONE, PROVISIONING, UP, PoolRuntime
from llmqueue.cluster.routers import ROUTERS, Random
from llmqueue.cluster.spec import DECODE, RETRY, FleetSpec, Pool
from llmqueue.engine.admission import reject_reason
from llmqueue.engine.limits import check_run_size
from llmqueue.engine.options import SimOptions, StopRun
from llmqueue.engine.fast.replica import Replica
from llmqueue.engine.request import Request, RequestStatus
from llmqueue.engine.run import RECORD_BATCH, SimResult
from llmqueue.engine.stream import RequestStream
from llmqueue.errors import InputError

FINISHED = RequestStatus.FINISHED


class _NoQueue:
    """An empty waiting room: :func:`reject_reason` against it names only what can never run."""

    def __len__(self):
        return 0

    def count(self, class_name):
        return 0


_NO_QUEUE = _NoQueue()


def simulate_fleet(config, step_time=None, requests=None, *, replicas: int = 1, router=Random.name,
                   seed: int | None = None, horizon_s: float | None = None, sample_dt: float | None = None,
                   options: SimOptions | None = None, reference: bool = False, decisions=None) -> SimResult:
    """Simulate a fleet serving ``requests``; returns the records of all its replicas.

    ``config`` is a :class:`~llmqueue.cluster.spec.FleetSpec` (then ``step_time`` may hold the
    requests: ``simulate_fleet(spec, requests, options=...)``), or an engine config: then
    ``replicas`` replicas of it with ``step_time`` behind ``router`` (a name or an object), one
    pool. ``options``: the client and recording options (timeouts, retries, prefix hashes, ...);
    ``seed`` / ``horizon_s`` / ``sample_dt`` given here take precedence over theirs. ``reference=True``
    runs the reference replica (:class:`~llmqueue.engine.reference.ReferenceReplica`, the executable
    specification; slow) in every slot: the fleet drives both through the same contract
    (:mod:`llmqueue.engine.api`), so their records must be equal. ``decisions``: a
    :class:`~llmqueue.cluster.decisions.DecisionLog` that records every routing and admission
    decision with the view it saw."""
    if isinstance(config, FleetSpec):
        spec, requests = config, (requests if requests is not None else step_time)
        columns = True
    else:
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise InputError("replicas", f"must be a whole number >= 1 (got {replicas!r})")
        if isinstance(router, str):
            from llmqueue.cluster.routers import router as make_router

            make_router(router)  # an unknown name: the flag's one-line error
        spec = FleetSpec(pools=[Pool("default", config, step_time, replicas, router)])
        columns = False
    opt = options or SimOptions()
    return _Fleet(spec, opt, seed=opt.seed if seed is None else seed,
                  horizon_s=opt.horizon_s if horizon_s is None else horizon_s,
                  sample_dt=opt.sample_dt if sample_dt is None else sample_dt, columns=columns,
                  reference=reference, decisions=decisions).run(requests)


class _Fleet(FleetRecords):
    def __init__(self, spec: FleetSpec, opt: SimOptions, *, seed: int, horizon_s, sample_dt: float, columns: bool,
                 reference: bool = False, replica_cls: Any = None, decisions: Any = None):
        self.spec, self.opt, self.seed = spec, opt, seed
        self.replica_cls: Any = replica_cls or Replica  # any class keeping the contract (llmqueue.engine.api)
        if reference:
            from llmqueue.engine.reference import ReferenceReplica

            self.replica_cls = ReferenceReplica
        self.horizon_s = horizon_s
        self.horizon = math.inf if horizon_s is None else horizon_s
        self.sample_dt = sample_dt
        self.columns = columns
        for k, p in enumerate(spec.pools):
            central = getattr(ROUTERS[p.router] if isinstance(p.router, str) else p.router, "central", False)
            if central and (opt.timeout_s or opt.ttft_timeout_s or opt.patience):
                raise InputError("router", "the central gateway's queue keeps no client deadlines yet",
                                 "use another --router, or drop the client timeouts")
            if opt.retry is not None and (p.config.max_waiting or p.config.class_max_waiting):
                raise InputError("max_waiting", "a fleet cannot combine a bounded waiting room with client retries yet",
                                 "drop the waiting-room limit or the retries (one replica models both)")
        self.ev: list = []
        self.n_ev = 0
        self.done: list = []          # (pool index, replica id or -1, request) not yet made columns
        self.chunks: list = []        # record columns of finished requests (with ``seq``), a batch at a time
        self.reasons: dict = {}       # seq -> why a request was rejected
        self.again: list = []         # retried attempts not yet arrived: (time, seq, request)
        self.n_ids = 0
        self.track_age = uses_queue_age(spec.gateway, spec.autoscalers)
        self.pools = []
        for k, p in enumerate(spec.pools):
            self.pools.append(PoolRuntime(p, k, seed, self._make_replica, self._new_id, opt.hash_block_tokens,
                                          spec.gateway.fair_share if spec.gateway is not None else None))
        self.by_name = {p.name: p for p in self.pools}
        self.views = {p.name: p.view for p in self.pools}  # what the gateway's rules read
        for a in spec.autoscalers:
            if a.metric == P99 or P99 in a.also:  # the p99 rule counts the arrivals routed to its pool
                pool = self.by_name[a.pool]
                pool.watch = ArrivalWatch(pool.spec)
        self.gateway = GatewayRuntime(spec.gateway) if spec.gateway is not None else None
        if decisions is not None:  # every decision written down with the numbers it read
            for pool in self.pools:
                pool.router = decisions.router(pool.name, pool.router, None)
            if self.gateway is not None:
                self.gateway = decisions.gateway(self.gateway)
        d = spec.disaggregation
        self.prefill = self.by_name[d.prefill] if d else None
        self.decode = self.by_name[d.decode] if d else None
        self.link: Any = KVLinkQueue(d) if d else None
        self.pd_out: dict = {}        # prefill-side request -> the user's output length
        self.pd_info: dict = {}       # seq -> (prefill replica id, kv transfer s, prefill's dispatch, first scheduled)
        self.in_transfer = 0
        self.lane_of: dict = {}       # seq -> lane name (only with lanes)
        self.degraded: dict = {}      # seq -> (how it was degraded, the max_tokens it asked) (only with degrade rules)
        self.batches: dict = {}       # lane name -> requests its batch window holds
        self.windows: dict = {}       # lane name -> the number of its open window (stale events differ)
        self.scale_events: list = []  # (t, pool, replicas before, after)
        self.samples: list = []       # pools series rows
        self.entry: Any = next((p for p in self.pools if p.spec.role != DECODE), self.pools[0])
        if d and self.entry is not self.prefill and not spec.lanes:
            self.entry = self.prefill

    # -- replicas ------------------------------------------------------------------------------------
    def _new_id(self) -> int:
        self.n_ids += 1
        return self.n_ids - 1

    def _make_replica(self, pool, i: int, incarnation: int):
        seed = self.seed
        if pool.k == 0 and incarnation == 0:
            # the first pool's replica 0 draws the single replica's streams (a fleet of one is the
            # replica), its others their own
            rs = seed if i == 0 else int(np.random.SeedSequence(seed, spawn_key=(31, i)).generate_state(1)[0])
        else:
            rs = int(np.random.SeedSequence(seed, spawn_key=(31, i, pool.k, incarnation)).generate_state(1)[0])
        opt = self.opt
        return self.replica_cls(pool.config, pool.spec.step_time, seed=rs, on_finish=partial(self._left, pool, i),
                       on_first_token=partial(self._first, pool, i), sample_dt=self.sample_dt, hash_block_tokens=opt.hash_block_tokens,
                       timeout_s=opt.timeout_s, ttft_timeout_s=opt.ttft_timeout_s, patience=opt.patience)

    def _push(self, t: float, kind: int, a=None, b=None) -> None:
        """An event at ``t``: (time, kind, sequence number, two payload fields)."""
        self.n_ev += 1
        heapq.heappush(self.ev, (t, kind, self.n_ev, a, b))

    # -- requests leaving ------------------------------------------------------------------------------
    def _first(self, pool, i: int, r: Request) -> None:
        """``r``'s first token came (``on_first_token``)."""
        pool.pending_prefill[i] -= r.num_prompt_tokens
        if self.track_age:
            pool.no_token.pop(r, None)

    def _left(self, pool, i: int, r: Request) -> None:
        """``r`` left slot ``i``'s replica (``on_finish``)."""
        pool.outstanding[i] -= 1
        pool.by_class[r.class_name] -= 1
        if pool.fair is not None:  # its output tokens served, charged to its tenant
            pool.fair.charge(pool.fair.tenant_of(r), r.num_output_tokens)
        if r.first_token_time != r.first_token_time:  # it left without a first token
            pool.pending_prefill[i] -= r.num_prompt_tokens
            if self.track_age:
                pool.no_token.pop(r, None)
        if self.pd_out or r.outcome != "ok":
            return self._record(pool, i, r)
        done = self.done  # _record's common case: an ok request's record is kept (_keep, inline)
        done.append((pool.k, pool.gid[i], r))
        if len(done) >= RECORD_BATCH:
            self.chunks.append(self._columns(done))
            self.done = []

    def _record(self, pool, i: int, r: Request) -> None:
        """``r``'s attempt ended (``i``: -1 when no replica held it): hand a finished prefill to the
        link, or keep its record and ask the client whether it tries again."""
        out = self.pd_out.pop(r, None) if self.pd_out else None
        t_end = r.finish_time
        if out is not None and r.outcome == "ok":
            d = Request(r.request_id, r.arrival_time, r.num_prompt_tokens, out, class_name=r.class_name,
                        priority=r.priority, attempt=r.attempt, hash_ids=r.hash_ids,
                        predicted_output_tokens=r.predicted_output_tokens, seq=r.seq, session_id=r.session_id)
            d.num_computed_tokens, d.num_output_tokens = r.num_prompt_tokens, 1
            d.first_token_time = t_end  # first_scheduled_time: set when the decode replica admits it
            d.num_cached_tokens, d.num_preemptions = r.num_cached_tokens, r.num_preemptions
            arrive = self.link.transfer(t_end, r.num_prompt_tokens * pool.spec.kv_bytes_per_token)
            disp = r.dispatch_time if r.dispatch_time == r.dispatch_time else r.arrival_time
            self.pd_info[r.seq] = (pool.gid[i], arrive - t_end, disp, r.first_scheduled_time)
            self.in_transfer += 1
            self._push(arrive, KV, d)
            return
        self._keep(pool.k, pool.gid[i] if i >= 0 else -1, r)
        retry = self.opt.retry
        if r.outcome != "ok" and retry is not None:
            t_next = retry(r.request_id, r.attempt, r.outcome, r.finish_time)
            if t_next is not None:
                self._again(r, float(t_next), out)

    def _keep(self, k: int, gid: int, r) -> None:
        """Keep ``r``'s record; finished requests become columns a batch at a time, so memory
        stays with what is in flight."""
        done = self.done
        done.append((k, gid, r))
        if len(done) >= RECORD_BATCH:
            self.chunks.append(self._columns(done))
            self.done = []

    def _again(self, r, t: float, out=None) -> None:
        if not out and self.degraded:
            out = self.degraded.get(r.seq, (None, r.max_tokens))[1]
        a = Request(r.request_id, t, r.num_prompt_tokens, out or r.max_tokens, class_name=r.class_name,
                    priority=r.priority, attempt=r.attempt + 1, hash_ids=r.hash_ids,
                    predicted_output_tokens=r.predicted_output_tokens, seq=self.n_seq, session_id=r.session_id)
        self.n_seq += 1
        heapq.heappush(self.again, (t, a.seq, a))

    def _reject(self, pool, r, why: str, t: float) -> None:
        r.status = FINISHED
        r.outcome, r.finish_time, r.reason = "rejected", t, why
        self._record(pool, -1, r)

    # -- requests entering ------------------------------------------------------------------------------
    def _place(self, pool, r, t: float, at: float | None = None) -> None:
        """``r`` enters ``pool`` at ``t``: routed now, or held in the pool's gateway queue."""
        if pool.watch is not None:
            pool.watch.arrive(r)
        if pool.central or not pool.routable or pool.held:
            pool.held.append(r)
            self._dispatch_held(pool, t)
            return
        self._submit(pool, pool.router.route(r, pool.view), r, t, at)

    def _submit(self, pool, i: int, r, t: float, at: float | None) -> None:
        s, o = r.num_prompt_tokens, r.max_tokens
        if s < 1 or o < 1 or s + o > pool.max_total:  # one that can never run: refused on arrival
            why = reject_reason(pool.config, r, _NO_QUEUE)
            r.status = FINISHED
            r.outcome, r.finish_time, r.reason = "rejected", t, why
            self._record(pool, i, r)
            return
        pool.outstanding[i] += 1
        pool.by_class[r.class_name] += 1
        if pool.fair is not None:  # its prompt served, charged to its tenant
            pool.fair.charge(pool.fair.tenant_of(r), s)
        if r.first_token_time != r.first_token_time:  # no first token yet (a P/D decode side has one)
            pool.pending_prefill[i] += s
            if self.track_age:
                pool.no_token[r] = r.arrival_time
        # a replica with a step in progress queues it (that step's end takes it); an idle one wakes now
        if pool.reps[i].accept(r, at) and pool.key[i] > t:
            pool.key[i] = t
            self._push(t, WAKE, pool, i)

    def _dispatch_held(self, pool, t: float) -> None:
        held = pool.held
        while held and pool.routable:
            i = pool.router.route(held[0], pool.view)
            if i is None:
                return
            self._submit(pool, i, held.popleft(), t, t)

    def _arrive(self, r, t: float, held: bool = False) -> None:
        """An attempt arrives at the gateway (``held``: released by its lane's batch window)."""
        spec = self.spec
        pool = self.entry
        if spec.lanes:
            ln = spec.lane(r.class_name, r.num_prompt_tokens)
            if ln is not None:
                pool = self.by_name[ln.pool]
                self.lane_of[r.seq] = ln.name
                if ln.batch_window_s > 0 and not held:
                    return self._hold(ln, r, t)
        if self.gateway is not None:
            view, why = self.gateway.decide(r, pool.view, self.views, t)
            pool = self.by_name[view.name]
            if why is not None:
                return self._reject(pool, r, why, t)
            dg = self.gateway.degraded
            if dg is not None:  # served smaller: its record says how, a retry asks what it asked
                self.degraded[r.seq] = (dg.label, r.max_tokens)
                r.max_tokens = capped(r.max_tokens, dg)
        if pool is self.prefill and r.max_tokens > 1:
            p = Request(r.request_id, r.arrival_time, r.num_prompt_tokens, 1, class_name=r.class_name,
                        priority=r.priority, attempt=r.attempt, hash_ids=r.hash_ids,
                        predicted_output_tokens=r.predicted_output_tokens, seq=r.seq, session_id=r.session_id)
            self.pd_out[p] = r.max_tokens
            r = p
        self._place(pool, r, t, t if held else None)

    def _hold(self, ln, r, t: float) -> None:
        """A batching lane holds ``r``: the first held opens the window; the batch leaves when it
        closes, or at once when ``batch_size`` are held."""
        batch = self.batches.setdefault(ln.name, [])
        if not batch:
            self.windows[ln.name] = self.windows.get(ln.name, 0) + 1
            self._push(t + ln.batch_window_s, WINDOW, ln.name, self.windows[ln.name])
        batch.append(r)
        if ln.batch_size and len(batch) >= ln.batch_size:
            self._release(ln.name, t)

    def _release(self, name: str, t: float) -> None:
        """The lane's held batch goes on (in arrival order) at ``t``; its window is closed."""
        batch = self.batches.pop(name, [])
        self.windows[name] = self.windows.get(name, 0) + 1  # the open window's event is stale
        for r in batch:
            self._arrive(r, t, held=True)

    # -- the other events ------------------------------------------------------------------------------------
    def _retire(self, pool, i: int, state: str) -> None:
        pool.take_out(i, state)
        pool.retire(i)

    def _kv_arrives(self, d, t: float) -> None:
        self.in_transfer -= 1
        self._place(self.decode, d, t, at=t)

    def _fault(self, pool, i: int, fault, t: float) -> None:
        """Slot ``i`` fails at ``t``: what it holds ends as ``error`` (sent again at once with
        ``inflight: retry``), it is down until its repair."""
        rep = pool.reps[i] if i < len(pool.reps) else None
        if rep is None or pool.state[i] not in (UP, DRAINING):
            return  # not serving (never started, provisioning, down or gone): nothing fails
        rep.step_at(t)  # the steps that ended by t count; what it holds then fails
        victims = rep.drain()
        self._retire(pool, i, DOWN)
        pool.outstanding[i] = 0
        pool.pending_prefill[i] = 0
        for r in victims:
            pool.by_class[r.class_name] -= 1
            if self.track_age:
                pool.no_token.pop(r, None)
            r.status = FINISHED
            r.outcome, r.finish_time, r.reason = "error", t, "replica failed"
            out = self.pd_out.get(r)
            if fault.inflight == RETRY:
                self.pd_out.pop(r, None)
                self._keep(pool.k, pool.gid[i], r)
                self._again(r, t, out)
            else:
                self._record(pool, i, r)
        if fault.repair_s < math.inf:
            self._push(t + fault.repair_s, REPAIR, pool, i)

    def _tick(self, j: int, t: float) -> None:
        a = self.spec.autoscalers[j]
        pool = self.by_name[a.pool]
        current = pool.view.serving() + pool.count(PROVISIONING)
        want = desired_replicas(a, current, {m: metric_total(m, pool.view, t, pool.watch)
                                             for m in dict.fromkeys((a.metric, *a.also))})
        if want > current:
            for _ in range(want - current):
                i = pool.add_slot(PROVISIONING)
                self._push(t + a.provisioning_delay_s, READY, pool, i)
            pool.last_scale = t
            self.scale_events.append((t, pool.name, current, want))
        elif want < current and t - pool.last_scale >= a.cooldown_s:
            want = max(want, current - a.scale_down_step)
            n = current - want
            for i in reversed(range(len(pool.state))):  # the newest orders first
                if n and pool.state[i] == PROVISIONING:
                    pool.state[i] = GONE
                    n -= 1
            up = sorted(pool.routable, key=lambda i: (pool.outstanding[i], -i))[:n]
            for i in up:
                if pool.outstanding[i] == 0 and pool.reps[i].load().num_waiting == 0:
                    self._retire(pool, i, GONE)
                else:
                    pool.take_out(i, DRAINING)
            pool.last_scale = t
            self.scale_events.append((t, pool.name, current, want))
        if self._periodic_next(t + a.interval_s):
            self._push(t + a.interval_s, TICK, j)

    def _busy(self) -> bool:
        return (self.head is not None or bool(self.again) or self.in_transfer > 0
                or any(p.held or any(p.outstanding) for p in self.pools))

    def _periodic_next(self, t: float) -> bool:
        return t <= self.horizon if self.horizon < math.inf else self._busy()

    # -- the run ------------------------------------------------------------------------------------
    def run(self, requests) -> SimResult:
        t0 = time.perf_counter()
        opt, spec = self.opt, self.spec
        caching = any(p.config.enable_prefix_caching for p in spec.pools)
        stream = RequestStream(requests, class_priority=spec.pools[0].config.class_priority,
                               predicted_output=opt.predicted_output, hash_ids=opt.hash_ids if caching else None)
        self.n_seq = stream.n
        self.classes = stream.classes
        check_run_size(last_arrival_s=float(stream.arrival_s[-1]) if stream.n else 0.0, horizon_s=self.horizon_s,
                       sample_dt=self.sample_dt)
        it = stream.requests()
        self.head = next(it, None)
        for j, a in enumerate(spec.autoscalers):
            self._push(a.interval_s, TICK, j)
        for f in spec.faults:
            pool = self.by_name[f.pool]
            self._push(f.at_s, FAULT, pool, (f.replica, f))
        if self.columns and self.sample_dt > 0:
            self._push(0.0, SAMPLE, 0)
        import gc

        enabled = gc.isenabled()
        gc.disable()  # the loop allocates many small objects and frees none of them in cycles
        try:
            interrupted = None
            try:
                self._loop(it)
            except StopRun as e:  # before an arrival: the run ends there, as at a horizon
                self.horizon = interrupted = e.t
            res = self._result(t0)
            res.interrupted_s = interrupted
            return res
        finally:
            if enabled:
                gc.enable()
            self._unlink()

    def _unlink(self) -> None:
        """Break the fleet's reference cycles (fleet -> pools -> replicas -> their callbacks, bound
        to the fleet): everything is freed as the run returns, by reference counting (the compiled
        build's cycles through native objects are not always found by the cycle collector)."""
        for pool in self.pools:
            pool._make = pool._new_id = None
            for rep in pool.reps:
                if rep is not None:
                    rep.close()

    def _loop(self, it) -> None:
        opt = self.opt
        ev, again, horizon = self.ev, self.again, self.horizon
        pop, push = heapq.heappop, heapq.heappush
        progress = opt.progress
        inf = math.inf
        n_iter = 0
        # the common fleet (one entry pool, no lanes, gateway, P/D or p99_ttft autoscaler counting its
        # arrivals): arrivals routed inline
        entry = self.entry
        simple = not self.spec.lanes and self.gateway is None and self.prefill is None and entry.watch is None
        route, view = entry.router.route, entry.view
        reps, key, outstanding, by_class, pending = (entry.reps, entry.key, entry.outstanding, entry.by_class,
                                                     entry.pending_prefill)
        max_total = entry.max_total
        track = self.track_age
        while True:
            head = self.head
            t_arr = head.arrival_time if head is not None else inf
            if again and again[0][0] < t_arr:
                t_arr = again[0][0]
            if ev:
                e = ev[0]
                t_ev = e[0]
                if t_ev < t_arr or (t_ev == t_arr < inf and e[1] != WAKE):
                    if t_ev > horizon:
                        break
                    t, kind, _, a, b = pop(ev)
                    if kind == REP or kind == WAKE:  # a replica's step ends (or an idle one is handed work)
                        pool = a
                        if pool.key[b] != t:
                            continue  # superseded
                        rep = pool.reps[b]
                        # the fast replica narrowed to its class: a native call in the compiled build
                        nk = rep.step_at(t) if isinstance(rep, Replica) else rep.step_at(t)
                        if nk <= t:
                            raise RuntimeError(f"replica {pool.gid[b]} of pool {pool.name} made no progress at t={t}")
                        pool.key[b] = nk
                        if nk < inf:
                            self.n_ev += 1
                            push(ev, (nk, REP, self.n_ev, pool, b))
                        if pool.state[b] == DRAINING and pool.outstanding[b] == 0:
                            self._retire(pool, b, GONE)
                        if pool.held:
                            self._dispatch_held(pool, t)
                    else:
                        self._event(kind, a, b, t)
                    continue
            if t_arr > horizon or t_arr == inf:
                break
            n_iter += 1
            if progress is not None and not n_iter & 4095:
                progress(t_arr)  # before the arrival is taken: a StopRun from it leaves it untaken
            if head is not None and head.arrival_time <= t_arr:  # the stream's first at equal times
                r = head
                self.head = next(it, None)
            else:
                r = pop(again)[2]
            if not simple or entry.central or entry.held or track or not entry.routable:
                self._arrive(r, t_arr)
                continue
            # _arrive, _place and _submit for the common fleet, inline
            i = route(r, view)
            sp, o = r.num_prompt_tokens, r.max_tokens
            if sp < 1 or o < 1 or sp + o > max_total:
                self._submit(entry, i, r, t_arr, None)  # refused there, with its reason
                continue
            outstanding[i] += 1
            by_class[r.class_name] += 1
            pending[i] += sp
            # a step in progress: the request joins the queue now (the step ending next would take
            # it from the arrivals at its end, before anything else happens there); else it wakes
            rep = reps[i]
            if (rep.accept(r) if isinstance(rep, Replica) else rep.accept(r)) and key[i] > t_arr:
                key[i] = t_arr
                self.n_ev += 1
                push(ev, (t_arr, WAKE, self.n_ev, entry, i))

    def _event(self, kind: int, a, b, t: float) -> None:
        """The fleet's events other than a replica's step end."""
        if kind == KV:
            self._kv_arrives(a, t)
        elif kind == READY or kind == REPAIR:
            if a.state[b] == (PROVISIONING if kind == READY else DOWN):
                a.bring_up(b)
                self._dispatch_held(a, t)
        elif kind == FAULT:
            self._fault(a, b[0], b[1], t)
        elif kind == TICK:
            self._tick(a, t)
        elif kind == WINDOW:
            if self.windows.get(a) == b:  # the window still open
                self._release(a, t)
        else:
            self._sample(a)
