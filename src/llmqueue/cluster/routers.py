"""Routers: which replica takes an arriving request, decided from read-only views of the fleet.

A router gets a :class:`~llmqueue.cluster.view.PoolView` of the pool (``outstanding`` per replica,
``routable`` replicas, ``num_waiting(i)``, ``kv_blocks_free(i)``, ...) and returns the index of a
routable replica, or None to hold the request at the gateway (only the central router does). Queueing terms, for c identical replicas of one request at a time:

- :class:`Random`: each replica an independent M/M/1 fed a thinned Poisson stream (``lam / c``);
- :class:`RoundRobin`: each an E_c/M/1 (every c-th arrival);
- :class:`LeastOutstanding`: join the shortest queue (JSQ; ties to the lowest index);
- :class:`LeastPrefill`: join the least prefill backlog (JSQ in prompt tokens awaiting a first token);
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

To add one: a class with ``name``, ``central`` and ``route(request, view)``, and its entry (the class
and a line of help) in ``_ENTRIES``: the command line's ``--router``, a scenario pool's ``router``
and ``plan --routers`` read :data:`ROUTERS`.
"""

from __future__ import annotations

import numpy as np

from llmqueue.cluster.affinity import LeastKV, PrefixAffinity, Session
from llmqueue.errors import InputError


class _Uniforms:
    """Uniform draws on [0, 1) taken a block at a time (one numpy call per 4,096 draws)."""

    def __init__(self, seed: int, key: int):
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))
        self.buf: list = []

    def pick(self, n: int) -> int:
        """A uniform index in 0..n-1."""
        if not self.buf:
            self.buf = self.rng.random(4096).tolist()
        return int(self.buf.pop() * n)


class Random:
    name = "random"
    central = False

    def __init__(self, seed: int = 0):
        self.u = _Uniforms(seed, 23)

    def route(self, request, view) -> int:
        r = view.routable
        return r[self.u.pick(len(r))]


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
        out = view.outstanding
        r = view.routable
        if len(r) == len(out):  # every replica serves: the first holding the fewest
            return out.index(min(out))
        return min(r, key=out.__getitem__)


class LeastPrefill:
    """Join the replica with the least prefill backlog (``view.pending_prefill``: prompt tokens of
    the requests it holds without a first token; ties to the fewest outstanding, then the lowest
    index). JSQ on the work that delays a new request's first token: a replica's TTFT is its
    prefill queue's sojourn, and requests differ in prefill work by orders of magnitude, so
    counting requests (JSQ) balances the wrong quantity."""

    name = "least-prefill"
    central = False

    def __init__(self, seed: int = 0):
        pass

    def route(self, request, view) -> int:
        pf, out = view.pending_prefill, view.outstanding
        return min(view.routable, key=lambda i: (pf[i], out[i], i))


class PowerOfTwo:
    name = "power-of-two"
    central = False

    def __init__(self, seed: int = 0):
        self.u = _Uniforms(seed, 29)

    def route(self, request, view) -> int:
        r = view.routable
        n = len(r)
        if n == 1:
            return r[0]
        i = self.u.pick(n)
        j = self.u.pick(n - 1)  # two distinct replicas, uniformly
        a, b = r[i], r[j + (j >= i)]
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


# (router class, its line of help, other names): the one list of routers
_ENTRIES = (
    (Random, "uniformly at random"),
    (RoundRobin, "each routable replica in turn"),
    (LeastOutstanding, "join the shortest queue: the fewest requests outstanding", "jsq"),
    (LeastPrefill, "the least prefill backlog in tokens"),
    (PowerOfTwo, "the shorter queue of two replicas drawn at random"),
    (Central, "the gateway holds the queue and dispatches to a free slot: M/M/c"),
    (LeastKV, "the most free KV blocks"),
    (PrefixAffinity, "the prompt's leading prefix sticks to a replica, spilling to the least prefill backlog "
                     "over a bound"),
    (Session, "a conversation sticks to its first turn's replica"),
)

#: Every router by name (``--router``, a scenario pool's ``router``, ``plan --routers``)
ROUTERS = {name: cls for cls, _, *others in _ENTRIES for name in (cls.name, *others)}

#: Each name's line of help (what ``--router``'s help lists)
ROUTER_HELP = {name: help_ if name == cls.name else f"{cls.name}'s other name"
               for cls, help_, *others in _ENTRIES for name in (cls.name, *others)}


def router(name_or_router, seed: int = 0):
    """A router object by name (see :data:`ROUTERS`), or the object itself."""
    if not isinstance(name_or_router, str):
        return name_or_router
    cls = ROUTERS.get(name_or_router)
    if cls is None:
        raise InputError("router", f"unknown router {name_or_router!r}", f"choose one of: {', '.join(ROUTERS)}")
    return cls(seed)
