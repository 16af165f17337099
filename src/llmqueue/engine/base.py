"""What every replica simulator shares: arrivals, client deadlines and retries, the waiting
queue order, admission control, records. The steppers differ only in how they take steps.

Event semantics (one replica, vLLM v1):

- A request arriving at ``t`` joins the waiting queue at ``t`` and is first considered by the
  scheduler at the start of the first step that starts at or after ``t``.
- At arrival it is rejected (``status = rejected``, ``finish_s = arrival_s``) when it can never
  run: prompt + output exceeds ``max_model_len`` or the whole KV cache, or when the waiting
  queue already holds ``max_waiting`` requests (admission control).
- Client deadlines (``timeout``: arrival + the class's timeout, or arrival + its TTFT timeout
  while no first token has come) and queue-time shedding
  (``max_queue_time_s`` for requests that never started) are applied at step boundaries; the
  request's ``finish_s`` is the deadline itself, the moment the client gave up.
- A request whose attempt ended with a retryable status is offered to the retry function,
  ``retry(request_id, attempt, status, t_end) -> t_next | None``; a new attempt (same
  ``request_id``, ``attempt + 1``) then arrives at ``t_next``.
- When the run stops at its horizon, requests still in the system get ``status = unfinished``
  with ``finish_s = NaN``; retries that would arrive later are not recorded.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from llmqueue.engine.config import EngineConfig
from llmqueue.engine.step_time import StepTimeModel, parse_step_time
from llmqueue.errors import InputError

NAN = float("nan")
STEP_FIELDS = ("step", "start_s", "duration_s", "prefill_tokens", "decode_seqs", "num_running", "num_waiting",
               "kv_tokens", "preempted", "steps")
TS_FIELDS = ("t_s", "num_waiting", "num_running", "kv_tokens")


@dataclass
class SimOptions:
    """Run options shared by all steppers.

    ``horizon_s``: stop at this simulated time (None: run until every request is done).
    ``timeout_s``: per class name, the client's timeout (seconds from arrival; absent = none).
    ``ttft_timeout_s``: per class name, the client gives up if no first token came by then.
    ``retry``: the client retry function (see module docstring) or None.
    ``predicted_output``: per-request predicted output lengths (the ``srpt`` policy's key);
    defaults to the true output lengths (an oracle).
    ``sample_dt``: time-series sampling interval (seconds); 0 disables the time series.
    ``seed``: seeds the step-time noise and drift streams.
    ``hash_ids``: per request, its prompt's prefix-unit ids (or None), for prefix caching;
    ``hash_block_tokens``: tokens per unit (Mooncake traces: 512).
    """

    horizon_s: float | None = None
    timeout_s: dict = field(default_factory=dict)
    ttft_timeout_s: dict = field(default_factory=dict)
    retry: Callable | None = None
    predicted_output: np.ndarray | None = None
    sample_dt: float = 1.0
    seed: int = 0
    progress: Callable | None = None
    hash_ids: list | None = None
    hash_block_tokens: int = 512


class BaseReplica:
    """Holds the request table, the waiting queue, deadlines, retries and the records."""

    def __init__(self, config: EngineConfig, step_time, requests, options: SimOptions | None = None):
        self.cfg = config
        self.model: StepTimeModel = parse_step_time(step_time)
        self.opt = options or SimOptions()
        self.noise = self.model.noise_stream(self.opt.seed)
        self.drift = self.model.drift_stream(self.opt.seed)
        self.bs = config.block_size
        self.total_blocks = config.num_kv_blocks
        self.free = config.num_kv_blocks
        # --- the request table (one row per attempt); retries append rows -------------------
        n = len(requests)
        self.rid = list(map(int, requests.request_id))
        self.arr = list(map(float, requests.arrival_s))
        self.prompt = list(map(int, requests.prompt_tokens))
        self.target = list(map(int, requests.output_tokens))
        cls = requests.class_name
        self.cls = [str(c) for c in cls] if not isinstance(cls, str) else [cls] * n
        self.attempt = [1] * n
        pred = self.opt.predicted_output
        self.pred = list(map(float, pred)) if pred is not None else [float(x) for x in self.target]
        prio = config.class_priority
        self.prio = [int(prio.get(c, 0)) for c in self.cls]
        # dynamic state
        self.comp = [0] * n        # tokens whose KV is computed
        self.outp = [0] * n        # output tokens produced
        self.blocks = [0] * n      # KV blocks held
        self.first_sched = [NAN] * n
        self.first_tok = [NAN] * n
        self.finish = [NAN] * n
        self.status = [""] * n     # "" while in the system
        self.npre = [0] * n
        self.state = [0] * n       # 0 not arrived, 1 waiting, 2 running, 3 done
        self.cached_tok = [0] * n  # prompt tokens found in the prefix cache at first scheduling
        # --- prefix caching -------------------------------------------------------------------
        self.pc = None
        self.hashes = [None] * n
        self.shared = [0] * n      # leading prefix units the request references in the cache
        self.regstop = [False] * n
        if config.enable_prefix_caching:
            from llmqueue.engine.prefix_cache import PrefixCache

            H = self.opt.hash_block_tokens
            if H < 1 or H % config.block_size:
                raise InputError("hash_block_tokens", f"{H} is not a multiple of the block size {config.block_size}")
            self.H = H
            self.ub = H // config.block_size
            self.pc = PrefixCache(config.num_kv_blocks, self.ub)
            if self.opt.hash_ids is not None:
                if len(self.opt.hash_ids) != n:
                    raise InputError("hash_ids", f"{len(self.opt.hash_ids)} hash lists for {n} requests")
                self.hashes = [tuple(int(x) for x in h) if h is not None and len(h) else None
                               for h in self.opt.hash_ids]
        # --- arrivals: the pre-generated stream plus a heap of retries ----------------------
        self._next_pre = 0
        self._n_pre = n
        self._retry_heap: list = []
        # --- waiting queue -------------------------------------------------------------------
        self.policy = config.policy
        self.waiting_fifo: deque = deque()
        self.waiting_heap: list = []
        self.n_waiting = 0
        self.n_waiting_cls: dict[str, int] = {}
        # --- deadlines: (time, kind, idx); kind 0 = client timeout, 1 = queue-time shedding ---
        self.deadlines: list = []
        self.dl_total: dict[int, float] = {}  # client deadlines by request, when set
        self.dl_ttft: dict[int, float] = {}
        self.steps_taken = 0
        # step records (columns) and time series
        self._step_buf: list = []
        self._step_chunks: list = []
        self._ts_buf: list = []
        self._ts_chunks: list = []
        self.next_sample = 0.0 if self.opt.sample_dt > 0 else math.inf
        self.horizon = self.opt.horizon_s if self.opt.horizon_s is not None else math.inf
        self.max_total = min(config.max_model_len or 10**18, config.num_kv_blocks * config.block_size)
        self.reject_reason: dict[int, str] = {}

    # ----------------------------------------------------------------------------------------
    # arrivals
    def next_arrival_time(self) -> float:
        t = self.arr[self._next_pre] if self._next_pre < self._n_pre else math.inf
        if self._retry_heap and self._retry_heap[0][0] < t:
            t = self._retry_heap[0][0]
        return t

    def take_arrivals(self, t: float) -> None:
        """Move every request that has arrived by ``t`` into the waiting queue (or reject it)."""
        while True:
            if self._next_pre < self._n_pre and self.arr[self._next_pre] <= t and \
                    (not self._retry_heap or self.arr[self._next_pre] <= self._retry_heap[0][0]):
                i = self._next_pre
                self._next_pre += 1
            elif self._retry_heap and self._retry_heap[0][0] <= t:
                i = heapq.heappop(self._retry_heap)[1]
            else:
                return
            self.arrive(i)

    def arrive(self, i: int) -> None:
        s, o = self.prompt[i], self.target[i]
        if s < 1 or o < 1:
            return self.end(i, "rejected", self.arr[i], "empty prompt or output")
        if s + o > self.max_total:
            why = (f"prompt+output {s + o} > max_model_len {self.cfg.max_model_len}"
                   if self.cfg.max_model_len and s + o > self.cfg.max_model_len
                   else f"prompt+output {s + o} exceeds the KV cache ({self.total_blocks * self.bs} tokens)")
            return self.end(i, "rejected", self.arr[i], why)
        if self.cfg.max_waiting and self.n_waiting >= self.cfg.max_waiting:
            return self.end(i, "rejected", self.arr[i], "waiting queue full")
        cap = self.cfg.class_max_waiting.get(self.cls[i]) if self.cfg.class_max_waiting else None
        if cap and self.n_waiting_cls.get(self.cls[i], 0) >= cap:
            return self.end(i, "rejected", self.arr[i], f"waiting queue of class {self.cls[i]} full")
        self.state[i] = 1
        self.wait_inc(i)
        self.push_waiting(i, front=False)
        to = self.opt.timeout_s.get(self.cls[i])
        if to:
            self.dl_total[i] = self.arr[i] + to
            heapq.heappush(self.deadlines, (self.arr[i] + to, 0, i))
        tt = self.opt.ttft_timeout_s.get(self.cls[i])
        if tt:
            self.dl_ttft[i] = self.arr[i] + tt
            heapq.heappush(self.deadlines, (self.arr[i] + tt, 2, i))
        qt = (self.cfg.class_max_queue_time_s.get(self.cls[i]) if self.cfg.class_max_queue_time_s else None) \
            or self.cfg.max_queue_time_s
        if qt:
            heapq.heappush(self.deadlines, (self.arr[i] + qt, 1, i))

    # ----------------------------------------------------------------------------------------
    # the waiting queue (lazy deletion: entries whose state is no longer 1 are skipped)
    def _key(self, i: int):
        if self.policy == "priority":
            return (self.prio[i], self.arr[i], i)
        if self.policy == "sjf":
            return (self.prompt[i], self.arr[i], i)
        return (self.pred[i] - self.outp[i], self.arr[i], i)  # srpt

    def push_waiting(self, i: int, front: bool) -> None:
        if self.policy == "fcfs":
            (self.waiting_fifo.appendleft if front else self.waiting_fifo.append)(i)
        else:
            heapq.heappush(self.waiting_heap, self._key(i))

    def waiting_head(self) -> int | None:
        if self.policy == "fcfs":
            q = self.waiting_fifo
            while q and self.state[q[0]] != 1:
                q.popleft()
            return q[0] if q else None
        h = self.waiting_heap
        while h and self.state[h[0][2]] != 1:
            heapq.heappop(h)
        return h[0][2] if h else None

    def pop_waiting_head(self) -> int:
        i = self.waiting_fifo.popleft() if self.policy == "fcfs" else heapq.heappop(self.waiting_heap)[2]
        self.wait_dec(i)
        return i

    def wait_inc(self, i: int) -> None:
        """Request ``i`` joins the waiting queue (counted in total and by class)."""
        self.n_waiting += 1
        c = self.cls[i]
        self.n_waiting_cls[c] = self.n_waiting_cls.get(c, 0) + 1

    def wait_dec(self, i: int) -> None:
        self.n_waiting -= 1
        self.n_waiting_cls[self.cls[i]] -= 1

    # ----------------------------------------------------------------------------------------
    # deadlines
    def next_deadline(self) -> float:
        d = self.deadlines
        while d and self.state[d[0][2]] == 3:
            heapq.heappop(d)
        return d[0][0] if d else math.inf

    def expire(self, t: float) -> None:
        """Apply client timeouts and queue-time shedding that are due by ``t``."""
        d = self.deadlines
        while d and d[0][0] <= t:
            when, kind, i = heapq.heappop(d)
            st = self.state[i]
            if st == 3:
                continue
            if kind == 1:  # shedding applies only to requests that never started
                if st == 1 and self.first_sched[i] != self.first_sched[i]:
                    self.wait_dec(i)
                    self.end(i, "rejected", when, "queue time limit")
                continue
            if kind == 2 and self.first_tok[i] <= when:
                continue  # TTFT deadline, but the first token came in time
            if st == 1:
                self.wait_dec(i)
            elif st == 2:
                self.remove_running(i)
            self.end(i, "timeout", when)

    # ----------------------------------------------------------------------------------------
    # endings and retries
    def end(self, i: int, status: str, t: float, reason: str | None = None) -> None:
        if status == "ok" and (self.dl_total or self.dl_ttft):
            # the client gave up before the response completed (inside the last step)
            late = [d for d in (self.dl_total.get(i, math.inf),) if d < t]
            dt = self.dl_ttft.get(i, math.inf)
            if dt < self.first_tok[i]:
                late.append(dt)
            if late:
                status, t = "timeout", min(late)
        self.state[i] = 3
        self.status[i] = status
        self.finish[i] = t
        if reason:
            self.reject_reason[i] = reason
        if status != "ok" and self.opt.retry is not None:
            t_next = self.opt.retry(self.rid[i], self.attempt[i], status, t)
            if t_next is not None:
                self._add_attempt(i, float(t_next))

    def _add_attempt(self, i: int, t_next: float) -> None:
        j = len(self.rid)
        for name, val in (("rid", self.rid[i]), ("arr", t_next), ("prompt", self.prompt[i]),
                          ("target", self.target[i]), ("cls", self.cls[i]), ("attempt", self.attempt[i] + 1),
                          ("pred", self.pred[i]), ("prio", self.prio[i]), ("comp", 0), ("outp", 0),
                          ("blocks", 0), ("first_sched", NAN), ("first_tok", NAN), ("finish", NAN),
                          ("status", ""), ("npre", 0), ("state", 0), ("cached_tok", 0),
                          ("hashes", self.hashes[i]), ("shared", 0), ("regstop", False)):
            getattr(self, name).append(val)
        heapq.heappush(self._retry_heap, (t_next, j))

    def remove_running(self, i: int) -> None:  # overridden by steppers
        raise NotImplementedError

    # ----------------------------------------------------------------------------------------
    # KV blocks: allocation from the free queue, release, admission, prefix units
    def alloc(self, n: int) -> None:
        """Take ``n`` free blocks (from the head of the free queue, evicting cached prefixes)."""
        self.free -= n
        if self.pc is not None and n:
            self.pc.consume(n)

    def release(self, i: int) -> None:
        """Free request ``i``'s blocks: private ones, and its prefix units nobody else uses."""
        if self.pc is None:
            self.free += self.blocks[i]
        else:
            k = self.shared[i]
            units = self.hashes[i][:k] if k else ()
            self.free += self.pc.free_request(self.blocks[i] - k * self.ub, units)
            self.shared[i] = 0
        self.blocks[i] = 0

    def admit_head(self, budget: int):
        """vLLM's admission of the waiting head with ``budget`` tokens left in the step: returns
        ``(i, new_tokens)`` after allocating its blocks (and its prefix-cache hits), or None when
        it cannot be scheduled in this step. The caller checks ``max_num_seqs``."""
        i = self.waiting_head()
        if i is None:
            return None
        cfg = self.cfg
        comp = self.comp[i]
        k = extra = 0
        if self.pc is not None and comp == 0 and self.hashes[i]:
            k, extra = self.pc.lookup(self.hashes[i], (self.prompt[i] - 1) // self.H)
            comp = k * self.H
        new = self.prompt[i] + self.outp[i] - comp
        thr = cfg.long_prefill_token_threshold
        if thr and new > thr:
            new = thr
        if not cfg.enable_chunked_prefill and new > budget:
            return None
        if new > budget:
            new = budget
        held = self.blocks[i] + k * (self.ub if k else 0)
        need = -(-(comp + new) // self.bs) - held
        gate = need
        if cfg.scheduler_reserve_full_isl:
            # vLLM 0.32's admission gate: the whole sequence so far (prompt + tokens already
            # generated, for a resumed request) must fit in the free blocks, not only this
            # step's chunk; fewer requests are admitted only to be preempted again
            full = self.prompt[i] + self.outp[i]
            if cfg.max_model_len:
                full = min(full, cfg.max_model_len)
            gate = max(gate, -(-full // self.bs) - held)
        if gate + extra > self.free:
            return None
        self.pop_waiting_head()
        if k:
            self.pc.take(self.hashes[i], k)
            self.free -= extra
            self.comp[i] = comp
            self.shared[i] = k
            self.blocks[i] = k * self.ub
        if self.first_sched[i] != self.first_sched[i]:
            self.cached_tok[i] = k * self.H if k else 0
        self.alloc(need)
        self.blocks[i] += need
        self.state[i] = 2
        return i, new

    def advance(self, i: int, new: int, t_end: float) -> int:
        """Apply ``new`` computed tokens of request ``i`` at the end of a step: 0 = no token yet
        (prefill continues), 1 = a token was produced, 2 = the last token was produced."""
        self.comp[i] += new
        if self.pc is not None:
            self.register_units(i)
        if self.comp[i] != self.prompt[i] + self.outp[i]:
            return 0
        self.outp[i] += 1
        if self.outp[i] == 1:
            self.first_tok[i] = t_end
        return 2 if self.outp[i] == self.target[i] else 1

    def register_units(self, i: int) -> None:
        """After a step: cache the prefix units request ``i``'s prefill has completed."""
        h = self.hashes[i]
        if h is None or self.regstop[i]:
            return
        u = self.shared[i]
        done = min(self.comp[i], self.prompt[i]) // self.H
        while u < done and u < len(h):
            if not self.pc.register(h[u]):
                self.regstop[i] = True
                break
            u += 1
        self.shared[i] = u

    def idle_until_next_event(self, running: int) -> float | None:
        """Nothing could be scheduled: sample the idle stretch and return the next arrival or
        deadline time (None when no event is left)."""
        nxt = min(self.next_arrival_time(), self.next_deadline())
        if nxt == math.inf:
            return None
        self.sample_until(min(nxt, self.horizon), self.n_waiting, running, (self.total_blocks - self.free) * self.bs)
        return nxt

    # ----------------------------------------------------------------------------------------
    # records
    def record_step(self, start, dur, prefill, decode, running, waiting, kv, preempted, steps=1) -> None:
        self._step_buf.append((self.steps_taken, start, dur, prefill, decode, running, waiting, kv, preempted, steps))

    def record_steps_bulk(self, start, dur, prefill, decode, running, waiting, kv) -> None:
        """Append many one-step rows at once (numpy arrays of equal length)."""
        self._flush_steps()
        k = len(start)
        self._step_chunks.append({
            "step": self.steps_taken + np.arange(k, dtype=np.int64), "start_s": start, "duration_s": dur,
            "prefill_tokens": prefill, "decode_seqs": decode, "num_running": running, "num_waiting": waiting,
            "kv_tokens": kv, "preempted": np.zeros(k, dtype=np.int64), "steps": np.ones(k, dtype=np.int64)})

    def _flush_steps(self) -> None:
        if self._step_buf:
            arr = list(zip(*self._step_buf))
            self._step_chunks.append({name: np.asarray(col, dtype=np.float64 if name in ("start_s", "duration_s")
                                                       else np.int64) for name, col in zip(STEP_FIELDS, arr)})
            self._step_buf = []

    def sample_until(self, t_end: float, waiting: int, running: int, kv_tokens: int) -> None:
        """Time-series rows for sample times before ``t_end`` with the given (constant) state."""
        ts = self._ts_buf
        while self.next_sample < t_end and self.next_sample <= self.horizon:
            ts.append((self.next_sample, waiting, running, kv_tokens))
            self.next_sample += self.opt.sample_dt

    def record_samples_bulk(self, t, waiting, running, kv) -> None:
        self._flush_samples()
        self._ts_chunks.append({"t_s": np.asarray(t, dtype=np.float64), "num_waiting": waiting,
                                "num_running": running, "kv_tokens": kv})

    def _flush_samples(self) -> None:
        if self._ts_buf:
            arr = list(zip(*self._ts_buf))
            self._ts_chunks.append({name: np.asarray(col, dtype=np.float64 if name == "t_s" else np.int64)
                                    for name, col in zip(TS_FIELDS, arr)})
            self._ts_buf = []

    def finalize(self) -> None:
        """Requests still in the system at the horizon end ``unfinished`` (``finish_s`` NaN);
        attempts that would arrive after it are dropped from the records."""
        for i in range(len(self.rid)):
            if self.state[i] in (1, 2):
                self.status[i] = "unfinished"

    def request_columns(self) -> dict:
        """The request records (``llmqueue.records.schema.REQUEST_COLUMNS``) as numpy arrays."""
        f = np.asarray
        arrived = f(self.state, dtype=np.int64) != 0
        n = int(arrived.sum())
        cols = {
            "request_id": f(self.rid, dtype=np.int64),
            "class": f(self.cls, dtype=object),
            "arrival_s": f(self.arr, dtype=np.float64),
            "dispatched_s": f(self.arr, dtype=np.float64),
            "first_scheduled_s": f(self.first_sched, dtype=np.float64),
            "first_token_s": f(self.first_tok, dtype=np.float64),
            "finish_s": f(self.finish, dtype=np.float64),
            "prompt_tokens": f(self.prompt, dtype=np.int64),
            "output_tokens": f(self.outp, dtype=np.int64),
            "cached_prompt_tokens": f(self.cached_tok, dtype=np.int64),
            "status": f(self.status, dtype=object),
            "preemptions": f(self.npre, dtype=np.int64),
            "replica": np.zeros(n, dtype=np.int64),
            "attempt": f(self.attempt, dtype=np.int64),
        }
        if n == len(self.rid):
            return cols
        return {k: (v[arrived] if len(v) == len(arrived) else v) for k, v in cols.items()}

    def step_columns(self) -> dict:
        self._flush_steps()
        out = {}
        for name in STEP_FIELDS:
            dt = np.float64 if name in ("start_s", "duration_s") else np.int64
            out[name] = (np.concatenate([c[name] for c in self._step_chunks]).astype(dt) if self._step_chunks
                         else np.empty(0, dtype=dt))
        out["replica"] = np.zeros(len(out["step"]), dtype=np.int64)
        return out

    def timeseries_columns(self) -> dict:
        self._flush_samples()
        out = {}
        for name in TS_FIELDS:
            dt = np.float64 if name == "t_s" else np.int64
            out[name] = (np.concatenate([c[name] for c in self._ts_chunks]).astype(dt) if self._ts_chunks
                         else np.empty(0, dtype=dt))
        out["replica"] = np.zeros(len(out["t_s"]), dtype=np.int64)
        return out

    # ----------------------------------------------------------------------------------------
    def step_duration(self, prefill: int, decode: int, context: int, t: float = 0.0) -> float:
        """The step's duration: the model's time for this composition, times the step's noise
        factor and the speed factor of the drift window holding its start ``t``."""
        d = self.model.base(prefill, decode, context)
        if self.noise is not None:
            d *= self.noise.at(self.steps_taken)
        if self.drift is not None:
            d *= self.drift.at(t)
        if not d > 0:
            raise InputError("step_time", f"the step-time model gave a non-positive step ({d!r})")
        return d
