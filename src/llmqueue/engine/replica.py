"""``Replica``: the fast simulator of one serving replica, on the engine's nouns.

Same semantics as the reference replica (:mod:`llmqueue.engine.reference`, the executable
specification), at a cost not proportional to decode steps x batch size. It shares the nouns
(:class:`~llmqueue.engine.request.Request`, :class:`~llmqueue.engine.request_queue.RequestQueue`,
the policy objects, the prefix cache's block pool) but no scheduling code with it; tests check
that the two produce the same records.

Decoding requests are kept implicitly. Between events every decoding request gains one token
per step, so a decoder's KV tokens are ``dbase[r] + D`` and its outputs ``obase[r] + D``, where
``D`` counts the steps in which all decoders advanced. What changes the state in between is
known in advance:

- the next completion is the smallest ``D_fin`` in a heap;
- a decoder needs a new KV block in the step where its token count is a multiple of the
  block size, so the blocks needed in any step come from a histogram of ``dbase mod
  block_size``: the step where the cache would run out is found in O(block_size);
- the next arrival, client deadline or horizon is a time: the step boundary at or after it
  follows from the closed-form (constant) or cumulative (other models) step times.

A run of decode-only steps up to the first of these events is taken in one jump (a
*stretch*). Steps with prefill work or admissions are taken one at a time with the decoders
aggregated (their budget and block needs are counts); a step that must preempt a decoder, or
whose token budget binds in an order that matters, is taken exactly (:meth:`Replica._exact_step`:
vLLM's ``schedule()`` on the materialized running list).

The replica steps on a clock it can share: :meth:`submit`, :meth:`next_event_time`,
:meth:`advance`, :meth:`state`, and ``on_finish(request)`` as requests leave. Event semantics
are the reference's (see its module docstring).
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import struct
from typing import Any, Final

import numpy as np

from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS
from llmqueue.engine.api import ReplicaLoad
from llmqueue.engine.admission import (DEADLINE_SHED, DEADLINE_TTFT, arrival_entry, deadlines, late_outcome,
                                       reject_reason)
from llmqueue.engine.epoch import MAX_CHUNK, advance_epoch, epoch_eligible
from llmqueue.engine.kv_cache_manager import cdiv
from llmqueue.engine.limits import sample_index_before
from llmqueue.engine.policies import victim_policy
from llmqueue.engine.request import Request, RequestStatus
from llmqueue.engine.request_queue import RequestQueue
from llmqueue.engine.stream import CHUNK, ChunkLists, RequestStream
from llmqueue.engine.step_model import constant_step, drift_stream, linear_decode, noise_stream
from llmqueue.engine.step_time import StepTimeModel, parse_step_time
from llmqueue.errors import InputError

# Final: in the compiled build a static load, not a lookup in the module's dictionary
WAITING: Final = RequestStatus.WAITING
RUNNING: Final = RequestStatus.RUNNING
PREEMPTED: Final = RequestStatus.PREEMPTED
FINISHED: Final = RequestStatus.FINISHED
NAN: Final = math.nan
_ROW: Final = struct.Struct(f"{len(STEP_FIELDS)}d")  # one step row: STEP_FIELDS as float64, packed
_pack_row: Final = _ROW.pack
_STEP_BUF: Final = 8192 * _ROW.size  # flush the step rows to columns past this many bytes (8,192 rows)
_heappush: Final = heapq.heappush
_heappop: Final = heapq.heappop


class Replica:
    """Fast simulation of one replica (see the module docstring).

    ``timeout_s`` / ``ttft_timeout_s``: per class, the client's deadlines. ``on_finish(request)``:
    called as each request leaves (``outcome`` set); ``on_first_token(request)``: as a request's
    first token comes (its ``first_token_time``); ``on_preempt(request)``: as a request is preempted.
    ``sample_dt``: time-series interval (0: none).
    """

    # attributes in slots: fixed offsets, one compact block per replica (a fleet holds many)
    __slots__ = (
        'D', 'H', '_arrivals', '_b0', '_c0', '_cc', '_cd', '_cp', '_deadlines_on', '_hold', '_lin', '_pending',
        '_budget', '_chunked', '_full_isl', '_max_len', '_max_seqs', '_plain', '_preempt_newest', '_price',
        '_price_inline',
        '_sample_k', '_st_chunk', '_st_lists', '_st_next', '_st_pos', '_st_times', '_step_buf', '_step_chunks',
        '_stream', '_thr', '_ts_buf', '_ts_chunks', 'arrived', 'blocks', 'bs', 'cfg', 'clock', 'dbase',
        'deadlines', 'dfin', 'dl', 'drift', 'epoch_steps', 'fin', 'free', 'hist', 'horizon', 'late',
        'max_total', 'model', 'next_sample', 'noise', 'now', 'obase', 'on_finish', 'on_first_token',
        'on_preempt', 'on_records', 'order', 'pc', 'plain_door', 'prefilling', 'progress', 'regstop',
        'running', 'sample_dt', 'seq', 'shared', 'steps_taken', 'stretch_arrivals', 'stretches', 'sum_dbase',
        'timeout_s', 'total_blocks', 'ttft_timeout_s', 'ub', 'use_epochs', 'victim', 'waiting',
        '_s_mode', '_s_a', '_s_g', '_s_t', '_s_ends')

    def __init__(self, config, step_time, *, seed: int = 0, hash_block_tokens: int = 512,
                 timeout_s: dict | None = None, ttft_timeout_s: dict | None = None, on_finish=None,
                 on_first_token=None, on_preempt=None, sample_dt: float = 0.0, horizon: float = math.inf,
                 progress=None):
        self.cfg = config
        # the knobs the scheduler reads every step, as typed fields (a frozen EngineConfig read once;
        # in the compiled build a field is a load, an EngineConfig attribute a dictionary lookup)
        self._budget = int(config.max_num_batched_tokens)
        self._max_seqs = int(config.max_num_seqs)
        self._max_len = int(config.max_model_len or 0)
        self._chunked = bool(config.enable_chunked_prefill)
        self._full_isl = bool(config.scheduler_reserve_full_isl)
        self._preempt_newest = config.preemption == "newest"
        self.model = parse_step_time(step_time)
        m = self.model
        self._b0: float = float(constant_step(m) or 0.0)  # a constant step time
        lin = linear_decode(m)  # decode steps linear in their composition: (c0, per sequence, per context token)
        self._lin: tuple[float, float, float] | None = (None if lin is None else
                                                         (float(lin[0]), float(lin[1]), float(lin[2])))
        self.noise = noise_stream(m, seed)
        self.drift = drift_stream(m, seed)
        # no noise, no drift and a positive fixed cost: a step's duration is the model's price of
        # its composition (never zero: the built-in models' coefficients are non-negative)
        self._plain = (self.noise is None and self.drift is None and isinstance(m, StepTimeModel)
                       and (m.c0 > 0 if m.roofline is None else m.roofline[0] > 0))
        self._price = m.base
        # a linear model without noise or drift is priced inline, term for term as its ``base`` (the
        # same floats) without a Python call a step: the compiled build's hot path
        self._price_inline = self._plain and type(m) is StepTimeModel and m.roofline is None
        self._c0, self._cp, self._cd, self._cc = ((float(m.c0), float(m.c_prefill), float(m.c_decode), float(m.c_ctx))
                                                  if self._price_inline else (0.0, 0.0, 0.0, 0.0))
        # KV blocks as typed ints (native arithmetic in the compiled build; a config value is untyped)
        self.bs: int = int(config.block_size)
        self.total_blocks: int = int(config.num_kv_blocks)
        self.free: int = self.total_blocks
        self.timeout_s = timeout_s or {}
        self.ttft_timeout_s = ttft_timeout_s or {}
        self._deadlines_on = bool(self.timeout_s or self.ttft_timeout_s or config.max_queue_time_s
                                  or config.class_max_queue_time_s)
        # no waiting-room limits: an arrival whose size fits joins the queue (``_join``)
        self.plain_door = not (config.max_waiting or config.class_max_waiting)
        self.on_finish = on_finish or (lambda r: None)
        self.on_first_token = on_first_token
        self.on_preempt = on_preempt
        self.sample_dt = sample_dt
        self.horizon = horizon
        self.progress = progress
        self.max_total: int = int(min(config.max_model_len or 10**18, config.capacity_tokens))
        self.victim = victim_policy(config.preemption)
        self._thr: int = int(config.long_prefill_token_threshold)
        self.waiting = RequestQueue(config.policy)
        # --- prefix caching -------------------------------------------------------------------
        self.pc: Any = None
        self.H: int = 1   # prefix-cache unit (tokens) and blocks a unit, set with the cache
        self.ub: int = 0
        if config.enable_prefix_caching:
            from llmqueue.engine.prefix_cache import PrefixCache

            H = hash_block_tokens
            if H < 1 or H % config.block_size:
                raise InputError("hash_block_tokens", f"{H} is not a multiple of the block size {config.block_size}")
            self.H = H
            self.ub = H // self.bs
            self.pc = PrefixCache(config.num_kv_blocks, self.ub)
        self.shared: dict = {}       # running request -> leading prefix units it references in the cache
        self.regstop: set = set()    # requests that stopped registering units (kept across preemptions)
        # --- arrivals and deadlines ----------------------------------------------------------------
        self._arrivals: list = []     # submitted requests: (arrival_time, retry?, seq, request)
        self._stream: RequestStream | None = None  # a fed stream, read a chunk at a time
        self._st_chunk = 0
        self._st_times: list[float] = []  # the loaded chunk's arrival times (its lists' [1], kept at hand)
        self._st_lists: ChunkLists | None = None  # the loaded chunk's columns (RequestStream.lists)
        self._st_pos = 0
        self._st_next = math.inf      # the stream's next arrival time
        self.deadlines: list = []     # (time, kind, seq, request)
        self.dl: dict = {}            # request -> {kind: time}
        # --- running requests: admission order, prefilling ones, implicit decoders ------------------
        self.blocks: dict[Request, int] = {}  # KV blocks held by running requests that are not implicit decoders
        self.order: dict[Request, int] = {}   # running request -> admission sequence number
        self.prefilling: dict[Request, int] = {}  # running requests not decoding (same values)
        self.seq = 0
        self.D = 0
        self.dbase: dict[Request, int] = {}
        self.obase: dict[Request, int] = {}
        self.dfin: dict[Request, int] = {}
        self.fin: list[tuple[int, int, Request]] = []  # (D at completion, admission seq, request)
        self.hist: list[int] = [0] * self.bs
        self.sum_dbase = 0
        self.late: set[Request] = set()
        self.running: list = []       # the materialized running list of an exact step
        # --- records ---------------------------------------------------------------------------------
        self.now = 0.0
        self.clock = 0.0     # the latest time advanced to
        self._hold: Any = None    # while advancing: the time a step may start by
        self._pending: Any = None  # a step begun by `clock` that ends after it: (end, apply, args)
        self.steps_taken = 0
        self.stretches = 0
        self.stretch_arrivals = 0  # arrivals that joined the queue inside a stretch (at a step boundary)
        self.arrived = 0  # requests that arrived (epochs' included)
        self.epoch_steps = 0
        self.use_epochs = True
        self.on_records: Any = None  # columns of requests an epoch finished without making them objects
        self._step_buf = bytearray()  # step rows packed as float64 (no object kept per step or value;
        # read back as columns without a copy, every 8,192 rows)
        self._step_chunks: list = []
        self._ts_buf: list = []
        self._ts_chunks: list = []
        self.next_sample = 0.0 if sample_dt > 0 else math.inf  # sample times are k * sample_dt
        self._sample_k = 0
        # the current stretch's step durations (:meth:`stretch`): 0 equal steps of ``_s_a``, 1 linear
        # (``_s_a`` + ``_s_g`` j), 2 the end times ``_s_ends``; it starts at ``_s_t``
        self._s_mode = 0
        self._s_a = 0.0
        self._s_g = 0.0
        self._s_t = 0.0
        self._s_ends: Any = None

    # =============================================================================================
    # the shared clock
    def submit(self, request, at: float | None = None) -> None:
        """Hand over a request that arrives at ``request.arrival_time``, or that a gateway
        dispatches at ``at`` (its ``dispatch_time``; the replica sees it then)."""
        _heappush(self._arrivals, arrival_entry(request, at))

    def accept(self, request, at: float | None = None) -> bool:
        """Hand over a request arriving now (the driver's clock; ``at``: dispatched by a gateway
        at that time): a replica with a step in progress and nothing else handed over queues it at
        once (its next step would take it first), else it is submitted. Returns whether the replica
        was idle (the driver must then call :meth:`step_at` now)."""
        if self._pending is not None and at is None and not self._arrivals:
            self._arrive(request)  # what the step's end would do first: nothing else is queued before it
            return False
        _heappush(self._arrivals, arrival_entry(request, at))
        return self._pending is None

    def load(self) -> ReplicaLoad:
        """The replica's load as numbers (:class:`~llmqueue.engine.api.ReplicaLoad`): queued
        requests (handed over ones included), the running batch, free KV blocks."""
        return ReplicaLoad(len(self.waiting) + len(self._arrivals), len(self.order), self.free, self.total_blocks,
                           self._pending is not None)

    def count_waiting(self, class_name: str) -> int:
        """Waiting requests of one class (handed over ones included)."""
        return self.waiting.count(class_name) + sum(1 for e in self._arrivals if e[3].class_name == class_name)

    def drain(self) -> list:
        """Every request the replica holds, handed back: running, then queued, then handed over
        and not yet seen (a failure, or the end of a run). The replica is not stepped again."""
        held = [*self.in_system(), *(e[3] for e in self._arrivals)]
        self._arrivals.clear()
        return held

    def close(self) -> None:
        """Drop the driver's callbacks and the step in progress (they refer to the driver): what
        the replica holds is freed with it by reference counting."""
        self.on_finish = self.on_first_token = self.on_preempt = None
        self._pending = None

    def feed(self, stream) -> None:
        """Take a whole :class:`~llmqueue.engine.stream.RequestStream` (sorted by arrival time): its
        requests are made as they arrive, so only those in flight are held."""
        self._stream = stream
        self._st_chunk = 0
        self._load_chunk()

    def _load_chunk(self, pos: int = 0) -> None:
        """Load the stream's next chunk (from its ``pos``-th request)."""
        s = self._stream
        if s is None or self._st_chunk * CHUNK + pos >= s.n:
            self._st_times, self._st_lists, self._st_next = [], None, math.inf
            return
        lists = s.lists(self._st_chunk)
        self._st_lists = lists
        self._st_times = lists[1]
        self._st_chunk += 1
        self._st_pos = pos
        self._st_next = self._st_times[pos]

    def stream_position(self) -> int:
        """Requests of the fed stream taken so far."""
        if self._stream is None:
            return 0
        if self._st_next == math.inf:
            return self._stream.n
        return (self._st_chunk - 1) * CHUNK + self._st_pos

    def _seek(self, i: int) -> None:
        """The stream's next request is its ``i``-th (the epoch path took those before it)."""
        assert self._stream is not None
        if i >= self._stream.n:
            self._st_times, self._st_lists, self._st_next = [], None, math.inf
            return
        if self._st_next != math.inf and i // CHUNK == self._st_chunk - 1:  # inside the loaded chunk
            self._st_pos = i % CHUNK
            self._st_next = self._st_times[self._st_pos]
            return
        self._st_chunk = i // CHUNK
        self._load_chunk(i % CHUNK)

    def _next_arrival(self) -> float:
        t = self._st_next
        a = self._arrivals
        return a[0][0] if a and a[0][0] < t else t

    def next_event_time(self) -> float:
        """When this replica next changes state: now if it has work, else the next arrival or
        deadline (``inf`` when none)."""
        if self._pending is not None:
            return self._pending[0]
        if self.order or self.waiting.size:
            return self.now
        return self._next_external()

    def advance(self, until: float) -> None:
        """Run up to ``until``: the steps that end by then are applied; a step that starts by then
        but ends later stays in progress (its schedule is visible in :meth:`state`, its tokens
        and completions come when a later call passes its end), as in the reference replica."""
        if until > self.clock:
            self.clock = until
        if self._pending is not None:
            end, apply, args = self._pending
            if end > until:
                return
            self._pending = None
            apply(*args)
            self.now = end
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._hold = until
            self._run(until, until)
        finally:
            self._hold = None
            if enabled:
                gc.enable()
        self._flush_large()  # a driver advancing step by step: _run's own flush never comes

    def step_at(self, t: float) -> float:
        """:meth:`advance` to ``t`` for a driver that holds the garbage collector off (the fleet at
        this replica's own event: its step in progress ends at ``t``, or it was idle and handed a
        request); returns :meth:`next_event_time`."""
        if t > self.clock:
            self.clock = t
        p = self._pending
        if p is not None:
            if p[0] > t:
                return p[0]
            self._pending = None
            p[1](*p[2])
            self.now = p[0]
        self._hold = t
        if self.now == t:
            # the common case: a step ended at t; take what arrived and expired, begin the next
            # step (it stays in progress), as one turn of _run's loop with horizon = hold = t
            if self._st_next <= t or (self._arrivals and self._arrivals[0][0] <= t):
                self._take_arrivals(t)
            if self.deadlines and self.deadlines[0][0] <= t:
                self._expire(t)
            if self.order or self.waiting.size:
                saved = self.horizon
                self.horizon = t
                self.step(t)
                self.horizon = saved
                if self._pending is None:  # not begun (nothing to schedule) or ended by t: the general loop
                    self._run(t, t)
            else:
                self._run(t, t)
        else:
            self._run(t, t)
        self._hold = None
        self._flush_large()
        p = self._pending
        if p is not None:
            return p[0]
        if self.order or self.waiting.size:
            return self.now
        return self._next_external()

    def run(self, horizon: float = math.inf) -> None:
        """Run until every submitted request is done, or until ``horizon``: steps start only
        before it (a step in progress from :meth:`advance` ends first)."""
        if self._pending is not None:
            end, apply, args = self._pending
            self._pending = None
            apply(*args)
            self.now = end

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
        hold = self._hold  # advance(): steps that start by `hold` begin; one that ends after it waits
        use_epochs = hold is None and self.use_epochs and self.on_records is not None and epoch_eligible(self)
        backoff = fails = 0
        chunk = 256
        saved = self.horizon
        self.horizon = horizon
        try:
            deadlines = self.deadlines
            arrivals = self._arrivals
            while t < horizon or (hold is not None and t == hold):
                if self._st_next <= t or (arrivals and arrivals[0][0] <= t):
                    self._take_arrivals(t)
                if deadlines and deadlines[0][0] <= t:
                    self._expire(t)
                if not self.order and not self.waiting.size:
                    t2: Any = t
                else:
                    t2 = None
                    if use_epochs and not self.prefilling and not self.waiting.size:
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
                                k = round((t_ep - t) / self._b0)
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
                    elif t != hold and self._can_stretch():  # at `hold` a stretch would be one step
                        t2 = self.stretch(t)
                    else:
                        t2 = self.step(t)
                    if self._pending is not None:
                        break  # a step in progress at `hold`
                if t2 == t:
                    nxt = self._next_external()
                    if nxt == math.inf or (stop_idle_at is not None and nxt > stop_idle_at):
                        if stop_idle_at is not None and stop_idle_at < math.inf:
                            self._sample_until(min(stop_idle_at, horizon), len(self.waiting), len(self.order),
                                               (self.total_blocks - self.free) * self.bs)
                        break
                    self._sample_until(min(nxt, horizon), len(self.waiting), len(self.order),
                                       (self.total_blocks - self.free) * self.bs)
                    t = nxt
                else:
                    t = t2
                iters += 1
                if not iters & 1023:
                    if len(self._step_buf) > _STEP_BUF:
                        self._flush_steps()
                    if len(self._ts_buf) > 8192:
                        self._flush_samples()
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
        arrived = [e[3] for e in self._arrivals if e[0] <= self.clock]  # not yet seen by the scheduler
        queued = sum(r.num_tokens - r.num_computed_tokens for r in (*self.waiting, *arrived))
        exact = self._pending is not None and self._pending[1] == self._exact_end
        running = self.running if exact else self.order  # an exact step in progress: its running list
        prefilling = sum(r.num_tokens - r.num_computed_tokens for r in running
                         if r not in self.dbase and not r.is_decoding)
        pc = self.pc
        return {"time": max(self.now, self.clock), "num_waiting": len(self.waiting) + len(arrived),
                "num_running": len(running),
                "kv_blocks_used": self.total_blocks - self.free, "kv_blocks_free": self.free,
                "queued_prefill_tokens": queued + prefilling,
                "cached_prefix_units": frozenset(pc.ref) | frozenset(pc.evictable) if pc else frozenset()}

    def in_system(self) -> list:
        """The requests that arrived and have not left, materialized (running, then waiting)."""
        self._materialize_all()
        return [*self.order, *self.waiting]

    # =============================================================================================
    # arrivals, admission control, deadlines, endings
    def _next_external(self) -> float:
        t = self._next_arrival()
        d = self.deadlines
        while d and d[0][3].status is FINISHED:
            _heappop(d)
        return min(t, d[0][0]) if d else t

    def _next_deadline(self) -> float:
        d = self.deadlines
        while d and d[0][3].status is FINISHED:
            _heappop(d)
        return d[0][0] if d else math.inf

    def _take_arrivals(self, t: float) -> None:
        """Every request that has arrived by ``t`` joins the queue (or is rejected); the stream's
        before a submitted one at equal times."""
        while True:
            r = self._next_arrived(t)
            if r is None:
                return
            self._arrive(r)

    def _next_arrived(self, t: float):
        """The next request arriving by ``t`` (the stream's before a submitted one at equal times),
        taken from its source; None when none is left."""
        a = self._arrivals
        ts = self._st_next
        if ts <= t and (not a or ts <= a[0][0]):
            s = self._stream
            lists = self._st_lists
            assert s is not None and lists is not None
            r = s.make_in(lists, self._st_pos)
            self._st_pos += 1
            if self._st_pos == len(self._st_times):
                self._load_chunk()
            else:
                self._st_next = self._st_times[self._st_pos]
            return r
        if a and a[0][0] <= t:
            return _heappop(a)[3]
        return None

    def _arrive(self, r: Request) -> None:
        if self.plain_door:  # no waiting-room limit: only the sizes can refuse it
            s, o = r.num_prompt_tokens, r.max_tokens
            if s > 0 and o > 0 and s + o <= self.max_total:
                return self._join(r)
        why = reject_reason(self.cfg, r, self.waiting)
        if why is not None:
            self.arrived += 1
            return self._reject(r, why)
        self._join(r)

    def _join(self, r: Request) -> None:
        """``r`` joins the waiting queue, with its client deadlines (the door's rules passed; a
        fleet that checked the sizes calls this directly when ``plain_door``: no waiting-room limit)."""
        self.arrived += 1
        r.status = WAITING
        self.waiting.add(r)
        if self._deadlines_on:
            marks = deadlines(self.cfg, r, self.timeout_s, self.ttft_timeout_s)
            for kind, when in marks.items():
                _heappush(self.deadlines, (when, kind, r.seq, r))
            if marks:
                self.dl[r] = marks

    def _reject(self, r: Request, why: str) -> None:
        r.status = FINISHED
        self._end(r, "rejected", r.arrival_time, why)

    def _expire(self, t: float) -> None:
        """Apply client timeouts and queue-time shedding that are due by ``t``."""
        d = self.deadlines
        while d and d[0][0] <= t:
            when, kind, _, r = _heappop(d)
            st = r.status
            if st is FINISHED:
                continue
            if kind == DEADLINE_SHED:  # shedding applies only to requests that never started
                if st is WAITING and r.first_scheduled_time != r.first_scheduled_time:
                    self.waiting.remove(r)
                    r.status = FINISHED
                    self._end(r, "rejected", when, "queue time limit")
                continue
            if kind == DEADLINE_TTFT and r.first_token_time <= when:
                continue  # the first token came in time
            if st is RUNNING:
                self._remove_running(r)
            else:
                self.waiting.remove(r)
            r.status = FINISHED
            self._end(r, "timeout", when)

    def _end(self, r: Request, outcome: str, t: float, reason: str | None = None) -> None:
        """``r`` (already FINISHED, its blocks freed) leaves: ok, or a late timeout, or as given."""
        if self.dl:
            outcome, t = late_outcome(self.dl.pop(r, None), r, outcome, t)
        r.outcome = outcome
        r.finish_time = t
        r.reason = reason
        self.on_finish(r)

    # =============================================================================================
    # KV blocks: allocation from the free queue, release, admission, prefix units
    def _alloc(self, n: int) -> None:
        """Take ``n`` free blocks (from the head of the free queue, evicting cached prefixes)."""
        self.free -= n
        if self.pc is not None and n:
            self.pc.consume(n)

    def _release(self, r: Request) -> None:
        """Free ``r``'s blocks: private ones, and its prefix units nobody else uses."""
        b = self.blocks.pop(r, 0)
        if self.pc is None:
            self.free += b
        else:
            k = self.shared.pop(r, 0)
            units = r.hash_ids[:k] if k and r.hash_ids is not None else ()
            self.free += self.pc.free_request(b - k * self.ub, units)

    def _remove_running(self, r: Request) -> None:
        """Take a running request out (a timeout): materialize it, free its blocks."""
        if r in self.dbase:
            self._drop_decoder(r)
        else:
            self.prefilling.pop(r, None)
        del self.order[r]
        self._release(r)

    def _ask(self, r: Request, computed: int) -> int:
        """Tokens ``r`` asks for in one step before the budget: the rest of its sequence after
        ``computed`` tokens, capped at ``long_prefill_token_threshold`` (vLLM's order: the cap first)."""
        new = r.num_prompt_tokens + r.num_output_tokens - computed
        thr = self._thr
        return thr if 0 < thr < new else new

    def _admit_head(self, budget: int) -> tuple[Request, int] | None:
        """vLLM's admission of the waiting head with ``budget`` tokens left in the step: returns
        ``(request, new_tokens)`` after allocating its blocks (and its prefix-cache hits), or None
        when it cannot be scheduled in this step. The caller checks ``max_num_seqs``."""
        r = self.waiting.peek()
        if r is None:
            return None
        comp = r.num_computed_tokens
        k = extra = 0
        pc = self.pc
        if pc is not None and comp == 0 and r.hash_ids:
            k, extra = pc.lookup(r.hash_ids, (r.num_prompt_tokens - 1) // self.H)
            comp = k * self.H
        new = self._ask(r, comp)
        if not self._chunked and new > budget:
            return None
        if new > budget:
            new = budget
        held = self.blocks.get(r, 0) + (k * self.ub if k else 0)
        need, gate = self._admit_blocks(r, comp, new, held)
        if gate + extra > self.free:
            return None
        self.waiting.take_head(r)
        if k:
            pc.take(r.hash_ids, k)
            self.free -= extra
            r.num_computed_tokens = comp
            self.shared[r] = k
            held = k * self.ub
        else:
            held = 0
        if r.num_cached_tokens < 0:
            r.num_cached_tokens = k * self.H if k else 0
        self._alloc(need)
        self.blocks[r] = held + need
        r.status = RUNNING
        return r, new

    def _advance(self, r: Request, new: int, t_end: float) -> int:
        """Apply ``new`` computed tokens of ``r`` at the end of a step: 0 = no token yet (prefill
        continues), 1 = a token was produced, 2 = the last token was produced."""
        c = r.num_computed_tokens + new
        r.num_computed_tokens = c
        if self.pc is not None:
            self._register_units(r)
        o = r.num_output_tokens
        if c != r.num_prompt_tokens + o:
            return 0
        o += 1
        r.num_output_tokens = o
        if o == 1:
            r.first_token_time = t_end
            if self.on_first_token is not None:
                self.on_first_token(r)
        return 2 if o == r.max_tokens else 1

    def _register_units(self, r: Request) -> None:
        """After a step: cache the prefix units ``r``'s prefill has completed."""
        h = r.hash_ids
        if h is None or r in self.regstop:
            return
        u = self.shared.get(r, 0)
        done = min(r.num_computed_tokens, r.num_prompt_tokens) // self.H
        while u < done and u < len(h):
            if not self.pc.register(h[u]):
                self.regstop.add(r)
                break
            u += 1
        self.shared[r] = u

    def _finish(self, r: Request, t_end: float) -> None:
        """``r`` produced its last token at ``t_end``."""
        self.order.pop(r, None)
        r.status = FINISHED
        self._release(r)
        if r in self.regstop:
            self.regstop.discard(r)
        self._end(r, "ok", t_end)

    # =============================================================================================
    # decoders (implicit)
    def _add_decoder(self, r: Request) -> None:
        db = r.num_computed_tokens - self.D
        ob = r.num_output_tokens - self.D
        self.dbase[r] = db
        self.obase[r] = ob
        f = r.max_tokens - ob
        self.dfin[r] = f
        _heappush(self.fin, (f, self.order[r], r))
        self.hist[db % self.bs] += 1
        self.sum_dbase += db
        self.blocks.pop(r, None)

    def _drop_decoder(self, r: Request) -> None:
        """Materialize decoder ``r`` (computed tokens, outputs, blocks) and remove it from the implicit state."""
        db = self.dbase.pop(r)
        ob = self.obase.pop(r)
        del self.dfin[r]
        self.hist[db % self.bs] -= 1
        self.sum_dbase -= db
        self.late.discard(r)
        c = db + self.D
        r.num_computed_tokens = c
        r.num_output_tokens = ob + self.D
        self.blocks[r] = cdiv(c, self.bs)

    def _materialize_all(self) -> None:
        for r in list(self.dbase):
            self._drop_decoder(r)
        self.fin.clear()

    def _rebuild(self) -> None:
        """Re-derive the prefilling and decoder sets from the exact step's running list."""
        self.prefilling.clear()
        order = self.order
        for r in self.running:
            if r not in order:
                self.seq += 1
                order[r] = self.seq
        self.order = order = {r: order[r] for r in self.running}
        for r, s in order.items():
            if r.num_output_tokens > 0 and r.num_computed_tokens == r.num_prompt_tokens + r.num_output_tokens - 1:
                self._add_decoder(r)
            else:
                self.prefilling[r] = s
        self._reset_late()

    def _reset_late(self) -> None:
        self.late.clear()
        if self.prefilling:
            m = min(self.prefilling.values())
            self.late.update(d for d in self.dbase if self.order[d] > m)

    def _inverted(self) -> bool:
        """Does some decoder come after a prefilling request in the running order?"""
        if not self.late:
            return False
        if not self.prefilling:
            self.late.clear()
            return False
        m = min(self.prefilling.values())
        for d in [d for d in self.late if self.order[d] < m]:
            self.late.discard(d)
        return bool(self.late)

    def _valid_fin_top(self) -> int | None:
        f = self.fin
        dfin = self.dfin
        while f and dfin.get(f[0][2]) != f[0][0]:
            _heappop(f)
        return f[0][0] if f else None

    def _complete_decoders(self, t_end: float) -> None:
        """Decoders whose last token came in the step(s) that ended at ``t_end`` finish."""
        D = self.D
        f = self.fin
        dfin = self.dfin
        if self.pc is not None or self.dl:
            while f and f[0][0] <= D:
                d_fin, _, r = _heappop(f)
                if dfin.get(r) != d_fin:
                    continue
                self._drop_decoder(r)
                self._finish(r, t_end)
            return
        # no prefix cache and no deadlines: the same, inlined (the hot path of a long run)
        dbase, obase, hist, order, late = self.dbase, self.obase, self.hist, self.order, self.late
        bs = self.bs
        on_finish = self.on_finish
        while f and f[0][0] <= D:
            d_fin, _, r = _heappop(f)
            if dfin.get(r) != d_fin:
                continue
            db = dbase.pop(r)
            ob = obase.pop(r)
            del dfin[r]
            hist[db % bs] -= 1
            self.sum_dbase -= db
            late.discard(r)
            c = db + D
            r.num_computed_tokens = c
            r.num_output_tokens = ob + D
            self.free += -(-c // bs)  # cdiv, inline
            del order[r]
            r.status = FINISHED
            r.outcome = "ok"
            r.finish_time = t_end
            on_finish(r)

    # =============================================================================================
    # one step with the decoders aggregated
    def step(self, t: float) -> float:
        B = self._budget
        n = len(self.dbase)
        need_dec = self.hist[(-self.D) % self.bs] if n else 0
        plan: list[tuple[Request, int]] = []
        budget = B - n
        exact = budget < 0
        preempted = 0
        demand = n
        blocks_needed = need_dec
        blocks = self.blocks
        bs = self.bs
        if not exact:
            for r in self.prefilling:
                c = r.num_computed_tokens
                new = self._ask(r, c)
                demand += new
                if new > budget:
                    new = budget
                if new <= 0:
                    break
                budget -= new
                blocks_needed += cdiv(c + new, bs) - blocks[r]
                plan.append((r, new))
            inverted = self._inverted() if (demand > B or blocks_needed > self.free) else False
            if inverted:
                exact = True
            elif blocks_needed > self.free:
                # out of KV blocks: preempt from the tail. While the victims are prefilling requests
                # (they come after every decoder), the outcome does not depend on the decoders'
                # order and is computed here; otherwise the exact step decides.
                tail = (self._preempt_tail(n, need_dec, B - n)
                        if n and self._preempt_newest and self.pc is None else None)
                if tail is None:
                    exact = True
                else:
                    plan, budget, preempted = tail
                    n = len(self.dbase)  # decoders may have been preempted
        if exact:
            return self._exact_step(t)
        if preempted:
            for r, new in plan:
                blocks[r] = cdiv(r.num_computed_tokens + new, bs)
        else:
            self._alloc(blocks_needed)
            for r, new in plan:
                blocks[r] = cdiv(r.num_computed_tokens + new, bs)
        # admit waiting requests with the remaining budget (only in a step that preempted none)
        waiting = self.waiting
        while not preempted and budget > 0 and waiting.size and len(self.order) < self._max_seqs:
            got = self._admit_head(budget)
            if got is None:
                break
            r, new = got
            self.seq += 1
            self.order[r] = self.seq
            self.prefilling[r] = self.seq
            plan.append((r, new))
            budget -= new
        if not plan and n == 0:
            return t
        prefill = 0
        decode = n
        context = self.sum_dbase + n * self.D + n
        for r, new in plan:
            if r.first_scheduled_time != r.first_scheduled_time:
                r.first_scheduled_time = t
            c = r.num_computed_tokens
            o = r.num_output_tokens
            if new == 1 and o > 0 and c == r.num_prompt_tokens + o - 1:
                decode += 1
                context += c + 1
            else:
                prefill += new
        if self._price_inline:
            dur = self._c0 + self._cp * prefill + self._cd * decode + self._cc * context
        elif self._plain:
            dur = self._price(prefill, decode, context)
        else:
            dur = self._duration(prefill, decode, context, t)
        t_end = t + dur
        used = (self.total_blocks - self.free) * bs
        nw = len(self.waiting)
        if self.next_sample < t_end:
            self._sample_until(t_end, nw, len(self.order), used)
        self._row(self.steps_taken, t, dur, prefill, decode, len(self.order), nw, used, preempted, 1)
        self.steps_taken += 1
        if self._hold is not None and t_end > self._hold:
            self._pending = (t_end, self._apply_plan, (plan, n, t_end))
            return t_end
        self._apply_plan(plan, n, t_end)
        return t_end

    def _apply_plan(self, plan: list[tuple[Request, int]], n: int, t_end: float) -> None:
        """The end of an aggregated step: decoders advance (D += 1), then the planned chunks."""
        if n:
            self.D += 1
            if self.fin[0][0] <= self.D:
                self._complete_decoders(t_end)
        for r, new in plan:
            res = self._advance(r, new, t_end)
            if res == 2:
                del self.prefilling[r]
                self._finish(r, t_end)
            elif res == 1:
                s = self.prefilling.pop(r)
                self._add_decoder(r)
                if self.prefilling and min(self.prefilling.values()) < s:
                    self.late.add(r)

    def _preempt_tail(self, n: int, need_dec: int, budget: int):
        """vLLM's walk when blocks run out and every prefilling request comes after the decoders:
        decoders allocate first, preempting prefilling requests from the tail as needed, then the
        remaining prefilling requests take their chunks in order, preempting the tail when short.
        Returns ``(plan, budget_left, preempted)`` with ``self.free`` updated (decoders preempted
        from the tail when the prefilling requests' blocks are not enough), or None when the
        caller must take the exact step."""
        pf = list(self.prefilling)
        blocks = self.blocks
        avail = self.free
        k = 0
        victims = []
        while need_dec > avail and k < len(pf):
            k += 1
            avail += blocks[pf[-k]]
        if need_dec > avail:
            # every prefilling request goes, and decoders from the tail until the rest fit: the
            # smallest such suffix is what vLLM's walk preempts (it preempts only when short, and a
            # decoder that would have to preempt itself is that suffix's first member)
            bs, D = self.bs, self.D
            dbase = self.dbase
            for v in reversed(self.order):
                if need_dec <= avail:
                    break
                if v not in dbase:
                    continue  # a prefilling request (they all come after the decoders here)
                c = dbase[v] + D
                avail += cdiv(c, bs)
                if c % bs == 0:
                    need_dec -= 1
                victims.append(v)
        preempted = 0
        for _ in range(k):
            self._preempt(pf.pop())
            preempted += 1
        for v in victims:
            self._drop_decoder(v)
            self._preempt(v)
            preempted += 1
        free = avail - need_dec
        plan: list[tuple[Request, int]] = []
        idx = 0
        bs = self.bs
        while idx < len(pf) and budget > 0:
            r = pf[idx]
            c = r.num_computed_tokens
            new = self._ask(r, c)
            if new > budget:
                new = budget
            need = cdiv(c + new, bs) - blocks[r]
            gone = False
            while need > free:
                v = pf.pop()
                free += blocks[v]
                self._preempt(v)
                preempted += 1
                if v is r:
                    gone = True
                    break
            if gone:
                break
            free -= need
            plan.append((r, new))
            budget -= new
            idx += 1
        self.free = free
        return plan, budget, preempted

    def _preempt(self, v: Request) -> None:
        """Preempt running request ``v`` (recompute), whose blocks the caller has freed or counts
        as freed: back to the waiting queue's front."""
        del self.order[v]
        self.prefilling.pop(v, None)
        self.blocks.pop(v, None)
        v.num_computed_tokens = 0
        v.num_preemptions += 1
        v.status = PREEMPTED
        self.waiting.prepend(v)
        if self.on_preempt is not None:
            self.on_preempt(v)

    # =============================================================================================
    # the exact step: vLLM's schedule() on the materialized running list
    def _exact_step(self, t: float) -> float:
        self._materialize_all()
        self.running = list(self.order)
        return self._exact(t)

    def _exact_schedule(self):
        budget = self._budget
        running = self.running
        blocks = self.blocks
        bs = self.bs
        scheduled: list = []
        preempted = 0
        k = 0
        while k < len(running) and budget > 0:
            r = running[k]
            c = r.num_computed_tokens
            new = self._ask(r, c)
            if new > budget:
                new = budget
            ok = True
            while True:
                need = cdiv(c + new, bs) - blocks[r]
                if need <= self.free:
                    self._alloc(need)
                    blocks[r] += need
                    break
                v = self.victim.victim(running)
                pos = running.index(v)
                if pos < k:  # already scheduled in this step (priority preemption): undo it
                    for m, (j, nj) in enumerate(scheduled):
                        if j is v:
                            budget += nj
                            del scheduled[m]
                            break
                    k -= 1
                del running[pos]
                self._release(v)
                self._preempt(v)
                preempted += 1
                if v is r:
                    ok = False
                    break
            if not ok:
                break  # r preempted itself: no more running requests this step (vLLM breaks)
            scheduled.append((r, new))
            budget -= new
            k += 1
        if preempted == 0:
            while budget > 0 and len(running) < self._max_seqs:
                got = self._admit_head(budget)
                if got is None:
                    break
                r, new = got
                running.append(r)
                scheduled.append((r, new))
                budget -= new
        return scheduled, preempted

    def _exact(self, t: float) -> float:
        scheduled, preempted = self._exact_schedule()
        while not scheduled and preempted:
            # everything scheduled was preempted: the freed blocks let the next pass admit work
            scheduled, more = self._exact_schedule()
            preempted += more
        if not scheduled:
            self._rebuild()
            return t
        order = self.order  # the running order as scheduled (what _rebuild keeps)
        for r in self.running:
            if r not in order:
                self.seq += 1
                order[r] = self.seq
        prefill = decode = context = 0
        for r, new in scheduled:
            if r.first_scheduled_time != r.first_scheduled_time:
                r.first_scheduled_time = t
            c = r.num_computed_tokens
            if new == 1 and r.num_output_tokens > 0 and c == r.num_prompt_tokens + r.num_output_tokens - 1:
                decode += 1
                context += c + 1
            else:
                prefill += new
        dur = self._duration(prefill, decode, context, t)
        t_end = t + dur
        used = (self.total_blocks - self.free) * self.bs
        self._sample_until(t_end, len(self.waiting), len(self.running), used)
        self._row(self.steps_taken, t, dur, prefill, decode, len(self.running), len(self.waiting), used, preempted, 1)
        self.steps_taken += 1
        if self._hold is not None and t_end > self._hold:
            self._pending = (t_end, self._exact_end, (scheduled, t_end))
            return t_end
        self._exact_end(scheduled, t_end)
        return t_end

    def _exact_end(self, scheduled: list, t_end: float) -> None:
        """The end of an exact step: the scheduled tokens are computed; back to the aggregated form."""
        for r, new in scheduled:
            if self._advance(r, new, t_end) == 2:
                self.running.remove(r)
                self._finish(r, t_end)
        self._rebuild()

    # =============================================================================================
    # a stretch of decode-only steps in one jump
    def _can_stretch(self) -> bool:
        n = len(self.dbase)
        if self.prefilling or n == 0 or n > self._budget:
            return False
        r = self.waiting.peek()
        if r is None:
            return True
        budget = self._budget - n
        if len(self.order) >= self._max_seqs or budget <= 0:
            return True
        if self.pc is not None:
            return False  # with prefix caching the admission check needs the cache: take a step
        c = r.num_computed_tokens
        new = self._ask(r, c)
        if not self._chunked and new > budget:
            return True
        if new > budget:
            new = budget
        # else the head can be admitted now: take a normal step
        return self._admit_blocks(r, c, new, self.blocks.get(r, 0))[1] > self.free

    def _admit_blocks(self, r: Request, comp: int, new: int, held: int) -> tuple[int, int]:
        """``(need, gate)`` for admitting waiting ``r`` (``comp`` tokens computed or cached, ``new``
        scheduled, ``held`` blocks already its own): the blocks its chunk allocates, and the free
        blocks admission requires: the chunk's, or with ``scheduler_reserve_full_isl`` (vLLM's
        gate) those of its whole sequence so far (prompt + tokens generated before a preemption)."""
        bs = self.bs
        need = -(-(comp + new) // bs) - held  # cdiv, inline
        if self._full_isl:
            full = r.num_prompt_tokens + r.num_output_tokens
            if self._max_len and full > self._max_len:
                full = self._max_len
            g = -(-full // bs) - held
            if g > need:
                return need, g
        return need, need

    def _block_limit(self, k_max: int) -> int:
        """Largest k <= k_max such that the next k decode steps' new blocks fit in ``free``."""
        n = len(self.dbase)
        bs = self.bs
        hist = self.hist
        D = self.D
        free = self.free
        k = 0
        if free >= 2 * n:
            periods = free // n - 1
            k = periods * bs
            free -= periods * n
            if k >= k_max:
                return k_max
        i = (-(D + k)) % bs  # hist's index for step k, walking down (no modulo per step)
        while k < k_max:
            need = hist[i]
            if need > free:
                return k
            free -= need
            k += 1
            i = i - 1 if i else bs - 1
        return k_max

    def _blocks_in(self, k: int) -> int:
        """New blocks the decoders allocate over the next ``k`` steps."""
        n = len(self.dbase)
        bs = self.bs
        periods = k // bs
        rem = k - periods * bs
        total = periods * n
        hist = self.hist
        i = (-(self.D + periods * bs)) % bs  # hist's index for step m, walking down
        for _ in range(rem):
            total += hist[i]
            i = i - 1 if i else bs - 1
        return total

    def _arrivals_pass(self) -> bool:
        """Can requests arriving during a decode stretch leave its schedule unchanged? Yes when
        nothing could be admitted before the stretch ends whatever arrives (the token budget or
        ``max_num_seqs`` binds, or, in an FCFS queue that is not empty, the head is blocked and
        arrivals queue behind it: it stays blocked, as the stretch only takes blocks) and no
        arrival brings a deadline. They are then taken inside the stretch, at the step boundary
        where the scheduler would see them, and the stretch goes on."""
        if self._deadlines_on:
            return False
        if len(self.order) >= self._max_seqs or self._budget <= len(self.dbase):
            return True
        return self.waiting._fifo is not None and len(self.waiting) > 0

    def stretch(self, t: float) -> float:
        """Advance as many decode-only steps as possible before the next event; returns the new time."""
        n = len(self.dbase)
        top = self._valid_fin_top()
        assert top is not None  # decoders are running
        k_max = self._block_limit(top - self.D)  # the completing step is the last one of the stretch
        if k_max <= 0:
            return self.step(t)
        # deadlines and the horizon end a stretch at the first step boundary after them; so do
        # arrivals (they may be admitted, join a queue whose length is recorded, or bring a
        # deadline) unless they pass through it (:meth:`_arrivals_pass`)
        through = self._arrivals_pass()
        t_arr = self._next_arrival()
        t_stop = min(self.horizon, self._next_deadline())
        if not through and t_arr < t_stop:
            t_stop = t_arr
        speed = 1.0
        if self.drift is not None:  # a drifting engine: the stretch ends after its speed window
            t_stop = min(t_stop, self.drift.next_boundary(t))
            speed = self.drift.at(t)
        # the stretch's step durations (:meth:`_cum`, :meth:`_reach`)
        self._s_t = t
        if self._b0 and self.noise is None:
            self._s_mode = 0
            self._s_a = self._b0 * speed
        elif self._lin is not None and self.noise is None:
            # linear: step j of the stretch lasts A + G j (the context grows by n a step), so the
            # first k steps last A k + G k (k - 1) / 2: the stopping step is a quadratic's root
            a, per_seq, per_ctx = self._lin
            A = speed * (a + per_seq * n + per_ctx * (self.sum_dbase + n * self.D + n))
            if A <= 0:
                return self.step(t)
            self._s_mode = 1
            self._s_a = A
            self._s_g = speed * per_ctx * n
        else:
            durs = self._stretch_durations(t, n, k_max, speed)
            if (durs <= 0).any():
                k_pos = int(np.argmax(durs <= 0))
                if k_pos == 0:
                    return self.step(t)
                k_max = k_pos  # the non-positive step is taken alone (and refused there)
            self._s_mode = 2
            self._s_ends = t + np.cumsum(durs)
        k = min(k_max, self._reach(t_stop)) if t_stop < math.inf else k_max
        dur = self._cum(k)
        hold = self._hold
        if hold is not None and t + dur > hold:
            # advancing to `hold`: only the steps that end by it (the one across it is taken alone)
            while k > 0 and t + self._cum(k) > hold:
                k -= 1
            if k == 0:
                return self.step(t)
            dur = self._cum(k)
        nw0 = len(self.waiting)
        marks: list | None = None
        if through and k > 1 and t_arr <= t + self._cum(k - 1):
            marks = self._arrivals_inside(t + self._cum(k - 1))
        t_end = t + dur
        if self.next_sample < t_end:
            self._sample_stretch(t, k, n, nw0, marks)
        used0 = self.total_blocks - self.free
        self._alloc(self._blocks_in(k))
        if marks:
            self._stretch_rows(t, k, n, nw0, marks, used0)
        else:
            self._row(self.steps_taken, t, dur, 0, n, n, nw0, (self.total_blocks - self.free) * self.bs, 0, k)
        self.steps_taken += k
        self.D += k
        self.stretches += 1
        self._complete_decoders(t_end)
        return t_end

    def _cum(self, j: int) -> float:
        """The current stretch's first ``j`` steps: their duration."""
        m = self._s_mode
        if m == 0:
            return j * self._s_a
        if m == 1:
            return self._s_a * j + self._s_g * j * (j - 1) / 2
        return float(self._s_ends[j - 1] - self._s_t) if j else 0.0

    def _reach(self, x: float) -> int:
        """The fewest steps (>= 1) of the current stretch that end at or after ``x``."""
        m = self._s_mode
        t = self._s_t
        if m == 0:
            b = self._s_a
            j = max(1, math.ceil((x - t) / b - 1e-9))
            while j > 1 and t + (j - 1) * b >= x:
                j -= 1
            while t + j * b < x:
                j += 1
            return j
        if m == 1:
            A = self._s_a
            G = self._s_g
            R = x - t
            if G > 0:
                h = A - G / 2
                j = math.ceil((-h + math.sqrt(h * h + 2 * G * R)) / G - 1e-9)
            else:
                j = math.ceil(R / A - 1e-9)
            j = max(1, j)
            while j > 1 and A * (j - 1) + G * (j - 1) * (j - 2) / 2 >= R:
                j -= 1
            while A * j + G * j * (j - 1) / 2 < R:
                j += 1
            return j
        return int(np.searchsorted(self._s_ends, x, side="left")) + 1

    def _arrivals_inside(self, last_start: float) -> list:
        """Take the requests that arrive by ``last_start`` (the start of a stretch's last step)
        in arrival order; returns, for each that joined the queue, the index of the step at
        whose start the scheduler sees it (ascending)."""
        marks: list = []
        while True:
            x = self._next_arrival()  # its time (the stream's, or the submitted one's)
            r = self._next_arrived(last_start)
            if r is None:
                self.stretch_arrivals += len(marks)
                return marks
            before = len(self.waiting)
            self._arrive(r)
            if len(self.waiting) > before:
                marks.append(self._reach(x))

    def _stretch_rows(self, t: float, k: int, n: int, nw0: int, marks: list, used0: int) -> None:
        """Step rows of a stretch that arrivals passed through: one row per run of steps with
        the same queue length."""
        bs = self.bs
        s = 0
        w = nw0
        i = 0
        m = len(marks)
        while s < k:
            while i < m and marks[i] <= s:
                i += 1
                w += 1
            e = marks[i] if i < m else k
            c0 = self._cum(s)
            self._row(self.steps_taken + s, t + c0, self._cum(e) - c0, 0, n, n, w, (used0 + self._blocks_in(e)) * bs,
                      0, e - s)
            s = e

    def _row(self, step: int, start: float, dur: float, prefill: int, decode: int, running: int, waiting: int,
             kv_tokens: int, preempted: int, steps: int) -> None:
        """One step row (``STEP_FIELDS``), packed as float64 onto the buffer: every value passed as a
        float (struct converts a float without making an object; an int it converts via a float)."""
        self._step_buf += _pack_row(float(step), start, dur, float(prefill), float(decode), float(running),
                                    float(waiting), float(kv_tokens), float(preempted), float(steps))

    def _stretch_durations(self, t: float, n: int, k: int, speed: float) -> np.ndarray:
        durs = self.model.decode_stretch(n, self.sum_dbase + n * self.D + n, k)
        if self.noise is not None:
            durs = durs * self.noise.slice(self.steps_taken, k)
        if speed != 1.0:
            durs = durs * speed
        return durs

    def _sample_stretch(self, t: float, k: int, n: int, nw0: int, marks: list | None) -> None:
        """Time-series rows for sample times inside a stretch: KV grows as blocks are allocated;
        the queue grows by the arrivals seen at the step indices ``marks``."""
        speed = self.drift.at(t) if self.drift is not None else 1.0
        used0 = self.total_blocks - self.free
        if self._b0 and self.noise is None:
            # equal steps: step i ends at t + b (i + 1), the same float as numpy's t + b * arange(1, k + 1)
            b = self._b0 * speed
            for ts in self._take_samples(t + b * k):
                j = min(max(int((ts - t) / b), 0), k)  # then exactly: the steps ended by ts
                while j < k and t + b * (j + 1) <= ts:
                    j += 1
                while j > 0 and t + b * j > ts:
                    j -= 1
                nw = nw0 + bisect.bisect_right(marks, j) if marks else nw0
                self._ts_buf.append((ts, nw, n, (used0 + self._blocks_in(j + 1)) * self.bs))
            return
        ends = t + np.cumsum(self._stretch_durations(t, n, k, speed))
        for ts in self._take_samples(float(ends[-1])):
            j = int(np.searchsorted(ends, ts, side="right"))  # step j contains the sample
            nw = nw0 + bisect.bisect_right(marks, j) if marks else nw0
            self._ts_buf.append((ts, nw, n, (used0 + self._blocks_in(j + 1)) * self.bs))

    # =============================================================================================
    # step times and records
    def _duration(self, prefill: int, decode: int, context: int, t: float) -> float:
        """The step's duration: the model's time for this composition, times the step's noise
        factor and the speed factor of the drift window holding its start ``t``."""
        d = self._b0 if self._b0 else self.model.base(prefill, decode, context)
        if self.noise is not None:
            d *= self.noise.at(self.steps_taken)
        if self.drift is not None:
            d *= self.drift.at(t)
        if not d > 0:
            raise InputError("step_time", f"the step-time model gave a non-positive step ({d!r})")
        return d

    def _take_samples(self, t_end: float) -> list:
        """The sample times before ``t_end`` (and not after the horizon); the next sample moves
        past them. O(1) in their number apart from the list itself."""
        k0 = self._sample_k
        k1 = sample_index_before(k0, self.sample_dt, t_end, self.horizon)
        if k1 == k0:
            return []
        self._sample_k = k1
        dt = self.sample_dt
        self.next_sample = k1 * dt
        return [i * dt for i in range(k0, k1)]

    def _sample_until(self, t_end: float, waiting: int, running: int, kv_tokens: int) -> None:
        """Time-series rows for sample times before ``t_end`` with the given (constant) state: a
        few as rows, many (an idle gap, a long step) as one block of columns."""
        k0 = self._sample_k
        k1 = sample_index_before(k0, self.sample_dt, t_end, self.horizon)
        if k1 - k0 <= 16:
            ts = self._ts_buf
            for k in range(k0, k1):
                ts.append((k * self.sample_dt, waiting, running, kv_tokens))
        else:
            m = k1 - k0
            self.add_sample_chunk(np.arange(k0, k1) * self.sample_dt, np.full(m, waiting, dtype=np.int64),
                                  np.full(m, running, dtype=np.int64), np.full(m, kv_tokens, dtype=np.int64))
        self._sample_k = k1
        self.next_sample = k1 * self.sample_dt if self.sample_dt > 0 else math.inf

    def add_step_chunk(self, cols: dict) -> None:
        """Append many step rows at once (columns of equal length), after those buffered."""
        self._flush_steps()
        self._step_chunks.append(cols)

    def add_sample_chunk(self, t, waiting, running, kv) -> None:
        self._flush_samples()
        self._ts_chunks.append({"t_s": np.asarray(t, dtype=np.float64), "num_waiting": waiting,
                                "num_running": running, "kv_tokens": kv})

    def _flush_large(self) -> None:
        """Flush the step and sample buffers once large: _run flushes every 1,024 of its
        iterations, and a driver advancing one step a call never reaches that."""
        if len(self._step_buf) > _STEP_BUF:
            self._flush_steps()
        if len(self._ts_buf) > 8192:
            self._flush_samples()

    def _flush_steps(self) -> None:
        if self._step_buf:
            rows = np.frombuffer(self._step_buf, dtype=np.float64).reshape(-1, len(STEP_FIELDS))
            self._step_chunks.append(_columns(rows, STEP_FIELDS, ("start_s", "duration_s")))
            self._step_buf = bytearray()

    def _flush_samples(self) -> None:
        if self._ts_buf:
            self._ts_chunks.append(_columns(self._ts_buf, TS_FIELDS, ("t_s",)))
            self._ts_buf = []

    def step_chunks(self) -> list:
        """The step records so far, as column chunks (the buffer flushed)."""
        self._flush_steps()
        return self._step_chunks

    def timeseries_chunks(self) -> list:
        self._flush_samples()
        return self._ts_chunks

    def step_columns(self) -> dict:
        return stack_columns([(0, self.step_chunks())], STEP_FIELDS, ("start_s", "duration_s"))

    def timeseries_columns(self) -> dict:
        return stack_columns([(0, self.timeseries_chunks())], TS_FIELDS, ("t_s",))


def stack_columns(groups: list, names: tuple, float_names: tuple) -> dict:
    """Step or time-series columns of ``groups`` ((replica id, column chunks) each), one replica
    after another, with the ``replica`` column: each chunk copied once into its place."""
    sizes = [len(c[names[0]]) for _, chunks in groups for c in chunks]
    n = sum(sizes)
    out = {name: np.empty(n, dtype=np.float64 if name in float_names else np.int64) for name in names}
    rep = out["replica"] = np.empty(n, dtype=np.int64)
    a = 0
    for gid, chunks in groups:
        start = a
        for c in chunks:
            b = a + len(c[names[0]])
            for name in names:
                out[name][a:b] = c[name]
            a = b
        rep[start:a] = gid
    return out


def _columns(rows, names: tuple, float_names: tuple) -> dict:
    """Record rows (tuples, or a 2-d float array of them) as named numpy columns, with the
    replica column."""
    if len(rows):
        a = np.asarray(rows, dtype=np.float64)
        out: Any = {name: (a[:, j] if name in float_names else a[:, j].astype(np.int64))
                    for j, name in enumerate(names)}
    else:
        out = {name: np.empty(0, dtype=np.float64 if name in float_names else np.int64) for name in names}
    out["replica"] = np.zeros(len(rows), dtype=np.int64)
    return out
