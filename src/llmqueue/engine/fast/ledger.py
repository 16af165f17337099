"""``BlockLedger``: the fast replica's paged KV cache, the twin of
:class:`~llmqueue.engine.kv_cache_manager.KVCacheManager` (the memory constraint ``M``).

``num_blocks`` blocks of ``block_size`` tokens; ``num_free_blocks`` of them free. A running request
that is not an implicit decoder has its blocks in :attr:`BlockLedger.blocks`; an implicit decoder
holds ``ceil(kv_tokens / block_size)`` blocks, counted by the
:class:`~llmqueue.engine.fast.decoders.DecoderPool` and already taken from the free count, so a
decode step takes only the blocks its decoders' new tokens open (the pool knows how many).

With prefix caching the block pool is the :class:`~llmqueue.engine.prefix_cache.PrefixCache`
(the free-block queue and the cached prefix units): :meth:`get_computed_blocks` finds a waiting
request's cached leading units, :meth:`allocate_slots` takes them with its new blocks,
:meth:`cache_blocks` registers the units a step's prefill completed, :meth:`free` returns private
blocks and the units nobody else uses.
"""

from __future__ import annotations

from typing import Any, Final

from llmqueue.engine.request import Request, RequestStatus
from llmqueue.errors import InputError

FINISHED: Final = RequestStatus.FINISHED


class BlockLedger:
    """Block accounting for one fast replica (see the module docstring).

    ``reserve_full_isl``: a waiting request is admitted only when its whole sequence so far fits
    (vLLM's ``scheduler_reserve_full_isl``), capped at ``max_model_len`` (0: no cap).
    """

    __slots__ = ("num_blocks", "block_size", "num_free_blocks", "blocks", "pool", "unit_tokens", "unit_blocks",
                 "units", "no_register", "reserve_full_isl", "max_model_len")

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = False,
                 hash_block_tokens: int = 512, reserve_full_isl: bool = True, max_model_len: int = 0) -> None:
        self.num_blocks: int = int(num_blocks)
        self.block_size: int = int(block_size)
        self.num_free_blocks: int = self.num_blocks
        self.reserve_full_isl: bool = bool(reserve_full_isl)
        self.max_model_len: int = int(max_model_len or 0)
        self.blocks: dict[Request, int] = {}  # blocks held by running requests that are not implicit decoders
        self.units: dict[Request, int] = {}   # running request -> its leading prefix units referenced or registered
        self.no_register: set[Request] = set()  # requests that met a unit cached by another (kept across preemptions)
        self.pool: Any = None
        self.unit_tokens: int = 1  # a prefix unit's tokens and blocks, set with the cache
        self.unit_blocks: int = 0
        if enable_caching:
            from llmqueue.engine.prefix_cache import PrefixCache

            if hash_block_tokens < 1 or hash_block_tokens % block_size:
                raise InputError("hash_block_tokens",
                                 f"{hash_block_tokens} is not a multiple of the block size {block_size}")
            self.unit_tokens = int(hash_block_tokens)
            self.unit_blocks = self.unit_tokens // self.block_size
            self.pool = PrefixCache(num_blocks, self.unit_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def allocate(self, n: int) -> None:
        """Take ``n`` free blocks (from the head of the free queue, evicting cached prefixes)."""
        self.num_free_blocks -= n
        if self.pool is not None and n:
            self.pool.consume(n)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grant the blocks for ``num_new_tokens`` more tokens of running ``request`` (its blocks
        in :attr:`blocks`), or refuse (False) without changing anything."""
        need = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - self.blocks[request]
        if need > self.num_free_blocks:
            return False
        self.allocate(need)
        self.blocks[request] += need
        return True

    def admission_blocks(self, request: Request, computed: int, num_new_tokens: int, held: int) -> tuple[int, int]:
        """``(need, gate)`` for admitting waiting ``request`` (``computed`` tokens computed or cached,
        ``num_new_tokens`` scheduled, ``held`` blocks already its own): the blocks its chunk
        allocates, and the free blocks admission requires: the chunk's, or with
        ``reserve_full_isl`` those of its whole sequence so far (prompt + tokens generated before
        a preemption)."""
        bs = self.block_size
        need = -(-(computed + num_new_tokens) // bs) - held  # cdiv, inline
        if self.reserve_full_isl:
            full = request.num_prompt_tokens + request.num_output_tokens
            if self.max_model_len and full > self.max_model_len:
                full = self.max_model_len
            gate = -(-full // bs) - held
            if gate > need:
                return need, gate
        return need, need

    def get_computed_blocks(self, request: Request) -> tuple[int, int]:
        """``(num_units, extra_blocks)``: the waiting request's leading prefix units found in the
        cache (at most all but the prompt's last token, which is always computed) and the free
        blocks that taking them removes (units that were evictable)."""
        h = request.hash_ids
        if self.pool is None or not h or request.num_computed_tokens:
            return 0, 0
        return self.pool.lookup(h, (request.num_prompt_tokens - 1) // self.unit_tokens)

    def allocate_admitted(self, request: Request, computed: int, num_new_tokens: int, units: int, extra: int) -> bool:
        """Admit waiting ``request``: its ``units`` cached prefix units (``extra`` of their blocks
        evictable, taken from the free queue; ``computed`` tokens computed or cached in all) and the
        blocks of ``num_new_tokens`` more tokens, if the admission gate (:meth:`admission_blocks`)
        passes; else refuse (False), changing nothing."""
        held = self.blocks.get(request, 0) + (units * self.unit_blocks if units else 0)
        need, gate = self.admission_blocks(request, computed, num_new_tokens, held)
        if gate + extra > self.num_free_blocks:
            return False
        if units:
            self.pool.take(request.hash_ids, units)
            self.num_free_blocks -= extra
            self.units[request] = units
        self.allocate(need)
        self.blocks[request] = held + need
        return True

    def free(self, request: Request, implicit_blocks: int = 0) -> None:
        """Return ``request``'s blocks (those in :attr:`blocks`, plus ``implicit_blocks`` an
        implicit decoder held): private ones, then its prefix units nobody else uses."""
        b = self.blocks.pop(request, 0) + implicit_blocks
        if self.pool is None:
            self.num_free_blocks += b
        else:
            k = self.units.pop(request, 0)
            units = request.hash_ids[:k] if k and request.hash_ids is not None else ()
            self.num_free_blocks += self.pool.free_request(b - k * self.unit_blocks, units)
            if request.status is FINISHED:
                self.no_register.discard(request)

    def cache_blocks(self, request: Request) -> None:
        """After a step: register the prefix units whose prefill ``request`` has completed (stops
        at the first unit already cached by another request, which it keeps privately)."""
        h = request.hash_ids
        if h is None or request in self.no_register:
            return
        u = self.units.get(request, 0)
        done = min(request.num_computed_tokens, request.num_prompt_tokens) // self.unit_tokens
        while u < done and u < len(h):
            if not self.pool.register(h[u]):
                self.no_register.add(request)
                break
            u += 1
        self.units[request] = u
