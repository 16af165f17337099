"""The host-memory KV tier of a replica: where a preempted request's KV waits instead of being dropped.

vLLM's CPU offloading (``--kv-offloading-size``, its offloading connector; LMCache's CPU backend)
keeps KV blocks in host memory; a request preempted for room keeps its computed KV there and, when
it is scheduled again, loads it back instead of recomputing its prompt and output so far. Here:
:meth:`HostTier.offload` at preemption (its ``num_computed_tokens`` ``c`` moved out when the tier
has ``c`` tokens free; else recompute, counted), :meth:`HostTier.restore` at admission (the ``c``
tokens counted as computed, their load priced ``c x s_per_token`` in that step: the forward pass
waits for its layers' KV), :meth:`HostTier.drop` when a waiting request leaves (a timeout).
Capacity is in tokens; a request's KV is held whole until it resumes (no eviction among
offloaded requests: a full tier sends the next victim to recompute).
"""

from __future__ import annotations

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
    """``capacity`` tokens of host memory, ``s_per_token`` seconds to load one token's KV back."""

    __slots__ = ("capacity", "free", "s_per_token", "offloads", "full", "restores", "loaded_tokens", "dropped",
                 "recomputed_tokens", "offloaded_tokens")

    def __init__(self, capacity: int, s_per_token: float) -> None:
        self.capacity = int(capacity)
        self.free = int(capacity)
        self.s_per_token = float(s_per_token)
        self.offloads = 0        # preemptions whose KV went to the tier
        self.full = 0            # preemptions recomputed because the tier had no room
        self.restores = 0        # resumptions served from the tier
        self.loaded_tokens = 0   # KV tokens loaded back
        self.dropped = 0         # offloaded requests that left before resuming
        self.recomputed_tokens = 0  # KV tokens dropped for recomputation (the tier full)
        self.offloaded_tokens = 0   # KV tokens moved to the tier

    def offload(self, r) -> bool:
        """Move preempted ``r``'s computed KV to the tier if it fits (True), else recompute."""
        c = r.num_computed_tokens
        if c <= 0:
            return False
        if c > self.free:
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

    def stats(self) -> dict:
        return {"capacity_tokens": self.capacity, "offloads": self.offloads, "recomputed_tier_full": self.full,
                "restores": self.restores, "offloaded_tokens": self.offloaded_tokens,
                "recomputed_tokens": self.recomputed_tokens, "loaded_tokens": self.loaded_tokens,
                "load_s": self.loaded_tokens * self.s_per_token, "dropped": self.dropped}
