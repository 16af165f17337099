"""Routers: which replica takes an arriving request, decided from read-only views of the fleet.

A router gets a :class:`~llmqueue.cluster.view.PoolView` of the pool (``outstanding`` per replica,
``routable`` replicas, ``num_waiting(i)``, ``kv_blocks_free(i)``, ...) and returns the index of a
routable replica, or None to hold the request at the gateway (only the central router does). Queueing terms, for c identical replicas of one request at a time:

- :class:`Random`: each replica an independent M/M/1 fed a thinned Poisson stream (``lam / c``);
- :class:`RoundRobin`: each an E_c/M/1 (every c-th arrival);
- :class:`LeastOutstanding`: join the shortest queue (JSQ; ties to the lowest index);
- :class:`PowerOfTwo`: the shorter of two replicas drawn at random (the power of two choices);
- :class:`Central`: one queue at the gateway, a request dispatched only to a replica with a free
  sequence slot: exactly M/M/c (Erlang C) with ``max_num_seqs = 1``.

Mean response times order central <= JSQ <= power of two <= random. Three more route on the
state that makes an LLM replica unlike an M/M/1 server, its KV cache (:mod:`llmqueue.cluster.affinity`):

- :class:`~llmqueue.cluster.affinity.LeastKV`: join the replica with the most free KV blocks;
- :class:`~llmqueue.cluster.affinity.PrefixAffinity`: the prompt's leading prefix sticks to a
  replica (a prefix's requests meet its cached KV; service is shorter there), spilling to the least
  prefill backlog over a bound (consistent hashing with bounded loads, the load in prefill tokens);
- :class:`~llmqueue.cluster.affinity.Session`: sticky sessions (a conversation's turns stay on the
  replica of its first turn, under the same load bound).

To add one: a class with ``name``, ``central`` and ``route(request, view)``, registered in :data:`ROUTERS`.
"""

from __future__ import annotations

import numpy as np

from llmqueue.cluster.affinity import LeastKV, PrefixAffinity, Session
from llmqueue.errors import InputError


class Random:
    name = "random"
    central = False

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(23,)))

    def route(self, request, view) -> int:
        r = view.routable
        return r[int(self.rng.integers(len(r)))]


class RoundRobin:
    name = "round-robin"
    central = False

    def __init__(self, seed: int = 0):
        self.next = 0

    def route(self, request, view) -> int:
        r = view.routable
        i = r[self.next % len(r)]
        self.next += 1
        return i


class LeastOutstanding:
    name = "least-outstanding"
    central = False

    def __init__(self, seed: int = 0):
        pass

    def route(self, request, view) -> int:
        return view.least_outstanding()


class PowerOfTwo:
    name = "power-of-two"
    central = False

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(29,)))

    def route(self, request, view) -> int:
        r = view.routable
        if len(r) == 1:
            return r[0]
        a, b = (r[k] for k in self.rng.choice(len(r), 2, replace=False).tolist())
        out = view.outstanding
        return a if out[a] <= out[b] else b


class Central:
    """The gateway holds the queue (FCFS) and dispatches to a replica with a free sequence slot."""

    name = "central"
    central = True

    def __init__(self, seed: int = 0):
        pass

    def route(self, request, view) -> int | None:
        out, cap = view.outstanding, view.max_num_seqs
        free = [i for i in view.routable if out[i] < cap]
        return min(free, key=out.__getitem__) if free else None


ROUTERS = {r.name: r for r in (Random, RoundRobin, LeastOutstanding, PowerOfTwo, Central, LeastKV, PrefixAffinity,
                                Session)}
ROUTERS["jsq"] = LeastOutstanding


def router(name_or_router, seed: int = 0):
    """A router object by name (see :data:`ROUTERS`), or the object itself."""
    if not isinstance(name_or_router, str):
        return name_or_router
    cls = ROUTERS.get(name_or_router)
    if cls is None:
        raise InputError("router", f"unknown router {name_or_router!r}", f"choose one of: {', '.join(ROUTERS)}")
    return cls(seed)
