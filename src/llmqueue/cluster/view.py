"""``PoolView``: what a policy may read of one pool's replicas at the moment it decides.

Numbers only, read-only, and the same whoever fills it: the fleet simulator, or a live gateway
in front of real engines. The driver keeps each replica's outstanding count (requests it holds,
waiting plus running: ``N_i`` in queueing terms) and its prefill backlog as requests are handed
over and leave, so join-the-shortest-queue costs one pass over a list. The rest of a replica's
state comes as a :class:`~llmqueue.engine.api.ReplicaLoad` (queued, running, free KV blocks),
read when a policy asks: from the simulated replica's ``load()``, or from the last scrape of a
live engine's ``/metrics`` (with its age). Only the replicas in ``routable`` serve (not
provisioning, failed or draining).
"""

from __future__ import annotations

from collections.abc import Callable, Sized

from llmqueue.engine.api import ReplicaLoad


class PoolView:
    """Replica slots ``0..n-1`` of one pool. ``outstanding[i]``: requests replica ``i`` holds;
    ``pending_prefill[i]``: prompt tokens of those without a first token yet (its prefill backlog);
    ``routable``: the slots that take requests now (ascending); ``load(i)``: replica ``i``'s
    :class:`~llmqueue.engine.api.ReplicaLoad`; ``max_num_seqs``: sequence slots per replica;
    ``kv_blocks_total``: KV blocks per replica; ``replicas_waiting()``: requests queued at the
    pool's replicas, all of them (``sum_i Q_i``; by default summed over the loads: a driver that
    keeps the sum as counts change gives it here, and an admission rule reads one number, not
    ``n`` loads)."""

    __slots__ = ("name", "outstanding", "routable", "max_num_seqs", "kv_blocks_total", "block_size",
                 "hash_block_tokens", "pending_prefill", "load", "held", "no_token", "replicas_waiting")

    def __init__(self, name: str, outstanding: list, routable: list, *, load: Callable[[int], ReplicaLoad],
                 max_num_seqs: int, kv_blocks_total: int, block_size: int, hash_block_tokens: int = 512,
                 pending_prefill: list | None = None, held: Sized = (), no_token: dict | None = None,
                 replicas_waiting: Callable[[], int] | None = None):
        self.name = name
        self.outstanding = outstanding
        self.pending_prefill = pending_prefill if pending_prefill is not None else [0] * len(outstanding)
        self.routable = routable
        self.load = load
        self.max_num_seqs = max_num_seqs
        self.kv_blocks_total = kv_blocks_total
        self.block_size = block_size
        self.hash_block_tokens = hash_block_tokens
        self.held = held          # the pool's gateway queue (read for its length)
        self.no_token = no_token if no_token is not None else {}  # request -> arrival time, oldest first
        self.replicas_waiting = replicas_waiting if replicas_waiting is not None else self._waiting_from_loads

    # -- the pool as a whole (what admission rules and autoscalers read) ----------------------------
    def serving(self) -> int:
        """Replicas taking requests (``c`` now)."""
        return len(self.routable)

    def queue_depth(self) -> int:
        """Requests waiting in the pool (``Q``): its gateway queue and every serving or draining
        replica's queue."""
        return len(self.held) + self.replicas_waiting()

    def _waiting_from_loads(self) -> int:
        load = self.load  # a replica holding no request has none waiting
        return sum(load(i).num_waiting for i, n in enumerate(self.outstanding) if n)

    def queue_age(self, t: float) -> float:
        """Age at ``t`` of the oldest request the pool holds without a first token (0: none): the
        wait of the head of its queue, the leading indicator of a queue that grows."""
        for a in self.no_token.values():
            return t - a
        return 0.0

    @property
    def n(self) -> int:
        return len(self.outstanding)

    def num_waiting(self, i: int) -> int:
        """Requests replica ``i`` holds that are not running (queued, or handed over and not yet
        seen by its scheduler)."""
        return self.load(i).num_waiting

    def num_running(self, i: int) -> int:
        """Requests in replica ``i``'s running batch."""
        return self.load(i).num_running

    def kv_blocks_free(self, i: int) -> int:
        return self.load(i).kv_blocks_free

    def kv_usage(self, i: int) -> float:
        """Share of replica ``i``'s KV blocks in use (0..1)."""
        return 1.0 - self.load(i).kv_blocks_free / self.kv_blocks_total

    def least_outstanding(self) -> int:
        """The routable replica holding the fewest requests (ties to the lowest index)."""
        out = self.outstanding
        r = self.routable
        if len(r) == len(out):
            return out.index(min(out))
        return min(r, key=out.__getitem__)
