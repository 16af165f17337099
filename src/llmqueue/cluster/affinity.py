"""Routers that read the KV cache: least KV usage, prefix affinity, sticky sessions.

An LLM replica is not an M/M/1 server: a request's service time depends on what the replica holds.
With prefix caching, prompt units already in a replica's KV cache are not prefilled again, so the
same request is served faster on the replica that saw its prefix; and a replica with few free KV
blocks admits fewer requests (a smaller effective number of servers) and preempts sooner. These
routers trade load balance (what JSQ optimizes) for that locality:

- :class:`LeastKV`: the replica with the most free KV blocks;
- :class:`PrefixAffinity`: consistent hashing of the prompt's leading prefix units with bounded
  loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent hashing with bounded loads", 2018);
- :class:`Session`: sticky sessions, a conversation pinned to the replica of its first turn.

The load bound of both affinity routers: a replica takes the request while its outstanding
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

_M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finalizer: a bijective, well-spread 64-bit mix of an integer (taken mod 2**64)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


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
    """Consistent hashing of the prompt's leading prefix with bounded loads.

    The key is the request's first ``prefix_units`` prefix ids (``hash_ids``: units of
    ``hash_block_tokens`` tokens). Rendezvous (highest random weight) hashing ranks the routable
    replicas by ``mix(key, replica)`` and the request goes to the first one in that order under
    the load bound (:func:`load_cap`); a replica leaving the routable set moves only the keys it
    held (the others keep their first choice), and a spilled request goes to the key's second
    choice, the same for every request of that prefix. A request without prefix ids goes to the
    least outstanding replica.

    In queueing terms: without the bound each replica is fed the requests of a fixed share of the
    prefixes (a thinned, but bursty, stream: a popular prefix lands on one replica), and each
    request of a prefix after the first finds its KV cached, so its service is shorter; the bound
    gives back JSQ's balance when the affinity would overload a replica.

    ``prefix_units`` (default 2): how many leading units make the key. Mooncake's traces begin
    every request with the same unit (a shared system prompt: id 0 in the conversation trace), so
    one unit would send everything to one replica; a conversation shows at the second unit (every
    later turn repeats the earlier turns' units). ``bound`` (default 1.25, Mirrokni et al.'s
    ``1 + eps``; ``math.inf``: no bound)."""

    name = "prefix-affinity"
    central = False

    def __init__(self, seed: int = 0, *, prefix_units: int = 2, bound: float = 1.25):
        _check(bound, prefix_units)
        self.prefix_units = prefix_units
        self.bound = bound
        self._salt: list = []  # mix64 of each replica index, grown as needed

    def order(self, key: int, routable) -> list:
        """The routable replicas in the key's rendezvous order (first choice first)."""
        salt = self._salt
        while len(salt) <= routable[-1]:
            salt.append(mix64(len(salt) * 0x9E3779B97F4A7C15 + 1))
        return sorted(routable, key=lambda i: (-mix64(key ^ salt[i]), i))

    def route(self, request, view) -> int:
        key = prefix_key(request.hash_ids, self.prefix_units)
        if key is None:
            return view.least_outstanding()
        order = self.order(key, view.routable)
        if math.isinf(self.bound):
            return order[0]
        cap = load_cap(view, self.bound)
        out = view.outstanding
        return next(i for i in order if out[i] <= cap)


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
