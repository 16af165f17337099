"""The open-loop sender: each request sent at its intended arrival time, on an absolute clock.

Request ``i`` is sent at ``t0 + arrival_s[i]``: ``t0`` is the run start on one monotonic clock
(``time.perf_counter``), ``arrival_s`` the workload's intended arrival time. The sender sleeps
until that instant and never waits for earlier responses, so a slow server cannot slow the
arrivals (no coordinated omission) and sleeping errors do not accumulate (no drift: every send
time is computed from ``t0``, never from the previous send). With a concurrency cap a semaphore
holds the requests in flight to it: the run is then closed-loop (a request waits in the client
for a free slot; its ``dispatched_s`` is when it got one).

Retries follow :mod:`llmqueue.workload.client`: after an attempt ends with a retryable status,
``retry(request_id, attempt, status, finish_s)`` gives the next attempt's intended send time (or
None); the next attempt is sent at that time, with the same prompt, as ``attempt + 1``.

If the server stops accepting connections (``abort_after`` consecutive connection failures and a
refused probe connection), sending stops, attempts in flight get ``abort_grace_s`` to end (then
``unfinished``), and the run carries ``error`` (the reason); requests never sent are counted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Mapping

import numpy as np

from llmqueue.bench.attempt import Attempt
from llmqueue.bench.http import base_url, conn_message
from llmqueue.errors import InputError

_pc = time.perf_counter

OVER_ASKED = "more output tokens than max_tokens"


def per_class(value, classes: tuple[str, ...]) -> list[float]:
    """A number, None or a ``{class: number}`` mapping (checked: :mod:`llmqueue.bench.options`) ->
    one value per class index (``inf``: none)."""
    if value is None:
        return [math.inf] * len(classes)
    if isinstance(value, Mapping):
        return [math.inf if value.get(c) is None else float(value[c]) for c in classes]
    return [float(value)] * len(classes)


def retry_function(retry, seed: int, requests):
    """Normalise ``retry``: None, a callable, a ClientBehavior / BoundClient, or a ClassMix."""
    if retry is None:
        return None
    if hasattr(retry, "retry_function"):  # ClassMix
        return retry.retry_function(seed, requests)
    if hasattr(retry, "bind") and hasattr(retry, "retry"):  # ClientBehavior
        return retry.bind(seed).decide
    if hasattr(retry, "decide"):  # BoundClient
        return retry.decide
    if callable(retry):
        return retry
    raise InputError("retry", f"expected a ClassMix, ClientBehavior or decide function (got {type(retry).__name__})")


class Sender:
    """Sends a run's requests (``requests``, their bodies from ``prompts``) through ``pool`` on
    their schedule, with retries; each finished attempt goes to ``record`` (a
    :meth:`llmqueue.bench.recorder.Recorder.record`). ``opts``: the run's
    :class:`~llmqueue.bench.options.BenchOptions`."""

    def __init__(self, requests, prompts, opts, record, notes: list):
        classes = tuple(requests.classes)
        self.classes = classes
        self.cls_idx = requests.class_index.tolist()
        # X-Request-Class per class (--class-header), the class names checked as header values
        self.cls_headers = [(b"X-Request-Class: " + c.encode("latin-1") + b"\r\n")
                            if opts.class_header and c.isprintable() and c.isascii() else b"" for c in classes]
        self.ids = requests.request_id.tolist()
        self.arrivals = np.asarray(requests.arrival_s, dtype=np.float64).tolist()
        self.timeouts = per_class(opts.timeout_s, classes)
        self.ttft_timeouts = per_class(opts.ttft_timeout_s, classes)
        self.retry = retry_function(opts.retry, opts.seed, requests)
        self.prompts = prompts
        self.record = record
        self.notes = notes
        self.spin_s = opts.spin_s
        self.abort_after = opts.abort_after
        self.sem = asyncio.Semaphore(opts.concurrency) if opts.concurrency else None
        self.loop = None
        self.pool = None
        self.t0 = 0.0
        self._tick_pad = 0.0
        self.errors: Counter = Counter()
        self.warnings: Counter = Counter()  # reasons an ok attempt is suspect (more tokens than asked)
        self.over_asked = (0.0, None)       # the largest output / max_tokens ratio, and (request, got, asked)
        self.sent_first = 0                 # first attempts sent
        self.retries_dropped = 0            # retries decided but not sent (run stopped)
        self.inflight: set = set()
        self.n_inflight = 0
        self.max_inflight = 0
        self.finished = 0                   # requests whose last attempt ended
        self.stopping = False
        self.cancel_inflight = False
        self.cancel_status = "unfinished"   # "cancelled" when the drain cap ends the run (the client's choice)
        self.error: str | None = None
        self.conn_fail_streak = 0
        self.probing = False
        self.sched_task = None

    def start(self, pool, t0: float) -> None:
        """Sending begins at ``t0`` (the run's clock origin), through ``pool``."""
        self.pool = pool
        self.loop = pool.loop
        # uvloop rounds timer delays to the nearest millisecond: half a tick more makes a sleep
        # end at or after its target (asyncio's own loop already rounds up)
        self._tick_pad = 0.0005 if type(self.loop).__module__.startswith("uvloop") else 0.0
        self.t0 = t0

    # -- sending ---------------------------------------------------------------------------------
    async def sleep_until(self, t_rel: float) -> None:
        """Return at (never before) ``t0 + t_rel``.

        The loop's timers tick in milliseconds (uvloop rounds a delay to the nearest tick), which
        sets how the wait ends (``spin_s``):

        - ``None`` (default): sleep to the nearest tick; if that is before the intended time,
          poll the clock for the rest (under half a millisecond), one loop pass at a time, so
          answers are still read and time-stamped meanwhile. Late by a few tenths of a ms.
        - ``0``: sleep to the first tick at or after the intended time: late by up to ~1 ms, no
          CPU spent waiting (the better choice when the client shares few cores with a server
          under heavy load).
        - ``> 0``: sleep to ``spin_s`` before the intended time, then poll.
        """
        target = self.t0 + t_rel
        spin = self.spin_s
        if spin is None:
            while True:
                d = target - _pc()
                if d <= 0:
                    return
                await asyncio.sleep(d)
        elif spin <= 0:
            pad = self._tick_pad
            while True:
                d = target - _pc()
                if d <= 0:
                    return
                await asyncio.sleep(d + pad)
        else:
            while True:
                d = target - _pc()
                if d <= 0:
                    return
                await asyncio.sleep(d - spin if d > spin else 0)

    async def schedule(self) -> None:
        arr = self.arrivals
        t0 = self.t0
        body = self.prompts.body
        create = asyncio.get_running_loop().create_task
        inflight = self.inflight
        discard = inflight.discard
        for i in range(len(arr)):
            if self.stopping:
                return
            b = body(i)
            if t0 + arr[i] > _pc():
                await self.sleep_until(arr[i])
                if self.stopping:
                    return
            task = create(self.request(i, b))
            inflight.add(task)
            task.add_done_callback(discard)
            self.sent_first += 1

    async def request(self, i: int, body: bytes) -> None:
        attempt = 1
        t_int = self.arrivals[i]
        rid = self.ids[i]
        self.n_inflight += 1
        if self.n_inflight > self.max_inflight:
            self.max_inflight = self.n_inflight
        try:
            while True:
                status, fin = await self.attempt(i, attempt, t_int, body)
                if status in ("ok", "unfinished", "cancelled") or self.retry is None:
                    return
                try:
                    t_next = self.retry(rid, attempt, status, fin)
                except Exception as e:  # noqa: BLE001 - a bad retry function must not end the run
                    note = f"retry function failed ({type(e).__name__}: {e}); no retries after it"
                    if note not in self.notes:
                        self.notes.append(note)
                    return
                if t_next is None:
                    return
                if self.stopping:
                    self.retries_dropped += 1
                    return
                attempt += 1
                t_int = float(t_next)
                try:
                    await self.sleep_until(t_int)
                except asyncio.CancelledError:
                    if not self.cancel_inflight:
                        raise
                    self.retries_dropped += 1
                    return
                if self.stopping:
                    self.retries_dropped += 1
                    return
        finally:
            self.n_inflight -= 1
            self.finished += 1

    async def attempt(self, i: int, attempt: int, t_int: float, body: bytes):
        """Send one attempt and record it; returns ``(status, finish_s)``."""
        t0 = self.t0
        sched = _pc() - t0
        k = self.cls_idx[i]
        ex = Attempt(t0, self.prompts.s[i])
        try:
            status, err = await ex.run(self.pool, body, self.sem, t_int + self.timeouts[k],
                                       t_int + self.ttft_timeouts[k], self.cls_headers[k])
        except asyncio.CancelledError:
            if not self.cancel_inflight:
                raise
            status, err = ex.stopped(self.cancel_status)
        if ex.conn_failed:
            self.connection_failed()
        if ex.http_status is not None and err != "response cut short":
            self.conn_fail_streak = 0
        fin = ex.fin
        if fin == fin and fin < t_int:  # only a clock oddity could do this; keep the schema's order
            fin = t_int
        if err is not None:
            self.errors[err] += 1
        ot = ex.ot if ex.ot is not None else len(ex.toks)
        if status == "ok" and ot > self.prompts.o[i]:
            self.more_than_asked(i, ot)
        self.record(self.ids[i], k, attempt, t_int, sched, status, fin, ot, ex)
        return status, fin

    def more_than_asked(self, i: int, ot: int) -> None:
        """An ok attempt with more output tokens than its ``max_tokens``: kept as ok (the server
        did serve it and its times are real), counted in ``summary["warnings"]`` with a note."""
        self.warnings[OVER_ASKED] += 1
        asked = self.prompts.o[i]
        r = ot / asked if asked > 0 else math.inf
        if r > self.over_asked[0]:
            self.over_asked = (r, (self.ids[i], ot, asked))

    async def warm_up(self, n: int) -> None:
        """Send ``n`` requests one after another before the run (not recorded)."""
        m = len(self.arrivals)
        t0 = _pc()
        limit = min(600.0, max(self.timeouts, default=600.0))  # the client's deadline bounds a warm-up too
        for j in range(n):
            ex = Attempt(t0, 0)
            try:
                await asyncio.wait_for(self.pool.send(ex, self.prompts.body(j % m)), limit)
                status, err = ex.outcome()
            except Exception as e:  # noqa: BLE001 - the run itself will say what is wrong
                ex.abandon()
                status, err = "error", conn_message(e)
            if status != "ok":
                self.notes.append(f"warm-up request {j}: {status} ({err})")

    # -- stopping --------------------------------------------------------------------------------
    def connection_failed(self) -> None:
        self.conn_fail_streak += 1
        if self.conn_fail_streak >= self.abort_after and not self.probing and not self.stopping:
            self.probing = True
            self.loop.create_task(self.probe())

    async def probe(self) -> None:
        """After repeated connection failures: is anything listening? If nothing is (connection
        refused, host unreachable), stop the run. A connect that only times out is an overloaded
        server, and a client out of file descriptors is the client's problem: neither stops it."""
        import errno

        host, port = self.pool.addr if self.pool.addr else (self.pool.host, self.pool.port)
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
            w.close()
            self.conn_fail_streak = 0
        except (ConnectionRefusedError, ConnectionResetError) as e:
            self._abort_unreachable(e)
        except OSError as e:
            if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED):
                self._abort_unreachable(e)
            elif e.errno in (errno.EMFILE, errno.ENFILE):
                note = ("the client ran out of file descriptors (open connections); raise `ulimit -n` "
                        "or lower the rate")
                if note not in self.notes:
                    self.notes.append(note)
            self.conn_fail_streak = 0
        except asyncio.TimeoutError:
            self.conn_fail_streak = 0
        finally:
            self.probing = False

    def _abort_unreachable(self, e: BaseException) -> None:
        t = _pc() - self.t0
        self.abort(f"server {base_url(self.pool.url)} stopped accepting connections at t = {t:.3f} s "
                   f"({conn_message(e)})")

    def abort(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.error = reason
        if self.sched_task is not None and not self.sched_task.done():
            self.sched_task.cancel()

    async def wait_inflight(self, drain_timeout_s: float | None, abort_grace_s: float) -> int:
        """Wait for the attempts in flight after the last send; returns how many the drain cap
        (``drain_timeout_s`` after the last send) cancelled."""
        drain_end = None if drain_timeout_s is None else _pc() + drain_timeout_s
        while self.inflight:
            if self.stopping:
                done, pending = await asyncio.wait(set(self.inflight), timeout=abort_grace_s)
                if pending:
                    await self.cancel_all()
                return 0
            wait = 0.5
            if drain_end is not None:
                left = drain_end - _pc()
                if left <= 0:  # the drain cap: what is still in flight is cancelled by the client
                    self.cancel_status = "cancelled"
                    n = len(self.inflight)
                    self.notes.append(f"{n} request(s) still in flight {drain_timeout_s:g} s after the last send "
                                      "(the drain cap) were cancelled: status cancelled")
                    await self.cancel_all()
                    return n
                wait = min(wait, left)
            await asyncio.wait(set(self.inflight), timeout=wait)  # wake up to notice an abort
        return 0

    async def cancel_all(self) -> None:
        self.cancel_inflight = True
        tasks = set(self.inflight)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
