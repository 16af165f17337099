"""The frontend delay from an ordinary low-load run and its step log (issue 17, item 5).

The runs are simulated, then given a known frontend: each request reaches the engine
``D_IN`` after its send and its tokens reach the client ``D_OUT`` after the engine made them
(each +-0.5 ms of jitter), and the step log is stamped ``LOG_LATE`` late, as vLLM's API server
stamps it. No request is alone at the server, so the isolated-request probe cannot serve.
"""

from __future__ import annotations

import json

import numpy as np
from _cli import run_cli

D_IN, D_OUT, LOG_LATE = 0.003, 0.002, 0.1
STEP = "linear:c0=0.008:prefill=2e-5:decode=1e-4:ctx=0"


def low_load_run(path, *, rate="poisson:4", seed=3, steps=True):
    """A simulated run of 200 requests of 80 output tokens at 4 req/s (about 3 in flight, the
    engine never idle while one is), rewritten as a client and a server log would see it."""
    from llmqueue.records import RequestRecords, StepRecords, read_run, write_records

    assert run_cli("simulate", "--arrival", rate, "--prompt", "uniform:100:3000", "--output", "fixed:80",
                   "--num-requests", "200", "--capacity-tokens", "400000", "--step-time", STEP,
                   "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--seed", str(seed),
                   "--out", str(path), "--no-progress", "--json").code == 0
    run = read_run(path)
    q = run.requests.to_dict()
    rng = np.random.default_rng(seed)
    n = len(q["arrival_s"])
    send = np.asarray(q["arrival_s"]) - D_IN - rng.uniform(-5e-4, 5e-4, n)
    late = D_OUT + rng.uniform(-5e-4, 5e-4, n)
    q.update(arrival_s=send, dispatched_s=send, first_token_s=np.asarray(q["first_token_s"]) + late,
             finish_s=np.asarray(q["finish_s"]) + late, first_scheduled_s=np.full(n, np.nan))
    write_records(path / "requests.parquet", RequestRecords.from_columns(q))
    s = run.steps.to_dict()
    late_log = {**s, "start_s": np.asarray(s["start_s"]) + LOG_LATE}
    write_records(path / "steps.parquet", StepRecords.from_columns(late_log))
    if not steps:  # a client's per-token times instead (evenly spaced, first to last token)
        import pyarrow as pa
        import pyarrow.parquet as pq

        from llmqueue.bench.recorder import token_schema

        (path / "steps.parquet").unlink()
        ok = np.flatnonzero(q["status"] == "ok")
        k = np.asarray(q["output_tokens"])[ok]
        t = np.concatenate([np.linspace(q["first_token_s"][i], q["finish_s"][i], m) for i, m in zip(ok, k)])
        pq.write_table(pa.table({"request_id": np.repeat(np.asarray(q["request_id"])[ok], k),
                                 "attempt": np.repeat(np.asarray(q["attempt"])[ok], k),
                                 "index": np.concatenate([np.arange(m) for m in k]), "t_s": t},
                                schema=token_schema()), path / "tokens.parquet")
    return path


def test_step_log_estimate_recovers_the_frontend_delay(tmp_path):
    from llmqueue.bench.calibrate import _alone
    from llmqueue.bench.frontend_steps import frontend_from_steps
    from llmqueue.records import read_run

    run = read_run(low_load_run(tmp_path / "run"))
    r = run.requests
    assert not _alone(np.asarray(r["dispatched_s"]), np.asarray(r["finish_s"])).any()  # no probe possible
    fe = frontend_from_steps(r, run.steps, max_num_seqs=64)
    true = D_IN + D_OUT
    assert fe["samples"] >= 100
    assert abs(fe["frontend_latency_s"] - true) < 0.1 * true
    assert fe["ci"][0] <= true <= fe["ci"][1]
    assert abs(fe["clock_offset_s"] - (LOG_LATE - D_OUT)) < 1e-3
    # the engine's wait for the step in progress matters: TTFT less the prefill steps alone (no
    # wait taken out) would put about 4 ms more on the frontend
    naive = float(np.median(fe["d_s"] + fe["wait_s"]))
    assert naive - true > 0.5 * true


def test_calibrate_uses_the_step_log_and_a_low_load_run_stands_in_for_the_probe(tmp_path):
    run = low_load_run(tmp_path / "run")
    cal = run_cli("calibrate", str(run), "-o", str(tmp_path / "cal.yaml"), "--json").json()
    assert abs(cal["frontend_latency_s"] - 0.005) < 0.0005
    assert cal["frontend_source"].startswith("step log: ")
    assert any("low-load requests against the step log" in n for n in cal["notes"])
    # a run without a step log: today's behaviour (no frontend delay), and a note would not lie
    bare = low_load_run(tmp_path / "bare", steps=False)
    ran = run_cli("calibrate", str(bare), "-o", str(tmp_path / "c2.yaml"), "--json")
    code = ran.code
    assert code == 0
    assert json.loads(ran.out)["frontend_latency_s"] is None
    # --probe with a low-load run whose requests were never alone: its step log stands in
    c3 = run_cli("calibrate", str(run), "-o", str(tmp_path / "c3.yaml"), "--probe", str(run), "--json").json()
    assert abs(c3["frontend_latency_s"] - 0.005) < 0.0005 and str(run) in c3["frontend_source"]
    # ... and without a step log the probe's one-line error stands
    code, _, err = run_cli("calibrate", str(run), "-o", str(tmp_path / "c4.yaml"), "--probe", str(bare))
    assert code == 2 and "alone at the server" in err and len(err.strip().splitlines()) == 1


def test_a_saturated_run_gives_no_step_log_estimate(tmp_path):
    """Requests that waited in the queue cannot be placed: a run far over capacity leaves too
    few to estimate from, and says so (it does not put the queue's wait on the frontend)."""
    from llmqueue.bench.frontend_steps import describe, frontend_from_steps
    from llmqueue.records import read_run

    run = read_run(low_load_run(tmp_path / "sat", rate="poisson:400", seed=5))
    fe = frontend_from_steps(run.requests, run.steps, max_num_seqs=64)
    assert fe["frontend_latency_s"] is None and fe["samples"] < 10
    assert "could be placed" in describe(fe)
