"""The replica contract: what a fleet, a gateway or an emulator may ask of one serving replica.

A replica is a server of the fleet's queueing network that keeps its own queue, KV cache and
schedule (vLLM's engine core). Whoever drives it sees only this contract, so a simulated replica
(:class:`~llmqueue.engine.fast.replica.Replica`, the fast path), the executable specification
(:class:`~llmqueue.engine.reference.ReferenceReplica`) and, later, a live engine behind HTTP are
interchangeable behind the same fleet and the same policies:

- ``submit(request, at=None)``: hand over a request that arrives at its ``arrival_time`` (or that a
  gateway dispatches at ``at``, its ``dispatch_time``); the replica sees it then.
- ``accept(request, at=None) -> bool``: hand over a request arriving *now*, while the driver steps
  the replica on a shared clock. A replica whose step is in progress takes it into its queue at
  once (its next step sees it); the result says whether the replica was idle, so that the driver
  must call ``step_at(now)`` to start it.
- ``step_at(t) -> float``: advance to ``t`` (the steps that end by ``t`` are applied; a step that
  starts at ``t`` begins and stays in progress) and return the next time the replica changes
  state (``inf``: none).
- ``next_event_time() -> float``: that time, without advancing.
- ``load() -> ReplicaLoad``: the numbers a router, an admission rule or an autoscaler may read.
- ``count_waiting(class_name) -> int``: the waiting requests of one class (a fleet's per-class
  queue depth).
- ``drain() -> list``: the replica's work ends (a failure, the end of a run): every request it holds
  is handed back, running first, then queued, then handed over and not yet seen.
- ``run(horizon)``: run alone until idle or ``horizon``; ``steps_taken``; ``step_chunks()`` and
  ``timeseries_chunks()``: its step and sampled records as column chunks; ``tier_account()``: its
  host KV tier's account (None without a tier); ``close()``: drop the driver's callbacks (the
  replica is not used again).

Policies never receive a replica: they read a :class:`ReplicaLoad` per replica, through a pool's
view (:class:`~llmqueue.cluster.view.PoolView`), which a simulator fills from ``load()`` and a
live gateway from each engine's ``/metrics`` (with the sample's age).
"""

from __future__ import annotations

from typing import Protocol


class ReplicaLoad:
    """One replica's load at a moment, as numbers.

    ``num_waiting``: requests queued (``Q_i``: waiting, preempted, or handed over and not yet seen
    by the scheduler); ``num_running``: requests in the running batch (``b_i``); ``kv_blocks_free``
    of ``kv_blocks_total`` KV blocks (cached blocks no request references count as free, as in
    vLLM's free queue); ``busy``: a step is in progress; ``age_s``: how old the numbers are (0 for
    a simulated replica, the scrape's age for a live one)."""

    __slots__ = ("num_waiting", "num_running", "kv_blocks_free", "kv_blocks_total", "busy", "age_s")

    def __init__(self, num_waiting: int, num_running: int, kv_blocks_free: int, kv_blocks_total: int,
                 busy: bool = False, age_s: float = 0.0):
        self.num_waiting = num_waiting
        self.num_running = num_running
        self.kv_blocks_free = kv_blocks_free
        self.kv_blocks_total = kv_blocks_total
        self.busy = busy
        self.age_s = age_s

    @property
    def kv_usage(self) -> float:
        """Share of the KV blocks in use (0..1)."""
        return 1.0 - self.kv_blocks_free / self.kv_blocks_total if self.kv_blocks_total else 0.0

    def __eq__(self, other) -> bool:
        return isinstance(other, ReplicaLoad) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self) -> str:
        return "ReplicaLoad(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


class ReplicaAPI(Protocol):
    """The contract (see the module docstring); both simulated replicas implement it."""

    steps_taken: int

    def submit(self, request, at: float | None = None) -> None: ...

    def accept(self, request, at: float | None = None) -> bool: ...

    def step_at(self, t: float) -> float: ...

    def next_event_time(self) -> float: ...

    def load(self) -> ReplicaLoad: ...

    def count_waiting(self, class_name: str) -> int: ...

    def drain(self) -> list: ...

    def run(self, horizon: float = ...) -> None: ...

    def step_chunks(self) -> list: ...

    def timeseries_chunks(self) -> list: ...

    def tier_account(self) -> dict | None: ...

    def close(self) -> None: ...
