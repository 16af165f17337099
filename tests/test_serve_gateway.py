"""``llmqueue gateway`` in front of emulated engines: relaying, records and decisions (replayed by
fresh policy objects: the same decisions), the rules' refusals with Retry-After, retries on
another replica, cancellation, bad input, keys, and a clean stop."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import numpy as np
import pytest

from llmqueue.records import read_records
from llmqueue.serve.launch import EmulatorProcess, GatewayProcess

STEP = "0.02"


def _scenario(tmp_path, gateway: dict | None = None, router: str = "least-outstanding", classes=None,
              max_num_seqs: int = 8) -> str:
    classes = classes or [{"name": "chat", "share": 0.7, "priority": 0}, {"name": "batch", "share": 0.3,
                                                                          "priority": 1}]
    doc = {"name": "gw-test",
           "workload": {"arrival": "poisson:5", "prompt": "fixed:10", "output": "fixed:5", "classes": classes},
           "deployment": {"capacity_tokens": 65536, "step_time": STEP, "max_num_seqs": max_num_seqs,
                          "pools": [{"name": "p", "replicas": 2, "router": router}]},
           "run": {"duration_s": 10}}
    if gateway:
        doc["deployment"]["gateway"] = gateway
    path = tmp_path / "gw.yaml"
    import yaml

    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _post(url, body, headers=None, stream=False, timeout=30.0):
    return httpx.post(url + "/v1/completions", json=body, headers=headers or {}, timeout=timeout)


def test_relays_records_and_replays_its_decisions(tmp_path):
    from llmqueue.cli.gateway_cmd import fleet_of
    from llmqueue.cluster.decisions import fresh_policies, replay

    sc = _scenario(tmp_path)
    out = tmp_path / "run"
    with EmulatorProcess("--replicas", "2", "--step-time", STEP, "--capacity-tokens", "65536") as emu:
        with GatewayProcess("--scenario", sc, "--backend", "p=" + ",".join(emu.urls), "--out", str(out)) as gw:
            whole = _post(gw.url, {"prompt": [1, 2, 3], "max_tokens": 4}, {"X-Request-Class": "batch"})
            assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 4
            with httpx.stream("POST", gw.url + "/v1/completions", json={"prompt": [1] * 20, "max_tokens": 6,
                                                                         "stream": True}, timeout=30) as r:
                events = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
            assert r.status_code == 200 and events[-1] == "data: [DONE]" and len(events) == 7
            for k in range(20):  # a few at once: the router sees outstanding requests
                _post(gw.url, {"prompt": [1] * (5 + k), "max_tokens": 3})
            assert httpx.get(gw.url + "/health").status_code == 200
            models = httpx.get(gw.url + "/v1/models").json()
            assert [m["id"] for m in models["data"]] == ["llmqueue-emulated"]
            metrics = httpx.get(gw.url + "/metrics").text
            assert 'llmqueue_gateway_requests_total{class="chat",outcome="admitted",pool="p",reason=""} 21.0' in metrics
            assert "llmqueue_gateway_predicted_wait_seconds" in metrics
    rec = read_records(out).to_dict()
    assert len(rec["status"]) == 22 and (rec["status"] == "ok").all()
    assert list(rec["class"][:1]) == ["batch"] and set(rec["pool"]) == {"p"} and set(rec["replica"]) <= {0, 1}
    assert list(rec["output_tokens"][:2]) == [4, 6]
    ttft = rec["first_token_s"] - rec["arrival_s"]
    assert (ttft > 0).all() and (rec["finish_s"] >= rec["first_token_s"]).all()
    decisions = [json.loads(ln) for ln in (out / "decisions.jsonl").read_text().splitlines()]
    assert len(decisions) == 22 and {d["kind"] for d in decisions} == {"route"}
    fleet, _ = fleet_of(sc)
    routers, rules = fresh_policies(fleet, 0)
    assert replay(decisions, routers=routers, gateway=rules) == [d["out"] for d in decisions]


def test_bench_class_header_sets_each_requests_class_at_the_gateway(tmp_path):
    """``bench --class-header`` sends each request's class as X-Request-Class: the gateway's records
    carry the bench's classes, request by request (the same geometry could not tell them apart)."""
    from llmqueue.bench.client import run_bench
    from llmqueue.workload import Workload
    from llmqueue.workload.generate import RequestArrays

    sc = _scenario(tmp_path)
    out = tmp_path / "run"
    parts = [Workload("poisson:20", prompt="fixed:10", output="fixed:2", class_name=c).generate(seed=k, n=12)
             for k, c in enumerate(("chat", "batch"))]
    reqs = RequestArrays.merge(*parts)
    with EmulatorProcess("--replicas", "2", "--step-time", STEP, "--capacity-tokens", "65536") as emu:
        with GatewayProcess("--scenario", sc, "--backend", "p=" + ",".join(emu.urls), "--out", str(out)) as gw:
            res = run_bench(gw.url, "llmqueue-emulated", reqs, seed=1, class_header=True)
    sent = res.records.to_dict()
    rec = read_records(out).to_dict()
    assert len(rec["class"]) == 24 and (rec["status"] == "ok").all()
    assert sorted(rec["class"]) == sorted(sent["class"]) and set(rec["class"]) == {"chat", "batch"}


def test_a_rate_limit_is_429_with_retry_after_and_admits_at_most_burst_plus_rate_t(tmp_path):
    sc = _scenario(tmp_path, gateway={"rate_limits": {"*": {"rate": 5, "burst": 3}}})
    out = tmp_path / "run"
    with EmulatorProcess("--replicas", "2", "--step-time", "0.005", "--capacity-tokens", "65536") as emu:
        with GatewayProcess("--scenario", sc, "--backend", "p=" + ",".join(emu.urls), "--out", str(out)) as gw:
            codes, after = [], []
            for _ in range(40):
                r = _post(gw.url, {"prompt": [1, 2], "max_tokens": 1})
                codes.append(r.status_code)
                if r.status_code == 429:
                    after.append(r.headers.get("retry-after"))
                    assert r.json()["error"]["type"] == "RateLimitError"
    assert 429 in codes and 200 in codes and all(a is not None and int(a) >= 1 for a in after)
    rec = read_records(out).to_dict()
    t = np.sort(rec["arrival_s"][rec["status"] == "ok"])
    for i in range(len(t)):  # every window [t_i, t_j]: at most burst + rate (t_j - t_i) admitted
        j = np.arange(i, len(t))
        assert ((j - i + 1) <= 3 + 5 * (t[j] - t[i]) + 1e-9).all()
    assert set(rec["reason"][rec["status"] == "rejected"]) == {"rate limited (*)"}


def test_a_full_queue_is_503_with_retry_after(tmp_path):
    sc = _scenario(tmp_path, gateway={"max_queue_depth": 1}, router="central", max_num_seqs=1)
    out = tmp_path / "run"
    import asyncio

    async def burst(url):
        async with httpx.AsyncClient(timeout=30) as c:
            return await asyncio.gather(*(c.post(url + "/v1/completions", json={"prompt": [1], "max_tokens": 10})
                                          for _ in range(12)))

    with EmulatorProcess("--replicas", "2", "--step-time", "0.05", "--max-num-seqs", "1") as emu:
        with GatewayProcess("--scenario", sc, "--backend", "p=" + ",".join(emu.urls), "--out", str(out)) as gw:
            answers = asyncio.run(burst(gw.url))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(503) >= 4 and codes.count(200) >= 4  # 2 served + at most 2 queued at a time
    assert all(int(a.headers["retry-after"]) >= 1 for a in answers if a.status_code == 503)
    rec = read_records(out).to_dict()
    assert set(rec["reason"][rec["status"] == "rejected"]) == {"queue full"}


def test_a_failed_replica_is_retried_elsewhere_and_counted(tmp_path):
    sc = _scenario(tmp_path, router="round-robin")
    out = tmp_path / "run"
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there: connection refused
    with EmulatorProcess("--step-time", STEP) as emu:
        with GatewayProcess("--scenario", sc, "--backend", f"p=http://127.0.0.1:{port},{emu.url}",
                            "--out", str(out)) as gw:
            answers = [_post(gw.url, {"prompt": [1, 2], "max_tokens": 2}) for _ in range(6)]
            metrics = httpx.get(gw.url + "/metrics").text
    assert [a.status_code for a in answers] == [200] * 6
    assert 'llmqueue_gateway_retries_total{pool="p"} 1.0' in metrics  # once: the dead one is out after it
    rec = read_records(out).to_dict()
    assert (rec["replica"] == 1).all() and sorted(rec["attempt"]) == [1] * 5 + [2]


def test_a_client_that_goes_away_cancels_the_engines_request(tmp_path):
    sc = _scenario(tmp_path)
    out = tmp_path / "run"
    with EmulatorProcess("--step-time", "0.05") as emu:
        with GatewayProcess("--scenario", sc, "--backend", f"p={emu.url}", "--out", str(out)) as gw:
            host, port = gw.url.rsplit("/", 1)[1].split(":")
            s = socket.create_connection((host, int(port)))
            body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 200, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            s.recv(4096)  # the stream has begun
            s.close()
            deadline = time.monotonic() + 20
            running = None
            while time.monotonic() < deadline:
                m = httpx.get(emu.url + "/metrics").text
                running = [ln for ln in m.splitlines() if ln.startswith("vllm:num_requests_running")]
                if running and float(running[0].split()[-1]) == 0.0:
                    break
                time.sleep(0.1)
            assert running and float(running[0].split()[-1]) == 0.0  # the engine let it go
            gm = httpx.get(gw.url + "/metrics").text
    assert 'llmqueue_gateway_cancellations_total{class="chat",pool="p"} 1.0' in gm
    rec = read_records(out).to_dict()
    assert list(rec["status"]) == ["cancelled"] and list(rec["reason"]) == ["client disconnected"]


def test_bad_input_gets_openai_errors_and_the_gateway_keeps_serving(tmp_path):
    sc = _scenario(tmp_path)
    with EmulatorProcess("--step-time", STEP) as emu:
        with GatewayProcess("--scenario", sc, "--backend", f"p={emu.url}", "--out", str(tmp_path / "run")) as gw:
            u = gw.url + "/v1/completions"
            bad = httpx.post(u, content=b"{not json", timeout=10)
            assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
            assert httpx.post(u, json={"model": "nope", "prompt": [1]}, timeout=10).status_code == 404
            assert httpx.post(u, json={"prompt": [1], "max_tokens": -3}, timeout=10).status_code == 400
            cls = httpx.post(u, json={"prompt": [1]}, headers={"X-Request-Class": "vip"}, timeout=10)
            assert cls.status_code == 400 and "X-Request-Class" in cls.json()["error"]["message"]
            big = httpx.post(u, content=b"x" * (9 << 20), timeout=30)
            assert big.status_code == 413
            assert httpx.get(gw.url + "/nowhere", timeout=10).status_code == 404
            ok = _post(gw.url, {"prompt": [1, 2], "max_tokens": 2})
            assert ok.status_code == 200


def test_client_keys_stay_at_the_gateway_and_are_never_recorded(tmp_path):
    from llmqueue.bench.stub_server import StubServer

    sc = _scenario(tmp_path)
    out = tmp_path / "run"
    key = "sk-secret-123456"
    with StubServer(model="llmqueue-emulated") as stub:
        with GatewayProcess("--scenario", sc, "--backend", f"p={stub.url}", "--out", str(out),
                            log_path=str(tmp_path / "gw.log")) as gw:
            r = _post(gw.url, {"prompt": [1, 2], "max_tokens": 2}, {"Authorization": f"Bearer {key}"})
            assert r.status_code == 200
            stats = httpx.get(stub.url + "/stats").json()
            metrics = httpx.get(gw.url + "/metrics").text
    assert stats["authorized"] == 0  # not forwarded
    rec = read_records(out).to_dict()
    assert rec["tenant"][0].startswith("key-") and key not in rec["tenant"][0]
    for f in (out / "decisions.jsonl", tmp_path / "gw.log"):
        assert key not in f.read_text()
    assert key not in metrics


def test_sigterm_drains_and_exits_130_with_the_records_on_disk(tmp_path):
    sc = _scenario(tmp_path)
    out = tmp_path / "run"
    with EmulatorProcess("--step-time", STEP) as emu:
        gw = GatewayProcess("--scenario", sc, "--backend", f"p={emu.url}", "--out", str(out)).start()
        for _ in range(3):
            _post(gw.url, {"prompt": [1, 2], "max_tokens": 2})
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(30) == 130
        gw.stop()
    assert len(read_records(out).to_dict()["status"]) == 3


def test_the_gateway_refuses_what_it_cannot_run(tmp_path):
    from _cli import run_cli

    sc = _scenario(tmp_path)
    code, _, err = run_cli("gateway", "--scenario", sc, "--backend", "q=http://127.0.0.1:1", "--out",
                           str(tmp_path / "r"))
    assert code == 2 and "--backend" in err and "no pool named 'q'" in err
    code, _, err = run_cli("gateway", "--scenario", sc, "--out", str(tmp_path / "r"))
    assert code == 2 and "has no engines" in err
    code, _, err = run_cli("gateway", "--scenario", "pd", "--backend", "prefill=http://127.0.0.1:1",
                           "--backend", "decode=http://127.0.0.1:2", "--out", str(tmp_path / "r"))
    assert code == 2 and "P/D" in err
    code, _, err = run_cli("gateway", "--scenario", sc, "--backend", "p=ftp://x", "--out", str(tmp_path / "r"))
    assert code == 2 and "--backend" in err
    code, _, err = run_cli("gateway", "--scenario", sc, "--backend", "p=http://127.0.0.1:1", "--listen", "nope",
                           "--out", str(tmp_path / "r"))
    assert code == 2 and "--listen" in err


@pytest.mark.slow
def test_central_queue_with_a_depth_bound_is_mmck(tmp_path):
    """c = 2 emulated replicas, one request at a time, exponential service (prompt and output of one
    token: one exponential step of mean 0.1 s), Poisson arrivals at 15 req/s, the central router and
    a depth bound of 1 per replica (K = 4): the blocking probability and the mean wait before
    service of admitted requests are M/M/2/4's, within their 95 % confidence intervals (batch means
    over the run), with mu from the measured mean service time (dispatch to end: the step plus the
    gateway's and the engine's own overhead of a millisecond or two)."""
    from llmqueue.bench.client import run_bench
    from llmqueue.metrics.ci import batch_means_ci
    from llmqueue.theory.classic import mmck
    from llmqueue.workload import Workload

    sc = _scenario(tmp_path, gateway={"max_queue_depth": 1}, router="central", max_num_seqs=1)
    out = tmp_path / "run"
    reqs = Workload("poisson:15", prompt="fixed:1", output="fixed:1").generate(seed=3, n=700)
    with EmulatorProcess("--replicas", "2", "--step-time", "exp:0.1", "--max-num-seqs", "1", "--seed", "5") as emu:
        with GatewayProcess("--scenario", sc, "--backend", "p=" + ",".join(emu.urls), "--out", str(out)) as gw:
            run_bench(gw.url, "llmqueue-emulated", reqs, seed=1)
    rec = read_records(out).to_dict()
    order = np.argsort(rec["arrival_s"])
    st = rec["status"][order]
    blocked = (st == "rejected").astype(float)
    ok = st == "ok"
    wait = (rec["dispatched_s"] - rec["arrival_s"])[order][ok]
    service = (rec["finish_s"] - rec["dispatched_s"])[order][ok]
    assert len(st) == 700 and set(st) <= {"ok", "rejected"}
    mu = 1.0 / service.mean()
    assert 8.5 < mu < 10.5  # the step's 10 per second (600 exponential draws: +-4 %), less a millisecond
    lam = (len(st) - 1) / (rec["arrival_s"].max() - rec["arrival_s"].min())
    th = mmck(lam=lam, mu=mu, c=2, K=4)
    pb, wq = batch_means_ci(blocked), batch_means_ci(wait)
    assert pb.lo <= th.P_block <= pb.hi, (pb, th.P_block)
    assert wq.lo <= th.Wq <= wq.hi, (wq, th.Wq)


def _lanes_scenario(tmp_path) -> str:
    import yaml

    doc = {"name": "gw-lanes",
           "workload": {"arrival": "poisson:24", "classes": [
               {"name": "chat", "share": 0.6, "priority": 0, "prompt": "uniform:5:40", "output": "uniform:2:12"},
               {"name": "batch", "share": 0.4, "priority": 1, "prompt": "uniform:20:80", "output": "uniform:4:20"}]},
           "deployment": {"capacity_tokens": 65536, "step_time": STEP, "max_num_seqs": 8,
                          "pools": [{"name": "chat", "replicas": 2, "router": "round-robin"},
                                    {"name": "bulk", "replicas": 1, "router": "least-outstanding"}],
                          "lanes": [{"name": "interactive", "pool": "chat", "classes": ["chat"]},
                                    {"name": "background", "pool": "bulk", "classes": ["batch"]}],
                          "gateway": {"rate_limits": {"batch": {"rate": 4, "burst": 3}}}},
           "run": {"duration_s": 10}}
    path = tmp_path / "lanes.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_the_simulated_fleet_makes_the_live_gateways_decisions_request_by_request(tmp_path):
    """Item 8 of the issue: `llmqueue simulate --scenario S --trace RUN/workload.parquet` on a gateway
    run's arrivals (each with its class and lengths) makes the gateway's decisions: the lane's pool,
    the replica (round-robin, a central count), and admit or refuse (a token bucket on the batch class,
    429s) agree on at least 99 % of requests (100 % expected: none of these reads the clock beyond the
    arrival times both share), and the time-dependent outcomes agree in distribution (TTFT p50 within
    20 %: the engines' timing is the scenario's step time)."""
    from _cli import run_cli

    from llmqueue.bench.client import run_bench
    from llmqueue.scenario.override import scenario_with

    sc = _lanes_scenario(tmp_path)
    reqs = scenario_with(sc).scenario.requests(seed=4)
    out, sim = tmp_path / "gw", tmp_path / "sim"
    with EmulatorProcess("--replicas", "2", "--scenario", sc, "--pool", "chat") as chat, \
            EmulatorProcess("--scenario", sc, "--pool", "bulk") as bulk:
        with GatewayProcess("--scenario", sc, "--backend", "chat=" + ",".join(chat.urls),
                            "--backend", "bulk=" + bulk.urls[0], "--out", str(out)) as gw:
            run_bench(gw.url, "llmqueue-emulated", reqs, seed=1, class_header=True)
    code, text, err = run_cli("simulate", "--scenario", sc, "--trace", str(out / "workload.parquet"), "--out",
                              str(sim), "--no-progress")
    assert code == 0, err
    live, simd = read_records(out).to_dict(), read_records(sim).to_dict()
    a, b = np.argsort(live["arrival_s"], kind="stable"), np.argsort(simd["arrival_s"], kind="stable")
    assert len(a) == len(b) == len(reqs) > 150
    assert (live["class"][a] == simd["class"][b]).all()
    np.testing.assert_allclose(live["arrival_s"][a] - live["arrival_s"][a][0], simd["arrival_s"][b], atol=1e-9)
    refused = live["status"][a] == "rejected"
    assert 5 <= refused.sum() and set(live["class"][a][refused]) == {"batch"}
    same = ((live["pool"][a] == simd["pool"][b]) & (live["replica"][a] == simd["replica"][b])
            & ((live["status"][a] == "ok") == (simd["status"][b] == "ok")))
    assert same.mean() >= 0.99, np.nonzero(~same)[0][:10]
    ok = (live["status"][a] == "ok") & (simd["status"][b] == "ok")
    ttft_live = np.median((live["first_token_s"] - live["arrival_s"])[a][ok])
    ttft_sim = np.median((simd["first_token_s"] - simd["arrival_s"])[b][ok])
    assert abs(ttft_live / ttft_sim - 1) < 0.2, (ttft_live, ttft_sim)
