"""The fast replica's ``Scheduler``: vLLM v1's service discipline (:mod:`llmqueue.engine.scheduler`
states it) on the waiting queue, the running requests, the implicit decoders and the block ledger.

The running requests are :attr:`Scheduler.running` (request -> admission number, in running
order): the prefilling ones are also in :attr:`Scheduler.prefilling`, the decoding ones are the
:class:`~llmqueue.engine.fast.decoders.DecoderPool`'s. A step is scheduled one of two ways:

- :meth:`Scheduler.schedule_aggregated`: the decoders as counts (each asks for one token and the
  blocks :meth:`~llmqueue.engine.fast.decoders.DecoderPool.blocks_needed_next_step` says), the
  prefilling requests one by one, then the waiting heads. When the KV cache runs short and every
  victim is a prefilling request at the tail (FCFS preemption, no prefix cache), the outcome does
  not depend on the decoders' order and is computed here (:meth:`Scheduler._preempt_tail`).
- :meth:`Scheduler.schedule`: vLLM's ``schedule()`` itself on the materialized running list
  (:meth:`Scheduler.materialize`), the same walk as the reference's ``Scheduler.schedule``. The
  replica takes it when the aggregated form cannot decide: a decoder must be preempted, or the
  token budget or the blocks bind while a decoder comes after a prefilling request.

:meth:`Scheduler.update_from_plan` and :meth:`Scheduler.update_from_output` apply a step at its
end: tokens computed, first tokens, decoders joining the pool or completing. Requests that
produced their last token wait in :attr:`Scheduler.finished` (blocks freed) for the replica to
see them out.
"""

from __future__ import annotations

from typing import Any, Final

from llmqueue.engine.fast.decoders import DecoderPool
from llmqueue.engine.fast.ledger import BlockLedger
from llmqueue.engine.host_tier import HostTier
from llmqueue.engine.output import Composition, SchedulerOutput
from llmqueue.engine.policies import PreemptNewest, victim_policy
from llmqueue.engine.request import Request, RequestStatus
from llmqueue.engine.request_queue import RequestQueue

# Final: in the compiled build a static load, not a lookup in the module's dictionary
WAITING: Final = RequestStatus.WAITING
RUNNING: Final = RequestStatus.RUNNING
PREEMPTED: Final = RequestStatus.PREEMPTED
FINISHED: Final = RequestStatus.FINISHED


class Scheduler:
    """The waiting queue, the running requests and the KV cache of one fast replica (see the
    module docstring). ``config``: an :class:`~llmqueue.engine.config.EngineConfig`;
    ``on_first_token(request)`` and ``on_preempt(request)``: called as they happen."""

    __slots__ = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "long_prefill_token_threshold",
                 "preempt_newest", "fifo", "waiting", "running", "prefilling", "running_list", "num_admitted",
                 "decoders", "kv", "victim", "finished", "composition", "num_preempted", "on_first_token",
                 "on_preempt", "tier", "step_load")

    def __init__(self, config, *, hash_block_tokens: int = 512) -> None:
        # the knobs read every step, as typed fields (a frozen EngineConfig read once; in the
        # compiled build a field is a load, an EngineConfig attribute a dictionary lookup)
        self.max_num_batched_tokens: int = int(config.max_num_batched_tokens)
        self.max_num_seqs: int = int(config.max_num_seqs)
        self.enable_chunked_prefill: bool = bool(config.enable_chunked_prefill)
        self.long_prefill_token_threshold: int = int(config.long_prefill_token_threshold)
        self.preempt_newest: bool = config.preemption == PreemptNewest.name
        self.kv = BlockLedger(config.num_kv_blocks, config.block_size, enable_caching=config.enable_prefix_caching,
                              hash_block_tokens=hash_block_tokens, reserve_full_isl=config.scheduler_reserve_full_isl,
                              max_model_len=config.max_model_len)
        self.waiting = RequestQueue(config.policy)
        self.fifo: bool = bool(self.waiting.policy.fifo)
        self.running: dict[Request, int] = {}     # running request -> admission number, in running order
        self.prefilling: dict[Request, int] = {}  # the running requests that are not decoding (same values)
        self.running_list: list = []              # the materialized running list of an exact step
        self.num_admitted = 0
        self.decoders = DecoderPool(config.block_size)
        self.victim = victim_policy(config.preemption)
        self.finished: list[Request] = []  # produced their last token, blocks freed: the replica sees them out
        self.composition = Composition()   # the aggregated step's (reused from step to step)
        self.num_preempted = 0             # by the last aggregated schedule
        self.on_first_token: Any = None
        self.on_preempt: Any = None
        self.tier: Any = HostTier(config.kv_offload_tokens, config.kv_offload_s_per_token) \
            if config.kv_offload_tokens else None
        if self.tier is not None and self.kv.pool is not None:  # evicted prefix units move down to the tier
            self.tier.unit_tokens = self.kv.unit_tokens
            self.kv.pool.lower = self.tier
        self.step_load = 0                 # KV tokens loaded back from the tier, until a step prices them

    # -- queries ---------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        request.status = WAITING
        self.waiting.add(request)

    def has_work(self) -> bool:
        return len(self.running) > 0 or self.waiting.size > 0

    def _chunk(self, request: Request, computed: int) -> int:
        """Tokens ``request`` asks for in one step before the budget: the rest of its sequence
        after ``computed`` tokens, capped at ``long_prefill_token_threshold`` (vLLM's order: the
        cap first)."""
        new = request.num_prompt_tokens + request.num_output_tokens - computed
        thr = self.long_prefill_token_threshold
        return thr if 0 < thr < new else new

    def in_system(self) -> list:
        """The requests that arrived and have not left, materialized (running, then waiting)."""
        self.materialize()
        return [*self.running, *self.waiting]

    def prefill_backlog(self, running) -> int:
        """Tokens still to prefill by the requests in ``running`` (the decoders have none)."""
        dec = self.decoders.kv_base
        return sum(r.num_tokens - r.num_computed_tokens for r in running if r not in dec and not r.is_decoding)

    def only_decodes(self) -> bool:
        """Are the next steps decode-only until an event: no request is prefilling, and the
        waiting head cannot be admitted (the token budget or ``max_num_seqs`` binds, or its blocks
        do not fit: decode steps only take blocks)? Then a stretch may jump them."""
        n = len(self.decoders.kv_base)
        if self.prefilling or n == 0 or n > self.max_num_batched_tokens:
            return False
        r = self.waiting.peek()
        if r is None:
            return True
        budget = self.max_num_batched_tokens - n
        if len(self.running) >= self.max_num_seqs or budget <= 0:
            return True
        kv = self.kv
        if kv.pool is not None:
            return False  # with prefix caching the admission check needs the cache: take a step
        c = r.offloaded_tokens or r.num_computed_tokens
        new = self._chunk(r, c)
        if not self.enable_chunked_prefill and new > budget:
            return True
        if new > budget:
            new = budget
        # else the head can be admitted now: take a normal step
        return kv.admission_blocks(r, c, new, kv.blocks.get(r, 0))[1] > kv.num_free_blocks

    def admission_closed(self) -> bool:
        """Can nothing be admitted during the coming decode steps, whatever arrives? Yes when the
        token budget or ``max_num_seqs`` binds, or, in an FCFS queue that is not empty, the head is
        blocked and arrivals queue behind it (it stays blocked: decode steps only take blocks)."""
        if len(self.running) >= self.max_num_seqs or self.max_num_batched_tokens <= len(self.decoders.kv_base):
            return True
        return self.fifo and self.waiting.size > 0

    # -- the aggregated step -----------------------------------------------------------------------
    def schedule_aggregated(self) -> list[tuple[Request, int]] | None:
        """Schedule a step with the decoders as counts: returns the explicit requests' chunks
        ``[(request, num_new_tokens)]`` (every decoder also takes one token), blocks allocated,
        :attr:`num_preempted` set; or None when the step must be taken exactly (:meth:`schedule`)."""
        budget_total = self.max_num_batched_tokens
        dec = self.decoders
        n = len(dec.kv_base)
        kv = self.kv
        bs = kv.block_size
        need_dec = dec.blocks_needed_next_step() if n else 0
        plan: list[tuple[Request, int]] = []
        budget = budget_total - n
        exact = budget < 0
        preempted = 0
        demand = n
        blocks_needed = need_dec
        blocks = kv.blocks
        if not exact:
            for r in self.prefilling:
                c = r.num_computed_tokens
                new = self._chunk(r, c)
                demand += new
                if new > budget:
                    new = budget
                if new <= 0:
                    break
                budget -= new
                blocks_needed += -(-(c + new) // bs) - blocks[r]
                plan.append((r, new))
            free = kv.num_free_blocks
            inverted = self._order_inverted() if (demand > budget_total or blocks_needed > free) else False
            if inverted:
                exact = True
            elif blocks_needed > free:
                # out of KV blocks: preempt from the tail. While the victims are prefilling requests
                # (they come after every decoder), the outcome does not depend on the decoders'
                # order and is computed here; otherwise the exact step decides.
                tail = (self._preempt_tail(n, need_dec, budget_total - n)
                        if n and self.preempt_newest and kv.pool is None else None)
                if tail is None:
                    exact = True
                else:
                    plan, budget, preempted = tail
        if exact:
            return None
        if not preempted:
            kv.allocate(blocks_needed)
        for r, new in plan:
            blocks[r] = -(-(r.num_computed_tokens + new) // bs)
        # admit waiting requests with the remaining budget (only in a step that preempted none)
        waiting = self.waiting
        while not preempted and budget > 0 and waiting.size and len(self.running) < self.max_num_seqs:
            got = self._admit_head(budget)
            if got is None:
                break
            r, new = got
            self.num_admitted += 1
            self.running[r] = self.num_admitted
            self.prefilling[r] = self.num_admitted
            plan.append((r, new))
            budget -= new
        self.num_preempted = preempted
        return plan

    def _admit_head(self, budget: int) -> tuple[Request, int] | None:
        """vLLM's admission of the waiting head with ``budget`` tokens left in the step: returns
        ``(request, num_new_tokens)`` after allocating its blocks (and its prefix-cache hits), or
        None when it cannot be scheduled in this step. The caller checks ``max_num_seqs``."""
        r = self.waiting.peek()
        if r is None:
            return None
        kv = self.kv
        computed = r.num_computed_tokens
        units = extra = 0
        held = r.offloaded_tokens  # its KV in the host tier: loaded back, not recomputed
        lower = 0  # its prefix units found in the host tier, right after its GPU hits
        tier = self.tier
        if held:
            computed = held
        elif kv.pool is not None and computed == 0 and r.hash_ids:
            units, extra = kv.get_computed_blocks(r)
            if tier is not None and tier.units:
                lower = tier.lookup_units(r.hash_ids, units, (r.num_prompt_tokens - 1) // kv.unit_tokens)
            computed = (units + lower) * kv.unit_tokens
        new = self._chunk(r, computed)
        if not self.enable_chunked_prefill and new > budget:
            return None
        if new > budget:
            new = budget
        if lower:  # they leave the tier before the allocation evicts GPU units down to it
            tier.take_units(r.hash_ids, units, lower)
        if not kv.allocate_admitted(r, computed, new, units, extra):
            if lower:
                tier.return_units(r.hash_ids, units, lower)
            return None
        self.waiting.take_head(r)
        if units or lower:
            r.num_computed_tokens = computed
        if held:
            r.num_computed_tokens = computed
            self.step_load += tier.restore(r)
        elif lower:
            self.step_load += tier.loaded_units(r, lower)
        if r.num_cached_tokens < 0:
            r.num_cached_tokens = (units + lower) * kv.unit_tokens if units or lower else 0
        r.status = RUNNING
        return r, new

    def _preempt_tail(self, n: int, need_dec: int, budget: int) -> tuple[list[tuple[Request, int]], int, int] | None:
        """vLLM's walk when blocks run out and every prefilling request comes after the decoders:
        decoders allocate first, preempting prefilling requests from the tail as needed, then the
        remaining prefilling requests take their chunks in order, preempting the tail when short.
        Returns ``(plan, budget_left, preempted)`` with the free blocks updated (decoders preempted
        from the tail when the prefilling requests' blocks are not enough)."""
        kv = self.kv
        dec = self.decoders
        prefilling = list(self.prefilling)
        blocks = kv.blocks
        avail = kv.num_free_blocks
        k = 0
        victims = []
        while need_dec > avail and k < len(prefilling):
            k += 1
            avail += blocks[prefilling[-k]]
        bs = kv.block_size
        if need_dec > avail:
            # every prefilling request goes, and decoders from the tail until the rest fit: the
            # smallest such suffix is what vLLM's walk preempts (it preempts only when short, and a
            # decoder that would have to preempt itself is that suffix's first member)
            kv_base = dec.kv_base
            steps = dec.steps
            for v in reversed(self.running):
                if need_dec <= avail:
                    break
                if v not in kv_base:
                    continue  # a prefilling request (they all come after the decoders here)
                c = kv_base[v] + steps
                avail += -(-c // bs)
                if c % bs == 0:
                    need_dec -= 1
                victims.append(v)
        preempted = 0
        for _ in range(k):
            self._preempt(prefilling.pop())
            preempted += 1
        for v in victims:
            dec.drop(v)
            self._preempt(v)
            preempted += 1
        free = avail - need_dec
        plan: list[tuple[Request, int]] = []
        idx = 0
        while idx < len(prefilling) and budget > 0:
            r = prefilling[idx]
            c = r.num_computed_tokens
            new = self._chunk(r, c)
            if new > budget:
                new = budget
            need = -(-(c + new) // bs) - blocks[r]
            gone = False
            while need > free:
                v = prefilling.pop()
                free += blocks[v]
                self._preempt(v)
                preempted += 1
                if v is r:
                    gone = True
                    break
            if gone:
                break
            free -= need
            plan.append((r, new))
            budget -= new
            idx += 1
        kv.num_free_blocks = free
        return plan, budget, preempted

    def _preempt(self, victim: Request) -> None:
        """Preempt running request ``victim`` (recompute), whose blocks the caller has freed or
        counts as freed: back to the waiting queue's front."""
        del self.running[victim]
        self.prefilling.pop(victim, None)
        self.kv.blocks.pop(victim, None)
        if self.tier is not None:
            self.tier.offload(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.status = PREEMPTED
        self.waiting.prepend(victim)
        if self.on_preempt is not None:
            self.on_preempt(victim)

    def _order_inverted(self) -> bool:
        """Does some decoder come after a prefilling request in the running order?"""
        behind = self.decoders.behind_prefill
        if not behind:
            return False
        if not self.prefilling:
            behind.clear()
            return False
        m = min(self.prefilling.values())
        running = self.running
        for d in [d for d in behind if running[d] < m]:
            behind.discard(d)
        return bool(behind)

    def update_from_plan(self, plan: list[tuple[Request, int]], num_decoders: int, t_end: float) -> None:
        """Apply an aggregated step that ended at ``t_end``: the decoders advance one token (and
        those that reached their last complete), then the planned chunks."""
        dec = self.decoders
        if num_decoders:
            dec.steps += 1
            if dec.finish_heap[0][0] <= dec.steps:
                self.complete_decoders()
        for r, new in plan:
            res = self._update_request(r, new, t_end)
            if res == 2:
                del self.prefilling[r]
                self._finish(r)
            elif res == 1:
                s = self.prefilling.pop(r)
                self._add_decoder(r)
                if self.prefilling and min(self.prefilling.values()) < s:
                    dec.behind_prefill.add(r)

    # -- the exact step: vLLM's schedule() on the materialized running list ------------------------
    def materialize(self) -> None:
        """Every decoder made explicit (its tokens and blocks), the running list in running order."""
        blocks = self.kv.blocks
        for r, b in self.decoders.drop_all():
            blocks[r] = b
        self.running_list = list(self.running)

    def schedule(self) -> SchedulerOutput:
        """One pass of vLLM's ``schedule()`` over :attr:`running_list` (after :meth:`materialize`):
        running requests in order, preempting the victim policy's choice while blocks run short,
        then waiting heads in a step that preempted none."""
        budget = self.max_num_batched_tokens
        running = self.running_list
        kv = self.kv
        out = SchedulerOutput()
        scheduled = out.scheduled
        k = 0
        while k < len(running) and budget > 0:
            r = running[k]
            new = self._chunk(r, r.num_computed_tokens)
            if new > budget:
                new = budget
            ok = True
            while not kv.allocate_slots(r, new):
                v = self.victim.victim(running)
                pos = running.index(v)
                if pos < k:  # already scheduled in this step (priority preemption): it gives its tokens back
                    for m, (j, nj) in enumerate(scheduled):
                        if j is v:
                            budget += nj
                            del scheduled[m]
                            break
                    k -= 1
                del running[pos]
                kv.free(v)
                self._preempt(v)
                out.preempted.append(v)
                if v is r:
                    ok = False
                    break
            if not ok:
                break  # r preempted itself: no more running requests this step (vLLM breaks)
            scheduled.append((r, new))
            budget -= new
            k += 1
        if not out.preempted:
            while budget > 0 and len(running) < self.max_num_seqs:
                got = self._admit_head(budget)
                if got is None:
                    break
                r, new = got
                running.append(r)
                self.num_admitted += 1
                self.running[r] = self.num_admitted
                scheduled.append((r, new))
                budget -= new
        out.count()  # its composition, as the step-time model prices it
        if self.step_load:  # requests resumed from the host tier: their KV loads in this step
            out.composition.load_tokens = self.step_load
            self.step_load = 0
        return out

    def update_from_output(self, scheduled: list[tuple[Request, int]], t_end: float) -> None:
        """Apply an exact step that ended at ``t_end``: the scheduled tokens are computed; back to
        the aggregated form (:meth:`rebuild`)."""
        for r, new in scheduled:
            if self._update_request(r, new, t_end) == 2:
                self.running_list.remove(r)
                self._finish(r)
        self.rebuild()

    def rebuild(self) -> None:
        """Re-derive the running order, the prefilling requests and the decoders from the exact
        step's running list."""
        self.prefilling.clear()
        running = self.running
        for r in self.running_list:
            if r not in running:
                self.num_admitted += 1
                running[r] = self.num_admitted
        self.running = running = {r: running[r] for r in self.running_list}
        for r, s in running.items():
            if r.num_output_tokens > 0 and r.num_computed_tokens == r.num_prompt_tokens + r.num_output_tokens - 1:
                self._add_decoder(r)
            else:
                self.prefilling[r] = s
        behind = self.decoders.behind_prefill
        behind.clear()
        if self.prefilling:
            m = min(self.prefilling.values())
            behind.update(d for d in self.decoders.kv_base if running[d] > m)

    # -- tokens, completions, departures -----------------------------------------------------------
    def _update_request(self, r: Request, new: int, t_end: float) -> int:
        """Apply ``new`` computed tokens of ``r`` at the end of a step: 0 = no token yet (prefill
        continues), 1 = a token was produced, 2 = the last token was produced."""
        c = r.num_computed_tokens + new
        r.num_computed_tokens = c
        if self.kv.pool is not None:
            self.kv.cache_blocks(r)
        o = r.num_output_tokens
        if c != r.num_prompt_tokens + o:
            return 0
        o += 1
        r.num_output_tokens = o
        if o == 1:
            r.first_token_time = t_end
            if self.on_first_token is not None:
                self.on_first_token(r)
        return 2 if o == r.max_tokens else 1

    def _add_decoder(self, r: Request) -> None:
        """Running request ``r`` now decodes: it joins the pool (its blocks counted there)."""
        self.decoders.add(r, self.running[r])
        self.kv.blocks.pop(r, None)

    def complete_decoders(self) -> None:
        """Decoders whose last token came in the step(s) just ended finish."""
        dec = self.decoders
        kv = self.kv
        plain = kv.pool is None  # no prefix cache: a decoder's blocks simply return to the free count
        running = self.running
        finished = self.finished
        while True:
            r = dec.pop_finished()
            if r is None:
                return
            held = dec.drop(r)
            del running[r]
            r.status = FINISHED
            if plain:
                kv.num_free_blocks += held
            else:
                kv.free(r, held)
            finished.append(r)

    def _finish(self, r: Request) -> None:
        """``r`` produced its last token: its blocks freed, it waits to be seen out."""
        self.running.pop(r, None)
        r.status = FINISHED
        self.kv.free(r)
        self.finished.append(r)

    def abort(self, request: Request) -> None:
        """Take a request out (a client timeout, shedding): from the running requests (its blocks
        freed) or the queue (its entry is skipped from now on)."""
        if request.status is RUNNING:
            if request in self.decoders.kv_base:
                self.kv.free(request, self.decoders.drop(request))
            else:
                self.prefilling.pop(request, None)
                self.kv.free(request)
            del self.running[request]
        else:
            self.waiting.remove(request)
            if self.tier is not None:
                self.tier.drop(request)
        request.status = FINISHED
