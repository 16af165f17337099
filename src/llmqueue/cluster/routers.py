"""Routers: which replica takes an arriving request, decided from read-only views of the fleet.

A router gets ``views``, one per replica (``num_waiting``, ``num_running``, ``kv_blocks_free``,
``max_num_seqs``), and returns an index, or None to hold the request at the gateway (only the
central router does). Queueing terms, for c identical replicas of one request at a time:

- :class:`Random`: each replica an independent M/M/1 fed a thinned Poisson stream (``lam / c``);
- :class:`RoundRobin`: each an E_c/M/1 (every c-th arrival);
- :class:`LeastOutstanding`: join the shortest queue (JSQ; ties to the lowest index);
- :class:`PowerOfTwo`: the shorter of two replicas drawn at random (the power of two choices);
- :class:`Central`: one queue at the gateway, a request dispatched only to a replica with a free
  sequence slot: exactly M/M/c (Erlang C) with ``max_num_seqs = 1``.

Mean response times order central <= JSQ <= power of two <= random. To add one: a class with
``name`` and ``route(request, views)``, registered in :data:`ROUTERS`.
"""

from __future__ import annotations

import numpy as np

from llmqueue.errors import InputError


def outstanding(v) -> int:
    """Requests a replica holds: waiting plus running."""
    return v["num_waiting"] + v["num_running"]


class Random:
    name = "random"
    central = False

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(23,)))

    def route(self, request, views) -> int:
        return int(self.rng.integers(len(views)))


class RoundRobin:
    name = "round-robin"
    central = False

    def __init__(self, seed: int = 0):
        self.next = 0

    def route(self, request, views) -> int:
        i = self.next % len(views)
        self.next += 1
        return i


class LeastOutstanding:
    name = "least-outstanding"
    central = False

    def __init__(self, seed: int = 0):
        pass

    def route(self, request, views) -> int:
        return min(range(len(views)), key=lambda i: outstanding(views[i]))


class PowerOfTwo:
    name = "power-of-two"
    central = False

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(29,)))

    def route(self, request, views) -> int:
        if len(views) == 1:
            return 0
        a, b = self.rng.choice(len(views), 2, replace=False).tolist()
        return a if outstanding(views[a]) <= outstanding(views[b]) else b


class Central:
    """The gateway holds the queue (FCFS) and dispatches to a replica with a free sequence slot."""

    name = "central"
    central = True

    def __init__(self, seed: int = 0):
        pass

    def route(self, request, views) -> int | None:
        free = [i for i, v in enumerate(views) if outstanding(v) < v["max_num_seqs"]]
        return min(free, key=lambda i: outstanding(views[i])) if free else None


ROUTERS = {r.name: r for r in (Random, RoundRobin, LeastOutstanding, PowerOfTwo, Central)}
ROUTERS["jsq"] = LeastOutstanding


def router(name_or_router, seed: int = 0):
    """A router object by name (see :data:`ROUTERS`), or the object itself."""
    if not isinstance(name_or_router, str):
        return name_or_router
    cls = ROUTERS.get(name_or_router)
    if cls is None:
        raise InputError("router", f"unknown router {name_or_router!r}", f"choose one of: {', '.join(ROUTERS)}")
    return cls(seed)
