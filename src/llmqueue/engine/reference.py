"""``ReferenceReplica``: the executable specification of one serving replica, built from the
engine's nouns (:class:`Request`, :class:`KVCacheManager`, :class:`RequestQueue`, the policies,
:class:`Scheduler`). One engine step at a time, every request an object; written to be read,
not to be fast. The fast replica (:mod:`llmqueue.engine.fast`) is built from the twins of these
nouns, in the same names, and must produce the same records; hand-worked traces in
``tests/test_engine_traces.py`` pin this one to vLLM's scheduler. Both price a step's
:class:`~llmqueue.engine.output.Composition` with the same :class:`~llmqueue.engine.pricing.StepPricer`.

A replica steps on a clock it can share with others: :meth:`submit` a request (any time before
its arrival), :meth:`next_event_time`, :meth:`advance` up to a time, read-only :meth:`state`.
Finished requests (ok, rejected, timed out, cancelled) go to ``on_finish`` as they leave;
``on_token`` sees every token at the end of the step that made it (a server streams it then).
:meth:`abort` takes a request out at the next step boundary (a client that went away).

Event semantics:

- A request arriving at ``t`` joins the waiting queue at ``t`` and is first considered by the
  scheduler at the start of the first step that starts at or after ``t``.
- At arrival it is rejected (``outcome = rejected``, ``finish_time = arrival``) when it can never
  run (prompt + output above ``max_model_len`` or the whole KV cache, an empty prompt or output)
  or when the waiting queue already holds ``max_waiting`` requests (in all, or of its class).
- Client deadlines (``timeout``: arrival + the class's timeout, or arrival + its TTFT timeout while
  no first token has come) and queue-time shedding (``max_queue_time_s``, for requests never
  scheduled) apply at step boundaries; ``finish_time`` is the deadline itself. A request whose
  last token came after a deadline (inside the step) timed out at the deadline.
- A step's duration is the step-time model's price of its composition, times the noise factor
  of the step's global index and the drift factor of the window holding its start.
- An aborted request (:meth:`abort`, a client that disconnected) leaves at the first step
  boundary at or after the abort, as vLLM frees an aborted request's KV before its next
  schedule: a step in progress still computes its tokens; ``outcome = cancelled``,
  ``finish_time`` that boundary (the abort's own time when the replica was idle).
"""

from __future__ import annotations

import heapq
import math

from llmqueue.engine.admission import (DEADLINE_PATIENCE, DEADLINE_SHED, DEADLINE_TTFT, arrival_entry, deadlines, late_outcome,
                                       reject_reason)
from llmqueue.engine.api import ReplicaLoad
from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS
from llmqueue.engine.request import RequestStatus
from llmqueue.engine.limits import sample_index_before
from llmqueue.engine.pricing import StepPricer
from llmqueue.engine.scheduler import Scheduler


class ReferenceReplica:
    """One replica on a shared clock (see the module docstring).

    ``timeout_s`` / ``ttft_timeout_s``: per class, the client's deadlines (seconds from arrival).
    ``on_finish(request)``: called when a request leaves (its ``outcome`` set); ``on_first_token``
    and ``on_preempt``: as a request's first token comes and as it is preempted; ``on_token(request,
    t_end)``: every token a step produces, at the step's end ``t_end``, in schedule order (before
    ``on_finish`` of the requests the step finished). ``on_step(row)`` and
    ``on_sample(row)``: the step records and time-series rows as they happen (``sample_dt`` 0: none).
    ``explain``: engine step indices whose decision is kept in :attr:`explanations`
    (:class:`~llmqueue.engine.explain.StepExplanation`).
    """

    def __init__(self, config, step_time, *, seed: int = 0, hash_block_tokens: int = 512,
                 timeout_s: dict | None = None, ttft_timeout_s: dict | None = None, patience: dict | None = None,
                 on_finish=None, on_first_token=None, on_preempt=None, on_step=None, on_sample=None,
                 sample_dt: float = 0.0, explain=(), on_token=None):
        self.config = config
        self.pricer = StepPricer(step_time, seed)
        self.scheduler = Scheduler(config, hash_block_tokens=hash_block_tokens)
        self.timeout_s = timeout_s or {}
        self.ttft_timeout_s = ttft_timeout_s or {}
        self.patience = patience or {}
        self.on_finish = on_finish or (lambda r: None)
        self.on_first_token = on_first_token
        self.on_preempt = on_preempt
        self.on_token = on_token
        self._step_rows: list = []    # the records kept here when no callback takes them
        self._sample_rows: list = []
        self.on_step = on_step or self._step_rows.append
        self.on_sample = on_sample or (self._sample_rows.append if sample_dt > 0 else None)
        self.sample_dt = sample_dt
        self.next_sample = 0.0 if (sample_dt > 0 and self.on_sample is not None) else math.inf
        self._sample_k = 0
        self.now = 0.0
        self.clock = 0.0  # the latest time advanced to
        self.steps_taken = 0
        self._arrivals: list = []   # (arrival_time, retry?, seq, request)
        self._deadlines: list = []  # (time, kind, seq, request)
        self._deadline_of: dict = {}  # request -> {kind: time}
        self._pending = None        # a step scheduled but not yet ended: (output, start, end)
        self.explain = frozenset(int(k) for k in explain)
        self.explanations: list = []
        self._aborts: list = []     # (request, time asked): applied at the next step boundary

    # -- the shared clock ------------------------------------------------------------------------
    def submit(self, request, at: float | None = None) -> None:
        """Hand over a request that arrives at ``request.arrival_time``, or that a gateway
        dispatches at ``at`` (its ``dispatch_time``; the replica sees it then)."""
        heapq.heappush(self._arrivals, arrival_entry(request, at))

    def accept(self, request, at: float | None = None) -> bool:
        """Hand over a request arriving now (``at``: dispatched by a gateway at that time): with a
        step in progress it joins the queue at once, else it is submitted. Returns whether the
        replica was idle (the driver then calls :meth:`step_at` now)."""
        if self._pending is not None and at is None and not self._arrivals:
            self._arrive(request)  # what the step's end would do first: nothing else is queued before it
            return False
        self.submit(request, at)
        return self._pending is None

    def step_at(self, t: float) -> float:
        """:meth:`advance` to ``t``, then :meth:`next_event_time`."""
        self.advance(t)
        return self.next_event_time()

    def load(self) -> ReplicaLoad:
        """The replica's load as numbers (:class:`~llmqueue.engine.api.ReplicaLoad`)."""
        s = self.scheduler
        return ReplicaLoad(len(s.waiting) + len(self._arrivals), len(s.running), s.kv.num_free_blocks,
                           self.config.num_kv_blocks, self._pending is not None)

    def count_waiting(self, class_name: str) -> int:
        """Waiting requests of one class (handed over ones included)."""
        return (self.scheduler.waiting.count(class_name)
                + sum(1 for e in self._arrivals if e[3].class_name == class_name))

    def drain(self) -> list:
        """Every request the replica holds, handed back: running, then queued, then handed over
        and not yet seen. The replica is not stepped again."""
        held = [*self.in_system(), *(e[3] for e in self._arrivals)]
        self._arrivals.clear()
        return held

    def abort(self, request, at: float | None = None) -> None:
        """Take ``request`` out at the first step boundary at or after ``at`` (default: the
        latest time advanced to): a client that disconnected. It leaves ``cancelled`` and its KV
        blocks are freed; a request already finished is left alone. An idle replica takes it out
        at ``at`` itself (an external event, in :meth:`next_event_time`)."""
        self._aborts.append((request, self.clock if at is None else at))

    def tier_account(self) -> dict | None:
        """The host KV tier's account (:meth:`~llmqueue.engine.host_tier.HostTier.stats`); None without one."""
        tier = self.scheduler.tier
        return None if tier is None else tier.stats()

    def close(self) -> None:
        """Drop the driver's callbacks and the step in progress."""
        self.on_finish = self.on_first_token = self.on_preempt = self.on_token = None
        self._pending = None

    def step_chunks(self) -> list:
        """The step records so far as one column chunk (when no ``on_step`` was given)."""
        from llmqueue.engine.fast.recorder import row_columns

        return [row_columns(self._step_rows, STEP_FIELDS, ("start_s", "duration_s"))]

    def timeseries_chunks(self) -> list:
        """The time-series rows so far as one column chunk (when no ``on_sample`` was given)."""
        from llmqueue.engine.fast.recorder import row_columns

        return [row_columns(self._sample_rows, TS_FIELDS, ("t_s",))]

    def next_event_time(self) -> float:
        """When this replica next changes state: the end of the step in progress, else the next
        arrival or deadline (``inf`` when none)."""
        if self._pending is not None:
            return self._pending[2]
        if self.scheduler.has_work():
            return self.now
        return self._next_external()

    def advance(self, until: float) -> None:
        """Run up to ``until``: steps that end by then are applied; a step that starts by then
        but ends later stays in progress (its schedule is visible in :meth:`state`)."""
        self.clock = max(self.clock, until)
        while True:
            if self._pending is not None:
                out, start, end = self._pending
                if end > until:
                    return
                self._pending = None
                self._end_step(out, end)
                self.now = end
                continue
            t = self.now
            if t > until:
                return
            self._take_arrivals(t)
            self._expire(t)
            if self._aborts:
                self._apply_aborts(t)
            step = self._begin_step(t) if self.scheduler.has_work() else None
            if step is not None:
                self._pending = step
                continue
            nxt = self._next_external()
            if nxt > until or nxt == math.inf:
                if until < math.inf:
                    self._sample_until(until)
                return
            self._sample_until(nxt)
            self.now = nxt

    def run(self, horizon: float = math.inf) -> None:
        """Run until every submitted request is done, or until ``horizon``: steps start only
        before it (a step that starts before it ends whole)."""
        self._horizon = horizon
        t = self.now
        while t < horizon:
            self._take_arrivals(t)
            self._expire(t)
            if self._aborts:
                self._apply_aborts(t)
            step = self._begin_step(t) if self.scheduler.has_work() else None
            if step is not None:
                self._end_step(step[0], step[2])
                t = step[2]
                continue
            nxt = self._next_external()
            if nxt == math.inf:
                break
            self._sample_until(min(nxt, horizon))
            t = nxt
        self.now = t

    def in_system(self) -> list:
        """The requests that arrived and have not left (running, then waiting)."""
        return [*self.scheduler.running, *self.scheduler.waiting]

    def state(self) -> dict:
        """A read-only view: waiting (queued, or arrived by the clock and not yet seen by the
        scheduler) and running counts, KV blocks used and free, tokens still to prefill in the
        queue and in service, the cached prefix units."""
        s = self.scheduler
        kv = s.kv
        arrived = [e[3] for e in self._arrivals if e[0] <= self.clock]  # not yet seen by the scheduler
        queued = sum(r.num_tokens - r.num_computed_tokens for r in (*s.waiting, *arrived))
        prefilling = sum(r.num_tokens - r.num_computed_tokens for r in s.running if not r.is_decoding)
        return {"time": max(self.now, self.clock), "num_waiting": len(s.waiting) + len(arrived),
                "num_running": len(s.running),
                "kv_blocks_used": kv.num_used_blocks, "kv_blocks_free": kv.num_free_blocks,
                "queued_prefill_tokens": queued + prefilling, "busy": self._pending is not None,
                "cached_prefix_units": frozenset(kv.pool.ref) | frozenset(kv.pool.evictable) if kv.pool else frozenset()}

    # -- arrivals and deadlines ------------------------------------------------------------------
    def _next_external(self) -> float:
        t = self._arrivals[0][0] if self._arrivals else math.inf
        if self._aborts:
            t = min(t, min(at for _, at in self._aborts))
        d = self._deadlines
        while d and d[0][3].is_finished:
            heapq.heappop(d)
        return min(t, d[0][0]) if d else t

    def _take_arrivals(self, t: float) -> None:
        a = self._arrivals
        while a and a[0][0] <= t:
            self._arrive(heapq.heappop(a)[3])

    def _arrive(self, r) -> None:
        why = reject_reason(self.config, r, self.scheduler.waiting)
        if why is not None:
            r.status = RequestStatus.FINISHED
            return self._finish(r, "rejected", r.arrival_time, why)
        self.scheduler.add_request(r)
        marks = deadlines(self.config, r, self.timeout_s, self.ttft_timeout_s, self.patience)
        for kind, when in marks.items():
            heapq.heappush(self._deadlines, (when, kind, r.seq, r))
        if marks:
            self._deadline_of[r] = marks

    def _expire(self, t: float) -> None:
        d = self._deadlines
        while d and d[0][0] <= t:
            when, kind, _, r = heapq.heappop(d)
            if r.is_finished:
                continue
            if kind == DEADLINE_SHED:
                if (r.status is RequestStatus.WAITING and math.isnan(r.first_scheduled_time)
                        and r.num_output_tokens == 0):  # a P/D decode side has its first token
                    self.scheduler.abort(r)
                    self._finish(r, "rejected", when, "queue time limit")
                continue
            if kind == DEADLINE_PATIENCE:  # the client gives up on a request that never started
                if (r.status is RequestStatus.WAITING and math.isnan(r.first_scheduled_time)
                        and r.num_output_tokens == 0):
                    self.scheduler.abort(r)
                    self._finish(r, "cancelled", when, "patience")
                continue
            if kind == DEADLINE_TTFT and r.first_token_time <= when:
                continue
            self.scheduler.abort(r)
            self._finish(r, "timeout", when)

    def _apply_aborts(self, t: float) -> None:
        """The aborts asked by ``t`` (a step boundary): each request leaves ``cancelled``."""
        due = [(r, at) for r, at in self._aborts if at <= t]
        self._aborts = [(r, at) for r, at in self._aborts if at > t]
        for r, at in due:
            if r.is_finished:
                continue
            unseen = [e for e in self._arrivals if e[3] is r]
            if unseen:  # handed over, not yet arrived
                self._arrivals.remove(unseen[0])
                heapq.heapify(self._arrivals)
                r.status = RequestStatus.FINISHED
            else:
                self.scheduler.abort(r)
            self._deadline_of.pop(r, None)
            self._finish(r, "cancelled", t)

    def _finish(self, r, outcome: str, t: float, reason: str | None = None) -> None:
        outcome, t = late_outcome(self._deadline_of.pop(r, None), r, outcome, t)
        r.outcome = outcome
        r.finish_time = t
        r.reason = reason
        self.on_finish(r)

    # -- steps ------------------------------------------------------------------------------------
    def _begin_step(self, t: float):
        """Schedule a step starting at ``t``: ``(output, start, end)``, or None when nothing can run."""
        s = self.scheduler
        before = (s.kv.num_free_blocks, len(s.waiting), len(s.running)) if self.steps_taken in self.explain else ()
        out = s.schedule()
        preempted = out.preempted
        self._preempted(out)
        while not out.scheduled and out.preempted:
            # everything scheduled was preempted: the freed blocks let the next pass admit work
            out = s.schedule()
            self._preempted(out)
            preempted = preempted + out.preempted
        if not out.scheduled:
            return None
        out.preempted = preempted
        for r, _ in out.scheduled:
            if math.isnan(r.first_scheduled_time):
                r.first_scheduled_time = t
        comp = out.composition
        dur = self.pricer.price(comp, self.steps_taken, t)
        if comp.load_tokens:  # KV loaded back from the host tier: the forward pass waits for it
            dur += comp.load_tokens * self.config.kv_offload_s_per_token
        end = t + dur
        kv_tokens = s.kv.num_used_blocks * self.config.block_size
        self._sample_until(end, (len(s.waiting), len(s.running), kv_tokens))
        self.on_step((self.steps_taken, t, dur, comp.prefill_tokens, comp.decode_seqs, len(s.running),
                      len(s.waiting), kv_tokens, len(preempted), 1))
        if self.steps_taken in self.explain:
            from llmqueue.engine.explain import StepExplanation

            after = (s.kv.num_free_blocks, len(s.waiting), len(s.running))
            self.explanations.append(StepExplanation.of(self.steps_taken, t, end, out, before, after))
        self.steps_taken += 1
        return out, t, end

    def _preempted(self, out) -> None:
        if self.on_preempt is not None:
            for v in out.preempted:
                self.on_preempt(v)

    def _end_step(self, out, end: float) -> None:
        emitted = ([r for r, new in out.scheduled if r.num_computed_tokens + new == r.num_tokens]
                   if self.on_token is not None else ())
        finished = self.scheduler.update_from_output(out, end)
        for r in emitted:
            self.on_token(r, end)
        if self.on_first_token is not None:
            for r, _ in out.scheduled:
                if r.first_token_time == end and r.num_output_tokens == 1:
                    self.on_first_token(r)
        for r in finished:
            self._finish(r, "ok", end)

    def _sample_until(self, t_end: float, st: tuple | None = None) -> None:
        """Time-series rows for the sample times before ``t_end``, in the current state."""
        if self.next_sample >= t_end:
            return
        if st is None:
            s = self.scheduler
            st = (len(s.waiting), len(s.running), s.kv.num_used_blocks * self.config.block_size)
        k1 = sample_index_before(self._sample_k, self.sample_dt, t_end, self._horizon)
        for k in range(self._sample_k, k1):  # sample times are k * sample_dt
            self.on_sample((k * self.sample_dt, *st))
        self._sample_k = k1
        self.next_sample = k1 * self.sample_dt

    _horizon = math.inf
