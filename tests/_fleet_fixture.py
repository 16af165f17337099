"""A synthetic fleet run, built by hand so that the answers are known by construction.

Two pools over 600 s, sampled every second: ``main`` (model ``big``) and ``fallback`` (model
``small``); two classes, ``chat`` and ``batch``. A load spike on [200, 260] s:

- ``main``'s chat queue is 2 before the spike, ramps to 50 at its end, then decays linearly back
  to 2 at 302 s (42 s after the spike) and stays there; batch waits 0 throughout;
- ``fallback``'s queue is 0 before the spike and then grows by one every 5 s to the end: it never
  recovers;
- ``main`` serves with 2 replicas until 230 s, a third provisioning from 210 s and serving from 230 s
  (so 2 x 230 + 3 x 370 = 1570 serving replica-seconds, 20 provisioning); ``fallback`` has 1.

Requests: 300 user requests, one every 2 s from 1 s; request i goes to ``fallback`` when i % 3 == 0,
else ``main``; class ``chat`` for even i, ``batch`` for odd. Every 10th request times out once and
is retried 5 s later (attempt 2), served by the same pool. P/D: main's requests carry a 10 ms KV
transfer, fallback's none (NaN).
"""

from __future__ import annotations

import numpy as np

from llmqueue.records import PoolSeries, RequestRecords, TimeSeries

SPIKE = (200.0, 260.0)
HORIZON = 600.0


def main_chat_waiting(t: np.ndarray) -> np.ndarray:
    w = np.full(len(t), 2.0)
    up = (t >= 200) & (t < 260)
    w[up] = 2 + 48 * (t[up] - 200) / 60
    down = (t >= 260) & (t < 302)
    w[down] = 2 + 48 * (302 - t[down]) / 42
    return np.round(w)


def fallback_waiting(t: np.ndarray) -> np.ndarray:
    return np.where(t < 200, 0.0, np.floor((t - 200) / 5) + 1)


def pool_columns(t_end: float = HORIZON, dt: float = 1.0) -> dict:
    t = np.arange(0.0, t_end, dt)
    rows = {k: [] for k in ("t_s", "pool", "class", "replicas", "provisioning", "num_waiting", "num_running")}

    def add(pool, cls, reps, prov, wait, run):
        rows["t_s"].append(t)
        rows["pool"].append(np.full(len(t), pool))
        rows["class"].append(np.full(len(t), cls))
        rows["replicas"].append(reps)
        rows["provisioning"].append(prov)
        rows["num_waiting"].append(wait)
        rows["num_running"].append(run)

    main_reps = np.where(t < 230, 2, 3)
    main_prov = np.where((t >= 210) & (t < 230), 1, 0)
    add("main", "chat", main_reps, main_prov, main_chat_waiting(t), np.full(len(t), 8))
    add("main", "batch", main_reps, main_prov, np.zeros(len(t)), np.full(len(t), 4))
    one = np.ones(len(t), dtype=int)
    add("fallback", "chat", one, 0 * one, fallback_waiting(t), 2 * one)
    add("fallback", "batch", one, 0 * one, np.zeros(len(t)), one)
    return {k: np.concatenate(v) for k, v in rows.items()}


def request_columns(*, optional: bool = True) -> dict:
    n = 300
    i = np.arange(n)
    arrival = 1.0 + 2.0 * i
    pool = np.where(i % 3 == 0, "fallback", "main")
    cls = np.where(i % 2 == 0, "chat", "batch")
    retried = i % 10 == 0
    # first attempts: the retried ones time out after 3 s
    rows = []
    for k in range(n):
        a = arrival[k]
        if retried[k]:
            rows.append(dict(request_id=k, attempt=1, arrival_s=a, dispatched_s=a + 0.5, first_scheduled_s=np.nan,
                             first_token_s=np.nan, finish_s=a + 3.0, output_tokens=0, status="timeout",
                             pool=pool[k], cls=cls[k]))
            a = a + 5.0
        rows.append(dict(request_id=k, attempt=2 if retried[k] else 1, arrival_s=a, dispatched_s=a + 0.5,
                         first_scheduled_s=a + 0.6, first_token_s=a + 1.0, finish_s=a + 1.0 + 0.02 * 9,
                         output_tokens=10, status="ok", pool=pool[k], cls=cls[k]))
    col = lambda name: np.array([r[name] for r in rows])  # noqa: E731
    out = {"request_id": col("request_id"), "class": col("cls"), "arrival_s": col("arrival_s"),
           "dispatched_s": col("dispatched_s"), "first_scheduled_s": col("first_scheduled_s"),
           "first_token_s": col("first_token_s"), "finish_s": col("finish_s"),
           "prompt_tokens": np.full(len(rows), 100), "output_tokens": col("output_tokens"),
           "cached_prompt_tokens": np.zeros(len(rows), int), "status": col("status"),
           "preemptions": np.zeros(len(rows), int), "replica": np.zeros(len(rows), int), "attempt": col("attempt")}
    if optional:
        p = col("pool")
        out.update({"pool": p, "lane": np.where(p == "main", "default", "overflow"),
                    "model": np.where(p == "main", "big", "small"),
                    "prefill_replica": np.where(p == "main", 0, -1),
                    "kv_transfer_s": np.where(p == "main", 0.01, np.nan),
                    "decode_scheduled_s": np.where(p == "main", col("first_token_s") + 0.015, np.nan),
                    "kv_loaded_tokens": np.where(col("request_id") % 7 == 0, 512, 0),
                    "degraded": np.where(col("request_id") % 5 == 0, "max_tokens 64", ""),
                    "tenant": np.where(col("request_id") % 2 == 0, "acme", "globex"),
                    "reason": np.where(col("status") == "timeout", "timeout", "")})
    return out


def timeseries_columns(*, optional: bool = True) -> dict:
    t = np.arange(0.0, HORIZON, 10.0)
    n = len(t)
    out = {"t_s": np.concatenate([t, t]), "replica": np.repeat([0, 1], n), "num_waiting": np.zeros(2 * n, int),
           "num_running": np.ones(2 * n, int), "kv_tokens": np.full(2 * n, 100)}
    if optional:
        out["pool"] = np.repeat(["main", "fallback"], n)
    return out


def fleet_run(optional: bool = True):
    """(requests, timeseries, pools) tables of the synthetic fleet run."""
    return (RequestRecords.from_columns(request_columns(optional=optional)),
            TimeSeries.from_columns(timeseries_columns(optional=optional)),
            PoolSeries.from_columns(pool_columns()))
