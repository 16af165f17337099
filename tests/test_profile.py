"""``llmqueue profile`` and the ``profile:DIR`` step-time model.

Against the stub server with known timings (a batch-dependent decode step, a prefill line): the
profile recovers each decode step and the TTFT within 5 %. The model: monotone in the batch
within the noise (a dip beyond it kept), through the measured points, linear in the per-sequence context, its stretches equal to its
steps; ``profile:DIR`` runs in ``simulate``; bad input is one line, exit 2.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.errors import InputError

STEPS = {1: 0.015, 2: 0.018, 4: 0.022, 8: 0.030}   # the stub's decode step (s) at n running requests
FIRST_S, PER_TOKEN_S = 0.200, 1e-4                  # its TTFT: 200 ms + 100 us per prompt token
# (a TTFT as the client sees it also holds the HTTP round trip and the stub's sleeps overshooting:
# 1.3-2.2 ms on this machine when it is busy, 5.6 ms once on a loaded CI host, which against 80 ms +
# 50 us a token came to 7 % of a 16-token TTFT; against these, under 3 %, and the slope's span
# over the probes is 100 ms, so 2.5 ms of jitter moves it under 3 %)
PREFILL_LENGTHS = (16, 256, 1024)


def _doc(rows, prefill=(2e-5, 0.011)):
    cells = [{"prompt_tokens": p, "context_tokens": ctx, "batch": b, "median_s": t, "count": 30}
             for p, ctx, pts in rows for b, t in pts]
    return {"format": "llmqueue-profile", "version": 1, "decode": cells,
            "prefill": {"per_token_s": prefill[0], "intercept_s": prefill[1]}}


def _write(d, doc):
    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.json").write_text(json.dumps(doc))
    return d


CONCAVE = [(64, 96, [(1, 0.010), (2, 0.013), (4, 0.015), (8, 0.018), (32, 0.030)]),
           (512, 544, [(1, 0.012), (2, 0.016), (4, 0.020), (8, 0.027), (32, 0.060)])]


# --- the model -----------------------------------------------------------------------------------

def test_the_model_hits_the_points_and_is_monotone(tmp_path):
    from llmqueue.engine.step_model import StepTime
    from llmqueue.engine.step_time import parse_step_time

    m = parse_step_time(f"profile:{_write(tmp_path, _doc(CONCAVE))}")
    assert isinstance(m, StepTime)
    for _, ctx, pts in CONCAVE:
        for b, t in pts:
            assert m.base(0, b, b * ctx) == pytest.approx(t, rel=1e-12)
    for _, ctx, _ in CONCAVE:
        v = np.array([m.base(0, n, n * ctx) for n in range(1, 80)])
        assert (np.diff(v) >= -1e-15).all()
    # between points: no overshoot, and concave data give a curve above the chord (n = 3 of 2..4)
    v3 = m.base(0, 3, 3 * 96)
    assert (0.013 + 0.015) / 2 <= v3 <= 0.015
    # beyond the last batch: the last segment goes on
    assert m.base(0, 64, 64 * 96) == pytest.approx(0.030 + 32 * (0.012 / 24), rel=1e-9)


def test_context_is_linear_between_rows_and_flat_below(tmp_path):
    from llmqueue.engine.step_time import parse_step_time

    m = parse_step_time(f"profile:{_write(tmp_path, _doc(CONCAVE))}")
    mid = (96 + 544) / 2
    assert m.base(0, 4, int(4 * mid)) == pytest.approx((0.015 + 0.020) / 2, rel=1e-9)
    assert m.base(0, 4, 4 * 10) == pytest.approx(0.015)            # below the shortest row: its value
    slope = (0.020 - 0.015) / (544 - 96)
    assert m.base(0, 4, 4 * 1000) == pytest.approx(0.020 + slope * (1000 - 544), rel=1e-9)


def test_stretch_equals_steps_and_the_mixed_rule(tmp_path):
    from llmqueue.engine.step_time import parse_step_time

    m = parse_step_time(f"profile:{_write(tmp_path, _doc(CONCAVE))}/profile.json:scale=1.5")
    for n, ctx0 in ((1, 50), (3, 3 * 200), (8, 8 * 700), (40, 40 * 90)):
        s = m.decode_stretch(n, ctx0, 200)
        assert s.tolist() == [m.base(0, n, ctx0 + n * j) for j in range(200)]  # exactly
    # mixed: decode part + the prefill line's slope x P (the fixed cost once); prefill-only: the line
    assert m.base(300, 4, 4 * 96) == pytest.approx(1.5 * (0.015 + 300 * 2e-5))
    assert m.base(300, 0, 0) == pytest.approx(1.5 * (0.011 + 300 * 2e-5))
    assert m.scaled(2).base(0, 1, 96) == pytest.approx(3 * 0.010)


def test_noisy_measurements_are_made_monotone(tmp_path):
    from llmqueue.engine.profile_step import isotonic
    from llmqueue.engine.step_time import parse_step_time

    np.testing.assert_allclose(isotonic([1, 3, 2, 4]), [1, 2.5, 2.5, 4])
    np.testing.assert_allclose(isotonic([5, 1], [1, 3]), [2, 2])
    m = parse_step_time(f"profile:{_write(tmp_path, _doc([(64, 96, [(1, 0.012), (2, 0.011), (4, 0.015)])]))}")
    v = [m.base(0, n, 96 * n) for n in (1, 2, 3, 4)]
    assert v[0] == v[1] == pytest.approx(0.0115) and v[3] == pytest.approx(0.015)


def test_a_dip_beyond_the_noise_is_kept_and_one_within_it_pooled(tmp_path):
    """An engine whose batch-4 step is faster than batch 2's (vLLM CPU on an AMD EPYC: 6.6 against
    8.5 ms in both passes) keeps its dip when the passes agree; the same dip between passes that
    disagree by more is pooled, and so is a small dip and any dip of a one-pass profile."""
    from llmqueue.engine.profile_step import cell_sd, level_noise, pool_within_noise
    from llmqueue.engine.step_time import parse_step_time

    def cell(b, t, passes):
        return {"prompt_tokens": 64, "context_tokens": 96, "batch": b, "median_s": t, "count": 400,
                "p25_s": 0.97 * t, "p75_s": 1.03 * t, "pass_medians_s": [t * x for x in passes]}

    steady = (0.98, 1.02)  # passes 4 % apart: a level's standard error 2 %
    pts = [(1, 0.0090), (2, 0.0103), (4, 0.0084), (8, 0.0110), (16, 0.0150)]
    doc = _doc([])
    doc["decode"] = [cell(b, t, steady) for b, t in pts]
    assert level_noise(doc["decode"]) == pytest.approx(0.02)
    m = parse_step_time(f"profile:{_write(tmp_path / 'a', doc)}")
    for b, t in pts:
        assert m.base(0, b, 96 * b) == pytest.approx(t, rel=1e-12)   # every point kept, the dip too
    assert 0.0084 <= m.base(0, 3, 288) <= 0.0103                    # between 2 and 4: no overshoot

    wander = (0.8, 1.2)  # passes 40 % apart: standard error 20 %, the same dip is noise
    doc["decode"] = [cell(b, t, wander) for b, t in pts]
    m = parse_step_time(f"profile:{_write(tmp_path / 'b', doc)}")
    v2, v4 = m.base(0, 2, 192), m.base(0, 4, 384)
    assert v2 == pytest.approx(v4) and v2 == pytest.approx((0.0103 + 0.0084) / 2)

    # one pass: the engine's wander between levels cannot be told from a dip, every dip is pooled
    doc["decode"] = [{k: v for k, v in cell(b, t, steady).items() if k != "pass_medians_s"} for b, t in pts]
    assert level_noise(doc["decode"]) is None
    m = parse_step_time(f"profile:{_write(tmp_path / 'c', doc)}")
    assert m.base(0, 2, 192) == pytest.approx(m.base(0, 4, 384)) == pytest.approx((0.0103 + 0.0084) / 2)

    # a 4 % dip between steady passes: within two standard errors (2 x 2.9 %), pooled
    y = [0.0100, 0.0096]
    sd = [cell_sd(cell(1, t, steady), 0.02) for t in y]
    np.testing.assert_allclose(pool_within_noise(y, None, sd), [0.0098, 0.0098])
    # no standard errors: plain pool-adjacent-violators
    np.testing.assert_allclose(pool_within_noise([1, 3, 2, 4]), [1, 2.5, 2.5, 4])
    # a pooled block is checked again against the block before it
    np.testing.assert_allclose(pool_within_noise([2.0, 1.0, 1.1, 0.8], None, [0.01, 0.3, 0.3, 0.3]),
                               [2.0, 2.9 / 3, 2.9 / 3, 2.9 / 3])


def test_the_profile_records_each_pass_median():
    from llmqueue.bench.profile import pool_cells

    a = {"prompt_tokens": 64, "batch": 2, "_itl": np.full(10, 0.01), "_ctx": np.full(10, 80.0),
         "_cycles": np.full(30, 0.009), "_elapsed": np.full(30, 0.008)}
    b = {**a, "_itl": np.full(10, 0.012), "_cycles": np.full(30, 0.011)}
    (c,) = pool_cells([a, b])
    assert c["source"] == "iteration log" and c["pass_medians_s"] == pytest.approx([0.009, 0.011])
    del b["_cycles"]
    (c,) = pool_cells([a, b])
    assert c["source"] == "inter-token latencies" and c["pass_medians_s"] == pytest.approx([0.010, 0.012])


def test_the_benchmark_rejudges_a_saved_run_with_either_rule(tmp_path):
    """``benchmarks/profile_vllm.py --rejudge`` prices a saved run's held-out steps with the current
    model (the dip its two passes agree on kept) and with every dip pooled."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "profile_vllm_under_test", Path(__file__).resolve().parents[1] / "benchmarks" / "profile_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pts = [(1, 0.0075), (2, 0.0085), (4, 0.0066), (8, 0.0090)]
    doc = _doc([(64, 112, pts)])
    for c in doc["decode"]:
        c.update(p25_s=0.98 * c["median_s"], p75_s=1.02 * c["median_s"], count=180,
                 pass_medians_s=[0.99 * c["median_s"], 1.01 * c["median_s"]])
    _write(tmp_path / "profile", doc)
    held = [{"batch": b, "context_per_seq": 112.0, "measured_ms": 1e3 * t, "profile_ms": 0.0, "err": 0.0}
            for b, t in pts]
    (tmp_path / "result.json").write_text(json.dumps({"held_out": held}))
    res = mod.rejudge(tmp_path)
    errs = {r["batch"]: r["err"] for r in res["held_out"]}
    mono = {r["batch"]: r["monotone_err"] for r in res["held_out"]}
    assert res["level_noise"] == pytest.approx(0.02) and res["within_10pct"]
    assert max(abs(e) for e in errs.values()) < 1e-9
    assert mono[2] == pytest.approx((0.0085 + 0.0066) / 2 / 0.0085 - 1)           # pooled: -11 %
    assert mono[4] == pytest.approx((0.0085 + 0.0066) / 2 / 0.0066 - 1)           # +14 %
    assert not res["monotone_within_10pct"]


@pytest.mark.parametrize("content,fragment", [
    (None, "no profile"),
    ("{not json", "not a readable profile"),
    ('{"format": "other"}', "not an llmqueue profile"),
    ('{"format": "llmqueue-profile", "decode": [], "prefill": {}}', "no decode cells"),
    ('{"format": "llmqueue-profile", "decode": [{"batch": 0, "median_s": 0.01, "context_tokens": 5}], '
     '"prefill": {"per_token_s": 0, "intercept_s": 0.01}}', "decode cell 0"),
    ('{"format": "llmqueue-profile", "decode": [{"batch": 1, "median_s": 0.01, "context_tokens": 5}], '
     '"prefill": {"per_token_s": -1, "intercept_s": 0.01}}', "prefill fit"),
])
def test_a_bad_profile_is_an_input_error(tmp_path, content, fragment):
    from llmqueue.engine.step_time import parse_step_time

    if content is not None:
        (tmp_path / "profile.json").write_text(content)
    with pytest.raises(InputError, match=fragment) as e:
        parse_step_time(f"profile:{tmp_path}")
    assert e.value.field == "step_time"


def test_plan_stops_at_max_num_seqs_and_the_kv_cache():
    from llmqueue.bench.profile import ladder, plan

    assert ladder(1) == [1] and ladder(8) == [1, 2, 4, 8] and ladder(48) == [1, 2, 4, 8, 16, 32, 48]
    server = {"max_num_seqs": 64, "num_gpu_blocks": 201, "block_size": 32, "M_usable": 6400, "max_model_len": 1024,
              "max_num_batched_tokens": 512}
    p = plan(server, contexts=[64, 480], output_tokens=32)
    assert p["contexts"][64] == [1, 2, 4, 8, 16, 32, 64]        # 3 blocks a request: 66 fit, max_num_seqs binds
    assert p["contexts"][480] == [1, 2, 4, 8, 12]                # 16 blocks a request: 200 // 16 = 12
    assert max(p["prefill"]) <= 512                              # one prefill step a probe
    with pytest.raises(InputError, match="max_num_seqs"):
        plan({"M_usable": 6400}, contexts=[64])
    with pytest.raises(InputError, match="--server-num-gpu-blocks"):
        plan({"max_num_seqs": 8}, contexts=[64])
    with pytest.raises(InputError, match="max_model_len"):
        plan(server, contexts=[1020], output_tokens=32)


def test_the_default_ladder_reaches_the_kv_bound_batches_of_a_saturation_run():
    """The vLLM CPU protocol's server (64 blocks of 32, max_model_len 512): the default profile
    stopped at batch 10 of context 64 (10 requests of 64 + 128 tokens fill the cache) and dropped
    the 512 context, while its saturation run held 7-14 sequences: the level above 10 was the
    profile extrapolated. Now the ladder goes on with shorter outputs to the KV limit at 24 output
    tokens (a KV-bound engine's batches: more sequences, each shorter), and the longest prompt that
    fits beside the output is a second row."""
    from llmqueue.bench.profile import level_output, plan

    server = {"max_num_seqs": 64, "num_gpu_blocks": 64, "block_size": 32, "M_usable": 2016, "max_model_len": 512,
              "max_num_batched_tokens": 256}
    p = plan(server)
    assert sorted(p["contexts"]) == [64, 384]
    assert p["contexts"][64] == [1, 2, 4, 8, 16, 21]   # 3 blocks (96 tokens) a request: 63 // 3 = 21
    assert [level_output(server, 64, b, 128) for b in (8, 16, 21)] == [128, 32, 32]
    assert p["contexts"][384] == [1, 2, 4]               # 13 blocks a request (384 + 24): 63 // 13 = 4
    assert level_output(server, 384, 4, 128) == 96 and level_output(server, 384, 2, 128) == 128
    assert any("fewer output tokens" in n for n in p["notes"])


# --- against the stub server ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def stub():
    from llmqueue.bench.stub_server import StubServer

    table = ",".join(f"{n}:{t}" for n, t in STEPS.items())
    with StubServer(decode_steps=table, first_token_delay_s=FIRST_S, prefill_token_s=PER_TOKEN_S,
                    max_model_len=4096) as s:
        yield s


@pytest.fixture(scope="module")
def profiled(stub, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "p"
    assert run_cli("profile", "--url", stub.url, "--out", str(out), "--contexts", "32", "--output-tokens", "40",
                   "--prefill-lengths", ",".join(map(str, PREFILL_LENGTHS)), "--prefill-repeats", "5",
                   "--server-max-num-seqs", "8", "--server-num-gpu-blocks", "10000", "--server-block-size", "16",
                   "--no-progress", "--json").code == 0
    return out


def test_profile_recovers_the_stubs_decode_steps_and_ttft(profiled):
    from llmqueue.engine.step_time import parse_step_time

    doc = json.loads((profiled / "profile.json").read_text())
    cells = {c["batch"]: c for c in doc["decode"]}
    assert sorted(cells) == [1, 2, 4, 8]                         # the ladder up to max_num_seqs
    model = parse_step_time(f"profile:{profiled}")
    for n, t in STEPS.items():
        assert cells[n]["median_s"] == pytest.approx(t, rel=0.05), n
        assert cells[n]["count"] >= 2 * 30 * n
        assert model.base(0, n, int(n * cells[n]["context_tokens"])) == pytest.approx(t, rel=0.05)
    # TTFT: a lone request's prefill step under the model, against the stub's TTFT
    for L in PREFILL_LENGTHS:
        assert model.base(L, 0, 0) == pytest.approx(FIRST_S + PER_TOKEN_S * L, rel=0.05), L
    pre = doc["prefill"]
    assert pre["per_token_s"] == pytest.approx(PER_TOKEN_S, rel=0.05)
    assert pre["source"] == "ttft" and pre["frontend_latency_s"] is None
    # the raw records of every level are kept
    assert (profiled / "runs" / "ctx32-b8" / "pass2" / "requests.parquet").is_file()
    assert all(c["passes"] == 2 for c in doc["decode"])           # two passes over the ladder, pooled
    assert (profiled / "runs" / "prefill" / "tokens.parquet").is_file()
    server = json.loads((profiled / "server.json").read_text())
    assert server["max_num_seqs"] == 8 and server["sources"]["max_num_seqs"].startswith("flag")


def test_profile_dir_runs_in_simulate(profiled, tmp_path):
    ran = run_cli("simulate", "--capacity-tokens", "20000", "--step-time", f"profile:{profiled}",
                  "--prompt", "uniform:10:200", "--output", "uniform:10:100", "--arrival", "poisson:5",
                  "--duration", "20", "--seed", "1", "--max-num-seqs", "8", "--no-progress", "--json")
    code = ran.code
    assert code == 0
    s = json.loads(ran.out)
    assert s["completed"] > 50
    # TPOT near the profile's decode steps (1-8 sequences: 15-30 ms, plus prompt chunks in mixed steps)
    assert 14 < s["mean_tpot_ms"] < 40


def _one_line(argv, fragment):
    code, _, err = run_cli(*argv)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("llmqueue: error: ") and "Traceback" not in err
    assert fragment in err, err


def test_bad_inputs_are_one_line(tmp_path, stub):
    base = ["--out", str(tmp_path / "o"), "--model", "m", "--no-progress"]
    _one_line(["profile", "--url", "http://127.0.0.1:9", *base, "--server-max-num-seqs", "4"], "connect")
    _one_line(["profile", "--url", stub.url, *base], "--server-max-num-seqs")
    _one_line(["profile", "--url", stub.url, *base, "--server-max-num-seqs", "4"], "--server-num-gpu-blocks")
    _one_line(["profile", "--url", stub.url, *base, "--contexts", "a,b"], "--contexts")
    _one_line(["profile", "--url", stub.url, *base, "--server-max-num-seqs", "4", "--server-block-size",
                       "16", "--server-num-gpu-blocks", "100", "--contexts", "4090"], "max_model_len")
    assert not (tmp_path / "o").exists()
    sim = ["simulate", "--capacity-tokens", "20000", "--prompt", "fixed:10", "--output", "fixed:10",
           "--arrival", "poisson:1", "--duration", "5", "--no-progress"]
    _one_line([*sim, "--step-time", f"profile:{tmp_path / 'nope'}"], "--step-time")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "profile.json").write_text("{oops")
    _one_line([*sim, "--step-time", f"profile:{tmp_path / 'bad'}"], "--step-time")


# --- calibrate --profile: the profile's shape at a run's level --------------------------------------

def test_calibrate_sets_the_profiles_level_from_a_run(tmp_path):
    """A run simulated with the profile 1.3x slower: calibrate --profile finds the factor, writes the
    scaled profile as step_time (so fitted:FILE gives it), and validate --step-model profile
    reproduces the run."""
    prof = _write(tmp_path / "prof", _doc(CONCAVE))
    run = tmp_path / "run"
    assert run_cli("simulate", "--capacity-tokens", "20000", "--step-time", f"profile:{prof}:scale=1.3",
                   "--prompt", "uniform:10:300", "--output", "uniform:10:200", "--arrival", "poisson:8",
                   "--duration", "120", "--max-num-seqs", "32", "--out", str(run), "--no-progress", "--json").code == 0
    cal = tmp_path / "cal.yaml"
    d = run_cli("calibrate", str(run), "-o", str(cal), "--profile", str(prof), "--json").json()
    assert d["profile_scale"] == pytest.approx(1.3, rel=0.01)
    assert d["step_time"].startswith("profile:") and d["step_time"] == d["step_time_profile"]
    assert float(d["step_time_constant"]) == pytest.approx(d["b"])
    from llmqueue.engine.step_time import parse_step_time

    fitted = parse_step_time(f"fitted:{cal}")
    assert fitted.base(0, 4, 4 * 96) == pytest.approx(1.3 * 0.015, rel=0.02)
    v = run_cli("validate", str(run), "--calibration", str(cal), "--step-model", "profile", "--drift", "0",
                "--speed-band", "0", "--json").json()
    rows = {r["quantity"]: r for r in v["rows"]}
    assert abs(rows["median_tpot_ms"]["rel_err_sim"]) < 0.03, rows["median_tpot_ms"]
    assert abs(rows["request_throughput"]["rel_err_sim"]) < 0.03, rows["request_throughput"]
    # no profile there: one line naming the flag
    _one_line(["calibrate", str(run), "-o", str(tmp_path / "c2.yaml"), "--profile", str(tmp_path / "no")],
              "--profile")
    (tmp_path / "empty").mkdir()
    _one_line(["calibrate", str(run), "-o", str(tmp_path / "c2.yaml"), "--profile", str(tmp_path / "empty")],
              "--profile")


def test_calibrate_keeps_the_frontend_delay_the_profile_measured(tmp_path):
    """A profile's prefill probes measured the server's delay outside the engine (TTFT less the
    logged prefill step, on lone requests): calibrate --profile keeps it as the calibration's
    frontend delay and names the profile as its source (it dropped it)."""
    doc = _doc(CONCAVE)
    doc["prefill"]["frontend_latency_s"] = 0.0125
    prof = _write(tmp_path / "prof", doc)
    run = tmp_path / "run"
    assert run_cli("simulate", "--capacity-tokens", "20000", "--step-time", f"profile:{prof}:scale=1.1",
                   "--prompt", "uniform:10:300", "--output", "uniform:10:200", "--arrival", "poisson:8",
                   "--duration", "60", "--max-num-seqs", "32", "--out", str(run), "--no-progress", "--json").code == 0
    d = run_cli("calibrate", str(run), "-o", str(tmp_path / "cal.yaml"), "--profile", str(prof), "--json").json()
    assert d["frontend_latency_s"] == pytest.approx(0.0125)
    assert d["frontend_source"].startswith("profile:")
    no_front = _write(tmp_path / "prof2", _doc(CONCAVE))  # a profile without one: the run's own estimate stays
    d2 = run_cli("calibrate", str(run), "-o", str(tmp_path / "c2.yaml"), "--profile", str(no_front), "--json").json()
    assert d2["frontend_latency_s"] != pytest.approx(0.0125)
    assert not (d2["frontend_source"] or "").startswith("profile:")


def test_a_calibration_moved_with_its_profile_still_loads(tmp_path):
    """calibrate -o writes a profile that lies under the calibration file's folder relative to that
    folder, so a run directory that is moved or archived keeps working (fitted:FILE, validate's
    load_calibration); a profile elsewhere stays absolute."""
    import shutil

    from llmqueue.bench.calibrate import load_calibration
    from llmqueue.engine.profile_step import rebase_spec
    from llmqueue.engine.step_time import parse_step_time

    work = tmp_path / "a"
    prof = _write(work / "prof", _doc(CONCAVE))
    run = work / "run"
    assert run_cli("simulate", "--capacity-tokens", "20000", "--step-time", f"profile:{prof}:scale=1.3",
                   "--prompt", "uniform:10:300", "--output", "uniform:10:200", "--arrival", "poisson:8",
                   "--duration", "60", "--max-num-seqs", "32", "--out", str(run), "--no-progress", "--json").code == 0
    assert run_cli("calibrate", str(run), "-o", str(work / "cal.yaml"), "--profile", str(prof), "--json").code == 0
    text = (work / "cal.yaml").read_text()
    spec_lines = [ln for ln in text.splitlines() if ln.startswith(("step_time:", "step_time_profile:"))]
    assert len(spec_lines) == 2 and all(ln.split(": ", 1)[1].startswith("profile:prof:scale=") for ln in spec_lines)
    shutil.move(str(work), str(tmp_path / "b"))
    moved = tmp_path / "b" / "cal.yaml"
    d = load_calibration(moved)
    assert d["step_time_profile"].startswith(f"profile:{tmp_path / 'b' / 'prof'}:scale=")
    assert parse_step_time(f"fitted:{moved}").base(0, 4, 4 * 96) == pytest.approx(1.3 * 0.015, rel=0.02)
    # outside the file's folder: unchanged; other specs: unchanged; relative read back against the folder
    assert rebase_spec("profile:/x/prof:scale=2", tmp_path, relative=True) == "profile:/x/prof:scale=2"
    assert rebase_spec("linear:c0=0.01:decode=1e-4", tmp_path, relative=True) == "linear:c0=0.01:decode=1e-4"
    assert rebase_spec("profile:p:scale=2:noise=gamma:cv=0.1", "/base", relative=False) == \
        "profile:/base/p:scale=2:noise=gamma:cv=0.1"


# --- the ladder sized for the saturation range (issue 36 item 4) -------------------------------------

def test_each_context_measures_its_smallest_and_largest_batch_first():
    from llmqueue.bench.profile import coverage_order

    assert coverage_order([1, 2, 4, 8, 16, 32]) == [1, 32, 4, 2, 8, 16]
    assert coverage_order([1, 2, 4, 8, 16, 32, 48])[:2] == [1, 48]
    assert sorted(coverage_order([1, 2, 4, 8, 12])) == [1, 2, 4, 8, 12] and coverage_order([1]) == [1]


def test_a_short_budget_still_reaches_the_largest_batch_and_says_how_long_the_ladder_takes(tmp_path):
    """A slow engine (40-60 ms steps) and a budget too short for the whole ladder at 60 output
    tokens (about 50 s): sized by the first step measured, the levels are cut to fewer tokens and every batch
    up to the largest (what a saturation run holds) is measured, within 5 % of the engine's step;
    a note gives the time the whole ladder needs; two passes give profile.json's repeat_spread."""
    from llmqueue.bench.stub_server import StubServer

    with StubServer(decode_steps="1:0.04,2:0.042,4:0.046,8:0.05,16:0.06", first_token_delay_s=0.01,
                    max_model_len=4096) as s:
        out = tmp_path / "p"
        r = run_cli("profile", "--url", s.url, "--out", str(out), "--contexts", "32", "--output-tokens", "60",
                    "--prefill-lengths", "16,64", "--prefill-repeats", "2", "--budget", "20",
                    "--server-max-num-seqs", "16", "--server-num-gpu-blocks", "10000", "--server-block-size", "16",
                    "--no-progress", "--json")
    assert r.code == 0, r.err
    doc = json.loads((out / "profile.json").read_text())
    batches = {c["batch"] for c in doc["decode"]}
    assert {1, 16} <= batches, batches              # the ends of the range first
    steps = {1: 0.04, 2: 0.042, 4: 0.046, 8: 0.05, 16: 0.06}
    for c in doc["decode"]:
        assert c["median_s"] == pytest.approx(steps[c["batch"]], rel=0.05), c
    assert any("takes about" in n and "cut to" in n for n in doc["notes"]), doc["notes"]
    assert doc["output_tokens_measured"] < doc["output_tokens"] == 60
    if any(c["passes"] > 1 for c in doc["decode"]):
        assert doc["repeat_spread"] is not None and doc["repeat_spread"] >= 0


def test_the_profiles_level_on_a_run_is_taken_at_the_batches_the_profile_measured():
    """A run's steps at batch 4 (10 ms) and 32 (40 ms) against a profile measured up to batch 8
    that extrapolates batch 32 to 30 ms: the level from the batches it measured is 1.0; from all
    steps it would carry the extrapolation's error (x1.2) into every batch."""
    from llmqueue.bench.calibrate import profile_level

    class Model:
        def base(self, p, d, c):
            return 0.010 if d <= 8 else 0.030

    d = np.array([4] * 40 + [32] * 40)
    dur = np.where(d == 4, 0.010, 0.040)
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    steps = {"start_s": start, "duration_s": dur, "prefill_tokens": np.zeros(80, int), "decode_seqs": d,
             "kv_tokens": d * 100}
    assert profile_level(steps, Model(), max_batch=8)[0] == pytest.approx(1.0, rel=1e-6)
    assert profile_level(steps, Model())[0] > 1.15
