"""``KVCacheManager``: the paged KV cache of one replica (vLLM v1's ``KVCacheManager``).

The memory constraint of the queue: ``num_blocks`` blocks of ``block_size`` tokens, ``M =
num_blocks x block_size`` tokens in all. A running request holds ``ceil(num_computed_tokens /
block_size)`` blocks (after a step's allocation: ``ceil((num_computed_tokens + new) /
block_size)``). :meth:`allocate_slots` grants a step's new blocks or refuses (the scheduler then
preempts); :meth:`free` returns a request's blocks.

With prefix caching (``enable_caching``), prompts carry ``hash_ids``, one per
``hash_block_tokens`` tokens (Mooncake: 512); the block pool (:class:`~llmqueue.engine.prefix_cache.PrefixCache`)
keeps the free-block queue and the table of cached prefix units. :meth:`get_computed_blocks`
finds a waiting request's cached leading units, :meth:`allocate_slots` takes them with the new
blocks, :meth:`cache_blocks` registers the units a step's prefill completed. The hit accounting
(``prefix_cache_queries``, ``prefix_cache_hits``, in tokens) follows vLLM's counters, counted
once per admission.
"""

from __future__ import annotations

from typing import Any

from llmqueue.errors import InputError


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the blocks that ``a`` tokens need at ``b`` tokens per block."""
    return -(-a // b)


class KVCacheManager:
    """Block accounting for one replica (see the module docstring).

    ``reserve_full_isl``: a waiting request is admitted only when its whole sequence so far
    (prompt plus tokens generated before a preemption, capped at ``max_model_len``) fits in the
    free blocks, not only this step's chunk (vLLM's ``scheduler_reserve_full_isl``).
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = False,
                 hash_block_tokens: int = 512, reserve_full_isl: bool = True, max_model_len: int = 0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserve_full_isl = reserve_full_isl
        self.max_model_len = max_model_len
        self.num_free_blocks = num_blocks
        self._held: dict = {}  # request -> [blocks, prefix units referenced or registered]
        self._no_register: set = set()  # requests that met a unit cached by another (kept across preemptions)
        self.pool: Any = None
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        if enable_caching:
            from llmqueue.engine.prefix_cache import PrefixCache

            H = hash_block_tokens
            if H < 1 or H % block_size:
                raise InputError("hash_block_tokens", f"{H} is not a multiple of the block size {block_size}")
            self.unit_tokens = H
            self.unit_blocks = H // block_size
            self.pool = PrefixCache(num_blocks, self.unit_blocks)

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the KV cache in use (vLLM's ``kv_cache_usage``)."""
        return self.num_used_blocks / self.num_blocks

    def blocks_of(self, request) -> int:
        h = self._held.get(request)
        return h[0] if h else 0

    def get_computed_blocks(self, request) -> tuple[int, int]:
        """``(num_units, extra_blocks)``: the request's leading prefix units found in the cache
        (at most all but the prompt's last token, which is always computed) and the free
        blocks that taking them removes (units that were evictable)."""
        if self.pool is None or not request.hash_ids or request.num_computed_tokens:
            return 0, 0
        return self.pool.lookup(request.hash_ids, (request.num_prompt_tokens - 1) // self.unit_tokens)

    # -- allocation ------------------------------------------------------------------------------
    def allocate_slots(self, request, num_new_tokens: int, computed: tuple[int, int] = (0, 0),
                       admitting: bool = False, loaded: int = 0) -> bool:
        """Grant the blocks for ``num_new_tokens`` more tokens of ``request`` (after its
        ``computed`` prefix units, for a request being admitted, and ``loaded`` tokens of prefix
        units that come from the host tier into new blocks), or refuse (False) without changing
        anything. ``admitting`` applies the whole-sequence gate."""
        units, extra = computed
        held = self.blocks_of(request) + units * (self.unit_blocks if units else 0)
        computed_tokens = request.num_computed_tokens + (units * self.unit_tokens if units else 0) + loaded
        need = cdiv(computed_tokens + num_new_tokens, self.block_size) - held
        gate = need
        if admitting and self.reserve_full_isl:
            full = request.num_tokens
            if self.max_model_len:
                full = min(full, self.max_model_len)
            gate = max(gate, cdiv(full, self.block_size) - held)
        if gate + extra > self.num_free_blocks:
            return False
        entry = self._held.setdefault(request, [0, 0])
        if units:
            self.pool.take(request.hash_ids, units)
            self.num_free_blocks -= extra
            entry[0] += units * self.unit_blocks
            entry[1] = units
            self.prefix_cache_hits += units * self.unit_tokens
        if admitting and self.pool is not None and request.hash_ids and request.num_computed_tokens == 0:
            self.prefix_cache_queries += request.num_prompt_tokens
        self.num_free_blocks -= need
        if self.pool is not None and need:
            self.pool.consume(need)
        entry[0] += need
        return True

    def free(self, request) -> None:
        """Return ``request``'s blocks: private ones, then its prefix units nobody else uses
        (call it after marking a request that leaves the replica finished)."""
        if request.is_finished:
            self._no_register.discard(request)
        entry = self._held.pop(request, None)
        if entry is None:
            return
        blocks, units = entry
        if self.pool is None:
            self.num_free_blocks += blocks
        else:
            shared = request.hash_ids[:units] if units else ()
            self.num_free_blocks += self.pool.free_request(blocks - units * self.unit_blocks, shared)

    def cache_blocks(self, request) -> None:
        """After a step: register the prefix units whose prefill ``request`` has completed
        (stops at the first unit already cached by another request, which it keeps privately)."""
        if self.pool is None or not request.hash_ids:
            return
        entry = self._held.get(request)
        if entry is None or request in self._no_register:
            return
        h = request.hash_ids
        u = entry[1]
        done = min(request.num_computed_tokens, request.num_prompt_tokens) // self.unit_tokens
        while u < done and u < len(h):
            if not self.pool.register(h[u]):
                self._no_register.add(request)
                break
            u += 1
        entry[1] = u
