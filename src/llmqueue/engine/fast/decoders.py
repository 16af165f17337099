"""``DecoderPool``: the running requests that are decoding, kept implicitly.

Between events every decoding request gains one token a step: it is the same customer in
service, one step further. So the pool keeps one common counter, :attr:`DecoderPool.steps` (the
decode steps all decoders took together), and per decoder only where it stood when it joined:
its KV tokens are ``kv_base[r] + steps``, its output tokens ``output_base[r] + steps``, and it
produces its last token in the step where ``steps`` reaches ``finish_step[r]``. What changes the
state between events is then known in advance:

- the next completion is the smallest finish step, the top of :attr:`finish_heap`;
- a decoder opens a new KV block in the step where its token count is a multiple of the block
  size, so the blocks all decoders need in any step come from :attr:`residues`, the histogram of
  ``kv_base mod block_size``: the blocks needed over ``k`` steps, and the number of steps the
  free blocks last, are O(block_size) (:meth:`blocks_needed`, :meth:`steps_within`).

A decoder leaves the pool by :meth:`drop`, which makes its counts explicit again (materializes
it) for the exact step, a preemption, a timeout or its completion.
"""

from __future__ import annotations

import heapq
from typing import Final

from llmqueue.engine.request import Request

_heappush: Final = heapq.heappush
_heappop: Final = heapq.heappop


class DecoderPool:
    """The implicit decoders of one replica (see the module docstring); ``block_size`` of its KV cache.

    ``behind_prefill``: decoders that may come after a prefilling request in the running order
    (a superset, kept by the scheduler): a step whose budget or blocks run short must then be
    taken exactly, as the order decides who gets them.
    """

    __slots__ = ("block_size", "steps", "kv_base", "output_base", "finish_step", "finish_heap", "residues",
                 "kv_base_sum", "behind_prefill")

    def __init__(self, block_size: int) -> None:
        self.block_size: int = int(block_size)
        self.steps: int = 0  # decode steps taken by every decoder together
        self.kv_base: dict[Request, int] = {}      # decoder -> KV tokens minus steps
        self.output_base: dict[Request, int] = {}  # decoder -> output tokens minus steps
        self.finish_step: dict[Request, int] = {}  # decoder -> the value of steps after its last token
        self.finish_heap: list[tuple[int, int, Request]] = []  # (finish step, admission number, decoder); stale entries skipped
        self.residues: list[int] = [0] * self.block_size  # decoders by kv_base mod block_size
        self.kv_base_sum: int = 0
        self.behind_prefill: set[Request] = set()

    @property
    def count(self) -> int:
        """The number of implicit decoders."""
        return len(self.kv_base)

    def add(self, request: Request, admission: int) -> None:
        """``request`` (its prompt computed, its next step a one-token decode) joins the pool;
        ``admission``: its admission number (ties of finish steps go to the earlier admitted)."""
        db = request.num_computed_tokens - self.steps
        ob = request.num_output_tokens - self.steps
        self.kv_base[request] = db
        self.output_base[request] = ob
        f = request.max_tokens - ob
        self.finish_step[request] = f
        _heappush(self.finish_heap, (f, admission, request))
        self.residues[db % self.block_size] += 1
        self.kv_base_sum += db

    def drop(self, request: Request, at_step: int = -1) -> int:
        """Take ``request`` out of the pool, its counts made explicit as of decode step ``at_step``
        (-1: now): its computed and output tokens set; returns the KV blocks it holds."""
        db = self.kv_base.pop(request)
        ob = self.output_base.pop(request)
        del self.finish_step[request]
        self.residues[db % self.block_size] -= 1
        self.kv_base_sum -= db
        self.behind_prefill.discard(request)
        steps = self.steps if at_step < 0 else at_step
        c = db + steps
        request.num_computed_tokens = c
        request.num_output_tokens = ob + steps
        return -(-c // self.block_size)

    def drop_all(self) -> list[tuple[Request, int]]:
        """Every decoder out of the pool (materialized), with the blocks it holds."""
        out = [(r, self.drop(r)) for r in list(self.kv_base)]
        self.finish_heap.clear()
        return out

    def next_finish_step(self) -> int:
        """The smallest finish step among the decoders (-1 when there are none)."""
        heap = self.finish_heap
        finish_step = self.finish_step
        while heap and finish_step.get(heap[0][2]) != heap[0][0]:
            _heappop(heap)  # stale: the decoder left (or rejoined) since
        return heap[0][0] if heap else -1

    def pop_finished(self) -> Request | None:
        """A decoder whose last token has come (its finish step reached), still in the pool; None
        when there is none. Finish-step order, ties by admission."""
        heap = self.finish_heap
        finish_step = self.finish_step
        steps = self.steps
        while heap and heap[0][0] <= steps:
            step, _, r = _heappop(heap)
            if finish_step.get(r) == step:
                return r
        return None

    def context_tokens(self) -> int:
        """KV tokens the decoders attend over in the next step, their new tokens included."""
        n = len(self.kv_base)
        return self.kv_base_sum + n * self.steps + n

    def blocks_needed_next_step(self) -> int:
        """New blocks the decoders open in the next step (those whose KV tokens fill a block)."""
        return self.residues[(-self.steps) % self.block_size]

    def blocks_needed(self, k: int) -> int:
        """New blocks the decoders open over the next ``k`` steps."""
        n = len(self.kv_base)
        bs = self.block_size
        periods = k // bs
        rem = k - periods * bs
        total = periods * n
        residues = self.residues
        i = (-(self.steps + periods * bs)) % bs  # residues' index for step m, walking down
        for _ in range(rem):
            total += residues[i]
            i = i - 1 if i else bs - 1
        return total

    def steps_within(self, free: int, k_max: int) -> int:
        """The largest ``k <= k_max`` such that the next ``k`` decode steps' new blocks fit in
        ``free`` blocks."""
        n = len(self.kv_base)
        bs = self.block_size
        residues = self.residues
        k = 0
        if free >= 2 * n:
            periods = free // n - 1
            k = periods * bs
            free -= periods * n
            if k >= k_max:
                return k_max
        i = (-(self.steps + k)) % bs  # residues' index for step k, walking down (no modulo per step)
        while k < k_max:
            need = residues[i]
            if need > free:
                return k
            free -= need
            k += 1
            i = i - 1 if i else bs - 1
        return k_max

    def held_blocks(self) -> int:
        """KV blocks the decoders hold in all."""
        bs = self.block_size
        steps = self.steps
        return sum(-(-(db + steps) // bs) for db in self.kv_base.values())
