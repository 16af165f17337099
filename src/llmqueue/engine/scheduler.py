"""``Scheduler.schedule() -> SchedulerOutput``: one engine step's batch, as vLLM v1 decides it.

The service discipline of a replica, read from vLLM's ``vllm/v1/core/sched/scheduler.py``:

1. A token budget per step, ``max_num_batched_tokens`` (the chunk size with chunked prefill).
2. RUNNING requests first, in list order: each asks for ``num_tokens - num_computed_tokens``
   tokens (one for a decoding request; the rest of its prompt, capped at
   ``long_prefill_token_threshold``, for a prefilling one), at most the budget left. When the KV
   cache cannot grant the blocks, the victim policy preempts a running request (recompute: its
   blocks are freed, ``num_computed_tokens`` = 0, it rejoins the waiting queue), repeatedly, until
   the blocks fit; a request that has to preempt itself ends the running pass (vLLM ``break``s).
   A victim already scheduled in this step gives back its tokens (priority preemption).
3. WAITING requests next, only in a step that preempted none, while the budget lasts and fewer
   than ``max_num_seqs`` run: the queue's head, after its cached prefix, asks for the rest of its
   sequence (capped as above); without chunked prefill it must fit the budget whole. The first
   head that cannot be granted its blocks (with the whole-sequence gate) stops the pass.

:meth:`Scheduler.update_from_output` applies the step at its end: computed tokens advance, a
request whose KV has caught up with its sequence emits a token, one that reached ``max_tokens``
finishes and frees its blocks.
"""

from __future__ import annotations

from llmqueue.engine.host_tier import HostTier
from llmqueue.engine.kv_cache_manager import KVCacheManager
from llmqueue.engine.output import SchedulerOutput
from llmqueue.engine.policies import victim_policy
from llmqueue.engine.request import RequestStatus
from llmqueue.engine.request_queue import RequestQueue


class Scheduler:
    """The waiting queue, the running list and the KV cache of one replica (see the module
    docstring). ``config`` is an :class:`~llmqueue.engine.config.EngineConfig`."""

    def __init__(self, config, *, hash_block_tokens: int = 512):
        self.config = config
        self.kv = KVCacheManager(config.num_kv_blocks, config.block_size,
                                 enable_caching=config.enable_prefix_caching, hash_block_tokens=hash_block_tokens,
                                 reserve_full_isl=config.scheduler_reserve_full_isl, max_model_len=config.max_model_len)
        self.waiting = RequestQueue(config.policy)
        self.running: list = []
        self.victim = victim_policy(config.preemption)
        self.tier = HostTier(config.kv_offload_tokens, config.kv_offload_s_per_token) if config.kv_offload_tokens else None
        if self.tier is not None and self.kv.pool is not None:  # evicted prefix units move down to the tier
            self.tier.unit_tokens = self.kv.unit_tokens
            self.kv.pool.lower = self.tier

    def add_request(self, request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.add(request)

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def _chunk(self, request, computed: int) -> int:
        """Tokens the request asks for in one step, before the budget: the rest of its sequence,
        capped at ``long_prefill_token_threshold``."""
        new = request.num_tokens - computed
        thr = self.config.long_prefill_token_threshold
        return thr if 0 < thr < new else new

    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        kv = self.kv
        running = self.running
        budget = cfg.max_num_batched_tokens
        out = SchedulerOutput()
        scheduled = out.scheduled
        k = 0
        while k < len(running) and budget > 0:
            r = running[k]
            new = min(self._chunk(r, r.num_computed_tokens), budget)
            while not kv.allocate_slots(r, new):
                v = self.victim.victim(running)
                pos = running.index(v)
                del running[pos]
                if pos < k:  # scheduled earlier in this step: it gives its tokens back
                    for m, (j, nj) in enumerate(scheduled):
                        if j is v:
                            budget += nj
                            del scheduled[m]
                            break
                    k -= 1
                self._preempt(v)
                out.preempted.append(v)
                if v is r:
                    break
            if r.status is not RequestStatus.RUNNING:
                break  # r preempted itself: no more running requests this step (vLLM)
            scheduled.append((r, new))
            budget -= new
            k += 1
        if not out.preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                r = waiting.peek()
                held = r.offloaded_tokens  # its KV in the host tier: loaded back, not recomputed
                lower = 0  # its prefix units found in the host tier, right after its GPU hits
                if held:
                    units = extra = 0
                    computed = held
                else:
                    units, extra = kv.get_computed_blocks(r)
                    computed = r.num_computed_tokens + (units * kv.unit_tokens if units else 0)
                    if self.tier is not None and self.tier.units and r.hash_ids and not r.num_computed_tokens:
                        lower = self.tier.lookup_units(r.hash_ids, units, (r.num_prompt_tokens - 1) // kv.unit_tokens)
                        computed += lower * kv.unit_tokens
                new = self._chunk(r, computed)
                if not cfg.enable_chunked_prefill and new > budget:
                    break
                new = min(new, budget)
                if held:  # allocate_slots counts the computed tokens the request holds
                    r.num_computed_tokens = held
                if lower:
                    self.tier.take_units(r.hash_ids, units, lower)
                if not kv.allocate_slots(r, new, (units, extra), admitting=True,
                                        loaded=lower * kv.unit_tokens if lower else 0):
                    if held:
                        r.num_computed_tokens = 0
                    if lower:
                        self.tier.return_units(r.hash_ids, units, lower)
                    break
                waiting.pop()
                if held:
                    out.composition.load_tokens += self.tier.restore(r)
                elif lower:
                    out.composition.load_tokens += self.tier.loaded_units(r, lower)
                r.num_computed_tokens = computed
                if r.num_cached_tokens < 0:
                    r.num_cached_tokens = (units + lower) * kv.unit_tokens if units or lower else 0
                r.status = RequestStatus.RUNNING
                running.append(r)
                scheduled.append((r, new))
                budget -= new
        out.count()  # its composition, as the step-time model prices it
        return out

    def _preempt(self, v) -> None:
        """Preemption: free the blocks, the computed tokens to the host tier if it has room (else
        forgotten: recompute), back to the queue."""
        self.kv.free(v)
        if self.tier is not None:
            self.tier.offload(v)
        v.num_computed_tokens = 0
        v.num_preemptions += 1
        v.status = RequestStatus.PREEMPTED
        self.waiting.prepend(v)

    def update_from_output(self, out: SchedulerOutput, t_end: float) -> list:
        """Apply a step that ended at ``t_end``; returns the requests that finished (their
        blocks freed, ``outcome`` not yet set: the caller decides ok or a late timeout)."""
        finished = []
        kv = self.kv
        for r, new in out.scheduled:
            r.num_computed_tokens += new
            kv.cache_blocks(r)
            if r.num_computed_tokens != r.num_tokens:
                continue  # prefill continues
            r.num_output_tokens += 1
            if r.num_output_tokens == 1:
                r.first_token_time = t_end
            if r.num_output_tokens == r.max_tokens:
                self.running.remove(r)
                r.status = RequestStatus.FINISHED
                kv.free(r)
                finished.append(r)
        return finished

    def abort(self, request) -> None:
        """Take a request out (a client timeout, shedding): from the queue or the running list."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            request.status = RequestStatus.FINISHED
            self.kv.free(request)
        else:
            self.waiting.remove(request)
            request.status = RequestStatus.FINISHED  # its queue entry is skipped from now on
            if self.tier is not None:
                self.tier.drop(request)
