"""``llmqueue emulate``: the simulator's replica on the wall clock, behind vLLM's API and metrics.

An :class:`EmulatedEngine` serves one replica (:class:`~llmqueue.engine.reference.ReferenceReplica`,
the executable specification: every request an object, so each token is known at the end of the
step that made it) on one port:

- a request is handed to the replica when it arrives (``accept``, after the steps that ended by
  then are applied), with ``arrival_time`` the engine's clock (seconds since the engine started);
- a timer wakes the replica at ``next_event_time()`` and calls ``step_at(now)``. The replica keeps
  its own timeline: a step ends at its scheduled time and the next one starts there, however late
  the event loop runs, so the schedule is exactly the simulator's for the same arrivals; the only
  error is the **emission lateness** of each token (the wall time it is written minus the scheduled
  end of its step), measured and served at ``GET /emulator/stats`` (p50/p99);
- each token is written (one server-sent event) as its step ends; a whole answer when the request
  finishes; a client that disconnects aborts its request, which frees its KV at the next step
  boundary (vLLM's behaviour);
- ``/metrics`` holds vLLM's series (:mod:`llmqueue.serve.vllm_metrics`); the log, vLLM's lines
  (:mod:`llmqueue.serve.iteration_log`); faults per :mod:`llmqueue.serve.faults`.

Requests the replica rejects at its door (a prompt and output above the KV cache, a full waiting
room with ``--max-waiting``) are answered 400 and 503 with vLLM's error body.
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array

from llmqueue.serve.http import HttpServer
from llmqueue.serve.openai import Answer, ApiError, models_body, overloaded, parse_request

STATS_PATH = "/emulator/stats"
SPIN_S = 0.002
"""A timer that fires this close before its due time waits out the rest on the clock (uvloop's timers
have a millisecond's resolution and fire up to a tick early), not on another timer (a tick late)."""
_NOT_FOUND = b'{"detail":"Not Found"}'
_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
_ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET", "/health": "GET",
           "/metrics": "GET", "/version": "GET", "/ping": "GET", STATS_PATH: "GET"}


class _Live:
    """A request in flight: its exchange, its answer's bytes and its tokens' times."""

    __slots__ = ("ex", "answer", "times", "gone")

    def __init__(self, ex, answer):
        self.ex = ex
        self.answer = answer
        self.times = array("d")
        self.gone = False


class EmulatedEngine:
    """One replica served on one port (see the module docstring).

    ``config`` / ``step_time``: the replica's :class:`~llmqueue.engine.config.EngineConfig` and
    step-time model; ``names``: the served model names (the first is the default);
    ``max_model_len``: the served context limit; ``seed``: the step-time noise's; ``faults``:
    :class:`~llmqueue.serve.faults.Faults` or None; ``log``: a
    :class:`~llmqueue.serve.iteration_log.StepLog` or None; ``t0``: ``time.perf_counter()`` at
    the engine's time 0 (shared by the replicas of one process)."""

    def __init__(self, config, step_time, *, names: tuple, max_model_len: int, seed: int = 0, faults=None,
                 log=None, t0: float | None = None, gpu_memory_utilization: float = 0.9):
        from llmqueue.engine.step_time import parse_step_time
        from llmqueue.serve.faults import Slowed

        self.config = config
        model = parse_step_time(step_time)
        self.step_time = Slowed(model, faults) if faults is not None and faults.slow else model
        self.names = tuple(names)
        self.max_model_len = int(max_model_len)
        self.seed = seed
        self.faults = faults
        self.log = log
        self.t0 = time.perf_counter() if t0 is None else t0
        self.gpu_memory_utilization = gpu_memory_utilization
        self.created = int(time.time())
        self.server = HttpServer(self.handle)
        self.lateness = array("d")     # seconds, one per token written
        self.requests = 0              # completion requests that reached the engine
        self.dead = False
        self.restarts = 0
        self._timer = None
        self._timer_at = math.inf
        self._open_row = None
        self._fresh()

    def _fresh(self) -> None:
        """A new replica, empty, with fresh counters (the start, or a restart)."""
        from llmqueue.engine.reference import ReferenceReplica
        from llmqueue.serve.vllm_metrics import EngineMetrics

        self.replica = ReferenceReplica(self.config, self.step_time, seed=self.seed, on_token=self._token,
                                        on_finish=self._finished, on_step=self._step)
        self.live: dict = {}
        self.metrics = EngineMetrics(self.names[0], self.config, self.max_model_len,
                                     gpu_memory_utilization=self.gpu_memory_utilization)

    def now(self) -> float:
        """The engine's clock: seconds since its time 0."""
        return time.perf_counter() - self.t0

    # -- the server ---------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> "EmulatedEngine":
        await self.server.start(host, port)
        if self.faults is not None and self.faults.restart_after is not None:
            asyncio.get_running_loop().call_later(max(self.faults.restart_after - self.now(), 0), self._restart)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self.server.close()

    def handle(self, ex) -> None:
        """Route one request (see :data:`_ROUTES`)."""
        method = _ROUTES.get(ex.path)
        if method is None:
            return ex.respond(404, _NOT_FOUND)
        if ex.method != method:
            return ex.respond(405, _NOT_ALLOWED)
        p = ex.path
        if p == "/v1/completions":
            return self._completion(ex, False)
        if p == "/v1/chat/completions":
            return self._completion(ex, True)
        if p == "/metrics":
            return ex.respond(200, self.metrics.exposition(self.replica.load()),
                              "text/plain; version=0.0.4; charset=utf-8")
        if p == "/v1/models":
            return ex.respond_json(200, models_body(self.names, self.max_model_len, self.created))
        if p == "/version":
            from llmqueue import __version__

            return ex.respond_json(200, {"version": f"llmqueue-emulate {__version__}"})
        if p == STATS_PATH:
            return ex.respond_json(200, self.stats())
        return ex.respond(200, b"", "application/json")  # /health, /ping

    def stats(self) -> dict:
        """The emulator's own counters and its token emission lateness (ms)."""
        import numpy as np

        lat = np.frombuffer(self.lateness, dtype=np.float64) * 1e3
        q = (lambda p: float(np.percentile(lat, p))) if len(lat) else (lambda p: None)
        return {"requests": self.requests, "tokens": len(lat), "steps": self.replica.steps_taken,
                "restarts": self.restarts, "dead": self.dead, "lateness_ms": {
                    "p50": q(50), "p99": q(99), "p999": q(99.9), "max": float(lat.max()) if len(lat) else None}}

    # -- completions --------------------------------------------------------------------------------
    def _completion(self, ex, chat: bool) -> None:
        from llmqueue.engine.request import Request

        self.requests += 1
        f = self.faults
        if f is not None and f.fail_after is not None and self.requests > f.fail_after:
            return self._crash(restart_after=None)
        try:
            req = parse_request(ex.body, chat=chat, served=self.names, max_model_len=self.max_model_len)
        except ApiError as e:
            return ex.respond(e.status, e.body())
        if f is not None and f.reject():
            e = overloaded(f.reject_status)
            return ex.respond(e.status, e.body())
        now = ex.t_arrival - self.t0  # when the request was whole (the parse is the server's)
        k = self.requests
        r = Request(request_id=k, arrival_time=now, num_prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                    seq=k)
        live = _Live(ex, Answer(req, f"{k:x}", self.created))
        self.live[r] = live
        self.metrics.arrived(req.max_tokens_asked, req.max_tokens)
        rep = self.replica
        ex.on_close = lambda: self._gone(rep, r)
        rep.step_at(now)  # the steps that ended by now, before this request can be seen
        if rep.accept(r):
            rep.step_at(now)
        if req.stream and r in self.live:
            ex.start_stream()
        self._arm()

    def _gone(self, rep, r) -> None:
        """The client went away: abort its request (its KV is freed at the next step boundary)."""
        live = self.live.get(r)
        if rep is not self.replica or live is None:
            return
        live.gone = True
        rep.abort(r, at=self.now())
        self._arm()

    # -- the replica's callbacks ------------------------------------------------------------------
    def _token(self, r, t_end: float) -> None:
        live = self.live.get(r)
        if live is None:
            return
        times = live.times
        times.append(t_end)
        if live.gone:
            return
        a = live.answer
        if a.req.stream:
            i = len(times) - 1
            ev = a.token_event(i)
            if i == 0 and a.req.chat:
                ev = a.role_event() + ev
            live.ex.write(ev.encode())
        self.lateness.append(self.now() - t_end)

    def _finished(self, r) -> None:
        live = self.live.pop(r, None)
        if live is None:
            return
        outcome = r.outcome
        m = self.metrics
        if outcome == "ok":
            m.finished_request(r, live.times, "length")
            a = live.answer
            if a.req.stream:
                live.ex.end(a.tail(len(live.times)).encode())
            else:
                live.ex.respond(200, a.whole(len(live.times)))
                self.lateness.append(self.now() - r.finish_time)
        elif outcome == "cancelled":
            m.finished_request(r, live.times, "abort")
        elif outcome == "rejected":
            why = r.reason or "rejected"
            if "waiting queue" in why:
                m.rejected_queue.inc()
                e = ApiError(503, f"The server's waiting queue is full ({why}); retry later",
                             "ServiceUnavailableError")
            else:
                e = ApiError(400, f"This request cannot be served: {why}.", "BadRequestError")
            live.ex.respond(e.status, e.body())
        else:  # a deadline of the engine's own (none by default)
            m.finished_request(r, live.times, "abort")
            live.ex.respond(408, ApiError(408, f"request {outcome}", "TimeoutError").body())

    def _step(self, row: tuple) -> None:
        self.metrics.step(row[3], row[4], row[8])
        if self.log is not None and self.log.iteration_details:
            self._log_open_row()
            self._open_row = row

    def _log_open_row(self) -> None:
        row, self._open_row = self._open_row, None
        if row is not None:
            self.log.step(row, self.replica.load().kv_usage)

    # -- the wall clock -------------------------------------------------------------------------------
    def _arm(self) -> None:
        """Wake at the replica's next event (no timer when it has none)."""
        t = self.replica.next_event_time()
        if t == self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = t
        if t < math.inf:
            self._timer = asyncio.get_running_loop().call_later(max(t - self.now(), 0.0), self._wake)

    def _wake(self) -> None:
        due, self._timer, self._timer_at = self._timer_at, None, math.inf
        now = self.now()
        if 0 < due - now < SPIN_S:  # the loop's timers tick in milliseconds and may fire early: wait out the rest
            while now < due:
                now = self.now()
        self.replica.step_at(now)
        row = self._open_row
        if row is not None and row[1] + row[2] <= now:
            self._log_open_row()
        self._arm()

    # -- faults -----------------------------------------------------------------------------------------
    def _crash(self, restart_after: float | None) -> None:
        """Drop everything in flight: connections reset, new ones refused; back empty after
        ``restart_after`` seconds (None: never)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self.replica.close()
        self.live = {}
        self.server.stop_listening()
        self.server.reset_all()
        if restart_after is None:
            self.dead = True
            return
        asyncio.get_running_loop().call_later(restart_after, lambda: asyncio.ensure_future(self._come_back()))

    def _restart(self) -> None:
        self._crash(self.faults.restart_delay)

    async def _come_back(self) -> None:
        self._fresh()
        self.restarts += 1
        await self.server.start(self.server.host, self.server.port)
