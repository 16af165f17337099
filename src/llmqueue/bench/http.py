"""A small HTTP/1.1 client on asyncio protocols: keep-alive connections to one server, and a
response parsed as its bytes arrive, in the protocol callback (no task per chunk).

Nothing here knows of benchmarks: the API is "open a pool to a URL with headers; send one request
body and feed the response to a consumer; close" (the benchmark client's transport, and the
upstream client of a gateway in front of servers)::

    pool = Pool(loop, "http://127.0.0.1:8000/v1/completions", headers, proxy=None)
    await pool.resolve()
    await pool.send(response, body)   # ``response``: a Response subclass; returns when it ends
    pool.close()

:class:`Response` reads the HTTP/1.1 framing (Content-Length, chunked, or until the connection
closes; interim ``1xx`` answers skipped) and hands the body's bytes to its subclass's
:meth:`Response.payload`; the pool resolves the send when the body ends, or fails it with
:class:`StreamError` (a response that cannot be read), :class:`Lost` (the connection closed
before any byte of the answer: a stale keep-alive connection, retried once on a fresh one) or an
``OSError``. Every buffer is bounded (head, chunk-size line, trailer), and every byte is copied a
bounded number of times: what a server sends cannot exhaust the client nor slow it down more
than linearly.

Connections are opened on demand with no limit (a limit would queue requests in the client:
closed-loop behaviour) and go to the URL's origin only, or through an ``http://`` proxy when one
is given: a plain-http server's requests are forwarded by it (the request line names the whole
URL), an https server is reached through a ``CONNECT`` tunnel inside which TLS runs end to end.
This costs about a third of a general client's CPU per request (aiohttp's ``ClientSession``,
measured on the stub server), which is what lets one process send thousands of requests per
second on time.

The OpenAI API's side: :func:`endpoint_url` (the path of ``completions`` or ``chat``) and
:func:`classify_http` (the record status of a non-200 answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from llmqueue.bench.credentials import proxy_auth
from llmqueue.errors import InputError

_HEAD, _BODY_LEN, _BODY_CLOSE, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _DONE = range(8)
_MAX_HEAD = 64 * 1024        # response head, and a chunked body's trailer
_MAX_CHUNK_LINE = 4096       # a chunk-size line (hex size and extensions)


class StreamError(Exception):
    """The response cannot be read (its framing, or what its consumer found in the body)."""


class Lost(ConnectionResetError):
    """The connection closed before any byte of the response (a stale keep-alive connection or
    a server that died): retried once on a fresh connection when the connection was reused."""


def check_url(url: str, field: str = "url") -> str:
    """``url`` when it is an http(s) URL with a host (and a valid port, if any); else one-line InputError."""
    fix = "e.g. http://127.0.0.1:8000 or http://[::1]:8000"
    try:
        p = urlsplit(str(url).strip())
        host, _ = p.hostname, p.port  # both raise ValueError on a malformed host or port
    except ValueError as e:
        raise InputError(field, f"{url!r} is not a valid URL ({e})", fix) from None
    if p.scheme not in ("http", "https") or not host:
        raise InputError(field, f"{url!r} is not an http(s) URL with a host", fix)
    return url


def base_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"


def endpoint_url(url: str, endpoint: str) -> str:
    """The request URL: ``url`` as given if it names an endpoint, else ``url/v1/<endpoint path>``."""
    if endpoint not in ("completions", "chat"):
        raise InputError("endpoint", f"unknown endpoint {endpoint!r}", "use completions or chat")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("url", f"{url!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000")
    try:
        parts.port
    except ValueError:
        raise InputError("url", f"{url!r} has a bad port", "e.g. http://127.0.0.1:8000") from None
    u = url.rstrip("/")
    if u.endswith("/completions"):
        return u
    path = "completions" if endpoint == "completions" else "chat/completions"
    return f"{u}/{path}" if u.endswith("/v1") else f"{u}/v1/{path}"


def classify_http(status: int, body: bytes | str = b"") -> str:
    """The record status of a non-200 HTTP answer: 429 and 503 (overload, admission control)
    and a 400/413 saying the prompt is too long (vLLM: "maximum context length") are
    ``rejected``; any other status is an ``error``."""
    if status in (429, 503):
        return "rejected"
    if status in (400, 413):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        t = text.lower()
        if ("maximum context length" in t or "max_model_len" in t or "context length" in t
                or "too long" in t or "exceeds" in t and "token" in t):
            return "rejected"
    return "error"


def conn_message(e: BaseException) -> str:
    """A connection failure in a few words (``connection refused``, ``connection reset``...)."""
    name = type(e).__name__
    s = str(e)
    if isinstance(e, Lost):
        return "server disconnected"
    if isinstance(e, ConnectionRefusedError) or "Connect call failed" in s or "Connection refused" in s:
        return "connection refused"
    if name == "ServerDisconnectedError":
        return "server disconnected"
    if isinstance(e, ConnectionResetError) or "reset by peer" in s:
        return "connection reset"
    if isinstance(e, asyncio.TimeoutError):
        return "connect timeout"
    if name == "ClientPayloadError":
        return "response cut short"
    return f"{name}: {s[:80]}" if s else name


class Response:
    """One HTTP/1.1 response on a connection, framed as bytes arrive: a subclass reads the body
    in :meth:`payload` (and may extend :meth:`finish`, :meth:`fail` and :meth:`reset`).

    ``http_status``: the status code (None before the head); ``keep_alive``: whether the
    connection may carry another request; ``complete``: the body ended; ``fut``: resolved when it
    ends (or failed); ``conn``: the connection it arrives on.
    """

    __slots__ = ("fut", "conn", "http_status", "state", "buf", "remaining", "keep_alive", "nbytes", "complete")

    def __init__(self):
        self.fut = None
        self.conn = None
        self.http_status = None
        self.reset()

    def reset(self) -> None:
        """Forget a response (before resending on a fresh connection)."""
        self.state = _HEAD
        self.buf = b""
        self.remaining = 0
        self.keep_alive = False
        self.nbytes = 0
        self.complete = False

    def payload(self, data: bytes) -> None:
        """Body bytes, as they arrive (a subclass reads them)."""
        raise NotImplementedError

    # -- called by the connection ------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.nbytes += len(data)
        if self.state != _HEAD:
            self.body(data)
            return
        old = self.buf
        buf = old + data if old else data
        j = buf.find(b"\r\n\r\n", max(len(old) - 3, 0))  # bytes already searched are not searched again
        if j < 0:
            if len(buf) > _MAX_HEAD:
                self.fail(StreamError("response head too large"))
            self.buf = buf
            return
        self.buf = b""
        lines = buf[:j].split(b"\r\n")
        parts = lines[0].split(None, 2)
        try:
            code = int(parts[1])
        except (IndexError, ValueError):
            self.fail(StreamError("not an HTTP response"))
            return
        clen = None
        chunked = False
        conn_hdr = b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    clen = int(value)
                except ValueError:
                    self.fail(StreamError("bad Content-Length"))
                    return
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                conn_hdr = value.strip().lower()
        if 100 <= code < 200:  # interim answer: the real one follows
            rest = buf[j + 4:]
            if rest:
                self.feed(rest)
            return
        self.http_status = code
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = conn_hdr == b"keep-alive"
        else:
            self.keep_alive = conn_hdr != b"close"
        if chunked:
            self.state = _CHUNK_SIZE
        elif clen is not None:
            self.state = _BODY_LEN
            self.remaining = clen
        else:
            self.state = _BODY_CLOSE
            self.keep_alive = False
        rest = buf[j + 4:]
        if self.state == _BODY_LEN and clen == 0:
            self.finish()
        elif rest:
            self.body(rest)

    def body(self, data: bytes) -> None:
        """Framing: hand the payload bytes to :meth:`payload`; finish at the end of the body."""
        st = self.state
        if st == _BODY_LEN:
            n = self.remaining
            if len(data) >= n:
                self.payload(data[:n])
                self.remaining = 0
                self.finish()
            else:
                self.remaining = n - len(data)
                self.payload(data)
            return
        if st == _BODY_CLOSE:
            self.payload(data)
            return
        if st == _DONE:
            return
        buf = self.buf + data if self.buf else data
        pos = 0
        n = len(buf)
        while pos < n and self.state != _DONE:
            st = self.state
            if st == _CHUNK_DATA:
                k = self.remaining
                take = buf[pos:pos + k]
                pos += len(take)
                self.remaining = k - len(take)
                if self.remaining == 0:
                    self.state = _CHUNK_CRLF
                self.payload(take)
            elif st == _CHUNK_CRLF:
                if n - pos < 2:
                    break
                pos += 2
                self.state = _CHUNK_SIZE
            elif st == _CHUNK_SIZE:
                pos = self._whole_chunks(buf, pos, n)
                if self.state != _CHUNK_SIZE:
                    return
                e = buf.find(b"\r\n", pos)
                if e < 0:
                    if n - pos > _MAX_CHUNK_LINE:
                        self.fail(StreamError("bad chunked encoding (chunk-size line too long)"))
                        return
                    break
                try:
                    size = int(buf[pos:e].split(b";", 1)[0], 16)
                except ValueError:
                    self.fail(StreamError("bad chunked encoding"))
                    return
                pos = e + 2
                if size == 0:
                    self.state = _TRAILER
                else:
                    self.remaining = size
                    self.state = _CHUNK_DATA
            elif st == _TRAILER:
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                    self.finish()
                    break
                e = buf.find(b"\r\n\r\n", pos)
                if e < 0:
                    if n - pos > _MAX_HEAD:
                        self.fail(StreamError("chunked trailer too large"))
                        return
                    break
                pos = e + 4
                self.finish()
                break
            else:  # _DONE or _HEAD cannot happen here
                break
        self.buf = buf[pos:] if pos < n else b""

    def _whole_chunks(self, buf: bytes, pos: int, n: int) -> int:
        """From a chunk-size line at ``pos``: the chunks wholly in ``buf`` (size line, data, CRLF)
        handed to :meth:`payload` together, in one call (an engine that sends many events at once
        costs one call, not three steps of the framing's states a chunk); returns where the first
        chunk not wholly there (or the last, size 0) begins. A size line that is not hex fails the
        response (after the chunks before it)."""
        pieces = []
        while True:
            e = buf.find(b"\r\n", pos)
            if e < 0:
                break
            line = buf[pos:e]
            try:
                size = int(line.split(b";", 1)[0] if b";" in line else line, 16)
            except ValueError:
                break  # the framing's own path says it
            end = e + 2 + size
            if size <= 0 or end + 2 > n:
                break
            pieces.append(buf[e + 2:end])
            pos = end + 2
        if pieces:
            self.payload(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        return pos

    def finish(self) -> None:
        """The body ended."""
        self.state = _DONE
        self.complete = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """The response cannot be completed (``exc`` fails the send)."""
        self.keep_alive = False
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(exc)

    def lost(self, exc) -> None:
        """The connection closed under this response."""
        if self.complete:
            return
        if self.state == _BODY_CLOSE and exc is None:
            self.finish()
        elif self.nbytes == 0:
            self.fail(Lost("server disconnected"))
        else:
            self.fail(StreamError("response cut short"))

    def abandon(self) -> None:
        """The client gives up (timeout, cancel): close the connection under it."""
        c = self.conn
        if c is not None and not self.complete:
            c.resp = None
            c.close()


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; feeds the bytes to its current response."""

    __slots__ = ("transport", "resp", "closed", "hs", "hs_fut")

    def __init__(self):
        self.transport = None
        self.resp = None
        self.closed = False
        self.hs = None      # a proxy's answer to CONNECT, while it arrives
        self.hs_fut = None  # resolved when the tunnel is open (or refused)

    async def open_tunnel(self, request: bytes) -> None:
        """Ask the proxy for a tunnel to the server (``CONNECT``) and wait for its 2xx answer."""
        self.hs = bytearray()
        self.hs_fut = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            await self.hs_fut
        finally:
            self.hs = self.hs_fut = None

    def tunnel_answer(self, data: bytes) -> None:
        f = self.hs_fut
        self.hs += data
        j = self.hs.find(b"\r\n\r\n")
        if j < 0:
            if len(self.hs) > _MAX_HEAD:
                f.set_exception(ConnectionError("the proxy's answer to CONNECT is too large"))
            return
        line = bytes(self.hs[:self.hs.find(b"\r\n")])
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[1].startswith(b"2") or len(parts[1]) != 3:
            f.set_exception(ConnectionError("the proxy refused the tunnel: " + line.decode("latin-1")[:80]))
        elif j + 4 != len(self.hs):
            f.set_exception(ConnectionError("the proxy sent bytes before the tunnel's TLS"))
        else:
            f.set_result(None)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:
            f = self.hs_fut
            if f is not None and not f.done():
                self.tunnel_answer(data)
                return
            self.close()  # bytes nobody asked for: the connection is not reusable
            return
        try:
            resp.feed(data)
        except Exception as e:  # noqa: BLE001 - an answer nobody foresaw fails its send, never the loop
            self.resp = None
            resp.fail(StreamError(f"unreadable response ({type(e).__name__})"))
            self.close()

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        f = self.hs_fut
        if f is not None and not f.done():
            f.set_exception(ConnectionResetError("the proxy closed the connection"))
        resp = self.resp
        if resp is not None:
            self.resp = None
            resp.lost(exc)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class Pool:
    """Keep-alive connections to the server of ``url``, created on demand (no limit: open loop),
    posting to ``url``'s path with ``headers`` (a mapping or ``(name, value)`` pairs, written in
    order after ``Host``).

    With ``proxy`` (an ``http://`` proxy URL, see :mod:`llmqueue.bench.credentials`) every
    connection goes to the proxy: a plain-http server's requests are forwarded by it (the
    request line names the whole URL), an https server is reached through a ``CONNECT`` tunnel,
    inside which TLS runs end to end with the server.
    """

    def __init__(self, loop, url: str, headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                 proxy: str | None = None):
        import ssl

        p = urlsplit(url)
        self.url = url
        self.loop = loop
        self.host = p.hostname
        self.port = p.port or (443 if p.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if p.scheme == "https" else None
        path = p.path or "/"
        if p.query:
            path += "?" + p.query
        host_hdr = p.netloc.rsplit("@", 1)[-1]
        items = headers.items() if isinstance(headers, Mapping) else headers
        extra = "".join(f"{k}: {v}\r\n" for k, v in items)
        self.tunnel = None  # the CONNECT request (an https server through a proxy)
        self.connect_to = (self.host, self.port)
        if proxy is not None:
            pp = urlsplit(proxy)
            self.connect_to = (pp.hostname, pp.port or 80)
            auth = proxy_auth(proxy)
            auth = f"Proxy-Authorization: {auth}\r\n" if auth else ""
            if self.ssl is None:
                path = f"http://{host_hdr}{path}"
                extra += auth
            else:
                authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
                self.tunnel = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n".encode()
        self.head = f"POST {path} HTTP/1.1\r\nHost: {host_hdr}\r\n{extra}".encode()
        self.idle: list[Conn] = []
        self.addr = None
        self.opened = 0

    async def resolve(self) -> None:
        """Look up the address to connect to (the server's, or the proxy's)."""
        import socket

        infos = await self.loop.getaddrinfo(*self.connect_to, type=socket.SOCK_STREAM)
        self.addr = infos[0][4][:2]

    async def acquire(self) -> tuple[Conn, bool]:
        """An idle connection, or a new one: ``(connection, reused)``."""
        idle = self.idle
        while idle:
            c = idle.pop()
            if not c.closed and not c.transport.is_closing():
                return c, True
        host, port = self.addr
        if self.tunnel is None:
            _, c = await self.loop.create_connection(Conn, host, port, ssl=self.ssl,
                                                     server_hostname=self.host if self.ssl else None)
        else:
            tr, c = await self.loop.create_connection(Conn, host, port)
            try:
                await c.open_tunnel(self.tunnel)
                c.transport = await self.loop.start_tls(tr, c, self.ssl, server_hostname=self.host)
            except BaseException:
                c.close()
                raise
        self.opened += 1
        return c, False

    async def connect(self) -> None:
        """Open one connection and keep it idle (a server that cannot be reached fails here)."""
        c, _ = await self.acquire()
        self.idle.append(c)

    async def send(self, resp: Response, body: bytes, headers: bytes = b"") -> None:
        """Post ``body`` and wait for the whole response (fed to ``resp`` as it arrives);
        ``headers``: more header lines for this request only (``b"Name: value\r\n"`` each)."""
        msg = self.head + headers + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        for tries in (0, 1):
            c, reused = await self.acquire()
            resp.conn = c
            resp.fut = self.loop.create_future()
            c.resp = resp
            c.transport.write(msg)
            try:
                await resp.fut
            except Lost:
                if reused and tries == 0:
                    resp.reset()
                    resp.fut = None
                    continue
                raise
            except BaseException:  # a failed or abandoned answer leaves the connection unusable
                c.close()
                raise
            finally:
                if c.resp is resp:
                    c.resp = None
            if resp.keep_alive and resp.complete and not c.closed:
                self.idle.append(c)
            else:
                c.close()
            return

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()
