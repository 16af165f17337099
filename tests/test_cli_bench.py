"""``llmqueue bench`` against the stub server (loopback only): summary keys, files, errors, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.bench.stub_server import StubServer
from llmqueue.records import is_complete, read_records


@pytest.fixture(scope="module")
def stub():
    with StubServer(token_delay_s=0.001) as s:
        yield s


WL = ("--arrival", "poisson:100", "--prompt", "uniform:4:40", "--output", "uniform:1:6", "--num-requests", "40")


def test_json_summary_has_vllm_names_and_files(stub, tmp_path):
    out_dir = tmp_path / "run"
    seen = stub.stats()["requests"]
    code, out, err = run_cli("bench", "--url", stub.url, "--model", stub.model, *WL, "--seed", "3",
                             "--out", str(out_dir), "--json", "--no-progress", "--warmup-requests", "2")
    assert code == 0, err
    s = json.loads(out)
    for key in ("completed", "failed", "request_throughput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "duration", "verdict", "status_counts"):
        assert key in s, key
    assert s["completed"] == 40 and s["status_counts"]["ok"] == 40
    assert stub.stats()["requests"] - seen == 42  # two warm-up requests, not recorded
    assert s["bench"]["model"] == stub.model and s["bench"]["load"] == "open-loop"
    assert "lag_ms" in s["client"] and "ks_gaps" in s["client"]
    for f in ("requests.parquet", "tokens.parquet", "workload.parquet", "summary.json"):
        assert (out_dir / f).exists(), f
    r = read_records(out_dir)
    assert len(r) == 40 and set(r["status"]) == {"ok"}
    # the same workload flags as simulate: the same seed gives the same intended stream
    from llmqueue.workload import Workload

    want = Workload("poisson:100", prompt="uniform:4:40", output="uniform:1:6").generate(seed=3, n=40)
    o = np.argsort(r["request_id"])
    assert np.array_equal(r["arrival_s"][o], want.arrival_s)
    assert np.array_equal(r["prompt_tokens"][o], want.prompt_tokens)


def test_table_and_model_from_the_server(stub, tmp_path):
    code, out, err = run_cli("bench", "--url", stub.url, *WL, "--out", str(tmp_path / "t"), "--no-progress",
                             "--endpoint", "chat")
    assert code == 0, err
    assert "Benchmark" in out and "client check" in out and "mean / p99 TTFT (ms), from the send (vLLM)" in out and "from the intended send time" in out
    assert f"model {stub.model}" in out  # asked /v1/models


def test_scenario_with_concurrency_is_closed_loop(stub, tmp_path):
    code, out, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--scenario", "chat",
                             "--duration", "2", "--concurrency", "2", "--out", str(tmp_path / "s"), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["bench"]["closed_loop"] is True and s["max_concurrency"] == 2
    assert s["completed"] == s["arrivals"] > 0
    assert "client_queue_ms" in s["client"]


def test_retries_from_the_command_line(tmp_path):
    with StubServer(reject_fraction=0.5, seed=5) as s:
        code, out, err = run_cli("bench", "--url", s.url, "--model", "m", *WL, "--max-attempts", "3",
                                 "--out", str(tmp_path / "r"), "--json")
        seen = s.stats()["requests"]
    assert code == 0, err
    summ = json.loads(out)
    r = read_records(tmp_path / "r")
    assert summ["attempts"] == len(r) == seen > 40
    assert r["attempt"].max() > 1 and r["attempt"].max() <= 3


def test_scenario_with_arrival_flag_sends_at_that_rate(stub, tmp_path):
    """--arrival with --scenario replaces the scenario's arrival process (chat: 5.5 req/s)."""
    code, out, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--scenario", "chat",
                             "--arrival", "deterministic:10", "--duration", "2", "--out", str(tmp_path / "s"), "--json")
    assert code == 0, err
    r = read_records(tmp_path / "s")
    first = r["arrival_s"][r["attempt"] == 1]
    assert 19 <= len(first) <= 20 and np.allclose(np.diff(np.sort(first)), 0.1)


@pytest.mark.parametrize("args, flag", [
    (("--arrival", "poisson:x", "--prompt", "fixed:4", "--output", "fixed:1", "--num-requests", "3"), "--arrival"),
    (("--arrival", "poisson:5", "--prompt", "fixed:4", "--num-requests", "3"), "--output"),
    (("--arrival", "poisson:5", "--prompt", "fixed:4", "--output", "fixed:1"), "--num-requests"),
    (("--scenario", "mixed", "--prompt", "fixed:4"), "--prompt"),   # several classes: no single length to set
    (("--scenario", "chat", "--trace", "t.csv"), "--trace"),
    (WL + ("--concurrency", "0"), "--concurrency"),
    (WL + ("--timeout", "-1"), "--timeout"),
])
def test_bad_input_is_one_line_exit_2(stub, args, flag):
    code, out, err = run_cli("bench", "--url", stub.url, "--model", "m", *args)
    assert code == 2
    assert err.startswith(f"llmqueue: error: {flag}") and err.count("\n") == 1, err


def test_missing_url_and_refused_connection():
    code, _, err = run_cli("bench", *WL)
    assert code == 2 and err.startswith("llmqueue: error:") and "--url" in err
    with StubServer() as s:
        url = s.url
    code, _, err = run_cli("bench", "--url", url, "--model", "m", *WL)
    assert code == 2
    assert err.startswith("llmqueue: error: --url: cannot connect to") and "connection refused" in err
    assert err.count("\n") == 1


def test_server_dies_mid_run_exit_1(tmp_path):
    out_dir = tmp_path / "dead"
    with StubServer(die_after=25, token_delay_s=0.001) as s:
        code, out, err = run_cli("bench", "--url", s.url, "--model", "m", "--arrival", "poisson:200",
                                 "--prompt", "fixed:8", "--output", "fixed:2", "--num-requests", "200",
                                 "--out", str(out_dir))
    assert code == 1
    assert "stopped accepting connections" in err and "written to" in err
    assert "Benchmark" in out and "requests not sent" in out
    r = read_records(out_dir)
    assert 20 <= int((r["status"] == "ok").sum()) <= 25
    assert json.loads((out_dir / "summary.json").read_text())["not_sent"] == 200 - len(r)


def test_sigterm_keeps_the_records(tmp_path):
    out_dir = tmp_path / "term"
    with StubServer(token_delay_s=0.05) as s:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen([sys.executable, "-m", "llmqueue.cli.main", "bench", "--url", s.url, "--model", "m",
                              "--arrival", "deterministic:20", "--prompt", "fixed:4", "--output", "fixed:10",
                              "--duration", "30", "--out", str(out_dir), "--no-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 20
        while not (out_dir / "requests.parquet.journal").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # some requests finished, some in flight
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "interrupted" in err
    r = read_records(out_dir)
    assert is_complete(out_dir / "requests.parquet") is False
    assert (r["status"] == "ok").sum() > 0 and (r["status"] == "unfinished").sum() > 0
    assert np.isnan(r["finish_s"][r["status"] == "unfinished"]).all()
    assert not (out_dir / "requests.parquet.journal").exists()


def test_sigkill_keeps_every_written_batch(tmp_path):
    """A client killed outright (SIGKILL: no handler runs, no file is closed) leaves every batch
    it wrote readable: the records and their token times, as written once a second."""
    out_dir = tmp_path / "kill"
    with StubServer(token_delay_s=0.02) as s:
        p = subprocess.Popen([sys.executable, "-m", "llmqueue.cli.main", "bench", "--url", s.url, "--model", "m",
                              "--arrival", "deterministic:20", "--prompt", "fixed:4", "--output", "fixed:10",
                              "--duration", "30", "--out", str(out_dir), "--no-progress"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        journal = out_dir / "requests.parquet.journal"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not journal.exists() or journal.stat().st_size < 2000):
            time.sleep(0.1)  # until a flush with records has reached the journal
        p.kill()
        _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL, err
    assert not (out_dir / "requests.parquet").exists() and not (out_dir / "summary.json").exists()
    r = read_records(out_dir)
    assert len(r) > 0 and (r["status"] == "ok").all()  # only finished attempts are written
    assert is_complete(out_dir / "requests.parquet") is False
    from llmqueue.records import finish_run
    from llmqueue.records.journal import read_table

    tok = read_table(out_dir / "tokens.parquet").to_pydict()
    # every written record has its ten chunk times (a token batch is written before its records,
    # so a kill between the two writes can leave one batch of times whose records never came)
    per = {}
    for rid in tok["request_id"]:
        per[rid] = per.get(rid, 0) + 1
    assert set(r["request_id"].tolist()) <= set(per) and all(n == 10 for n in per.values())
    assert len(per) - len(r) <= 25  # at most one flush (a second of 20 req/s) ahead
    assert {p.name for p in finish_run(out_dir)} == {"requests.parquet", "tokens.parquet"}
    assert len(read_records(out_dir / "requests.parquet")) == len(r)


def _step_line(t: float | None, i: int) -> str:
    stamp = "" if t is None else f"{t:.6f} "
    return (f"{stamp}(APIServer pid=7) INFO 11-26 06:09:32 [loggers.py:199] Engine 000: Iteration({i}): "
            "1 context requests, 20 context tokens, 3 generation requests, 3 generation tokens, "
            "iteration elapsed time: 5.00 ms, CPU KV cache usage: 25.0%\n")


def _bench_while_logging(stub, out_dir, log, *, stamped: bool):
    """``llmqueue bench --server-log LOG`` while a thread appends step lines to LOG (as vLLM
    does while it serves), with or without the epoch prefix."""
    import threading

    stop = threading.Event()

    def server_logs():
        i = 100
        with open(log, "a") as f:
            while not stop.is_set():
                f.write(_step_line(time.time() if stamped else None, i))
                f.flush()
                i += 1
                time.sleep(0.005)

    th = threading.Thread(target=server_logs)
    th.start()
    try:
        return run_cli("bench", "--url", stub.url, "--model", stub.model, *WL, "--out", str(out_dir),
                       "--server-log", str(log), "--json", "--no-progress")
    finally:
        stop.set()
        th.join()


def test_server_log_becomes_step_records(stub, tmp_path):
    """--server-log: the per-step lines the server logs while the run goes become steps.parquet
    (on the run's clock); lines from before the run are left out; a log without sub-second time
    stamps is a note, not a failure; a missing file is a one-line error (exit 2)."""
    log = tmp_path / "vllm.log"
    log.write_text("".join(_step_line(time.time() - 100 + k, k) for k in range(5)))  # an earlier run
    code, out, err = _bench_while_logging(stub, tmp_path / "run", log, stamped=True)
    assert code == 0, err
    s = json.loads(out)
    from llmqueue.records import read_steps

    steps = read_steps(tmp_path / "run" / "steps.parquet")
    assert s["bench"]["server_log_steps"] == len(steps) > 5
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["bench"]["server_log_steps"] == len(steps)
    assert steps["step"].min() >= 100  # the earlier run's lines are not this run's
    end = steps["start_s"] + steps["duration_s"]
    assert end.min() >= 0 and end.max() <= s["bench"]["t_end_s"] + 1.0
    assert set(steps["prefill_tokens"]) == {20} and set(steps["decode_seqs"]) == {3}
    # vLLM's own stamp has whole seconds: no cycle can be measured, so no steps and a note
    coarse = tmp_path / "coarse.log"
    coarse.write_text("")
    code, out, err = _bench_while_logging(stub, tmp_path / "run2", coarse, stamped=False)
    assert code == 0 and "whole-second" in err and "VLLM_LOGGING_PREFIX" in err
    assert not (tmp_path / "run2" / "steps.parquet").exists()
    code, out, err = run_cli("bench", "--url", stub.url, "--model", stub.model, *WL, "--out",
                             str(tmp_path / "run3"), "--server-log", str(tmp_path / "missing.log"), "--no-progress")
    assert code == 2 and "server_log" in err and len(err.strip().splitlines()) == 1


def test_wait_for_steps_returns_once_the_last_answers_step_is_logged(tmp_path):
    """vLLM logs a step after streaming it: the log is read once a step stamped after the last
    answer is there (a half-written line does not count); a server that logs nothing more is
    waited for ``quiet_s``, one that keeps logging older steps for ``timeout_s``."""
    import threading

    from llmqueue.bench.steplog import steps_from_log, wait_for_steps

    log = tmp_path / "vllm.log"
    log.write_text("".join(_step_line(time.time() - 50 + k, k) for k in range(3)))
    offset = log.stat().st_size
    after = time.time()
    written = {}

    def late_line():
        time.sleep(0.3)
        line = _step_line(time.time(), 7)
        with open(log, "a") as f:
            f.write(line[:40])
            f.flush()
            time.sleep(0.2)
            written["t"] = time.monotonic()
            f.write(line[40:])

    th = threading.Thread(target=late_line)
    th.start()
    assert wait_for_steps(log, offset=offset, after_epoch_s=after, quiet_s=3.0, timeout_s=10.0)
    assert time.monotonic() >= written["t"]  # not before the whole line was there
    th.join()
    steps, note = steps_from_log(log, offset=offset, t0_epoch_s=after - 1.0)
    assert note is None and list(steps["step"]) == [7]
    t = time.monotonic()
    assert not wait_for_steps(log, offset=log.stat().st_size, after_epoch_s=time.time(), quiet_s=0.2,
                              timeout_s=60.0)
    assert time.monotonic() - t < 30.0  # quiet for 0.2 s: gave up long before the 60-s cap


def test_trace_replay_builds_prompts_from_prefix_hashes(stub, tmp_path):
    """A Mooncake trace: its hash ids reach the client (--no-prefix-hashes turns them off)."""
    lines = []
    for i in range(12):
        hashes = [0, 1] + [100 + i] if i % 2 == 0 else [0, 2]
        lines.append(json.dumps({"timestamp": 50 * i, "input_length": len(hashes) * 64 - 7, "output_length": 3,
                                 "hash_ids": hashes}))
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    base = ["bench", "--url", stub.url, "--model", stub.model, "--trace", str(trace), "--prefix-block-tokens", "64",
            "--json", "--no-progress"]
    code, out, err = run_cli(*base, "--out", str(tmp_path / "on"))
    assert code == 0, err
    s = json.loads(out)
    assert s["completed"] == 12 and s["bench"]["prefix_hashes"] == {"block_tokens": 64, "requests": 12}
    r = read_records(tmp_path / "on")
    assert sorted(r["prompt_tokens"]) == sorted(len(h) * 64 - 7 for h in ([0, 1, 9], [0, 2]) for _ in range(6))
    # the run keeps the hashes beside its workload, for validate's simulation
    from llmqueue.bench.recorder import load_requests_parquet
    from llmqueue.bench.replay import measured_hashes

    stream = load_requests_parquet(tmp_path / "on" / "workload.parquet")
    hashes, H = measured_hashes(tmp_path / "on", stream)
    assert H == 64 and hashes == [[0, 1, 100 + i] if i % 2 == 0 else [0, 2] for i in range(12)]
    code, out, err = run_cli(*base, "--no-prefix-hashes", "--out", str(tmp_path / "off"))
    assert code == 0, err
    assert json.loads(out)["bench"]["prefix_hashes"] is None
    assert measured_hashes(tmp_path / "off", stream) == (None, 0)
    code, out, err = run_cli(*base, "--prefix-block-tokens", "0", "--out", str(tmp_path / "bad"))
    assert code == 2 and "--prefix-block-tokens" in err and "Traceback" not in err


_REASONS = {"negative-usage": "invalid usage.completion_tokens (not an integer in [0, 2^63))",
            "huge-usage": "invalid usage.completion_tokens (not an integer in [0, 2^63))",
            "usage-type": "invalid usage.completion_tokens (not an integer in [0, 2^63))",
            "choices-type": "malformed chunk: choices is not a list",
            "long-line": "SSE line over 8388608 bytes"}


@pytest.mark.parametrize("mode", ["negative-usage", "huge-usage", "usage-type", "choices-type", "long-line",
                                  "over-max-tokens"])
def test_a_hostile_server_loses_no_finished_request(tmp_path, mode):
    """Whatever a server answers, every request it answered is on disk with a status, the run goes
    on and exits 0, and the summary counts the failures by reason. Before: a usage count of -1
    ended the run (exit 2, 7 of 20 kept, no summary.json); one above int64 lost its request
    (OverflowError, '19 arrived'); a wrong-typed ``choices`` printed asyncio tracebacks; 3x
    max_tokens passed unremarked."""
    out_dir = tmp_path / mode
    with StubServer(token_delay_s=0.001, misbehave=mode, misbehave_fraction=0.4, seed=3) as s:
        code, out, err = run_cli("bench", "--url", s.url, "--model", "m", "--arrival", "poisson:100",
                                 "--prompt", "fixed:8", "--output", "fixed:4", "--num-requests", "20",
                                 "--out", str(out_dir), "--json", "--no-progress")
        st = s.stats()
    assert code == 0, err
    assert err == ""  # no traceback, no note
    bad = st["misbehaved"]
    assert 0 < bad < 20 and st["requests"] == 20
    r = read_records(out_dir)
    assert is_complete(out_dir / "requests.parquet")
    assert len(r) == st["requests"] and sorted(r["request_id"]) == list(range(20))
    summ = json.loads(out)
    assert json.loads((out_dir / "summary.json").read_text())["status_counts"] == summ["status_counts"]
    if mode == "over-max-tokens":
        # kept as ok with the server's count, and counted as a warning with a note
        assert (r["status"] == "ok").all()
        assert int((r["output_tokens"] == 12).sum()) == bad and int((r["output_tokens"] == 4).sum()) == 20 - bad
        assert summ["warnings"] == {"more output tokens than max_tokens": bad}
        assert any("more output tokens than max_tokens" in n and "3x" in n for n in summ["notes"])
        assert summ["total_output_tokens"] == 4 * 20 + 8 * bad
    else:
        err_rows = r["status"] == "error"
        assert int(err_rows.sum()) == bad and int((r["status"] == "ok").sum()) == 20 - bad
        assert summ["failed"] == bad and summ["completed"] == 20 - bad
        assert summ["errors"] == {_REASONS[mode]: bad}
        assert summ["warnings"] == {}
        # recorded with what the client saw: the prompt sent and the chunks counted
        assert (r["prompt_tokens"] == 8).all() and (r["output_tokens"][err_rows] <= 4).all()


def test_a_full_disk_stops_the_run_in_one_line_and_keeps_what_was_written(tmp_path, monkeypatch):
    """ENOSPC while writing the records: the run stops (exit 1) with one line saying how many
    records are on disk, and those stay readable with their token times. Before: a traceback."""
    import errno

    from llmqueue.records.journal import ParquetJournal

    real = ParquetJournal.write_table
    seen = {"requests": 0}

    def write_table(self, table, row_group_size=None):
        if self.path.name == "requests.parquet":
            if seen["requests"] == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            seen["requests"] += 1
        real(self, table, row_group_size)

    monkeypatch.setattr(ParquetJournal, "write_table", write_table)
    out_dir = tmp_path / "full"
    with StubServer(token_delay_s=0.001) as s:
        code, out, err = run_cli("bench", "--url", s.url, "--model", "m", "--arrival", "deterministic:40",
                                 "--prompt", "fixed:4", "--output", "fixed:2", "--duration", "10",
                                 "--out", str(out_dir), "--no-progress")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"llmqueue: error: cannot write records to {out_dir} (No space left on device) at t =")
    assert "Benchmark" in out  # the report is still printed
    import re

    n = int(re.search(r"(\d+) attempt record\(s\) written", lines[0]).group(1))
    r = read_records(out_dir)
    assert len(r) == n > 0 and (r["status"] == "ok").all() and len(np.unique(r["request_id"])) == n
    assert n < 400 and is_complete(out_dir / "requests.parquet") is False
    from llmqueue.records.journal import read_table

    tok = read_table(out_dir / "tokens.parquet").to_pydict()
    assert set(r["request_id"].tolist()) <= set(tok["request_id"])
