"""Automatic prefix caching (vLLM v1 semantics, at the granularity of the trace's hash blocks).

A request may carry ``hash_ids``: one id per ``unit_tokens`` of its prompt (Mooncake traces use
512-token units); equal ids mean an identical prefix up to and including that unit. The KV
cache keeps, for every unit some request has computed, the unit's blocks:

- *in use* while a running request references it (reference count > 0), shared by all of them;
- *evictable* once no running request does: the blocks are free, but keep their contents
  until an allocation takes them.

Free blocks form one queue, as vLLM's free-block queue: allocations take blocks from the head;
freed blocks join the tail, a request's private blocks first, then its prefix units deepest
first (so the shared roots are evicted last). A unit whose blocks are taken is evicted whole.

When a waiting request is scheduled, the longest run of its leading units that are cached
(in use or evictable) is a hit: those tokens count as computed (at least one prompt token is
always computed, as in vLLM) and evictable hits leave the free queue. When a request's
prefill completes a unit, the unit is registered in the cache under that request (unless an
identical unit is already cached, in which case the request keeps a private copy and stops
registering, a simplification of vLLM's duplicate handling).

With a host KV tier (:mod:`llmqueue.engine.host_tier`), ``lower`` is that tier: a unit evicted
here moves down to it (:meth:`~llmqueue.engine.host_tier.HostTier.store_unit`).
"""

from __future__ import annotations

from collections import deque
from typing import Any


class PrefixCache:
    """The free-block queue and the table of cached prefix units (see the module docstring).

    The caller keeps the count of free blocks; this class keeps their order and contents.
    """

    def __init__(self, total_blocks: int, unit_blocks: int):
        self.unit_blocks = unit_blocks
        self.queue: deque = deque([[None, total_blocks]])  # [unit id or None (plain), blocks]
        self.ref: dict = {}        # unit id -> running requests referencing it
        self.evictable: dict = {}  # unit id -> the queue entry holding its blocks
        self.hit_units = 0
        self.evicted_units = 0
        self.lower: Any = None     # the host KV tier evicted units move down to (None: dropped)

    def cached(self, h) -> bool:
        return h in self.ref or h in self.evictable

    def lookup(self, hash_ids, max_units: int) -> tuple[int, int]:
        """``(k, blocks)``: the first ``k`` units are cached; taking them removes ``blocks`` free blocks."""
        k = 0
        extra = 0
        for h in hash_ids[:max_units]:
            if h in self.ref:
                pass
            elif h in self.evictable:
                extra += self.unit_blocks
            else:
                break
            k += 1
        return k, extra

    def take(self, hash_ids, k: int) -> None:
        """Reference the first ``k`` (cached) units of a request being scheduled."""
        for h in hash_ids[:k]:
            entry = self.evictable.pop(h, None)
            if entry is not None:
                entry[1] = 0  # its blocks leave the free queue (the entry is skipped when reached)
                self.ref[h] = 1
            else:
                self.ref[h] += 1
        self.hit_units += k

    def register(self, h) -> bool:
        """A running request completed unit ``h``: cache it (in use by that request)."""
        if h in self.ref or h in self.evictable:
            return False
        self.ref[h] = 1
        return True

    def consume(self, n: int) -> None:
        """Take ``n`` blocks from the head of the free queue, evicting the units they held."""
        q = self.queue
        while n > 0:
            entry = q[0]
            h, blocks = entry
            if blocks == 0:
                q.popleft()
                continue
            if h is not None:
                # the unit is evicted whole: its blocks become plain free blocks, n taken from them
                del self.evictable[h]
                self.evicted_units += 1
                if self.lower is not None:
                    self.lower.store_unit(h)
                entry[0] = None
            take = blocks if blocks <= n else n
            entry[1] = blocks - take
            n -= take
            if entry[1] == 0:
                q.popleft()

    def free_request(self, private_blocks: int, units) -> int:
        """Release a request: its private blocks, then its units deepest first. Returns the number
        of blocks that became free (private ones plus units nobody references any more)."""
        freed = 0
        if private_blocks:
            self.queue.append([None, private_blocks])
            freed += private_blocks
        for h in reversed(units):
            c = self.ref[h] - 1
            if c:
                self.ref[h] = c
                continue
            del self.ref[h]
            entry = [h, self.unit_blocks]
            self.evictable[h] = entry
            self.queue.append(entry)
            freed += self.unit_blocks
        return freed
