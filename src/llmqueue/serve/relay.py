"""``Relay``: an engine's answer passed to the client as it arrives, timed on the gateway's clock.

A streamed answer (server-sent events) is written to the client as the engine sends it, what
one read from the engine holds in one write; each event that carries a token (not the chat
role's opening chunk, the usage event or ``[DONE]``) is timed: the first is the request's first token (TTFT from its arrival at the
gateway), the gaps between them its inter-token latencies. The output token count is the usage
the engine reports (``completion_tokens``), else the token events counted. A whole answer (and
any error answer) is kept, up to :data:`MAX_WHOLE_BYTES`, and sent when it ends, with the
engine's status. Nothing of the client's request or of the engine's headers is passed on but the
body and the status.

Garbage is not passed on: a streamed answer's events must be server-sent events whose lines are
``data:`` (a JSON object or ``[DONE]``), ``event:``, ``id:``, ``retry:`` or a ``:`` comment, and
the stream must not end inside an event; a whole ``200`` answer must be a JSON object. The
client's stream begins only with the first whole event (lines may end with LF or CR LF, read as
LF across reads: a CR LF cut between two still ends its line), so an answer that is garbage from
its start fails before any byte reached the client (the gateway tries another replica, or answers
502); garbage later fails the send (the whole events before it, in the same read too, are passed
on; an event the engine had not ended when its bytes came was passed on as they came) and the
gateway ends the client's stream with an error event. Checking costs a prefix test per event, or,
for a run of plain ``data: {...}`` events, a few counts over the run.
"""

from __future__ import annotations

import re

from llmqueue.bench.http import Response, StreamError

MAX_WHOLE_BYTES = 64 * 1024 * 1024
MAX_EVENT_BYTES = 1 << 20   # an event (or the bytes before the first) longer than this is garbage
_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
#: what makes an event more than a token to count (checked one by one from the first that holds one)
_MARKS = (b'"choices":[]', b"[DONE]", b'"role":"assistant"', b'"completion_tokens"')


class Relay(Response):
    """Passes one upstream answer to the client exchange ``ex`` (see the module docstring);
    ``stream``: the client asked for server-sent events; ``clock()``: the gateway's time."""

    __slots__ = ("ex", "stream", "clock", "started", "first", "last", "events", "usage_tokens", "gaps", "carry",
                 "whole", "too_large", "on_first", "bad", "crlf", "out", "lead", "good")

    def __init__(self, ex, stream: bool, clock, on_first=None):
        super().__init__()
        self.ex = ex
        self.stream = stream
        self.clock = clock
        self.started = False        # bytes of the answer reached the client
        self.first = float("nan")   # the first token event's time
        self.last = float("nan")
        self.events = 0             # token events seen
        self.usage_tokens = None    # completion_tokens from the engine's usage, when it reports it
        self.gaps: list = []
        self.carry = b""
        self.whole: list = []
        self.too_large = False
        self.on_first = on_first    # called once, at the first token
        self.bad = None             # why the answer is garbage, once it is found to be
        self.crlf = None            # the engine ends its event lines with CR LF (sse-starlette's way)
        self.out: list = []         # the streamed chunks of one upstream read, relayed at its end
        self.lead = b""             # what the scanned buffer carried from earlier reads (already sent)
        self.good = 0               # line ends of the scanned buffer before the event found bad

    @property
    def output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.events

    def payload(self, data: bytes) -> None:
        if self.bad is not None:
            return
        if self.stream and self.http_status == 200:
            self.out.append(data)  # relayed at the end of the read (:meth:`feed`)
            return
        n = sum(map(len, self.whole)) + len(data)
        if n > MAX_WHOLE_BYTES:
            self.too_large = True
            return
        self.whole.append(data)

    def feed(self, data: bytes) -> None:
        """One upstream read: the events its chunks hold are checked and timed together and go to
        the client in one write (an engine that sends many events at once costs one scan and one
        send, not one a chunk: a burst of small writes keeps the client's reader off the CPU until
        it ends)."""
        super().feed(data)
        if self.out:
            self._relay()

    def _relay(self) -> None:
        """Check, time and write the streamed bytes gathered from the read so far."""
        out = self.out
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        if self.bad is not None:
            return
        whole = self._scan(data)
        if self.bad is not None:
            k = self.good - self.lead.count(b"\n")  # line ends of this read before the event found bad
            if self.started and k > 0:  # the whole events before it, as the engine sent them
                self.ex.write(data[:_after_lines(data, k)])
            self.fail(StreamError(self.bad))
        elif self.started:
            self.ex.write(data)
        elif whole:  # the first whole event: the client's stream begins
            self.started = True
            self.ex.start_stream(200, first=b"".join(self.whole) + data)
            self.whole.clear()
        else:
            self.whole.append(data)

    def _scan(self, data: bytes) -> bool:
        """Check and time the events that ``data`` ends (events end with a blank line; one may span
        chunks): sets :attr:`bad` at one that is not a server-sent event; whether any ended.

        The token events before the first that may be something else (a usage, ``[DONE]``, the
        chat stream's opening chunk) are checked together when they are plain ``data: {...}``
        events (counting their lines and their starts: what an engine sends while it decodes);
        the others one by one."""
        if self.crlf is None and b"\n" in data:
            self.crlf = b"\r\n" in data  # JSON holds no raw CR LF: these are line ends
        carry = self.lead = self.carry  # kept as it was (its line ends are counted only if garbage follows)
        buf = carry + data if carry else data
        if self.crlf:  # after joining: a CR LF cut between two reads is one line end
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            return self._events(buf)
        whole = buf[:end + 2]
        cut = len(whole)
        for mark in _MARKS:
            j = whole.find(mark, 0, cut)
            if j >= 0:
                cut = whole.rfind(b"\n\n", 0, j) + 2  # the start of the event that holds it (0: the first)
                if cut == 1:
                    cut = 0
        bulk = whole[:cut] if cut < len(whole) else whole
        k = 0
        if bulk:  # plain events: each one line "data: {...}" ended by a blank line, and nothing else
            k = bulk.count(b"\n\ndata: {") + 1
            if not (bulk.startswith(b"data: {") and bulk.count(b"\n") == 2 * k):
                return self._events(buf)  # one by one (it says which is not an event)
        if b"\n\n\n" in buf[max(cut - 2, 0):]:  # blank lines in a row after them: split as they come
            return self._events(buf)
        self.carry = buf[end + 2:]
        if len(self.carry) > MAX_EVENT_BYTES:
            self.bad = f"no end of a server-sent event in {MAX_EVENT_BYTES} bytes"
            return False
        t = None
        if k:
            t = self.clock()
            self._tokens(t, k)
        if cut < len(whole):
            self._each(whole[cut:end].split(b"\n\n"), t, 2 * k)
        return True

    def _events(self, buf: bytes) -> bool:
        parts = buf.split(b"\n\n")
        self.carry = parts.pop()
        if len(self.carry) > MAX_EVENT_BYTES:
            self.bad = f"no end of a server-sent event in {MAX_EVENT_BYTES} bytes"
            return False
        self._each(parts, None, 0)
        return bool(parts) and self.bad is None

    def _each(self, parts: list, t, lines: int) -> None:
        """Check and time ``parts`` (whole events, in order, after ``lines`` line ends of the
        scanned buffer) one by one; ``t``: the read's time, once taken."""
        for i, ev in enumerate(parts):
            if not (ev.startswith((b"data: {", b"data:{", b"data: [DONE]")) and b"\n" not in ev) and _not_sse(ev):
                self.bad = f"not a server-sent event: {bytes(ev[:40])!r}"
                self.good = lines + sum(p.count(b"\n") + 2 for p in parts[:i])
                return
            if b'"choices":[]' in ev or b"[DONE]" in ev or not ev.strip():
                m = _USAGE.search(ev)
                if m:
                    self.usage_tokens = int(m.group(1))
                continue
            if b'"role":"assistant"' in ev and b'"content":""' in ev:
                continue  # the chat stream's opening chunk: no token yet
            m = _USAGE.search(ev)  # continuous usage stats ride on token events
            if m:
                self.usage_tokens = int(m.group(1))
            t = self.clock() if t is None else t
            self._tokens(t, 1)

    def _tokens(self, t: float, k: int) -> None:
        """``k`` token events seen at ``t``: the first token, or a gap since the last (and ``k - 1``
        gaps of 0 after it: one read, one time)."""
        if self.events == 0:
            self.first = t
            if self.on_first is not None:
                self.on_first()
        else:
            self.gaps.append(t - self.last)
        if k > 1:
            self.gaps.extend([0.0] * (k - 1))
        self.last = t
        self.events += k

    def finish(self) -> None:
        if self.out:  # the end of the body came in the read that carried these bytes
            self._relay()
        if self.bad is not None:
            return
        if self.stream and self.http_status == 200 and (self.carry.strip() or not self.started):
            self.bad = "the engine's stream ended inside an event" if self.started else "no server-sent event"
        elif self.http_status == 200 and not self.stream and not self.too_large and \
                b"".join(self.whole).lstrip()[:1] != b"{":
            self.bad = "the engine's answer is not a JSON object"
        if self.bad is not None:
            self.complete = True
            self.fail(StreamError(self.bad))
            return
        if not self.stream or self.http_status != 200:
            body = b"".join(self.whole)
            if self.http_status == 200:
                self.first = self.last = self.clock()  # a whole answer's first token is its end
                if self.on_first is not None:
                    self.on_first()
                m = _USAGE.search(body)
                if m:
                    self.usage_tokens = int(m.group(1))
        super().finish()

    def send_whole(self) -> None:
        """Answer the client with the kept body and the engine's status (after :meth:`finish`)."""
        if self.too_large:
            from llmqueue.serve.openai import ApiError

            e = ApiError(502, "the engine's answer exceeded the gateway's limit", "BadGatewayError")
            self.ex.respond(e.status, e.body())
            return
        self.ex.respond(self.http_status or 502, b"".join(self.whole))


def _after_lines(raw: bytes, k: int) -> int:
    """Where in ``raw`` its ``k``-th line end (LF, or CR LF) ends."""
    pos = -1
    for _ in range(k):
        pos = raw.index(b"\n", pos + 1)
    return pos + 1


def _not_sse(ev: bytes) -> bool:
    """Whether an event's lines are not all server-sent-event fields (``data:`` holding a JSON
    object or ``[DONE]``)."""
    for line in ev.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line:
            continue
        if not line.startswith(_FIELDS):
            return True
        if line.startswith(b"data:"):
            v = line[5:].strip()
            if v[:1] != b"{" and v != b"[DONE]":
                return True
    return False
