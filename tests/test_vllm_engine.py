"""A real vLLM CPU server (tests marked ``vllm``; excluded by default).

Run with ``bash scripts/ci_vllm.sh`` (makes the venv first) or ``python -m pytest -q -m vllm``.
The ``vllm_server`` fixture (tests/conftest.py) serves a tiny random-weight Llama on 127.0.0.1.
"""

from __future__ import annotations

import json
import random
import threading
import time

import numpy as np
import pytest
from _cli import run_cli

pytestmark = pytest.mark.vllm

httpx = pytest.importorskip("httpx")
# loopback only: no proxy from the environment
_HTTP = httpx.Client(trust_env=False, timeout=300)


def _stream_completion(srv, prompt_ids, max_tokens):
    body = {"model": srv.model, "prompt": prompt_ids, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    chunks = []
    with _HTTP.stream("POST", f"{srv.url}/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def test_streamed_token_id_prompt_gives_exactly_max_tokens(vllm_server):
    rng = random.Random(1)
    prompt = [rng.randrange(16, 4096) for _ in range(100)]
    chunks = _stream_completion(vllm_server, prompt, 37)
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == 100
    assert usage["completion_tokens"] == 37
    ids = [t for c in chunks for ch in c.get("choices", []) for t in (ch.get("token_ids") or [])]
    assert len(ids) == 37
    assert all(0 <= t < 4096 for t in ids)
    finish = [ch.get("finish_reason") for c in chunks for ch in c.get("choices", [])]
    assert finish[-1] == "length"


def test_chat_template_and_tokenizer_work(vllm_server):
    r = _HTTP.post(f"{vllm_server.url}/v1/chat/completions", timeout=300, json={
        "model": vllm_server.model, "max_tokens": 5, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Hello there, how are you?"}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5
    tok = _HTTP.post(f"{vllm_server.url}/tokenize", json={"model": vllm_server.model, "prompt": "Bakode tumi."})
    assert tok.status_code == 200 and tok.json()["count"] > 0


def test_metrics_parse_and_kv_capacity(vllm_server, vllm_model_dir):
    from llmqueue.bench.prom import cache_config, parse_metrics, snapshot_row
    from llmqueue.hardware.hf_config import model_from_hf_config
    from llmqueue.hardware.memory import kv_bytes_per_token

    snap = parse_metrics(_HTTP.get(f"{vllm_server.url}/metrics", timeout=30).text)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:iteration_tokens_total_sum",
                 "vllm:iteration_tokens_total_count", "vllm:time_to_first_token_seconds_count"):
        assert name in snap, name
    cc = cache_config(snap)
    assert cc.block_size == 32
    assert cc.M == cc.num_gpu_blocks * cc.block_size
    assert cc.M == int(cc.labels["kv_cache_size_tokens"])
    # llmqueue's KV arithmetic predicts the engine's capacity: 1 GiB / bytes per fp32 token.
    per_token = kv_bytes_per_token(model_from_hf_config(vllm_model_dir / "config.json"), "fp32")
    assert cc.M == (int(cc.labels["kv_cache_memory_bytes"]) // per_token) // 32 * 32
    row = snapshot_row(snap)
    assert row["num_running"] >= 0 and 0 <= row["kv_usage"] <= 1


def test_sampler_and_iteration_log_during_a_burst(vllm_server):
    """Long "anchor" requests one at a time, then a burst of ``n`` short ones.

    Whether a row was scraped while an anchor ran is read from the server's own counter in that
    row, not from the client's clock: on these 2-core machines a process beside the busy engine
    (this test, the sampler thread) can stall for seconds, so client time stamps of streamed
    tokens lag the engine. While only anchors run, a row whose generation counter is part-way
    through an anchor (``(G - G0) % a_olen != 0``) was taken mid-request: ``num_running == 1``.
    Anchors are repeated until the sampler has two such rows (a stall outlasting one anchor).
    """
    from llmqueue.bench.prom import MetricsSampler, iteration_steps, read_iteration_log

    rng = random.Random(2)
    n, plen, olen = 8, 64, 48
    a_olen, max_anchors = 300, 6                  # an anchor decodes for about 4 s here
    t0_wall, t0 = time.time(), time.perf_counter()
    before = len(read_iteration_log(vllm_server.log_path)["step"])
    errors = []

    def one(max_tokens):
        try:
            c = _stream_completion(vllm_server, [rng.randrange(16, 4096) for _ in range(plen)], max_tokens)
            assert c[-1]["usage"]["completion_tokens"] == max_tokens
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def mid_anchor(cols, g0, t_end):
        g = cols["generation_tokens"] - g0
        taken = cols["t_s"] + cols["scrape_s"] / 2 < t_end             # scrape over before t_end
        return taken & (g > 0) & (g % a_olen != 0)

    with MetricsSampler(vllm_server.url, interval_s=0.1, t0=t0) as sampler:
        deadline = time.monotonic() + 30
        while len(sampler.rows) < 2 and time.monotonic() < deadline:  # an idle sample or two first
            time.sleep(0.05)
        idle = sampler.to_columns()
        assert len(idle["t_s"]) >= 2 and idle["num_running"][-1] == 0, idle
        g0 = idle["generation_tokens"][-1]
        anchors = 0
        while anchors < max_anchors:
            one(a_olen)
            anchors += 1
            if mid_anchor(sampler.to_columns(), g0, time.perf_counter() - t0).sum() >= 2:
                break
        t_burst = time.perf_counter() - t0
        threads = [threading.Thread(target=one, args=(olen,)) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors
    cols = sampler.to_columns()
    assert sampler.errors == 0, sampler.last_error
    assert len(cols["t_s"]) >= 4 and np.all(np.diff(cols["t_s"]) > 0)
    mid = mid_anchor(cols, g0, t_burst)
    assert mid.sum() >= 2, f"{mid.sum()} scrapes part-way through {anchors} anchors of {a_olen} tokens"
    assert np.all(cols["num_running"][mid] == 1), cols["num_running"][mid]
    assert np.nanmax(cols["num_running"]) <= n
    assert np.all(np.diff(cols["generation_tokens"]) >= 0)        # counters never fall
    assert cols["generation_tokens"][-1] - g0 >= anchors * a_olen + n * olen - olen
    assert sampler.cache_config is not None and sampler.cache_config.M > 0
    ts = sampler.to_timeseries()
    assert len(ts) == len(cols["t_s"])

    # The per-step log: the anchors' and the burst's prompt and decode tokens are all there.
    time.sleep(0.5)  # the API server logs a step just after it ends
    log = read_iteration_log(vllm_server.log_path)
    new = {k: v[before:] for k, v in log.items()}
    assert new["prefill_tokens"].sum() == (anchors + n) * plen
    # each request's first output token comes from its prefill step, the rest from decode steps
    assert new["decode_tokens"].sum() == anchors * (a_olen - 1) + n * (olen - 1)
    assert np.all(new["duration_s"] > 0) and np.all(np.isfinite(new["t_log"]))
    assert np.all(np.diff(new["step"]) == 1)
    steps = iteration_steps(new, t0_wall=t0_wall, M=sampler.cache_config.M)
    assert len(steps) == len(new["step"])
    assert steps["start_s"].min() > -1.0 and steps["start_s"].max() < time.time() - t0_wall
    assert steps["kv_tokens"].max() > 0


def test_kv_pressure_preempts_and_stop_kills_every_process(vllm_venv, vllm_model_dir, tmp_path):
    """A cache of 16 blocks (15 usable: 480 tokens) for 6 requests of 64 + 96 tokens: the engine preempts."""
    from llmqueue.bench.engine import VllmServer, _alive, _descendants
    from llmqueue.bench.prom import cache_config, parse_metrics

    srv = VllmServer(vllm_model_dir, venv=vllm_venv, work_dir=tmp_path / "work",
                     log_path=tmp_path / "server.log", num_gpu_blocks_override=16,
                     max_num_seqs=8, max_model_len=256, iteration_details=False)
    with srv:
        family = [srv.pid, *_descendants(srv.pid)]
        assert len(family) >= 2  # the API server and its engine core
        rng = random.Random(3)
        errors = []

        def one():
            try:
                c = _stream_completion(srv, [rng.randrange(16, 4096) for _ in range(64)], 96)
                assert c[-1]["usage"]["completion_tokens"] == 96
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        snap = parse_metrics(_HTTP.get(f"{srv.url}/metrics", timeout=30).text)
        cc = cache_config(snap)
        assert (cc.M, cc.M_usable) == (16 * 32, 15 * 32)
        assert snap.value("vllm:num_preemptions_total") >= 1
    deadline = time.time() + 10
    while any(_alive(p) for p in family) and time.time() < deadline:
        time.sleep(0.2)
    assert not [p for p in family if _alive(p)]
    assert srv.pid is None


def test_trace_prefix_hashes_hit_vllms_prefix_cache_as_simulated(vllm_venv, vllm_model_dir, tmp_path):
    """A Mooncake-style trace replayed with its hash ids against vLLM with prefix caching on: the
    server's prefix-cache hits (tokens) equal what llmqueue's simulator predicts for the same
    trace; without the hash ids (random prompts) the server finds nothing to reuse."""
    from llmqueue.bench.client import run_bench
    from llmqueue.bench.engine import VllmServer
    from llmqueue.records import read_run
    from llmqueue.workload.traces import load_trace, trace_to_requests
    from tests.conftest import VLLM_TEST_MODEL

    H = 64                                         # tokens a hash: two vLLM blocks of 32
    lines = []
    for i in range(10):
        doc = i % 3                                # three documents, each a two-hash prefix
        hashes = [10 * doc, 10 * doc + 1, 1000 + i] + ([2000 + i] if i % 2 else [])
        lines.append(json.dumps({"timestamp": 400 * i, "input_length": len(hashes) * H - 9, "output_length": 4,
                                 "hash_ids": hashes}))
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    tr = load_trace(str(trace))
    reqs = trace_to_requests(tr)
    assert run_cli("simulate", "--trace", str(trace), "--enable-prefix-caching", "--prefix-block-tokens", str(H),
                   "--block-size", "32", "--capacity-tokens", "100000", "--step-time", "0.01",
                   "--out", str(tmp_path / "sim"), "--json").code == 0
    predicted = int(read_run(tmp_path / "sim").requests["cached_prompt_tokens"].sum())
    assert predicted == 7 * 2 * H                  # each document's 2nd, 3rd... request reuses 2 hashes

    vocab = VLLM_TEST_MODEL["vocab_size"]
    srv = VllmServer(vllm_model_dir, venv=vllm_venv, work_dir=tmp_path / "work", log_path=tmp_path / "server.log",
                     enable_prefix_caching=True, max_model_len=1024, iteration_details=False)
    with srv:
        hits = {}
        for name, h in (("hashes", tr.hash_ids), ("random", None)):
            # one request at a time: a client stall cannot put two of a document's requests in one step
            res = run_bench(srv.url, srv.model, reqs, vocab_size=vocab, hash_ids=h, prefix_block_tokens=H,
                            metrics_url=srv.url, metrics_interval_s=0.2, seed=1 if h is None else 0, concurrency=1,
                            out_dir=tmp_path / name)
            assert res.error is None and (res.records["status"] == "ok").all(), res.summary["errors"]
            c = res.summary["server_counters"]
            assert c["prefix_cache_queries"] == reqs.prompt_tokens.sum()
            hits[name] = c["prefix_cache_hits"]
    assert hits["hashes"] == predicted
    assert hits["random"] == 0
    # validate simulates the measured run with its prompts' hashes (the server counted prefix-cache
    # queries, so it had caching on) and sets the server's hits beside the simulated ones
    from llmqueue.bench.validate import validate

    # one request at a time: the batch limits do not matter, but validate takes none for granted
    cal = {"capacity_tokens": 100000, "b": 0.01, "step_time": "0.01",
           "engine": {"block_size": 32, "max_num_seqs": 256, "max_num_batched_tokens": 8192}}
    v = validate(tmp_path / "hashes", cal)
    row = next(r for r in v["rows"] if r["quantity"] == "prefix_cache_hits")
    assert row["measured"] == row["simulated"] == predicted
    assert v["prefix_caching"] == {"hash_block_tokens": H, "requests_with_hashes": 10}
    from llmqueue.errors import InputError

    with pytest.raises(InputError, match="verdict_copies"):  # back-to-back copies would share prefixes
        validate(tmp_path / "hashes", cal, verdict_copies=2)
    v = validate(tmp_path / "random", cal)
    assert v["prefix_caching"] is None and "prefix_cache_hits" not in [r["quantity"] for r in v["rows"]]


def test_bad_server_argument_fails_fast_with_log_tail(vllm_venv, vllm_model_dir, tmp_path):
    from llmqueue.bench.engine import VllmServer, VllmServerError

    srv = VllmServer(vllm_model_dir, venv=vllm_venv, work_dir=tmp_path, log_path=tmp_path / "bad.log",
                     extra_args=["--no-such-flag"], startup_timeout_s=120)
    t = time.monotonic()
    with pytest.raises(VllmServerError, match="exited with code") as e:
        srv.start()
    assert time.monotonic() - t < 120
    assert "no-such-flag" in str(e.value)
    assert srv.pid is None


def test_bench_server_log_calibrate_and_probe(vllm_server, tmp_path):
    """The CLI path a user takes: ``llmqueue bench --server-log`` (vLLM's per-step lines become
    steps.parquet on the run's clock), then ``calibrate --probe``: the step cycle b-bar and the
    linear step model come from those steps, and the frontend delay from the probe's isolated
    requests with the engine's logged prefill times taken out (a few ms on loopback)."""
    from llmqueue.records import read_steps

    common = ["--url", vllm_server.url, "--model", vllm_server.model, "--vocab-size", "4096",
              "--server-log", str(vllm_server.log_path), "--no-progress", "--json"]
    load = tmp_path / "load"
    s = run_cli("bench", *common, "--arrival", "poisson:4", "--prompt", "fixed:48", "--output", "fixed:12",
                "--num-requests", "12", "--seed", "1", "--out", str(load)).json()
    assert s["completed"] == 12 and s["bench"]["server_log_steps"] > 0
    steps = read_steps(load / "steps.parquet")
    assert steps["prefill_tokens"].sum() == 12 * 48            # every prompt token, in this run's steps
    assert steps["decode_seqs"].sum() == 12 * 11               # the first token comes with the prefill
    end = steps["start_s"] + steps["duration_s"]
    assert end.min() >= 0 and end.max() <= s["bench"]["t_end_s"] + 1.0
    probe = tmp_path / "probe"
    assert run_cli("bench", *common, "--arrival", "deterministic:2", "--prompt", "uniform:16:64", "--output", "fixed:4",
                   "--num-requests", "8", "--seed", "2", "--out", str(probe)).code == 0
    cal = run_cli("calibrate", str(load), "-o", str(tmp_path / "cal.yaml"), "--probe", str(probe), "--json").json()
    assert cal["b_estimator"] == "cycle" and 0 < cal["b"] < 5
    assert cal["linear"] is not None and cal["linear"]["steps"] >= 20
    assert 0 <= cal["frontend_latency_s"] < 0.2
    assert any("step log" in n for n in cal["notes"])
