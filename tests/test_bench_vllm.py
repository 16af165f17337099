"""``llmqueue bench`` speaking ``vllm bench serve``: its flags as aliases, real-prompt datasets
(ShareGPT, custom JSONL), vLLM's latency definitions (from the actual send) and its result file,
against the stub server (loopback only)."""

from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pyarrow.parquet as pq
import pytest
from _cli import run_cli

from llmqueue.bench import vllm_flags as vf
from llmqueue.bench.checks import peak_concurrency
from llmqueue.bench.datasets import estimate_tokens, load_dataset
from llmqueue.bench.stub_server import StubServer
from llmqueue.errors import InputError
from llmqueue.records import read_records

VLLM_RESULT_KEYS = (
    "date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
    "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "generated_texts",
    "errors", "max_concurrent_requests", "max_output_tokens_per_s")


@pytest.fixture(scope="module")
def slow_first():
    """A server whose first token takes 50 ms (the acceptance's TTFT)."""
    with StubServer(first_token_delay_s=0.05, token_delay_s=0.001) as s:
        yield s


@pytest.fixture(scope="module")
def stub():
    with StubServer(token_delay_s=0.0005) as s:
        yield s


@pytest.fixture(scope="module")
def sharegpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    conv = [{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(f"w{j}" for j in range(6 + i))},
        {"from": "gpt", "value": "y" * (40 + 12 * i)},
        {"from": "human", "value": "ignored third turn"}]} for i in range(20)]
    conv += [{"id": "one-turn", "conversations": [{"from": "human", "value": "only one turn"}]},
             {"id": "too-short", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]},
             {"id": "no-conv"}]
    p = d / "sharegpt.json"
    p.write_text(json.dumps(conv))
    return p


# -- the acceptance: vLLM's flags, vLLM's TTFT, vLLM's result file ----------------------------

def test_acceptance_vllm_flags_ttft_from_the_send_and_result_file(slow_first, tmp_path):
    out_dir = tmp_path / "run"
    code, out, err = run_cli("bench", "--url", slow_first.url, "--model", slow_first.model,
                             "--request-rate", "20", "--max-concurrency", "1", "--num-prompts", "50",
                             "--prompt", "fixed:16", "--output", "fixed:4", "--save-result", "--out", str(out_dir),
                             "--no-progress")
    assert code == 0, err
    s = json.loads((out_dir / "summary.json").read_text())
    # vLLM's TTFT (from the actual send): the server's 50 ms; from the schedule, the wait for the
    # single slot adds up (50 requests at 20/s, each taking ~55 ms: the client queue grows)
    assert 45 <= s["mean_ttft_ms"] <= 90
    assert s["from_intended"]["mean_ttft_ms"] > 4 * s["mean_ttft_ms"]
    assert s["from_intended"]["p99_ttft_ms"] > s["p99_ttft_ms"]
    assert s["max_concurrency"] == 1 and s["max_concurrent_requests"] == 1
    assert "TTFT (ms), from the send (vLLM)" in out and "TTFT from the intended send time" in out
    files = list(out_dir.glob("openai-20.0qps-concurrency1-stub-model-*.json"))
    assert len(files) == 1 and f"vLLM bench serve result written to {files[0]}" in out
    v = json.loads(files[0].read_text())
    for k in VLLM_RESULT_KEYS:
        assert k in v, k
    assert v["backend"] == "openai" and v["model_id"] == slow_first.model and v["num_prompts"] == 50
    assert v["request_rate"] == 20.0 and v["burstiness"] == 1.0 and v["max_concurrency"] == 1
    # the aggregates are summary.json's; the per-request lists agree with them
    for k in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
              "output_throughput", "total_token_throughput", "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
              "p99_itl_ms", "std_ttft_ms"):
        assert v[k] == pytest.approx(s[k], rel=1e-12), k
    assert "mean_e2el_ms" not in v  # vLLM's default --percentile-metrics: ttft,tpot,itl
    assert v["completed"] == 50 and len(v["ttfts"]) == len(v["itls"]) == len(v["input_lens"]) == 50
    assert 1e3 * np.mean(v["ttfts"]) == pytest.approx(s["mean_ttft_ms"], rel=1e-9)
    assert 1e3 * np.percentile(v["ttfts"], 99) == pytest.approx(s["p99_ttft_ms"], rel=1e-9)
    itls = np.concatenate([np.asarray(x) for x in v["itls"]])
    assert len(itls) == s["itl_samples"] and 1e3 * itls.mean() == pytest.approx(s["mean_itl_ms"], rel=1e-9)
    assert sum(v["input_lens"]) == s["total_input_tokens"] == 50 * 16
    assert v["output_lens"] == [4] * 50 and v["errors"] == [""] * 50


def test_request_rate_inf_sends_everything_at_once(stub, tmp_path):
    out_dir = tmp_path / "run"
    code, _, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--request-rate", "inf",
                           "--num-prompts", "30", "--prompt", "fixed:8", "--output", "fixed:2", "--out", str(out_dir),
                           "--no-progress", "--save-result", "--result-filename", "r.json")
    assert code == 0, err
    wl = pq.read_table(out_dir / "workload.parquet").to_pydict()
    assert len(wl["arrival_s"]) == 30 and set(wl["arrival_s"]) == {0.0}
    assert json.loads((out_dir / "r.json").read_text())["request_rate"] == "inf"


def test_request_rate_and_burstiness_follow_vllm(stub, tmp_path):
    # burstiness b: Gamma gaps with shape b (CV 1/sqrt(b)), mean 1/rate
    assert vf.arrival_spec(5.0, 1.0) == "poisson:5.0"
    assert vf.arrival_spec(5.0, 0.25) == "gamma:5.0:cv=2.0"
    assert vf.arrival_spec(5.0, math.inf) == "deterministic:5.0"
    from llmqueue.workload import Workload

    gaps = np.diff(Workload(vf.arrival_spec(10.0, 4.0), prompt="fixed:1", output="fixed:1")
                   .generate(seed=1, n=20_000).arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(0.5, rel=0.05) and gaps.mean() == pytest.approx(0.1, rel=0.03)
    # as vLLM does: the times scaled so that the last request is sent at N / rate
    out_dir = tmp_path / "run"
    code, _, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--request-rate", "200",
                           "--burstiness", "4", "--num-prompts", "40", "--prompt", "fixed:4", "--output", "fixed:1",
                           "--out", str(out_dir), "--no-progress")
    assert code == 0, err
    a = np.asarray(pq.read_table(out_dir / "workload.parquet").to_pydict()["arrival_s"])
    assert a[-1] == pytest.approx(40 / 200, rel=1e-12) and np.all(np.diff(a) >= 0)
    s = json.loads((out_dir / "summary.json").read_text())
    assert s["bench"]["vllm"]["request_rate"] == 200 and s["bench"]["vllm"]["burstiness"] == 4


# -- one line for each bad combination --------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    (("--concurrency", "2", "--max-concurrency", "2"), "--max-concurrency"),
    (("--num-requests", "5", "--num-prompts", "5"), "--num-prompts"),
    (("--request-rate", "5", "--arrival", "poisson:5"), "--request-rate"),
    (("--burstiness", "2", "--arrival", "poisson:5"), "--burstiness"),
    (("--request-rate", "5", "--burstiness", "0"), "--burstiness"),
    (("--request-rate", "fast"), "--request-rate"),
    (("--request-rate", "-1"), "--request-rate"),
    (("--request-rate", "inf", "--duration", "5"), "--request-rate"),
    (("--dataset-name", "random", "--dataset-path", "DATA"), "--dataset-path"),
    (("--dataset-name", "sharegpt"), "--dataset-path"),
    (("--dataset-name", "sharegpt", "--dataset-path", "DATA", "--prompt", "fixed:3"), "--dataset-name"),
    (("--goodput", "ttft"), "--goodput"),
    (("--goodput", "latency:5"), "--goodput"),
    (("--goodput", "ttft:-1"), "--goodput"),
    (("--extra-body", "{bad"), "--extra-body"),
    (("--extra-body", "[1]"), "--extra-body"),
    (("--percentile-metrics", "ttft,queue"), "--percentile-metrics"),
    (("--metric-percentiles", "0,50"), "--metric-percentiles"),
    (("--metric-percentiles", "x"), "--metric-percentiles"),
    (("--result-dir", "RES"), "--result-dir"),
    (("--max-concurrency", "0"), "--max-concurrency"),
])
def test_bad_vllm_flags_are_one_line(args, flag, tmp_path, sharegpt):
    args = tuple(str(sharegpt) if a == "DATA" else str(tmp_path / "res") if a == "RES" else a for a in args)
    base = ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "o")]
    wl = [] if any(a in args for a in ("--arrival", "--request-rate", "--num-requests", "--num-prompts")) else \
        ["--request-rate", "5", "--num-prompts", "3"]
    if "--prompt" not in args and "--dataset-name" not in args:
        wl += ["--prompt", "fixed:3", "--output", "fixed:2"]
    if "--num-requests" not in args and "--num-prompts" not in args and "--duration" not in args:
        wl += ["--num-prompts", "3"] if "--num-prompts" not in wl else []
    code, out, err = run_cli(*base, *wl, *args)
    assert code == 2, (err, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_goodput_takes_vllms_multi_value_spelling(slow_first, tmp_path):
    assert vf.expand_multi(["--goodput", "ttft:1", "tpot:2", "--x", "y"]) == \
        ["--goodput", "ttft:1", "--goodput", "tpot:2", "--x", "y"]
    assert vf.parse_goodput(["ttft:500", "tpot:50 e2el:900"]) == {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2el_ms": 900.0}
    common = ["bench", "--url", slow_first.url, "--model", slow_first.model, "--request-rate", "100",
              "--num-prompts", "20", "--prompt", "fixed:4", "--output", "fixed:3", "--no-progress", "--json"]
    code, out, err = run_cli(*common, "--goodput", "ttft:2000", "e2el:5000", "--out", str(tmp_path / "a"))
    assert code == 0, err
    s = json.loads(out)
    assert s["request_goodput"] == pytest.approx(s["request_throughput"]) and s["request_goodput"] > 0
    # the 50 ms first token misses a 10 ms TTFT target
    code, out, err = run_cli(*common, "--goodput", "ttft:10", "--out", str(tmp_path / "b"))
    assert code == 0, err
    assert json.loads(out)["request_goodput"] == 0


def test_percentile_flags_shape_summary_and_result(stub, tmp_path):
    out_dir = tmp_path / "run"
    code, _, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--request-rate", "200",
                           "--num-prompts", "20", "--prompt", "fixed:4", "--output", "fixed:3", "--out", str(out_dir),
                           "--no-progress", "--metric-percentiles", "25,50,99", "--percentile-metrics", "e2el,ttft",
                           "--save-result", "--result-dir", str(tmp_path / "res"), "--result-filename", "v.json")
    assert code == 0, err
    s = json.loads((out_dir / "summary.json").read_text())
    assert s["percentiles"] == [25, 50, 99] and "p25_ttft_ms" in s and "p90_ttft_ms" not in s
    v = json.loads((tmp_path / "res" / "v.json").read_text())
    assert {"p25_e2el_ms", "p50_e2el_ms", "p99_e2el_ms", "mean_e2el_ms", "p25_ttft_ms"} <= set(v)
    assert not any(k.endswith("_tpot_ms") or k.endswith("_itl_ms") for k in v)
    assert v["p25_e2el_ms"] == pytest.approx(s["p25_e2el_ms"])


def test_extra_body_is_merged_into_every_request():
    from llmqueue.bench.prompts import Prompts
    from llmqueue.workload import Workload

    reqs = Workload("poisson:5", prompt="fixed:3", output="fixed:2").generate(seed=0, n=3)
    for endpoint, texts in (("completions", None), ("chat", None), ("completions", ["a b", "c", "d e f"])):
        p = Prompts(reqs, model="m", endpoint=endpoint, seed=0, token_range=(100, 500), exact_output=True,
                     extra_body=vf.parse_extra_body('{"temperature": 0, "top_p": 0.5}'), texts=texts)
        b = json.loads(p.body(2))
        assert b["temperature"] == 0 and b["top_p"] == 0.5 and b["stream"] is True
        if texts:
            assert b["prompt"] == "d e f"


def test_peak_concurrency_as_vllm_counts_it():
    assert peak_concurrency([0, 1, 2], [1, 2, 3]) == 1  # an end before a start at the same instant
    assert peak_concurrency([0, 0.5, 0.6], [1, 2, 0.7]) == 3
    assert peak_concurrency([], []) == 0 and peak_concurrency([0.0, np.nan], [1.0, 2.0]) == 1


# -- datasets ---------------------------------------------------------------------------------

def test_sharegpt_prompts_are_sent_as_text_and_records_keep_the_servers_counts(stub, tmp_path, sharegpt):
    for endpoint in ("completions", "chat"):
        out_dir = tmp_path / endpoint
        code, _, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--endpoint", endpoint,
                               "--dataset-name", "sharegpt", "--dataset-path", str(sharegpt), "--request-rate", "200",
                               "--num-prompts", "15", "--seed", "4", "--out", str(out_dir), "--no-progress")
        assert code == 0, err
        ds = load_dataset("sharegpt", sharegpt, 15, seed=4)
        r = read_records(out_dir)
        o = np.argsort(r["request_id"])
        # the stub counts one token per word of a text prompt: the records hold its usage counts
        assert r["prompt_tokens"][o].tolist() == [len(t.split()) for t in ds.texts]
        wl = pq.read_table(out_dir / "workload.parquet").to_pydict()
        assert wl["prompt_tokens"] == [estimate_tokens(t) for t in ds.texts] != r["prompt_tokens"][o].tolist()
        # output lengths: the completions' (estimated) token counts, as vLLM takes them
        assert wl["output_tokens"] == ds.output_tokens.tolist() == r["output_tokens"][o].tolist()
        s = json.loads((out_dir / "summary.json").read_text())
        assert s["bench"]["dataset"]["name"] == "sharegpt" and s["bench"]["prompt"].startswith("dataset text")
        assert s["bench"]["exact_output"] is False  # vLLM sends ignore_eos only for random prompts
    # which entries: two turns and vLLM's length bounds (the one-turn, short and empty ones dropped)
    assert ds.available == 15 and ds.oversampled == 0
    assert all(t.startswith("w0 w1 w2") for t in ds.texts)


def test_sharegpt_oversamples_and_output_flag_overrides(sharegpt):
    ds = load_dataset("sharegpt", sharegpt, 50, seed=1, output_len=np.full(50, 7))
    assert len(ds.texts) == 50 and ds.available == 20 and ds.oversampled == 30
    assert set(ds.output_tokens.tolist()) == {7}
    again = load_dataset("sharegpt", sharegpt, 50, seed=1, output_len=np.full(50, 7))
    assert again.texts == ds.texts  # seeded
    assert load_dataset("sharegpt", sharegpt, 50, seed=2).texts != ds.texts


def test_custom_jsonl_prompts_and_output_lengths(stub, tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": f"question number {i} " + "x " * i, "output_len": 2 + i})
                           for i in range(8)) + "\n\n" + json.dumps({"prompt": "no length"}) + "\n")
    ds = load_dataset("custom", p, 9, seed=0)
    lens = dict(zip(ds.texts, ds.output_tokens.tolist()))
    assert lens["no length"] == 256 and lens["question number 3 x x x "] == 5
    out_dir = tmp_path / "run"
    code, _, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--dataset-name", "custom",
                           "--dataset-path", str(p), "--arrival", "poisson:300", "--num-requests", "9",
                           "--output", "fixed:3", "--out", str(out_dir), "--no-progress")
    assert code == 0, err
    r = read_records(out_dir)
    assert set(r["status"]) == {"ok"} and set(r["output_tokens"].tolist()) == {3}  # --output overrides
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt"}\n')
    with pytest.raises(InputError, match="line 1 has no \"prompt\""):
        load_dataset("custom", bad, 1)
    bad.write_text('{"prompt": "x", "output_len": 0}\n')
    with pytest.raises(InputError, match="not a positive integer"):
        load_dataset("custom", bad, 1)
    bad.write_text('{"conversations": []}')
    with pytest.raises(InputError, match="not a ShareGPT file"):
        load_dataset("sharegpt", bad, 1)
    bad.write_text("[]")
    with pytest.raises(InputError, match="has no conversation with two turns"):
        load_dataset("sharegpt", bad, 1)


def test_tokenizer_is_optional(sharegpt, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(InputError, match="pip install transformers"):
        load_dataset("sharegpt", sharegpt, 3, tokenizer="gpt2")

    class _Tok:  # one token per 3 characters, plus one (a BOS)
        def __call__(self, text):
            return types.SimpleNamespace(input_ids=list(range(len(text) // 3 + 1)))

    fake = types.ModuleType("transformers")
    fake.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda name: _Tok())
    monkeypatch.setitem(sys.modules, "transformers", fake)
    ds = load_dataset("sharegpt", sharegpt, 5, tokenizer="fake")
    assert ds.prompt_tokens.tolist() == [len(t) // 3 + 1 for t in ds.texts]
    assert ds.counted_by == "tokenizer fake"
    # the completions' lengths by the tokenizer: 40 + 12 i characters
    assert set(ds.output_tokens.tolist()) <= {(40 + 12 * i) // 3 + 1 for i in range(20)}
