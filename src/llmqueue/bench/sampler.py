"""The server's ``/metrics`` during a benchmark run: started before the first send, stopped after
the last answer (:class:`llmqueue.bench.prom.MetricsSampler`, a thread on the run's clock).

What comes of it: ``timeseries.parquet`` (the server's queue gauges in the simulator's schema),
``metrics.parquet`` (every sampled column: gauges, counters such as preemptions, histogram sums
and counts) and ``server.json`` (its KV cache shape); the summary's ``server_counters`` are the
counters' growth over the run, from a scrape taken before the first send to one taken after the
last answer (and after the server's finished-requests counter caught up with the answers, up to
2 s). A sampler that cannot start or fails is a note, never the run's failure.
"""

from __future__ import annotations

import time

SERVER_FILE = "server.json"
METRICS_FILE = "metrics.parquet"


def start_sampler(metrics_url: str | None, interval_s: float, notes: list):
    """The sampler of ``metrics_url`` (None when there is none), after its first scrape: the
    server counters' growth (``server_counters``) is measured from that baseline, so it covers
    every request of the run even when the polling thread's first scrape comes late. The caller
    starts the thread (``start(t0=...)``)."""
    if not metrics_url:
        return None
    try:
        from llmqueue.bench.prom import MetricsSampler
    except ImportError:
        notes.append("--metrics-url given but llmqueue.bench.prom.MetricsSampler is not available: "
                     "no server time series")
        return None
    try:
        s = MetricsSampler(metrics_url, interval_s=interval_s, clock=time.perf_counter)
        s.sample_once()
        return s
    except Exception as e:  # noqa: BLE001 - the sampler is optional
        notes.append(f"metrics sampler did not start: {e}")
        return None


def stop_sampler(s, metrics_url: str, finished_ok: int, notes: list):
    """Stop the sampler (once the server counted ``finished_ok`` finished requests, or after a
    while): ``(time series, what the server said about itself for server.json, every sampled
    column for metrics.parquet)``, each None when missing."""
    ts = server = cols = None
    try:
        s.stop(finished_at_least=finished_ok)
        if len(getattr(s, "rows", ())):
            ts = s.to_timeseries()
            cols = s.to_columns()
        cc = getattr(s, "cache_config", None)
        if cc is not None:
            server = {"metrics_url": metrics_url, **cache_server(cc)}
        if getattr(s, "errors", 0):
            notes.append(f"metrics sampler: {s.errors} failed scrape(s) ({s.last_error})")
    except Exception as e:  # noqa: BLE001
        notes.append(f"metrics sampler failed: {e}")
    return ts, server, cols


def cache_server(cc) -> dict:
    """What the server's ``vllm:cache_config_info`` (``cc``: a :class:`~llmqueue.bench.prom.CacheConfig`)
    says about it, for ``server.json``: every label typed (:func:`~llmqueue.bench.server_info.from_cache_config`),
    the KV blocks and their size, ``M`` and ``M_usable``, each with its source ``metrics``."""
    from llmqueue.bench.server_info import from_cache_config

    labels = from_cache_config(cc.labels)
    return {**labels, "num_gpu_blocks": cc.num_gpu_blocks, "block_size": cc.block_size, "M": cc.M,
            "M_usable": cc.M_usable, "cache_config_info": dict(cc.labels),
            "sources": {k: "metrics" for k in (*labels, "num_gpu_blocks", "block_size")}}
