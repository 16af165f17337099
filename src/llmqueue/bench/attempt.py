"""One attempt of one request: its answer read as it streams, its token times and its outcome.

An :class:`Attempt` is an HTTP response (:class:`~llmqueue.bench.http.Response`) whose body is
read as server-sent events (:class:`~llmqueue.bench.sse.SSEParser`): each event's data is decoded
as JSON when it arrives and a chunk with ``choices`` is time-stamped then
(``time.perf_counter() - t0``), as ``vllm bench serve`` time-stamps its chunks. Events of the
default type (``message``) carry the chunks; an ``error`` event fails the attempt (as the OpenAI
SDK reads it); other named events are ignored. vLLM's chat stream opens with a role-only chunk
(``delta: {"role": "assistant", "content": ""}``), sent in the same engine iteration as the first
token: it is not a token and is skipped.

What the attempt's record holds (``llmqueue.records`` schema): ``first_token_s`` the arrival of the
first chunk carrying ``choices``; ``finish_s`` the arrival of the last such chunk (vLLM's
``latency``), or the time the attempt failed, or its deadline for a timeout; seconds from ``t0``.
``prompt_tokens``/``output_tokens``: the usage chunk's ``prompt_tokens`` and
``completion_tokens`` (without one: the prompt sent and the chunks counted);
``cached_prompt_tokens``: ``usage.prompt_tokens_details.cached_tokens`` or 0.

Statuses (an attempt never raises; a failure is a status):

==============================================================  ===========
what happened                                                   status
==============================================================  ===========
HTTP 200, tokens streamed, ``[DONE]`` or a usage chunk seen     ``ok``
HTTP 429 or 503 (overload, admission control)                   ``rejected``
HTTP 400/413 saying the prompt is too long (vLLM: "maximum      ``rejected``
context length")
any other HTTP status (400 bad request, 404 model, 500, ...)    ``error``
malformed JSON chunk, an ``error`` event in the stream, no      ``error``
token, stream cut before ``[DONE]``, connection refused/reset
a broken answer: a usage count that is not an integer in        ``error``
``[0, 2**63)``, ``choices`` not a list, an SSE line over 8 MiB
client deadline passed (``timeout_s`` / ``ttft_timeout_s``)     ``timeout``
still in flight when the run was stopped or interrupted         ``unfinished``
==============================================================  ===========
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from array import array

from llmqueue.bench.http import Response, StreamError, classify_http, conn_message
from llmqueue.bench.sse import SSEError, SSEParser

_pc = time.perf_counter

_MAX_ERRBODY = 1 << 20       # kept of a non-200 body (for classify_http)
_MAX_COUNT = (1 << 63) - 1   # a token count must fit the records' int64


class Expired(Exception):
    """The attempt's client deadline passed."""


class Attempt(Response):
    """One try of one request, sent at ``t0 + disp`` with ``prompt_tokens`` prompt tokens.

    ``toks``: the chunks' arrival times; ``first``/``fin``: the first and last token (or the
    failure, or the deadline); ``ot``/``pt``/``cached``: the server's counts once read;
    ``conn_failed``: the connection failed under it (refused, reset, cut short).
    """

    __slots__ = ("t0", "pt", "ot", "cached", "first", "fin", "toks", "usage", "done", "timer", "task", "expired",
                 "later", "sse", "errbody", "done_t", "disp", "conn_failed")

    def __init__(self, t0: float, prompt_tokens: int):
        self.t0 = t0
        self.pt = prompt_tokens
        self.ot = None
        self.cached = 0
        self.first = math.nan
        self.fin = math.nan
        self.toks = array("d")
        self.usage = None
        self.done = False
        self.timer = None
        self.task = None
        self.expired = False
        self.later = None
        self.disp = math.nan
        self.conn_failed = False
        Response.__init__(self)

    def reset(self) -> None:
        Response.reset(self)
        self.sse = None
        self.errbody = bytearray()
        self.done_t = math.nan

    # -- sending -------------------------------------------------------------------------------
    async def run(self, pool, body: bytes, sem, deadline: float, ttft_deadline: float,
                  headers: bytes = b"") -> tuple[str, str | None]:
        """Send ``body`` through ``pool`` (after a slot of ``sem``, a concurrency cap, when
        given) and read the answer, within the deadlines (absolute, s from ``t0``; ``inf``:
        none). Returns ``(status, reason)``; a cancel that is not its own deadline's is raised
        (the caller says what it means)."""
        t0 = self.t0
        first_deadline = deadline if deadline <= ttft_deadline else ttft_deadline
        status = "error"
        err = None
        task = None
        if first_deadline != math.inf:
            # one timer per attempt (cheaper than asyncio.timeout); it fails the exchange, or
            # cancels the task while it waits for a slot or a connection
            loop = pool.loop
            task = self.task = asyncio.current_task()
            self.timer = loop.call_at(loop.time() + (t0 + first_deadline - _pc()), self.expire)
            if ttft_deadline < deadline and deadline != math.inf:
                self.later = (deadline, loop)
        acquired = False
        try:
            if sem is not None:
                await sem.acquire()
                acquired = True
            self.disp = _pc() - t0
            await pool.send(self, body, headers)
            status, err = self.outcome()
        except Expired:
            status = "timeout"
        except asyncio.CancelledError:
            self.abandon()
            if not self.expired:
                raise
            task.uncancel()
            status = "timeout"
        except StreamError as e:
            status = "error"
            if self.fin != self.fin:
                self.fin = _pc() - t0
            err = str(e)
            self.conn_failed = err == "response cut short"
        except OSError as e:  # connect failures, resets
            status = "error"
            if self.fin != self.fin:
                self.fin = _pc() - t0
            err = conn_message(e)
            self.conn_failed = True
        except Exception as e:  # noqa: BLE001 - anything else is this attempt's error, not the run's
            self.abandon()
            status = "error"
            if self.fin != self.fin:
                self.fin = _pc() - t0
            err = f"{type(e).__name__}: {str(e)[:80]}"
        finally:
            if self.timer is not None:
                self.timer.cancel()
            if acquired:
                sem.release()
        if status == "timeout":
            first = self.first
            self.fin = deadline if (first == first or deadline <= ttft_deadline) else ttft_deadline
            err = "client timeout" if self.fin == deadline else "client TTFT timeout"
        return status, err

    def stopped(self, status: str) -> tuple[str, str]:
        """The run stopped while the attempt was in flight: ``unfinished`` (no finish time), or
        ``cancelled`` by the client at the drain cap (finished now)."""
        if status == "cancelled":
            self.fin = _pc() - self.t0
            return status, "cancelled at the drain cap"
        self.fin = math.nan
        return status, "in flight when the run stopped"

    def expire(self) -> None:
        """The attempt's deadline passed (a timer callback)."""
        self.timer = None
        f = self.fut
        if f is not None:
            if f.done():  # the answer came first
                return
            self.expired = True
            self.keep_alive = False
            f.set_exception(Expired())
            self.abandon()
        else:  # waiting for a concurrency slot or a connection
            self.expired = True
            self.task.cancel()

    # -- the answer, as it arrives (called by the connection) ----------------------------------
    def payload(self, data: bytes) -> None:
        """Response body bytes: server-sent events for a 200, else kept (1 MiB at most) for the status."""
        if self.fut is None or self.fut.done():
            return
        if self.http_status != 200:
            if len(self.errbody) < _MAX_ERRBODY:
                self.errbody += data[:_MAX_ERRBODY - len(self.errbody)]
            return
        sse = self.sse
        if sse is None:
            sse = self.sse = SSEParser()
        try:
            events = sse.feed(data)
        except SSEError as e:
            self.fail(StreamError(str(e)))
            return
        t0 = self.t0
        for kind, ev in events:
            if kind != b"message":
                if kind == b"error":  # the OpenAI SDK raises on an ``event: error``
                    self.fail(StreamError("error event in stream" + _error_text(ev)))
                    return
                continue  # other named events (pings, progress) carry no chunk
            if ev == b"[DONE]":
                self.done = True
                continue
            try:
                d = json.loads(ev)
            except ValueError:
                d = _odd_data(ev)
                if d is None:
                    self.fail(StreamError("malformed JSON chunk"))
                    return
                if d is _DONE_DATA:
                    self.done = True
                    continue
                if d is _NO_DATA:
                    continue
            if type(d) is not dict:
                self.fail(StreamError("malformed JSON chunk"))
                return
            ch = d.get("choices")
            if ch:
                if type(ch) is not list:
                    self.fail(StreamError("malformed chunk: choices is not a list"))
                    return
                if not self.toks and _role_only(ch):
                    continue  # vLLM's chat stream opens with {"role": "assistant", "content": ""}
                now = _pc() - t0
                if self.first != self.first:
                    self.first = now
                    if self.later is not None:  # the TTFT deadline is met: the total one applies
                        deadline, loop = self.later
                        if self.timer is not None:
                            self.timer.cancel()
                        self.timer = loop.call_at(loop.time() + (t0 + deadline - _pc()), self.expire)
                self.toks.append(now)
            elif "error" in d or d.get("object") == "error":
                e = d.get("error") if isinstance(d.get("error"), dict) else d
                msg = str(e.get("message", "") if isinstance(e, dict) else e)[:80]
                self.fail(StreamError("error event in stream" + (f": {msg}" if msg else "")))
                return
            u = d.get("usage")
            if u:
                self.usage = u

    def finish(self) -> None:
        self.done_t = _pc() - self.t0
        Response.finish(self)

    def fail(self, exc: BaseException) -> None:
        if self.fin != self.fin:
            self.fin = _pc() - self.t0
        Response.fail(self, exc)

    # -- the outcome -----------------------------------------------------------------------------
    def outcome(self) -> tuple[str, str | None]:
        code = self.http_status
        if code != 200:
            self.fin = self.done_t
            return classify_http(code, bytes(self.errbody)), f"HTTP {code}"
        if not self.toks:
            self.fin = self.done_t
            return "error", "no token in the stream"
        if not (self.done or self.usage):
            self.fin = self.done_t
            return "error", "stream ended before [DONE]"
        self.fin = self.toks[-1]
        u = self.usage
        if u:
            bad = self.read_usage(u)
            if bad is not None:
                return "error", bad
        return "ok", None

    def read_usage(self, u) -> str | None:
        """Take the server's token counts from its usage chunk; returns why they cannot be taken
        (the attempt is then an error, recorded with the prompt sent and the chunks counted), or
        None. A count must be an integer (not a string, float or bool) in ``[0, 2**63)``, the
        records' int64; cached prompt tokens cannot exceed the prompt."""
        if type(u) is not dict:
            return "invalid usage (not an object)"
        c = u.get("completion_tokens")
        p = u.get("prompt_tokens")
        det = u.get("prompt_tokens_details")
        k = det.get("cached_tokens") if type(det) is dict else None
        for name, v in (("completion_tokens", c), ("prompt_tokens", p), ("prompt_tokens_details.cached_tokens", k)):
            if v is not None and not (type(v) is int and 0 <= v <= _MAX_COUNT):
                return f"invalid usage.{name} (not an integer in [0, 2^63))"
        if k and p is not None and k > p:
            return "invalid usage.prompt_tokens_details.cached_tokens (more than prompt_tokens)"
        self.ot = len(self.toks) if c is None else c
        if p is not None:
            self.pt = p
        if k:
            self.cached = k
        return None


def _role_only(choices) -> bool:
    """A chat chunk that only announces the role (no content, reasoning or tool call): not a token."""
    c = choices[0]
    delta = c.get("delta") if type(c) is dict else None
    if type(delta) is not dict or "role" not in delta or c.get("finish_reason"):
        return False
    return not any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls"))


_DONE_DATA = object()
_NO_DATA = object()


def _odd_data(ev: bytes):
    """An event's data that ``json.loads`` refused: ``[DONE]`` with spaces around it, nothing but
    spaces (a keep-alive), or JSON that is not valid UTF-8 (read as the WHATWG decoder reads
    it: bad bytes become U+FFFD). None: not JSON."""
    s = ev.strip()
    if s == b"[DONE]":
        return _DONE_DATA
    if not s:
        return _NO_DATA
    try:
        return json.loads(ev.decode("utf-8", "replace"))
    except ValueError:
        return None


def _error_text(ev: bytes) -> str:
    """``": message"`` of an ``error`` event's data (JSON with a message, or text), or ``""``."""
    try:
        d = json.loads(ev)
    except ValueError:
        msg = ev.decode("utf-8", "replace").strip()
    else:
        e = d.get("error", d) if isinstance(d, dict) else d
        msg = str(e.get("message", "") if isinstance(e, dict) else e)
    msg = msg[:80]
    return f": {msg}" if msg else ""
