"""What the gateway adds: llmqueue gateway beside nginx and LiteLLM's proxy, each in front of the
same fast local stub, side by side in one run on this machine (issue 35, "Performance").

Targets (one process each; the stub, the proxy and the client share the machine's cores):
- ``direct``: the stub itself (serve.http, the project's server core, in its own process): every
  answer written at once (a streamed one: ``--chunks`` events, then usage and ``[DONE]``, a chunk
  each: the head and the first event in one send, the rest in a second; ``--stub-sends each``: one
  send an event, whose burst of 65 sends, about 0.3 ms of the stub's CPU, delays whichever process
  shares its core: on two cores, the proxy or the client);
- ``gateway``: ``llmqueue gateway`` with one pool of one replica (least-outstanding), its records
  and decisions written to a temporary run folder as in use;
- ``nginx``: a plain reverse proxy (``proxy_buffering off``, HTTP/1.1 keep-alive upstream), when
  ``nginx`` is on PATH;
- ``litellm``: LiteLLM's proxy (``litellm --config``, an ``openai/`` model at the stub), when the
  ``--litellm`` executable exists (installed in its own virtualenv, not a dependency).

Figures, each per target:
- added TTFT against ``direct``, unloaded: ``--unloaded`` streamed requests one after another on one
  kept-alive connection, p50 and p99 of send to first ``data:`` event (the added figure: the
  target's percentile less direct's);
- p99 TTFT at ``--rate`` streamed requests a second (Poisson, open loop, ``llmqueue bench``'s
  client, ``--seconds``), and its excess over direct's;
- throughput: closed loop on ``--connections`` kept-alive connections for ``--seconds``,
  non-streamed and streamed (``--chunks`` events a request): requests a second;
- the policy decision (classify + admit + route, with the decision log the live gateway keeps) with
  64 replicas, in-process on the gateway's own objects: p50 / p99 microseconds.

    python benchmarks/gateway_overhead.py [--seconds 8] [--rate 500] [--quick] [--out results.json]
        [--litellm /work/.litellm-venv/bin/litellm] [--stub-sends once|each]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
MODEL = "m"
KEY = "sk-llmqueue-bench"   # LiteLLM refuses to start without a master key; every target gets it


# -- the stub -------------------------------------------------------------------------------------

def serve_stub(port: int, chunks: int, each: bool = False) -> None:
    """The upstream every target forwards to: answers at once (a streamed one: ``chunks`` events,
    the first with the head in one send, the rest in a second; ``each``: one send an event)."""
    sys.path.insert(0, str(SRC))
    from llmqueue.serve.http import HttpServer

    event = (b'data: {"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" tok",'
             b'"finish_reason":null}]}\n\n')
    tail = (b'data: {"id":"c","object":"text_completion","model":"m","choices":[],"usage":{"prompt_tokens":4,'
            b'"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n' % (chunks, chunks + 4))
    whole = json.dumps({"id": "c", "object": "text_completion", "model": MODEL,
                        "choices": [{"index": 0, "text": " tok" * 16, "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 4, "completion_tokens": 16, "total_tokens": 20}}).encode()
    rest = [event] * (chunks - 1) + [tail]
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
    metrics = (b'vllm:num_requests_running{model_name="m"} 0.0\nvllm:num_requests_waiting{model_name="m"} 0.0\n'
               b'vllm:kv_cache_usage_perc{model_name="m"} 0.0\n')

    def handle(ex):
        if ex.path in ("/v1/completions", "/v1/chat/completions"):
            if b'"stream":true' in ex.body.replace(b" ", b""):
                ex.start_stream(200, first=event)  # the first token's event with the head: one send
                if each:
                    for _ in range(chunks - 1):
                        ex.write(event)
                    ex.end(tail)
                else:
                    ex.end_chunks(rest)  # the other events (a chunk each) and the end: one send
            else:
                ex.respond(200, whole)
        elif ex.path == "/v1/models":
            ex.respond(200, models)
        elif ex.path == "/metrics":
            ex.respond(200, metrics, "text/plain")
        else:
            ex.respond(200, b"{}")

    async def main():
        srv = HttpServer(handle, max_connections=1 << 16)
        await srv.start("127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    import uvloop

    uvloop.run(main())


# -- processes ------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, path: str = "/health", timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200") or path == "/":
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nothing answered {path} on port {port} within {timeout:g} s")


class Targets:
    """Start the stub and every proxy available; ``ports``: target name -> port."""

    def __init__(self, chunks: int, litellm: str | None, work: Path, stub_each: bool = False):
        self.procs: list = []
        self.ports: dict = {}
        self.notes: list = []
        self.work = work
        stub = free_port()
        self._spawn([sys.executable, __file__, "--serve-stub", str(stub), "--chunks", str(chunks),
                     *(["--stub-sends", "each"] if stub_each else [])], "stub")
        wait_http(stub)
        self.ports["direct"] = stub
        self._gateway(stub)
        self._nginx(stub)
        self._litellm(stub, litellm)

    def _spawn(self, cmd, name, **kw):
        log = open(self.work / f"{name}.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def _gateway(self, stub: int) -> None:
        import yaml

        sc = self.work / "one.yaml"
        sc.write_text(yaml.safe_dump({"name": "overhead", "workload": {"arrival": "poisson:1", "prompt": "fixed:4",
                                                                       "output": "fixed:16"},
                                      "deployment": {"capacity_tokens": 1 << 24, "step_time": "0.02",
                                                     "max_num_seqs": 4096,
                                                     "pools": [{"name": "p", "replicas": 1,
                                                                "router": "least-outstanding"}]},
                                      "run": {"duration_s": 10}}))
        port = free_port()
        exe = shutil.which("llmqueue") or str(Path(sys.executable).parent / "llmqueue")
        self._spawn([exe, "gateway", "--scenario", str(sc), "--backend", f"p=http://127.0.0.1:{stub}",
                     "--listen", f"127.0.0.1:{port}", "--out", str(self.work / "gw-run")], "gateway")
        wait_http(port)
        self.ports["gateway"] = port

    def _nginx(self, stub: int) -> None:
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if nginx is None:
            self.notes.append("nginx: not installed (apt-get install nginx)")
            return
        port = free_port()
        d = self.work / "nginx"
        (d / "logs").mkdir(parents=True, exist_ok=True)
        (d / "nginx.conf").write_text(f"""
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  upstream stub {{ server 127.0.0.1:{stub}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
""")
        self._spawn([nginx, "-p", str(d), "-c", str(d / "nginx.conf")], "nginx")
        wait_http(port)
        self.ports["nginx"] = port

    def _litellm(self, stub: int, exe: str | None) -> None:
        if not exe or not Path(exe).exists():
            self.notes.append(f"litellm: no executable at {exe} (pip install 'litellm[proxy]' in a venv)")
            return
        import yaml

        cfg = self.work / "litellm.yaml"
        cfg.write_text(yaml.safe_dump({"model_list": [{"model_name": MODEL, "litellm_params": {
            "model": f"openai/{MODEL}", "api_base": f"http://127.0.0.1:{stub}/v1", "api_key": "none"}}]}))
        port = free_port()
        env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_MASTER_KEY": KEY}
        self._spawn([exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                    "litellm", env=env)
        try:
            wait_http(port, "/health/liveliness", timeout=180)
        except RuntimeError as e:
            self.notes.append(f"litellm: {e} (see {self.work / 'litellm.log'})")
            return
        self.ports["litellm"] = port

    def close(self) -> None:
        import signal

        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


# -- the client: raw sockets, keep-alive -----------------------------------------------------------

def _request(stream: bool) -> bytes:
    body = json.dumps({"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 16, "stream": stream}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))


async def _answer(reader, stream: bool) -> float | None:
    """Read one answer; returns the perf_counter time of the first ``data:`` event (streamed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    first = None
    if b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if first is None and b"data:" in data:
                first = time.perf_counter()
            if size == 0:
                return first
    n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
    body = await reader.readexactly(n)
    if stream and first is None and b"data:" in body:
        first = time.perf_counter()
    return first


async def unloaded_ttft(port: int, n: int) -> np.ndarray:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = _request(True)
    out = []
    for k in range(n + 20):
        t0 = time.perf_counter()
        writer.write(req)
        try:
            first = await _answer(reader, True)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            continue
        if k >= 20:  # warm-up: connections, caches
            out.append(first - t0)
        await asyncio.sleep(0.002)
    writer.close()
    return np.asarray(out)


async def closed_loop(port: int, conns: int, seconds: float, stream: bool) -> float:
    req = _request(stream)
    done = 0
    stop = time.perf_counter() + seconds

    async def worker():
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(req)
            try:
                await _answer(reader, stream)
            except (asyncio.IncompleteReadError, ConnectionError):  # the proxy ended the keep-alive: a new one
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            done += 1
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    return done / (time.perf_counter() - t0)


def open_loop_p99(port: int, rate: float, seconds: float) -> dict:
    sys.path.insert(0, str(SRC))
    from llmqueue.bench.client import run_bench
    from llmqueue.workload import Workload

    reqs = Workload(f"poisson:{rate}", prompt="fixed:4", output="fixed:16").generate(seed=1, duration=seconds)
    res = run_bench(f"http://127.0.0.1:{port}", MODEL, reqs, seed=1, api_key=KEY)
    s = res.summary
    return {"p50_ttft_ms": s.get("median_ttft_ms"), "p99_ttft_ms": s.get("p99_ttft_ms"),
            "completed": s.get("completed"), "send_lag_p99_ms": (s.get("client_check") or {}).get("lag_p99_ms")}


# -- the decision, in-process ---------------------------------------------------------------------

def decision_us(replicas: int = 64, n: int = 20000) -> dict:
    """classify + lane + admit (the gateway rules) + route, as Gateway._completion runs them, on a
    pool of ``replicas`` with a gateway rule set (a rate limit, a queue bound) and the decision log
    writing every decision to a file, as in use."""
    sys.path.insert(0, str(SRC))
    import yaml

    from llmqueue.cli.gateway_cmd import fleet_of
    from llmqueue.engine.request import Request
    from llmqueue.serve.gateway import Gateway
    from llmqueue.serve.gateway_run import tune_gc

    out = {}
    for router in ("least-outstanding", "power-of-two"):
        d = Path(tempfile.mkdtemp())
        sc = d / "s.yaml"
        sc.write_text(yaml.safe_dump({"name": "d", "workload": {"arrival": "poisson:1", "classes": [
            {"name": "chat", "share": 0.5, "prompt": "fixed:100", "output": "fixed:10"},
            {"name": "batch", "share": 0.5, "prompt": "fixed:100", "output": "fixed:10"}]},
            "deployment": {"capacity_tokens": 1 << 20, "step_time": "0.02",
                           "pools": [{"name": "p", "replicas": replicas, "router": router}],
                           "gateway": {"rate_limits": {"batch": {"rate": 1e9, "burst": 1e9}}, "max_queue_depth": 8}},
            "run": {"duration_s": 10}}))
        fleet, classes = fleet_of(str(sc))
        gw = Gateway(fleet, {"p": [f"http://127.0.0.1:{1 + i}" for i in range(replicas)]}, classes=classes,
                     out_dir=None)
        from llmqueue.serve.gateway_records import GatewayRecords

        gw.records = GatewayRecords(d / "run", gw.t0_epoch)   # decisions written as in use
        pool = gw.pools["p"]
        rng = np.random.default_rng(0)
        for i in range(replicas):
            pool.outstanding[i] = int(rng.integers(0, 8))

        class Ex:
            headers = {"x-request-class": "batch", "x-tenant": "t1"}

        ex = Ex()
        tune_gc()   # as the gateway's process does once it listens
        times = np.empty(n)
        for k in range(n):
            t0 = time.perf_counter_ns()
            cls = gw._class(ex)
            tenant = gw._tenant(ex)
            r = Request(request_id=k, arrival_time=gw.now(), num_prompt_tokens=100, max_tokens=10, class_name=cls,
                        priority=0, seq=k)
            gw.tenants[r] = tenant
            lane, pname = fleet.lane_of(cls, 100)
            p = gw.pools[pname]
            view, why = gw.rules.decide(r, p.view, gw.views, r.arrival_time)
            i = p.router.route(r, view)
            times[k] = (time.perf_counter_ns() - t0) / 1e3
            gw.tenants.pop(r, None)
            if k % 512 == 0:
                gw.records.flush()
        gw.records.close()
        out[router] = {"p50_us": float(np.percentile(times[1000:], 50)), "p99_us": float(np.percentile(times[1000:], 99)),
                       "replica": int(i)}
    return out


# -- the run --------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--unloaded", type=int, default=400)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--stub-sends", choices=("once", "each"), default="once",
                    help="the stub sends a streamed answer's events after the first in one send (once), or one "
                         "send an event (each: its burst of sends competes for the CPU with the proxy on a small "
                         "machine)")
    ap.add_argument("--litellm", default="/work/.litellm-venv/bin/litellm")
    ap.add_argument("--quick", action="store_true", help="a short smoke: 1 s loads, 50 unloaded requests")
    ap.add_argument("--only", default=None, help="comma-separated targets (direct is always measured)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--serve-stub", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_stub is not None:
        return serve_stub(a.serve_stub, a.chunks, each=a.stub_sends == "each")
    if a.quick:
        a.seconds, a.unloaded, a.rate = 1.0, 50, min(a.rate, 100.0)
    work = Path(tempfile.mkdtemp(prefix="gw-overhead-"))
    res: dict = {"machine": f"{os.cpu_count()} cores", "seconds": a.seconds, "rate": a.rate, "chunks": a.chunks,
                 "stub_sends": a.stub_sends,
                 "connections": a.connections, "targets": {}}
    res["decision_64_replicas"] = decision_us(64, 2000 if a.quick else 20000)
    t = Targets(a.chunks, None if a.quick else a.litellm, work, stub_each=a.stub_sends == "each")
    res["notes"] = t.notes
    try:
        names = list(t.ports) if not a.only else ["direct", *[x for x in a.only.split(",") if x in t.ports]]
        for name in names:
            port = t.ports[name]
            u = asyncio.run(unloaded_ttft(port, a.unloaded)) * 1e3
            row = {"unloaded_ttft_p50_ms": float(np.percentile(u, 50)), "unloaded_ttft_p99_ms": float(np.percentile(u, 99))}
            row["nonstreamed_rps"] = asyncio.run(closed_loop(port, a.connections, a.seconds, False))
            row["streamed_rps"] = asyncio.run(closed_loop(port, a.connections, a.seconds, True))
            row["open_loop"] = open_loop_p99(port, a.rate, a.seconds)
            res["targets"][name] = row
            print(f"{name:8s} unloaded TTFT p50 {row['unloaded_ttft_p50_ms']:.3f} ms p99 "
                  f"{row['unloaded_ttft_p99_ms']:.3f} ms; {row['nonstreamed_rps']:,.0f} req/s whole, "
                  f"{row['streamed_rps']:,.0f} streamed; at {a.rate:g} req/s TTFT p99 "
                  f"{row['open_loop']['p99_ttft_ms']:.3f} ms", flush=True)
    finally:
        t.close()
    d = res["targets"]["direct"]
    for name, row in res["targets"].items():
        row["added_unloaded_p50_ms"] = row["unloaded_ttft_p50_ms"] - d["unloaded_ttft_p50_ms"]
        row["added_unloaded_p99_ms"] = row["unloaded_ttft_p99_ms"] - d["unloaded_ttft_p99_ms"]
        row["added_loaded_p99_ms"] = row["open_loop"]["p99_ttft_ms"] - d["open_loop"]["p99_ttft_ms"]
    print("\ntarget    added TTFT p50 / p99 (unloaded)   added p99 at rate   whole req/s   streamed req/s")
    for name, row in res["targets"].items():
        print(f"{name:8s}  {row['added_unloaded_p50_ms']:7.3f} / {row['added_unloaded_p99_ms']:7.3f} ms"
              f"          {row['added_loaded_p99_ms']:8.3f} ms   {row['nonstreamed_rps']:11,.0f}   "
              f"{row['streamed_rps']:13,.0f}")
    for r, v in res["decision_64_replicas"].items():
        print(f"decision (classify + admit + route, 64 replicas, {r}): p50 {v['p50_us']:.1f} us, p99 {v['p99_us']:.1f} us")
    for n in res["notes"]:
        print("note:", n)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
        print("results written to", a.out)


if __name__ == "__main__":
    main()
