"""Vectorized epochs: many steps of the fast replica at once while no scheduling constraint binds.

With a constant, noise-free step time ``b`` the steps of a busy period fall on a fixed grid
``t0 + k b``. As long as (1) every arriving request is admitted at the first step boundary
after it arrives and prefilled in that one step, (2) the token budget, ``max_num_seqs`` and
the KV cache never bind, and (3) the replica never idles, requests do not interact: request
``r`` arriving at ``a_r`` is prefilled in step ``k_r = ceil((a_r - t0)/b)``, gets its first token at
``t0 + (k_r + 1) b`` and finishes at ``t0 + (k_r + o_r) b`` (an M/D/infinity stretch of the
queue). So an epoch computes, with numpy, every step's running count, token count and KV
blocks from difference arrays, finds the first step ``K`` where a constraint would bind (or the
replica would idle), and commits everything before ``K`` exactly. From ``K`` on the replica's
step-by-step path takes over. The blocks a request holds in step ``k`` are ``ceil((X_r + k) /
block_size)`` with ``X_r = s_r - k_r`` (new requests) or its KV tokens plus one (running
decoders); their sum is split into a linear part and a residue part counted per residue class,
so the whole check is O(block_size x K).

Requests that finish inside an epoch never become :class:`Request` objects: their records are
written as columns (``on_records``). Those still running at its end join the replica's implicit
decoders (:class:`~llmqueue.engine.fast.decoders.DecoderPool`). An epoch reads the replica's nouns:
its arrivals, its scheduler's decoders and block ledger, its pricer and its recorder.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue.engine.request import RequestStatus
from llmqueue.records.columns import request_record_columns

MAX_CHUNK = 50_000  # arrivals considered per epoch, at most
MAX_EPOCH_STEPS = 1 << 20
"""Steps one epoch computes at most: its per-step arrays take about ``(block_size + 12) x 8`` bytes
a step (under 250 MB at block size 16); a longer busy period is taken in several epochs."""


def epoch_eligible(rep) -> bool:
    """Can ``rep`` (a :class:`~llmqueue.engine.fast.replica.Replica`) use epochs at all?"""
    cfg = rep.config
    pricer = rep.pricer
    return (rep.arrivals.stream is not None and pricer.constant > 0 and pricer.noise is None and pricer.drift is None
            and rep.scheduler.on_first_token is None
            and not rep.timeout_s and not rep.ttft_timeout_s and not rep.patience and not cfg.max_waiting and not cfg.enable_prefix_caching
            and not cfg.class_max_waiting and not cfg.class_max_queue_time_s and not cfg.max_queue_time_s
            and not cfg.kv_offload_tokens)


def advance_epoch(rep, t0: float, chunk: int = 1024):
    """Try to advance ``rep`` from the step boundary ``t0`` by a vectorized epoch.

    Preconditions (checked by the caller): no request prefilling, none waiting. ``chunk``
    arrivals of the fed stream are considered. Returns ``(new time, arrivals taken, whether the
    epoch ran to the end of its chunk)``, or None when not even one step could be taken.
    """
    if rep.arrivals.submitted or rep.deadlines:
        return None
    b = rep.pricer.constant
    cfg = rep.config
    dec = rep.scheduler.decoders
    bs = dec.block_size
    stream = rep.arrivals.stream
    lo = rep.arrivals.position()
    hi = min(stream.n, lo + chunk)
    # --- candidate steps --------------------------------------------------------------------
    horizon_steps = math.inf if rep.horizon == math.inf else max(0, math.ceil((rep.horizon - t0) / b - 1e-12))
    if lo < hi:
        a = stream.arrival_s[lo:hi]
        k_arr = np.ceil((a - t0) / b - 1e-12).astype(np.int64)
        np.maximum(k_arr, 0, out=k_arr)
        k_max = int(k_arr[-1])  # arrivals at later steps belong to the next epoch
    else:
        k_arr = np.empty(0, dtype=np.int64)
        k_max = max(dec.finish_step.values()) - dec.steps if dec.finish_step else 0
    if horizon_steps < math.inf:
        k_max = min(k_max, int(horizon_steps))
    if k_max <= 0:
        return None
    K = k_max
    # --- new requests (in this chunk, admitted before k_max) --------------------------------------
    sel = k_arr < K
    idx = np.arange(lo, hi)[sel]
    kr = k_arr[sel]
    s = stream.prompt[lo:hi][sel]
    o = stream.output[lo:hi][sel]
    # a request rejected at arrival (it can never run) may be retried by the client, and one
    # whose prompt exceeds an unchunked budget would wait at the head: the epoch stops before it
    bad = (s < 1) | (o < 1) | (s + o > rep.max_total)
    if not cfg.enable_chunked_prefill:
        bad |= s + o - 1 > cfg.max_num_batched_tokens
    viol = []
    if bad.any():
        viol.append(int(kr[bad][0]))
    thr = cfg.long_prefill_token_threshold
    if thr:
        over = (~bad) & (s > thr)
        if over.any():
            viol.append(int(kr[over][0]))
    ok = ~bad
    kr_ok, s_ok, o_ok = kr[ok], s[ok], o[ok]
    end_ok = kr_ok + o_ok - 1  # last step index (inclusive)
    # --- running decoders -------------------------------------------------------------------------
    decoders = list(dec.kv_base)  # kv_base and finish_step share their insertion order
    n0 = len(decoders)
    if n0:
        c0 = np.fromiter(dec.kv_base.values(), dtype=np.int64, count=n0) + dec.steps
        f0 = np.fromiter(dec.finish_step.values(), dtype=np.int64, count=n0) - dec.steps
        X0 = c0 + 1
    else:
        c0 = f0 = X0 = np.empty(0, dtype=np.int64)
    # all active intervals [start, end] and block offsets X
    start = np.concatenate([np.zeros(n0, dtype=np.int64), kr_ok])
    end = np.concatenate([f0 - 1, end_ok])
    X = np.concatenate([X0, s_ok - kr_ok])
    # the per-step arrays below stop at the first idle step (found from the intervals alone) and
    # at MAX_EPOCH_STEPS: time in which nothing runs is never paid for step by step
    K = min(K, _first_idle_step(start, end) + 1, MAX_EPOCH_STEPS)
    Kc = K
    # difference arrays over steps [0, Kc)
    st = np.minimum(start, Kc)
    en = np.minimum(end + 1, Kc)
    seqs = np.bincount(st, minlength=Kc + 1)[: Kc + 1] - np.bincount(en, minlength=Kc + 1)[: Kc + 1]
    seqs = np.cumsum(seqs)[:Kc]
    pre_tok = np.bincount(kr_ok[kr_ok < Kc], weights=s_ok[kr_ok < Kc], minlength=Kc)[:Kc]
    pre_cnt = np.bincount(kr_ok[kr_ok < Kc], minlength=Kc)[:Kc]
    tokens = seqs - pre_cnt + pre_tok
    Y = X + bs - 1
    sumY = np.cumsum(np.bincount(st, weights=Y, minlength=Kc + 1)[: Kc + 1] -
                     np.bincount(en, weights=Y, minlength=Kc + 1)[: Kc + 1])[:Kc]
    kk = np.arange(Kc)
    lin = sumY + kk * seqs
    if bs > 1:
        q = Y % bs
        w = Kc + 1
        cnt = (np.bincount(q * w + st, minlength=bs * w) - np.bincount(q * w + en, minlength=bs * w)).reshape(bs, w)
        cnt = np.cumsum(cnt, axis=1)[:, :Kc]
        res = (np.arange(bs)[:, None] + kk[None, :]) % bs
        modsum = (cnt * res).sum(axis=0)
        blocks = (lin - modsum) // bs
    else:
        blocks = lin
    blocks = np.rint(blocks).astype(np.int64)
    bad_step = (seqs > cfg.max_num_seqs) | (tokens > cfg.max_num_batched_tokens) | \
        (blocks > rep.scheduler.kv.num_blocks) | (seqs == 0)
    if bad_step.any():
        viol.append(int(np.argmax(bad_step)))
    if rep.explain_next - rep.steps_taken < K:
        viol.append(rep.explain_next - rep.steps_taken)  # a step to explain is taken alone
    full = not viol and K == k_max
    if viol:
        K = min(K, min(viol))
    if K <= 0:
        return None
    _commit(rep, t0, b, K, decoders, f0, idx, kr, s, o, ok, seqs, pre_tok, pre_cnt, blocks)
    taken_until = lo + int(np.searchsorted(k_arr, K, side="left"))
    rep.arrived += taken_until - lo
    rep.arrivals.seek(taken_until)
    return t0 + K * b, taken_until - lo, full


def _first_idle_step(start: np.ndarray, end: np.ndarray) -> int:
    """The first step index in which none of the intervals ``[start, end]`` (inclusive, ``start``
    sorted) is running: the replica would idle there. O(intervals), whatever the gaps' lengths."""
    if not start.size or start[0] > 0:
        return 0
    reach = np.maximum.accumulate(end + 1)  # steps [0, reach[i]) are covered by the first i + 1
    gap = np.nonzero(start[1:] > reach[:-1])[0]
    return int(reach[gap[0]] if gap.size else reach[-1])


def _commit(rep, t0, b, K, decoders, f0, idx, kr, s, o, ok, seqs, pre_tok, pre_cnt, blocks) -> None:
    """Commit steps ``[0, K)`` of an epoch: step and time-series records, finished requests,
    and the still-running ones as implicit decoders."""
    sched = rep.scheduler
    dec = sched.decoders
    kv = sched.kv
    rec = rep.recorder
    bs = kv.block_size
    seqs, blocks, pre_tok, pre_cnt = seqs[:K], blocks[:K], pre_tok[:K], pre_cnt[:K]
    rec.add_step_chunk({
        "step": rep.steps_taken + np.arange(K, dtype=np.int64), "start_s": t0 + b * np.arange(K),
        "duration_s": np.full(K, b), "prefill_tokens": pre_tok.astype(np.int64),
        "decode_seqs": (seqs - pre_cnt).astype(np.int64), "num_running": seqs.astype(np.int64),
        "num_waiting": np.zeros(K, dtype=np.int64), "kv_tokens": blocks * bs,
        "preempted": np.zeros(K, dtype=np.int64), "steps": np.ones(K, dtype=np.int64)})
    t_end = t0 + K * b
    if rec.next_sample < t_end:
        ts = np.asarray(rec.take_samples(t_end, rep.horizon), dtype=np.float64)
        if len(ts):
            k_s = np.minimum(np.floor((ts - t0) / b + 1e-12).astype(np.int64), K - 1)
            rec.add_sample_chunk(ts, np.zeros(len(ts), dtype=np.int64), seqs[k_s], blocks[k_s] * bs)
    D0 = dec.steps
    dec.steps += K
    rep.steps_taken += K
    rep.stretches += 1
    rep.epoch_steps += K
    # decoders that were running before the epoch and finish inside it (their last token in step f0)
    fin_j = np.nonzero(f0 <= K)[0]
    if len(fin_j):
        running = sched.running
        for j, f, tf in zip(fin_j.tolist(), f0[fin_j].tolist(), (t0 + f0[fin_j] * b).tolist()):
            r = decoders[j]
            dec.drop(r, D0 + f)
            del running[r]
            r.status = RequestStatus.FINISHED
            rep.finish(r, "ok", tf)
        dec.behind_prefill.clear()
    # requests admitted in the epoch: records for those done, decoders for the rest
    adm = np.nonzero(ok & (kr < K))[0]
    if len(adm):
        ids = idx[adm]
        k0 = kr[adm]
        sa, oa = s[adm], o[adm]
        e = k0 + oa - 1
        done = e < K
        if done.any():
            stream = rep.arrivals.stream
            d = ids[done]
            arrival = stream.arrival_s[d]
            rep.on_records(request_record_columns(
                len(d), request_id=stream.request_id[d],
                class_=np.asarray(stream.classes, dtype=object)[stream.class_index[d]],
                arrival_s=arrival, first_scheduled_s=t0 + k0[done] * b, first_token_s=t0 + (k0[done] + 1) * b,
                finish_s=t0 + (e[done] + 1) * b, prompt_tokens=sa[done], output_tokens=oa[done], status="ok",
                extra={"seq": d.astype(np.int64)}))
        live = ~done
        if live.any():
            produced = K - k0[live]
            comp = sa[live] + produced - 1
            make = rep.arrivals.stream.make
            key = sched.waiting.policy.key
            admitted = []
            for i, k, c, p in zip(ids[live].tolist(), k0[live].tolist(), comp.tolist(), produced.tolist()):
                r = make(i)
                admitted.append((k, key(r), r, c, p))  # the queue's key as it was admitted
            # the running order is the admission order: by step, and within a step by the waiting
            # queue's order (the policy's key), which decides the preemption victims later
            admitted.sort(key=lambda x: x[:2])
            running = sched.running
            for k, _, r, c, p in admitted:
                r.first_scheduled_time = t0 + k * b
                r.first_token_time = t0 + (k + 1) * b
                r.num_output_tokens = p
                r.num_computed_tokens = c
                r.num_cached_tokens = 0
                r.status = RequestStatus.RUNNING
                sched.num_admitted += 1
                running[r] = sched.num_admitted
                dec.add(r, sched.num_admitted)
    # free blocks: recount what the running decoders hold
    kv.num_free_blocks = kv.num_blocks - dec.held_blocks()
