"""Engine knobs of one serving replica, named as vLLM names them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from llmqueue._validate import nonnegative, positive, positive_int
from llmqueue.engine.policies import FCFS, ORDERINGS, VICTIMS, PreemptNewest
from llmqueue.errors import InputError


@dataclass(frozen=True)
class EngineConfig:
    """One replica's scheduler and KV-cache configuration (vLLM v1 semantics).

    - ``num_kv_blocks`` x ``block_size``: the paged KV cache, ``M`` tokens in all.
    - ``max_num_batched_tokens``: the per-step token budget (the chunk size with chunked prefill).
    - ``max_num_seqs``: at most this many requests run (hold KV) at once.
    - ``enable_chunked_prefill``: when False a prompt is prefilled in one step, and a waiting
      request whose prompt exceeds the remaining budget waits for the next step.
    - ``long_prefill_token_threshold``: caps one request's prefill chunk per step (0 = off).
    - ``max_model_len``: prompt + output above it is rejected at arrival (vLLM answers 400).
    - ``policy``: waiting-queue order, one of :data:`~llmqueue.engine.policies.ORDERINGS`.
    - ``preemption``: victim when blocks run out, one of :data:`~llmqueue.engine.policies.VICTIMS`.
    - ``max_waiting``: admission control, reject arrivals when this many already wait (0 = no limit).
    - ``max_queue_time_s``: shed requests that waited longer than this before starting (0 = off).
    - ``class_priority``, ``class_max_waiting``, ``class_max_queue_time_s``: per request class
      (lane, tenant), its priority and its own admission limits (applied besides the global ones).
    - ``scheduler_reserve_full_isl``: admit a waiting request only when its whole sequence so
      far (the prompt, plus the tokens generated before a preemption) fits in the free KV
      blocks, not only its first chunk (vLLM's default since it grew the flag; False: the older
      chunk-only check).
    - ``enable_prefix_caching``: reuse the KV of cached prompt prefixes (requests need hash ids;
      see :mod:`llmqueue.engine.prefix_cache`).
    - ``kv_offload_tokens``: a host-memory KV tier of that many tokens (vLLM's CPU offloading,
      ``--kv-offloading-size``; 0 = none): a preempted request's computed KV moves there instead of
      being dropped, room permitting, and is loaded back when it resumes (no recomputation);
      ``kv_offload_s_per_token``: the seconds one token's KV takes to load (its bytes over the
      tier's bandwidth), added to the step that resumes it (the forward pass waits for its layers'
      KV). See :mod:`llmqueue.theory.kv_tiers` for what it does to ``mu``.
    """

    num_kv_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    max_model_len: int = 0
    policy: str = FCFS.name
    preemption: str = PreemptNewest.name
    max_waiting: int = 0
    max_queue_time_s: float = 0.0
    enable_prefix_caching: bool = False
    scheduler_reserve_full_isl: bool = True
    class_priority: dict = field(default_factory=dict)
    class_max_waiting: dict = field(default_factory=dict)
    class_max_queue_time_s: dict = field(default_factory=dict)
    kv_offload_tokens: int = 0
    kv_offload_s_per_token: float = 0.0

    def __post_init__(self):
        positive_int("kv_offload_tokens", self.kv_offload_tokens, minimum=0)
        nonnegative("kv_offload_s_per_token", self.kv_offload_s_per_token)
        positive_int("num_kv_blocks", self.num_kv_blocks)
        positive_int("block_size", self.block_size)
        positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        positive_int("max_num_seqs", self.max_num_seqs)
        positive_int("long_prefill_token_threshold", self.long_prefill_token_threshold, minimum=0)
        positive_int("max_model_len", self.max_model_len, minimum=0)
        positive_int("max_waiting", self.max_waiting, minimum=0)
        nonnegative("max_queue_time_s", self.max_queue_time_s)
        for name in ("class_max_waiting", "class_max_queue_time_s"):
            for c, v in getattr(self, name).items():
                (positive_int if name == "class_max_waiting" else nonnegative)(f"{name}[{c}]", v)
        if self.policy not in ORDERINGS:
            raise InputError("policy", f"unknown scheduling policy {self.policy!r}",
                             f"choose one of: {', '.join(ORDERINGS)}")
        if self.preemption not in VICTIMS:
            raise InputError("preemption", f"unknown preemption mode {self.preemption!r}",
                             f"choose one of: {', '.join(VICTIMS)}")

    @property
    def capacity_tokens(self) -> int:
        """``M``: KV capacity in tokens."""
        return self.num_kv_blocks * self.block_size

    @classmethod
    def from_capacity(cls, capacity_tokens: float, *, block_size: int = 16, **kw) -> "EngineConfig":
        """Build from a KV capacity ``M`` in tokens (rounded down to whole blocks)."""
        M = positive("capacity_tokens", capacity_tokens)
        block_size = positive_int("block_size", block_size)
        blocks = int(math.floor(M / block_size))
        if blocks < 1:
            raise InputError("capacity_tokens", f"{M:g} tokens is less than one block of {block_size}")
        return cls(num_kv_blocks=blocks, block_size=block_size, **kw)

    def with_(self, **kw) -> "EngineConfig":
        return replace(self, **kw)
