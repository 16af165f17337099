"""The HTTP/1.1 server core the live layer shares (the emulator, the gateway): asyncio on uvloop,
requests parsed by httptools (llhttp, the parser of Node.js and uvicorn).

A handler gets one :class:`Exchange` per request and answers it whole (:meth:`Exchange.respond`)
or as a stream of chunks (:meth:`Exchange.start_stream`, :meth:`Exchange.write`,
:meth:`Exchange.end`): from any callback, with no task per chunk, so an engine's step can write
the tokens of all its running requests in one pass. A handler may also be a coroutine function
(it then runs as a task). Connections are kept alive; requests that arrive on a connection while
an answer is still streaming (pipelining) wait their turn. A client that goes away while its
answer is pending fires the exchange's ``on_close`` (a server aborts the request then).

Limits (a slow or hostile client costs bounded memory and time): the request head
(:data:`MAX_HEAD_BYTES`), the body (``max_body_bytes``), and the bytes an answer may have queued
for a client that does not read (:data:`MAX_UNSENT_BYTES`: the connection is closed past it).
Malformed HTTP gets ``400`` and the connection is closed; a header value holding CR or LF (an
attempt to add a header of its own) is malformed, and the answer names the header. Time: a
request begun must be whole (head and body) within ``request_timeout_s`` (else ``408`` and the
connection closed: a client that trickles bytes), a kept-alive connection with no request is
closed quietly after ``idle_timeout_s``, and past ``max_connections`` open connections a new one
gets ``503`` and is closed at once. The deadlines are checked by one sweep over the connections
every quarter of the shorter one (at most every second), so a request pays a clock read per
state change, not a timer; an idle connection costs about 2 KB (docs/benchmarks.md).

Why this server: benchmarks/http_servers.py measured it against aiohttp.web and granian on
the same emulated answers (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import struct
import time

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_UNSENT_BYTES = 8 * 1024 * 1024
REQUEST_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 60.0
MAX_CONNECTIONS = 16384
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           413: "Payload Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
_IDLE, _READING, _BUSY = range(3)   # a connection's phase: waiting for a request, reading one, answering


class Exchange:
    """One request and its answer. ``method`` and ``path`` (str, the query string cut off),
    ``headers`` (lower-case names -> str), ``body`` (bytes), ``t_arrival`` (``time.perf_counter()``
    when the request was whole). ``on_close``: called once if the client goes away before
    :meth:`end` (set it to abort the work behind the answer)."""

    __slots__ = ("conn", "method", "path", "query", "headers", "body", "t_arrival", "on_close", "state",
                 "keep_alive")

    def __init__(self, conn, method: str, path: str, query: str, headers: dict, body: bytes, keep_alive: bool):
        self.conn = conn
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.t_arrival = time.perf_counter()
        self.on_close = None
        self.state = 0  # 0: no answer yet, 1: streaming, 2: done
        self.keep_alive = keep_alive

    @property
    def open(self) -> bool:
        """The answer is not finished and the client is still there."""
        return self.state != 2 and not self.conn.closed

    def respond(self, status: int, body: bytes, content_type: str = "application/json", headers=()) -> None:
        """Answer whole: status, ``Content-Length`` and the body."""
        if self.state != 0:
            return
        self.state = 2
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        conn = "" if self.keep_alive else "connection: close\r\n"
        head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\ncontent-type: {content_type}\r\n"
                f"content-length: {len(body)}\r\n{conn}{extra}\r\n").encode()
        self.conn.send(head + body, self)

    def respond_json(self, status: int, obj, headers=()) -> None:
        self.respond(status, json.dumps(obj, separators=(",", ":")).encode(), headers=headers)

    def start_stream(self, status: int = 200, content_type: str = "text/event-stream; charset=utf-8",
                     first: bytes = b"") -> None:
        """Send the head of a chunked answer (and ``first``, a first chunk, with it)."""
        if self.state != 0:
            return
        self.state = 1
        conn = "" if self.keep_alive else "connection: close\r\n"
        head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\ncontent-type: {content_type}\r\n"
                f"transfer-encoding: chunked\r\ncache-control: no-cache\r\n{conn}\r\n").encode()
        self.conn.write(head + (b"%x\r\n%b\r\n" % (len(first), first) if first else b""))

    def write(self, data: bytes) -> None:
        """One chunk of a streamed answer (dropped when the client is gone)."""
        if self.state == 1 and data:
            self.conn.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end(self, last: bytes = b"") -> None:
        """Finish a streamed answer (``last``: a final chunk sent with the terminator)."""
        if self.state != 1:
            return
        self.state = 2
        self.conn.send((b"%x\r\n%b\r\n" % (len(last), last) if last else b"") + b"0\r\n\r\n", self)

    def end_chunks(self, parts) -> None:
        """Finish a streamed answer with ``parts``, each its own chunk, in one write (an answer
        whose events are all ready: one send, not one an event)."""
        if self.state != 1:
            return
        self.state = 2
        self.conn.send(b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n", self)

    def reset(self) -> None:
        """Drop the connection at once with a TCP reset (a crashed server)."""
        self.conn.reset()


class _Connection(asyncio.Protocol):
    """One client connection: parse requests (httptools), hand them out one at a time."""

    def __init__(self, server: "HttpServer"):
        import httptools

        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.closed = False
        self.current: Exchange | None = None   # the exchange being answered
        self.queued: list = []                 # requests whole but waiting for the current one
        self._url = b""
        self._headers: list = []
        self._body: list = []
        self._size = 0
        self._head = 0
        self.phase = _IDLE
        self.since = 0.0   # loop time the phase began (the deadlines count from it)

    # -- asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        srv = self.server
        if len(srv.connections) >= srv.max_connections:  # refused at once: the open ones keep their memory
            srv.refused += 1
            self._fail(503, f"the server holds its limit of {srv.max_connections} connections; retry later",
                       "ServiceUnavailableError")
            return
        self.since = srv.loop_time()
        srv.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "upgrades are not supported")
        except httptools.HttpParserError as e:
            inner = e.__context__ or e.__cause__  # a limit raised inside a parser callback
            if isinstance(inner, _TooLarge):
                self._fail(inner.status, inner.message)
            else:
                name = _offending_header(data)
                self._fail(400, f"malformed HTTP request ({e})" if name is None else
                           f"header {name}: a value holding CR or LF, or a folded line, is not allowed",
                           param=None if name is None else name.lower())
        except _TooLarge as e:
            self._fail(e.status, e.message)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.connections.discard(self)
        ex, self.current = self.current, None
        self.queued.clear()
        if ex is not None and ex.state != 2 and ex.on_close is not None:
            cb, ex.on_close = ex.on_close, None
            cb()

    # -- httptools callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._body = []
        self._size = 0
        self._head = 0
        self.phase = _READING
        self.since = self.server.loop_time()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head += len(url)
        if self._head > MAX_HEAD_BYTES:
            raise _TooLarge(431, "request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head += len(name) + len(value)
        if self._head > MAX_HEAD_BYTES:
            raise _TooLarge(431, "request head too large")
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.server.max_body_bytes:
            raise _TooLarge(413, f"request body over {self.server.max_body_bytes} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = self._url.decode("latin-1")
        path, _, query = url.partition("?")
        ex = Exchange(self, self.parser.get_method().decode("latin-1"), path, query, dict(self._headers),
                      b"".join(self._body), self.parser.should_keep_alive())
        self.phase = _BUSY
        if self.current is None:
            self._dispatch(ex)
        else:
            self.queued.append(ex)

    # -- answers --------------------------------------------------------------------------------
    def _dispatch(self, ex: Exchange) -> None:
        self.current = ex
        try:
            r = self.server.handler(ex)
            if inspect.isawaitable(r):
                task = asyncio.ensure_future(r)
                task.add_done_callback(lambda t, ex=ex: self._handler_done(t, ex))
        except Exception as e:  # noqa: BLE001 - a handler's bug answers 500, the server keeps serving
            self._crashed(ex, e)

    def _handler_done(self, task, ex: Exchange) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._crashed(ex, task.exception())

    def _crashed(self, ex: Exchange, e: BaseException) -> None:
        self.server.errors += 1
        if ex.state == 0:
            ex.respond_json(500, {"error": {"message": f"internal error ({type(e).__name__})",
                                            "type": "InternalServerError", "param": None, "code": 500}})
        elif ex.state == 1:
            self.close()

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        tr = self.transport
        tr.write(data)
        if tr.get_write_buffer_size() > MAX_UNSENT_BYTES:  # a client that does not read
            self.close()

    def send(self, data: bytes, ex: Exchange) -> None:
        """The last bytes of ``ex``'s answer: then the next queued request, or close."""
        self.write(data)
        if self.current is ex:
            self.current = None
            if not ex.keep_alive:
                self.close()
            elif self.queued:
                self._dispatch(self.queued.pop(0))
            else:  # waiting again: idle, or the rest of a request sent behind this one
                if self.phase == _BUSY:
                    self.phase = _IDLE
                self.since = self.server.loop_time()

    def expire(self, now: float, request_timeout_s: float, idle_timeout_s: float) -> None:
        """Apply the deadlines (the server's sweep): a request begun and not whole in time gets
        ``408``; a connection idle too long is closed quietly. An answer in progress has none."""
        if self.current is not None or self.phase == _BUSY:
            return
        if self.phase == _READING:
            if now - self.since > request_timeout_s:
                self.server.timed_out += 1
                self._fail(408, f"the request was not whole within {request_timeout_s:g} s")
        elif now - self.since > idle_timeout_s:
            self.close()

    def _fail(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        if self.closed:
            return
        body = json.dumps({"error": {"message": message, "type": kind, "param": param,
                                     "code": status}}).encode()
        self.queued.clear()
        if self.current is None:
            self.transport.write((f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\ncontent-type: "
                                  f"application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
                                  ).encode() + body)
        self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()
            self.closed = True

    def reset(self) -> None:
        """Close with a TCP reset (SO_LINGER 0): the client sees ECONNRESET, as from a crash."""
        if self.transport is None or self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.transport.abort()


def _offending_header(data: bytes) -> str | None:
    """The name of the header in ``data`` whose value holds a bare CR or LF, or is followed by a
    folded (whitespace-led) line: what an attempt to inject a header looks like; None if none."""
    prev = None
    for line in data.split(b"\r\n")[1:]:
        if not line:
            break
        if line[:1] in (b" ", b"\t"):
            return prev
        name = line.split(b":", 1)[0].strip().decode("latin-1")[:64]
        if b"\r" in line or b"\n" in line:
            return name
        prev = name
    return None


class _TooLarge(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


class HttpServer:
    """One listening socket and its connections. ``handler(exchange)``: answers a request (or
    returns an awaitable that does). ``start(host, port)`` binds (``port`` 0: a free one,
    :attr:`port` tells it); :meth:`stop_listening` refuses new connections (the open ones go
    on), :meth:`reset_all` drops every open one with a TCP reset.

    Limits (see the module docstring): ``max_body_bytes``, ``request_timeout_s`` (a request begun
    must be whole by then: else 408), ``idle_timeout_s`` (a kept-alive connection with no request
    is closed), ``max_connections`` (a connection past it gets 503). Counted: :attr:`timed_out`
    (408s), :attr:`refused` (connections over the limit), :attr:`errors` (handler crashes)."""

    def __init__(self, handler, *, max_body_bytes: int = MAX_BODY_BYTES, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.connections: set = set()
        self.server = None
        self.host = None
        self.port = None
        self.errors = 0
        self.timed_out = 0
        self.refused = 0
        self.loop_time = time.monotonic   # the loop's clock once started
        self._sweeper = None

    async def start(self, host: str = "127.0.0.1", port: int = 0, field: str = "host") -> "HttpServer":
        """Listen on ``host:port``; an address that cannot be bound is a one-line error naming ``field``
        (the flag that gave it)."""
        from llmqueue.errors import InputError

        loop = asyncio.get_running_loop()
        try:
            self.server = await loop.create_server(lambda: _Connection(self), host, port, backlog=4096,
                                                   reuse_address=True)
        except OSError as e:
            raise InputError(field, f"cannot listen on {host}:{port} ({e.strerror or e})",
                             "give an address of this machine (127.0.0.1) and a free port (0 picks one)") from None
        self.host = host
        self.port = self.server.sockets[0].getsockname()[1]
        self.loop_time = loop.time
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        return self

    async def _sweep(self) -> None:
        """Every quarter of the shorter deadline (at most every second): each connection's deadlines."""
        tick = min(max(min(self.request_timeout_s, self.idle_timeout_s) / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(tick)
            now = self.loop_time()
            for c in list(self.connections):
                c.expire(now, self.request_timeout_s, self.idle_timeout_s)

    def stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def reset_all(self) -> None:
        for c in list(self.connections):
            c.reset()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        srv, self.server = self.server, None
        for c in list(self.connections):
            c.close()
        if srv is not None:
            srv.close()
            await srv.wait_closed()
