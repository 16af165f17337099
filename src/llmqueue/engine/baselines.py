"""Baselines the seeds compare continuous batching against, in the same record schema.

- :func:`dynamic_batching` (Inference Foundations): request-level batches. When the server is free it
  starts a batch of ``B_max`` waiting requests, or, once the oldest waiting request has waited
  ``T_max``, of all that wait (at most ``B_max``). A batch of ``B`` is served in
  ``T_svc(B) = T_fixed + t_req B`` and all its requests finish (first token and last token)
  when it ends. ``T_max = inf`` waits for full batches: the system of Inference Foundations' Table 1.
- :func:`static_batching` (the Continuous Batching essay, head-of-line blocking): token-level batches of up to
  ``B`` requests taken when the server is free; one prefill step for the batch's prompts, then
  decode steps until the longest output is done. Each request's tokens stream as they are made
  (it finishes at its own last token) but no new request joins until the whole batch ends.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue._validate import nonnegative, positive, positive_int
from llmqueue.engine.run import SimResult
from llmqueue.engine.step_time import parse_step_time
from llmqueue.records.columns import request_record_columns

NAN = float("nan")


def _columns(requests, first_sched, first_tok, finish, outp, status) -> dict:
    """The request records of a baseline run (one replica, no retries, admitted on arrival)."""
    cls = requests.class_name
    return request_record_columns(
        len(requests), request_id=requests.request_id, class_=cls if isinstance(cls, str) else [str(c) for c in cls],
        arrival_s=requests.arrival_s, first_scheduled_s=first_sched, first_token_s=first_tok, finish_s=finish,
        prompt_tokens=requests.prompt_tokens, output_tokens=outp, status=status)


def _steps(rows: list) -> dict:
    cols = ("step", "start_s", "duration_s", "prefill_tokens", "decode_seqs", "num_running", "num_waiting",
            "kv_tokens", "preempted", "steps")
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, len(cols))
    out = {c: arr[:, j].astype(np.float64 if c in ("start_s", "duration_s") else np.int64) for j, c in enumerate(cols)}
    out["replica"] = np.zeros(len(arr), dtype=np.int64)
    return out


def _timeseries(arrivals: np.ndarray, starts: list, ends: list, sizes: list, dt: float, horizon: float) -> dict:
    """Waiting/running counts sampled every ``dt``: waiting = arrived and not yet in a batch."""
    t = np.arange(0.0, horizon, dt) if dt > 0 else np.empty(0)
    starts_a, ends_a, sizes_a = np.asarray(starts), np.asarray(ends), np.asarray(sizes)
    cum = np.concatenate([[0], np.cumsum(sizes_a)]) if len(sizes_a) else np.zeros(1)
    arrived = np.searchsorted(arrivals, t, side="right")
    started = np.searchsorted(starts_a, t, side="right") if len(starts_a) else np.zeros(len(t), dtype=int)
    batched = cum[started]
    running = np.where((started > 0) & (ends_a[np.maximum(started - 1, 0)] > t), sizes_a[np.maximum(started - 1, 0)], 0) \
        if len(starts_a) else np.zeros(len(t), dtype=int)
    return {"t_s": t, "replica": np.zeros(len(t), dtype=np.int64), "num_waiting": (arrived - batched).astype(np.int64),
            "num_running": np.asarray(running, dtype=np.int64), "kv_tokens": np.zeros(len(t), dtype=np.int64)}


def dynamic_batching(requests, *, B_max: int, T_fixed: float, t_req: float, T_max: float = math.inf,
                     horizon_s: float | None = None, sample_dt: float = 1.0) -> SimResult:
    """Inference Foundations' dynamic batching server (request level); see the module docstring."""
    B_max = positive_int("B_max", B_max)
    T_fixed = nonnegative("T_fixed", T_fixed)
    t_req = nonnegative("t_req", t_req)
    if not T_max == math.inf:
        T_max = nonnegative("T_max", T_max)
    if T_fixed + t_req <= 0:
        positive("T_fixed", T_fixed)
    arr = np.asarray(requests.arrival_s, dtype=np.float64)
    n = len(arr)
    horizon = math.inf if horizon_s is None else positive("horizon_s", horizon_s)
    first_sched = np.full(n, NAN)
    finish = np.full(n, NAN)
    status = np.array(["unfinished"] * n, dtype=object)
    outp = np.zeros(n, dtype=np.int64)
    target = np.asarray(requests.output_tokens, dtype=np.int64)
    rows, starts, ends, sizes = [], [], [], []
    free_at = 0.0
    head = 0
    while head < n:
        # a batch starts when the server is free and either B_max requests wait or the oldest waited T_max
        full_at = arr[head + B_max - 1] if head + B_max - 1 < n else math.inf
        start = max(free_at, min(full_at, arr[head] + T_max))
        if start == math.inf or start >= horizon:
            break
        size = int(np.searchsorted(arr, start, side="right")) - head
        size = max(1, min(size, B_max))
        dur = T_fixed + t_req * size
        end = start + dur
        idx = slice(head, head + size)
        first_sched[idx] = start
        finish[idx] = end
        status[idx] = "ok"
        outp[idx] = target[idx]
        waiting = int(np.searchsorted(arr, start, side="right")) - head - size
        rows.append((len(rows), start, dur, int(np.sum(requests.prompt_tokens[idx])), size, size, waiting, 0, 0, 1))
        starts.append(start)
        ends.append(end)
        sizes.append(size)
        head += size
        free_at = end
    hz = horizon if horizon < math.inf else (float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0)
    req = _columns(requests, first_sched, finish.copy(), finish, outp, status)
    return SimResult(requests=req, steps=_steps(rows), timeseries=_timeseries(arr, starts, ends, sizes, sample_dt, hz),
                     horizon_s=hz, wall_s=0.0, num_steps=len(rows))


def static_batching(requests, *, B: int, step_time, horizon_s: float | None = None,
                    sample_dt: float = 1.0) -> SimResult:
    """Static (request-level) batching with token streaming; see the module docstring.

    The step-time model gives the prefill step (all prompts of the batch) and each decode step
    (``decode_seqs`` = requests of the batch still generating; finished ones are padding that
    costs nothing but holds the slot).
    """
    B = positive_int("B", B)
    model = parse_step_time(step_time)
    arr = np.asarray(requests.arrival_s, dtype=np.float64)
    prompt = np.asarray(requests.prompt_tokens, dtype=np.int64)
    target = np.asarray(requests.output_tokens, dtype=np.int64)
    n = len(arr)
    horizon = math.inf if horizon_s is None else positive("horizon_s", horizon_s)
    first_sched = np.full(n, NAN)
    first_tok = np.full(n, NAN)
    finish = np.full(n, NAN)
    outp = np.zeros(n, dtype=np.int64)
    status = np.array(["unfinished"] * n, dtype=object)
    noise = model.noise_stream(0)
    drift = model.drift_stream(0)
    rows, starts, ends, sizes = [], [], [], []
    step_no = 0
    t = 0.0
    head = 0

    def dur_of(p, d, c):
        nonlocal step_no
        x = model.base(p, d, c)
        if noise is not None:
            x *= noise.at(step_no)
        if drift is not None:
            x *= drift.at(t)
        step_no += 1
        return x

    while head < n:
        t = max(t, arr[head])
        if t >= horizon:
            break
        size = max(1, min(int(np.searchsorted(arr, t, side="right")) - head, B))
        idx = np.arange(head, head + size)
        first_sched[idx] = t
        waiting = int(np.searchsorted(arr, t, side="right")) - head - size
        start = t
        d = dur_of(int(prompt[idx].sum()), 0, 0)
        rows.append((len(rows), t, d, int(prompt[idx].sum()), 0, size, waiting, int(prompt[idx].sum()), 0, 1))
        t += d
        first_tok[idx] = t
        outp[idx] = 1
        done = target[idx] <= 1
        finish[idx[done]] = t
        ctx = prompt[idx] + 1
        for j in range(1, int(target[idx].max())):
            live = target[idx] > j
            d = dur_of(0, int(live.sum()), int(ctx[live].sum()))
            rows.append((len(rows), t, d, 0, int(live.sum()), size, 0, int((prompt[idx] + np.minimum(target[idx], j)).sum()), 0, 1))
            t += d
            outp[idx[live]] += 1
            ctx[live] += 1
            ending = target[idx] == j + 1
            finish[idx[ending]] = t
        status[idx] = "ok"
        starts.append(start)
        ends.append(t)
        sizes.append(size)
        head += size
    hz = horizon if horizon < math.inf else (float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0)
    req = _columns(requests, first_sched, first_tok, finish, outp, status)
    return SimResult(requests=req, steps=_steps(rows), timeseries=_timeseries(arr, starts, ends, sizes, sample_dt, hz),
                     horizon_s=hz, wall_s=0.0, num_steps=len(rows))
