"""The gateway's process: start, serve until SIGINT or SIGTERM, drain, exit 130 with the records
on disk."""

from __future__ import annotations

import asyncio
import signal
import sys

INTERRUPTED = 130
#: the young generation's collection threshold in the gateway's process (Python's default: 700)
GC_GEN0 = 50_000


def tune_gc() -> None:
    """The collector for a request path: the objects made at start-up are frozen out of every
    collection, and the young generation is collected every ``GC_GEN0`` allocations instead of 700.
    A decision allocates a few dozen small objects; at the default a collection landed in one
    decision in a few hundred and set its p99 (64 replicas: 100-200 us against a 35 us median,
    58 us with this; benchmarks/gateway_overhead.py)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0, 20, 20)


def serve_gateway(fleet, backends: dict, *, host: str, port: int, drain_timeout_s: float = 30.0, on_ready=None,
                  **kw) -> int:
    """Run a :class:`~llmqueue.serve.gateway.Gateway` until a signal; returns the exit code (130:
    stopped by a signal, after the requests in flight finished or ``drain_timeout_s`` passed)."""
    from llmqueue.serve.gateway import Gateway

    async def main() -> int:
        gw = Gateway(fleet, backends, **kw)
        try:
            await gw.start(host, port)
            tune_gc()
            if on_ready is not None:
                on_ready(gw.url)
            sys.stdout.flush()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            left = await gw.drain(drain_timeout_s)
            if left:
                print(f"llmqueue gateway: {left} request(s) still in flight after {drain_timeout_s:g} s were cut",
                      file=sys.stderr)
            return INTERRUPTED
        finally:
            await gw.close()

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())
