"""The gateway in front of two real vLLM CPU servers (``scripts/ci_vllm.sh``): each engine's
/metrics is scraped into the view the policies read (its KV blocks from ``vllm:cache_config_info``),
a client that disconnects frees the engine (``vllm:num_requests_running`` falls back to 0), and the
queue bound sheds with 503 and Retry-After exactly what does not fit (2 x max_num_seqs in service,
max_queue_depth x 2 held)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import os
import time

import httpx
import pytest
import yaml

from llmqueue.bench.prom import cache_config, parse_metrics
from llmqueue.records import read_records
from llmqueue.serve.launch import GatewayProcess

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def second_vllm(vllm_venv, vllm_model_dir):
    from conftest import VLLM_TEST_SERVER, _vllm_work

    from llmqueue.bench.engine import VllmServer

    work = _vllm_work()
    with VllmServer(vllm_model_dir, venv=vllm_venv, work_dir=work, seed=1,
                    log_path=work / "logs" / f"pytest-vllm-b-{os.getpid()}.log", **VLLM_TEST_SERVER) as srv:
        yield srv


def _finished(urls) -> dict:
    """Requests the engines finished, by vLLM's ``finished_reason`` (abort, length, stop)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    for u in urls:
        text = httpx.get(u + "/metrics", timeout=30, trust_env=False).text
        for fam in text_string_to_metric_families(text):
            if fam.name == "vllm:request_success":
                for smp in fam.samples:
                    if smp.name.endswith("_total"):
                        k = smp.labels.get("finished_reason", "")
                        out[k] = out.get(k, 0) + smp.value
    return out


def _metric(url: str, name: str) -> float:
    return parse_metrics(httpx.get(url + "/metrics", timeout=30, trust_env=False).text, [name]).first([name])


def test_two_vllm_servers_behind_the_gateway(tmp_path, vllm_server, second_vllm):
    from conftest import VLLM_TEST_SERVER

    seqs = VLLM_TEST_SERVER["max_num_seqs"]
    engines = [vllm_server.url, second_vllm.url]
    sc = tmp_path / "gw.yaml"
    sc.write_text(yaml.safe_dump({
        "name": "gw-vllm", "workload": {"arrival": "poisson:1", "prompt": "fixed:8", "output": "fixed:8"},
        "deployment": {"capacity_tokens": 65536, "step_time": "0.02", "max_num_seqs": seqs,
                       "block_size": VLLM_TEST_SERVER["block_size"],
                       "pools": [{"name": "p", "replicas": 2, "router": "central"}],
                       "gateway": {"max_queue_depth": 1}},
        "run": {"duration_s": 10}}))
    out = tmp_path / "run"
    model = vllm_server.model
    with GatewayProcess("--scenario", str(sc), "--backend", "p=" + ",".join(engines), "--out", str(out),
                        "--scrape-interval", "0.2") as gw:
        # disconnects free the engines: 2 x seqs long streamed answers (every slot of both engines),
        # each cut as soon as its first chunk came (the tiny model decodes 1,000 tokens in a second or
        # two and vLLM's CPU server streams in bursts: a cut that waited for the others' first chunks,
        # or for a scrape, found them all finished in CI)
        n_cut = 2 * seqs
        body = {"model": model, "prompt": [11, 12, 13, 14], "max_tokens": 1000, "ignore_eos": True, "stream": True}

        def cut(_):
            with httpx.Client(timeout=120, trust_env=False) as c, \
                    c.stream("POST", gw.url + "/v1/completions", json=body) as r:
                return r.status_code, next(r.iter_lines())  # leaving the block closes the connection

        before = _finished(engines)
        with cf.ThreadPoolExecutor(n_cut) as ex:
            cuts = list(ex.map(cut, range(n_cut)))
        assert all(code == 200 and first.startswith("data: ") for code, first in cuts)
        end = time.monotonic() + 30
        while sum(_metric(u, "vllm:num_requests_running") for u in engines) > 0 and time.monotonic() < end:
            time.sleep(0.2)
        assert sum(_metric(u, "vllm:num_requests_running") for u in engines) == 0
        after = _finished(engines)
        ended = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        # the engines ran to their end only the requests whose generation ended before their cut
        # reached them; the others were aborted (vLLM counts no success for them) and nothing is
        # decoding any more
        done = int(ended.get("length", 0) + ended.get("stop", 0))
        aborted = n_cut - done
        assert aborted >= 1, ended
        made = sum(_metric(u, "vllm:generation_tokens_total") for u in engines)
        time.sleep(1.0)
        assert sum(_metric(u, "vllm:generation_tokens_total") for u in engines) == made
        # the bound: 2 x seqs in service, 2 held, the rest shed at once (sent together from one loop)
        n = 2 * seqs + 2 + 14
        short = {"model": model, "prompt": [21, 22, 23, 24, 25], "max_tokens": 1000, "ignore_eos": True}

        async def burst():
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
            async with httpx.AsyncClient(timeout=600, trust_env=False, limits=limits) as c:
                rs = await asyncio.gather(*(c.post(gw.url + "/v1/completions", json=short) for _ in range(n)))
            return [(r.status_code, r.headers.get("retry-after")) for r in rs]

        res = asyncio.run(burst())
        metrics = httpx.get(gw.url + "/metrics", timeout=30, trust_env=False).text
    codes = [c for c, _ in res]
    assert set(codes) <= {200, 503}
    rec = read_records(out).to_dict()
    burst_rows = rec["prompt_tokens"] == 5
    last = rec["arrival_s"][burst_rows].max()
    early = int((burst_rows & (rec["status"] == "ok") & (rec["finish_s"] < last)).sum())  # slots freed meanwhile
    assert 2 * seqs + 2 <= codes.count(200) <= 2 * seqs + 2 + early, (codes.count(200), early)
    assert codes.count(503) >= 1
    assert all(ra is not None and int(ra) >= 1 for c, ra in res if c == 503)
    assert "llmqueue_gateway_cancellations_total" in metrics
    # each abort came from a cut the gateway counted; it counts more where the engine had ended the
    # generation before the client went away but its stream had not yet reached the gateway
    assert aborted <= list(rec["status"]).count("cancelled") <= n_cut
    assert list(rec["status"]).count("rejected") == codes.count(503)
    # the scrapes reached the policies: the numbers they read of each engine (the gateway's
    # /metrics shows them) carry vLLM's KV blocks and an age; each admission read the queues' sum
    blocks = {}
    for u in engines:
        cc = cache_config(parse_metrics(httpx.get(u + "/metrics", timeout=30, trust_env=False).text,
                                        ["vllm:cache_config_info"]))
        blocks[u] = int(cc.num_gpu_blocks)
    from prometheus_client.parser import text_string_to_metric_families

    seen = {f.name: {s.labels["replica"]: s.value for s in f.samples}
            for f in text_string_to_metric_families(metrics) if f.name.startswith("llmqueue_gateway_replica_")}
    assert sorted(seen["llmqueue_gateway_replica_kv_blocks"].values()) == sorted(blocks.values())
    ages = list(seen["llmqueue_gateway_replica_load_age_seconds"].values())
    assert all(0 < a < 60 for a in ages) and min(ages) < 1.0  # vLLM's CPU server answers /metrics late when busy
    admits = [json.loads(ln) for ln in (out / "decisions.jsonl").read_text().splitlines()]
    admits = [d for d in admits if d["kind"] == "admit"]
    assert admits and all(isinstance(d["views"]["p"]["replicas_waiting"], int) for d in admits)
