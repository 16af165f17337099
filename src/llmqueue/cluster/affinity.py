"""Routers that read the KV cache: least KV usage, prefix affinity, sticky sessions.

An LLM replica is not an M/M/1 server: a request's service time depends on what the replica holds.
With prefix caching, prompt units already in a replica's KV cache are not prefilled again, so the
same request is served faster on the replica that saw its prefix; and a replica with few free KV
blocks admits fewer requests (a smaller effective number of servers) and preempts sooner. These
routers trade load balance (what JSQ optimizes) for that locality:

- :class:`LeastKV`: the replica with the most free KV blocks;
- :class:`PrefixAffinity`: the prompt's leading prefix units map to a replica, spilling to the
  least loaded over a bound on the prefill backlog (consistent hashing with bounded loads: Mirrokni,
  Thorup and Zadimoghaddam, 2018, with the load in prefill tokens and new keys placed on load);
- :class:`Session`: sticky sessions, a conversation pinned to the replica of its first turn.

The load bound of :class:`Session` (and of :class:`PrefixAffinity` with ``load="requests"``;
by default it bounds prefill tokens the same way): a replica takes the request while its outstanding
count is at most ``bound * (mean outstanding over the routable replicas + 1)``. The least loaded
replica always qualifies (its count is at most the mean), so a request always finds one, and no
replica holds more than about ``bound`` times the mean: the bound caps the imbalance (and so the
queueing delay) that affinity may cost. Hashes are splitmix64 mixes of the integer prefix ids:
deterministic across processes and runs (Python's ``hash`` of a string is salted), and the same
for every gateway that routes the same requests.
"""

from __future__ import annotations

import math

from llmqueue.errors import InputError
from llmqueue.workload.hashed import mix64

_M64 = (1 << 64) - 1


def prefix_key(hash_ids, units: int) -> int | None:
    """The 64-bit key of the first ``units`` prefix ids of a request (None without any)."""
    if not hash_ids:
        return None
    k = 0x2545F4914F6CDD1D
    for h in hash_ids[:units]:
        k = mix64(k ^ (int(h) & _M64))
    return k


def load_cap(view, bound: float) -> float:
    """The most requests a replica may hold and still take one under the load bound."""
    r = view.routable
    out = view.outstanding
    return bound * (sum(out[i] for i in r) / len(r) + 1.0)


def _check(bound, prefix_units):
    if not (isinstance(bound, (int, float)) and bound >= 1.0):
        raise InputError("router", f"the load bound must be a number >= 1 (got {bound!r})",
                         "1.25 is the usual choice; math.inf turns the bound off")
    if not isinstance(prefix_units, int) or isinstance(prefix_units, bool) or prefix_units < 1:
        raise InputError("router", f"prefix_units must be a whole number >= 1 (got {prefix_units!r})")


class LeastKV:
    """Join the replica with the most free KV blocks (the least KV usage); ties to the fewest
    outstanding requests, then the lowest index.

    In queueing terms a replica is a processor-sharing server whose number of concurrent slots is
    set by its free KV memory, not by ``max_num_seqs`` once the cache is the bottleneck: routing
    to the most free blocks keeps admissions and preemptions even across replicas (JSQ on the
    resource that binds). Free blocks include cached blocks that no request references (they are
    evictable, as in vLLM's free queue). Under light load all replicas have equal free KV and it
    falls back to least outstanding."""

    name = "least-kv"
    central = False

    def __init__(self, seed: int = 0):
        pass

    def route(self, request, view) -> int:
        out = view.outstanding
        free = view.kv_blocks_free
        return min(view.routable, key=lambda i: (-free(i), out[i], i))


class PrefixAffinity:
    """Prefix affinity: the prompt's leading prefix units, hashed, map to a replica; a request
    spills to the least loaded replica when that one is over a load bound, and the load is the
    replica's prefill backlog (prompt tokens of the requests it holds without a first token).

    What it models. With prefix caching a request is served faster on the replica that holds its
    prefix; its time to first token is, to first order, the prefill work ahead of it on its replica
    (the backlog: chunked prefill shares each step's token budget among the prompts in prefill)
    plus its own uncached prompt. So the router (i) keeps a key's requests on one replica, where
    its prefix is cached, and (ii) counts load in prefill tokens, not requests: a just-routed
    12,000-token prompt delays the next first token far more than a decoding request does (JSQ on
    requests is blind to that). This is consistent hashing with bounded loads (Mirrokni, Thorup
    and Zadimoghaddam, 2018) with the load measured in the work that sets TTFT, as in SGLang's
    cache-aware router and llm-d's prefix-cache plus load scorers.

    The key (:func:`prefix_key`): the request's first ``prefix_units`` prefix ids (``hash_ids``:
    units of ``hash_block_tokens`` tokens). Its replica, the key's home:

    - ``new_keys="least"`` (default): a key seen for the first time goes to the replica with the
      least prefill backlog (no replica holds its prefix yet, so nothing is lost by choosing on load
      alone, whereas a hash places it as a random router would, and long prefills collide) and the
      router remembers key -> replica in a table of at most ``max_keys`` keys (the least recently
      routed is forgotten first; a forgotten key is placed as a new one). Later requests of the key
      go to that replica while it is routable and under the bound; otherwise they spill to the least
      loaded replica and the key is re-homed there (that replica now holds the longest copy of the
      prefix: the spilled request's whole prompt).
    - ``new_keys="hash"``: stateless consistent hashing: rendezvous (highest random weight) hashing
      ranks the routable replicas by ``mix(key, replica)``; the request goes to the first one in that
      order under the bound (a spilled key's requests go to its second choice, the same for every
      request of that prefix). Every gateway routing the same requests agrees without sharing
      state, and a replica leaving the routable set moves only the keys it held.

    The bound: with load ``L_i`` (``load="prefill"``: ``view.pending_prefill[i]``; ``"requests"``:
    ``view.outstanding[i]``) and ``w`` the request's own weight (its prompt tokens; 1 request), a
    replica takes the request while ``L_i <= bound * (mean_i L_i + w)`` over the routable replicas.
    The least loaded replica always qualifies, so the bound caps the imbalance (the queueing delay)
    that affinity may cost at about ``bound`` times the mean backlog. A request without prefix ids
    goes to the least loaded replica (ties: fewest outstanding, then lowest index).

    ``prefix_units`` (default 2): Mooncake's traces begin every request with the same unit (a shared
    system prompt), so one unit would send everything to one replica; a conversation shows at the
    second unit. ``bound`` (default 1.25, Mirrokni et al.'s ``1 + eps``; ``math.inf``: no bound).
    ``load="requests", new_keys="hash"`` is the plain consistent hashing with bounded loads on the
    request count (this router before the prefill backlog)."""

    name = "prefix-affinity"
    central = False

    def __init__(self, seed: int = 0, *, prefix_units: int = 2, bound: float = 1.25, load: str = "prefill",
                 new_keys: str = "least", max_keys: int = 1 << 16):
        _check(bound, prefix_units)
        if load not in ("prefill", "requests"):
            raise InputError("router", f"load must be 'prefill' or 'requests' (got {load!r})")
        if new_keys not in ("least", "hash"):
            raise InputError("router", f"new_keys must be 'least' or 'hash' (got {new_keys!r})")
        if not isinstance(max_keys, int) or isinstance(max_keys, bool) or max_keys < 1:
            raise InputError("router", f"max_keys must be a whole number >= 1 (got {max_keys!r})")
        self.prefix_units = prefix_units
        self.bound = bound
        self.load = load
        self.new_keys = new_keys
        self.max_keys = max_keys
        self.homes: dict = {}  # key -> replica (new_keys="least"), oldest routed first
        self._salt: list = []  # mix64 of each replica index, grown as needed

    def order(self, key: int, routable) -> list:
        """The routable replicas in the key's rendezvous order (first choice first)."""
        salt = self._salt
        while len(salt) <= routable[-1]:
            salt.append(mix64(len(salt) * 0x9E3779B97F4A7C15 + 1))
        return sorted(routable, key=lambda i: (-mix64(key ^ salt[i]), i))

    def loads(self, request, view):
        """The load per replica slot and the request's own weight in the same unit."""
        if self.load == "prefill":
            return view.pending_prefill, request.num_prompt_tokens
        return view.outstanding, 1

    def cap(self, view, loads, w) -> float:
        """The most load a replica may hold and still take a request of weight ``w``."""
        r = view.routable
        return self.bound * (sum(loads[i] for i in r) / len(r) + w)

    def route(self, request, view) -> int:
        loads, w = self.loads(request, view)
        out = view.outstanding
        key = prefix_key(request.hash_ids, self.prefix_units)
        if key is None:
            return min(view.routable, key=lambda i: (loads[i], out[i], i))
        if self.new_keys == "hash":
            order = self.order(key, view.routable)
            if math.isinf(self.bound):
                return order[0]
            cap = self.cap(view, loads, w)
            return next(i for i in order if loads[i] <= cap)
        homes = self.homes
        i = homes.pop(key, None)  # re-inserted below: now the most recently routed
        if i is None or i not in view.routable or loads[i] > self.cap(view, loads, w):
            i = min(view.routable, key=lambda j: (loads[j], out[j], j))
            if len(homes) >= self.max_keys:
                del homes[next(iter(homes))]
        homes[key] = i
        return i


class Session:
    """Sticky sessions: a conversation's turns go to the replica its first turn went to.

    The first turn of a session goes to the least outstanding replica (JSQ) and the session is
    pinned there; a later turn follows the pin while that replica is routable and under the load
    bound (:func:`load_cap`), else it goes to the least outstanding replica and the session is
    pinned anew. In queueing terms: JSQ over sessions rather than requests (a session's later
    turns are routed on state that was current at its first), which keeps a conversation's KV
    prefix on one replica while the bound limits the imbalance.

    The session key is ``request.session_id`` when the request has one; traces without a session
    column (Mooncake's have none) fall back to the first ``prefix_units`` prefix ids, as
    :class:`PrefixAffinity` (a conversation's turns repeat its first turn's units); a request with
    neither goes to the least outstanding replica. At most ``max_sessions`` pins are kept (the
    oldest pin is forgotten first)."""

    name = "session"
    central = False

    def __init__(self, seed: int = 0, *, prefix_units: int = 2, bound: float = 1.25, max_sessions: int = 1 << 20):
        _check(bound, prefix_units)
        self.prefix_units = prefix_units
        self.bound = bound
        self.max_sessions = max_sessions
        self.pins: dict = {}

    def key(self, request):
        sid = getattr(request, "session_id", None)
        if sid is not None:
            return (0, sid)
        k = prefix_key(request.hash_ids, self.prefix_units)
        return None if k is None else (1, k)

    def route(self, request, view) -> int:
        key = self.key(request)
        if key is None:
            return view.least_outstanding()
        i = self.pins.get(key)
        if i is not None and i in view.routable and view.outstanding[i] <= load_cap(view, self.bound):
            return i
        j = view.least_outstanding()
        if i is not None:
            del self.pins[key]  # re-pinned: now the newest
        elif len(self.pins) >= self.max_sessions:
            del self.pins[next(iter(self.pins))]
        self.pins[key] = j
        return j
