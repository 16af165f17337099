"""The record schema shared by the simulator and the real-server benchmark.

One row per request (attempt), simulated or measured. Times are seconds from the start
of the run (t = 0 is the first intended arrival's clock origin). ``NaN`` marks a time that
never happened (e.g. ``first_token_s`` of a rejected request).

Request columns (name -> numpy dtype):

- ``request_id``: the request's id (retries of one request share it; see ``attempt``).
- ``class``: request class (lane/tenant) name.
- ``arrival_s``: intended arrival (send) time; latencies are measured from it, so a late
  client cannot hide queueing (no coordinated omission).
- ``dispatched_s``: actual send time (benchmark) / time admitted to the engine (simulator).
- ``first_scheduled_s``: start of the first engine step that processed any of its tokens.
- ``first_token_s``: time the first output token was produced (end of the step that made it).
- ``finish_s``: time the last token was produced, or the time of rejection/timeout/cancel.
- ``prompt_tokens``, ``output_tokens``: requested prompt length and produced output tokens.
- ``cached_prompt_tokens``: prompt tokens served from the prefix cache.
- ``status``: one of :data:`STATUSES`.
- ``preemptions``: times the request was preempted (recompute).
- ``replica``: replica index (0 for a single replica).
- ``attempt``: 1 for the first try, 2.. for retries.

``status = unfinished`` marks a request still in the system when the run stopped; its
``finish_s`` is NaN (``NaN`` finish means exactly that: in flight at the end). Every other
status has a finish time. Pass the run's stop time as ``horizon_s`` to the metrics so that such
requests count as in flight up to it.

Derived (``llmqueue.metrics``), defined as vLLM bench serve defines them:
``queue_s = first_scheduled_s - arrival_s``, ``ttft_s = first_token_s - arrival_s``,
``e2el_s = finish_s - arrival_s``, ``tpot_s = (e2el_s - ttft_s) / (output_tokens - 1)`` for
``output_tokens > 1``, ``itl_s`` the gaps between consecutive tokens.

Step columns: one row per engine iteration. A step table may carry the optional column
``steps`` (:data:`STEP_OPTIONAL_COLUMNS`): the row then summarises ``steps`` consecutive
iterations of identical composition; ``start_s`` is the start of the first, ``duration_s`` the
total duration of all of them (so each lasted ``duration_s / steps``) and the counts
(``prefill_tokens``, ``decode_seqs``, ...) are per iteration. Time-series columns: sampled state.
"""

from __future__ import annotations

STATUSES = ("ok", "rejected", "timeout", "cancelled", "error", "unfinished")

REQUEST_COLUMNS: dict[str, str] = {
    "request_id": "int64",
    "class": "str",
    "arrival_s": "float64",
    "dispatched_s": "float64",
    "first_scheduled_s": "float64",
    "first_token_s": "float64",
    "finish_s": "float64",
    "prompt_tokens": "int64",
    "output_tokens": "int64",
    "cached_prompt_tokens": "int64",
    "status": "str",
    "preemptions": "int64",
    "replica": "int64",
    "attempt": "int64",
}

REQUEST_OPTIONAL_COLUMNS: dict[str, str] = {
    # a fleet's records (llmqueue.cluster): where the request was served
    "pool": "str",              # the pool that served it (P/D: the decode pool)
    "lane": "str",              # the lane that sent it there ("" when none matched)
    "model": "str",             # the model that served it (a fallback pool's model differs)
    "prefill_replica": "int64", # P/D: the prefill pool's replica (-1 otherwise)
    "kv_transfer_s": "float64", # P/D: seconds from prefill's end until the KV reached decode (NaN otherwise)
    "decode_scheduled_s": "float64",  # P/D: when a decode replica first scheduled it (NaN otherwise)
    "kv_loaded_tokens": "int64", # with a host KV tier: KV tokens it loaded from it (resumptions, prefix hits)
    "degraded": "str",          # with gateway degrade rules: how it was served smaller ("max_tokens 128", "to small"; "" as asked)
    # a gateway's records (llmqueue.serve.gateway)
    "tenant": "str",            # the tenant (X-Tenant, or a hash of the client's key; never the key)
    "reason": "str",            # why it was refused or failed ("" when it was served)
}

STEP_COLUMNS: dict[str, str] = {
    "step": "int64",            # iteration index on its replica
    "replica": "int64",
    "start_s": "float64",
    "duration_s": "float64",
    "prefill_tokens": "int64",  # prompt tokens computed in this step (all chunks)
    "decode_seqs": "int64",     # sequences that produced a token by decoding
    "num_running": "int64",     # sequences scheduled in this step
    "num_waiting": "int64",     # requests waiting after scheduling
    "kv_tokens": "int64",       # KV tokens held at the end of the step (block-rounded)
    "preempted": "int64",       # sequences preempted while scheduling this step
}

STEP_OPTIONAL_COLUMNS: dict[str, str] = {
    "steps": "int64",           # iterations this row summarises (default 1)
}

TIMESERIES_OPTIONAL_COLUMNS: dict[str, str] = {
    "pool": "str",              # a fleet's pool of the replica
}

POOL_COLUMNS: dict[str, str] = {
    # a fleet's pools over time, one row per (sample time, pool, class); replicas and
    # provisioning repeat on a pool's class rows
    "t_s": "float64",
    "pool": "str",
    "class": "str",
    "replicas": "int64",        # replicas serving (taking requests)
    "provisioning": "int64",    # replicas starting (ordered by the autoscaler, not serving yet)
    "num_waiting": "int64",     # this class's requests waiting in the pool (replicas' queues and the gateway's)
    "num_running": "int64",     # this class's requests running in the pool
}

TIMESERIES_COLUMNS: dict[str, str] = {
    "t_s": "float64",
    "replica": "int64",
    "num_waiting": "int64",
    "num_running": "int64",
    "kv_tokens": "int64",
}
