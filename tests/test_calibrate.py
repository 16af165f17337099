"""Calibrate and validate on simulated runs, where the truth is known."""

import json

import pytest
from _cli import run_cli


def _sim(tmp_path, name, step, extra=()):
    out = tmp_path / name
    assert run_cli("simulate", "--capacity-tokens", "20000", "--step-time", step, "--prompt", "uniform:10:400",
                   "--output", "uniform:10:200", "--arrival", "poisson:12", "--duration", "400", "--out", str(out),
                   "--no-progress", "--json", *extra).code == 0
    return out


def _probe(tmp_path, step: str, rate: float):
    """A simulated probe run (30 requests, 4 output tokens, ``rate`` per second) and its
    request columns."""
    import numpy as np
    import pyarrow.parquet as pq

    probe = tmp_path / "probe"
    assert run_cli("simulate", "--capacity-tokens", "20000", "--step-time", step, "--prompt", "uniform:10:200",
                   "--output", "fixed:4", "--arrival", f"deterministic:{rate:g}", "--num-requests", "30",
                   "--out", str(probe), "--no-progress", "--json").code == 0
    t = pq.read_table(probe / "requests.parquet").to_pydict()
    return probe, {k: np.asarray(v) for k, v in t.items()}


def test_calibrate_recovers_the_step_model_and_capacity(tmp_path):
    run = _sim(tmp_path, "lin", "linear:c0=0.01:prefill=2e-5:decode=3e-4")
    cal = tmp_path / "cal.yaml"
    d = run_cli("calibrate", str(run), "-o", str(cal), "--json").json()
    assert d["capacity_tokens"] == 20000  # from the run's summary (block-rounded M)
    lin = d["linear"]
    assert lin["c0"] == pytest.approx(0.01, rel=1e-6)
    assert lin["prefill"] == pytest.approx(2e-5, rel=1e-6)
    assert lin["decode"] == pytest.approx(3e-4, rel=1e-6)
    assert lin["r2"] > 0.999999
    # validating the run against its own calibrated linear model reproduces it exactly
    v = run_cli("validate", str(run), "--calibration", str(cal), "--step-model", "linear", "--json").json()
    for r in v["rows"]:
        if r["measured"] is not None:
            assert r["rel_err_sim"] == pytest.approx(0.0, abs=1e-9), r


def test_constant_step_calibration_predicts_capacity(tmp_path):
    run = _sim(tmp_path, "sat", "0.03", ["--arrival", "poisson:60"])
    cal = tmp_path / "cal.yaml"
    d = run_cli("calibrate", str(run), "-o", str(cal), "--json").json()
    assert d["b"] == pytest.approx(0.03)
    v = run_cli("validate", str(run), "--calibration", str(cal), "--json").json()
    assert v["saturated"]
    cap = v["capacity"]
    assert abs(cap["rel_err_sim"]) < 1e-9          # the same simulator with the same inputs
    assert abs(cap["rel_err_theory"]) < 0.10       # seed 004's bar for the closed form


def test_calibrate_errors(tmp_path):
    assert run_cli("calibrate", str(tmp_path / "nope")).code == 2


def test_step_cycles_count_the_time_between_steps_and_skip_idle_gaps():
    import numpy as np

    from llmqueue.bench.calibrate import calibrate, step_cycles  # noqa: F401

    # five busy steps 30 ms long with 4 ms between them, an idle second, two more steps; then a
    # simulator-style row of 10 steps 0.02 s each
    start = [0.0, 0.034, 0.068, 0.102, 0.136, 1.5, 1.534, 1.568]
    dur = [0.03] * 8
    steps = {"start_s": np.array(start), "duration_s": np.array(dur)}
    mask, cyc, k = step_cycles(steps)
    assert mask.tolist() == [True, True, True, True, False, True, True, False]
    assert np.allclose(cyc[mask], 0.034)
    mask, cyc, k = step_cycles(steps, window=(0.05, 2.0))
    assert mask.tolist() == [False, False, True, True, False, True, True, False]
    sim = {"start_s": np.array([0.0, 0.2, 0.23]), "duration_s": np.array([0.2, 0.03, 0.03]),
           "steps": np.array([10, 1, 1])}
    mask, cyc, k = step_cycles(sim)
    assert mask.tolist() == [True, True, False] and np.allclose(cyc[:2], [0.02, 0.03])


def test_cycle_estimator_and_window(tmp_path):
    run = _sim(tmp_path, "lin", "linear:c0=0.01:prefill=2e-5:decode=3e-4", ["--arrival", "poisson:40"])
    cal = tmp_path / "cal.yaml"
    d = run_cli("calibrate", str(run), "-o", str(cal), "--from", "50", "--to", "300", "--json").json()
    assert d["b_estimator"] == "cycle"
    # the simulator runs steps back to back: the mean cycle is the mean step time in the window
    import numpy as np

    from llmqueue.records import read_run

    st = read_run(run).steps
    k = np.asarray(st["steps"], float)
    w = (np.asarray(st["start_s"]) >= 50) & (np.asarray(st["start_s"]) < 300)
    want = np.asarray(st["duration_s"])[w].sum() / k[w].sum()
    assert d["b"] == pytest.approx(want, rel=0.02)
    assert d["b_estimators"]["median"] != d["b"]
    ran = run_cli("calibrate", str(run), "-o", str(cal), "--estimator", "median", "--json")
    assert ran.code == 0
    assert json.loads(ran.out)["b_estimator"] == "median"
    ran = run_cli("calibrate", str(run), "-o", str(cal), "--from", "10", "--to", "5")
    assert ran.code == 2
    assert "--to" in ran.err


def test_frontend_latency_is_recovered_from_isolated_requests(tmp_path):
    """A probe run whose every token reached the client 12 ms after the engine made it: the
    calibration finds the 12 ms, and validate adds it to TTFT and E2EL but not to TPOT."""

    from llmqueue.bench.calibrate import calibrate, frontend_latency
    from llmqueue.bench.validate import validate
    from llmqueue.records import RequestRecords, write_records

    step = "linear:c0=0.01:prefill=2e-4:decode=1e-3"
    probe, cols = _probe(tmp_path, step, 2)
    cols["first_token_s"] = cols["first_token_s"] + 0.012
    cols["finish_s"] = cols["finish_s"] + 0.012
    write_records(probe / "requests.parquet", RequestRecords.from_columns(cols))
    cal = calibrate(probe, capacity_tokens=20000).to_dict()
    fl = frontend_latency(probe, cal)
    assert fl["frontend_latency_s"] == pytest.approx(0.012, abs=1e-6) and fl["samples"] == 30
    assert fl["method"] == "step log"
    # a step model twice as slow on prefill: the step log still finds 12 ms; without the log,
    # the model's error lands on the frontend (about -20 ms on a 100-token prompt: clamped to 0)
    off = dict(cal, step_time_linear="linear:c0=0.01:prefill=4e-4:decode=1e-3")
    assert frontend_latency(probe, off)["frontend_latency_s"] == pytest.approx(0.012, abs=1e-6)
    (probe / "steps.parquet").rename(tmp_path / "steps.parquet")
    assert frontend_latency(probe, cal)["method"] == "step model"
    assert frontend_latency(probe, cal)["frontend_latency_s"] == pytest.approx(0.012, abs=1e-6)
    assert frontend_latency(probe, off)["frontend_latency_s"] == pytest.approx(0.0, abs=1e-9)  # clamped: model too slow
    (tmp_path / "steps.parquet").rename(probe / "steps.parquet")
    # validate the shifted run: with the delay the simulated latencies match, without it TTFT is short
    cal["frontend_latency_s"] = fl["frontend_latency_s"]
    with_f = {r["quantity"]: r for r in validate(probe, cal, step_model="linear", horizon_s=30)["rows"]}
    without = {r["quantity"]: r for r in validate(probe, cal, step_model="linear", frontend=False, horizon_s=30)["rows"]}
    assert abs(with_f["median_ttft_ms"]["rel_err_sim"]) < 1e-6
    assert without["median_ttft_ms"]["simulated"] == pytest.approx(with_f["median_ttft_ms"]["simulated"] - 12, abs=1e-6)
    assert with_f["median_tpot_ms"]["simulated"] == pytest.approx(without["median_tpot_ms"]["simulated"])
    out = tmp_path / "cal.yaml"
    ran = run_cli("calibrate", str(probe), "-o", str(out), "--probe", str(probe), "--json")
    assert ran.code == 0
    import json as _json
    assert _json.loads(ran.out)["frontend_latency_s"] == pytest.approx(0.012, abs=1e-6)


def test_frontend_latency_counts_only_requests_alone_at_the_server(tmp_path):
    """A probe sent faster than the engine serves: requests share steps, and the wait for
    another's prefill is the engine's, not the frontend's. Only the isolated requests count, and
    a probe with fewer than 5 of them is an error that says how far apart to send them."""
    import numpy as np

    from llmqueue.bench.calibrate import _alone, calibrate, frontend_latency
    from llmqueue.errors import InputError
    from llmqueue.records import RequestRecords, write_records

    # [start, finish): 0 and 1 overlap, 2 alone, 3 unfinished (lasts to the end) overlaps 4
    alone = _alone(np.array([0.0, 0.5, 2.0, 3.0, 4.0]), np.array([1.0, 1.5, 2.5, np.nan, 4.5]))
    assert alone.tolist() == [False, False, True, False, False]
    assert _alone(np.array([1.0, 0.0]), np.array([2.0, 1.0])).tolist() == [True, True]  # touching ends

    step = "linear:c0=0.05:prefill=2e-3:decode=1e-3"  # a lone request takes 0.1-0.6 s
    probe, cols = _probe(tmp_path, step, 1)
    cal = calibrate(probe, capacity_tokens=20000).to_dict()
    cal["step_time_linear"] = step
    assert frontend_latency(probe, cal)["overlapping"] == 0
    # every 3rd request 0.9 s late to the client (a slow request, e.g. a GC pause): its interval now
    # covers the next send; the median over the isolated ones stays at the frontend's 12 ms
    late = np.arange(len(cols["finish_s"])) % 3 == 0
    cols["first_token_s"] = cols["first_token_s"] + 0.012 + 0.9 * late
    cols["finish_s"] = cols["finish_s"] + 0.012 + 0.9 * late
    write_records(probe / "requests.parquet", RequestRecords.from_columns(cols))
    fl = frontend_latency(probe, cal)
    assert fl["overlapping"] == 20 and fl["samples"] == 10
    assert fl["frontend_latency_s"] == pytest.approx(0.012, abs=1e-6)
    cols["finish_s"] = cols["finish_s"] + 2.0  # now every request overlaps the next
    write_records(probe / "requests.parquet", RequestRecords.from_columns(cols))
    with pytest.raises(InputError, match="alone at the server.*deterministic:"):
        frontend_latency(probe, cal)


def test_sent_view_and_stream_move_late_sends():
    """A client that sent some requests late: measured latencies count from the send, and the
    replayed stream puts those requests at their send times (in order)."""
    import numpy as np

    from llmqueue.bench.replay import sent_stream, sent_view
    from llmqueue.records import RequestRecords
    from llmqueue.workload.generate import RequestArrays

    n = 4
    arr = np.array([0.0, 1.0, 2.0, 3.0])
    disp = np.array([0.0, 2.5, 2.0, np.nan])  # request 1 sent 1.5 s late; request 3 never sent
    recs = RequestRecords.from_columns(
        request_id=np.arange(n), **{"class": np.array(["default"] * n)}, arrival_s=arr, dispatched_s=disp,
        first_scheduled_s=np.full(n, np.nan), first_token_s=arr + np.array([0.1, 1.6, 0.1, np.nan]),
        finish_s=arr + np.array([0.5, 2.0, 0.5, np.nan]), prompt_tokens=np.full(n, 10), output_tokens=np.full(n, 5),
        cached_prompt_tokens=np.zeros(n, int), status=np.array(["ok", "ok", "ok", "error"]),
        preemptions=np.zeros(n, int), replica=np.zeros(n, int), attempt=np.ones(n, int))
    v = sent_view(recs)
    ttft = v["first_token_s"] - v["arrival_s"]
    assert np.allclose(ttft[:3], 0.1) and v["arrival_s"][3] == 3.0
    stream = RequestArrays(np.arange(n), arr, np.full(n, 10), np.full(n, 5))
    s = sent_stream(stream, recs)
    assert s.request_id.tolist() == [0, 2, 1, 3] and s.arrival_s.tolist() == [0.0, 2.0, 2.5, 3.0]


def test_speed_drift_measures_the_engine_wander_against_the_model():
    import numpy as np

    from llmqueue.bench.calibrate import speed_drift

    # 60 s of back-to-back decode steps of 10 sequences; the model says 20 ms a step, the engine
    # runs at 1.0x in even 10-s windows and 1.2x in odd ones
    lin = {"c0": 0.01, "prefill": 0.0, "decode": 0.001, "ctx": 0.0}
    t, start = 0.0, []
    while t < 60.0:
        start.append(t)
        t += 0.02 * (1.2 if int(t // 10) % 2 else 1.0)
    n = len(start)
    steps = {"start_s": np.array(start), "duration_s": np.full(n, 0.015), "prefill_tokens": np.zeros(n),
             "decode_seqs": np.full(n, 10), "kv_tokens": np.zeros(n)}
    d = speed_drift(steps, lin)
    assert d["windows"] == 6
    assert d["min"] == pytest.approx(1.0, abs=0.01) and d["max"] == pytest.approx(1.2, abs=0.01)
    assert d["sd"] == pytest.approx(np.std([1.0, 1.2] * 3, ddof=1), rel=0.05)
    # an engine exactly at the model's speed does not wander
    steps["start_s"] = np.arange(n) * 0.02
    assert speed_drift(steps, lin)["sd"] == pytest.approx(0.0, abs=1e-9)
    assert speed_drift({k: v[:100] for k, v in steps.items()}, lin) is None  # 2 s: too short


def test_validate_speed_band_covers_an_engine_that_ran_slower(tmp_path):
    """The run's engine was 10 % slower than calibrated: the point prediction misses, the band
    for +-15 % engine speed holds the measured values, a +-2 % band does not hold them all."""
    from llmqueue.bench.calibrate import calibrate
    from llmqueue.bench.validate import validate

    base = "linear:c0=0.01:prefill=2e-5:decode=3e-4"
    ref = _sim(tmp_path, "ref", base, ["--arrival", "poisson:40"])
    run = _sim(tmp_path, "slow", "linear:c0=0.011:prefill=2.2e-5:decode=3.3e-4", ["--arrival", "poisson:10"])
    cal = calibrate(ref).to_dict()
    assert cal["speed_sd"] == pytest.approx(0.0, abs=1e-6)  # a simulated engine keeps its speed
    wide = validate(run, cal, step_model="linear", speed_band=0.15)
    rows = {r["quantity"]: r for r in wide["rows"] if r["measured"]}
    for q in ("median_ttft_ms", "median_tpot_ms", "mean_e2el_ms"):
        r = rows[q]
        assert r["rel_err_sim"] < -0.05, r  # predicted faster than it ran
        assert r["in_band"] and r["band"][0] < r["simulated"] < r["band"][1], r
    narrow = validate(run, cal, step_model="linear", speed_band=0.02)
    assert not all(r["in_band"] for r in narrow["rows"] if r.get("band") and r["quantity"].endswith("tpot_ms"))
    off = validate(run, cal, step_model="linear", speed_band=0.0)
    assert all("band" not in r for r in off["rows"])
    assert run_cli("validate", str(run), "--calibration", str(tmp_path / "nope.yaml")).code == 2
    with pytest.raises(Exception, match="speed_band"):
        validate(run, cal, speed_band=1.5)
    # the diagnosis: at the speed the engine had in the run (read from its step log), the same
    # simulator reproduces the run; the factor it finds is the 1.1 the run was made with
    diag = validate(run, cal, step_model="linear", speed_factor="run", speed_band=0.0)
    assert diag["speed_factor"] == pytest.approx(1.1, rel=1e-3)
    for r in diag["rows"]:
        if r["measured"]:
            assert r["rel_err_sim"] == pytest.approx(0.0, abs=2e-3), r
    fixed = validate(run, cal, step_model="linear", speed_factor=1.1, speed_band=0.0)
    assert fixed["speed_factor"] == 1.1
    for a, b in zip(fixed["rows"], diag["rows"]):
        if a["simulated"] is not None:
            assert a["simulated"] == pytest.approx(b["simulated"], rel=2e-3), (a, b)
    import yaml

    (tmp_path / "cal.yaml").write_text(yaml.safe_dump(cal))
    ran = run_cli("validate", str(run), "--calibration", str(tmp_path / "cal.yaml"), "--step-model", "linear",
                  "--speed-factor", "run")
    assert ran.code == 0
    assert "engine speed x1.100 applied" in ran.out
    ran = run_cli("validate", str(run), "--calibration", str(tmp_path / "cal.yaml"), "--speed-factor", "fast")
    assert ran.code == 2
    assert "--speed-factor" in ran.err


def test_speed_factor_run_is_measured_against_the_step_model_in_use(tmp_path):
    """``--speed-factor run`` with another step model than the calibration's linear one (a profile,
    or a given --step-time): the run's speed is measured against that model. Here the model in use
    prices every step at twice the reference engine's time and the run's engine was 1.1 x the
    reference: the factor is 0.55 (measured against the linear model it was 1.1, which doubled the
    model's error: TPOT +100 %), and at that factor the simulation reproduces the run."""
    from llmqueue.bench.calibrate import calibrate
    from llmqueue.bench.validate import validate

    ref = _sim(tmp_path, "ref", "linear:c0=0.01:prefill=2e-5:decode=3e-4", ["--arrival", "poisson:40"])
    run = _sim(tmp_path, "slow", "linear:c0=0.011:prefill=2.2e-5:decode=3.3e-4", ["--arrival", "poisson:10"])
    cal = calibrate(ref).to_dict()
    twice = "linear:c0=0.02:prefill=4e-5:decode=6e-4"
    diag = validate(run, cal, knobs={"step_time": twice}, speed_factor="run", speed_band=0.0)
    assert diag["speed_factor"] == pytest.approx(0.55, rel=2e-3)
    for r in diag["rows"]:
        if r["measured"] and r["quantity"].endswith(("tpot_ms", "e2el_ms")):
            assert r["rel_err_sim"] == pytest.approx(0.0, abs=5e-3), r


def test_step_time_scaled_scales_every_term():
    from llmqueue.engine.step_time import parse_step_time

    m = parse_step_time("linear:c0=0.01:prefill=2e-5:decode=3e-4:ctx=1e-7")
    s = m.scaled(1.25)
    for args in ((0, 10, 1000), (256, 3, 40), (0, 0, 0)):
        assert s.base(*args) == pytest.approx(1.25 * m.base(*args))
    assert s.decode_stretch(8, 500, 4) == pytest.approx(1.25 * m.decode_stretch(8, 500, 4))


def test_window_up_to_the_last_send(tmp_path):
    """``--to last-send`` / ``--horizon last-send``: the window ends at the client's last send
    (a concurrency-capped saturation run is saturated until then), read from ``dispatched_s``."""
    import numpy as np
    import pyarrow.parquet as pq

    from llmqueue.bench.calibrate import last_send_s
    from llmqueue.records import RequestRecords, write_records

    run = _sim(tmp_path, "sat", "linear:c0=0.01:prefill=2e-5:decode=3e-4", ["--arrival", "poisson:40"])
    t = pq.read_table(run / "requests.parquet").to_pydict()
    cols = {k: np.asarray(v) for k, v in t.items()}
    # the sends of a capped client: the last one at 250 s, some never sent
    cols["dispatched_s"] = np.minimum(cols["arrival_s"] * 0.8, 250.0)
    cols["dispatched_s"][:3] = np.nan
    write_records(run / "requests.parquet", RequestRecords.from_columns(cols))
    assert last_send_s(run) == pytest.approx(250.0)

    def cal_json(*args):
        return run_cli("calibrate", str(run), "-o", str(tmp_path / "c.yaml"), "--from", "20", *args, "--json").json()

    by_name, by_value, whole = cal_json("--to", "last-send"), cal_json("--to", "250"), cal_json()
    assert by_name["b"] == by_value["b"] and by_name["b"] != whole["b"]
    assert any("[20, 250)" in n for n in by_name["notes"])

    def horizon(value):
        return run_cli("validate", str(run), "--calibration", str(tmp_path / "c.yaml"), "--horizon", value,
                       "--speed-band", "0", "--json").json()["simulation"]["horizon_s"]

    assert horizon("last-send") == pytest.approx(250.0) and horizon("300") == pytest.approx(300.0)
    ran = run_cli("calibrate", str(run), "-o", str(tmp_path / "c.yaml"), "--to", "soon")
    assert ran.code == 2
    assert "--to" in ran.err
    cols["dispatched_s"][:] = np.nan
    write_records(run / "requests.parquet", RequestRecords.from_columns(cols))
    ran = run_cli("validate", str(run), "--calibration", str(tmp_path / "c.yaml"), "--horizon", "last-send")
    assert ran.code == 2
    assert "dispatched_s" in ran.err


def test_steps_from_another_run_join_the_linear_fit(tmp_path):
    """``calibrate --steps-from``: a low-load run's steps join the linear model's fit (M and b
    stay the main run's). Runs with one linear step model give it back from both
    together; a low-load run whose steps are cheaper (a concave engine's small batches) pulls
    the fitted model towards them; a run without step records is a one-line error (exit 2)."""
    import shutil

    truth = "linear:c0=0.01:prefill=2e-5:decode=3e-4"
    sat = _sim(tmp_path, "sat", truth, ["--arrival", "poisson:40", "--duration", "120"])
    low = _sim(tmp_path, "low", truth, ["--arrival", "poisson:2", "--duration", "120"])
    cheap = _sim(tmp_path, "cheap", "linear:c0=0.005:prefill=2e-5:decode=3e-4", ["--arrival", "poisson:2",
                                                                                "--duration", "120"])
    from llmqueue.bench.calibrate import calibrate

    alone = calibrate(sat)
    both = calibrate(sat, steps_from=[low])
    assert both.linear["c0"] == pytest.approx(0.01, rel=1e-6) and both.linear["decode"] == pytest.approx(3e-4, rel=1e-6)
    assert both.linear["steps"] > alone.linear["steps"]
    assert both.b == alone.b and both.capacity_tokens == alone.capacity_tokens
    assert both.speed_sd == pytest.approx(alone.speed_sd, abs=1e-9)  # this run's steps, the same model
    assert any(str(low) in n for n in both.notes)
    pulled = calibrate(sat, steps_from=[cheap]).linear
    assert pulled["c0"] < 0.0099  # below the saturation run's own 0.01
    cal = tmp_path / "cal.yaml"
    ran = run_cli("calibrate", str(sat), "-o", str(cal), "--steps-from", str(cheap), "--json")
    assert ran.code == 0
    assert json.loads(ran.out)["linear"]["c0"] == pytest.approx(pulled["c0"])
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(low / "requests.parquet", bare / "requests.parquet")
    ran = run_cli("calibrate", str(sat), "-o", str(cal), "--steps-from", str(bare))
    assert ran.code == 2
    err = ran.err
    assert "steps_from" in err and len(err.strip().splitlines()) == 1


def test_validate_simulates_the_engine_speed_drift_that_calibrate_measured(tmp_path):
    """A "measured" engine whose speed drifts (CV 0.12 over 10-s windows): calibrate finds the
    drift on its saturation run, and validate, simulating it, predicts a near-capacity run's
    p99 TTFT (the mean over several runs of other drift draws) better than a steady engine."""
    import numpy as np

    from llmqueue.bench.calibrate import calibrate
    from llmqueue.bench.validate import validate

    base = "linear:c0=0.01:prefill=2e-5:decode=3e-4"
    drifting = f"{base}:drift=0.12:span=10"
    ref = _sim(tmp_path, "ref", drifting, ["--arrival", "poisson:40", "--seed", "101"])
    cal = calibrate(ref, window=(15.0, 400.0)).to_dict()
    assert cal["speed_sd"] == pytest.approx(0.12, rel=0.35)
    mu = json.loads((ref / "summary.json").read_text())["request_throughput"]
    p99, pred, steady = [], [], []
    for seed in (102, 103, 104, 105):
        run = _sim(tmp_path, f"load{seed}", drifting, ["--arrival", f"poisson:{0.85 * mu:.3f}", "--seed", str(seed)])
        v = validate(run, cal, step_model="linear", speed_band=0.0)
        assert v["drift"] == cal["speed_sd"] and v["drift_reps"] == 8
        row = {r["quantity"]: r for r in v["rows"]}["p99_ttft_ms"]
        assert row["drift_range"][0] < row["simulated"] < row["drift_range"][1]
        p99.append(row["measured"])
        pred.append(row["simulated"])
        off = validate(run, cal, step_model="linear", speed_band=0.0, drift=0.0)
        assert off["drift"] == 0.0 and "drift_range" not in off["rows"][0]
        steady.append({r["quantity"]: r for r in off["rows"]}["p99_ttft_ms"]["simulated"])
    err_drift = abs(np.mean(pred) - np.mean(p99)) / np.mean(p99)
    err_steady = abs(np.mean(steady) - np.mean(p99)) / np.mean(p99)
    assert np.mean(steady) < np.mean(pred)  # slow windows lengthen the tail
    assert err_drift < err_steady, (p99, pred, steady)
    with pytest.raises(Exception, match="drift"):
        validate(run, cal, drift=1.5)
    import yaml

    (tmp_path / "cal.yaml").write_text(yaml.safe_dump(cal))
    ran = run_cli("validate", str(run), "--calibration", str(tmp_path / "cal.yaml"), "--step-model", "linear",
                  "--drift", "0.1", "--drift-reps", "2", "--speed-band", "0")
    assert ran.code == 0
    assert "speed drift 10.0% over 10-s windows, mean of 2 draws" in ran.out
    ran = run_cli("validate", str(run), "--calibration", str(tmp_path / "cal.yaml"), "--drift", "2")
    assert ran.code == 2
    err = ran.err
    assert "drift" in err and "Traceback" not in err


def test_validate_engine_flags_override_the_calibrated_server(tmp_path):
    """The simulate flags validate takes replace the calibrated server's knobs: what the run would
    have done with 4 slots, half the KV cache and slower steps."""
    run = _sim(tmp_path, "lin", "linear:c0=0.01:prefill=2e-5:decode=3e-4")
    cal = tmp_path / "cal.yaml"
    assert run_cli("calibrate", str(run), "-o", str(cal), "--json").code == 0
    args = ["validate", str(run), "--calibration", str(cal), "--step-model", "linear", "--json"]
    same = run_cli(*args).json()
    v = run_cli(*args, "--max-num-seqs", "4", "--capacity-tokens", "10000", "--step-time", "0.02").json()
    sim, ref = v["simulation"], same["simulation"]
    assert ref["engine"]["max_num_seqs"] == 256 and ref["kv_capacity_tokens"] == 20000  # the run's own
    assert sim["engine"]["max_num_seqs"] == 4 and sim["kv_capacity_tokens"] == 10000
    assert v["step_model"] == "0.02" and same["step_model"] != "0.02"
    assert sim["mean_ttft_ms"] > 2 * ref["mean_ttft_ms"]  # four slots queue the 12 req/s
    ran = run_cli(*args, "--max-num-seqs", "0")
    assert ran.code == 2
    err = ran.err
    assert err.startswith("llmqueue: error: --max-num-seqs: must be >= 1") and err.count("\n") == 1


def test_validate_margin_gives_the_distance_to_the_preemption_cliff(tmp_path):
    """validate --margin: the calibrated prediction's regime, the engine slow-down and the traffic
    factor that tip the same stream into preemption, printed and in the JSON; a small KV cache
    (--capacity-tokens) brings the cliff closer."""
    run = _sim(tmp_path, "lin", "linear:c0=0.01:prefill=2e-5:decode=3e-4")
    cal = tmp_path / "cal.yaml"
    assert run_cli("calibrate", str(run), "-o", str(cal), "--json").code == 0
    args = ["validate", str(run), "--calibration", str(cal), "--step-model", "linear", "--margin", "0.1"]
    m = run_cli(*args, "--json").json()["regime_margin"]
    assert m["regime"] in ("clear", "metastable", "preempting") and m["margin"] == 0.1
    small = run_cli(*args, "--json", "--capacity-tokens", "4000").json()["regime_margin"]
    room = [x if x is not None else m["max_factor"] for x in (m["rate_factor"], small["rate_factor"])]
    assert room[1] <= room[0]  # less KV, no more room before preempting
    assert small["regime"] != "clear" or small["rate_factor"] is not None
    ran = run_cli(*args)
    assert ran.code == 0
    assert "Distance to the preemption cliff" in ran.out
    # the probability that the engine's run-to-run speed spread tips it (issue 36 item 5): the
    # calibration's spread (here the stated default: one run), beside the verdict
    from llmqueue.margin import DEFAULT_SPEED_SPREAD

    t = m["tipping"]
    assert t["spread"] == DEFAULT_SPEED_SPREAD and "default" in t["spread_source"] and 0 <= t["probability"] <= 1
    assert "tipping probability" in ran.out and "of engine speeds" in ran.out


def test_validate_leaves_out_server_errors_and_applies_the_client_deadlines(tmp_path):
    """A quarter of the run's requests failed at the server (status ``error``): the replay leaves
    them out, so the simulated throughput is the ok requests' (serving them all would put it a
    third high). The client's deadline, as a benchmark records it, is applied to the replay: no
    simulated request lasts longer than it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from llmqueue.bench.calibrate import calibrate
    from llmqueue.bench.validate import validate

    run = _sim(tmp_path, "lin", "linear:c0=0.01:prefill=2e-5:decode=3e-4")
    cal = calibrate(run).to_dict()
    t = pq.read_table(run / "requests.parquet")
    d = {k: np.asarray(v) for k, v in t.to_pydict().items()}
    bad = np.arange(len(d["request_id"])) % 4 == 1
    d["status"] = np.where(bad, "error", d["status"]).astype(object)
    for k in ("first_scheduled_s", "first_token_s"):
        d[k] = np.where(bad, np.nan, d[k])
    d["finish_s"] = np.where(bad, d["arrival_s"], d["finish_s"])
    d["output_tokens"] = np.where(bad, 0, d["output_tokens"])
    pq.write_table(pa.table({k: d[k].tolist() for k in t.column_names}, schema=t.schema), run / "requests.parquet")
    v = validate(run, cal, step_model="linear", speed_band=0.0, drift=0.0)
    assert v["replay"]["left_out_server_errors"] == int(bad.sum()) > 50
    assert v["replay"]["requests"] == len(bad) - int(bad.sum())
    thr = next(r for r in v["rows"] if r["quantity"] == "request_throughput")
    assert abs(thr["rel_err_sim"]) < 0.05, thr
    ran = run_cli("validate", str(run), "--calibration", _yaml(tmp_path, cal), "--step-model", "linear")
    assert ran.code == 0
    assert f"{int(bad.sum())} request(s) the server answered with an error" in ran.out

    # the client's deadline, recorded as `llmqueue bench` records it: requests past it time out
    import json

    s = json.loads((run / "summary.json").read_text())
    free = validate(run, cal, step_model="linear", speed_band=0.0, drift=0.0)
    assert free["simulation"]["status_counts"].get("timeout", 0) == 0
    p50 = next(r for r in free["rows"] if r["quantity"] == "mean_e2el_ms")["simulated"] / 1000.0
    s["bench"] = {"timeout_s": {"default": p50}, "retries": False}
    (run / "summary.json").write_text(json.dumps(s))
    tight = validate(run, cal, step_model="linear", speed_band=0.0, drift=0.0)
    assert tight["replay"]["client_timeout_s"] == {"default": p50}
    assert tight["simulation"]["status_counts"].get("timeout", 0) > 20
    ran = run_cli("validate", str(run), "--calibration", _yaml(tmp_path, cal), "--step-model", "linear")
    assert ran.code == 0
    assert "the client's deadlines applied: timeout default" in ran.out


def _yaml(tmp_path, cal: dict) -> str:
    import yaml

    p = tmp_path / "cal.yaml"
    p.write_text(yaml.safe_dump(cal))
    return str(p)
