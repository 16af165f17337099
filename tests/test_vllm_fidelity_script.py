"""``benchmarks/vllm_fidelity.py`` without vLLM: the profile step model, cross-shape and the acceptance summary.

The script's protocol needs the server's iteration log (the step records that calibrate and the
profile's level read), which the stub server does not write; so the protocol runs end to end
against a *simulated* server instead: the script's ``one_run`` replaced by a simulation of each
request stream on a known engine (a concave step-time surface, 1.25x slower than its profile),
``take_profile`` by writing that surface's profile, the server by a stand-in. Everything else is the
script's own: saturation window, calibrate --profile, probe, validate with each step model and
margin, load runs at the acceptance's factors, cross-shape, the summary. The real
``take_profile`` is run against the stub server (HTTP, ``llmqueue profile``'s code), and the
summary's pass/fail rules on synthetic results, where each bar is crossed on purpose.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import math
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCALE = 1.25  # the simulated engine is this much slower than its profile says: calibrate must find it
CONCAVE = [(64, 96, [(1, 0.010), (2, 0.013), (4, 0.015), (8, 0.018), (32, 0.030)]),
           (512, 544, [(1, 0.012), (2, 0.016), (4, 0.020), (8, 0.027), (32, 0.060)])]


def load_script():
    """A fresh copy of the script as a module (its SERVER and MODEL dicts are its own)."""
    spec = importlib.util.spec_from_file_location("vllm_fidelity_under_test", REPO / "benchmarks" / "vllm_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def profile_doc() -> dict:
    cells = [{"prompt_tokens": p, "context_tokens": ctx, "batch": b, "median_s": t, "count": 30}
             for p, ctx, pts in CONCAVE for b, t in pts]
    return {"format": "llmqueue-profile", "version": 1, "source": "synthetic", "decode": cells,
            "prefill": {"per_token_s": 2e-5, "intercept_s": 0.011}}


def simulated_lab(mod, tmp: Path, slower: dict | None = None) -> dict:
    """Replace what touches vLLM in ``mod`` by a simulated engine; returns a record of the calls.
    ``slower``: shape -> factor, that shape's server that much slower again (a machine whose speed
    drifted between two servers' runs)."""
    truth_dir = tmp / "truth"
    truth_dir.mkdir(parents=True)
    (truth_dir / "profile.json").write_text(json.dumps(profile_doc()))
    truth = f"profile:{truth_dir}:scale={SCALE}"
    calls: dict = {"profiles": [], "runs": []}

    def one_run(srv, run_dir, reqs, *, warmup_s, knobs, concurrency=None, **kw):
        from llmqueue.bench.server_info import record
        from llmqueue.engine.options import SimOptions
        from llmqueue.engine.step_time import parse_step_time
        from llmqueue.simulate import SimSpec, run_simulation, write_outcome
        from llmqueue.spec import engine_config

        M = (knobs["num_gpu_blocks_override"] - 1) * knobs["block_size"]
        cfg = engine_config(M, max_num_seqs=knobs["max_num_seqs"],
                            max_num_batched_tokens=knobs["max_num_batched_tokens"], block_size=knobs["block_size"])
        f = next((v for k, v in (slower or {}).items() if k in Path(run_dir).parts), 1.0)
        model = parse_step_time(truth).scaled(f) if f != 1.0 else parse_step_time(truth)
        out = run_simulation(SimSpec(engine=cfg, step_time=model, requests=reqs, warmup_s=warmup_s,
                                     options=SimOptions(seed=0)))
        write_outcome(out, run_dir)
        record(run_dir, log=None, flags=mod.server_flags(knobs))  # server.json, as the benchmark writes it
        calls["runs"].append(Path(run_dir).name)
        return out.summary

    def take_profile(srv, out_dir, *, knobs, **kw):
        calls["profiles"].append(Path(out_dir))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "profile.json").write_text(json.dumps(profile_doc()))
        return {"dir": str(out_dir), "elapsed_s": 0.0, "settings": kw}

    mod.one_run = one_run
    mod.take_profile = take_profile
    mod.open_server = lambda model_dir, work, log_path: contextlib.nullcontext(
        types.SimpleNamespace(url="http://simulated", model="sim", log_path=None, startup_s=0.0))
    mod.engine_setup = lambda model: (None, None, "simulated")
    return calls


# short runs on a KV cache large enough (delta 0.05) for the verdicts to be clear
QUICK = ["--sat-s", "40", "--warmup-s", "5", "--run-s", "60", "--b-guess", "0.01", "--kv-blocks", "257"]


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fid")
    mod = load_script()
    calls = simulated_lab(mod, tmp)
    out = tmp / "out"
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--step-model", "profile",
                     "--cross-shape", "balanced", *QUICK]) == 0
    return mod, calls, out


def test_the_profile_protocol_runs_end_to_end(profiled_run, capsys):
    mod, calls, out = profiled_run
    res = json.loads((out / "fidelity.json").read_text())
    assert res["step_model"] == "profile" and res["factors"] == [0.5, 0.8, 0.9, 1.2, 1.5]
    # one profile per shape, right after its saturation run, and before the probe and the loads
    assert calls["profiles"] == [out / "balanced" / "profile", out / "decode" / "profile"]
    assert calls["runs"][:3] == ["sat", "probe", "x0.5"]
    for shape in ("balanced", "decode"):
        row = res["shapes"][shape]
        assert row["step_model"] == "profile"
        assert row["step_time"].startswith(f"profile:{out.resolve() / shape / 'profile'}:scale=")
        assert row["profile_scale"] == pytest.approx(SCALE, rel=0.02)  # the level from the saturation run
        assert abs(row["capacity_sim"]["profile"]["err"]) < 0.05
        assert set(row["runs"]) == {"0.5", "0.8", "0.9", "1.2", "1.5"}
        for f, rr in row["runs"].items():
            assert rr["model_verdict"]["step_model"] == "profile"
            assert rr["model_verdict"]["regime_margin"]["margin"] == 0.1
            assert {"constant_b", "linear", "profile"} <= set(rr)
        # the profile carries the engine's shape: at half load it predicts the TPOT closely
        assert abs(row["runs"]["0.5"]["profile"]["median_tpot_ms"]["rel_err"]) < 0.05
    acc = json.loads((out / "acceptance.json").read_text())
    g = acc["groups"]
    assert (g["latency"]["n"], g["capacity_sim"]["n"], g["verdicts"]["n"], g["cross_shape"]["n"]) == (16, 2, 8, 1)
    # a simulator predicting a simulated engine from its own profile: every figure within its bar
    assert acc["passed"], [c for c in acc["checks"] if not c["ok"]]
    assert not acc["met"] and not acc["complete"]  # one seed, two shapes: the figures pass, the protocol is short
    assert any("prompt not run" in w for w in acc["incomplete_because"])
    assert any("1 seed" in w for w in acc["incomplete_because"])
    cs = res["cross_shape"]
    assert cs["source"] == "balanced" and cs["step_model"] == "profile"
    assert cs["step_time"] == res["shapes"]["balanced"]["step_time"]
    assert abs(cs["shapes"]["decode"]["err_sim"]) < 0.05


def test_analyze_only_redoes_cross_shape_from_another_shape(profiled_run, capsys):
    mod, calls, out = profiled_run
    n_runs = len(calls["runs"])
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--cross-shape", "decode", "--analyze-only"]) == 0
    assert len(calls["runs"]) == n_runs  # no server, no new run
    text = capsys.readouterr().out
    res = json.loads((out / "fidelity.json").read_text())
    cs = res["cross_shape"]
    assert cs["source"] == "decode" and cs["step_time"] == res["shapes"]["decode"]["step_time"]
    assert cs["shapes"]["decode"]["calibrated_here"] and not cs["shapes"]["balanced"]["calibrated_here"]
    assert abs(cs["shapes"]["balanced"]["err_sim"]) < 0.05
    # balanced is predicted with decode's profile and level, not with its own
    assert "/decode/profile:scale=" in cs["step_time"] and cs["step_time"] != res["shapes"]["balanced"]["step_time"]
    assert "## Acceptance (step model profile; seeds 1)" in text
    assert "| cross-shape capacity, simulator | 5 % | 1 of 1 | PASS |" in text


def test_cross_shape_separates_the_engines_drift_from_the_model(tmp_path, capsys):
    """The decode shape's server runs 10 % slower than balanced's (the same engine, another moment
    on a shared machine): predicted from balanced's calibration its capacity is ~10 % high (the bar
    fails, as it should), the diagnosis finds the engine 10 % slower on decode's own decode-only
    steps and, with that speed put in, the prediction is right."""
    mod = load_script()
    simulated_lab(mod, tmp_path, slower={"decode": 1.10})
    out = tmp_path / "out"
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--step-model", "profile",
                     "--cross-shape", "balanced", "--factors", "0.5", *QUICK]) == 0
    text = capsys.readouterr().out
    x = json.loads((out / "fidelity.json").read_text())["cross_shape"]["shapes"]
    assert x["balanced"]["engine_speed_ratio"] == pytest.approx(1.0)
    assert x["decode"]["err_sim"] == pytest.approx(0.10, abs=0.03)  # the slower engine serves 1/1.1 as much
    assert x["decode"]["engine_speed_ratio"] == pytest.approx(1.10, abs=0.02)
    assert abs(x["decode"]["err_sim_speed_matched"]) < 0.03
    assert "| cross-shape capacity, simulator | 5 % | 0 of 1 | FAIL |" in text
    assert "cross-shape, speed-matched (diagnosis)" in text


def test_the_default_step_model_takes_no_profile(tmp_path, capsys):
    mod = load_script()
    calls = simulated_lab(mod, tmp_path)
    out = tmp_path / "out"
    assert mod.main(["--out", str(out), "--shapes", "balanced", "--factors", "0.5", *QUICK]) == 0
    text = capsys.readouterr().out
    res = json.loads((out / "fidelity.json").read_text())
    assert calls["profiles"] == [] and not (out / "balanced" / "profile").exists()
    row = res["shapes"]["balanced"]
    assert res["step_model"] == "linear" and row["step_time"] == f"{row['b']:.6g}"  # the constant b, as before
    assert set(row["capacity_sim"]) == {"constant_b", "linear"}
    assert row["runs"]["0.5"]["model_verdict"]["step_model"] == "linear" and "profile" not in row["runs"]["0.5"]
    acc = res["acceptance"]
    assert acc["step_models"] == ["linear"] and not acc["met"]
    missing = [c for c in acc["checks"] if c["group"] == "verdicts" and c["value"] == "no run at this load"]
    assert sorted(c["factor"] for c in missing) == [0.9, 1.2, 1.5]
    assert acc["groups"]["latency"]["n"] == 8 and acc["groups"]["latency"]["ok"] <= 4  # no 0.8x run: 4 figures missing
    assert "step model linear" in text and "ACCEPTANCE: NOT MET" in text
    # --resume: balanced is kept, decode (cut short: a directory, no row) is set aside and run
    (out / "decode").mkdir()
    (out / "decode" / "left-over").write_text("x")
    n = len(calls["runs"])
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--factors", "0.5", "--resume", *QUICK]) == 0
    assert calls["runs"][n:] == ["sat", "probe", "x0.5"]  # decode's only
    assert "balanced: kept from" in capsys.readouterr().out
    res2 = json.loads((out / "fidelity.json").read_text())
    assert res2["shapes"]["balanced"] == row and set(res2["shapes"]) == {"balanced", "decode"}
    assert [p.name.split("-")[0] for p in out.glob("decode.partial-*")] == ["decode.partial"]
    assert not (out / "decode" / "left-over").exists()
    with pytest.raises(SystemExit, match="step-model linear"):
        mod.main(["--out", str(out), "--shapes", "balanced", "--step-model", "profile", "--resume", *QUICK])


# --- the summary's rules on synthetic results -------------------------------------------------------

def _results(mod, step_model="profile", err=0.01) -> dict:
    lat = {q: {"measured": 100.0, "simulated": 100.0 * (1 + err), "rel_err": err} for q in mod.LAT}
    runs = {}
    for f in mod.FACTORS:
        want = "stable" if f < 1 else "unstable: queue grows 0.3 req/s (95% CI 0.1 to 0.5)"
        runs[str(f)] = {"measured_verdict": want, "sim_verdict": want, "theory_verdict": want.split(":")[0],
                        step_model: copy.deepcopy(lat),
                        "model_verdict": {"step_model": step_model, "simulated": want}}
    shapes = {s: {"mu_measured": 1.0, "err_theory": 0.03, "capacity_sim": {step_model: {"mu": 1.01, "err": 0.01}},
                  "runs": copy.deepcopy(runs)} for s in mod.SHAPES}
    cross = {"source": "balanced", "step_model": step_model,
             "shapes": {s: {"err_sim": 0.02, "err_theory": 0.08} for s in mod.SHAPES}}
    return {"step_model": step_model, "shapes": shapes, "cross_shape": cross}


def test_the_summary_passes_a_complete_protocol_and_fails_each_bar():
    mod = load_script()
    good = {6: _results(mod), 7: _results(mod)}
    acc = mod.acceptance(good)
    assert acc["met"] and acc["complete"] and acc["passed"]
    assert {g: (x["n"], x["ok"]) for g, x in acc["groups"].items()} == {
        "latency": (48, 48), "capacity_sim": (6, 6), "capacity_theory": (6, 6), "verdicts": (24, 24),
        "cross_shape": (4, 4)}

    def fails(edit, group):
        by = copy.deepcopy(good)
        edit(by[7])
        a = mod.acceptance(by)
        assert not a["met"] and not a["groups"][group]["passed"], group
        assert [g for g, x in a["groups"].items() if not x["passed"]] == [group]
        return a

    def lat(r, q="p99_tpot_ms", f="0.8", v=-0.151):
        r["shapes"]["decode"]["runs"][f]["profile"][q]["rel_err"] = v

    fails(lat, "latency")
    fails(lambda r: lat(r, "median_ttft_ms", "0.5", math.nan), "latency")  # NaN is no pass
    # only 0.5x and 0.8x are latency checks: a 0.9x miss is none
    by = copy.deepcopy(good)
    lat(by[6], "p99_ttft_ms", "0.9", 0.9)
    assert mod.acceptance(by)["met"]
    fails(lambda r: r["shapes"]["prompt"]["capacity_sim"]["profile"].update(err=0.051), "capacity_sim")
    fails(lambda r: r["shapes"]["prompt"].update(err_theory=-0.11), "capacity_theory")
    fails(lambda r: r["cross_shape"]["shapes"]["decode"].update(err_sim=0.06), "cross_shape")
    # the calibration shape's own cross-shape row is no check
    by = copy.deepcopy(good)
    by[6]["cross_shape"]["shapes"]["balanced"]["err_sim"] = 0.5
    assert mod.acceptance(by)["met"]
    fails(lambda r: r["shapes"]["balanced"]["runs"].pop("1.5"), "verdicts")
    fails(lambda r: r["shapes"]["balanced"]["runs"]["0.9"].update(theory_verdict="indeterminate"), "verdicts")
    # the server stayed stable at 1.2x and the simulator said unstable: a miss
    fails(lambda r: r["shapes"]["decode"]["runs"]["1.2"].update(measured_verdict="stable"), "verdicts")
    # the linear model's figures are not the profile protocol's
    by = copy.deepcopy(good)
    by[7] = _results(mod, "linear")
    a = mod.acceptance(by)
    assert a["passed"] and not a["complete"] and not a["met"] and "not profile" in a["incomplete_because"][0]
    # one seed, or no cross-shape check: incomplete
    assert not mod.acceptance({6: good[6]})["met"]
    by = copy.deepcopy(good)
    del by[6]["cross_shape"]
    a = mod.acceptance(by)
    assert not a["met"] and a["groups"]["cross_shape"]["n"] == 2


def test_a_metastable_prediction_passes_when_its_margin_holds_what_the_server_did():
    mod = load_script()

    def judge(f, server, slower):
        rr = {"measured_verdict": server, "theory_verdict": "unstable" if f > 1 else "stable", "sim_verdict": "stable",
              "model_verdict": {"simulated": "metastable: an engine 6% slower tips the same arrivals into preemption",
                                "simulated_slower": slower}}
        return mod.judge_verdicts(f, rr)

    # the server held on at 1.2x (stable) or tipped (unstable): the margin holds both when the slower
    # engine's verdict is unstable
    assert judge(1.2, "stable", "unstable: queue grows 0.2 req/s")["ok"]
    assert judge(1.2, "unstable: queue grows 0.2 req/s", "unstable: queue grows 0.1 req/s")["ok"]
    # it does not hold an unstable server when the slower engine stays stable
    j = judge(1.2, "unstable: queue grows 0.2 req/s", "stable")
    assert not j["ok"] and not j["simulated_ok"] and j["theory_ok"]
    assert judge(0.9, "stable", "stable")["ok"]
    assert not judge(0.9, "insufficient data", "unstable")["ok"]
    # without a margin the simulator must say what the factor implies, and the server must do it
    rr = {"measured_verdict": "stable", "theory_verdict": "stable", "model_verdict": {"simulated": "unstable: x"}}
    assert not mod.judge_verdicts(0.5, rr)["ok"]
    # results without model_verdict (older runs): the constant-b simulator's verdict
    assert mod.judge_verdicts(1.5, {"measured_verdict": "overloaded: 30% failed", "theory_verdict": "unstable",
                                    "sim_verdict": "unstable: queue grows 1 req/s"})["ok"]
    assert [mod.verdict_kind(v) for v in ("stable", "unstable: q", "overloaded: x", "metastable: y", "indeterminate",
                                          "insufficient data", None)] == [
        "stable", "unstable", "unstable", "metastable", "indeterminate", "insufficient data", "none"]


def test_factors_and_run_lengths():
    mod = load_script()
    assert mod.parse_factors("acceptance") == [0.5, 0.8, 0.9, 1.2, 1.5]
    assert mod.parse_factors("legacy") == [0.5, 0.8, 0.9, 1.3]
    assert mod.parse_factors("0.5,1.3") == [0.5, 1.3] and mod.parse_factors("none") == []
    assert set(mod.FACTORS) | set(mod.LEGACY_FACTORS) <= set(mod.RUN_S)
    assert set(mod.LATENCY_FACTORS) | set(mod.VERDICT_FACTORS) <= set(mod.FACTORS)
    assert mod.run_seconds(0.5, 250) == 375.0 and mod.run_seconds(1.5, 250) == 250.0
    assert mod.run_seconds(2.0) == mod.DEFAULT_RUN_S


# --- the real profile call, against the stub server ---------------------------------------------------

def test_take_profile_profiles_a_server_over_http(tmp_path):
    """The script's ``take_profile`` (``llmqueue profile``'s run_profile with the script's server
    flags) against the stub: a ladder per context up to max_num_seqs, a usable ``profile:DIR``."""
    pytest.importorskip("aiohttp")
    from llmqueue.bench.stub_server import StubServer
    from llmqueue.engine.step_time import parse_step_time

    mod = load_script()
    steps = {1: 0.012, 2: 0.015, 4: 0.020}
    knobs = {**mod.SERVER, "max_num_seqs": 4}
    with StubServer(decode_steps=",".join(f"{n}:{t}" for n, t in steps.items()), first_token_delay_s=0.01,
                    prefill_token_s=2e-5) as srv:
        acct = mod.take_profile(srv, tmp_path / "p", knobs=knobs, output_tokens=24, budget_s=60)
    assert acct["skipped"] == [] and acct["elapsed_s"] < 60
    assert sorted(acct["cells"]) == [[32, 1], [32, 2], [32, 4], [256, 1], [256, 2], [256, 4]]
    server = json.loads((tmp_path / "p" / "server.json").read_text())
    assert server["max_num_seqs"] == 4 and server["M_usable"] == 63 * 32 and server["max_model_len"] == 512
    model = parse_step_time(f"profile:{tmp_path / 'p'}")
    doc = json.loads((tmp_path / "p" / "profile.json").read_text())
    for c in doc["decode"]:
        n = c["batch"]
        assert model.base(0, n, int(n * c["context_tokens"])) == pytest.approx(steps[n], rel=0.10), c


def test_one_server_cross_shape_runs_every_shape_on_one_server(tmp_path, capsys):
    """``--one-server``: the saturation runs back to back on one server (the source first and last),
    one profile after the first, every run predicted from the first run's calibration. On an engine
    that does not drift, each shape's capacity is predicted within the bar and the source's second
    run (its own stream again) within a per cent or two."""
    mod = load_script()
    calls = simulated_lab(mod, tmp_path)
    out = tmp_path / "out"
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--step-model", "profile",
                     "--cross-shape", "balanced", "--one-server", *QUICK]) == 0
    text = capsys.readouterr().out
    assert calls["runs"] == ["0-balanced", "1-decode", "2-balanced"]
    assert calls["profiles"] == [out / "one-server" / "profile"]
    one = json.loads((out / "fidelity.json").read_text())["cross_shape_one_server"]
    assert one == json.loads((out / "one_server.json").read_text())
    assert [x["shape"] for x in one["runs"]] == ["balanced", "decode", "balanced"]
    assert one["step_time"].startswith(f"profile:{out / 'one-server' / 'profile'}:scale=")
    for x in one["runs"]:
        assert abs(x["err_sim"]) < 0.05, x
        assert x["engine_speed_ratio"] == pytest.approx(1.0, abs=0.02)
    # the second balanced run replays the first's stream on the same engine: the same capacity
    assert one["runs"][2]["mu_measured"] == pytest.approx(one["runs"][0]["mu_measured"], rel=1e-6)
    assert "| cross-shape capacity, simulator, one server | 5 % | 1 of 1 | PASS |" in text
    assert "| 1-decode |" in text


def test_one_server_cross_shape_reports_a_drifting_engine(tmp_path, capsys):
    """The engine slows by 10 % for the decode shape's run on the one server: the bar fails by
    that much, and the drift column says so."""
    mod = load_script()
    simulated_lab(mod, tmp_path, slower={"1-decode": 1.10})
    out = tmp_path / "out"
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--step-model", "profile",
                     "--cross-shape", "balanced", "--one-server", *QUICK]) == 0
    text = capsys.readouterr().out
    runs = json.loads((out / "one_server.json").read_text())["runs"]
    assert runs[1]["err_sim"] == pytest.approx(0.10, abs=0.03)
    assert runs[1]["engine_speed_ratio"] == pytest.approx(1.10, abs=0.02)
    assert abs(runs[1]["err_sim_speed_matched"]) < 0.03  # with the run's own speed put in: right
    assert abs(runs[2]["err_sim"]) < 0.03
    assert "| cross-shape capacity, simulator, one server | 5 % | 0 of 1 | FAIL |" in text
    # --analyze-only --rejudge predicts the saved one-server runs again: the same figures
    saved = json.loads((out / "fidelity.json").read_text())["cross_shape_one_server"]["runs"]
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--analyze-only", "--rejudge"]) == 0
    again = json.loads((out / "fidelity.json").read_text())["cross_shape_one_server"]["runs"]
    assert [x["err_sim"] for x in again] == pytest.approx([x["err_sim"] for x in saved], abs=1e-9)
    assert [x["err_sim_speed_matched"] for x in again[1:]] == pytest.approx(
        [x["err_sim_speed_matched"] for x in saved[1:]], abs=1e-9)


def test_one_server_mirrored_takes_out_a_linear_drift(tmp_path, capsys):
    """``--one-server --mirror``: balanced, decode, decode, balanced on an engine slowing by 5 % a
    run (1.00, 1.05, 1.10, 1.15). Each run predicted from the first run's calibration misses by
    its drift; the source's two runs pooled (their mean level) and the decode shape's two runs
    pooled cancel the linear drift: decode within a per cent, judged on the pooled figure."""
    mod = load_script()
    calls = simulated_lab(mod, tmp_path, slower={"1-decode": 1.05, "2-decode": 1.10, "3-balanced": 1.15})
    out = tmp_path / "out"
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--step-model", "profile",
                     "--cross-shape", "balanced", "--one-server", "--mirror", *QUICK]) == 0
    text = capsys.readouterr().out
    assert calls["runs"] == ["0-balanced", "1-decode", "2-decode", "3-balanced"]
    one = json.loads((out / "one_server.json").read_text())
    assert [x["err_sim"] for x in one["runs"]] == pytest.approx([0.0, 0.05, 0.10, 0.15], abs=0.03)
    pooled = one["pooled"]
    assert pooled["source_level_ratio"] == pytest.approx(1.15, rel=0.02)
    assert pooled["shapes"]["decode"]["runs"] == 2
    assert pooled["shapes"]["decode"]["measured_spread"] == pytest.approx(1.10 / 1.05 - 1, abs=0.02)
    assert abs(pooled["shapes"]["decode"]["err_sim"]) < 0.015
    assert abs(pooled["shapes"]["balanced"]["err_sim"]) < 0.015
    assert "| cross-shape capacity, simulator, one server | 5 % | 1 of 1 | PASS |" in text
    assert "Mirrored on one server" in text
    # --analyze-only --rejudge recomputes the pooled figures: the same
    assert mod.main(["--out", str(out), "--shapes", "balanced,decode", "--analyze-only", "--rejudge"]) == 0
    again = json.loads((out / "fidelity.json").read_text())["cross_shape_one_server"]["pooled"]
    assert again["shapes"]["decode"]["err_sim"] == pytest.approx(pooled["shapes"]["decode"]["err_sim"], abs=1e-9)
    # --mirror needs the one-server check with the profile model
    with pytest.raises(SystemExit) as e:
        mod.main(["--out", str(out), "--shapes", "balanced,decode", "--cross-shape", "balanced", "--one-server",
                  "--mirror"])
    assert e.value.code == 2


def test_one_server_needs_the_source_shape(tmp_path, capsys):
    mod = load_script()
    simulated_lab(mod, tmp_path)
    with pytest.raises(SystemExit) as e:
        mod.main(["--out", str(tmp_path / "out"), "--shapes", "balanced,decode", "--one-server"])
    assert e.value.code == 2
    assert "--one-server: give the calibration's shape with --cross-shape SOURCE" in capsys.readouterr().err
