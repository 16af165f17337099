"""The open-loop benchmark client against the stub server (loopback only).

Truth comes from the request stream itself (intended times, lengths), from the stub's own
counters (``/stats``: requests seen, rejected, malformed), and from recomputing vLLM bench
serve's definitions from the per-chunk times written beside the records.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmqueue.bench.checks import arrival_check, ks_2samp
from llmqueue.bench.client import BenchConnectError, run_bench
from llmqueue.bench.http import classify_http, endpoint_url
from llmqueue.bench.prompts import DEFAULT_TOKEN_RANGE, Prompts, token_id_range
from llmqueue.bench.stub_server import StubServer
from llmqueue.errors import InputError as InputErrorType
from llmqueue.records import REQUEST_COLUMNS, is_complete, read_records
from llmqueue.workload import Workload
from llmqueue.workload.client import ClientBehavior, RetryPolicy
from llmqueue.workload.generate import RequestArrays


@pytest.fixture(scope="module")
def stub():
    with StubServer(token_delay_s=0.002, cached_tokens=3) as s:
        yield s


def _reqs(rate=100, n=60, prompt="uniform:5:60", output="uniform:1:12", seed=1):
    return Workload(f"poisson:{rate}", prompt=prompt, output=output).generate(seed=seed, n=n)


def _tokens(out_dir):
    return pq.read_table(out_dir / "tokens.parquet").to_pydict()


# -- records ----------------------------------------------------------------------------------

def test_records_schema_times_and_exact_lengths(stub, tmp_path):
    reqs = _reqs()
    before = stub.stats()
    res = run_bench(stub.url, stub.model, reqs, out_dir=tmp_path, seed=3)
    after = stub.stats()
    assert res.error is None
    r = res.records
    assert list(r.columns) == list(REQUEST_COLUMNS)
    # the file on disk holds the same rows (it keeps completion order; the result is sorted)
    disk = read_records(tmp_path)
    assert is_complete(tmp_path / "requests.parquet")
    o = np.lexsort((disk["attempt"], disk["request_id"]))
    for c in REQUEST_COLUMNS:
        a, b = disk[c][o], r[c]
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), c
    # one attempt per request, intended times exactly the workload's, sent no earlier than intended
    assert np.array_equal(r["request_id"], reqs.request_id)
    assert np.array_equal(r["arrival_s"], reqs.arrival_s)
    assert (r["attempt"] == 1).all() and (r["status"] == "ok").all()
    assert (r["dispatched_s"] >= r["arrival_s"]).all()
    assert (r["first_token_s"] > r["dispatched_s"]).all()
    assert (r["finish_s"] >= r["first_token_s"]).all()
    assert np.isnan(r["first_scheduled_s"]).all()
    assert (r["preemptions"] == 0).all() and (r["replica"] == 0).all()
    # exact lengths: token-id prompts and max_tokens + ignore_eos, as the server counted them
    assert np.array_equal(r["prompt_tokens"], reqs.prompt_tokens)
    assert np.array_equal(r["output_tokens"], reqs.output_tokens)
    assert after["prompt_tokens"] - before["prompt_tokens"] == int(reqs.prompt_tokens.sum())
    assert after["requests"] - before["requests"] == len(reqs)
    # usage.prompt_tokens_details.cached_tokens
    assert np.array_equal(r["cached_prompt_tokens"], np.minimum(3, reqs.prompt_tokens))
    # per-chunk times: one row per token, first = first_token_s, last = finish_s
    t = _tokens(tmp_path)
    rid = np.asarray(t["request_id"])
    assert np.array_equal(np.bincount(rid, minlength=len(reqs)), reqs.output_tokens)
    ts = np.asarray(t["t_s"])
    for i in range(len(reqs)):
        mine = ts[rid == i]
        assert mine[0] == r["first_token_s"][i] and mine[-1] == r["finish_s"][i]
        assert (np.diff(mine) >= 0).all()
    # the intended stream is kept for validation
    wl = pq.read_table(tmp_path / "workload.parquet").to_pydict()
    assert np.array_equal(wl["arrival_s"], reqs.arrival_s)
    assert json.loads((tmp_path / "summary.json").read_text())["completed"] == len(reqs)


def test_latencies_as_vllm_defines_them(stub, tmp_path):
    reqs = _reqs(n=50, output="uniform:2:12", seed=2)
    res = run_bench(stub.url, stub.model, reqs, out_dir=tmp_path)
    r, s = res.records, res.summary
    t = _tokens(tmp_path)
    rid, ts = np.asarray(t["request_id"]), np.asarray(t["t_s"])
    # vllm/benchmarks/serve.py: ttft = first chunk - send; latency = last chunk - send;
    # tpot = (latency - ttft) / (output_len - 1); itl = gaps between consecutive chunks
    sent = r["dispatched_s"]
    ttft = r["first_token_s"] - sent
    latency = r["finish_s"] - sent
    tpot = (latency - ttft) / (r["output_tokens"] - 1)
    itl = np.concatenate([np.diff(ts[rid == i]) for i in range(len(reqs))])
    # the vLLM-named keys measure from the actual send, as vLLM's do
    assert s["mean_ttft_ms"] == pytest.approx(1e3 * ttft.mean(), rel=1e-9)
    assert s["p99_ttft_ms"] == pytest.approx(1e3 * np.percentile(ttft, 99), rel=1e-9)
    assert s["median_ttft_ms"] == pytest.approx(1e3 * np.median(ttft), rel=1e-9)
    assert s["std_ttft_ms"] == pytest.approx(1e3 * ttft.std(), rel=1e-9)
    assert s["mean_e2el_ms"] == pytest.approx(1e3 * latency.mean(), rel=1e-9)
    assert s["p99_e2el_ms"] == pytest.approx(1e3 * np.percentile(latency, 99), rel=1e-9)
    assert s["mean_tpot_ms"] == pytest.approx(1e3 * tpot.mean(), rel=1e-9)
    assert s["mean_itl_ms"] == pytest.approx(1e3 * itl.mean(), rel=1e-9)
    assert s["p99_itl_ms"] == pytest.approx(1e3 * np.percentile(itl, 99), rel=1e-9)
    assert s["itl_samples"] == len(itl) == int((r["output_tokens"] - 1).sum())
    # from the intended send time: a distinct name (>= from the actual send)
    fi = s["from_intended"]
    assert fi["mean_ttft_ms"] == pytest.approx(1e3 * (r["first_token_s"] - r["arrival_s"]).mean(), rel=1e-9)
    assert fi["p99_e2el_ms"] == pytest.approx(1e3 * np.percentile(r["finish_s"] - r["arrival_s"], 99), rel=1e-9)
    assert fi["mean_ttft_ms"] >= s["mean_ttft_ms"]
    assert "from_send" not in s
    assert s["completed"] == len(reqs) and s["failed"] == 0
    assert s["total_output_tokens"] == int(reqs.output_tokens.sum())
    assert s["bench"]["load"] == "open-loop" and s["max_concurrency"] is None


def test_chat_endpoint_records_the_servers_usage(stub, tmp_path):
    reqs = _reqs(n=20, seed=4)
    res = run_bench(stub.url, stub.model, reqs, endpoint="chat")
    r = res.records
    assert (r["status"] == "ok").all()
    # the role-only chunk that opens a vLLM chat stream is not a token
    assert np.array_equal(np.bincount(res.tokens["request_id"], minlength=len(reqs)), reqs.output_tokens)
    # the stub counts one token per word of the messages: the usage count is what is recorded
    assert np.array_equal(r["prompt_tokens"], reqs.prompt_tokens)
    assert np.array_equal(r["output_tokens"], reqs.output_tokens)
    assert res.summary["bench"]["endpoint"] == "chat"


def test_prompts_are_seeded_exact_and_in_range():
    reqs = _reqs(n=30)
    a = Prompts(reqs, model="m", endpoint="completions", seed=7, token_range=(100, 500), exact_output=True,
                 extra_body={"temperature": 0})
    b = Prompts(reqs, model="m", endpoint="completions", seed=7, token_range=(100, 500), exact_output=True,
                 extra_body={"temperature": 0})
    c = Prompts(reqs, model="m", endpoint="completions", seed=8, token_range=(100, 500), exact_output=True,
                 extra_body=None)
    for i in range(len(reqs)):
        d = json.loads(a.body(i))
        assert a.body(i) == b.body(i)
        assert len(d["prompt"]) == reqs.prompt_tokens[i]
        assert all(100 <= x < 500 for x in d["prompt"])
        assert d["max_tokens"] == d["min_tokens"] == reqs.output_tokens[i]
        assert d["ignore_eos"] is True and d["stream"] is True
        assert d["stream_options"] == {"include_usage": True} and d["temperature"] == 0
    assert any(a.body(i) != c.body(i) for i in range(len(reqs)))
    chat = json.loads(Prompts(reqs, model="m", endpoint="chat", seed=7, token_range=(100, 500),
                               exact_output=False, extra_body=None).body(0))
    assert len(chat["messages"][0]["content"].split()) == reqs.prompt_tokens[0]
    assert chat["max_completion_tokens"] == reqs.output_tokens[0] and "ignore_eos" not in chat
    assert token_id_range() == DEFAULT_TOKEN_RANGE
    assert token_id_range(8192) == (409, 7783)


def test_prompts_from_prefix_hashes_share_exactly_the_shared_blocks():
    """A hash stands for the same H ids everywhere; prompts are cut to their exact lengths."""
    H = 16
    reqs = RequestArrays(np.arange(6), np.arange(6) * 0.1, [3 * H - 5, 3 * H, 2 * H, 4 * H + 3, 10, 2 * H],
                         [1, 2, 3, 4, 5, 6])
    hashes = [[1, 2, 3], [1, 2, 9], [7, 2], [1, 2], None, []]

    def make(seed=7, endpoint="completions", hash_ids=hashes):
        return Prompts(reqs, model="m", endpoint=endpoint, seed=seed, token_range=(100, 500), exact_output=True,
                        extra_body=None, hash_ids=hash_ids, hash_block_tokens=H)

    p = make()
    ids = [json.loads(p.body(i))["prompt"] for i in range(len(reqs))]
    assert [len(x) for x in ids] == list(reqs.prompt_tokens)
    assert all(100 <= t < 500 for x in ids for t in x)
    assert ids[0][:2 * H] == ids[1][:2 * H]                   # shared hashes 1, 2
    assert ids[0][2 * H:] != ids[1][2 * H:3 * H - 5]          # hash 3 and hash 9 differ
    assert ids[2][H:2 * H] == ids[0][H:2 * H]                 # hash 2 means the same ids in another place
    assert ids[2][:H] != ids[0][:H]
    assert ids[3][:2 * H] == ids[1][:2 * H]                   # two hashes for 4H + 3 tokens: the rest is
    q = make()
    assert all(p.body(i) == q.body(i) for i in range(len(reqs)))
    r = make(seed=8)
    assert json.loads(r.body(0))["prompt"] != ids[0]
    # no hashes (None or empty): the request's own pool slice, as without hash_ids
    plain = make(hash_ids=None)
    assert p.body(4) == plain.body(4) and p.body(5) == plain.body(5)
    assert ids[3][2 * H:] == json.loads(plain.body(3))["prompt"][:2 * H + 3]   # the request's own ids
    words = [json.loads(make(endpoint="chat").body(i))["messages"][0]["content"].split() for i in range(2)]
    assert words[0][:2 * H] == words[1][:2 * H] and words[0][2 * H:] != words[1][2 * H:3 * H - 5]
    with pytest.raises(InputErrorType, match="hash_ids"):
        make(hash_ids=hashes[:3])
    with pytest.raises(InputErrorType, match="hash_block_tokens"):
        Prompts(reqs, model="m", endpoint="completions", seed=7, token_range=(100, 500), exact_output=True,
                 extra_body=None, hash_ids=hashes, hash_block_tokens=0)


# -- statuses ---------------------------------------------------------------------------------

def test_rejections_and_malformed_chunks_are_statuses(tmp_path):
    reqs = _reqs(rate=200, n=80, seed=5)
    with StubServer(reject_fraction=0.25, reject_status=429, malformed_fraction=0.25, seed=11) as s:
        res = run_bench(s.url, s.model, reqs, out_dir=tmp_path)
        st = s.stats()
    r = res.records
    counts = {k: int((r["status"] == k).sum()) for k in ("ok", "rejected", "error")}
    assert counts["rejected"] == st["rejected"] > 0
    assert counts["error"] == st["malformed"] > 0
    assert counts["ok"] == len(reqs) - st["rejected"] - st["malformed"]
    assert res.summary["errors"]["HTTP 429"] == st["rejected"]
    assert res.summary["errors"]["malformed JSON chunk"] == st["malformed"]
    assert res.error is None and len(read_records(tmp_path)) == len(reqs)
    # a failed attempt keeps its times: a rejection has no first token, a broken stream had one
    rej = r["status"] == "rejected"
    assert np.isnan(r["first_token_s"][rej]).all() and np.isfinite(r["finish_s"][rej]).all()
    assert np.isfinite(r["first_token_s"][r["status"] == "error"]).all()
    assert res.summary["failed"] == counts["rejected"] + counts["error"]


def test_503_and_too_long_prompts_are_rejected():
    reqs = RequestArrays(np.arange(6), np.linspace(0, 0.05, 6), [10, 10, 10, 500, 10, 500], [2] * 6)
    with StubServer(reject_fraction=0.5, reject_status=503, max_model_len=100, seed=2) as s:
        res = run_bench(s.url, s.model, reqs)
        st = s.stats()
    r = res.records
    assert (r["status"][[3, 5]] == "rejected").all()  # vLLM's 400 "maximum context length"
    assert int((r["status"] == "rejected").sum()) == st["rejected"] + st["too_long"]
    assert set(r["status"]) <= {"ok", "rejected"}


def test_classify_http():
    assert classify_http(429) == classify_http(503) == "rejected"
    assert classify_http(400, b'{"message": "This model\'s maximum context length is 2048 tokens."}') == "rejected"
    assert classify_http(400, b'{"message": "unknown field"}') == "error"
    assert classify_http(404) == classify_http(500) == "error"


def test_client_timeouts(tmp_path):
    reqs = RequestArrays(np.arange(4), [0.0, 0.01, 0.02, 0.03], [5] * 4, [3] * 4)
    with StubServer(first_token_delay_s=0.3, token_delay_s=0.001) as s:
        res = run_bench(s.url, s.model, reqs, timeout_s=0.08, out_dir=tmp_path)
        ttft = run_bench(s.url, s.model, reqs, timeout_s=5, ttft_timeout_s=0.05)
    r = res.records
    assert (r["status"] == "timeout").all()
    assert np.array_equal(r["finish_s"], r["arrival_s"] + 0.08)  # the deadline, from the intended time
    assert res.summary["errors"]["client timeout"] == 4
    t = ttft.records
    assert (t["status"] == "timeout").all() and np.array_equal(t["finish_s"], t["arrival_s"] + 0.05)
    # the deadlines are recorded, for a replay to apply (validate)
    assert res.summary["bench"]["timeout_s"] == {"default": 0.08} and res.summary["bench"]["ttft_timeout_s"] == {}
    assert ttft.summary["bench"]["ttft_timeout_s"] == {"default": 0.05}


# -- the run itself -------------------------------------------------------------------------------

def test_server_killed_mid_run_keeps_every_finished_request(tmp_path):
    reqs = _reqs(rate=200, n=200, output="fixed:3", seed=6)
    with StubServer(die_after=60, token_delay_s=0.001) as s:
        res = run_bench(s.url, s.model, reqs, out_dir=tmp_path, abort_grace_s=1.0)
    assert res.error is not None and "stopped accepting connections" in res.error
    disk = read_records(tmp_path)
    assert is_complete(tmp_path / "requests.parquet") is False  # marked as cut short, still readable
    assert len(disk) == len(res.records)
    ok = res.records["status"] == "ok"
    assert 40 <= ok.sum() <= 60  # the stub answered 60 at most before it died
    s = res.summary
    assert s["completed"] == ok.sum() and s["failed"] == len(disk) - ok.sum() >= 3
    assert s["not_sent"] == len(reqs) - len(disk) > 0
    assert set(np.unique(disk["status"])) <= {"ok", "error", "unfinished"}
    assert json.loads((tmp_path / "summary.json").read_text())["bench"]["stopped_early"] == res.error


def test_connection_refused_at_start():
    with StubServer() as s:
        url = s.url
    with pytest.raises(BenchConnectError, match="connection refused"):
        run_bench(url, "m", _reqs(n=3))


def test_concurrency_cap_is_closed_loop():
    reqs = _reqs(rate=400, n=24, output="fixed:4", seed=7)
    with StubServer(token_delay_s=0.01) as s:
        res = run_bench(s.url, s.model, reqs, concurrency=2)
    r, summ = res.records, res.summary
    assert summ["bench"]["closed_loop"] is True and summ["max_concurrency"] == 2
    assert summ["bench"]["load"].startswith("closed-loop")
    # never more than two attempts between dispatch and finish at once
    ev = sorted([(t, 1) for t in r["dispatched_s"]] + [(t, -1) for t in r["finish_s"]], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in ev:
        level += d
        peak = max(peak, level)
    assert peak <= 2
    # requests waited in the client: latency from the intended time exceeds the one from the send
    assert summ["client"]["client_queue_ms"]["max"] > 0
    assert summ["from_intended"]["mean_e2el_ms"] > summ["mean_e2el_ms"]
    # the vLLM-named keys count from the actual send (after the slot was free), as vLLM's do
    ok = r["status"] == "ok"
    assert summ["mean_e2el_ms"] == pytest.approx(1e3 * (r["finish_s"] - r["dispatched_s"])[ok].mean(), rel=1e-9)


def test_retries_are_recorded_as_attempts():
    reqs = _reqs(rate=200, n=40, output="fixed:2", seed=8)
    behavior = ClientBehavior(retry=RetryPolicy(max_attempts=3, backoff_s=0.01, multiplier=2, jitter=0.5))
    with StubServer(reject_fraction=0.4, seed=3) as s:
        res = run_bench(s.url, s.model, reqs, retry=behavior, seed=9)
        st = s.stats()
    r = res.records
    assert len(r) == st["requests"] > len(reqs)
    decide = behavior.bind(9).decide
    for rid in range(len(reqs)):
        m = r["request_id"] == rid
        att = r["attempt"][m]
        assert np.array_equal(att, np.arange(1, m.sum() + 1))
        stat, arr, fin = r["status"][m], r["arrival_s"][m], r["finish_s"][m]
        assert arr[0] == reqs.arrival_s[rid]
        for k in range(len(att) - 1):  # each retry sent when decide() said, after a rejection
            assert stat[k] == "rejected"
            assert arr[k + 1] == decide(rid, k + 1, "rejected", fin[k])
        assert stat[-1] == "ok" or len(att) == 3
    assert (r["dispatched_s"] >= r["arrival_s"]).all()
    assert res.summary["attempts"] == len(r)


def test_arrival_check_rule():
    rng = np.random.default_rng(0)
    a = np.cumsum(rng.exponential(0.01, 2000))
    good = arrival_check(a, a + rng.uniform(0, 3e-4, len(a)))
    assert good["arrivals_ok"] and good["ks_gaps"]["pvalue"] > 0.01
    # a client that sends every request 20% too slowly drifts: the gaps differ, lags grow
    slow = arrival_check(a, a * 1.2)
    assert not slow["arrivals_ok"] and slow["ks_gaps"]["pvalue"] < 1e-4 and slow["lag_trend_ms_per_s"] > 100
    # deterministic arrivals with sub-millisecond jitter: no KS test (it would reject any jitter);
    # the gaps against their constant value, within the tolerance
    d = np.arange(2000) * 0.01
    det = arrival_check(d, d + rng.uniform(0, 2e-4, len(d)))
    assert det["ks_gaps"] is None and det["gap_check"]["p99_gap_error_ms"] < 2 and det["arrivals_ok"]


def test_ks_2samp_matches_scipy():
    # reference values: scipy.stats.ks_2samp(x, y, method="asymp") on these draws (scipy 1.x);
    # hard-coded so that the test does not import scipy.stats (seconds on a busy machine)
    ref = [(0.11666666666666659, 0.8151812621368473), (0.09625, 0.0018504290977127123),
           (0.036333333333333384, 0.03717948009813776)]
    rng = np.random.default_rng(3)
    for (n, m, shift), (d_ref, p_ref) in zip(((60, 50, 0.0), (800, 700, 0.1), (3000, 3000, 0.02)), ref):
        x, y = rng.exponential(1, n), rng.exponential(1, m) + shift
        d, p = ks_2samp(x, y)
        assert d == pytest.approx(d_ref, abs=1e-12)
        assert p == pytest.approx(p_ref, rel=0.1)


def test_realized_arrivals_follow_the_intended_ones(stub):
    # The realized send times keep the intended gaps' distribution (KS test) and do not drift.
    # The machine is shared: a run whose tail lag is the OS scheduler's may fail the KS test,
    # so up to three runs are made and one must pass.
    reqs = _reqs(rate=100, n=150, output="fixed:1", seed=10)
    pvalues = []
    for _ in range(3):
        res = run_bench(stub.url, stub.model, reqs)
        c = res.summary["client"]
        ks = c["ks_gaps"]
        assert ks["mean_gap_realized_ms"] == pytest.approx(ks["mean_gap_intended_ms"], rel=0.05)
        assert c["lag_ms"]["p50"] < 5
        pvalues.append(ks["pvalue"])
        if ks["pvalue"] > 0.01:
            break
    assert max(pvalues) > 0.01, pvalues
    assert res.summary["request_rate"] == pytest.approx(len(reqs) / reqs.arrival_s[-1])


def test_input_errors():
    from llmqueue.errors import InputError

    with pytest.raises(InputError, match="endpoint"):
        endpoint_url("http://127.0.0.1:1", "embeddings")
    with pytest.raises(InputError, match="url"):
        endpoint_url("ftp://x", "completions")
    assert endpoint_url("http://h:1", "completions") == "http://h:1/v1/completions"
    assert endpoint_url("http://h:1/v1/", "chat") == "http://h:1/v1/chat/completions"
    assert endpoint_url("http://h:1/v1/chat/completions", "completions") == "http://h:1/v1/chat/completions"
    with pytest.raises(InputError, match="concurrency"):
        run_bench("http://127.0.0.1:1", "m", _reqs(n=2), concurrency=0)
    with pytest.raises(InputError, match="vocab_size"):
        token_id_range(3)
    assert math.isfinite(token_id_range(50)[1])


def test_metrics_url_samples_a_time_series(stub, tmp_path):
    pytest.importorskip("llmqueue.bench.prom")
    from llmqueue.records import read_timeseries

    res = run_bench(stub.url, stub.model, _reqs(rate=100, n=60, seed=12), out_dir=tmp_path, metrics_url=stub.url,
                    metrics_interval_s=0.05)
    ts = read_timeseries(tmp_path)
    assert len(ts) >= 2 and res.summary["mean_num_running"] is not None
    # on the run's clock; the first row is the baseline scraped just before the first send
    assert -1.0 < ts["t_s"].min() <= 0 < ts["t_s"][1]
    # every sampled column (counters too) is kept beside the records, and the counters' growth
    # over the run is in the summary: the stub counts what it served, so it can be checked
    import pyarrow.parquet as pq

    m = pq.read_table(tmp_path / "metrics.parquet")
    assert {"t_s", "num_running", "preemptions", "generation_tokens", "requests_finished"} <= set(m.column_names)
    assert len(m) == len(ts)
    c = res.summary["server_counters"]
    assert c["preemptions"] is None  # the stub has no such counter: unknown, not zero
    gen = m["generation_tokens"].to_numpy()
    assert c["generation_tokens"] == gen[-1] - gen[0] > 0
    assert c["requests_finished"] == 60 and (res.records["status"] == "ok").all()
    assert c["prompt_tokens"] == res.records["prompt_tokens"].sum()


def test_server_counters_cover_every_request_when_the_sampler_thread_stalls(stub, tmp_path, monkeypatch):
    """The counters' growth is measured from a scrape taken before the first send, not from the
    polling thread's first scrape: a thread that starts late (on a busy 2-core machine it stalled
    for seconds beside a CPU vLLM engine) must not lose the first requests from the counts."""
    pytest.importorskip("llmqueue.bench.prom")
    from llmqueue.bench.prom import MetricsSampler

    run = MetricsSampler._run

    def late_run(self):
        time.sleep(0.4)
        run(self)

    monkeypatch.setattr(MetricsSampler, "_run", late_run)
    reqs = _reqs(rate=200, n=40, seed=4)
    assert reqs.arrival_s[5] < 0.4  # requests that the stalled thread's first scrape would miss
    res = run_bench(stub.url, stub.model, reqs, metrics_url=stub.url, metrics_interval_s=0.05)
    assert (res.records["status"] == "ok").all()
    c = res.summary["server_counters"]
    assert c["requests_finished"] == 40
    assert c["prompt_tokens"] == reqs.prompt_tokens.sum()
    assert c["generation_tokens"] == res.records["output_tokens"].sum()


def _sse(events):
    return "".join(f"data: {e}\n\n" for e in events).encode()


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_exchange_parses_any_split_of_the_bytes(framing, step):
    """HTTP framing and server-sent events, fed in pieces of any size (as TCP may deliver them)."""
    import asyncio

    from llmqueue.bench.attempt import Attempt

    tok = '{"id":"c","choices":[{"index":0,"text":" a","finish_reason":null}],"usage":null}'
    usage = '{"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,' \
            '"prompt_tokens_details":{"cached_tokens":2}}}'
    body = b": ping\n\n" + _sse([tok, tok]) + b"data: " + tok.encode() + b"\r\n\r\n" + _sse([usage, "[DONE]"])
    if framing == "chunked":
        parts = [body[i:i + 50] for i in range(0, len(body), 50)]
        payload = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    elif framing == "length":
        payload = body
        head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body)
    else:
        payload = body
        head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    raw = b"HTTP/1.1 100 Continue\r\n\r\n" + head + payload

    loop = asyncio.new_event_loop()
    try:
        ex = Attempt(0.0, 5)
        ex.fut = loop.create_future()
        for i in range(0, len(raw), step):
            ex.feed(raw[i:i + step])
        if framing == "close":
            assert not ex.fut.done()
            ex.lost(None)
        assert ex.fut.done() and ex.fut.exception() is None
        assert ex.outcome() == ("ok", None)
        assert len(ex.toks) == 3 and ex.ot == 3 and ex.pt == 7 and ex.cached == 2
        assert ex.keep_alive == (framing != "close")
        # a body cut short is an error, not ok
        cut = Attempt(0.0, 5)
        cut.fut = loop.create_future()
        cut.feed(raw[: len(raw) - 30])
        cut.lost(ConnectionResetError())
        assert cut.fut.done() and "cut short" in str(cut.fut.exception())
    finally:
        loop.close()


def test_exchange_errors():
    import asyncio

    from llmqueue.bench.attempt import Attempt

    loop = asyncio.new_event_loop()
    try:
        def run(raw):
            ex = Attempt(0.0, 5)
            ex.fut = loop.create_future()
            ex.feed(raw)
            return ex
        bad = run(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\ndata: {not json}\n\n..")
        assert "malformed JSON" in str(bad.fut.exception())
        err = run(b"HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n"
                  + b'data: {"error": {"message": "engine dead", "code": 500}}\n\n'.ljust(64))
        assert "error event in stream: engine dead" in str(err.fut.exception())
        empty = run(b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\ndata: [DONE]\n\n")
        assert empty.outcome() == ("error", "no token in the stream")
        rej = run(b'HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}')
        assert rej.outcome() == ("rejected", "HTTP 429")
        junk = run(b"SSH-2.0-OpenSSH\r\n\r\n")
        assert "not an HTTP response" in str(junk.fut.exception())
    finally:
        loop.close()


@pytest.mark.vllm
def test_against_a_real_vllm_server(vllm_server, tmp_path):
    """vLLM's own OpenAI server (CPU build, tiny model): exact lengths, chat usage, 400 -> rejected."""
    from tests.conftest import VLLM_TEST_MODEL, VLLM_TEST_SERVER

    vocab = VLLM_TEST_MODEL["vocab_size"]
    reqs = Workload("poisson:4", prompt="uniform:8:200", output="uniform:2:16").generate(seed=1, n=8)
    res = run_bench(vllm_server.url, vllm_server.model, reqs, vocab_size=vocab, out_dir=tmp_path, timeout_s=120,
                    metrics_url=vllm_server.url, metrics_interval_s=0.2)
    r = res.records
    assert res.error is None and (r["status"] == "ok").all(), res.summary["errors"]
    # the server's own counters over the run (scraped before the first send and after the last
    # answer): it generated what the client asked for, and it reports its preemptions
    c = res.summary["server_counters"]
    assert 0.95 * reqs.output_tokens.sum() <= c["generation_tokens"] <= reqs.output_tokens.sum()
    assert c["preemptions"] is not None and c["preemptions"] >= 0
    assert c["requests_finished"] == len(reqs)
    assert (tmp_path / "metrics.parquet").exists()
    # the KV cache's use, over the capacity the server reported (cache_config_info)
    assert 0 < res.summary["kv_utilization"] <= 1
    assert np.array_equal(r["prompt_tokens"], reqs.prompt_tokens)
    assert np.array_equal(r["output_tokens"], reqs.output_tokens)
    # one chunk per token, except where vLLM sent several tokens in one chunk
    chunks = np.bincount(np.asarray(_tokens(tmp_path)["request_id"]), minlength=len(reqs))
    assert (chunks >= 1).all() and (chunks <= reqs.output_tokens).all()
    assert chunks.sum() >= 0.8 * reqs.output_tokens.sum()
    chat = run_bench(vllm_server.url, vllm_server.model, reqs, endpoint="chat", timeout_s=120)
    c = chat.records
    assert (c["status"] == "ok").all(), chat.summary["errors"]
    assert np.array_equal(c["output_tokens"], reqs.output_tokens)
    assert (c["prompt_tokens"] > 0).all()  # the server's count, chat template included
    chunks = np.bincount(chat.tokens["request_id"], minlength=len(reqs))  # the role-only chunk is skipped
    assert (chunks >= 1).all() and (chunks <= reqs.output_tokens).all()
    too_long = RequestArrays([0], [0.0], [VLLM_TEST_SERVER["max_model_len"] + 10], [4])
    rej = run_bench(vllm_server.url, vllm_server.model, too_long, vocab_size=vocab)
    assert rej.records["status"][0] == "rejected"


def test_stub_endpoints(stub):
    import urllib.error
    import urllib.request

    def get(path):
        with urllib.request.urlopen(stub.url + path, timeout=10) as r:
            return r.status, r.read().decode()

    assert get("/health")[0] == 200
    assert json.loads(get("/v1/models")[1])["data"][0]["id"] == stub.model
    text = get("/metrics")[1]
    assert "vllm:num_requests_running{" in text and "vllm:generation_tokens_total{" in text
    req = urllib.request.Request(stub.url + "/v1/completions", method="POST",
                                 data=json.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4}).encode())
    with urllib.request.urlopen(req, timeout=10) as r:
        body = json.loads(r.read())
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 4
    with pytest.raises(urllib.error.HTTPError) as e:
        get("/v1/nothing")
    assert e.value.code == 404
    with pytest.raises(InputErrorType, match="loopback"):
        StubServer(host="10.0.0.1")


def test_slow_writes_never_overlap_nor_repeat(stub, tmp_path, monkeypatch):
    """A flush cancelled while its write runs (the run ending) must not let a second write touch
    the Parquet writer at the same time (pyarrow crashed the process: CI exit 139) nor write the
    same rows twice."""
    import threading
    import time

    from llmqueue.bench import recorder as mod

    real = mod.Recorder._write_batch
    state = {"active": 0, "overlap": 0, "calls": 0}
    lock = threading.Lock()

    def slow(self, a, b, t):
        with lock:
            state["active"] += 1
            state["calls"] += 1
            state["overlap"] = max(state["overlap"], state["active"])
        try:
            time.sleep(0.15)  # longer than the flush interval and than the run's tail
            real(self, a, b, t)
        finally:
            with lock:
                state["active"] -= 1

    monkeypatch.setattr(mod.Recorder, "_write_batch", slow)
    reqs = _reqs(rate=400, n=80, output="fixed:2", seed=11)
    res = run_bench(stub.url, stub.model, reqs, out_dir=tmp_path, flush_interval_s=0.02)
    assert res.error is None and state["calls"] >= 2
    assert state["overlap"] == 1
    disk = read_records(tmp_path)
    assert len(disk) == len(reqs) == len(np.unique(disk["request_id"]))
    tok = _tokens(tmp_path)
    assert len(tok["t_s"]) == int(res.records["output_tokens"].sum())


@pytest.mark.parametrize("endpoint, line_end, ids", [("completions", "cr", True), ("chat", "crlf", True),
                                                     ("completions", "lf", True)])
def test_spec_valid_event_streams_from_a_server(endpoint, line_end, ids):
    """A server whose event stream is valid but not vLLM's (bare-CR or CRLF line ends, an ``id:``
    line after each ``data:`` line): every request is ok, with exactly its tokens."""
    reqs = _reqs(rate=200, n=30, seed=13)
    with StubServer(token_delay_s=0.001, sse_line_end=line_end, sse_ids=ids) as s:
        res = run_bench(s.url, s.model, reqs, endpoint=endpoint)
        st = s.stats()
    r = res.records
    assert (r["status"] == "ok").all(), res.summary["errors"]
    assert st["completed"] == len(reqs)
    assert np.array_equal(r["output_tokens"], reqs.output_tokens)
    assert np.array_equal(np.bincount(res.tokens["request_id"], minlength=len(reqs)), reqs.output_tokens)


def test_usage_counts_are_checked():
    """A usage count must be an integer in [0, 2**63) (the records' int64), cached tokens no more
    than the prompt: anything else is the attempt's error, recorded with the prompt sent and the
    chunks counted (before: -1 failed the whole batch's write, 2**70 an OverflowError that lost
    the request, "12" was taken as 12)."""
    from llmqueue.bench.attempt import Attempt

    def outcome(usage):
        ex = Attempt(0.0, 5)
        ex.http_status, ex.done, ex.usage = 200, True, usage
        ex.toks.extend([0.1, 0.2])
        return ex.outcome(), ex.ot, ex.pt, ex.cached

    assert outcome({"prompt_tokens": 7, "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 7}}) == (("ok", None), 2, 7, 7)
    assert outcome({"completion_tokens": 2 ** 63 - 1}) == (("ok", None), 2 ** 63 - 1, 5, 0)
    assert outcome({"prompt_tokens": 9}) == (("ok", None), 2, 9, 0)  # no completion count: the chunks
    for bad in ({"completion_tokens": -1}, {"completion_tokens": 2 ** 63}, {"completion_tokens": 2 ** 70},
                {"completion_tokens": True}, {"completion_tokens": 2.0}, {"completion_tokens": "2"},
                {"prompt_tokens": -3}, {"prompt_tokens": [4]}, {"prompt_tokens_details": {"cached_tokens": -1}},
                {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 5}}, [1, 2], "x", 3):
        (status, reason), ot, pt, cached = outcome(bad)
        assert status == "error" and reason.startswith("invalid usage"), bad
        assert (ot, pt, cached) == (None, 5, 0), bad


def test_a_full_disk_at_the_end_leaves_the_journals_readable(stub, tmp_path, monkeypatch):
    """The journals cannot become Parquet files (ENOSPC): the run's error says so in one line,
    no half-written file is left, and every record stays readable from its journal."""
    import errno
    import os

    from llmqueue.records import journal

    class FullDisk:
        def __init__(self, path, schema, compression=None):
            with open(path, "wb") as f:
                f.write(b"PAR1")  # a started file, as a real write leaves it

        def write_table(self, *a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def add_key_value_metadata(self, meta):
            pass

        def close(self):
            pass

    monkeypatch.setattr(journal.pq, "ParquetWriter", FullDisk)
    reqs = _reqs(n=30, seed=14)
    res = run_bench(stub.url, stub.model, reqs, out_dir=tmp_path)
    assert res.error == (f"cannot write to {tmp_path} (No space left on device); "
                         "the journals stay in place, readable")
    assert res.written == len(reqs)
    assert not (tmp_path / "requests.parquet").exists() and not (tmp_path / "requests.parquet.tmp").exists()
    assert (tmp_path / "requests.parquet.journal").exists() and (tmp_path / "tokens.parquet.journal").exists()
    disk = read_records(tmp_path)
    assert len(disk) == len(reqs) and (disk["status"] == "ok").all()
    assert not is_complete(tmp_path / "requests.parquet")


def test_an_unforeseen_parsing_failure_is_its_attempts_error(stub, monkeypatch, capsys):
    """An exception while a response is parsed (in the protocol callback) fails that attempt, in
    one reason, and never escapes to the event loop (which printed an asyncio traceback per
    request and left the attempt to end as a cut connection)."""
    from llmqueue.bench import attempt as mod

    real = mod.Attempt.payload
    calls = {"n": 0}

    def flaky(self, data):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise RuntimeError("unforeseen")
        real(self, data)

    monkeypatch.setattr(mod.Attempt, "payload", flaky)
    reqs = _reqs(rate=200, n=30, output="fixed:1", seed=15)
    res = run_bench(stub.url, stub.model, reqs)
    r = res.records
    bad = int((r["status"] == "error").sum())
    assert len(r) == len(reqs) and bad > 0 and int((r["status"] == "ok").sum()) == len(reqs) - bad
    assert res.summary["errors"] == {"unreadable response (RuntimeError)": bad} and res.error is None
    assert "Traceback" not in capsys.readouterr().err


def test_whole_chunks_read_together_frame_as_the_states_one_by_one():
    """The chunked framing's shortcut (the chunks wholly in a read handed over in one call) gives
    the payload bytes, the end and the failures the state-by-state framing gives, over random
    bodies (extensions, bad size lines, trailers) cut at random reads."""
    import random

    from llmqueue.bench.http import Response

    class Kept(Response):
        __slots__ = ("got", "failed")

        def __init__(self):
            super().__init__()
            self.got, self.failed = [], None

        def payload(self, data):
            self.got.append(data)

        def fail(self, exc):
            self.failed = str(exc)
            super().fail(exc)

    class StateByState(Kept):
        __slots__ = ()

        def _whole_chunks(self, buf, pos, n):
            return pos

    rng = random.Random(11)
    seen = set()
    for _ in range(800):
        body = b""
        for _ in range(rng.randrange(0, 12)):
            d = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
            size = b"%x" % len(d) if rng.random() < 0.9 else b"%X" % len(d)
            ext = b";x=1" if rng.random() < 0.1 else b""
            body += size + ext + b"\r\n" + d + b"\r\n"
        if rng.random() < 0.05:
            body += b"zz\r\n"  # not a size
        body += b"0\r\n" + (b"T: 1\r\n" if rng.random() < 0.2 else b"") + b"\r\n"
        data = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body
        cuts = sorted(rng.sample(range(1, len(data)), min(rng.randrange(0, 6), len(data) - 1)))
        outs = []
        for cls in (Kept, StateByState):
            r = cls()
            for a, b in zip([0, *cuts], [*cuts, len(data)]):
                r.feed(data[a:b])
            outs.append((b"".join(r.got), r.complete, r.failed, r.buf))
        assert outs[0] == outs[1], data
        seen.add((outs[0][1], outs[0][2] is not None))
    assert seen == {(True, False), (False, True)}  # whole bodies and bad ones
