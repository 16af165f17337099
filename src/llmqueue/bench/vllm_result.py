"""``llmqueue bench --save-result``: the run in ``vllm bench serve``'s result format.

The JSON object ``vllm/benchmarks/serve.py`` writes with ``--save-result`` (so vLLM's own sweep
plotting and result readers take it): the set-up (``date``, ``endpoint_type``, ``backend``,
``label``, ``model_id``, ``tokenizer_id``, ``num_prompts``, ``request_rate`` (a number, or
``"inf"``), ``burstiness``, ``max_concurrency``), the totals (``duration``, ``completed``,
``failed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput``,
``request_goodput`` (null without ``--goodput``), ``output_throughput``,
``total_token_throughput``, ``max_output_tokens_per_s``, ``max_concurrent_requests``), per
request (in request order, the last attempt of each: ``input_lens`` (the server's prompt token
counts), ``output_lens`` (0 for a failed request), ``ttfts`` and ``latencies`` (seconds from the
actual send; 0 for a failed request, as vLLM writes them), ``itls`` (each request's gaps between
streamed chunks, seconds), ``start_times`` (the send, seconds from the run's start),
``queue_times`` (the send's delay after the intended time: the wait for a concurrency slot),
``generated_texts`` and ``errors`` ("" for a success, else the request's status)), and for each
selected metric (``--percentile-metrics``) ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` and
``pP_X_ms`` for each ``--metric-percentiles`` value.

Every aggregate is the run summary's value (``summary.json``, the same definitions: vLLM's, from
the actual send); with a warm-up (``--warmup``) the aggregates leave it out while the per-request
lists hold every request. The client does not keep the generated text: ``generated_texts`` holds
empty strings.
"""

from __future__ import annotations

import json
import math
from datetime import datetime

import numpy as np

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")  # vLLM's default for generative models


def backend_name(endpoint: str) -> str:
    """vLLM's ``--backend`` for the endpoint: ``openai`` (completions) or ``openai-chat``."""
    return "openai-chat" if endpoint == "chat" else "openai"


def result_filename(*, endpoint: str, request_rate, max_concurrency, model: str, date: str,
                    label: str | None = None) -> str:
    """vLLM's default name: ``{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json``."""
    rate = float("inf") if request_rate == "inf" else float(request_rate)
    conc = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    base = str(model).rstrip("/").split("/")[-1] or "model"
    return f"{label or backend_name(endpoint)}-{rate}qps{conc}-{base}-{date}.json"


def _last_attempts(records) -> np.ndarray:
    """Row index of each request's last attempt, in request-id order."""
    rid = np.asarray(records["request_id"])
    att = np.asarray(records["attempt"])
    order = np.lexsort((att, rid))
    rid_o = rid[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = rid_o[1:] != rid_o[:-1]
    return order[last]


def _chunk_times(tokens) -> dict:
    """``{(request_id, attempt): chunk times}`` from the tokens columns."""
    rid = np.asarray(tokens["request_id"])
    att = np.asarray(tokens["attempt"])
    idx = np.asarray(tokens["index"])
    t = np.asarray(tokens["t_s"], dtype=np.float64)
    if not len(t):
        return {}
    order = np.lexsort((idx, att, rid))
    rid, att, t = rid[order], att[order], t[order]
    cut = np.flatnonzero((np.diff(rid) != 0) | (np.diff(att) != 0)) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(t)]])
    return {(int(rid[a]), int(att[a])): t[a:b] for a, b in zip(starts.tolist(), ends.tolist())}


def _peak_tokens_per_s(ok_start, chunk_lists) -> float:
    """vLLM's ``max_output_tokens_per_s``: the most chunks in one 1-s bucket from the first send."""
    times = [c for c in chunk_lists if len(c)]
    if not times or not len(ok_start):
        return 0.0
    t = np.concatenate(times)
    t0 = float(np.min(ok_start))
    n = int(math.ceil(float(t.max()) - t0)) + 1
    b = np.floor(t - t0).astype(np.int64)
    b = b[(b >= 0) & (b < n)]
    return float(np.bincount(b, minlength=n).max()) if len(b) else 0.0


def vllm_result(summary: dict, records, tokens, *, model: str, endpoint: str, num_prompts: int, request_rate,
                burstiness: float = 1.0, max_concurrency: int | None = None, tokenizer_id: str | None = None,
                percentile_metrics=DEFAULT_PERCENTILE_METRICS, percentiles=None, date: str | None = None,
                label: str | None = None) -> dict:
    """The result dict (see the module docstring). ``summary``: the run's summary (its
    percentiles must include ``percentiles``); ``records``/``tokens``: the run's attempts and
    chunk times (:class:`~llmqueue.bench.client.BenchResult`); ``request_rate``: the configured
    rate (a number or ``"inf"``)."""
    date = date or datetime.now().strftime("%Y%m%d-%H%M%S")
    percentiles = list(summary.get("percentiles") or [99]) if percentiles is None else list(percentiles)
    rows = _last_attempts(records)
    status = np.asarray(records["status"])[rows]
    ok = status == "ok"
    disp = np.asarray(records["dispatched_s"], dtype=np.float64)[rows]
    arr = np.asarray(records["arrival_s"], dtype=np.float64)[rows]
    first = np.asarray(records["first_token_s"], dtype=np.float64)[rows]
    fin = np.asarray(records["finish_s"], dtype=np.float64)[rows]
    rid = np.asarray(records["request_id"])[rows]
    att = np.asarray(records["attempt"])[rows]
    chunks = _chunk_times(tokens)
    per_chunks = [chunks.get((int(r), int(a)), np.zeros(0)) if o else np.zeros(0)
                  for r, a, o in zip(rid.tolist(), att.tolist(), ok.tolist())]

    def num(x):
        return float(x) if x is not None and np.isfinite(x) else 0.0

    out: dict = {
        "date": date,
        "endpoint_type": backend_name(endpoint),
        "backend": backend_name(endpoint),
        "label": label,
        "model_id": model,
        "tokenizer_id": tokenizer_id,
        "num_prompts": int(num_prompts),
        "request_rate": "inf" if request_rate == "inf" or request_rate == math.inf else float(request_rate),
        "burstiness": float(burstiness),
        "max_concurrency": max_concurrency,
        "duration": summary.get("duration"),
        "completed": summary.get("completed"),
        "failed": summary.get("failed"),
        "total_input_tokens": summary.get("total_input_tokens"),
        "total_output_tokens": summary.get("total_output_tokens"),
        "request_throughput": summary.get("request_throughput"),
        "request_goodput": summary.get("request_goodput"),
        "output_throughput": summary.get("output_throughput"),
        "total_token_throughput": summary.get("total_token_throughput"),
        "input_lens": [int(x) for x in np.asarray(records["prompt_tokens"])[rows].tolist()],
        "output_lens": [int(x) if o else 0 for x, o in zip(np.asarray(records["output_tokens"])[rows].tolist(),
                                                           ok.tolist())],
        "ttfts": [num(f - d) if o else 0.0 for f, d, o in zip(first.tolist(), disp.tolist(), ok.tolist())],
        "itls": [np.diff(c).tolist() for c in per_chunks],
        "latencies": [num(f - d) if o else 0.0 for f, d, o in zip(fin.tolist(), disp.tolist(), ok.tolist())],
        "start_times": [num(d) for d in disp.tolist()],
        "queue_times": [num(d - a) for d, a in zip(disp.tolist(), arr.tolist())],
        "generated_texts": ["" for _ in rows],
        "errors": ["" if o else str(s) for s, o in zip(status.tolist(), ok.tolist())],
        "max_output_tokens_per_s": _peak_tokens_per_s(disp[ok], per_chunks),
        "max_concurrent_requests": summary.get("max_concurrent_requests"),
    }
    from llmqueue.metrics.summary import percentile_word

    for m in percentile_metrics:
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{m}_ms"] = summary.get(f"{stat}_{m}_ms")
        for p in percentiles:
            key = f"p{percentile_word(p)}_{m}_ms"
            out[key] = summary.get(key)
    return out


def write_result(path, result: dict) -> None:
    """Write ``result`` as vLLM does (one JSON object; missing parents created)."""
    from pathlib import Path

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    from llmqueue._files import write_atomic

    write_atomic(path, json.dumps(clean(result), allow_nan=False, default=float))
