"""Execution backends for plans: run independent simulations serially, on local processes or on Ray.

Every backend answers ``map(fn, tasks)`` with ``(index, result)`` pairs as tasks finish (any
order); ``fn`` must be a module-level function and tasks picklable. Results do not depend on the
backend: a task carries its own seed, so the same task gives the same numbers in the parent
process, in a worker process or on a Ray worker.

- :class:`SerialBackend` (``serial``): one task after another in this process.
- :class:`LocalBackend` (``local``, the default): a :class:`concurrent.futures.ProcessPoolExecutor`
  with ``workers`` processes (default: every core, ``os.cpu_count()``).
- :class:`RayBackend` (``ray``): one Ray task per simulation (``num_cpus=1``). With ``address``
  it joins that cluster (``ray.init(address=...)``, e.g. ``"auto"`` or ``"ray://host:10001"``);
  without, it starts a local Ray instance with ``workers`` CPUs (default: every core) and stops it
  when the backend is closed. Ray is an optional dependency (``pip install 'llmqueue[ray]'``),
  imported only when this backend is used. Worker nodes need llmqueue installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

from llmqueue.errors import InputError

BACKENDS = ("local", "serial", "ray")


class Backend:
    """Base class: ``name``, ``workers`` and ``map``; a context manager that closes itself."""

    name = "?"
    workers = 1

    def map(self, fn: Callable, tasks: Iterable) -> Iterator[tuple[int, object]]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def describe(self) -> str:
        return f"{self.name} ({self.workers} worker{'s' if self.workers != 1 else ''})"


class SerialBackend(Backend):
    """Run tasks one after another in this process."""

    name = "serial"

    def map(self, fn, tasks):
        for i, t in enumerate(tasks):
            yield i, fn(t)


class LocalBackend(Backend):
    """A pool of local worker processes (``ProcessPoolExecutor``); ``workers`` defaults to all cores.

    The pool starts lazily on the first ``map`` and is reused by later ones until ``close``.
    """

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = _workers(workers)
        self._pool = None

    def map(self, fn, tasks):
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        tasks = list(tasks)
        if not tasks:
            return
        if self._pool is None:
            # Import the heavy modules once here: forked workers inherit them instead of each
            # paying ~1 CPU-second of imports on the same cores.
            import importlib

            for mod in ("numpy", "scipy.stats", "pyarrow", "llmqueue.simulate", "llmqueue.metrics.summary"):
                try:
                    importlib.import_module(mod)
                except ImportError:  # pragma: no cover - optional pieces
                    pass
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_ignore_sigint)
        futures = {self._pool.submit(fn, t): i for i, t in enumerate(tasks)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield futures[f], f.result()
        except KeyboardInterrupt:
            self._stop()
            raise
        finally:
            for f in pending:
                f.cancel()

    def _stop(self) -> None:
        """Ctrl-C: end the workers now (their points are lost; finished ones were handed back)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for p in list((getattr(pool, "_processes", None) or {}).values()):
            p.terminate()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayBackend(Backend):
    """Ray tasks, one per simulation, on a local Ray instance or the cluster at ``address``."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise InputError("backend", "ray is not installed",
                             "pip install 'llmqueue[ray]' (or pip install ray), or use --backend local") from None
        self._ray = ray
        self.address = address
        self._started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=_workers(workers), include_dashboard=False, log_to_driver=False,
                         object_store_memory=256 * 1024 * 1024, configure_logging=False)
                self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = cpus if address or workers is None else min(_workers(workers), cpus)
        self._remote = {}

    def map(self, fn, tasks):
        ray = self._ray
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = {remote.remote(t): i for i, t in enumerate(tasks)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for r in done:
                    yield refs[r], ray.get(r)
        finally:
            for r in pending:
                ray.cancel(r, force=True)

    def describe(self) -> str:
        where = f"cluster at {self.address}" if self.address else "local instance"
        return f"ray ({where}, {self.workers} CPUs)"

    def close(self):
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent (which ends them): no traceback from each of them."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _workers(workers: int | None) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError("workers", f"must be a whole number >= 1 (got {workers!r})")
    return workers


def get_backend(backend: str | Backend = "local", *, workers: int | None = None,
                address: str | None = None) -> Backend:
    """A backend by name (``local``, ``serial``, ``ray``), or ``backend`` itself if it is one."""
    if isinstance(backend, Backend):
        return backend
    name = str(backend).strip().lower()
    if address and name != "ray":
        raise InputError("address", "only the ray backend joins a cluster", "add --backend ray, or drop --address")
    if name == "serial":
        if workers not in (None, 1):
            raise InputError("workers", "the serial backend runs one simulation at a time",
                             "drop --workers, or use --backend local")
        return SerialBackend()
    if name == "local":
        return LocalBackend(workers)
    if name == "ray":
        return RayBackend(workers, address)
    raise InputError("backend", f"unknown backend {backend!r}", f"choose one of: {', '.join(BACKENDS)}")
