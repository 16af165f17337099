"""Issue 36 item 1: another client's measurements import as they are shipped.

The acceptance: one run against the stub server, benchmarked natively, and the SAME requests
written as another client would log them (a gzipped JSONL, times counted from the run's start with
the run's epoch kept aside, its own status words, null token counts on the requests it aborted, and
a CSV of the server's /metrics samples), imported with flags only: ``calibrate`` and ``validate``
give the same figures on both runs: the same calibration (every number within 1e-9, relative) and
``validate``'s measured and simulated figures within :data:`RTOL` plus twice the two runs' ends'
difference over the run's length (the import knows the run's end from its last answer, a benchmark
from its own clock a few ms later: a rate over the run moves by that share; measured: 1e-4 at
most on an idle machine). Then one small test per flag, each failing on the code before it.
"""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from _cli import run_cli

from llmqueue.bench.stub_server import StubServer
from llmqueue.records import read_records

#: relative tolerance of validate's figures compared between the native and the imported run
RTOL = 1e-3
#: the engine settings both runs are given (bench's --server-* flags, import's own)
SETTINGS = {"max-num-seqs": "16", "max-num-batched-tokens": "512", "block-size": "16", "num-gpu-blocks": "257"}
#: the other client's status words
WORDS = {"ok": "finished", "cancelled": "aborted_drain_cap", "timeout": "deadline", "error": "failed"}


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A benchmarked run with cancelled requests (a drain cap) and /metrics sampled."""
    out = tmp_path_factory.mktemp("native") / "run"
    with StubServer(token_delay_s=0.01) as s:
        code, _, err = run_cli("bench", "--url", s.url, "--model", s.model, "--arrival", "poisson:25", "--seed", "3",
                               "--prompt", "uniform:8:64", "--output", "fixed:12", "--num-requests", "60",
                               "--drain-timeout", "0.06", "--warmup", "0.4", "--metrics-url", s.url,
                               *[x for k, v in SETTINGS.items() for x in (f"--server-{k}", v)],
                               "--out", out, "--no-progress", "--json")
    assert code == 0, err
    return out


def shipped(run_dir, dest):
    """The native run as another client logs it: ``(jsonl.gz, metrics csv, its epoch)``."""
    summ = json.loads((run_dir / "summary.json").read_text())
    epoch = summ["bench"]["t0_epoch_s"]
    r = read_records(run_dir)
    tok = pq.read_table(run_dir / "tokens.parquet").to_pydict()
    chunks: dict = {}
    for rid, att, t in zip(tok["request_id"], tok["attempt"], tok["t_s"]):
        chunks.setdefault((rid, att), []).append(t)
    lines = []
    for i in range(len(r)):
        st = str(r["status"][i])
        ok = st == "ok"
        send, first, fin = (float(r[c][i]) for c in ("dispatched_s", "first_token_s", "finish_s"))
        lines.append({"rid": int(r["request_id"][i]), "sched": float(r["arrival_s"][i]), "sent": send,
                      "ttft": first - send if math.isfinite(first) else None,
                      "e2e": fin - send if math.isfinite(fin) else None,
                      "isl": int(r["prompt_tokens"][i]), "osl": int(r["output_tokens"][i]) if ok else None,
                      "state": WORDS[st], "chunks": chunks.get((int(r["request_id"][i]), int(r["attempt"][i])), [])})
    src = dest / "client.jsonl.gz"
    src.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    m = pq.read_table(run_dir / "metrics.parquet").to_pydict()
    vllm = {"num_running": "vllm:num_requests_running", "num_waiting": "vllm:num_requests_waiting",
            "kv_usage": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions_total",
            "requests_finished": "vllm:request_success_total", "generation_tokens": "vllm:generation_tokens_total",
            "prompt_tokens": "vllm:prompt_tokens_total"}
    cols = [c for c in vllm if c in m]
    rows = ["time," + ",".join(vllm[c] for c in cols)]
    rows += [f"{t!r}," + ",".join("" if math.isnan(m[c][k]) else repr(m[c][k]) for c in cols)
             for k, t in enumerate(m["t_s"])]
    met = dest / "metrics.csv"
    met.write_text("\n".join(rows) + "\n")
    return src, met, epoch


MAP = "request_id=rid,arrival_s=sched,send_s=sent,ttft_s=ttft,e2el_s=e2e,prompt_tokens=isl,output_tokens=osl," \
      "status=state,chunk_times=chunks"
STATUS_MAP = ",".join(f"{w}={s}" for s, w in WORDS.items())


def test_a_run_logged_by_another_client_calibrates_and_validates_as_benched(native, tmp_path):
    src, met, epoch = shipped(native, tmp_path)
    imp = tmp_path / "imported"
    code, out, err = run_cli("import", "jsonl", src, "--out", imp, "--map", MAP, "--time-zero", repr(epoch),
                             "--status-map", STATUS_MAP, "--metrics", met, "--warmup", "0.4",
                             *[x for k, v in SETTINGS.items() for x in (f"--{k}", v)], "--json")
    assert code == 0, err
    s_imp = json.loads(out)
    s_nat = json.loads((native / "summary.json").read_text())
    assert s_imp["status_counts"] == s_nat["status_counts"] and s_nat["status_counts"]["cancelled"] > 0
    # the records: the same requests at the same times
    a, b = read_records(native), read_records(imp)
    assert a["status"].tolist() == b["status"].tolist()
    for c in ("arrival_s", "dispatched_s", "finish_s"):
        assert np.allclose(a[c], b[c], atol=1e-5, equal_nan=True), c
    # the server's samples: the same queue lengths and counters as bench's sampler recorded
    assert s_imp["server_counters"] == pytest.approx(s_nat["server_counters"])
    rtol = RTOL + 2 * abs(s_imp["horizon_s"] - s_nat["horizon_s"]) / (s_nat["horizon_s"] - s_nat["warmup_s"])
    assert s_imp["warmup_s"] == s_nat["warmup_s"] == 0.4
    for k in ("mean_num_waiting", "mean_num_running"):
        assert s_imp[k] == pytest.approx(s_nat[k], rel=rtol, abs=1e-3), k
    figures = {}
    for name, run in (("native", native), ("imported", imp)):
        code, out, err = run_cli("calibrate", run, "-o", tmp_path / f"{name}.yaml", "--json")
        assert code == 0, err
        cal = json.loads(out)
        # both measured up to the client's last send (the same in both runs): the run's end, which
        # bench takes from its own clock and import from the last answer, moves no figure
        code, out, err = run_cli("validate", run, "--calibration", tmp_path / f"{name}.yaml", "--drift", "0",
                                 "--horizon", "last-send", "--json")
        assert code == 0, err
        figures[name] = (cal, json.loads(out))
    (cn, vn), (ci, vi) = figures["native"], figures["imported"]
    numbers = [k for k, v in cn.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert "b" in numbers and "capacity_tokens" in numbers
    for k in numbers:
        assert ci[k] == pytest.approx(cn[k], rel=1e-9), k
    assert ci["engine"] == cn["engine"] and ci["step_time"] == cn["step_time"]
    rows_n = {r["quantity"]: r for r in vn["rows"]}
    rows_i = {r["quantity"]: r for r in vi["rows"]}
    assert set(rows_n) == set(rows_i)
    for q, rn in rows_n.items():
        for k in ("measured", "simulated"):
            x, y = rn.get(k), rows_i[q].get(k)
            if x is None or y is None:
                assert x is y, (q, k)
            else:
                assert y == pytest.approx(x, rel=rtol, abs=1e-6), (q, k, x, y)
    assert vi["verdicts"] == vn["verdicts"]


# -- one test per flag ---------------------------------------------------------------------------

def client_rows(n=40, *, rate=4.0, t0=0.0, seed=5):
    """Requests as a client logs them: ``sent`` from ``t0``, TTFT and end-to-end latency, token counts."""
    rnd = np.random.default_rng(seed)
    t = t0 + np.cumsum(rnd.exponential(1.0 / rate, n))
    return [{"rid": i, "sent": float(t[i]), "ttft": 0.05, "e2e": 0.05 + 0.01 * 9, "isl": 20 + i % 7, "osl": 10,
             "state": "finished", "gaps": [0.01] * 9} for i in range(n)]


def write_jsonl(path, rows, *, gz=False):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


PLAIN = "request_id=rid,send_s=sent,ttft_s=ttft,e2el_s=e2e,prompt_tokens=isl,output_tokens=osl,status=state"
FINISHED = ("--status-map", "finished=ok")


def test_gzip_is_read_by_its_magic_bytes_whatever_the_name(tmp_path):
    rows = client_rows()
    for name in ("run.jsonl.gz", "run.log"):  # a compressed file under any name
        src = write_jsonl(tmp_path / name, rows, gz=True)
        code, out, err = run_cli("import", "jsonl", src, "--out", tmp_path / name.replace(".", "_"), "--map", PLAIN,
                                 *FINISHED, "--json")
        assert code == 0, err
        assert json.loads(out)["imported"]["requests"] == 40
    csv = "sent,ttft,e2e,isl,osl\n" + "".join(f"{r['sent']},0.05,0.14,{r['isl']},10\n" for r in rows)
    (tmp_path / "run.csv.gz").write_bytes(gzip.compress(csv.encode()))
    code, _, err = run_cli("import", "csv", tmp_path / "run.csv.gz", "--out", tmp_path / "c",
                           "--map", "send_s=sent,ttft_s=ttft,e2el_s=e2e,prompt_tokens=isl,output_tokens=osl")
    assert code == 0, err


STEP_LINE = ("{t:.6f} (APIServer pid=1) INFO 01-01 00:00:00 [loggers.py:199] Engine 000: Iteration({i}): "
             "1 context requests, 20 context tokens, 1 generation requests, 1 generation tokens, "
             "iteration elapsed time: 15.00 ms, GPU KV cache usage: 1.0%")


def test_time_zero_places_relative_times_on_the_server_logs_clock(tmp_path):
    epoch = 1_764_000_000.5
    rows = client_rows(rate=4.0)
    src = write_jsonl(tmp_path / "rel.jsonl", rows)
    span = rows[-1]["sent"] + 0.14
    log = tmp_path / "vllm.log"
    times = [epoch - 20.0] + list(epoch + np.arange(0.02, span, 0.25)) + [epoch + span + 20.0]
    log.write_text("\n".join(STEP_LINE.format(t=t, i=i) for i, t in enumerate(times)) + "\n")
    code, out, err = run_cli("import", "jsonl", src, "--out", tmp_path / "r", "--map", PLAIN, *FINISHED,
                             "--time-zero", repr(epoch), "--server-log", log, "--json")
    assert code == 0, err
    s = json.loads(out)
    assert any(f"{len(times) - 2} engine steps" in n for n in s["notes"]), s["notes"]
    assert s["imported"]["t0_epoch_s"] == epoch
    r = read_records(tmp_path / "r")
    assert np.allclose(np.sort(r["dispatched_s"]), [x["sent"] for x in rows])  # the run's 0 is the file's 0
    code, out, _ = run_cli("import", "jsonl", src, "--out", tmp_path / "r2", "--map", PLAIN, *FINISHED,
                           "--server-log", log, "--json")
    assert any("not epoch seconds" in n for n in json.loads(out)["notes"])


def test_status_map_takes_a_clients_own_words_and_an_unknown_one_is_one_line(tmp_path):
    rows = client_rows()
    rows[-1].update(state="aborted_drain_cap", e2e=0.3, osl=None)
    src = write_jsonl(tmp_path / "s.jsonl", rows)
    code, _, err = run_cli("import", "jsonl", src, "--out", tmp_path / "x", "--map", PLAIN, *FINISHED)
    line = one_error_line(err)
    assert code == 2 and "'aborted_drain_cap'" in line and "row 40" in line and "--status-map" in line
    code, out, err = run_cli("import", "jsonl", src, "--out", tmp_path / "r", "--map", PLAIN, "--status-map",
                             "finished=ok,ABORTED_DRAIN_CAP=cancelled", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["imported"]["status_map"] == {"finished": "ok", "aborted_drain_cap": "cancelled"}
    assert read_records(tmp_path / "r")["status"].tolist().count("cancelled") == 1


def test_null_token_counts_are_allowed_only_on_requests_that_did_not_finish(tmp_path):
    rows = client_rows()
    rows[3].update(state="cancelled", e2e=0.02, ttft=None, isl=None, osl=None)
    rows[4].update(state="error", e2e=0.01, ttft=None, osl=None)
    src = write_jsonl(tmp_path / "n.jsonl", rows)
    code, out, err = run_cli("import", "jsonl", src, "--out", tmp_path / "r", "--map", PLAIN, *FINISHED, "--json")
    assert code == 0, err
    s = json.loads(out)
    assert any("without a prompt length" in n for n in s["notes"])
    r = read_records(tmp_path / "r")
    o = np.argsort(r["request_id"])
    assert r["output_tokens"][o][3] == 0 and r["output_tokens"][o][4] == 0
    rows[5]["osl"] = None  # a finished request without its output count
    write_jsonl(src, rows)
    code, _, err = run_cli("import", "jsonl", src, "--out", tmp_path / "r2", "--map", PLAIN, *FINISHED)
    line = one_error_line(err)
    assert code == 2 and "row 6 is ok" in line and "output_tokens" in line


SCRAPE = """# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {w}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {r}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} 0.5
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="m",engine="0"}} {p}
vllm:num_preemptions_total{{model_name="m",engine="1"}} 1
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="257"}} 1.0
"""


def test_metrics_scrapes_reach_the_run_as_benchs_sampler_records_them(tmp_path):
    epoch = 1_764_000_000.0
    rows = client_rows(rate=4.0)
    src = write_jsonl(tmp_path / "m.jsonl", rows)
    end = rows[-1]["sent"] + 0.2
    ts = [-1.0, *np.arange(0.0, end + 0.5, 0.5).tolist()]
    # '# time T' lines on the requests' clock, and the same scrapes with the exposition's timestamps
    text = "".join(f"# time {t!r}\n" + SCRAPE.format(w=3, r=2, p=10 + k) for k, t in enumerate(ts))
    (tmp_path / "m.prom").write_text(text)
    stamped = "".join("\n".join(ln + (f" {int(round((epoch + t) * 1000))}" if ln and not ln.startswith("#") else "")
                                for ln in SCRAPE.format(w=3, r=2, p=10 + k).splitlines()) + "\n"
                      for k, t in enumerate(ts))
    (tmp_path / "m.stamped").write_text(stamped)
    for name, extra in (("m.prom", ()), ("m.stamped", ("--time-zero", repr(epoch)))):
        run = tmp_path / name.replace(".", "_")
        code, out, err = run_cli("import", "jsonl", src, "--out", run, "--map", PLAIN + ",itl_s=gaps", *FINISHED,
                                 "--metrics",
                                 tmp_path / name, "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
                                 "--warmup", "0", *extra, "--json")
        assert code == 0, (name, err)
        s = json.loads(out)
        # preemptions summed over the engines, as a scrape's are, grown by one a scrape, over the run's
        # scrapes: from the last one before the first send (at 0) on; the one at -1 s is another time's
        assert s["server_counters"]["preemptions"] == len(ts) - 2, name
        assert s["mean_num_waiting"] == pytest.approx(3.0) and s["mean_num_running"] == pytest.approx(2.0)
        assert (run / "metrics.parquet").exists() and (run / "timeseries.parquet").exists()
        assert json.loads((run / "server.json").read_text())["M_usable"] == 256 * 16
    # validate puts the server's preemptions beside the simulated ones
    code, _, err = run_cli("calibrate", tmp_path / "m_prom", "-o", tmp_path / "c.yaml")
    assert code == 0, err
    code, out, err = run_cli("validate", tmp_path / "m_prom", "--calibration", tmp_path / "c.yaml", "--drift", "0",
                             "--json")
    assert code == 0, err
    pre = next(r for r in json.loads(out)["rows"] if r["quantity"] == "preemptions")
    assert pre["measured"] == len(ts) - 2
    # samples on another clock than the requests' (epoch stamps, relative requests): one line
    code, _, err = run_cli("import", "jsonl", src, "--out", tmp_path / "x", "--map", PLAIN, *FINISHED,
                           "--metrics", tmp_path / "m.stamped")
    assert code == 2 and "--time-zero" in one_error_line(err)


def test_an_import_gets_a_bench_runs_warm_up_by_default(tmp_path):
    from llmqueue.bench.options import RUN_WARMUP_S

    src = write_jsonl(tmp_path / "w.jsonl", client_rows(n=200, rate=4.0))  # about 50 s
    code, out, err = run_cli("import", "jsonl", src, "--out", tmp_path / "r", "--map", PLAIN, *FINISHED, "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["warmup_s"] == RUN_WARMUP_S == 15.0 and s["imported"]["warmup_s"] == 15.0
    assert any("first 15 s left out" in n for n in s["notes"])


def test_calibrate_names_imports_own_flags_for_a_missing_setting(tmp_path):
    src = write_jsonl(tmp_path / "e.jsonl", client_rows())
    assert run_cli("import", "jsonl", src, "--out", tmp_path / "r", "--map", PLAIN, *FINISHED).code == 0
    code, _, err = run_cli("calibrate", tmp_path / "r", "-o", tmp_path / "c.yaml", "--capacity-tokens", "4096")
    line = one_error_line(err)
    assert code == 2 and "--max-num-seqs N (or --server-log FILE) to import" in line and "bench" not in line
    code, _, err = run_cli("calibrate", tmp_path / "r", "-o", tmp_path / "c.yaml", "--capacity-tokens", "4096",
                           "--max-num-seqs", "8", "--max-num-batched-tokens", "256")
    line = one_error_line(err)
    assert code == 2 and "--map chunk_times=COLUMN" in line and "--server-log" in line and "bench" not in line
