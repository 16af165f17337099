"""vLLM's Prometheus metrics for one served engine: the names, types, label sets and histogram
buckets of vLLM 0.32's ``/metrics`` (scraped from its CPU server; ``tests/test_serve_vllm.py``
compares them with a live one), filled from the engine's own events.

One :class:`EngineMetrics` per replica, each with its own ``prometheus_client`` registry (N
replicas in one process never share a series). Labels are vLLM's: ``model_name`` and ``engine``
("0") on every engine series. The gauges (running, waiting, KV usage) are read from the replica
when scraped. Series vLLM exports that have no counterpart in the emulated engine (multimodal
and external caches, FLOPs estimates) are exported at zero, so dashboards and alerts written for
vLLM find every name.

Times are vLLM v1's request stats: TTFT = first token - arrival; inter-token latency = the gap
between consecutive tokens; e2e = finish - arrival; queue = first scheduled - arrival; prefill =
first token - first scheduled; decode = last token - first token; inference = last token - first
scheduled; time per output token = decode / (tokens - 1).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

from llmqueue.serve.histograms import observe_many

_SECONDS_LONG = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
N_BUCKETS = (1, 2, 5, 10, 20)
FINISHED_REASONS = ("abort", "error", "length", "repetition", "stop")

#: ``vllm:cache_config_info``'s labels in vLLM 0.32 (those the emulated engine knows get its values)
CACHE_CONFIG_LABELS = (
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens", "effective_attention_block_size",
    "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching", "engine", "gpu_memory_utilization",
    "hash_block_size", "is_attention_free", "kv_cache_dtype_skip_layers", "kv_cache_layout",
    "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens", "kv_offloading_backend",
    "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size", "mamba_cache_dtype", "mamba_cache_mode",
    "mamba_page_size_padded", "mamba_ssm_cache_dtype", "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
    "prefix_cache_retention_interval", "prefix_caching_hash_algo", "prefix_match_unit", "replayssm_buffer_len",
    "skip_page_size_padded", "sliding_window", "swa_bounded_replay", "use_kda_recoverssm", "use_replayssm",
    "user_specified_block_size")


def buckets_125(top: int) -> tuple:
    """vLLM's 1-2-5 buckets up to ``top`` (``max_model_len``): 1, 2, 5, 10, 20, 50, ..."""
    out, mag = [], 1
    while True:
        for m in (1, 2, 5):
            v = m * mag
            if v > top:
                return tuple(out)
            out.append(v)
        mag *= 10


class EngineMetrics:
    """vLLM's series for one engine (see the module docstring). ``config``: the replica's
    :class:`~llmqueue.engine.config.EngineConfig`; ``max_model_len`` the served limit."""

    def __init__(self, model_name: str, config, max_model_len: int, *, gpu_memory_utilization: float = 0.9):
        self.registry = r = CollectorRegistry(auto_describe=True)
        for c in (ProcessCollector, PlatformCollector, GCCollector):
            c(registry=r)
        lab = {"model_name": model_name, "engine": "0"}
        self.labels = lab
        names = ("model_name", "engine")

        def g(name, doc, extra=()):
            return Gauge(name, doc, (*names, *extra), registry=r)

        def c(name, doc, extra=()):
            return Counter(name, doc, (*names, *extra), registry=r)

        def h(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**lab)

        tok = buckets_125(max_model_len)
        for name, doc in (
                ("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU (for Model "
                 "Flops Utilization calculations)."),
                ("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU (for Model "
                 "Flops Utilization calculations)."),
                ("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU (for "
                 "Model Flops Utilization calculations).")):
            c(name, doc).labels(**lab)
        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.").labels(**lab)
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**lab)
        by_reason = g("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason. Reason labels: "
                      "'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints "
                      "(LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
                      ("reason",))
        self.waiting_capacity = by_reason.labels(**lab, reason="capacity")
        by_reason.labels(**lab, reason="deferred")
        sleep = g("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means "
                  "engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
                  ("sleep_state",))
        sleep.labels(**lab, sleep_state="awake").set(1)
        for s in ("weights_offloaded", "discard_all"):
            sleep.labels(**lab, sleep_state=s)
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**lab)
        self.prefix_queries = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
                                "tokens.").labels(**lab)
        self.prefix_hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
                             ).labels(**lab)
        c("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache "
          "sharing, in terms of number of queried tokens.").labels(**lab)
        c("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache "
          "sharing, in terms of number of cached tokens.").labels(**lab)
        c("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.").labels(**lab)
        c("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.").labels(**lab)
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(**lab)
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**lab)
        by_source = c("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",))
        self.prompt_computed = by_source.labels(**lab, source="local_compute")
        self.prompt_cache_hit = by_source.labels(**lab, source="local_cache_hit")
        by_source.labels(**lab, source="external_kv_transfer")
        self.prompt_cached = c("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
                               ).labels(**lab)
        cached_by = c("vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that supplied "
                      "them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM "
                      "instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
                      "vllm:external_prefix_cache_hits.", ("source",))
        self.cached_device = cached_by.labels(**lab, source="device")
        for s in ("disk", "external_unspecified", "host", "p2p"):
            cached_by.labels(**lab, source=s)
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.").labels(**lab)
        success = c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))
        self.finished = {f: success.labels(**lab, finished_reason=f) for f in FINISHED_REASONS}
        rej = Counter("vllm:admission_rejections", "Number of admission attempts rejected by a queue limit, by reason.",
                      ("model_name", "reason"), registry=r)
        self.rejected_queue = rej.labels(model_name=model_name, reason="max_num_queued_reqs")
        rej.labels(model_name=model_name, reason="max_num_queued_tokens")
        self.h_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.h_generation = h("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.h_iteration = h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                             ITERATION_TOKEN_BUCKETS)
        self.h_max_gen = h("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested "
                           "generation tokens.", tok)
        self.h_n = h("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.h_max_tokens = h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok)
        self.h_ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                        TTFT_BUCKETS)
        self.h_itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.h_tpot = h("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds "
                        "per request.", ITL_BUCKETS)
        self.h_e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                       _SECONDS_LONG)
        self.h_queue = h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                         _SECONDS_LONG)
        self.h_inference = h("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for "
                             "request.", _SECONDS_LONG)
        self.h_prefill = h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                           _SECONDS_LONG)
        self.h_decode = h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                          _SECONDS_LONG)
        self.h_preemptions = h("vllm:request_num_preemptions", "Histogram of the number of times a request was "
                               "preempted.", PREEMPTION_BUCKETS)
        self.h_prefill_kv = h("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during "
                              "prefill (excluding cached tokens).", tok)
        blocks, bs = config.num_kv_blocks, config.block_size
        known = {"block_size": bs, "enable_prefix_caching": config.enable_prefix_caching, "engine": "0",
                 "gpu_memory_utilization": gpu_memory_utilization, "num_gpu_blocks": blocks,
                 "kv_cache_size_tokens": blocks * bs, "effective_attention_block_size": bs, "cache_dtype": "auto",
                 "kv_cache_max_concurrency": round(blocks * bs / max_model_len, 2) if max_model_len else None,
                 "_block_size_resolved": True, "user_specified_block_size": True, "is_attention_free": False}
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", CACHE_CONFIG_LABELS,
                     registry=r)
        info.labels(**{k: str(known.get(k)) for k in CACHE_CONFIG_LABELS}).set(1)

    # -- the engine's events ----------------------------------------------------------------------
    def arrived(self, max_tokens_asked: int | None, max_tokens: int) -> None:
        self.h_n.observe(1)
        self.h_max_tokens.observe(max_tokens if max_tokens_asked is None else max_tokens_asked)
        self.h_max_gen.observe(max_tokens)

    def step(self, prefill_tokens: int, decode_seqs: int, preempted: int) -> None:
        self.h_iteration.observe(prefill_tokens + decode_seqs)
        if preempted:
            self.preemptions.inc(preempted)

    def finished_request(self, r, token_times, reason: str) -> None:
        """A request that left: its record's times (engine seconds) and its tokens' times."""
        n = len(token_times)
        self.finished[reason].inc()
        self.prompt_tokens.inc(r.num_prompt_tokens)
        self.prompt_computed.inc(r.num_prompt_tokens)
        self.generation_tokens.inc(n)
        self.h_prompt.observe(r.num_prompt_tokens)
        self.h_generation.observe(n)
        self.h_preemptions.observe(r.num_preemptions)
        self.h_prefill_kv.observe(r.num_prompt_tokens)
        self.prefix_queries.inc(r.num_prompt_tokens)
        self.h_e2e.observe(r.finish_time - r.arrival_time)
        sched = r.first_scheduled_time
        if sched == sched:
            self.h_queue.observe(sched - r.arrival_time)
        if n:
            first, last = token_times[0], token_times[-1]
            self.h_ttft.observe(first - r.arrival_time)
            if sched == sched:
                self.h_prefill.observe(first - sched)
                self.h_inference.observe(last - sched)
            self.h_decode.observe(last - first)
            if n > 1:
                self.h_tpot.observe((last - first) / (n - 1))
                observe_many(self.h_itl, [token_times[i] - token_times[i - 1] for i in range(1, n)])

    def exposition(self, load) -> bytes:
        """The text exposition, with the gauges read from ``load`` (a ReplicaLoad) now."""
        self.running.set(load.num_running)
        self.waiting.set(load.num_waiting)
        self.waiting_capacity.set(load.num_waiting)
        self.kv_usage.set(load.kv_usage)
        return generate_latest(self.registry)
