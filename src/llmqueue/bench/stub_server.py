"""A minimal OpenAI-compatible streaming server for tests and client benchmarks (loopback only).

It answers like vLLM's OpenAI server, without a model:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: streams ``max_tokens`` (chat:
  ``max_completion_tokens`` or ``max_tokens``) chunks of one token each as server-sent events
  (chat: after a role-only chunk, as vLLM sends it),
  then, with ``stream_options.include_usage``, a usage chunk (``choices: []``) and ``data: [DONE]``.
  The prompt length is the number of token ids of a ``prompt: [ids]`` (a string prompt or chat
  messages count one token per whitespace-separated word). ``stream: false`` gets one JSON body.
- ``GET /health`` (200), ``GET /v1/models``, ``GET /metrics`` (a few ``vllm:`` gauges and
  counters in Prometheus text format), ``GET /stats`` (the stub's own counters as JSON).

Timing: the first token is sent ``first_token_delay_s`` after the request arrives, each further
token ``token_delay_s`` after the previous one (0: all at once, written in one piece).
A batch-dependent engine, for ``llmqueue profile`` to measure: ``prefill_token_s`` adds that many
seconds per prompt token to the first token's delay (a prefill line), and ``decode_steps``
(``"1:0.020,2:0.024,4:0.030"``: running requests -> seconds) makes each further token come
``step(n)`` after the previous one was due, ``n`` the requests streaming at that moment,
interpolated linearly between the table's points (flat outside them). Tokens are due on a
schedule (due times add up; the event loop's lateness does not), so the gaps a client sees
average ``step(n)`` exactly.

Fault injection (deterministic for a given ``seed`` and request order): ``reject_fraction`` of
requests are answered ``reject_status`` (429 or 503, vLLM-style error JSON); ``malformed_fraction``
of streams carry a malformed JSON chunk after their first token; ``max_model_len`` answers 400 with
vLLM's "maximum context length" message when prompt + max_tokens exceed it; ``die_after`` ends the
process abruptly (``os._exit``) when request ``die_after + 1`` arrives, resetting every open
connection, as a crashed server does; ``cached_tokens`` reports that many prompt tokens as
``usage.prompt_tokens_details.cached_tokens``.

Hostile or broken servers (``misbehave``, for ``misbehave_fraction`` of the streamed requests,
counted in ``/stats`` as ``misbehaved``; the request is still answered and counted ``completed``):

- ``negative-usage``: ``usage.completion_tokens`` is -1;
- ``huge-usage``: ``usage.completion_tokens`` is 2**70 (beyond a 64-bit integer);
- ``usage-type``: the usage counts are strings (``"completion_tokens": "12"``);
- ``choices-type``: ``choices`` is an object, not a list, in every token chunk;
- ``long-line``: after the first token, one ``data:`` line of ``long_line_bytes`` bytes;
- ``over-max-tokens``: three times ``max_tokens`` tokens (and usage says so).

Event-stream framing (valid by the WHATWG server-sent events format, which vLLM does not use):
``sse_line_end`` ends lines with ``lf`` (default), ``crlf`` or a bare ``cr``; ``sse_ids`` adds an
``id:`` line after each ``data:`` line.

What reached it (``/stats``, for the client's credential tests): ``authorized`` counts the
requests that carried an ``Authorization`` header, ``proxied`` those whose request line named a
whole URL (as a forward proxy receives them: the stub answers them itself, standing in for the
proxy and the server behind it), ``x_headers`` the ``X-*`` headers by name.
``tls_cert``/``tls_key`` (PEM files) serve HTTPS instead.

It needs ``aiohttp``, a test dependency (``pip install llmqueue[test]``), imported only when a
stub starts: ``llmqueue`` itself runs without it. Run it in a subprocess with :class:`StubServer` (a free port on 127.0.0.1)::

    with StubServer(token_delay_s=0.001, reject_fraction=0.1) as srv:
        run_bench(srv.url, srv.model, requests)

or ``python -m llmqueue.bench.stub_server --port 0 --token-delay 0.001``, which prints
``llmqueue-stub listening on http://127.0.0.1:PORT`` when ready. Only loopback addresses are
accepted as ``--host``.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
import weakref
from dataclasses import asdict, dataclass, fields

from llmqueue.errors import InputError

READY_PREFIX = "llmqueue-stub listening on "
_MAX_BODY = 64 * 1024 * 1024
MISBEHAVIOURS = ("negative-usage", "huge-usage", "usage-type", "choices-type", "long-line", "over-max-tokens")
_LINE_ENDS = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}


@dataclass
class StubConfig:
    """What the stub answers and which faults it injects (see the module docstring)."""

    model: str = "stub-model"
    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    reject_fraction: float = 0.0
    reject_status: int = 429
    malformed_fraction: float = 0.0
    max_model_len: int | None = None
    die_after: int | None = None
    cached_tokens: int = 0
    seed: int = 0
    misbehave: str | None = None
    misbehave_fraction: float = 1.0
    long_line_bytes: int = 9 << 20
    sse_line_end: str = "lf"
    sse_ids: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    decode_steps: str | None = None
    prefill_token_s: float = 0.0

    def __post_init__(self):
        self.step_table = _step_table(self.decode_steps) if self.decode_steps else None
        for name in ("token_delay_s", "first_token_delay_s", "reject_fraction", "malformed_fraction",
                     "prefill_token_s"):
            v = float(getattr(self, name))
            if not v >= 0:
                raise InputError(name, f"must be >= 0 (got {v!r})")
            setattr(self, name, v)
        for name in ("reject_fraction", "malformed_fraction"):
            if getattr(self, name) > 1:
                raise InputError(name, f"must be in [0, 1] (got {getattr(self, name)!r})")
        if self.misbehave is not None and self.misbehave not in MISBEHAVIOURS:
            raise InputError("misbehave", f"unknown misbehaviour {self.misbehave!r}",
                             f"use one of {list(MISBEHAVIOURS)}")
        self.misbehave_fraction = float(self.misbehave_fraction)
        if not 0 <= self.misbehave_fraction <= 1:
            raise InputError("misbehave_fraction", f"must be in [0, 1] (got {self.misbehave_fraction!r})")
        if self.sse_line_end not in _LINE_ENDS:
            raise InputError("sse_line_end", f"unknown line end {self.sse_line_end!r}", "use lf, crlf or cr")
        if self.reject_status not in (400, 408, 429, 500, 502, 503, 504):
            raise InputError("reject_status", f"unsupported status {self.reject_status}",
                             "use 429 or 503 (or 400/408/500/502/504)")


def _step_table(text: str) -> tuple[list[float], list[float]]:
    """``"1:0.02,4:0.03"`` -> ``([1, 4], [0.02, 0.03])`` (running requests ascending, seconds > 0)."""
    ns, ts = [], []
    try:
        for part in str(text).split(","):
            n, t = part.split(":")
            ns.append(float(n))
            ts.append(float(t))
    except ValueError:
        raise InputError("decode_steps", f"cannot parse {text!r}", "e.g. 1:0.020,2:0.024,4:0.030") from None
    if not all(t > 0 for t in ts) or not all(n >= 1 for n in ns) or ns != sorted(set(ns)):
        raise InputError("decode_steps", f"{text!r}: running counts must be >= 1 and ascending, seconds > 0")
    return ns, ts


def step_seconds(table, n: int) -> float:
    """The table's step time at ``n`` running requests (linear between points, flat outside)."""
    ns, ts = table
    if n <= ns[0]:
        return ts[0]
    for i in range(1, len(ns)):
        if n <= ns[i]:
            return ts[i - 1] + (ts[i] - ts[i - 1]) * (n - ns[i - 1]) / (ns[i] - ns[i - 1])
    return ts[-1]


def aiohttp_web():
    """``aiohttp.web``, which only the stub needs: a test dependency (``llmqueue[test]``), imported
    here, when a stub is started; without it one line says how to install it."""
    try:
        from aiohttp import web
    except ImportError:
        raise InputError("aiohttp", "the stub server needs aiohttp, which is not installed",
                         "pip install llmqueue[test]") from None
    return web


def _loopback(host: str) -> str:
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise InputError("host", f"{host!r} is not a loopback address",
                         "the stub serves tests only: use 127.0.0.1, ::1 or localhost")
    return host


# -- the server ------------------------------------------------------------------------------

class _Stub:
    """The aiohttp application's state: configuration, counters and the fault draws."""

    def __init__(self, cfg: StubConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.stats = {"requests": 0, "completed": 0, "rejected": 0, "too_long": 0, "malformed": 0,
                      "misbehaved": 0, "authorized": 0, "proxied": 0, "x_headers": {}, "client_gone": 0,
                      "running": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.created = int(time.time())
        self.peers: weakref.WeakSet = weakref.WeakSet()  # open connections seen (for "connections")
        self.connections = 0
        m = json.dumps(cfg.model)
        # Chunk templates (vLLM's field order); %s: id, text/delta, finish_reason.
        self._cmpl = ('data: {"id":"cmpl-%s","object":"text_completion","created":' + str(self.created)
                      + ',"model":' + m + ',"choices":[{"index":0,"text":" tok","logprobs":null,'
                      '"finish_reason":%s,"stop_reason":null}],"usage":null}\n\n')
        self._chat = ('data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":'
                      + str(self.created) + ',"model":' + m + ',"choices":[{"index":0,"delta":%s,'
                      '"logprobs":null,"finish_reason":%s}],"usage":null}\n\n')
        self._usage = ('data: {"id":"%s","object":"%s","created":' + str(self.created) + ',"model":' + m
                       + ',"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,'
                       '"completion_tokens":%d,"prompt_tokens_details":%s}}\n\n')

    # one SSE event per token
    def token_chunk(self, chat: bool, rid: str, i: int, n: int) -> str:
        fin = '"length"' if i == n - 1 else "null"
        if chat:
            return self._chat % (rid, '{"content":" tok"}', fin)
        return self._cmpl % (rid, fin)

    def role_chunk(self, rid: str) -> str:
        """vLLM's chat streams open with the role and empty content, with the first token."""
        return self._chat % (rid, '{"role":"assistant","content":""}', "null")

    def usage_chunk(self, chat: bool, rid: str, prompt: int, out: int, bad: str | None = None) -> str:
        cached = min(self.cfg.cached_tokens, prompt)
        details = '{"cached_tokens":%d}' % cached if cached else "null"
        obj = "chat.completion.chunk" if chat else "text_completion"
        if bad in ("negative-usage", "huge-usage", "usage-type"):
            c = {"negative-usage": -1, "huge-usage": 2 ** 70, "usage-type": str(out)}[bad]
            p = str(prompt) if bad == "usage-type" else prompt
            return "data: " + json.dumps({"id": rid, "object": obj, "choices": [], "usage": {
                "prompt_tokens": p, "completion_tokens": c, "total_tokens": None}}) + "\n\n"
        return self._usage % (("chatcmpl-" if chat else "cmpl-") + rid, obj, prompt, prompt + out, out, details)

    def stream(self, chat: bool, rid: str, n_in: int, n_out: int, malformed: bool, usage: bool,
               bad: str | None) -> list[str]:
        """The events of one streamed answer: one piece per token (the first with the chat role
        chunk and, for some faults, the broken event after it), then usage and ``[DONE]``."""
        n = 3 * n_out if bad == "over-max-tokens" else n_out
        parts = [self.token_chunk(chat, rid, i, n) for i in range(n)]
        if bad == "choices-type":
            parts = [p.replace('"choices":[', '"choices":{"list":[').replace('}],"usage"', '}]},"usage"')
                     for p in parts]
        if chat and parts:
            parts[0] = self.role_chunk(rid) + parts[0]
        if malformed and parts:
            parts[0] += 'data: {"id": "broken", "choices": [{"text": \n\n'
        if bad == "long-line" and parts:
            parts[0] += 'data: {"pad": "' + "x" * self.cfg.long_line_bytes + '"}\n\n'
        if usage:
            parts.append(self.usage_chunk(chat, rid, n_in, n, bad))
        parts.append("data: [DONE]\n\n")
        cfg = self.cfg
        if cfg.sse_ids:
            parts = [p.replace("\n\n", "\nid: %s\n\n" % rid) for p in parts]
        if cfg.sse_line_end != "lf":
            eol = _LINE_ENDS[cfg.sse_line_end]
            parts = [p.replace("\n", eol) for p in parts]
        return parts


def _prompt_len(body: dict, chat: bool) -> int:
    if chat:
        n = 0
        for msg in body.get("messages") or []:
            c = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(c, str):
                n += len(c.split())
            elif isinstance(c, list):
                n += sum(len(p.get("text", "").split()) for p in c if isinstance(p, dict))
        return n
    p = body.get("prompt")
    if isinstance(p, list):
        if p and isinstance(p[0], list):
            return len(p[0])
        if p and isinstance(p[0], str):
            return len(p[0].split())
        return len(p)
    return len(p.split()) if isinstance(p, str) else 0


def _error(web, status: int, message: str, kind: str):
    body = json.dumps({"object": "error", "message": message, "type": kind, "param": None, "code": status})
    return web.Response(status=status, text=body, content_type="application/json")


def _routes(cfg: StubConfig) -> dict:
    """``{(method, path): handler}`` of the stub (see the module docstring)."""
    web = aiohttp_web()

    st = _Stub(cfg)
    stats = st.stats

    def seen(request) -> None:
        """Count what reached the stub: a key, a proxy's request line, custom headers."""
        h = request.headers
        if "Authorization" in h:
            stats["authorized"] += 1
        if not request.raw_path.startswith("/"):
            stats["proxied"] += 1
        for k in h:
            if k[:2].lower() == "x-":
                x = stats["x_headers"]
                x[k.lower()] = x.get(k.lower(), 0) + 1

    async def generate(request, chat: bool):
        stats["requests"] += 1
        seen(request)
        tr = request.transport
        if tr is not None:
            try:
                if tr not in st.peers:
                    st.peers.add(tr)
                    st.connections += 1
            except TypeError:  # uvloop's TLS transports take no weak reference: not counted
                pass
        if cfg.die_after is not None and stats["requests"] > cfg.die_after:
            os._exit(17)  # a crash: no clean shutdown, open connections are reset
        n_req = stats["requests"]
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(web, 400, "request body is not JSON", "BadRequestError")
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        n_out = int(max_tokens) if max_tokens is not None else 16
        n_in = _prompt_len(body, chat)
        if cfg.max_model_len is not None and n_in + n_out > cfg.max_model_len:
            stats["too_long"] += 1
            return _error(web, 400, f"This model's maximum context length is {cfg.max_model_len} tokens. "
                          f"However, you requested {n_in + n_out} tokens ({n_in} in the messages, "
                          f"{n_out} in the completion). Please reduce the length of the messages or "
                          "completion.", "BadRequestError")
        if cfg.reject_fraction and st.rng.random() < cfg.reject_fraction:
            stats["rejected"] += 1
            return _error(web, cfg.reject_status, "the server is overloaded; retry later",
                          "ServiceUnavailableError" if cfg.reject_status == 503 else "RateLimitError")
        malformed = bool(cfg.malformed_fraction) and st.rng.random() < cfg.malformed_fraction
        rid = str(n_req)
        stats["prompt_tokens"] += n_in
        if not body.get("stream"):
            return await _whole(web, request, st, chat, rid, n_in, n_out)
        bad = None
        if cfg.misbehave is not None and st.rng.random() < cfg.misbehave_fraction:
            bad = cfg.misbehave
            stats["misbehaved"] += 1
        if malformed:
            stats["malformed"] += 1
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        parts = st.stream(chat, rid, n_in, n_out, malformed, usage, bad)
        n_tok = 3 * n_out if bad == "over-max-tokens" else n_out
        stats["running"] += 1
        try:
            table = cfg.step_table
            first = cfg.first_token_delay_s + cfg.prefill_token_s * n_in
            if cfg.token_delay_s == 0 and first == 0 and table is None:
                stats["generation_tokens"] += n_tok
                stats["completed"] += 1
                return web.Response(body="".join(parts).encode(), content_type="text/event-stream")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
            await resp.prepare(request)
            try:
                if first:
                    await asyncio.sleep(first)
                loop = asyncio.get_running_loop()
                due = loop.time()
                for i in range(n_tok):
                    if i and table is not None:
                        due += step_seconds(table, stats["running"])
                        wait = due - loop.time()
                        if wait > 0:
                            await asyncio.sleep(wait)
                    elif i and cfg.token_delay_s:
                        await asyncio.sleep(cfg.token_delay_s)
                    await resp.write(parts[i].encode())
                    stats["generation_tokens"] += 1
                for p in parts[n_tok:]:
                    await resp.write(p.encode())
                await resp.write_eof()
            except ConnectionResetError:  # the client went away (closed the stream): stop, as vLLM aborts
                stats["client_gone"] += 1
                return resp
            stats["completed"] += 1
            return resp
        finally:
            stats["running"] -= 1

    async def completions(request):
        return await generate(request, False)

    async def chat_completions(request):
        return await generate(request, True)

    async def health(request):
        return web.Response(text="")

    async def models(request):
        seen(request)
        return web.json_response({"object": "list", "data": [
            {"id": cfg.model, "object": "model", "created": st.created, "owned_by": "llmqueue-stub",
             "max_model_len": cfg.max_model_len}]})

    async def metrics(request):
        lbl = '{model_name="%s"}' % cfg.model
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{lbl} {float(stats['running'])}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{lbl} 0.0",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{lbl} 0.0",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{lbl} {float(stats['prompt_tokens'])}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{lbl} {float(stats['generation_tokens'])}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{finished_reason="length",model_name="{cfg.model}"}} '
            f"{float(stats['completed'])}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def get_stats(request):
        return web.json_response({**stats, "connections": st.connections, "config": asdict(cfg)})

    return {("POST", "/v1/completions"): completions, ("POST", "/v1/chat/completions"): chat_completions,
            ("GET", "/health"): health, ("GET", "/v1/models"): models, ("GET", "/metrics"): metrics,
            ("GET", "/stats"): get_stats}


def make_app(cfg: StubConfig):
    """The stub as an ``aiohttp.web.Application`` (for aiohttp's test client and runners)."""
    web = aiohttp_web()

    app = web.Application(client_max_size=_MAX_BODY)
    for (method, path), handler in _routes(cfg).items():
        app.router.add_route(method, path, handler)
    return app


def make_server(cfg: StubConfig):
    """The stub as a low-level ``aiohttp.web.Server``: the same handlers without the application's
    router and middleware machinery (less CPU per request, which matters when the stub shares the
    machine's cores with the client it serves)."""
    web = aiohttp_web()

    routes = _routes(cfg)

    async def dispatch(request):
        handler = routes.get((request.method, request.path))
        if handler is None:
            if any(p == request.path for _, p in routes):
                return web.Response(status=405, text="method not allowed")
            return web.Response(status=404, text="not found")
        return await handler(request)

    def request_factory(message, payload, protocol, writer, task):
        return web.BaseRequest(message, payload, protocol, writer, task, asyncio.get_running_loop(),
                               client_max_size=_MAX_BODY)

    return web.Server(dispatch, request_factory=request_factory, access_log=None)


async def _whole(web, request, st: _Stub, chat: bool, rid: str, n_in: int, n_out: int):
    """``stream: false``: one JSON answer after all tokens."""
    cfg = st.cfg
    per = step_seconds(cfg.step_table, st.stats["running"] + 1) if cfg.step_table else cfg.token_delay_s
    delay = cfg.first_token_delay_s + cfg.prefill_token_s * n_in + per * max(n_out - 1, 0)
    if delay:
        await asyncio.sleep(delay)
    st.stats["generation_tokens"] += n_out
    st.stats["completed"] += 1
    text = " tok" * n_out
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
              if chat else {"index": 0, "text": text, "finish_reason": "length"})
    cached = min(cfg.cached_tokens, n_in)
    return web.json_response({
        "id": ("chatcmpl-" if chat else "cmpl-") + rid, "object": "chat.completion" if chat else "text_completion",
        "created": st.created, "model": cfg.model, "choices": [choice],
        "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out,
                  "prompt_tokens_details": {"cached_tokens": cached} if cached else None}})


def serve(cfg: StubConfig, host: str = "127.0.0.1", port: int = 0, *, use_uvloop: bool = True) -> None:
    """Serve until SIGTERM/SIGINT; prints the ready line (with the bound port) on stdout."""
    web = aiohttp_web()

    _loopback(host)

    async def main():
        runner = web.ServerRunner(make_server(cfg), handle_signals=False)
        await runner.setup()
        ctx = None
        if cfg.tls_cert:
            import ssl

            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True, ssl_context=ctx)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        print(f"{READY_PREFIX}{'https' if ctx else 'http'}://{shown}:{bound}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    if use_uvloop:
        try:
            import uvloop

            uvloop.run(main())
            return
        except ImportError:
            pass
    asyncio.run(main())


# -- the subprocess helper -------------------------------------------------------------------

class StubServer:
    """The stub in a subprocess on a free loopback port; a context manager.

    Keyword arguments are :class:`StubConfig` fields. ``url`` is ``http://127.0.0.1:PORT``;
    ``stop()`` ends it with SIGTERM, ``kill()`` with SIGKILL (a crash); ``stats()`` reads its
    counters.
    """

    def __init__(self, host: str = "127.0.0.1", *, start_timeout_s: float = 30.0, use_uvloop: bool = True,
                 **options):
        self.config = StubConfig(**options)
        self.host = _loopback(host)
        self.start_timeout_s = start_timeout_s
        self.use_uvloop = use_uvloop
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def argv(self) -> list[str]:
        c = self.config
        a = [sys.executable, "-m", "llmqueue.bench.stub_server", "--host", self.host, "--port", "0",
             "--model", c.model, "--token-delay", repr(c.token_delay_s),
             "--first-token-delay", repr(c.first_token_delay_s), "--reject-fraction", repr(c.reject_fraction),
             "--reject-status", str(c.reject_status), "--malformed-fraction", repr(c.malformed_fraction),
             "--cached-tokens", str(c.cached_tokens), "--seed", str(c.seed),
             "--misbehave-fraction", repr(c.misbehave_fraction), "--long-line-bytes", str(c.long_line_bytes),
             "--sse-line-end", c.sse_line_end, "--prefill-token-delay", repr(c.prefill_token_s)]
        if c.decode_steps:
            a += ["--decode-steps", c.decode_steps]
        if c.misbehave is not None:
            a += ["--misbehave", c.misbehave]
        if c.sse_ids:
            a.append("--sse-ids")
        if c.tls_cert:
            a += ["--tls-cert", c.tls_cert, "--tls-key", c.tls_key or c.tls_cert]
        if c.max_model_len is not None:
            a += ["--max-model-len", str(c.max_model_len)]
        if c.die_after is not None:
            a += ["--die-after", str(c.die_after)]
        if not self.use_uvloop:
            a.append("--no-uvloop")
        return a

    def start(self) -> "StubServer":
        import tempfile

        aiohttp_web()  # its subprocess needs aiohttp: say so here, in one line

        # stderr to a file, never a pipe nobody reads: a full pipe would stall the server
        self._stderr = tempfile.TemporaryFile(mode="w+t")
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     start_new_session=True)
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + self.start_timeout_s
        line = ""
        while time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                line = self.proc.stdout.readline()
                if line.startswith(READY_PREFIX) or not line:
                    break
            if self.proc.poll() is not None:
                break
        sel.close()
        if not line.startswith(READY_PREFIX):
            err = ""
            if self.proc.poll() is not None:
                self._stderr.seek(0)
                err = ((self._stderr.read() or "").strip().splitlines()[-1:] or [""])[0]
            self.kill()
            raise RuntimeError(f"the stub server did not start: {err or 'no ready line'}")
        self.url = line[len(READY_PREFIX):].strip()
        import atexit

        atexit.register(self.stop)  # never outlive the process that started it
        return self

    def stats(self) -> dict:
        """The stub's counters (asked directly: never through a proxy the environment names)."""
        import urllib.request

        handlers = [urllib.request.ProxyHandler({})]
        if self.config.tls_cert:
            import ssl

            ctx = ssl.create_default_context(cafile=self.config.tls_cert)
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        with urllib.request.build_opener(*handlers).open(self.url + "/stats", timeout=10) as r:
            return json.loads(r.read())

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_pipes()

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipes()

    def _close_pipes(self):
        for f in (self.proc.stdout, getattr(self, "_stderr", None)):
            if f is not None and not f.closed:
                f.close()

    def stderr_text(self) -> str:
        """What the server wrote on stderr so far (its log)."""
        f = getattr(self, "_stderr", None)
        if f is None or f.closed:
            return ""
        f.flush()
        f.seek(0)
        return f.read()

    def __enter__(self) -> "StubServer":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmqueue.bench.stub_server", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: a free port (printed on the ready line)")
    ap.add_argument("--model", default="stub-model")
    ap.add_argument("--token-delay", type=float, default=0.0, dest="token_delay_s")
    ap.add_argument("--first-token-delay", type=float, default=0.0, dest="first_token_delay_s")
    ap.add_argument("--prefill-token-delay", type=float, default=0.0, dest="prefill_token_s",
                    help="seconds per prompt token added to the first token's delay")
    ap.add_argument("--decode-steps", default=None, help="running requests -> seconds between tokens, "
                    "e.g. 1:0.020,2:0.024,4:0.030")
    ap.add_argument("--reject-fraction", type=float, default=0.0)
    ap.add_argument("--reject-status", type=int, default=429)
    ap.add_argument("--malformed-fraction", type=float, default=0.0)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--die-after", type=int, default=None)
    ap.add_argument("--cached-tokens", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--misbehave", choices=MISBEHAVIOURS, default=None)
    ap.add_argument("--misbehave-fraction", type=float, default=1.0)
    ap.add_argument("--long-line-bytes", type=int, default=9 << 20)
    ap.add_argument("--sse-line-end", choices=tuple(_LINE_ENDS), default="lf")
    ap.add_argument("--sse-ids", action="store_true")
    ap.add_argument("--tls-cert", default=None, help="PEM certificate: serve HTTPS")
    ap.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    ap.add_argument("--no-uvloop", action="store_true")
    a = ap.parse_args(argv)
    names = {f.name for f in fields(StubConfig)}
    try:
        cfg = StubConfig(**{k: v for k, v in vars(a).items() if k in names})
        _loopback(a.host)
        aiohttp_web()
    except InputError as e:
        print(f"stub_server: error: {e}", file=sys.stderr)
        return 2
    serve(cfg, a.host, a.port, use_uvloop=not a.no_uvloop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
