"""Writes the other clients' result files that tests/test_import.py imports (run it to remake them).

Shapes followed (the tools' own models, read, not copied):

- guidellm_v0.7_benchmarks.json: vllm-project/guidellm v0.7.x / main (2026),
  ``GenerativeBenchmarksReport.model_dump(mode="json")``: src/guidellm/benchmark/schemas/report.py
  (metadata.version 2), benchmark.py (``config``, ``metrics.request_totals``, ``requests`` by
  status), src/guidellm/schemas/request_stats.py (``GenerativeRequestStats`` and its serialized
  computed fields), schemas/info.py (``RequestInfo``, ``RequestTimings``: Unix seconds),
  schemas/request.py (``UsageMetrics``). Two benchmarks (a synchronous one and a constant-rate one).
- guidellm_v0.3_benchmarks.json: guidellm v0.3.1, src/guidellm/benchmark/benchmark.py
  (``GenerativeTextResponseStats``/``GenerativeTextErrorStats``, ``request_totals``) and
  src/guidellm/scheduler/result.py (``SchedulerRequestInfo``). One benchmark.
- aiperf_profile_export.jsonl: ai-dynamo/aiperf main of October 2025,
  aiperf/common/models/record_models.py (``MetricRecordInfo``: metadata, metrics {value, unit},
  error), docs/tutorials/working-with-profile-exports.md; display units as AIPerf exports them
  (ms for times, tokens for lengths). Warmup records first, one cancelled and one failed request.

The numbers are drawn (seeded) from a plain model of a lightly loaded server: Poisson sends at
2 req/s, TTFT 40-80 ms, 15-17 ms between chunks (times rounded to the microsecond).
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

HERE = Path(__file__).parent
T0 = 1_767_225_600.0  # 2026-01-01 UTC


def _requests(n, rate, seed):
    rnd = random.Random(seed)
    t, out = T0, []
    for i in range(n):
        t += rnd.expovariate(rate)
        n_in, n_out = rnd.randint(64, 512), rnd.randint(6, 24)
        ttft = round(0.04 + 0.04 * rnd.random(), 6)
        gaps = [round(0.015 + 0.002 * rnd.random(), 6) for _ in range(n_out - 1)]
        t = round(t, 6)
        out.append({"i": i, "send": t, "n_in": n_in, "n_out": n_out, "ttft": ttft, "gaps": gaps,
                    "uid": str(uuid.UUID(int=rnd.getrandbits(128)))})
    return out


def _gl_new_request(q, status):
    t = q["send"]
    first = t + q["ttft"] if status != "errored" else None
    last = first + sum(q["gaps"]) if status == "completed" else (first + sum(q["gaps"][:3]) if first else None)
    end = (last + 0.0005) if last else t + 0.2
    n_out = q["n_out"] if status == "completed" else (4 if first else 0)
    timings = {"targeted_start": t - 0.0004, "queued": t - 0.0009, "dequeued": t - 0.0003,
               "scheduled_at": t - 0.0002, "resolve_start": t - 0.0001, "request_start": t,
               "first_request_iteration": t + 0.001, "first_token_iteration": first,
               "first_output_token_iteration": first, "last_token_iteration": last,
               "last_request_iteration": end - 0.0002, "request_iterations": n_out + 2,
               "token_iterations": n_out, "request_end": end, "resolve_end": end + 0.0001,
               "finalized": end + 0.002}
    info = {"request_id": q["uid"], "conversation_id": None, "history_len": 0, "turn_index": 0, "node_id": None,
            "agent_id": None, "parent_node_ids": [], "status": status, "scheduler_node_id": 0,
            "scheduler_process_id": 0, "scheduler_start_time": T0, "timings": timings,
            "settings": {"relative_timestamp": None, "requeue_delay": None},
            "error": "ReadTimeout: server disconnected" if status == "errored" else None,
            "traceback": None, "started_at": t, "completed_at": end}
    usage_in = {"text_tokens": q["n_in"], "cached_tokens": 0 if q["i"] % 5 else 16, "text_words": q["n_in"] // 1,
                "text_characters": 5 * q["n_in"]}
    usage_out = {"text_tokens": n_out if status != "errored" else None, "text_words": n_out,
                 "text_characters": 5 * n_out}
    lat = end - t
    return {"type_": "generative_request_stats", "request_id": q["uid"], "response_id": f"cmpl-{q['i']}",
            "request_args": None, "output": " tok tok ...", "reasoning_output": None, "tool_calls": None,
            "info": info, "input_metrics": usage_in, "output_metrics": usage_out,
            "request_start_time": t, "request_end_time": end, "request_latency": lat,
            "prompt_tokens": q["n_in"], "cached_tokens": usage_in["cached_tokens"],
            "output_tokens": usage_out["text_tokens"], "total_tokens": q["n_in"] + n_out,
            "time_to_first_token_ms": 1e3 * (first - t) if first else None,
            "time_per_output_token_ms": 1e3 * (last - t) / n_out if last and n_out else None,
            "inter_token_latency_ms": 1e3 * (last - first) / (n_out - 1) if last and n_out > 1 else None,
            "tokens_per_second": (q["n_in"] + n_out) / lat, "output_tokens_per_second": n_out / lat,
            "time_to_first_output_token_ms": 1e3 * (first - t) if first else None,
            "iter_tokens_per_iteration": 1.0 if n_out > 1 else None,
            "output_tokens_per_iteration": 1.0 if n_out else None}


def _gl_new_benchmark(reqs, strategy, idx):
    groups = {"successful": [], "errored": [], "incomplete": []}
    for q in reqs:
        st = "errored" if q["i"] % 17 == 9 else "cancelled" if q is reqs[-1] else "completed"
        g = {"completed": "successful", "errored": "errored", "cancelled": "incomplete"}[st]
        groups[g].append(_gl_new_request(q, st))
    counts = {k: len(v) for k, v in groups.items()}
    start, end = reqs[0]["send"], reqs[-1]["send"] + 2.0
    return {"type_": "generative_benchmark", "id_": str(uuid.UUID(int=idx + 7)), "run_id": "run-1", "run_index": idx,
            "config": {"id_": str(uuid.UUID(int=idx + 99)), "run_id": "run-1", "run_index": idx,
                       "strategy": strategy, "constraints": {"max_seconds": {"max_duration": 30}},
                       "sample_size": None, "warmup": {"value": None, "mode": "prefer_duration"},
                       "cooldown": {"value": None, "mode": "prefer_duration"}, "prefer_response_metrics": True,
                       "profile": {"type_": "sweep"}, "requests": {}, "backend": {"type_": "openai_http"},
                       "environment": {}},
            "scheduler_state": {"node_id": 0, "num_processes": 1, "start_time": start, "end_time": end},
            "scheduler_metrics": {"start_time": start, "request_start_time": start, "measure_start_time": start,
                                  "measure_end_time": end, "request_end_time": end, "end_time": end},
            "metrics": {"request_totals": {**counts, "total": sum(counts.values())},
                        "requests_per_second": {"successful": {"mean": len(reqs) / (end - start)}}},
            "requests": groups, "start_time": start, "end_time": end, "duration": end - start}


def guidellm_new():
    sync = _requests(3, 1.0, seed=3)
    rated = _requests(30, 2.0, seed=4)
    for q in rated:
        q["send"] += 10.0
    report = {"metadata": {"version": 2, "guidellm_version": "0.7.3", "python_version": "3.12.3",
                           "platform": "Linux-6.8.0-x86_64-with-glibc2.39"},
              "config": {"target": "http://localhost:8000", "profile": "sweep", "rate": None},
              "benchmarks": [_gl_new_benchmark(sync, {"type_": "synchronous", "worker_count": 1,
                                                      "max_concurrency": 1}, 0),
                             _gl_new_benchmark(rated, {"type_": "constant", "rate": 2.0, "max_concurrency": None,
                                                       "startup_duration": 0.0}, 1)]}
    (HERE / "guidellm_v0.7_benchmarks.json").write_text(json.dumps(report))


def guidellm_old():
    reqs = _requests(30, 2.0, seed=5)
    succ, err = [], []
    for q in reqs:
        t = q["send"]
        si = {"requested": True, "completed": True, "errored": q["i"] == 11, "canceled": False,
              "targeted_start_time": t - 0.0003, "queued_time": t - 0.001, "dequeued_time": t - 0.0004,
              "scheduled_time": t - 0.0002, "worker_start": t - 0.0001, "request_start": t,
              "request_end": t + 1.0, "worker_end": t + 1.0001, "process_id": 0}
        first = t + q["ttft"]
        last = first + sum(q["gaps"])
        row = {"type_": "generative_text_response", "request_id": q["uid"], "request_type": "text_completions",
               "scheduler_info": si, "prompt": "w w w ...", "output": " tok tok ...",
               "prompt_tokens": q["n_in"], "output_tokens": q["n_out"], "start_time": t, "end_time": last + 0.0004,
               "first_token_time": first, "last_token_time": last,
               "request_latency": last + 0.0004 - t, "time_to_first_token_ms": 1e3 * (first - t),
               "time_per_output_token_ms": 1e3 * (last - first) / q["n_out"],
               "inter_token_latency_ms": 1e3 * (last - first) / (q["n_out"] - 1),
               "tokens_per_second": 0.0, "output_tokens_per_second": 0.0}
        if q["i"] == 11:
            row.update(type_="generative_text_error", error="Server disconnected", output=None,
                       first_token_time=None, last_token_time=None, output_tokens=0,
                       time_to_first_token_ms=None, time_per_output_token_ms=None, inter_token_latency_ms=None)
            err.append(row)
        else:
            succ.append(row)
    b = {"type_": "generative_benchmark", "id_": "b-1", "run_id": "r-1",
         "args": {"profile": {"type_": "constant"}, "strategy_index": 0,
                  "strategy": {"type_": "constant", "rate": 2.0, "initial_burst": True}, "max_number": None,
                  "max_duration": 15.0, "warmup_number": None, "warmup_duration": None,
                  "cooldown_number": None, "cooldown_duration": None},
         "run_stats": {"start_time": reqs[0]["send"], "end_time": reqs[-1]["send"] + 2},
         "worker": {"type_": "generative_requests_worker"}, "request_loader": {"type_": "generative_request_loader"},
         "extras": {}, "metrics": {},
         "request_totals": {"successful": len(succ), "incomplete": 0, "errored": len(err),
                            "total": len(succ) + len(err)},
         "request_samples": None, "requests": {"successful": succ, "incomplete": [], "errored": err},
         "start_time": reqs[0]["send"], "end_time": reqs[-1]["send"] + 2}
    (HERE / "guidellm_v0.3_benchmarks.json").write_text(json.dumps({"benchmarks": [b]}))


def aiperf():
    reqs = _requests(42, 2.0, seed=6)
    lines = []
    for q in reqs:
        i = q["i"]
        start = int(q["send"] * 1e9)
        phase = "warmup" if i < 2 else "profiling"
        md = {"session_num": i, "x_request_id": q["uid"], "x_correlation_id": str(uuid.UUID(int=i + 1000)),
              "conversation_id": str(uuid.UUID(int=i + 2000)), "turn_index": 0, "request_start_ns": start,
              "request_ack_ns": start + int(1e9 * q["ttft"] * 0.4), "request_end_ns": None,
              "worker_id": "worker_359d423a", "record_processor_id": "record_processor_1fa47cd7",
              "benchmark_phase": phase, "was_cancelled": False, "cancellation_time_ns": None}
        if i == 20:  # cancelled by the client (AIPerf's --request-cancellation-rate)
            md.update(request_end_ns=start + 30_000_000, was_cancelled=True, cancellation_time_ns=start + 30_000_000,
                      request_ack_ns=None)
            lines.append({"metadata": md, "metrics": {"error_isl": {"value": q["n_in"], "unit": "tokens"}},
                          "error": {"code": 499, "type": "RequestCancellationError",
                                    "message": "Request was cancelled after 0.030 seconds"}})
            continue
        if i == 31:
            md.update(request_end_ns=start + 2_000_000, request_ack_ns=None)
            lines.append({"metadata": md, "metrics": {"error_isl": {"value": q["n_in"], "unit": "tokens"}},
                          "error": {"code": 503, "type": "Service Unavailable", "message": "Service Unavailable"}})
            continue
        icl = [1e3 * g for g in q["gaps"]]
        lat = 1e3 * (q["ttft"] + sum(q["gaps"]))
        md["request_end_ns"] = start + int(1e6 * lat)
        m = {"input_sequence_length": {"value": q["n_in"], "unit": "tokens"},
             "time_to_first_token": {"value": 1e3 * q["ttft"], "unit": "ms"},
             "time_to_second_token": {"value": icl[0], "unit": "ms"},
             "request_latency": {"value": lat, "unit": "ms"},
             "output_token_count": {"value": q["n_out"], "unit": "tokens"},
             "inter_chunk_latency": {"value": icl, "unit": "ms"},
             "output_sequence_length": {"value": q["n_out"], "unit": "tokens"},
             "inter_token_latency": {"value": (lat - 1e3 * q["ttft"]) / (q["n_out"] - 1), "unit": "ms"},
             "output_token_throughput_per_user": {"value": 1e3 * (q["n_out"] - 1) / (lat - 1e3 * q["ttft"]),
                                                  "unit": "tokens/sec/user"}}
        lines.append({"metadata": md, "metrics": m, "error": None})
    (HERE / "aiperf_profile_export.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    guidellm_new()
    guidellm_old()
    aiperf()
