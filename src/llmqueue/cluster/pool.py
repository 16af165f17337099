"""``PoolRuntime``: one pool's replica slots while a fleet runs.

A slot holds one replica at a time and is in one state: ``up`` (serving: the router may pick it),
``provisioning`` (ordered by the autoscaler, serving after its cold start), ``draining`` (taking
no new requests, leaving when empty), ``down`` (failed, back after its repair time) or ``gone``.
The pool keeps per replica its outstanding count ``N_i`` (requests it holds) and per class the
requests it holds, so that routers and the gateway read them in O(1), and the requests that have
no first token yet in arrival order (the queue age a gateway can see).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

import numpy as np

from llmqueue.cluster.fairness import FairQueue
from llmqueue.cluster.routers import router as make_router
from llmqueue.cluster.view import PoolView

UP, PROVISIONING, DRAINING, DOWN, GONE = "up", "provisioning", "draining", "down", "gone"


def pool_router(spec, k: int, seed: int):
    """A new router for pool ``spec`` (index ``k`` in the fleet), seeded as the fleet seeds it."""
    return make_router(spec.router, seed + 7919 * k if k else seed)


class PoolRuntime:
    """The replicas of :class:`~llmqueue.cluster.spec.Pool` ``spec`` (index ``k`` in the fleet)."""

    def __init__(self, spec, k: int, seed: int, make_replica, new_id, hash_block_tokens: int = 512,
                 fair_share: dict | None = None):
        self.spec = spec
        self.k = k
        self.name = spec.name
        self.config = spec.config
        c = spec.config
        self.max_total = min(c.max_model_len or c.capacity_tokens, c.capacity_tokens)  # longest request it can run
        self.seed = seed
        self._make = make_replica          # (pool runtime, slot, incarnation) -> Replica
        self._new_id = new_id              # () -> the next fleet-wide replica id
        self.reps: list = []
        self.state: list = []
        self.outstanding: list = []
        self.pending_prefill: list = []    # per slot: prompt tokens of the requests it holds without a first token
        self.incarnation: list = []        # replicas made for the slot so far
        self.gid: list = []                # the fleet-wide replica id of each slot (records' ``replica``)
        self.routable: list = []
        self.retired: list = []            # (slot, replica) of replicas that left (faults, scale-down)
        self.key: list = []                # the time of each slot's scheduled event (inf: none)
        self.by_class: Counter = Counter() # requests the pool's replicas hold, per class
        # requests the pool's gateway queue holds (central, or none routable): FIFO, or weighted fair
        # between tenants by tokens when the gateway gives shares (``fair``: then charge it)
        self.fair: Any = FairQueue(fair_share) if fair_share else None
        self.held: Any = self.fair if fair_share else deque()
        self.no_token: dict = {}           # request -> arrival time, for requests without a first token yet
        self.router = pool_router(spec, k, seed)
        self.central = getattr(self.router, "central", False)
        c = self.config
        self.view = PoolView(self.name, self.outstanding, self.routable, load=self.load,
                             max_num_seqs=c.max_num_seqs, kv_blocks_total=c.num_kv_blocks, block_size=c.block_size,
                             hash_block_tokens=hash_block_tokens, pending_prefill=self.pending_prefill,
                             held=self.held, no_token=self.no_token)
        self.last_scale = -np.inf        # the autoscaler's last change (scale-down waits a cooldown after it)
        self.watch: Any = None           # an ArrivalWatch when a p99_ttft autoscaler reads the pool
        for _ in range(spec.replicas):
            self.add_slot(UP)

    # -- slots -------------------------------------------------------------------------------------
    def add_slot(self, state: str) -> int:
        i = len(self.reps)
        self.gid.append(self._new_id())
        self.state.append(state)
        self.outstanding.append(0)
        self.pending_prefill.append(0)
        self.incarnation.append(0)
        self.key.append(np.inf)
        self.reps.append(None)
        if state == UP:
            self.reps[i] = self._make(self, i, 0)
            self.incarnation[i] = 1
        if state == UP:
            self.routable.append(i)
        return i

    def bring_up(self, i: int) -> None:
        """Slot ``i`` starts serving with a fresh (empty) replica."""
        if self.reps[i] is None:
            self.reps[i] = self._make(self, i, self.incarnation[i])
            self.incarnation[i] += 1
        self.state[i] = UP
        if i not in self.routable:
            self.routable.append(i)
            self.routable.sort()

    def take_out(self, i: int, state: str) -> None:
        """Slot ``i`` stops taking requests (``draining``, ``down`` or ``gone``)."""
        self.state[i] = state
        if i in self.routable:
            self.routable.remove(i)

    def retire(self, i: int) -> None:
        """Slot ``i``'s replica leaves (its records are kept)."""
        if self.reps[i] is not None:
            self.retired.append((i, self.reps[i]))
            self.reps[i] = None
        self.key[i] = np.inf

    # -- what the view reads (policies read the view: self.view) ------------------------------------
    def count(self, state: str) -> int:
        return sum(1 for s in self.state if s == state)

    def load(self, i: int):
        """Slot ``i``'s replica's :class:`~llmqueue.engine.api.ReplicaLoad` (what the view reads)."""
        return self.reps[i].load()

    def count_waiting(self, class_name: str) -> int:
        """Requests of one class waiting in the pool: the replicas' queues and the gateway queue."""
        return (sum(1 for r in self.held if r.class_name == class_name)
                + sum(r.count_waiting(class_name) for r in self.reps if r is not None))


    def all_replicas(self) -> list:
        """(slot, replica) of every replica this pool ran, live and retired."""
        return [*self.retired, *((i, r) for i, r in enumerate(self.reps) if r is not None)]
