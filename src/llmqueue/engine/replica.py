"""The fast replica simulator: vLLM v1 scheduling semantics, cost not proportional to
decode steps x batch size.

Decoding requests are kept implicitly. Between events every decoding request gains one
token per step, so request ``i``'s KV tokens are ``dbase[i] + D`` and its outputs
``obase[i] + D``, where ``D`` counts the steps in which all decoders advanced. What changes
the state in between is known in advance:

- the next completion is the smallest ``D_fin`` in a heap;
- a decoder needs a new KV block in the step where its token count is a multiple of the
  block size, so the blocks needed in any step come from a histogram of ``dbase mod
  block_size``: the step where the cache would run out is found in O(block_size);
- the next arrival, client deadline or horizon is a time: the step boundary at or after it
  follows from the closed-form (constant) or cumulative (other models) step times.

A run of decode-only steps up to the first of these events is taken in one jump. Steps with
prefill work or admissions are taken one at a time with the decoders aggregated (their
budget and block needs are counts); a step that must preempt, or whose token budget binds
in an order that matters, falls back to the exact step of :mod:`llmqueue.engine.exact` on a
materialized copy of the state. Tests check that the records equal those of the reference
replica (:mod:`llmqueue.engine.reference`), which is built from the engine's nouns and shares
no scheduling code with this module.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from llmqueue.engine.exact import ExactStepper


class Replica(ExactStepper):
    """Fast simulation of one replica. ``run()`` fills the same records as the reference."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.order: dict[int, int] = {}       # running requests -> admission sequence number
        self.prefilling: dict[int, int] = {}  # running requests not decoding (same seq values)
        self.seq = 0
        self.D = 0
        self.dbase: dict[int, int] = {}
        self.obase: dict[int, int] = {}
        self.dfin: dict[int, int] = {}
        self.fin: list = []
        self.hist = [0] * self.bs
        self.sum_dbase = 0
        self.late: set[int] = set()
        self.stretches = 0
        self.use_epochs = True
        self.epoch_steps = 0
        # numpy views of the pre-generated requests, for vectorized epochs
        self.arr_np = np.asarray(self.arr[: self._n_pre], dtype=np.float64)
        self.prompt_np = np.asarray(self.prompt[: self._n_pre], dtype=np.int64)
        self.target_np = np.asarray(self.target[: self._n_pre], dtype=np.int64)

    # -- decoders (implicit) ----------------------------------------------------------------------
    def _add_decoder(self, i: int) -> None:
        db = self.comp[i] - self.D
        ob = self.outp[i] - self.D
        self.dbase[i] = db
        self.obase[i] = ob
        f = self.target[i] - ob
        self.dfin[i] = f
        heapq.heappush(self.fin, (f, i))
        self.hist[db % self.bs] += 1
        self.sum_dbase += db

    def _drop_decoder(self, i: int) -> None:
        """Materialize decoder ``i`` (comp, outp, blocks) and remove it from the implicit state."""
        db = self.dbase.pop(i)
        ob = self.obase.pop(i)
        del self.dfin[i]
        self.hist[db % self.bs] -= 1
        self.sum_dbase -= db
        self.late.discard(i)
        c = db + self.D
        self.comp[i] = c
        self.outp[i] = ob + self.D
        self.blocks[i] = -(-c // self.bs)

    def remove_running(self, i: int) -> None:
        if i in self.dbase:
            self._drop_decoder(i)
        else:
            self.prefilling.pop(i, None)
        del self.order[i]
        self.release(i)

    def _materialize_all(self) -> None:
        for i in list(self.dbase):
            self._drop_decoder(i)
        self.fin.clear()

    def _rebuild(self) -> None:
        """Re-derive prefilling/decoder sets from explicit state (after an exact step)."""
        self.prefilling.clear()
        for i in self.running:
            if i not in self.order:
                self.seq += 1
                self.order[i] = self.seq
        for i in list(self.order):
            if self.state[i] != 2:
                del self.order[i]
        # keep the order of self.running (the exact step's list) in the dict
        self.order = {i: self.order[i] for i in self.running}
        for i, s in self.order.items():
            if self.outp[i] > 0 and self.comp[i] == self.prompt[i] + self.outp[i] - 1:
                self._add_decoder(i)
            else:
                self.prefilling[i] = s
        self._reset_late()

    def _reset_late(self) -> None:
        self.late.clear()
        if self.prefilling:
            m = min(self.prefilling.values())
            self.late.update(d for d in self.dbase if self.order[d] > m)

    def _inverted(self) -> bool:
        """Does some decoder come after a prefilling request in the running order?"""
        if not self.late:
            return False
        if not self.prefilling:
            self.late.clear()
            return False
        m = min(self.prefilling.values())
        for d in [d for d in self.late if self.order[d] < m]:
            self.late.discard(d)
        return bool(self.late)

    def _valid_fin_top(self) -> int | None:
        f = self.fin
        while f and self.dfin.get(f[0][1]) != f[0][0]:
            heapq.heappop(f)
        return f[0][0] if f else None

    # -- one step with decoders aggregated ---------------------------------------------------------
    def step(self, t: float) -> float:
        cfg = self.cfg
        B = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        n = len(self.dbase)
        need_dec = self.hist[(-self.D) % self.bs] if n else 0
        plan = []
        budget = B - n
        exact = budget < 0
        preempted = 0
        demand = n
        blocks_needed = need_dec
        if not exact:
            for i in self.prefilling:
                new = self.prompt[i] + self.outp[i] - self.comp[i]
                if thr and new > thr:
                    new = thr
                demand += new
                new = min(new, budget)
                if new <= 0:
                    break
                budget -= new
                blocks_needed += -(-(self.comp[i] + new) // self.bs) - self.blocks[i]
                plan.append((i, new))
            inverted = self._inverted() if (demand > B or blocks_needed > self.free) else False
            if inverted:
                exact = True
            elif blocks_needed > self.free:
                # out of KV blocks: preempt from the tail. While the victims are prefilling requests
                # (they come after every decoder), the outcome does not depend on the decoders'
                # order and is computed here; otherwise the exact step decides.
                tail = (self._preempt_tail(n, need_dec, B - n, thr)
                        if n and cfg.preemption == "newest" and self.pc is None else None)
                if tail is None:
                    exact = True
                else:
                    plan, budget, preempted = tail
        if exact:
            return self._exact_step(t)
        if preempted:
            for i, new in plan:
                self.blocks[i] = -(-(self.comp[i] + new) // self.bs)
        else:
            # allocate: decoders and planned prefill chunks
            self.alloc(blocks_needed)
            for i, new in plan:
                self.blocks[i] = -(-(self.comp[i] + new) // self.bs)
        # admit waiting requests with the remaining budget (only in a step that preempted none)
        while not preempted and budget > 0 and len(self.order) < cfg.max_num_seqs:
            got = self.admit_head(budget)
            if got is None:
                break
            i, new = got
            self.seq += 1
            self.order[i] = self.seq
            self.prefilling[i] = self.seq
            plan.append((i, new))
            budget -= new
        if not plan and n == 0:
            return t
        # composition and duration
        prefill = 0
        decode = n
        context = self.sum_dbase + n * self.D + n
        for i, new in plan:
            if self.first_sched[i] != self.first_sched[i]:
                self.first_sched[i] = t
            if new == 1 and self.outp[i] > 0 and self.comp[i] == self.prompt[i] + self.outp[i] - 1:
                decode += 1
                context += self.comp[i] + 1
            else:
                prefill += new
        dur = self.step_duration(prefill, decode, context, t)
        t_end = t + dur
        used = (self.total_blocks - self.free) * self.bs
        self.sample_until(t_end, self.n_waiting, len(self.order), used)
        self.record_step(t, dur, prefill, decode, len(self.order), self.n_waiting, used, preempted)
        self.steps_taken += 1
        # apply: decoders advance (D += 1), then prefill chunks
        if n:
            self.D += 1
            self._complete_decoders(t_end)
        for i, new in plan:
            r = self.advance(i, new, t_end)
            if r == 2:
                del self.order[i]
                del self.prefilling[i]
                self.release(i)
                self.end(i, "ok", t_end)
            elif r == 1:
                s = self.prefilling.pop(i)
                self._add_decoder(i)
                if self.prefilling and min(self.prefilling.values()) < s:
                    self.late.add(i)
        return t_end

    def _preempt_tail(self, n: int, need_dec: int, budget: int, thr: int):
        """vLLM's walk when blocks run out and every prefilling request comes after the decoders:
        decoders allocate first, preempting prefilling requests from the tail as needed, then the
        remaining prefilling requests take their chunks in order, preempting the tail when short.
        Returns ``(plan, budget_left, preempted)`` with ``self.free`` updated, or None when a decoder
        would have to be preempted (the caller then takes the exact step)."""
        pf = list(self.prefilling)
        blocks = self.blocks
        avail = self.free
        k = 0
        while need_dec > avail:
            if k == len(pf):
                return None
            k += 1
            avail += blocks[pf[-k]]
        preempted = 0
        for _ in range(k):
            self._preempt(pf.pop())
            preempted += 1
        free = avail - need_dec
        plan = []
        idx = 0
        bs = self.bs
        while idx < len(pf) and budget > 0:
            i = pf[idx]
            new = self.prompt[i] + self.outp[i] - self.comp[i]
            if thr and new > thr:
                new = thr
            new = min(new, budget)
            need = -(-(self.comp[i] + new) // bs) - blocks[i]
            gone = False
            while need > free:
                v = pf.pop()
                free += blocks[v]
                self._preempt(v)
                preempted += 1
                if v == i:
                    gone = True
                    break
            if gone:
                break
            free -= need
            plan.append((i, new))
            budget -= new
            idx += 1
        self.free = free
        return plan, budget, preempted

    def _preempt(self, v: int) -> None:
        """Preempt running request ``v`` (recompute): free its blocks, back to the waiting front."""
        del self.order[v]
        self.prefilling.pop(v, None)
        self.blocks[v] = 0
        self.comp[v] = 0
        self.npre[v] += 1
        self.state[v] = 1
        self.wait_inc(v)
        self.push_waiting(v, front=True)

    def _complete_decoders(self, t_end: float) -> None:
        D = self.D
        f = self.fin
        while f and f[0][0] <= D:
            d_fin, i = heapq.heappop(f)
            if self.dfin.get(i) != d_fin:
                continue
            self._drop_decoder(i)
            del self.order[i]
            self.release(i)
            self.end(i, "ok", t_end)

    def _exact_step(self, t: float) -> float:
        """A step that preempts or whose budget binds out of order: the exact step."""
        self._materialize_all()
        self.running = list(self.order)
        t_end = ExactStepper.step(self, t)
        self._rebuild()
        return t_end

    # -- a stretch of decode-only steps in one jump -------------------------------------------
    def _can_stretch(self) -> bool:
        n = len(self.dbase)
        if self.prefilling or n == 0 or n > self.cfg.max_num_batched_tokens:
            return False
        i = self.waiting_head()
        if i is None:
            return True
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens - n
        if len(self.order) >= cfg.max_num_seqs or budget <= 0:
            return True
        if self.pc is not None:
            return False  # with prefix caching the admission check needs the cache: take a step
        new = self.prompt[i] + self.outp[i] - self.comp[i]
        if cfg.long_prefill_token_threshold and new > cfg.long_prefill_token_threshold:
            new = cfg.long_prefill_token_threshold
        if not cfg.enable_chunked_prefill and new > budget:
            return True
        new = min(new, budget)
        if -(-(self.comp[i] + new) // self.bs) - self.blocks[i] > self.free:
            return True
        return False  # the head can be admitted now: take a normal step

    def _block_limit(self, k_max: int) -> int:
        """Largest k <= k_max such that the next k decode steps' new blocks fit in ``free``."""
        n = len(self.dbase)
        bs = self.bs
        hist = self.hist
        D = self.D
        free = self.free
        k = 0
        if free >= 2 * n:
            periods = free // n - 1
            k = periods * bs
            free -= periods * n
            if k >= k_max:
                return k_max
        while k < k_max:
            need = hist[(-(D + k)) % bs]
            if need > free:
                return k
            free -= need
            k += 1
        return k_max

    def _blocks_in(self, k: int) -> int:
        """New blocks the decoders allocate over the next ``k`` steps."""
        n = len(self.dbase)
        bs = self.bs
        periods, rem = divmod(k, bs)
        total = periods * n
        D = self.D + periods * bs
        hist = self.hist
        for m in range(rem):
            total += hist[(-(D + m)) % bs]
        return total

    def stretch(self, t: float) -> float:
        """Advance as many decode-only steps as possible before the next event; returns the new time."""
        n = len(self.dbase)
        top = self._valid_fin_top()
        k_max = top - self.D  # the completing step is the last one of the stretch
        k_max = self._block_limit(k_max)
        if k_max <= 0:
            return self.step(t)
        # arrivals (they may be admitted, join a queue whose length is recorded, or bring a
        # deadline), deadlines and the horizon end a stretch at the first step boundary after them
        t_stop = min(self.horizon, self.next_arrival_time(), self.next_deadline())
        # a drifting engine: the stretch ends at the first step boundary after its speed window
        speed = 1.0
        if self.drift is not None:
            t_stop = min(t_stop, self.drift.next_boundary(t))
            speed = self.drift.at(t)
        ctx0 = self.sum_dbase + n * self.D + n
        model = self.model
        if model.is_constant and self.noise is None:
            b = model.c0 * speed
            if t_stop < math.inf:
                k_t = max(1, math.ceil((t_stop - t) / b - 1e-9))
                while t + (k_t - 1) * b >= t_stop and k_t > 1:
                    k_t -= 1
                while t + k_t * b < t_stop:
                    k_t += 1
                k = min(k_max, k_t)
            else:
                k = k_max
            dur = k * b
        else:
            durs = model.decode_stretch(n, ctx0, k_max)
            if self.noise is not None:
                durs = durs * self.noise.slice(self.steps_taken, k_max)
            if speed != 1.0:
                durs = durs * speed
            ends = t + np.cumsum(durs)
            if t_stop < math.inf:
                k = int(np.searchsorted(ends, t_stop, side="left")) + 1
                k = min(k, k_max)
            else:
                k = k_max
            dur = float(ends[k - 1] - t)
            if (durs[:k] <= 0).any():
                return self.step(t)
        alloc = self._blocks_in(k)
        t_end = t + dur
        if self.opt.sample_dt > 0 and self.next_sample < t_end:
            self._sample_stretch(t, k, n)
        self.alloc(alloc)
        self.record_step(t, dur, 0, n, n, self.n_waiting, (self.total_blocks - self.free) * self.bs, 0, steps=k)
        self.steps_taken += k
        self.D += k
        self.stretches += 1
        self._complete_decoders(t_end)
        return t_end

    def _sample_stretch(self, t: float, k: int, n: int) -> None:
        """Time-series rows for sample times inside a stretch: KV grows as blocks are allocated."""
        model = self.model
        speed = self.drift.at(t) if self.drift is not None else 1.0
        if model.is_constant and self.noise is None:
            ends = t + model.c0 * speed * np.arange(1, k + 1)
        else:
            durs = model.decode_stretch(n, self.sum_dbase + n * self.D + n, k)
            if self.noise is not None:
                durs = durs * self.noise.slice(self.steps_taken, k)
            if speed != 1.0:
                durs = durs * speed
            ends = t + np.cumsum(durs)
        used0 = self.total_blocks - self.free
        while self.next_sample < ends[-1] and self.next_sample <= self.horizon:
            j = int(np.searchsorted(ends, self.next_sample, side="right"))  # step j contains the sample
            kv = (used0 + self._blocks_in(j + 1)) * self.bs
            self._ts_buf.append((self.next_sample, self.n_waiting, n, kv))
            self.next_sample += self.opt.sample_dt

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> "Replica":
        import gc

        enabled = gc.isenabled()
        gc.disable()  # the loop allocates many small objects and frees none of them in cycles
        try:
            return self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> "Replica":
        from llmqueue.engine.epoch import advance_epoch, epoch_eligible

        t = 0.0
        progress = self.opt.progress
        from llmqueue.engine.epoch import MAX_CHUNK

        use_epochs = self.use_epochs and epoch_eligible(self)
        backoff = fails = iters = 0
        chunk = 256
        while t < self.horizon:
            self.take_arrivals(t)
            self.expire(t)
            if not self.order and not self.n_waiting:
                t2 = t
            else:
                t2 = None
                if use_epochs and not self.prefilling and not self.n_waiting:
                    if backoff > 0:
                        backoff -= 1
                    else:
                        ep = advance_epoch(self, t, chunk)
                        if ep is None:
                            # a constraint binds right away: take normal steps for a while,
                            # longer after each consecutive failure
                            fails += 1
                            backoff = min(64, 1 << fails)
                        else:
                            t2, taken, full = ep
                            fails = 0
                            chunk = min(MAX_CHUNK, 2 * chunk) if full else max(64, 2 * taken)
                if t2 is not None:
                    pass
                elif self._can_stretch():
                    t2 = self.stretch(t)
                else:
                    t2 = self.step(t)
            if t2 == t:
                nxt = self.idle_until_next_event(len(self.order))
                if nxt is None:
                    break
                t = nxt
            else:
                t = t2
            if progress is not None:
                iters += 1
                if not iters & 1023:
                    progress(t)
        if progress is not None:
            progress(t)
        self._materialize_all()
        self.running = list(self.order)
        self.finalize()
        return self
