"""Vectorized epochs: many steps at once while no scheduling constraint binds.

With a constant, noise-free step time ``b`` the steps of a busy period fall on a fixed grid
``t0 + k b``. As long as (1) every arriving request is admitted at the first step boundary
after it arrives and prefilled in that one step, (2) the token budget, ``max_num_seqs`` and
the KV cache never bind, and (3) the replica never idles, requests do not interact: request
``r`` arriving at ``a_r`` is prefilled in step ``k_r = ceil((a_r - t0)/b)``, gets its first token at
``t0 + (k_r + 1) b`` and finishes at ``t0 + (k_r + o_r) b``. So an epoch computes, with numpy,
every step's running count, token count and KV blocks from difference arrays, finds the first
step ``K`` where a constraint would bind (or the replica would idle), and commits everything
before ``K`` exactly. From ``K`` on the step-by-step simulator takes over. The blocks a request
holds in step ``k`` are ``ceil((X_r + k) / block_size)`` with ``X_r = s_r - k_r`` (new requests) or
its KV tokens plus one (running decoders); their sum is split into a linear part and a
residue part counted per residue class, so the whole check is O(block_size x K).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

MAX_CHUNK = 50_000  # arrivals considered per epoch, at most


def epoch_eligible(sim) -> bool:
    """Can ``sim`` (a :class:`~llmqueue.engine.replica.Replica`) use epochs at all?"""
    m = sim.model
    cfg = sim.cfg
    return (m.is_constant and sim.noise is None and sim.drift is None and not sim.opt.timeout_s and not sim.opt.ttft_timeout_s
            and not cfg.max_waiting and not cfg.enable_prefix_caching and not cfg.class_max_waiting
            and not cfg.class_max_queue_time_s
            and not cfg.max_queue_time_s)


def advance_epoch(sim, t0: float, chunk: int = 1024) -> tuple[float, int] | None:
    """Try to advance ``sim`` from the step boundary ``t0`` by a vectorized epoch.

    Preconditions (checked by the caller): no request prefilling, none waiting, no retry or
    deadline pending. ``chunk`` arrivals are considered. Returns ``(new time, arrivals taken,
    whether the epoch ran to the end of its chunk)``, or None when not even one step could be taken.
    """
    b = sim.model.c0
    cfg = sim.cfg
    bs = sim.bs
    lo = sim._next_pre
    hi = min(sim._n_pre, lo + chunk)
    if sim._retry_heap or sim.deadlines:
        return None
    # --- candidate steps --------------------------------------------------------------------
    horizon_steps = math.inf if sim.horizon == math.inf else max(0, math.ceil((sim.horizon - t0) / b - 1e-12))
    if lo < hi:
        a = sim.arr_np[lo:hi]
        k_arr = np.ceil((a - t0) / b - 1e-12).astype(np.int64)
        np.maximum(k_arr, 0, out=k_arr)
        k_max = int(k_arr[-1])  # arrivals at later steps belong to the next epoch
    else:
        a = np.empty(0)
        k_arr = np.empty(0, dtype=np.int64)
        k_max = max(sim.dfin.values()) - sim.D if sim.dfin else 0
    if horizon_steps < math.inf:
        k_max = min(k_max, int(horizon_steps))
    if k_max <= 0:
        return None
    K = k_max
    # --- new requests (in this chunk, admitted before k_max) --------------------------------------
    sel = k_arr < K
    idx = np.arange(lo, hi)[sel]
    kr = k_arr[sel]
    s = sim.prompt_np[lo:hi][sel]
    o = sim.target_np[lo:hi][sel]
    # arrivals that the reference rejects on arrival (never fit / unschedulable): they take no
    # resources; with a retry function they would spawn new arrivals, so stop before them
    bad = (s < 1) | (o < 1) | (s + o > sim.max_total)
    if not cfg.enable_chunked_prefill:
        bad |= s + o - 1 > cfg.max_num_batched_tokens
    if bad.any() and sim.opt.retry is not None:
        K = min(K, int(kr[bad][0]))
    thr = cfg.long_prefill_token_threshold
    viol = []
    if thr:
        over = (~bad) & (s > thr)
        if over.any():
            viol.append(int(kr[over][0]))
    ok = ~bad
    kr_ok, s_ok, o_ok = kr[ok], s[ok], o[ok]
    end_ok = kr_ok + o_ok - 1  # last step index (inclusive)
    # --- running decoders -------------------------------------------------------------------------
    dec = list(sim.dbase)  # dbase and dfin share their insertion order
    n0 = len(dec)
    if n0:
        c0 = np.fromiter(sim.dbase.values(), dtype=np.int64, count=n0) + sim.D
        f0 = np.fromiter(sim.dfin.values(), dtype=np.int64, count=n0) - sim.D
        X0 = c0 + 1
    else:
        c0 = f0 = X0 = np.empty(0, dtype=np.int64)
    # all active intervals [start, end] and block offsets X
    start = np.concatenate([np.zeros(n0, dtype=np.int64), kr_ok])
    end = np.concatenate([f0 - 1, end_ok])
    X = np.concatenate([X0, s_ok - kr_ok])
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
        (blocks > sim.total_blocks) | (seqs == 0)
    if bad_step.any():
        viol.append(int(np.argmax(bad_step)))
    full = not viol and K == k_max
    if viol:
        K = min(K, min(viol))
    if K <= 0:
        return None
    # --- commit steps [0, K) ----------------------------------------------------------------------
    t_of = lambda k: t0 + k * b  # noqa: E731
    seqs, tokens, blocks, pre_tok, pre_cnt = seqs[:K], tokens[:K], blocks[:K], pre_tok[:K], pre_cnt[:K]
    sim.record_steps_bulk(t0 + b * np.arange(K), np.full(K, b), pre_tok.astype(np.int64),
                          (seqs - pre_cnt).astype(np.int64), seqs.astype(np.int64),
                          np.zeros(K, dtype=np.int64), blocks * bs)
    if sim.opt.sample_dt > 0 and sim.next_sample < t_of(K):
        ts = []
        while sim.next_sample < t_of(K) and sim.next_sample <= sim.horizon:
            ts.append(sim.next_sample)
            sim.next_sample += sim.opt.sample_dt
        ts = np.asarray(ts)
        kk_s = np.minimum(np.floor((ts - t0) / b + 1e-12).astype(np.int64), K - 1)
        sim.record_samples_bulk(ts, np.zeros(len(ts), dtype=np.int64), seqs[kk_s], blocks[kk_s] * bs)
    sim.D += K
    sim.steps_taken += K
    sim.stretches += 1
    sim.epoch_steps += K
    # existing decoders that finish inside the epoch
    fin_j = np.nonzero(f0 <= K)[0]
    if len(fin_j):
        dbase, obase, dfin, order, hist = sim.dbase, sim.obase, sim.dfin, sim.order, sim.hist
        fin_ids = [dec[j] for j in fin_j.tolist()]
        t_fin = (t0 + f0[fin_j] * b).tolist()
        for i, tf in zip(fin_ids, t_fin):
            db = dbase.pop(i)
            del obase[i], dfin[i], order[i]
            hist[db % bs] -= 1
            sim.sum_dbase -= db
            sim.outp[i] = sim.target[i]
            sim.blocks[i] = 0
            sim.state[i] = 3
            sim.status[i] = "ok"
            sim.finish[i] = tf
        sim.late.clear()
    # new requests: rejected ones (as at arrival), then admitted ones
    taken_until = lo + int(np.searchsorted(k_arr, K, side="left"))
    for pos in np.nonzero(bad & (kr < K))[0]:
        sim.arrive(int(idx[pos]))
    adm = np.nonzero(ok & (kr < K))[0]
    if len(adm):
        ids = idx[adm]
        k0 = kr[adm]
        sa, oa = s[adm], o[adm]
        e = k0 + oa - 1
        done = e < K
        _scatter(sim.first_sched, ids, t0 + k0 * b)
        _scatter(sim.first_tok, ids, t0 + (k0 + 1) * b)
        d_ids = ids[done]
        if len(d_ids):
            _scatter(sim.outp, d_ids, oa[done])
            _scatter(sim.finish, d_ids, t0 + (e[done] + 1) * b)
            _scatter(sim.state, d_ids, np.full(len(d_ids), 3))
            _scatter(sim.status, d_ids, ["ok"] * len(d_ids))
        r_ids = ids[~done]
        if len(r_ids):
            produced = K - k0[~done]
            comp = sa[~done] + produced - 1
            _scatter(sim.outp, r_ids, produced)
            _scatter(sim.comp, r_ids, comp)
            _scatter(sim.blocks, r_ids, -(-comp // bs))
            _scatter(sim.state, r_ids, np.full(len(r_ids), 2))
            # as decoders: dbase = comp - D, obase = outp - D, D_fin = target - obase
            db = comp - sim.D
            ob = produced - sim.D
            fin = oa[~done] - ob
            rl = r_ids.tolist()
            seq0 = sim.seq
            sim.order.update(zip(rl, range(seq0 + 1, seq0 + 1 + len(rl))))
            sim.seq = seq0 + len(rl)
            sim.dbase.update(zip(rl, db.tolist()))
            sim.obase.update(zip(rl, ob.tolist()))
            sim.dfin.update(zip(rl, fin.tolist()))
            sim.fin.extend(zip(fin.tolist(), rl))
            heapq.heapify(sim.fin)
            h = np.bincount(db % bs, minlength=bs)
            sim.hist = [x + int(y) for x, y in zip(sim.hist, h)]
            sim.sum_dbase += int(db.sum())
    sim._next_pre = taken_until
    # free blocks: recount what the running decoders hold
    if sim.dbase:
        dbv = np.fromiter(sim.dbase.values(), dtype=np.int64, count=len(sim.dbase))
        sim.free = sim.total_blocks - int((-(-(dbv + sim.D) // bs)).sum())
    else:
        sim.free = sim.total_blocks
    return t_of(K), taken_until - lo, full


def _scatter(lst: list, ids: np.ndarray, values) -> None:
    """``lst[ids[j]] = values[j]`` for a Python list (ids ascending)."""
    vals = values.tolist() if hasattr(values, "tolist") else list(values)
    ids_l = ids.tolist()
    if ids_l and ids_l[-1] - ids_l[0] + 1 == len(ids_l):  # a contiguous run: one slice assignment
        lst[ids_l[0]: ids_l[-1] + 1] = vals
    else:
        for i, v in zip(ids_l, vals):
            lst[i] = v
