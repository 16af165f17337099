"""The gateway's process: start, serve until SIGINT or SIGTERM, drain, exit 130 with the records
on disk."""

from __future__ import annotations

import asyncio
import signal
import sys

INTERRUPTED = 130


def serve_gateway(fleet, backends: dict, *, host: str, port: int, drain_timeout_s: float = 30.0, on_ready=None,
                  **kw) -> int:
    """Run a :class:`~llmqueue.serve.gateway.Gateway` until a signal; returns the exit code (130:
    stopped by a signal, after the requests in flight finished or ``drain_timeout_s`` passed)."""
    from llmqueue.serve.gateway import Gateway

    async def main() -> int:
        gw = Gateway(fleet, backends, **kw)
        try:
            await gw.start(host, port)
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
