"""Starting emulated engines: N replicas in one process (:func:`serve_forever`, what ``llmqueue
emulate`` runs), and ``llmqueue emulate`` in a subprocess (:class:`EmulatorProcess`, for tests and
benchmarks: free loopback ports, read from its ready lines)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

READY_MARK = "llmqueue emulate: replica "


@dataclass
class EngineSpec:
    """One replica to serve: its engine, step-time model, served names, seed, faults, port and log."""

    engine: object
    step_time: object
    names: tuple
    seed: int = 0
    faults: object = None
    port: int = 0
    log_file: str | None = None
    gpu_memory_utilization: float = 0.9

    @property
    def max_model_len(self) -> int:
        """The served context limit: the engine's ``max_model_len``, else its KV cache."""
        return self.engine.max_model_len or self.engine.capacity_tokens


def _settings(spec: EngineSpec) -> dict:
    """The engine settings as vLLM's ``non-default args`` line states them."""
    e = spec.engine
    return {"served_model_name": list(spec.names), "max_num_seqs": e.max_num_seqs,
            "max_num_batched_tokens": e.max_num_batched_tokens, "block_size": e.block_size,
            "max_model_len": spec.max_model_len, "enable_chunked_prefill": e.enable_chunked_prefill,
            "enable_prefix_caching": e.enable_prefix_caching, "num_gpu_blocks_override": e.num_kv_blocks,
            "gpu_memory_utilization": spec.gpu_memory_utilization, "seed": spec.seed,
            "step_time": getattr(spec.step_time, "spec", str(spec.step_time))}


async def start_engines(specs, *, host: str = "127.0.0.1", iteration_details: bool = False) -> list:
    """Start one :class:`~llmqueue.serve.emulator.EmulatedEngine` per spec on one clock (their
    time 0 is now); returns them listening."""
    from llmqueue.serve.emulator import EmulatedEngine
    from llmqueue.serve.iteration_log import StepLog

    t0 = time.perf_counter()
    t0_epoch = time.time()
    engines = []
    for s in specs:
        stream = open(s.log_file, "a", encoding="utf-8") if s.log_file else None
        log = StepLog(stream, t0_epoch=t0_epoch, iteration_details=iteration_details)
        eng = EmulatedEngine(s.engine, s.step_time, names=s.names, max_model_len=s.max_model_len, seed=s.seed,
                             faults=s.faults, log=log, t0=t0, gpu_memory_utilization=s.gpu_memory_utilization)
        engines.append(await eng.start(host, s.port))
        log.startup(_settings(s), s.engine.capacity_tokens)  # once it listens (a refused address logs nothing)
    return engines


def serve_forever(specs, *, host: str = "127.0.0.1", iteration_details: bool = False, on_ready=None) -> None:
    """Serve the replicas until SIGINT or SIGTERM; ``on_ready(i, url)`` as each listens."""

    async def main():
        engines = await start_engines(specs, host=host, iteration_details=iteration_details)
        import gc

        gc.collect()
        gc.freeze()  # what exists now is never scanned again: shorter collector pauses while serving
        for i, e in enumerate(engines):
            if on_ready is not None:
                on_ready(i, e.url)
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for e in engines:
            await e.close()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


class EmulatorProcess:
    """``llmqueue emulate ARGS --port 0`` in a subprocess; a context manager. ``urls``: one per
    replica (from its ready lines); ``stop()`` ends it with SIGTERM."""

    def __init__(self, *args: str, start_timeout_s: float = 60.0, log_path=None):
        self.args = [str(a) for a in args]
        self.start_timeout_s = start_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.urls: list[str] = []

    @property
    def url(self) -> str:
        return self.urls[0]

    def start(self) -> "EmulatorProcess":
        import selectors
        import tempfile

        argv = [sys.executable, "-m", "llmqueue.cli.main", *self._command()]
        self._err = open(self.log_path, "w") if self.log_path else tempfile.TemporaryFile(mode="w+t")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._err, bufsize=0,
                                     start_new_session=True)
        want = math.inf  # until the first ready line says how many
        fd = self.proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + self.start_timeout_s
        buf = b""
        while time.monotonic() < deadline and self.proc.poll() is None and len(self.urls) < want:
            if not sel.select(timeout=0.1):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                got = self._ready(line.decode("utf-8", "replace"))
                if got is not None:
                    self.urls.append(got[0])
                    want = got[1]
        sel.close()
        if len(self.urls) < want:
            self.stop()
            raise RuntimeError(f"llmqueue {self._command()[0]} did not start: {self.stderr_text()[-2000:]}")
        return self

    def _command(self) -> list:
        """The command line after ``llmqueue``."""
        return ["emulate", *self.args, *(() if "--port" in self.args else ("--port", "0"))]

    @staticmethod
    def _ready(text: str):
        """``(url, how many to wait for)`` of a ready line, else None."""
        if text.startswith(READY_MARK):  # "replica I of N serving MODEL at URL"
            return text.rsplit(" at ", 1)[1].strip(), int(text[len(READY_MARK):].split()[2])
        return None

    def stderr_text(self) -> str:
        f = self._err
        if f is None or f.closed:
            return ""
        f.flush()
        if self.log_path:
            return open(self.log_path).read()
        f.seek(0)
        return f.read()

    def stop(self, timeout_s: float = 10.0) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p is not None and p.stdout is not None:
            p.stdout.close()

    def __enter__(self) -> "EmulatorProcess":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False



class GatewayProcess(EmulatorProcess):
    """``llmqueue gateway ARGS --listen 127.0.0.1:0`` in a subprocess; ``url``: where it listens;
    ``stop()`` sends SIGTERM (it drains, then exits 130)."""

    def _command(self) -> list:
        return ["gateway", *self.args, *(() if "--listen" in self.args else ("--listen", "127.0.0.1:0"))]

    @staticmethod
    def _ready(text: str):
        mark = "llmqueue gateway: listening on "
        if text.startswith(mark):
            return text[len(mark):].split()[0], 1
        return None
