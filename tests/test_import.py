"""Engine settings recorded (never assumed), ``llmqueue import``, and the drain cap's ``cancelled``.

Against the stub server and hand-written files: no vLLM needed.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.bench.stub_server import StubServer
from llmqueue.records import read_records

# vLLM 0.32's startup lines, as a VllmServer log holds them (abridged)
VLLM_LOG = """\
$ /venv/bin/python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 35933 --model /m --block-size 32 --max-num-seqs 16 --max-num-batched-tokens 2048 --max-model-len 1024 --no-enable-prefix-caching
1795789164.135756 (APIServer pid=28921) INFO 11-27 14:19:24 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 35933, 'model': '/m', 'dtype': 'float32', 'max_model_len': 1024, 'served_model_name': ['m'], 'block_size': 32, 'enable_prefix_caching': False, 'max_num_batched_tokens': 2048, 'max_num_seqs': 16}
1795789170.595302 (EngineCore pid=28933) INFO 11-27 14:19:30 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m', dtype=torch.float32, max_seq_len=1024, enable_chunked_prefill=True, enable_prefix_caching=False, seed=0
1795789178.465713 (EngineCore pid=28933) INFO 11-27 14:19:38 [kv_cache_utils.py:2327] CPU KV cache size: 131,072 tokens, Maximum concurrency for 1,024 tokens per request: 128.00x
"""


@pytest.fixture(scope="module")
def stub():
    with StubServer(token_delay_s=0.002) as s:
        yield s


WL = ("--arrival", "poisson:50", "--prompt", "uniform:4:40", "--output", "fixed:6", "--num-requests", "30",
      "--no-progress", "--json")


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("llmqueue: error: ")
    return lines[0]


# -- engine settings ---------------------------------------------------------------------------

def test_server_log_parsing_reads_every_startup_form():
    from llmqueue.bench.server_info import from_cache_config, parse_server_log

    got = parse_server_log(VLLM_LOG.splitlines())
    assert got["max_num_seqs"] == 16 and got["max_num_batched_tokens"] == 2048 and got["block_size"] == 32
    assert got["max_model_len"] == 1024 and got["enable_chunked_prefill"] is True
    assert got["enable_prefix_caching"] is False and got["kv_cache_size_tokens"] == 131072
    old = parse_server_log(["INFO 05-01 api_server.py:1 args: Namespace(host=None, max_num_seqs=256, "
                            "max_num_batched_tokens=None, block_size=16, enable_chunked_prefill=False)"])
    assert old == {"max_num_seqs": 256, "block_size": 16, "enable_chunked_prefill": False}
    # the last start in an appended log wins
    again = parse_server_log(VLLM_LOG.splitlines() + ["$ python -m vllm.entrypoints.openai.api_server --max-num-seqs 8"])
    assert again["max_num_seqs"] == 8 and "max_num_batched_tokens" not in again
    labels = from_cache_config({"block_size": "32", "num_gpu_blocks": "2048", "gpu_memory_utilization": "0.92",
                                "enable_prefix_caching": "False", "num_cpu_blocks": "None", "engine": "0"})
    assert labels == {"block_size": 32, "num_gpu_blocks": 2048, "gpu_memory_utilization": 0.92,
                      "enable_prefix_caching": False}


def test_bench_records_settings_with_sources_and_calibrate_uses_them(stub, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(VLLM_LOG)
    out = tmp_path / "run"
    code, _, err = run_cli("bench", "--url", stub.url, "--model", stub.model, *WL, "--out", out,
                           "--server-log", log, "--server-max-num-seqs", "32", "--server-num-gpu-blocks", "64")
    assert code == 0, err
    server = json.loads((out / "server.json").read_text())
    assert server["max_num_seqs"] == 16 and server["sources"]["max_num_seqs"] == f"server log {log}"
    assert server["max_num_batched_tokens"] == 2048 and server["block_size"] == 32
    assert server["num_gpu_blocks"] == 64 and server["sources"]["num_gpu_blocks"] == "flag --server-num-gpu-blocks"
    assert server["M_usable"] == 63 * 32
    # the flag and the log disagree: the server's word is kept, and the run says so
    assert any("max_num_seqs" in n and "32" in n for n in server["notes"])
    assert "max_num_seqs" in err and err.startswith("llmqueue: note:")
    code, cout, err = run_cli("calibrate", out, "-o", tmp_path / "cal.yaml", "--json")
    assert code == 0, err
    cal = json.loads(cout)
    assert cal["engine"]["max_num_seqs"] == 16 and cal["engine"]["max_num_batched_tokens"] == 2048
    assert cal["capacity_tokens"] == 63 * 32


def test_calibrate_without_engine_settings_stops_in_one_line(stub, tmp_path):
    out = tmp_path / "bare"
    code, sout, err = run_cli("bench", "--url", stub.url, "--model", stub.model, *WL, "--out", out)
    assert code == 0, err
    assert any("server.json lacks max_num_seqs" in n for n in json.loads(sout)["notes"])
    code, _, err = run_cli("calibrate", out, "-o", tmp_path / "c.yaml", "--capacity-tokens", "4096")
    assert code == 2
    line = one_error_line(err)
    assert "max_num_seqs unknown" in line and "--server-max-num-seqs" in line and "--max-num-seqs N here" in line
    assert not (tmp_path / "c.yaml").exists()
    code, _, err = run_cli("calibrate", out, "-o", tmp_path / "c.yaml", "--capacity-tokens", "4096",
                           "--max-num-seqs", "8")
    assert code == 2 and "max_num_batched_tokens unknown" in one_error_line(err)
    code, _, err = run_cli("calibrate", out, "-o", tmp_path / "c.yaml", "--capacity-tokens", "4096",
                           "--max-num-seqs", "8", "--max-num-batched-tokens", "512", "--json")
    assert code == 0, err
    cal = (tmp_path / "c.yaml").read_text()
    assert "max_num_seqs: 8" in cal and "max_num_batched_tokens: 512" in cal


def test_validate_with_a_calibration_without_engine_settings_stops_in_one_line(tmp_path):
    """An older calibration file (the engine settings assumed, not recorded): one line, and the
    validate flags supply them."""
    import yaml

    out = tmp_path / "sim"
    assert run_cli("simulate", "--arrival", "poisson:2", "--prompt", "fixed:32", "--output", "fixed:8",
                   "--num-requests", "40", "--capacity-tokens", "4096", "--step-time", "0.01", "--out", str(out),
                   "--json").code == 0
    cal = {"capacity_tokens": 4096, "b": 0.01, "step_time": "0.01", "engine": {"block_size": 16}}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(cal))
    code, _, err = run_cli("validate", out, "--calibration", tmp_path / "old.yaml", "--drift", "0")
    assert code == 2
    line = one_error_line(err)
    assert "calibration: max_num_seqs unknown" in line and "--max-num-seqs N here" in line
    code, _, err = run_cli("validate", out, "--calibration", tmp_path / "old.yaml", "--drift", "0",
                           "--max-num-seqs", "8", "--max-num-batched-tokens", "512", "--json")
    assert code == 0, err


# -- import --------------------------------------------------------------------------------------

def write_client_jsonl(path, n=120, seed=1):
    """What another client might log: epoch-second sends, a TTFT, the end-to-end latency and the
    chunk arrival times, under its own column names (plain Python, no llmqueue)."""
    rnd = random.Random(seed)
    t = 1_700_000_000.0
    with open(path, "w") as f:
        for i in range(n):
            t += rnd.expovariate(2.0)
            n_out = rnd.randint(4, 30)
            ttft = 0.04 + 0.04 * rnd.random()
            chunks = [t + ttft + 0.015 * k for k in range(n_out)]
            f.write(json.dumps({"id": 1000 + i, "t0": t, "ttft": ttft, "latency": chunks[-1] - t,
                                "n_in": rnd.randint(16, 200), "n_out": n_out, "times": chunks,
                                "err": None}) + "\n")


JSONL_MAP = ("request_id=id,send_s=t0,ttft_s=ttft,e2el_s=latency,prompt_tokens=n_in,output_tokens=n_out,"
             "chunk_times=times,error=err")


def test_generic_jsonl_imports_calibrates_and_validates(tmp_path):
    src = tmp_path / "client.jsonl"
    write_client_jsonl(src)
    run_dir = tmp_path / "run"
    code, out, err = run_cli("import", "jsonl", src, "--out", run_dir, "--map", JSONL_MAP,
                             "--max-num-seqs", "16", "--max-num-batched-tokens", "512", "--block-size", "16",
                             "--num-gpu-blocks", "257", "--warmup", "0", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["imported"]["requests"] == 120 and s["status_counts"]["ok"] == 120
    r = read_records(run_dir)
    assert sorted(r["request_id"].tolist()) == list(range(1000, 1120))
    assert np.nanmin(r["arrival_s"]) == 0.0  # the earliest send is the origin
    rows = {d["id"]: d for d in map(json.loads, src.read_text().splitlines())}
    o = np.argsort(r["request_id"])
    ttft = np.array([rows[i]["ttft"] for i in sorted(rows)])
    assert np.allclose((r["first_token_s"] - r["dispatched_s"])[o], ttft, atol=1e-6)
    assert r["output_tokens"][o].tolist() == [rows[i]["n_out"] for i in sorted(rows)]
    server = json.loads((run_dir / "server.json").read_text())
    assert server["sources"]["max_num_seqs"] == "import --max-num-seqs" and server["M_usable"] == 256 * 16
    code, out, err = run_cli("calibrate", run_dir, "-o", tmp_path / "cal.yaml", "--json")
    assert code == 0, err
    cal = json.loads(out)
    assert abs(cal["b"] - 0.015) < 1e-3 and cal["capacity_tokens"] == 256 * 16
    code, out, err = run_cli("validate", run_dir, "--calibration", tmp_path / "cal.yaml", "--drift", "0",
                             "--json")
    assert code == 0, err
    v = json.loads(out)
    tp = next(x for x in v["rows"] if x["quantity"] == "request_throughput")
    assert abs(tp["rel_err_sim"]) < 0.05
    # a --time-origin keeps the times as the file's, less the origin
    code, _, err = run_cli("import", "jsonl", src, "--out", tmp_path / "run2", "--map", JSONL_MAP,
                           "--time-origin", "1700000000")
    assert code == 0, err
    r2 = read_records(tmp_path / "run2")
    t0 = min(d["t0"] for d in rows.values())
    assert abs(np.nanmin(r2["arrival_s"]) - (t0 - 1_700_000_000)) < 1e-5


def vllm_result(n=40, seed=2, with_starts=True):
    """A vLLM bench serve --save-result --save-detailed file, its keys as vLLM writes them."""
    rnd = random.Random(seed)
    starts, ttfts, itls, lats, inl, outl, errors = [], [], [], [], [], [], []
    t = 0.0
    for i in range(n):
        t += rnd.expovariate(4.0)
        failed = i % 13 == 5
        k = rnd.randint(3, 20)
        gaps = [0.01 + 0.002 * rnd.random() for _ in range(k - 1)]
        ttft = 0.03 + 0.02 * rnd.random()
        starts.append(1000.0 + t)
        inl.append(rnd.randint(10, 300))
        outl.append(0 if failed else k)
        ttfts.append(0.0 if failed else ttft)
        itls.append([] if failed else gaps)
        lats.append(0.0 if failed else ttft + sum(gaps))
        errors.append("Bad Request" if failed else "")
    d = {"date": "20250101-000000", "backend": "vllm", "model_id": "m", "tokenizer_id": "m", "num_prompts": n,
         "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None, "duration": t, "completed": n - 3,
         "total_input_tokens": sum(inl), "total_output_tokens": sum(outl), "request_throughput": 4.0,
         "input_lens": inl, "output_lens": outl, "ttfts": ttfts, "itls": itls, "latencies": lats,
         "generated_texts": [""] * n, "errors": errors}
    if with_starts:
        d["start_times"] = starts
    return d


def test_vllm_bench_result_imports_and_renders_in_report(tmp_path):
    src = tmp_path / "vllm-result.json"
    src.write_text(json.dumps(vllm_result()))
    run_dir = tmp_path / "run"
    code, out, err = run_cli("import", "vllm-bench", src, "--out", run_dir, "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["status_counts"]["ok"] == 37 and s["status_counts"]["error"] == 3
    assert s["imported"]["chunk_times"] and s["imported"]["result"]["model_id"] == "m"
    r = read_records(run_dir)
    assert len(r) == 40 and (run_dir / "tokens.parquet").exists() and (run_dir / "workload.parquet").exists()
    html = tmp_path / "report.html"
    code, out, err = run_cli("report", run_dir, "-o", html)
    assert code == 0, err
    assert html.exists() and "<html" in html.read_text()[:2000].lower()
    # without start_times: spaced at the file's request_rate, with a note
    d = vllm_result(with_starts=False)
    src.write_text(json.dumps(d))
    code, out, err = run_cli("import", "vllm-bench", src, "--out", tmp_path / "r2", "--json")
    assert code == 0, err
    assert any("no start_times" in n for n in json.loads(out)["notes"])


@pytest.mark.parametrize("case, args, field", [
    ("unknown-format", ("import", "parquet", "{src}", "--out", "{out}"), "FORMAT"),
    ("bad-map-syntax", ("import", "jsonl", "{src}", "--out", "{out}", "--map", "send_s"), "map"),
    ("bad-map-field", ("import", "jsonl", "{src}", "--out", "{out}", "--map", "sent=t0"), "map"),
    ("map-missing-column", ("import", "jsonl", "{src}", "--out", "{out}", "--map", "send_s=nope"), "nope"),
    ("missing-column", ("import", "jsonl", "{src}", "--out", "{out}", "--map", "send_s=t0"), "prompt_tokens"),
    ("map-on-vllm", ("import", "vllm-bench", "{vsrc}", "--out", "{out}", "--map", "send_s=t0"), "map"),
    ("vllm-not-a-result", ("import", "vllm-bench", "{src}", "--out", "{out}"), "file"),
    ("bad-origin", ("import", "jsonl", "{src}", "--out", "{out}", "--map", JSONL_MAP, "--time-origin", "x"),
     "--time-origin"),
])
def test_bad_imports_exit_2_in_one_line(tmp_path, case, args, field):
    src = tmp_path / "client.jsonl"
    write_client_jsonl(src, n=5)
    vsrc = tmp_path / "v.json"
    vsrc.write_text(json.dumps(vllm_result(n=5)))
    argv = [a.format(src=src, vsrc=vsrc, out=tmp_path / "out") for a in args]
    code, _, err = run_cli(*argv)
    assert code == 2, (case, err)
    assert field in one_error_line(err), (case, err)


def test_bad_status_and_ok_without_times_are_one_line(tmp_path):
    src = tmp_path / "s.csv"
    src.write_text("send_s,ttft_s,e2el_s,prompt_tokens,output_tokens,status\n0,0.1,0.5,10,5,ok\n1,,,10,0,lost\n")
    code, _, err = run_cli("import", "csv", src, "--out", tmp_path / "o")
    assert code == 2 and "'lost' is not a status" in one_error_line(err)
    src.write_text("send_s,ttft_s,e2el_s,prompt_tokens,output_tokens,status\n0,0.1,0.5,10,5,ok\n1,,,10,0,ok\n")
    code, _, err = run_cli("import", "csv", src, "--out", tmp_path / "o")
    assert code == 2 and "no first or last token time" in one_error_line(err)
    # a CSV in the record schema's own names needs no --map; cancelled is a status
    src.write_text("send_s,ttft_s,e2el_s,prompt_tokens,output_tokens,status\n0,0.1,0.5,10,5,ok\n"
                   "1,,0.3,10,0,cancelled\n2,0.1,0.4,12,4,ok\n")
    code, out, err = run_cli("import", "csv", src, "--out", tmp_path / "o", "--json")
    assert code == 0, err
    assert json.loads(out)["status_counts"]["cancelled"] == 1


def test_converted_trace_as_workload_parquet_is_one_line_in_validate(tmp_path):
    """Issue 17: a ``workload convert`` output used as workload.parquet crashed validate with
    KeyError: 'request_id'."""
    src = tmp_path / "client.jsonl"
    write_client_jsonl(src, n=60)
    run_dir = tmp_path / "run"
    assert run_cli("import", "jsonl", str(src), "--out", str(run_dir), "--map", JSONL_MAP, "--max-num-seqs", "16",
                   "--max-num-batched-tokens", "512", "--capacity-tokens", "4096").code == 0
    assert run_cli("calibrate", str(run_dir), "-o", str(tmp_path / "cal.yaml")).code == 0
    trace = tmp_path / "trace.csv"
    trace.write_text("t,p,o\n" + "".join(f"{i * 0.5},{20 + i},{5}\n" for i in range(60)))
    assert run_cli("workload", "convert", str(trace), "-o", str(run_dir / "workload.parquet"),
                   "--map", "time=t,prompt=p,output=o").code == 0
    code, _, err = run_cli("validate", run_dir, "--calibration", tmp_path / "cal.yaml", "--drift", "0")
    assert code == 2
    line = one_error_line(err)
    assert "request_id" in line and "llmqueue import" in line


# -- the drain cap -------------------------------------------------------------------------------

def test_drain_cap_cancels_what_is_still_in_flight(tmp_path):
    out = tmp_path / "drain"
    with StubServer(token_delay_s=0.05) as s:
        code, sout, err = run_cli("bench", "--url", s.url, "--model", s.model, "--arrival", "deterministic:20",
                                  "--prompt", "fixed:8", "--output", "fixed:40", "--num-requests", "10",
                                  "--drain-timeout", "0.3", "--out", out, "--no-progress", "--json")
    assert code == 0, err
    summ = json.loads(sout)
    r = read_records(out)
    cancelled = r["status"] == "cancelled"
    assert cancelled.sum() == summ["bench"]["drain_cancelled"] > 0
    assert summ["status_counts"]["cancelled"] == cancelled.sum()
    assert np.isfinite(r["finish_s"][cancelled]).all()
    # cancelled at the cap: about 0.3 s after the last send (at 0.45 s)
    assert np.all(np.abs(r["finish_s"][cancelled] - 0.75) < 0.25)
    assert any("drain cap" in n for n in summ["notes"])
    code, _, err = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", *WL, "--out",
                           tmp_path / "x", "--drain-timeout", "-1")
    assert code == 2 and "--drain-timeout" in one_error_line(err)


# -- guidellm and AIPerf -------------------------------------------------------------------------
# the files: tests/data/make_import_fixtures.py (which versions of the tools' models they follow)

DATA = __import__("pathlib").Path(__file__).parent / "data"


def hand_calibration(path, b=0.016):
    """A calibration file written by hand: the engine's settings and a constant step time."""
    import yaml

    path.write_text(yaml.safe_dump({"capacity_tokens": 65536, "b": b, "step_time": str(b),
                                    "engine": {"block_size": 16, "max_num_seqs": 64,
                                               "max_num_batched_tokens": 2048}}))
    return path


def test_guidellm_report_imports_validates_and_renders(tmp_path):
    src = DATA / "guidellm_v0.7_benchmarks.json"
    report = json.loads(src.read_text())
    code, _, err = run_cli("import", "guidellm", src, "--out", tmp_path / "x")
    assert code == 2
    line = one_error_line(err)
    assert "2 benchmarks" in line and "1 synchronous" in line and "2 constant@2 req/s" in line
    assert "--benchmark K" in line
    run_dir = tmp_path / "run"
    code, out, err = run_cli("import", "guidellm", src, "--benchmark", "2", "--out", run_dir, "--warmup", "0",
                             "--json")
    assert code == 0, err
    s = json.loads(out)
    groups = report["benchmarks"][1]["requests"]
    assert s["status_counts"]["ok"] == len(groups["successful"]) == 27
    assert s["status_counts"]["error"] == len(groups["errored"]) and s["status_counts"]["cancelled"] == 1
    assert s["imported"]["result"]["strategy"] == "constant@2 req/s" and s["imported"]["result"]["schema"] == "v0.4+"
    r = read_records(run_dir)
    # TTFT from the send (timings.request_start), as guidellm's own time_to_first_token_ms
    want = sorted(q["time_to_first_token_ms"] for q in groups["successful"])
    ok = r["status"] == "ok"
    got = np.sort(1e3 * (r["first_token_s"] - r["dispatched_s"])[ok])
    assert np.allclose(got, want, atol=1e-3)
    assert sorted(r["prompt_tokens"][ok].tolist()) == sorted(q["prompt_tokens"] for q in groups["successful"])
    # the intended send (targeted_start) is 0.4 ms before the actual one
    assert np.allclose((r["dispatched_s"] - r["arrival_s"]), 0.0004, atol=1e-6)
    assert not (run_dir / "tokens.parquet").exists()  # guidellm keeps no per-chunk times
    cal = hand_calibration(tmp_path / "cal.yaml")
    code, out, err = run_cli("validate", run_dir, "--calibration", cal, "--drift", "0", "--json")
    assert code == 0, err
    # the chunks came 15-17 ms apart: the measured TPOT is the calibration's step time
    tpot = next(x for x in json.loads(out)["rows"] if x["quantity"] == "median_tpot_ms")
    assert abs(tpot["rel_err_sim"]) < 0.03
    code, _, err = run_cli("report", run_dir, "-o", tmp_path / "r.html")
    assert code == 0, err
    assert "<html" in (tmp_path / "r.html").read_text()[:2000].lower()


def test_guidellm_v03_report_imports(tmp_path):
    src = DATA / "guidellm_v0.3_benchmarks.json"
    code, out, err = run_cli("import", "guidellm", src, "--out", tmp_path / "run", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["status_counts"]["ok"] == 29 and s["status_counts"]["error"] == 1
    assert s["imported"]["result"]["schema"] == "v0.2-v0.3"
    rows = json.loads(src.read_text())["benchmarks"][0]["requests"]["successful"]
    r = read_records(tmp_path / "run")
    ok = r["status"] == "ok"
    assert np.allclose(np.sort(1e3 * (r["first_token_s"] - r["dispatched_s"])[ok]),
                       sorted(q["time_to_first_token_ms"] for q in rows), atol=1e-3)
    assert np.allclose(np.sort((r["finish_s"] - r["dispatched_s"])[ok]),
                       sorted(q["last_token_time"] - q["start_time"] for q in rows), atol=1e-6)


def test_aiperf_export_imports_calibrates_validates_and_renders(tmp_path):
    src = DATA / "aiperf_profile_export.jsonl"
    recs = [json.loads(x) for x in src.read_text().splitlines()]
    prof = [d for d in recs if d["metadata"]["benchmark_phase"] == "profiling"]
    run_dir = tmp_path / "run"
    code, out, err = run_cli("import", "aiperf", src, "--out", run_dir, "--max-num-seqs", "64",
                             "--max-num-batched-tokens", "2048", "--capacity-tokens", "65536", "--warmup", "0",
                             "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["imported"]["requests"] == len(prof) == 40 and any("2 warmup" in n for n in s["notes"])
    assert s["status_counts"] == {**s["status_counts"], "ok": 38, "cancelled": 1, "error": 1}
    r = read_records(run_dir)
    o = np.argsort(r["dispatched_s"])
    ok = [d for d in prof if d["error"] is None]
    ttft = np.array([d["metrics"]["time_to_first_token"]["value"] for d in ok]) / 1e3
    sel = (r["status"] == "ok")[o]
    assert np.allclose((r["first_token_s"] - r["dispatched_s"])[o][sel], ttft, atol=1e-6)
    assert r["output_tokens"][o][sel].tolist() == [d["metrics"]["output_sequence_length"]["value"] for d in ok]
    # per-chunk times from inter_chunk_latency: the decode gaps were drawn in 15-17 ms
    code, out, err = run_cli("calibrate", run_dir, "-o", tmp_path / "cal.yaml", "--json")
    assert code == 0, err
    cal = json.loads(out)
    assert 0.0155 < cal["b"] < 0.0165
    code, out, err = run_cli("validate", run_dir, "--calibration", tmp_path / "cal.yaml", "--drift", "0",
                             "--json")
    assert code == 0, err
    tpot = next(x for x in json.loads(out)["rows"] if x["quantity"] == "median_tpot_ms")
    assert abs(tpot["rel_err_sim"]) < 0.03
    code, _, err = run_cli("report", run_dir, "-o", tmp_path / "r.html")
    assert code == 0, err


def _aiperf_without(tmp_path, metric):
    lines = (DATA / "aiperf_profile_export.jsonl").read_text().splitlines()
    d = json.loads(lines[5])
    d["metrics"].pop(metric)
    lines[5] = json.dumps(d)
    p = tmp_path / "export.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("case, fmt, make, words", [
    ("guidellm-not-a-report", "guidellm", lambda t: _write(t / "x.json", {"ttfts": []}), ("benchmarks list",)),
    ("guidellm-no-requests", "guidellm", lambda t: _write(t / "x.json", {"benchmarks": [{"requests": {}}]}),
     ("requests.successful", "--sample-requests")),
    ("guidellm-bad-index", "guidellm", lambda t: DATA / "guidellm_v0.3_benchmarks.json", ("1..1",)),
    ("aiperf-summary-file", "aiperf", lambda t: _write(t / "s.jsonl", {"records": {}}), ("no metadata",)),
    ("aiperf-not-streamed", "aiperf", lambda t: _aiperf_without(t, "time_to_first_token"),
     ("metrics.time_to_first_token", "--streaming")),
    ("aiperf-no-isl", "aiperf", lambda t: _aiperf_without(t, "input_sequence_length"),
     ("metrics.input_sequence_length",)),
])
def test_bad_guidellm_and_aiperf_files_are_one_line(tmp_path, case, fmt, make, words):
    src = make(tmp_path)
    extra = ("--benchmark", "4") if case == "guidellm-bad-index" else ()
    code, _, err = run_cli("import", fmt, src, "--out", tmp_path / "o", *extra)
    assert code == 2, (case, err)
    line = one_error_line(err)
    assert all(w in line for w in words), (case, line)


def _write(path, obj):
    path.write_text(json.dumps(obj) + "\n")
    return path


def test_server_log_steps_in_the_run_window_become_steps_parquet(tmp_path):
    """The server log's per-step lines between the run's first send and its last answer (epoch
    stamps, the file's clock) become steps.parquet; earlier and later ones (other runs) do not."""
    from llmqueue.records import read_run

    src = DATA / "aiperf_profile_export.jsonl"
    recs = [json.loads(x) for x in src.read_text().splitlines()]
    prof = [d for d in recs if d["metadata"]["benchmark_phase"] == "profiling"]
    t0 = min(d["metadata"]["request_start_ns"] for d in prof) / 1e9
    t1 = max(d["metadata"]["request_end_ns"] for d in prof) / 1e9
    line = ("{t:.6f} (APIServer pid=1) INFO 01-01 00:00:00 [loggers.py:199] Engine 000: Iteration({i}): "
            "{p} context requests, {pt} context tokens, 1 generation requests, 1 generation tokens, "
            "iteration elapsed time: 15.00 ms, GPU KV cache usage: 1.0%")
    times = [t0 - 30.0, t0 - 5.0] + list(np.arange(t0 + 0.05, t1, 0.5)) + [t1 + 30.0]
    log = tmp_path / "vllm.log"
    log.write_text(VLLM_LOG + "\n".join(line.format(t=t, i=i, p=i % 2, pt=100 * (i % 2))
                                        for i, t in enumerate(times)) + "\n")
    run_dir = tmp_path / "run"
    code, out, err = run_cli("import", "aiperf", src, "--out", run_dir, "--server-log", log, "--json")
    assert code == 0, err
    inside = len(times) - 3
    assert any(f"{inside} engine steps" in n for n in json.loads(out)["notes"])
    st = read_run(run_dir).steps
    assert len(st) == inside and np.asarray(st["prefill_tokens"]).max() == 100
    assert np.all(np.asarray(st["start_s"]) >= 0)
    # a vllm-bench result's start_times are not epoch seconds: said, no steps
    vsrc = tmp_path / "v.json"
    vsrc.write_text(json.dumps(vllm_result()))
    code, out, err = run_cli("import", "vllm-bench", vsrc, "--out", tmp_path / "v", "--server-log", log, "--json")
    assert code == 0, err
    assert any("not epoch seconds" in n for n in json.loads(out)["notes"])
    assert not (tmp_path / "v" / "steps.parquet").exists()
