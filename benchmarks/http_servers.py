"""Choose the live layer's HTTP server by measurement: the same emulated answers served by three
candidates, side by side in one run on this machine.

Candidates (each one process, uvloop):
- ``serve.http``: llmqueue's core (asyncio Protocol + httptools), tokens written from timer callbacks;
- ``aiohttp``: aiohttp.web's low-level server, a task per streamed answer (``await resp.write``);
- ``granian``: granian's RSGI interface (Rust I/O, one worker), a task per streamed answer.

Loads (a client process on the same 2 cores, raw asyncio sockets, keep-alive):
- non-streamed: 32 connections in closed loop for ``--seconds``: requests/s;
- streamed: Poisson arrivals at ``--rate`` req/s, each answer 64 tokens due every 20 ms after the
  request (``rate x 64 / 1.28 s`` tokens a second in flight): the server's emission lateness
  (wall time a token is written minus its due time), p50/p99, from its own ``/stats``.

    python benchmarks/http_servers.py [--seconds 8] [--rate 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

TOKENS, GAP = 64, 0.020
EVENT = b'data: {"choices":[{"index":0,"text":" tok","finish_reason":null}]}\n\n'
BODY = json.dumps({"choices": [{"index": 0, "text": " tok" * 16, "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 4, "completion_tokens": 16}}).encode()
LATE: list = []


def _stats() -> bytes:
    import numpy as np

    lat = np.asarray(LATE) * 1e3
    return json.dumps({"tokens": len(lat), "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
                       "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None}).encode()


# -- the candidates -----------------------------------------------------------------------------

def serve_http(port: int) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from llmqueue.serve.http import HttpServer

    def handler(ex):
        if ex.path == "/stats":
            return ex.respond(200, _stats())
        if b'"stream": true' not in ex.body:
            return ex.respond(200, BODY)
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        ex.start_stream()

        def tick(i):
            if not ex.open:
                return
            ex.write(EVENT)
            LATE.append(time.perf_counter() - (t0 + (i + 1) * GAP))
            if i + 1 == TOKENS:
                ex.end(b"data: [DONE]\n\n")
            else:
                loop.call_later(t0 + (i + 2) * GAP - time.perf_counter(), tick, i + 1)

        loop.call_later(GAP, tick, 0)

    async def main():
        await HttpServer(handler).start("127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    import uvloop

    uvloop.run(main())


def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def handle(request):
        body = await request.read()
        if request.path == "/stats":
            return web.Response(body=_stats(), content_type="application/json")
        if b'"stream": true' not in body:
            return web.Response(body=BODY, content_type="application/json")
        t0 = time.perf_counter()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(TOKENS):
            await asyncio.sleep(t0 + (i + 1) * GAP - time.perf_counter())
            await resp.write(EVENT)
            LATE.append(time.perf_counter() - (t0 + (i + 1) * GAP))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main():
        runner = web.ServerRunner(web.Server(handle, access_log=None), handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    import uvloop

    uvloop.run(main())


async def rsgi_app(scope, proto):
    """The granian candidate (RSGI)."""
    body = await proto()
    if scope.path == "/stats":
        proto.response_bytes(200, [("content-type", "application/json")], _stats())
        return
    if b'"stream": true' not in body:
        proto.response_bytes(200, [("content-type", "application/json")], BODY)
        return
    t0 = time.perf_counter()
    tr = proto.response_stream(200, [("content-type", "text/event-stream")])
    for i in range(TOKENS):
        await asyncio.sleep(t0 + (i + 1) * GAP - time.perf_counter())
        await tr.send_bytes(EVENT)
        LATE.append(time.perf_counter() - (t0 + (i + 1) * GAP))
    await tr.send_bytes(b"data: [DONE]\n\n")


def start(kind: str, port: int) -> subprocess.Popen:
    here = os.path.dirname(os.path.abspath(__file__))
    if kind == "granian":
        argv = [sys.executable, "-m", "granian", "--interface", "rsgi", "--workers", "1", "--loop", "uvloop",
                "--port", str(port), "--no-ws", "--log-level", "warning", "http_servers:rsgi_app"]
    else:
        argv = [sys.executable, os.path.abspath(__file__), "--serve", kind, "--port", str(port)]
    p = subprocess.Popen(argv, cwd=here, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(200):
        try:
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{kind} did not start")


# -- the load -----------------------------------------------------------------------------------

async def _request(reader, writer, body: bytes, stream: bool) -> None:
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    head = await reader.readuntil(b"\r\n\r\n")
    if b"chunked" in head.lower():
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return
    n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(n)


async def closed_loop(port: int, seconds: float, conns: int = 32) -> float:
    done = 0
    end = time.perf_counter() + seconds
    body = json.dumps({"prompt": [1, 2, 3, 4], "max_tokens": 16}).encode()

    async def one():
        nonlocal done
        r, w = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < end:
            await _request(r, w, body, False)
            done += 1
        w.close()

    t = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(conns)))
    return done / (time.perf_counter() - t)


async def open_loop(port: int, seconds: float, rate: float) -> None:
    rng = random.Random(1)
    body = json.dumps({"prompt": [1, 2, 3, 4], "max_tokens": TOKENS, "stream": True}).encode()
    idle: list = []
    tasks = []

    async def one():
        conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
        await _request(*conn, body, True)
        idle.append(conn)

    t, end = time.perf_counter(), time.perf_counter() + seconds
    while t < end:
        t += rng.expovariate(rate)
        await asyncio.sleep(max(t - time.perf_counter(), 0))
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    for _, w in idle:
        w.close()


def get_stats(port: int) -> dict:
    import urllib.request

    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"http://127.0.0.1:{port}/stats") as r:
        return json.loads(r.read())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve")
    ap.add_argument("--port", type=int, default=18500)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rate", type=float, default=32.0)
    a = ap.parse_args()
    if a.serve:
        {"serve.http": serve_http, "aiohttp": serve_aiohttp}[a.serve](a.port)
        return 0
    import uvloop

    rows = []
    for i, kind in enumerate(("serve.http", "aiohttp", "granian")):
        port = a.port + i
        p = start(kind, port)
        try:
            rps = uvloop.run(closed_loop(port, a.seconds))
            uvloop.run(open_loop(port, a.seconds, a.rate))
            st = get_stats(port)
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()
        rows.append((kind, rps, st))
        print(f"{kind:11s} non-streamed {rps:8.0f} req/s | streamed {a.rate:g} req/s x {TOKENS} tokens: "
              f"{st['tokens']} tokens, lateness p50 {st['p50_ms']:.3f} ms, p99 {st['p99_ms']:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
