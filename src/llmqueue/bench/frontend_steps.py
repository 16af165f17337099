"""The server's delay outside the engine, from an ordinary low-load run and its step log.

A request's TTFT, measured by the client from its send, is a pipeline and a queue in series::

    TTFT = d_in + W + S_prefill + d_out

``d_in`` (HTTP, the API server, tokenizing, the hop to the engine core) and ``d_out``
(detokenizing, streaming the first chunk back) are a fixed delay with no queue: the
*frontend delay* ``d = d_in + d_out`` that ``validate`` adds to every simulated first and
last token (shifting every arrival by ``d_in`` does not change a queue's waits, so only the
sum matters). ``W + S_prefill`` is the engine's own part: the wait from the request's arrival
at the engine to the start of the step that begins its prefill, and the prefill steps
themselves. The step log (``steps.parquet``: vLLM's iteration log, or a simulated run) gives
the engine's part without a probe run of isolated requests:

1. *Which steps prefilled the request.* The step log's clock is not the client's: vLLM's API
   server stamps a step when it logs it, about 100 ms after the step's token reached the client
   (:mod:`llmqueue.bench.steplog`). The step that produced a request's first token ends a
   constant ``c`` away from the first token's arrival at the client (``c`` = the log's lateness
   less ``d_out``), so ``c`` is the mode of ``step end - first token`` over the pairs of
   requests and prefill steps within :data:`WINDOW_S` of each other (a false pair's offset is
   spread by the arrival process, the true pairs' offsets pile up). Each request's first-token
   step is then the prefill step nearest ``first token + c``; walking back over the steps
   that prefilled without a break, their prompt tokens must add up to the request's own (its
   prompt less the prefix-cache hit): steps that also prefilled another request are left out.
2. *When it reached the engine.* A step's composition is fixed when it is scheduled, so a
   request that arrived while step ``k0 - 1`` ran starts in step ``k0`` (vLLM v1's engine
   core reads new requests between steps, and a decode-only step leaves the token budget
   free). If the engine was idle before ``k0`` (a gap longer than :data:`IDLE_GAP` x the
   busy gap), the request woke it: it arrived at ``k0``'s start. If the engine was busy, the
   arrival is uniform over the previous step's cycle (arrivals are not synchronised with the
   engine's steps), so its expectation is the middle of that cycle, and the error of that
   guess is symmetric with mean 0. A request counts only when it found the engine's queue
   empty: no prefill in step ``k0 - 1`` (else it may have waited behind another prompt for the
   token budget), every request sent before it had its first token before it was sent (none
   was still queued), fewer sequences than ``max_num_seqs`` running, and (when the log gives
   the KV use) room in the KV cache.
3. ``d_i = TTFT_i - (end of k1 - arrival_i)``: every term offset-free (differences on one
   clock). The estimate is the median of ``d_i`` with a distribution-free 95 % interval from
   the order statistics (the binomial quantiles of the count below the median).

A saturated run satisfies step 2's conditions rarely (its queue is seldom empty), so this is
an estimate from a low-load run: few requests prefilling at once, most arriving during
decode-only steps. Not modelled: async scheduling (``--async-scheduling`` schedules the next
step before the current one ends: a request then starts one step later than assumed here, and
the estimate is low by about a step cycle) and speculative decoding.
"""

from __future__ import annotations

import numpy as np

WINDOW_S = 2.0
"""The widest offset between the step log's clock and the client's that is searched (s)."""

IDLE_GAP = 3.0
"""A gap between steps this many times the median gap (and at least 1 ms) is the engine idle."""


def _mode_offset(off: np.ndarray, h: float) -> float:
    """The centre of the densest interval of width ``h`` among ``off``: the median of the
    offsets in it."""
    x = np.sort(off)
    hi = np.searchsorted(x, x + h, side="right")
    i = int(np.argmax(hi - np.arange(len(x))))
    return float(np.median(x[i:hi[i]]))


def median_ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``x``: the order statistics ``x_(j)`` and
    ``x_(n-j+1)`` with ``j`` the binomial(n, 1/2) quantile, covering it with at least ``level``."""
    from scipy.stats import binom

    xs = np.sort(np.asarray(x, dtype=np.float64))
    n = len(xs)
    j = int(binom.ppf((1 - level) / 2, n, 0.5))
    if j < 1:
        return float(xs[0]), float(xs[-1])
    return float(xs[j - 1]), float(xs[n - j])


def frontend_from_steps(requests, steps, *, max_num_seqs: int | None = None,
                        capacity_tokens: float | None = None, min_samples: int = 10,
                        min_share: float = 0.1) -> dict:
    """The frontend delay ``d`` (seconds) from a run's requests and its step log (see the module).

    Returns ``{"frontend_latency_s", "samples", "finished", "ci": (lo, hi), "p10", "p90",
    "clock_offset_s", "method": "step log", "d_s", "wait_s"}`` (``d_s``: each placed request's
    delay; ``wait_s``: the engine wait before its first prefill step that was taken out of it),
    or ``{"frontend_latency_s": None, "samples", "finished", "reason"}`` when fewer than
    ``min_samples`` requests, or than ``min_share`` of the finished ones, could be placed against
    the step log (a saturated run: the few requests that found its queue empty arrived during
    long steps, a wide spread; a log that is not the run's; no prefill counts).
    ``frontend_latency_s`` is clamped at 0 (``raw`` keeps the median)."""
    st = np.asarray(steps["start_s"], dtype=np.float64)
    du = np.asarray(steps["duration_s"], dtype=np.float64)
    k = np.asarray(steps["steps"], dtype=np.float64) if "steps" in steps else np.ones(len(st))
    pf = np.asarray(steps["prefill_tokens"], dtype=np.int64)
    ds = np.asarray(steps["decode_seqs"], dtype=np.int64)
    kv = np.asarray(steps["kv_tokens"], dtype=np.float64) if "kv_tokens" in steps else np.zeros(len(st))
    o = np.argsort(st, kind="stable")
    st, du, k, pf, ds, kv = st[o], du[o], k[o], pf[o], ds[o], kv[o]
    end = st + du
    last_start = end - du / np.maximum(k, 1.0)  # the start of a row's last iteration
    status = np.asarray(requests["status"])
    send = np.asarray(requests["dispatched_s"], dtype=np.float64) if "dispatched_s" in requests.to_dict() \
        else np.asarray(requests["arrival_s"], dtype=np.float64)
    send = np.where(np.isfinite(send), send, np.asarray(requests["arrival_s"], dtype=np.float64))
    first = np.asarray(requests["first_token_s"], dtype=np.float64)
    cached = np.asarray(requests["cached_prompt_tokens"], dtype=np.int64) \
        if "cached_prompt_tokens" in requests.to_dict() else 0
    need = np.maximum(np.asarray(requests["prompt_tokens"], dtype=np.int64) - cached, 1)
    ok = (status == "ok") & np.isfinite(first) & np.isfinite(send)
    n_ok = int(ok.sum())
    out = {"frontend_latency_s": None, "samples": 0, "finished": n_ok}
    P = np.flatnonzero(pf > 0)
    if len(P) == 0 or n_ok == 0:
        return {**out, "reason": "the step log records no prefill"}
    eP = end[P]
    oP = np.argsort(eP, kind="stable")
    eP_sorted, P_sorted = eP[oP], P[oP]
    # the client's side of "the queue was empty": every request sent earlier had its first token
    # (had left the queue) before this one was sent
    o_send = np.argsort(send, kind="stable")
    f_sorted = np.where(np.isfinite(first), first, -np.inf)[o_send]
    before = np.empty(len(send))
    before[o_send] = np.concatenate(([-np.inf], np.maximum.accumulate(f_sorted)[:-1]))
    idx = np.flatnonzero(ok & (before < send))
    # 1. the clock offset: the mode of (prefill step end - first token) over nearby pairs
    lo = np.searchsorted(eP_sorted, first[idx] - WINDOW_S, side="left")
    hi = np.searchsorted(eP_sorted, first[idx] + WINDOW_S, side="right")
    pairs = [eP_sorted[a:b] - f for a, b, f in zip(lo, hi, first[idx]) if b > a]
    if not pairs:
        return {**out, "reason": f"no prefill step within {WINDOW_S:g} s of a first token: the step log is "
                                 "not on the run's clock"}
    offs = np.concatenate(pairs)
    gaps = st[1:] - end[:-1]
    busy_gap = float(np.median(np.maximum(gaps, 0.0))) if len(gaps) else 0.0
    cyc = np.diff(st) / np.maximum(k[:-1], 1.0)
    h = max(0.001, 0.25 * float(np.median(cyc[cyc > 0]))) if (cyc > 0).any() else 0.001
    c = _mode_offset(offs, h)
    idle_thr = max(IDLE_GAP * busy_gap, 0.001)
    d, wait = [], []
    for i in idx:
        # the prefill step that produced the first token: nearest to first + c
        j = int(np.searchsorted(eP_sorted, first[i] + c))
        cand = [m for m in (j - 1, j) if 0 <= m < len(eP_sorted)]
        m = min(cand, key=lambda m: abs(eP_sorted[m] - first[i] - c))
        if abs(eP_sorted[m] - first[i] - c) > 2 * h:
            continue
        k1 = int(P_sorted[m])
        k0, tot = k1, int(pf[k1])
        while tot < need[i] and k0 > 0 and pf[k0 - 1] > 0:
            k0 -= 1
            tot += int(pf[k0])
        if tot != need[i]:
            continue  # its prefill shared a step with another request's
        if k0 == 0 or st[k0] - end[k0 - 1] > idle_thr:
            arrival = st[k0]  # it woke an idle engine
        else:
            p = k0 - 1
            if pf[p] > 0 or (max_num_seqs is not None and ds[p] >= max_num_seqs):
                continue  # the queue may not have been empty: it may have waited
            if capacity_tokens and kv[p] > 0 and kv[p] + need[i] > capacity_tokens:
                continue
            arrival = 0.5 * (last_start[p] + st[k0])
        d.append((first[i] - send[i]) - (end[k1] - arrival))
        wait.append(st[k0] - arrival)
    d, wait = np.asarray(d), np.asarray(wait)
    if len(d) < max(min_samples, min_share * n_ok):
        return {**out, "samples": int(len(d)),
                "reason": f"only {len(d)} of {n_ok} finished requests could be placed against the step log "
                          f"(need {min_samples} and {min_share:.0%}; the others waited in the queue or shared a "
                          "prefill step): a run at low load, whose requests mostly arrive during decode-only "
                          "steps, gives more"}
    med = float(np.median(d))
    lo_ci, hi_ci = median_ci(d)
    return {"frontend_latency_s": max(med, 0.0), "raw": med, "samples": int(len(d)), "finished": n_ok,
            "ci": (lo_ci, hi_ci), "p10": float(np.percentile(d, 10)), "p90": float(np.percentile(d, 90)),
            "clock_offset_s": c, "method": "step log", "d_s": d, "wait_s": wait}


def describe(fe: dict, where: str = "") -> str:
    """One line for calibrate's notes: ``frontend delay: 4.1 ms (95 % CI 3.6-4.7) from 103
    low-load requests against the step log``."""
    src = f" of {where}" if where else ""
    if fe.get("frontend_latency_s") is None:
        return f"frontend delay not estimated from the step log{src}: {fe.get('reason')}"
    lo, hi = fe["ci"]
    clamp = f", clamped from {1e3 * fe['raw']:.1f} ms" if fe["raw"] < 0 else ""
    return (f"frontend delay: {1e3 * fe['frontend_latency_s']:.1f} ms (95 % CI {1e3 * lo:.1f}-{1e3 * hi:.1f} ms"
            f"{clamp}) from {fe['samples']} of {fe['finished']} low-load requests against the step log{src}")
