"""``PoolView``: what a router may read of one pool's replicas at the moment it routes.

Read-only and cheap: the fleet keeps each replica's outstanding count (requests it holds,
waiting plus running: ``N_i`` in queueing terms) as requests are handed over and leave, so
join-the-shortest-queue costs one pass over a list; the rest is read from the replica when asked.
Only the replicas in ``routable`` serve (not provisioning, failed or draining).
"""

from __future__ import annotations


class PoolView:
    """Replica slots ``0..n-1`` of one pool. ``outstanding[i]``: requests replica ``i`` holds;
    ``pending_prefill[i]``: prompt tokens of those without a first token yet (its prefill backlog);
    ``routable``: the slots that take requests now (ascending); ``max_num_seqs``: sequence slots
    per replica; ``kv_blocks_total``: KV blocks per replica."""

    __slots__ = ("name", "reps", "outstanding", "routable", "max_num_seqs", "kv_blocks_total", "block_size",
                 "hash_block_tokens", "pending_prefill")

    def __init__(self, name: str, reps: list, outstanding: list, routable: list, config, hash_block_tokens: int = 512,
                 pending_prefill: list | None = None):
        self.name = name
        self.pending_prefill = pending_prefill if pending_prefill is not None else [0] * len(outstanding)
        self.reps = reps
        self.outstanding = outstanding
        self.routable = routable
        self.max_num_seqs = config.max_num_seqs
        self.kv_blocks_total = config.num_kv_blocks
        self.block_size = config.block_size
        self.hash_block_tokens = hash_block_tokens

    @property
    def n(self) -> int:
        return len(self.reps)

    def num_waiting(self, i: int) -> int:
        """Requests replica ``i`` holds that are not running (queued, or handed over and not yet
        seen by its scheduler)."""
        rep = self.reps[i]
        return len(rep.waiting) + len(rep._arrivals)

    def num_running(self, i: int) -> int:
        return self.outstanding[i] - self.num_waiting(i)

    def kv_blocks_free(self, i: int) -> int:
        return self.reps[i].free

    def kv_usage(self, i: int) -> float:
        """Share of replica ``i``'s KV blocks in use (0..1)."""
        return 1.0 - self.reps[i].free / self.kv_blocks_total

    def least_outstanding(self) -> int:
        """The routable replica holding the fewest requests (ties to the lowest index)."""
        out = self.outstanding
        r = self.routable
        if len(r) == len(out):
            return out.index(min(out))
        return min(r, key=out.__getitem__)
