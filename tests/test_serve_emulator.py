"""``llmqueue emulate``: vLLM's surface (answers, errors, metrics, log), aborts and faults.

Each test starts the emulator in a subprocess on free loopback ports (``EmulatorProcess``) and
talks to it over HTTP; steps take tens of milliseconds so that timing checks hold on a busy
machine (no tight wall-clock bounds: counts, orders and generous hang guards).
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from llmqueue.bench.prom import parse_iteration_log, parse_metrics
from llmqueue.bench.server_info import parse_server_log
from llmqueue.serve.launch import EmulatorProcess

ENGINE = ("--step-time", "0.02", "--capacity-tokens", "8192", "--max-model-len", "1024", "--block-size", "16",
          "--max-num-seqs", "8")


def _client(url):
    return httpx.Client(base_url=url, timeout=30, trust_env=False)


def _events(text: str) -> list:
    return [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]


def test_bad_input_gets_vllms_status_and_body_and_the_server_keeps_serving():
    with EmulatorProcess(*ENGINE, "--served-model-name", "m") as emu, _client(emu.url) as c:
        cases = [
            (c.post("/v1/completions", content=b"{not json"), 400, "Bad Request", "body"),
            (c.post("/v1/completions", json=[1, 2]), 400, "Bad Request", "body"),
            (c.post("/v1/completions", json={"model": "nope", "prompt": [1, 2]}), 404, "NotFoundError", "model"),
            (c.post("/v1/completions", json={"prompt": [7] * 1100, "max_tokens": 4}), 400, "BadRequestError",
             "input_tokens"),
            (c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 10 ** 9}), 400, "BadRequestError",
             "max_tokens"),
            (c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": -1}), 400, "BadRequestError",
             "max_tokens"),
            (c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": "x"}), 400, "Bad Request",
             "body.max_tokens"),
            (c.post("/v1/completions", json={"max_tokens": 2}), 400, "BadRequestError", "prompt"),
        ]
        for r, status, kind, param in cases:
            assert r.status_code == status, r.text
            err = r.json()["error"]
            assert (err["type"], err["param"], err["code"]) == (kind, param, status)
        assert "maximum context length is 1024" in cases[3][0].json()["error"]["message"]
        assert c.get("/v1/completions").status_code == 405 and c.get("/nowhere").status_code == 404
        # malformed HTTP on a raw socket: 400, the connection closed, the server still serving
        host, port = emu.url.rsplit("/", 1)[1].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 400")
        # a prompt + max_tokens over max_model_len is cut to what fits (vLLM answers 200)
        r = c.post("/v1/completions", json={"prompt": [7] * 1000, "max_tokens": 100})
        assert r.status_code == 200 and r.json()["usage"] == {
            "prompt_tokens": 1000, "total_tokens": 1024, "completion_tokens": 24,
            "prompt_tokens_details": None, "completion_tokens_details": None}
        stats = c.get("/emulator/stats").json()
        assert stats["requests"] == 9 and not stats["dead"]


def test_answers_streamed_and_whole_as_vllm_shapes_them():
    with EmulatorProcess(*ENGINE) as emu, _client(emu.url) as c:
        body = {"prompt": [1, 2, 3, 4], "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        r = c.post("/v1/completions", json=body)
        assert r.headers["content-type"].startswith("text/event-stream") and r.text.endswith("data: [DONE]\n\n")
        ev = _events(r.text)
        assert [e["choices"][0]["finish_reason"] for e in ev[:3]] == [None, None, "length"]
        assert [e["usage"]["completion_tokens"] for e in ev[:3]] == [1, 2, 3]
        assert ev[3]["choices"] == [] and ev[3]["usage"] == {"prompt_tokens": 4, "total_tokens": 7,
                                                             "completion_tokens": 3}
        r = c.post("/v1/completions", json={**body, "stream_options": None})
        assert len(_events(r.text)) == 3 and all("usage" not in e for e in _events(r.text))
        chat = {"messages": [{"role": "user", "content": "hello there"}], "max_completion_tokens": 2, "stream": True,
                "stream_options": {"include_usage": True}}
        ev = _events(c.post("/v1/chat/completions", json=chat).text)
        assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert [e["choices"][0]["delta"] for e in ev[1:3]] == [{"content": " tok"}] * 2
        # the stated text rule: ceil(11 bytes / 4) = 3 tokens, plus 4 for the message
        assert ev[3]["usage"] == {"prompt_tokens": 7, "total_tokens": 9, "completion_tokens": 2}
        whole = c.post("/v1/chat/completions", json={**chat, "stream": False}).json()
        assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["content"] == " tok tok"
        assert c.post("/v1/completions", json={"prompt": "abcdefgh", "max_tokens": 5}).json()["usage"][
            "prompt_tokens"] == 2
        assert c.get("/v1/models").json()["data"][0]["max_model_len"] == 1024
        assert c.get("/health").status_code == 200


def test_a_disconnect_frees_the_engine_and_is_counted_as_an_abort(tmp_path):
    with EmulatorProcess(*ENGINE) as emu, _client(emu.url) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": [1] * 64, "max_tokens": 500, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break  # one token came: the request runs
            snap = parse_metrics(c.get("/metrics").text)
            assert snap.value("vllm:num_requests_running") == 1 and snap.value("vllm:kv_cache_usage_perc") > 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the next step boundary (20 ms) frees it
            snap = parse_metrics(c.get("/metrics").text)
            if snap.value("vllm:num_requests_running") == 0:
                break
            time.sleep(0.05)
        assert snap.value("vllm:num_requests_running") == 0 and snap.value("vllm:kv_cache_usage_perc") == 0
        assert snap.value("vllm:request_success_total", finished_reason="abort") == 1
        assert snap.value("vllm:request_success_total", finished_reason="length") == 0
        assert snap.value("vllm:generation_tokens_total") < 500


def test_metrics_count_what_was_served():
    with EmulatorProcess(*ENGINE, "--served-model-name", "m") as emu, _client(emu.url) as c:
        for n in (3, 5):
            c.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": n})
        snap = parse_metrics(c.get("/metrics").text)
        lab = {"model_name": "m", "engine": "0"}
        assert snap.value("vllm:generation_tokens_total", **lab) == 8
        assert snap.value("vllm:prompt_tokens_total", **lab) == 20
        assert snap.value("vllm:request_success_total", finished_reason="length", **lab) == 2
        assert snap.value("vllm:e2e_request_latency_seconds_count", **lab) == 2
        assert snap.value("vllm:inter_token_latency_seconds_count", **lab) == 2 + 4
        # a token every 20 ms step: the inter-token latencies sum to 6 steps exactly
        assert snap.value("vllm:inter_token_latency_seconds_sum", **lab) == pytest.approx(6 * 0.02, rel=1e-6)
        cfg = snap.labels("vllm:cache_config_info")
        assert (cfg["block_size"], cfg["num_gpu_blocks"]) == ("16", "512")
        assert snap.types["vllm:time_to_first_token_seconds"] == "histogram"


def test_the_log_is_vllms_for_server_log_readers(tmp_path):
    log = tmp_path / "emu.log"
    with EmulatorProcess(*ENGINE, "--enable-logging-iteration-details", "--log-file", str(log)) as emu, \
            _client(emu.url) as c:
        t0 = time.time()
        c.post("/v1/completions", json={"prompt": [1] * 40, "max_tokens": 4})
        time.sleep(0.1)
    settings = parse_server_log(log)
    assert (settings["max_num_seqs"], settings["max_num_batched_tokens"], settings["block_size"],
            settings["max_model_len"], settings["num_gpu_blocks"]) == (8, 8192, 16, 1024, 512)
    cols = parse_iteration_log(log.read_text())
    assert list(cols["prefill_tokens"]) == [40, 0, 0, 0] and list(cols["decode_seqs"]) == [0, 1, 1, 1]
    assert list(cols["duration_s"]) == pytest.approx([0.02] * 4)
    assert cols["t_log"][0] > t0 and list(cols["t_log"][1:] - cols["t_log"][:-1]) == pytest.approx([0.02] * 3,
                                                                                                  abs=1e-5)


def test_replicas_listen_on_consecutive_ports_and_are_independent():
    with EmulatorProcess(*ENGINE, "--replicas", "2", "--port", "0") as emu:
        assert len(emu.urls) == 2
        with _client(emu.urls[0]) as a, _client(emu.urls[1]) as b:
            a.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
            assert parse_metrics(a.get("/metrics").text).value("vllm:generation_tokens_total") == 3
            assert parse_metrics(b.get("/metrics").text).value("vllm:generation_tokens_total") == 0


def test_fail_after_resets_open_connections_and_refuses_later_ones():
    with EmulatorProcess(*ENGINE, "--fail-after", "1") as emu, _client(emu.url) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": [1], "max_tokens": 1000, "stream": True}) as r:
            it = r.iter_lines()
            next(line for line in it if line.startswith("data: {"))
            with httpx.Client(base_url=emu.url, timeout=30, trust_env=False) as other:
                with pytest.raises(httpx.HTTPError):
                    other.post("/v1/completions", json={"prompt": [1], "max_tokens": 2})  # request 2: the crash
            with pytest.raises(httpx.HTTPError):
                for _ in it:  # the open stream is reset
                    pass
        with pytest.raises(httpx.ConnectError):
            httpx.get(emu.url + "/health", timeout=5, trust_env=False)


def test_reject_fraction_is_deterministic_for_a_seed():
    def statuses(seed):
        with EmulatorProcess(*ENGINE, "--reject-fraction", "0.5", "--reject-status", "429", "--seed", str(seed)) as emu, \
                _client(emu.url) as c:
            return [c.post("/v1/completions", json={"prompt": [1], "max_tokens": 1}).status_code for _ in range(12)]

    a, b = statuses(3), statuses(3)
    assert a == b and set(a) == {200, 429}
    import random

    rng = random.Random(3)
    assert a == [429 if rng.random() < 0.5 else 200 for _ in range(12)]


def test_slow_factor_stretches_the_steps_in_its_window(tmp_path):
    log = tmp_path / "emu.log"
    with EmulatorProcess(*ENGINE, "--slow-factor", "3@0:1000", "--enable-logging-iteration-details", "--log-file",
                         str(log)) as emu, _client(emu.url) as c:
        c.post("/v1/completions", json={"prompt": [1] * 8, "max_tokens": 3})
        time.sleep(0.1)
    assert list(parse_iteration_log(log.read_text())["duration_s"]) == pytest.approx([0.06] * 3)


def test_restart_drops_everything_and_comes_back_empty():
    with EmulatorProcess(*ENGINE, "--restart-after", "1.5", "--restart-delay", "1.0") as emu, _client(emu.url) as c:
        c.post("/v1/completions", json={"prompt": [1], "max_tokens": 2})
        with pytest.raises(httpx.HTTPError):
            c.post("/v1/completions", json={"prompt": [1], "max_tokens": 200}, timeout=60)  # cut by the restart
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                r = httpx.get(emu.url + "/emulator/stats", timeout=5, trust_env=False)
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        assert r.json()["restarts"] == 1
        snap = parse_metrics(httpx.get(emu.url + "/metrics", timeout=5, trust_env=False).text)
        assert snap.value("vllm:generation_tokens_total") == 0  # fresh counters, as a new process
        with _client(emu.url) as c2:
            assert c2.post("/v1/completions", json={"prompt": [1], "max_tokens": 2}).status_code == 200
