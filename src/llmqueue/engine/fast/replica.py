"""``Replica``: the fast simulator of one serving replica, on the engine's nouns.

Same semantics as the reference replica (:mod:`llmqueue.engine.reference`, the executable
specification; its module docstring states the event semantics), at a cost not proportional to
decode steps x batch size. It is built from the fast twins of the reference's nouns: the
:class:`~llmqueue.engine.fast.scheduler.Scheduler` (vLLM's ``schedule()``, with the decoders
aggregated when their order cannot matter), the :class:`~llmqueue.engine.fast.decoders.DecoderPool`
(decoding requests kept implicitly), the :class:`~llmqueue.engine.fast.ledger.BlockLedger` (the
KV cache), the :class:`~llmqueue.engine.pricing.StepPricer` and the
:class:`~llmqueue.engine.fast.recorder.StepRecorder`. Tests check that the two replicas produce
the same records.

Three ways to take steps, the cheapest that is exact:

- a *step* (:meth:`Replica.step`): one engine step, the decoders as counts; or, when their
  order matters (a decoder must be preempted, a budget binds behind a prefilling request), the
  exact step: vLLM's ``schedule()`` on the materialized running list;
- a *stretch* (:meth:`Replica.stretch`): the decode-only steps up to the next event (a
  completion, the step where the free blocks run out, an arrival, a deadline, the horizon) in
  one jump (:class:`~llmqueue.engine.fast.stretch.DecodeStretch`);
- an *epoch* (:mod:`llmqueue.engine.fast.epoch`): with a constant step time and nothing binding,
  a busy period's steps computed with numpy.

The replica steps on a clock it can share (the replica contract, :mod:`llmqueue.engine.api`):
:meth:`submit`, :meth:`accept`, :meth:`step_at`, :meth:`next_event_time`, :meth:`load`,
:meth:`drain`; alone: :meth:`feed`, :meth:`run`, :meth:`advance`, :meth:`state`.
"""

from __future__ import annotations

import gc
import heapq
import math
from typing import Any, Final

from llmqueue.engine.admission import DEADLINE_PATIENCE, DEADLINE_SHED, DEADLINE_TTFT, arrival_entry, deadlines, late_outcome, reject_reason
from llmqueue.engine.api import ReplicaLoad
from llmqueue.engine.fast.arrivals import Arrivals
from llmqueue.engine.fast.epoch import MAX_CHUNK, advance_epoch, epoch_eligible
from llmqueue.engine.fast.recorder import StepRecorder, stack_columns
from llmqueue.engine.fast.scheduler import Scheduler
from llmqueue.engine.fast.stretch import DecodeStretch
from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS
from llmqueue.engine.output import Composition, SchedulerOutput
from llmqueue.engine.pricing import StepPricer
from llmqueue.engine.request import Request, RequestStatus

# Final: in the compiled build a static load, not a lookup in the module's dictionary
WAITING: Final = RequestStatus.WAITING
RUNNING: Final = RequestStatus.RUNNING
FINISHED: Final = RequestStatus.FINISHED
NO_STEP: Final = 1 << 60  # an engine step index never reached (no step to explain; a native int)
_push_deadline: Final = heapq.heappush
_pop_deadline: Final = heapq.heappop


class PendingStep:
    """A step begun by the driver's clock that ends after it: its end, its schedule (the explicit
    requests' chunks; ``num_decoders`` implicit decoders besides), and whether it was exact."""

    __slots__ = ("end", "scheduled", "num_decoders", "exact")

    def __init__(self, end: float, scheduled: list[tuple[Request, int]], num_decoders: int, exact: bool) -> None:
        self.end = end
        self.scheduled = scheduled
        self.num_decoders = num_decoders
        self.exact = exact


class Replica:
    """Fast simulation of one replica (see the module docstring).

    ``timeout_s`` / ``ttft_timeout_s``: per class, the client's deadlines. ``on_finish(request)``:
    called as each request leaves (``outcome`` set); ``on_first_token(request)``: as a request's
    first token comes (its ``first_token_time``); ``on_preempt(request)``: as a request is preempted.
    ``sample_dt``: time-series interval (0: none). ``explain``: engine step indices whose decision
    is kept as a :class:`~llmqueue.engine.explain.StepExplanation` in :attr:`explanations`
    (those steps are taken exactly; the records are the same).
    """

    # attributes in slots: fixed offsets, one compact block per replica (a fleet holds many)
    __slots__ = ("config", "pricer", "scheduler", "recorder", "arrivals", "stretcher", "timeout_s", "ttft_timeout_s", "patience",
                 "deadlines_on", "plain_door", "max_total", "deadlines", "deadline_marks", "on_finish", "progress",
                 "horizon", "now", "clock", "hold", "pending", "steps_taken", "stretches", "stretch_arrivals",
                 "arrived", "epoch_steps", "use_epochs", "on_records", "explain_steps", "explain_next",
                 "explanations")

    def __init__(self, config, step_time, *, seed: int = 0, hash_block_tokens: int = 512,
                 timeout_s: dict | None = None, ttft_timeout_s: dict | None = None, patience: dict | None = None,
                 on_finish=None,
                 on_first_token=None, on_preempt=None, sample_dt: float = 0.0, horizon: float = math.inf,
                 progress=None, explain=()):
        self.config = config
        self.pricer = StepPricer(step_time, seed)
        self.scheduler = Scheduler(config, hash_block_tokens=hash_block_tokens)
        self.scheduler.on_first_token = on_first_token
        self.scheduler.on_preempt = on_preempt
        self.recorder = StepRecorder(sample_dt)
        self.arrivals = Arrivals()
        self.stretcher = DecodeStretch(self.scheduler.decoders, self.recorder, self.pricer)
        self.timeout_s = timeout_s or {}
        self.ttft_timeout_s = ttft_timeout_s or {}
        self.patience = patience or {}
        self.deadlines_on = bool(self.timeout_s or self.ttft_timeout_s or self.patience or config.max_queue_time_s
                                 or config.class_max_queue_time_s)
        # no waiting-room limits: an arrival whose size fits joins the queue (``_join``)
        self.plain_door = not (config.max_waiting or config.class_max_waiting)
        self.max_total: int = int(min(config.max_model_len or 10**18, config.capacity_tokens))
        self.deadlines: list = []      # (time, kind, seq, request)
        self.deadline_marks: dict = {}  # request -> {kind: time}
        self.on_finish: Any = on_finish or (lambda r: None)
        self.progress = progress
        self.horizon = horizon
        self.now = 0.0
        self.clock = 0.0       # the latest time advanced to
        self.hold: Any = None  # while advancing: the time a step may start by
        self.pending: PendingStep | None = None  # a step begun by `clock` that ends after it
        self.steps_taken = 0
        self.stretches = 0
        self.stretch_arrivals = 0  # arrivals that joined the queue inside a stretch (at a step boundary)
        self.arrived = 0  # requests that arrived (epochs' included)
        self.epoch_steps = 0
        self.use_epochs = True
        self.on_records: Any = None  # columns of requests an epoch finished without making them objects
        self.explain_steps: list[int] = sorted({int(k) for k in explain}, reverse=True)  # still to come, last first
        self.explain_next: int = self.explain_steps.pop() if self.explain_steps else NO_STEP
        self.explanations: list = []

    # =============================================================================================
    # the replica contract (llmqueue.engine.api)
    def submit(self, request, at: float | None = None) -> None:
        """Hand over a request that arrives at ``request.arrival_time``, or that a gateway
        dispatches at ``at`` (its ``dispatch_time``; the replica sees it then)."""
        self.arrivals.push(arrival_entry(request, at))

    def accept(self, request, at: float | None = None) -> bool:
        """Hand over a request arriving now (the driver's clock; ``at``: dispatched by a gateway
        at that time): a replica with a step in progress and nothing else handed over queues it at
        once (its next step would take it first), else it is submitted. Returns whether the replica
        was idle (the driver must then call :meth:`step_at` now)."""
        if self.pending is not None and at is None and not self.arrivals.submitted:
            self._arrive(request)  # what the step's end would do first: nothing else is queued before it
            return False
        self.arrivals.push(arrival_entry(request, at))
        return self.pending is None

    def load(self) -> ReplicaLoad:
        """The replica's load as numbers (:class:`~llmqueue.engine.api.ReplicaLoad`): queued
        requests (handed over ones included), the running batch, free KV blocks."""
        s = self.scheduler
        return ReplicaLoad(s.waiting.size + len(self.arrivals.submitted), len(s.running), s.kv.num_free_blocks,
                           s.kv.num_blocks, self.pending is not None)

    def count_waiting(self, class_name: str) -> int:
        """Waiting requests of one class (handed over ones included)."""
        return self.scheduler.waiting.count(class_name) + self.arrivals.count_class(class_name)

    def drain(self) -> list:
        """Every request the replica holds, handed back: running, then queued, then handed over
        and not yet seen (a failure, or the end of a run). The replica is not stepped again."""
        return [*self.in_system(), *self.arrivals.drain()]

    def tier_account(self) -> dict | None:
        """The host KV tier's account (:meth:`~llmqueue.engine.host_tier.HostTier.stats`); None without one."""
        tier = self.scheduler.tier
        return None if tier is None else tier.stats()

    def close(self) -> None:
        """Drop the driver's callbacks and the step in progress (they refer to the driver): what
        the replica holds is freed with it by reference counting."""
        self.on_finish = None
        self.scheduler.on_first_token = self.scheduler.on_preempt = None
        self.pending = None

    def next_event_time(self) -> float:
        """When this replica next changes state: now if it has work, else the next arrival or
        deadline (``inf`` when none)."""
        if self.pending is not None:
            return self.pending.end
        if self.scheduler.has_work():
            return self.now
        return self._next_external()

    def step_at(self, t: float) -> float:
        """:meth:`advance` to ``t`` for a driver that holds the garbage collector off (the fleet at
        this replica's own event: its step in progress ends at ``t``, or it was idle and handed a
        request); returns :meth:`next_event_time`."""
        if t > self.clock:
            self.clock = t
        p = self.pending
        if p is not None:
            if p.end > t:
                return p.end
            self.pending = None
            self._end_step(p)
            self.now = p.end
        self.hold = t
        s = self.scheduler
        if self.now == t:
            # the common case: a step ended at t; take what arrived and expired, begin the next
            # step (it stays in progress), as one turn of _run's loop with horizon = hold = t
            if self.arrivals.next_time() <= t:
                self._take_arrivals(t)
            if self.deadlines and self.deadlines[0][0] <= t:
                self._expire(t)
            if s.has_work():
                saved = self.horizon
                self.horizon = t
                self.step(t)
                self.horizon = saved
                if self.pending is None:  # not begun (nothing to schedule) or ended by t: the general loop
                    self._run(t, t)
            else:
                self._run(t, t)
        else:
            self._run(t, t)
        self.hold = None
        self.recorder.flush_large()
        p = self.pending
        if p is not None:
            return p.end
        if s.has_work():
            return self.now
        return self._next_external()

    def step_chunks(self) -> list:
        """The step records so far, as column chunks."""
        return self.recorder.step_chunks()

    def timeseries_chunks(self) -> list:
        """The time-series rows so far, as column chunks."""
        return self.recorder.timeseries_chunks()

    # =============================================================================================
    # alone: a fed stream, run, advance, state
    def feed(self, stream) -> None:
        """Take a whole :class:`~llmqueue.engine.stream.RequestStream` (sorted by arrival time): its
        requests are made as they arrive, so only those in flight are held."""
        self.arrivals.feed(stream)

    def advance(self, until: float) -> None:
        """Run up to ``until``: the steps that end by then are applied; a step that starts by then
        but ends later stays in progress (its schedule is visible in :meth:`state`, its tokens
        and completions come when a later call passes its end), as in the reference replica."""
        if until > self.clock:
            self.clock = until
        p = self.pending
        if p is not None:
            if p.end > until:
                return
            self.pending = None
            self._end_step(p)
            self.now = p.end
        enabled = gc.isenabled()
        gc.disable()
        try:
            self.hold = until
            self._run(until, until)
        finally:
            self.hold = None
            if enabled:
                gc.enable()
        self.recorder.flush_large()  # a driver advancing step by step: _run's own flush never comes

    def run(self, horizon: float = math.inf) -> None:
        """Run until every submitted request is done, or until ``horizon``: steps start only
        before it (a step in progress from :meth:`advance` ends first)."""
        p = self.pending
        if p is not None:
            self.pending = None
            self._end_step(p)
            self.now = p.end
        enabled = gc.isenabled()
        gc.disable()  # the loop allocates many small objects and frees none of them in cycles
        try:
            self._run(min(horizon, self.horizon), None)
        finally:
            if enabled:
                gc.enable()

    def _run(self, horizon: float, stop_idle_at) -> None:
        t = self.now
        progress = self.progress
        iters = 0
        hold = self.hold  # advance(): steps that start by `hold` begin; one that ends after it waits
        use_epochs = hold is None and self.use_epochs and self.on_records is not None and epoch_eligible(self)
        backoff = fails = 0
        chunk = 256
        saved = self.horizon
        self.horizon = horizon
        s = self.scheduler
        arrivals = self.arrivals
        rec = self.recorder
        try:
            deadlines = self.deadlines
            submitted = arrivals.submitted
            while t < horizon or (hold is not None and t == hold):
                if arrivals.next_stream_time <= t or (submitted and submitted[0][0] <= t):  # arrivals.next_time() <= t
                    self._take_arrivals(t)
                if deadlines and deadlines[0][0] <= t:
                    self._expire(t)
                if not s.running and not s.waiting.size:
                    t2: Any = t
                else:
                    t2 = None
                    if use_epochs and not s.prefilling and not s.waiting.size:
                        if backoff > 0:
                            backoff -= 1
                        else:
                            ep = advance_epoch(self, t, chunk)
                            if ep is None:
                                # a constraint binds right away: take normal steps for a while,
                                # longer after each consecutive failure
                                fails += 1
                                backoff = min(64, 1 << fails)
                            else:
                                t_ep, taken, full = ep
                                k = round((t_ep - t) / self.pricer.constant)
                                t2 = t_ep
                                chunk = min(MAX_CHUNK, 2 * chunk) if full else max(64, 2 * taken)
                                if k < 40 and taken < 16:
                                    # a short epoch costs more than the steps it saves (a binding
                                    # constraint keeps ending them): step normally for longer
                                    fails += 1
                                    backoff = min(512, 4 << fails)
                                else:
                                    fails = 0
                    if t2 is not None:
                        pass
                    elif t != hold and s.only_decodes():  # at `hold` a stretch would be one step
                        t2 = self.stretch(t)
                    else:
                        t2 = self.step(t)
                    if self.pending is not None:
                        break  # a step in progress at `hold`
                if t2 == t:
                    nxt = self._next_external()
                    kv = s.kv
                    if nxt == math.inf or (stop_idle_at is not None and nxt > stop_idle_at):
                        if stop_idle_at is not None and stop_idle_at < math.inf:
                            rec.sample_until(min(stop_idle_at, horizon), horizon, s.waiting.size, len(s.running),
                                             kv.num_used_blocks * kv.block_size)
                        break
                    rec.sample_until(min(nxt, horizon), horizon, s.waiting.size, len(s.running),
                                     kv.num_used_blocks * kv.block_size)
                    t = nxt
                else:
                    t = t2
                iters += 1
                if not iters & 1023:
                    rec.flush_large()
                    if progress is not None:
                        progress(t)
            if progress is not None:
                progress(t)
        finally:
            self.horizon = saved
        self.now = t

    def state(self) -> dict:
        """A read-only view: waiting (queued, or arrived by the clock and not yet seen by the
        scheduler) and running counts, KV blocks used and free, tokens still to prefill (queued
        and in service), the cached prefix units."""
        s = self.scheduler
        kv = s.kv
        arrived = self.arrivals.arrived_by(self.clock)
        queued = sum(r.num_tokens - r.num_computed_tokens for r in (*s.waiting, *arrived))
        p = self.pending
        running: Any = s.running_list if p is not None and p.exact else s.running  # an exact step in progress: its list
        pool = kv.pool
        return {"time": max(self.now, self.clock), "num_waiting": s.waiting.size + len(arrived),
                "num_running": len(running),
                "kv_blocks_used": kv.num_used_blocks, "kv_blocks_free": kv.num_free_blocks,
                "queued_prefill_tokens": queued + s.prefill_backlog(running),
                "cached_prefix_units": frozenset(pool.ref) | frozenset(pool.evictable) if pool else frozenset()}

    def in_system(self) -> list:
        """The requests that arrived and have not left, materialized (running, then waiting)."""
        return self.scheduler.in_system()

    def step_columns(self) -> dict:
        return stack_columns([(0, self.recorder.step_chunks())], STEP_FIELDS, ("start_s", "duration_s"))

    def timeseries_columns(self) -> dict:
        return stack_columns([(0, self.recorder.timeseries_chunks())], TS_FIELDS, ("t_s",))

    # =============================================================================================
    # arrivals, admission control, deadlines, departures
    def _next_external(self) -> float:
        t = self.arrivals.next_time()
        d = self._next_deadline()
        return d if d < t else t

    def _next_deadline(self) -> float:
        d = self.deadlines
        while d and d[0][3].status is FINISHED:
            _pop_deadline(d)
        return d[0][0] if d else math.inf

    def _take_arrivals(self, t: float) -> None:
        """Every request that has arrived by ``t`` joins the queue (or is rejected)."""
        arrivals = self.arrivals
        while True:
            r = arrivals.take(t)
            if r is None:
                return
            self._arrive(r)

    def _arrive(self, r: Request) -> None:
        if self.plain_door:  # no waiting-room limit: only the sizes can refuse it
            s, o = r.num_prompt_tokens, r.max_tokens
            if s > 0 and o > 0 and s + o <= self.max_total:
                return self._join(r)
        why = reject_reason(self.config, r, self.scheduler.waiting)
        if why is not None:
            self.arrived += 1
            r.status = FINISHED
            return self.finish(r, "rejected", r.arrival_time, why)
        self._join(r)

    def _join(self, r: Request) -> None:
        """``r`` joins the waiting queue, with its client deadlines (the door's rules passed)."""
        self.arrived += 1
        self.scheduler.add_request(r)
        if self.deadlines_on:
            marks = deadlines(self.config, r, self.timeout_s, self.ttft_timeout_s, self.patience)
            for kind, when in marks.items():
                _push_deadline(self.deadlines, (when, kind, r.seq, r))
            if marks:
                self.deadline_marks[r] = marks

    def _expire(self, t: float) -> None:
        """Apply client timeouts and queue-time shedding that are due by ``t``."""
        d = self.deadlines
        s = self.scheduler
        while d and d[0][0] <= t:
            when, kind, _, r = _pop_deadline(d)
            st = r.status
            if st is FINISHED:
                continue
            if kind == DEADLINE_SHED:  # shedding applies only to requests that never started
                if st is WAITING and r.first_scheduled_time != r.first_scheduled_time and r.num_output_tokens == 0:
                    s.abort(r)
                    self.finish(r, "rejected", when, "queue time limit")
                continue
            if kind == DEADLINE_PATIENCE:  # the client gives up on a request that never started
                if st is WAITING and r.first_scheduled_time != r.first_scheduled_time and r.num_output_tokens == 0:
                    s.abort(r)
                    self.finish(r, "cancelled", when, "patience")
                continue
            if kind == DEADLINE_TTFT and r.first_token_time <= when:
                continue  # the first token came in time
            s.abort(r)
            self.finish(r, "timeout", when)

    def finish(self, r: Request, outcome: str, t: float, reason: str | None = None) -> None:
        """``r`` (already FINISHED, its blocks freed) leaves: ok, or a late timeout, or as given."""
        if self.deadline_marks:
            outcome, t = late_outcome(self.deadline_marks.pop(r, None), r, outcome, t)
        r.outcome = outcome
        r.finish_time = t
        r.reason = reason
        self.on_finish(r)

    def _depart(self, t_end: float) -> None:
        """The requests that produced their last token in the step(s) ending at ``t_end`` leave."""
        finished = self.scheduler.finished
        if self.deadline_marks:
            for r in finished:
                self.finish(r, "ok", t_end)
        else:  # no deadline it could have missed: ok at t_end (finish(), inline)
            on_finish = self.on_finish
            for r in finished:
                r.outcome = "ok"
                r.finish_time = t_end
                r.reason = None
                on_finish(r)
        finished.clear()

    # =============================================================================================
    # steps
    def step(self, t: float) -> float:
        """One engine step from ``t``, the decoders aggregated (or exact when their order
        matters); returns its end (``t``: nothing could be scheduled)."""
        s = self.scheduler
        plan = s.schedule_aggregated() if self.steps_taken != self.explain_next else None
        if plan is None:
            return self._exact_step(t)
        dec = s.decoders
        n = len(dec.kv_base)
        if not plan and n == 0:
            return t
        comp = s.composition
        comp.reset(n, dec.context_tokens())
        if s.step_load:  # requests resumed from the host tier: their KV loads in this step
            comp.load_tokens = s.step_load
            s.step_load = 0
        for r, new in plan:
            if r.first_scheduled_time != r.first_scheduled_time:
                r.first_scheduled_time = t
            comp.add(r, new)
        t_end = self._record_step(t, comp, len(s.running), s.num_preempted)
        if self.hold is not None and t_end > self.hold:
            self.pending = PendingStep(t_end, plan, n, False)
            return t_end
        s.update_from_plan(plan, n, t_end)
        if s.finished:
            self._depart(t_end)
        return t_end

    def _exact_step(self, t: float) -> float:
        """One engine step from ``t`` as vLLM's ``schedule()`` takes it, on the materialized running list."""
        s = self.scheduler
        kv = s.kv
        explain = self.steps_taken == self.explain_next
        before = (kv.num_free_blocks, s.waiting.size, len(s.running)) if explain else ()
        s.materialize()
        out = s.schedule()
        preempted = out.preempted
        while not out.scheduled and out.preempted:
            # everything scheduled was preempted: the freed blocks let the next pass admit work
            out = s.schedule()
            preempted = preempted + out.preempted
        if not out.scheduled:
            s.rebuild()
            return t
        out.preempted = preempted
        for r, _ in out.scheduled:
            if r.first_scheduled_time != r.first_scheduled_time:
                r.first_scheduled_time = t
        t_end = self._record_step(t, out.composition, len(s.running_list), len(out.preempted))
        if explain:
            self._explain(out, t, t_end, before)
        if self.hold is not None and t_end > self.hold:
            self.pending = PendingStep(t_end, out.scheduled, 0, True)
            return t_end
        s.update_from_output(out.scheduled, t_end)
        if s.finished:
            self._depart(t_end)
        return t_end

    def _record_step(self, t: float, comp: Composition, running: int, preempted: int) -> float:
        """Price a step of composition ``comp`` starting at ``t``, record its row and the samples
        before its end; returns its end."""
        s = self.scheduler
        kv = s.kv
        dur = self.pricer.price(comp, self.steps_taken, t)
        if comp.load_tokens:  # KV loaded back from the host tier: the forward pass waits for it
            dur += comp.load_tokens * self.config.kv_offload_s_per_token
            comp.load_tokens = 0
        t_end = t + dur
        used = (kv.num_blocks - kv.num_free_blocks) * kv.block_size
        waiting = s.waiting.size
        rec = self.recorder
        if rec.next_sample < t_end:
            rec.sample_until(t_end, self.horizon, waiting, running, used)
        rec.row(self.steps_taken, t, dur, comp.prefill_tokens, comp.decode_seqs, running, waiting, used, preempted, 1)
        self.steps_taken += 1
        return t_end

    def _end_step(self, p: PendingStep) -> None:
        """The step in progress ends (at ``p.end``): its tokens are computed, its requests leave."""
        if p.exact:
            self.scheduler.update_from_output(p.scheduled, p.end)
        else:
            self.scheduler.update_from_plan(p.scheduled, p.num_decoders, p.end)
        self._depart(p.end)

    def _explain(self, out: SchedulerOutput, t: float, t_end: float, before: tuple) -> None:
        """Keep the decision of the step just begun (:attr:`explain_next`) as a StepExplanation."""
        from llmqueue.engine.explain import StepExplanation

        s = self.scheduler
        self.explanations.append(StepExplanation.of(self.explain_next, t, t_end, out, before,
                                                    (s.kv.num_free_blocks, s.waiting.size, len(s.running_list))))
        self.explain_next = self.explain_steps.pop() if self.explain_steps else NO_STEP

    # =============================================================================================
    # a stretch of decode-only steps in one jump
    def stretch(self, t: float) -> float:
        """Advance as many decode-only steps as possible before the next event; returns the new time."""
        s = self.scheduler
        dec = s.decoders
        kv = s.kv
        n = len(dec.kv_base)
        k_max = dec.steps_within(kv.num_free_blocks, dec.next_finish_step() - dec.steps)  # the completing step ends it
        if self.explain_next - self.steps_taken < k_max:
            k_max = self.explain_next - self.steps_taken  # the explained step is taken alone
        if k_max <= 0:
            return self.step(t)
        # deadlines and the horizon end a stretch at the first step boundary after them; so do
        # arrivals (they may be admitted, join a queue whose length is recorded, or bring a
        # deadline) unless nothing can be admitted during it whatever arrives: they then pass
        # through it, taken at the step boundary where the scheduler would see them
        through = not self.deadlines_on and s.admission_closed()
        t_arr = self.arrivals.next_time()
        t_stop = min(self.horizon, self._next_deadline())
        if not through and t_arr < t_stop:
            t_stop = t_arr
        speed = 1.0
        drift = self.pricer.drift
        if drift is not None:  # a drifting engine: the stretch ends after its speed window
            t_stop = min(t_stop, drift.next_boundary(t))
            speed = drift.at(t)
        st = self.stretcher
        k_max = st.begin(t, k_max, speed, self.steps_taken)
        if k_max <= 0:
            return self.step(t)
        k = min(k_max, st.reach(t_stop)) if t_stop < math.inf else k_max
        dur = st.duration(k)
        hold = self.hold
        if hold is not None and t + dur > hold:
            # advancing to `hold`: only the steps that end by it (the one across it is taken alone)
            while k > 0 and t + st.duration(k) > hold:
                k -= 1
            if k == 0:
                return self.step(t)
            dur = st.duration(k)
        waiting0 = s.waiting.size
        marks: list | None = None
        if through and k > 1 and t_arr <= t + st.duration(k - 1):
            marks = self._arrivals_inside(t + st.duration(k - 1))
        t_end = t + dur
        if self.recorder.next_sample < t_end:
            st.record_samples(t, k, n, waiting0, marks, kv.num_used_blocks, self.steps_taken, self.horizon)
        used0 = kv.num_used_blocks
        kv.allocate(dec.blocks_needed(k))
        if marks:
            st.record_rows(self.steps_taken, t, k, n, waiting0, marks, used0)
        else:
            self.recorder.row(self.steps_taken, t, dur, 0, n, n, waiting0, kv.num_used_blocks * kv.block_size, 0, k)
        self.steps_taken += k
        dec.steps += k
        self.stretches += 1
        s.complete_decoders()
        if s.finished:
            self._depart(t_end)
        return t_end

    def _arrivals_inside(self, last_start: float) -> list:
        """Take the requests that arrive by ``last_start`` (the start of a stretch's last step)
        in arrival order; returns, for each that joined the queue, the index of the step at
        whose start the scheduler sees it (ascending)."""
        marks: list = []
        arrivals = self.arrivals
        waiting = self.scheduler.waiting
        while True:
            x = arrivals.next_time()
            r = arrivals.take(last_start)
            if r is None:
                self.stretch_arrivals += len(marks)
                return marks
            before = waiting.size
            self._arrive(r)
            if waiting.size > before:
                marks.append(self.stretcher.reach(x))
