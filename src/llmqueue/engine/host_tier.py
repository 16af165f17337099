"""The host-memory KV tier of a replica: where a preempted request's KV and evicted prefixes wait.

vLLM's CPU offloading (``--kv-offloading-size``, its offloading connector; LMCache's CPU backend)
keeps KV blocks in host memory. Two uses, one capacity (in tokens):

- **Preemption.** A request preempted for room keeps its computed KV in the tier and, when it is
  scheduled again, loads it back instead of recomputing its prompt and output so far:
  :meth:`HostTier.offload` at preemption (its ``num_computed_tokens`` ``c`` moved out when the
  tier has, or can evict, room for ``c`` tokens; else recompute, counted), :meth:`HostTier.restore`
  at admission (the ``c`` tokens counted as computed, their load priced ``c x s_per_token`` in that
  step: the forward pass waits for its layers' KV), :meth:`HostTier.drop` when a waiting request
  leaves (a timeout). A preempted request's KV is held whole until it resumes.
- **Prefix units.** With prefix caching, a unit the GPU's free queue evicts moves down to the tier
  (:meth:`HostTier.store_unit`: an exclusive, victim tier, least recently stored evicted first when
  room is needed); a waiting request whose leading units miss the GPU cache but are found here
  (:meth:`HostTier.lookup_units`, the run right after its GPU hits) loads them
  (:meth:`HostTier.take_units`, :meth:`HostTier.loaded_units`) at the same price per token
  instead of computing them: vLLM's external prefix-cache hits. Loaded units leave the tier (they
  are on the GPU again).

Offloaded requests are pinned; stored units give way to them and to newer units.
"""

from __future__ import annotations

from collections import OrderedDict

from llmqueue.errors import InputError

GIB = 1 << 30


def tier_settings(size_gib: float, gbps: float, bytes_per_token: float, tensor_parallel_size: int = 1) -> tuple[int, float]:
    """``(capacity tokens, load seconds per token)`` of a host tier of ``size_gib`` (summed over the
    replica's ``tensor_parallel_size`` GPUs, as vLLM's ``--kv-offloading-size``; callers pass tp x pp,
    every GPU holding its share of the layers and heads) holding ``bytes_per_token`` (all GPUs) per
    token, each GPU loading its share over its own link of ``gbps`` GB/s in parallel:
    ``s = bytes_per_token / tp / (gbps 1e9)``."""
    tokens = int(size_gib * GIB // bytes_per_token)
    return tokens, bytes_per_token / max(int(tensor_parallel_size), 1) / (gbps * 1e9)


def with_host_tier(config, size_gib: float, gbps: float, bytes_per_token, model, tensor_parallel_size: int = 1,
                   kv_dtype: str = "auto"):
    """``config`` with the host KV tier of ``size_gib`` GiB at ``gbps`` GB/s
    (:func:`tier_settings`); the KV bytes of a token are
    ``bytes_per_token``, else ``model``'s. Unchanged when ``size_gib`` is 0."""
    if not size_gib:
        return config
    import dataclasses

    if bytes_per_token is None:
        if model is None:
            raise InputError("kv_bytes_per_token", "is needed with a host KV tier and no model",
                             "give --kv-bytes-per-token (e.g. 131072 for Llama-3.1-8B in bf16), or --model")
        from llmqueue.hardware import kv_bytes_per_token, resolve_dtype

        bytes_per_token = kv_bytes_per_token(model, resolve_dtype(kv_dtype, model, field="kv_cache_dtype", kv=True))
    tokens, s = tier_settings(size_gib, gbps, bytes_per_token, tensor_parallel_size)
    if tokens < 1:
        raise InputError("kv_offloading_size", f"{size_gib:g} GiB holds no token's KV ({bytes_per_token:g} B each)",
                         "give a larger size")
    return dataclasses.replace(config, kv_offload_tokens=tokens, kv_offload_s_per_token=s)


class HostTier:
    """``capacity`` tokens of host memory, ``s_per_token`` seconds to load one token's KV back;
    ``unit_tokens`` the prefix cache's unit (0: no prefix caching, no units stored)."""

    __slots__ = ("capacity", "free", "s_per_token", "offloads", "full", "restores", "loaded_tokens", "dropped",
                 "recomputed_tokens", "offloaded_tokens", "units", "unit_tokens", "stored_units", "evicted_units",
                 "unstored_units", "prefix_hit_units", "first_hit_units")

    def __init__(self, capacity: int, s_per_token: float) -> None:
        self.capacity = int(capacity)
        self.free = int(capacity)
        self.s_per_token = float(s_per_token)
        self.offloads = 0        # preemptions whose KV went to the tier
        self.full = 0            # preemptions recomputed because the tier had no room
        self.restores = 0        # resumptions served from the tier
        self.loaded_tokens = 0   # KV tokens loaded back (resumptions and prefix hits)
        self.dropped = 0         # offloaded requests that left before resuming
        self.recomputed_tokens = 0  # KV tokens dropped for recomputation (the tier full)
        self.offloaded_tokens = 0   # KV tokens moved to the tier at preemption
        self.units: OrderedDict = OrderedDict()  # prefix units the GPU evicted, the oldest first
        self.unit_tokens = 0
        self.stored_units = 0    # units moved down from the GPU
        self.evicted_units = 0   # units the tier dropped for room
        self.unstored_units = 0  # units not stored: pinned requests left no room
        self.prefix_hit_units = 0  # units loaded by waiting requests (external prefix-cache hits)
        self.first_hit_units = 0   # of those, at a request's first admission (its cached_prompt_tokens)

    def _room(self, n: int) -> bool:
        """Make ``n`` tokens free, evicting the oldest stored units as needed; False if it cannot."""
        units = self.units
        u = self.unit_tokens
        while self.free < n and units:
            units.popitem(last=False)
            self.free += u
            self.evicted_units += 1
        return self.free >= n

    def offload(self, r) -> bool:
        """Move preempted ``r``'s computed KV to the tier if it fits (True), else recompute."""
        c = r.num_computed_tokens
        if c <= 0:
            return False
        if c > self.free and (c > self.free + len(self.units) * self.unit_tokens or not self._room(c)):
            self.full += 1
            self.recomputed_tokens += c
            return False
        r.offloaded_tokens = c
        self.free -= c
        self.offloads += 1
        self.offloaded_tokens += c
        return True

    def restore(self, r) -> int:
        """``r`` resumes: its offloaded tokens come back (returned, for the step's load time)."""
        c = r.offloaded_tokens
        r.offloaded_tokens = 0
        r.loaded_tokens += c
        self.free += c
        self.restores += 1
        self.loaded_tokens += c
        return c

    def drop(self, r) -> None:
        """``r`` left while offloaded: its tier space is free again."""
        if r.offloaded_tokens:
            self.free += r.offloaded_tokens
            r.offloaded_tokens = 0
            self.dropped += 1

    def store_unit(self, h) -> None:
        """The GPU evicted prefix unit ``h``: keep it here (the newest), room permitting."""
        units = self.units
        if h in units:
            units.move_to_end(h)
            return
        if not self._room(self.unit_tokens):
            self.unstored_units += 1
            return
        units[h] = None
        self.free -= self.unit_tokens
        self.stored_units += 1

    def lookup_units(self, hash_ids, start: int, stop: int) -> int:
        """How many of ``hash_ids[start:stop]`` (the units after a request's GPU hits, up to its
        last full unit before the prompt's final token) are here, in a run from ``start``."""
        units = self.units
        j = 0
        for h in hash_ids[start:stop]:
            if h not in units:
                break
            j += 1
        return j

    def take_units(self, hash_ids, start: int, j: int) -> None:
        """A waiting request is about to load units ``start .. start + j`` (found by
        :meth:`lookup_units`): they leave the tier before its blocks are allocated (an allocation
        evicts GPU units down here, which must not push these out)."""
        units = self.units
        for h in hash_ids[start:start + j]:
            del units[h]
        self.free += j * self.unit_tokens

    def return_units(self, hash_ids, start: int, j: int) -> None:
        """The request could not be admitted: its units come back, the newest (a lookup touches)."""
        units = self.units
        for h in hash_ids[start:start + j]:
            units[h] = None
        self.free -= j * self.unit_tokens

    def loaded_units(self, r, j: int) -> int:
        """``r`` was admitted with ``j`` units taken from the tier: the tokens loaded (returned, for
        the step's load time), counted as external prefix-cache hits (call it before the scheduler
        sets ``r``'s cached tokens: a first admission's hits are counted apart, as the records'
        ``cached_prompt_tokens`` count only those; a request recomputed after a preemption can hit
        again)."""
        n = j * self.unit_tokens
        self.prefix_hit_units += j
        if r.num_cached_tokens < 0:
            self.first_hit_units += j
        self.loaded_tokens += n
        r.loaded_tokens += n
        return n

    def stats(self) -> dict:
        out = {"capacity_tokens": self.capacity, "offloads": self.offloads, "recomputed_tier_full": self.full,
               "restores": self.restores, "offloaded_tokens": self.offloaded_tokens,
               "recomputed_tokens": self.recomputed_tokens, "loaded_tokens": self.loaded_tokens,
               "load_s": self.loaded_tokens * self.s_per_token, "dropped": self.dropped}
        if self.unit_tokens:
            out.update(prefix_units_stored=self.stored_units, prefix_units_evicted=self.evicted_units,
                       prefix_units_not_stored=self.unstored_units, prefix_hit_tokens=self.prefix_hit_units * self.unit_tokens,
                       first_admission_hit_tokens=self.first_hit_units * self.unit_tokens,
                       prefix_units_held=len(self.units))
        return out


def merge_stats(accounts: list) -> dict:
    """A fleet's host-tier account: the replicas' :meth:`HostTier.stats` summed (capacity, counts,
    tokens, load seconds: replica-seconds), with ``replicas`` the number that had a tier."""
    out: dict = {}
    for a in accounts:
        for k, v in a.items():
            out[k] = out.get(k, 0) + v
    out["replicas"] = len(accounts)
    return out
