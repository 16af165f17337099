"""The fast path's exact step: vLLM v1's ``schedule()`` on the fast replica's request table.

The fast replica (:mod:`llmqueue.engine.replica`) takes a step this way whenever its aggregated
decoders cannot decide the outcome (a preemption, a token budget that binds out of order): the
running list is materialized and every request handled in order. It works on the parallel
columns of :class:`~llmqueue.engine.base.BaseReplica`, not on the engine's nouns; the reference
replica (:mod:`llmqueue.engine.reference`) is the independent specification both are tested against.
"""

from __future__ import annotations

from llmqueue.engine.base import BaseReplica


class ExactStepper(BaseReplica):
    """One step at a time with every running request explicit (``self.running``: indices in order)."""


    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.running: list[int] = []

    # -- KV blocks ------------------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def remove_running(self, i: int) -> None:
        self.running.remove(i)
        self.release(i)

    def preempt_victim(self) -> int:
        if self.cfg.preemption == "lowest-priority":
            return max(self.running, key=lambda j: (self.prio[j], self.arr[j], j))
        return self.running[-1]

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self):
        """vLLM v1's schedule(): returns [(request, new_tokens)] and the number preempted."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        scheduled: list[tuple[int, int]] = []
        preempted = 0
        k = 0
        while k < len(self.running) and budget > 0:
            i = self.running[k]
            new = self.prompt[i] + self.outp[i] - self.comp[i]
            if thr and new > thr:
                new = thr
            new = min(new, budget)
            ok = True
            while True:
                need = self.blocks_for(self.comp[i] + new) - self.blocks[i]
                if need <= self.free:
                    self.alloc(need)
                    self.blocks[i] += need
                    break
                v = self.preempt_victim()
                pos = self.running.index(v)
                if pos < k:  # already scheduled in this step (priority preemption): undo it
                    for m, (j, nj) in enumerate(scheduled):
                        if j == v:
                            budget += nj
                            del scheduled[m]
                            break
                    k -= 1
                self.running.remove(v)
                self.release(v)
                self.comp[v] = 0
                self.npre[v] += 1
                self.state[v] = 1
                self.wait_inc(v)
                self.push_waiting(v, front=True)
                preempted += 1
                if v == i:
                    ok = False
                    break
            if not ok:
                break  # i preempted itself: no more running requests this step (vLLM breaks)
            scheduled.append((i, new))
            budget -= new
            k += 1
        if preempted == 0:
            while budget > 0 and len(self.running) < cfg.max_num_seqs:
                got = self.admit_head(budget)
                if got is None:
                    break
                i, new = got
                self.running.append(i)
                scheduled.append((i, new))
                budget -= new
        return scheduled, preempted

    def step(self, t: float) -> float:
        scheduled, preempted = self.schedule()
        while not scheduled and preempted:
            # everything scheduled was preempted: the freed blocks let the next pass admit work
            scheduled, more = self.schedule()
            preempted += more
        if not scheduled:
            return t
        prefill = decode = context = 0
        for i, new in scheduled:
            if self.first_sched[i] != self.first_sched[i]:
                self.first_sched[i] = t
            if new == 1 and self.comp[i] == self.prompt[i] + self.outp[i] - 1 and self.outp[i] > 0:
                decode += 1
                context += self.comp[i] + 1
            else:
                prefill += new
        dur = self.step_duration(prefill, decode, context, t)
        t_end = t + dur
        self.sample_until(t_end, self.n_waiting, len(self.running), (self.total_blocks - self.free) * self.bs)
        self.record_step(t, dur, prefill, decode, len(self.running), self.n_waiting,
                         (self.total_blocks - self.free) * self.bs, preempted)
        self.steps_taken += 1
        for i, new in scheduled:
            if self.advance(i, new, t_end) == 2:
                self.running.remove(i)
                self.release(i)
                self.end(i, "ok", t_end)
        return t_end
