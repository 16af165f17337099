"""How many emulated replicas and streamed tokens a second one ``llmqueue emulate`` process holds,
and its token emission lateness (wall time a token is written minus the scheduled end of the step
that made it, from each replica's ``/emulator/stats``).

Each replica runs about 62 sequences at a time in steady state: a constant 30 ms step, requests of 16
prompt and 64 output tokens arriving as a Poisson stream at 32 req/s per replica (Little: about
62 running), so each replica writes 2,048 tokens a second, about 62 at each step's end. The load
generator is one process on the same machine (raw asyncio sockets, keep-alive, streamed
requests read to their end).

    python benchmarks/emulator_speed.py [--replicas 1,2,4] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from http_servers import _request  # noqa: E402  (one HTTP/1.1 exchange on a raw connection)

STEP, SEQS, OUT, RATE = 0.030, 64, 64, 32.0


async def load(ports: list, seconds: float, rate: float) -> int:
    """Poisson arrivals at ``rate`` req/s per port, each a streamed request of OUT tokens."""
    body = json.dumps({"prompt": list(range(100, 116)), "max_tokens": OUT, "stream": True}).encode()
    idle = {p: [] for p in ports}
    done = 0

    async def one(port):
        nonlocal done
        conn = idle[port].pop() if idle[port] else await asyncio.open_connection("127.0.0.1", port)
        await _request(*conn, body, True)
        idle[port].append(conn)
        done += 1

    async def stream(port, seed):
        rng = random.Random(seed)
        tasks = []
        t, end = time.perf_counter(), time.perf_counter() + seconds
        while t < end:
            t += rng.expovariate(rate)
            await asyncio.sleep(max(t - time.perf_counter(), 0))
            tasks.append(asyncio.ensure_future(one(port)))
        await asyncio.gather(*tasks)

    await asyncio.gather(*(stream(p, i) for i, p in enumerate(ports)))
    for conns in idle.values():
        for _, w in conns:
            w.close()
    return done


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=RATE, help="requests a second per replica")
    a = ap.parse_args()
    import httpx
    import uvloop

    from llmqueue.serve.launch import EmulatorProcess

    print(f"step {1e3 * STEP:g} ms, max_num_seqs {SEQS}, {OUT} output tokens, {a.rate:g} req/s per replica, "
          f"{a.seconds:g} s", flush=True)
    for n in (int(x) for x in a.replicas.split(",")):
        with EmulatorProcess("--replicas", str(n), "--step-time", str(STEP), "--max-num-seqs", str(SEQS),
                             "--capacity-tokens", "1048576", "--max-model-len", "4096") as emu:
            ports = [int(u.rsplit(":", 1)[1]) for u in emu.urls]
            t = time.perf_counter()
            done = uvloop.run(load(ports, a.seconds, a.rate))
            wall = time.perf_counter() - t
            stats = [httpx.get(u + "/emulator/stats", trust_env=False, timeout=30).json() for u in emu.urls]
        tokens = sum(s["tokens"] for s in stats)
        p50 = max(s["lateness_ms"]["p50"] for s in stats)
        p99 = max(s["lateness_ms"]["p99"] for s in stats)
        print(f"{n} replica(s): offered {n * a.rate * OUT:,.0f} tokens/s; {done} requests, {tokens} tokens in "
              f"{wall:.1f} s (arrivals for {a.seconds:g} s, then the drain); "
              f"lateness p50 {p50:.3f} ms, p99 {p99:.3f} ms (worst replica)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
