"""The planner's measured inputs (:mod:`llmqueue.plan.inputs`) and its resume from the point cache.

- ``--calibration FILE``: a calibration written by ``llmqueue calibrate`` from a simulated run
  of the planner tests' cheap scenario on one a100-40gb replica; the plan prices every step and
  ``M`` with it (theory and simulation), says so, and refuses a space of other GPUs or sizes.
- ``--step-time SPEC``: a constant 20 ms step puts the TPOT bound at exactly 20 ms; a
  ``fitted:FILE`` spec whose file changes is simulated afresh (the cache key holds its bytes).
- resume: a plan interrupted after two simulations and rerun with the same ``--out`` simulates
  only the rest and gives the uninterrupted plan's answer and numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import run_cli

from llmqueue.plan.planner import plan

from test_plan_planner import RUN, SLOS, SPACE, write_tiny

ONE = dict(SPACE, gpus=["a100-40gb"], tp=(1,))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    sc = Path(write_tiny(tmp_path_factory, "plan_inputs"))
    d = sc.parent
    run = d / "run"
    assert run_cli("simulate", "--scenario", str(sc), "--gpu", "a100-40gb", "--max-num-seqs", "16",
                   "--max-num-batched-tokens", "512", "--duration", "120", "--out", str(run)).code == 0
    cal = d / "cal.yaml"
    assert run_cli("calibrate", str(run), "-o", str(cal)).code == 0
    return {"dir": d, "scenario": str(sc), "calibration": cal}


def _err(args) -> str:
    code, out, err = run_cli(*args)
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error: "), err
    return lines[0]


def test_plan_with_a_calibration(files, tmp_path):
    import yaml

    cal = yaml.safe_load(files["calibration"].read_text())
    assert cal["step_time_linear"].startswith("linear:")
    out = tmp_path / "out"
    args = ["plan", "--scenario", files["scenario"], "--gpus", "a100-40gb", "--tp", "1", "--replicas", "1..4",
            "--max-num-seqs", "2,16", "--max-num-batched-tokens", "512", "--duration", "120", "--seed", "3",
            "--no-sensitivity", "--calibration", str(files["calibration"]), "--out", str(out)]
    ran = run_cli(*args)
    assert ran.code == 0
    text = ran.out
    d = json.loads((out / "plan.json").read_text())
    assert d["step_model_source"].startswith(f"calibration {files['calibration']}: linear step model linear:")
    assert d["step_inputs"] == {"step_time": cal["step_time_linear"], "capacity_tokens": cal["capacity_tokens"]}
    assert "step model" in text and "calibration" in text
    # every simulation ran with the calibrated model and M
    points = [json.loads(p.read_text()) for p in (out / "points").glob("*.json")]
    assert points and all(p["params"]["step_time"] == cal["step_time_linear"] for p in points)
    assert all(p["params"]["capacity_tokens"] == cal["capacity_tokens"] for p in points)
    # the theory used it too: the TPOT bound is the calibrated decode step alone at the mean prompt
    c0, ctx = cal["linear"]["c0"], cal["linear"]["ctx"]
    mean_prompt = d["mean_prompt_tokens"]
    bounds = {c["tpot_bound_ms"] for c in d["candidates"] if c["tpot_bound_ms"] is not None}
    assert bounds and all(b == pytest.approx(1e3 * (c0 + ctx * mean_prompt), rel=1e-3) for b in bounds)
    # the recommendation meets the SLOs in its confirming simulation
    assert d["recommended"]["simulation"]["meets"]


@pytest.mark.parametrize("extra, words", [
    (["--gpus", "a100-40gb,h100-sxm", "--tp", "1"], ["--calibration", "one GPU at one tensor-parallel size",
                                                     "2 GPU types"]),
    (["--gpus", "a100-40gb", "--tp", "1,2"], ["--calibration", "2 tensor-parallel sizes"]),
    (["--gpus", "a100-40gb", "--tp", "1", "--step-time", "0.02"], ["--calibration", "not both"]),
])
def test_calibration_refused_outside_its_server(files, tmp_path, extra, words):
    line = _err(["plan", "--scenario", files["scenario"], "--calibration", str(files["calibration"]),
                         "--out", str(tmp_path / "o"), *extra])
    for w in words:
        assert w in line


def test_calibration_that_records_its_gpu(files, tmp_path):
    """A calibration naming its GPU and size is refused on another GPU, named in the fix."""
    import yaml

    d = yaml.safe_load(files["calibration"].read_text())
    d["gpu"], d["tensor_parallel_size"] = "h100-sxm", 1
    p = tmp_path / "cal_h100.yaml"
    p.write_text(yaml.safe_dump(d))
    line = _err(["plan", "--scenario", files["scenario"], "--calibration", str(p), "--gpus", "a100-40gb",
                         "--tp", "1", "--out", str(tmp_path / "o")])
    assert "was measured on h100-sxm, not a100-40gb" in line and "--gpus h100-sxm" in line


def test_step_time_spec(files, tmp_path):
    res = plan(files["scenario"], slos=SLOS, **ONE, **RUN, step_time="0.02", out_dir=tmp_path / "a")
    assert res.meta["step_model_source"].startswith("step-time 0.02 (given)")
    assert [c.tpot_bound_ms for c in res.candidates] == pytest.approx([20.0] * len(res.candidates))  # 20 ms steps
    assert all(c.result["p99_tpot_ms"] == pytest.approx(20.0) for c in res.candidates if c.result)
    line = _err(["plan", "--scenario", files["scenario"], "--gpus", "a100-40gb", "--tp", "1",
                         "--step-time", "0.02", "--slo-tpot-p99-ms", "15", "--out", str(tmp_path / "o")])
    assert "--slo-tpot-p99-ms" in line and "below the fastest single-request decode step 20 ms" in line
    line = _err(["plan", "--scenario", files["scenario"], "--step-time", "0.02", "--out", str(tmp_path / "o")])
    assert "--step-time" in line and "one GPU at one tensor-parallel size" in line
    line = _err(["plan", "--scenario", files["scenario"], "--gpus", "a100-40gb", "--tp", "1",
                         "--step-time", "warp:9", "--out", str(tmp_path / "o")])
    assert "--step-time" in line and "unknown step-time model 'warp'" in line


def test_fitted_file_change_is_not_answered_from_the_cache(files, tmp_path):
    """``fitted:FILE``: the same path with other contents is a different point."""
    f = tmp_path / "fit.yaml"
    f.write_text("step_time: 0.015\n")
    kw = dict(slos=SLOS, **ONE, **RUN, step_time=f"fitted:{f}", out_dir=tmp_path / "out")
    first = plan(files["scenario"], **kw)
    again = plan(files["scenario"], **kw)
    assert again.meta["simulations_run"] == 0 and again.meta["simulations_cached"] == first.meta["simulations_run"]
    f.write_text("step_time: 0.016\n")
    changed = plan(files["scenario"], **kw)
    assert changed.meta["simulations_cached"] == 0 and changed.meta["simulations_run"] > 0


# --- resume ---------------------------------------------------------------------------------------

def _answer(res):
    return res.recommended.config, {c.config: (c.result["p99_ttft_ms"], c.result["p99_tpot_ms"])
                                    for c in res.candidates if c.result}


def test_interrupted_plan_resumes_from_the_cache(files, tmp_path):
    whole = plan(files["scenario"], slos=SLOS, **SPACE, **RUN, out_dir=tmp_path / "whole")
    n = whole.meta["simulations_run"]
    assert n >= 3 and whole.meta["resumed"] == {"cached": 0, "points": n}
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        plan(files["scenario"], slos=SLOS, **SPACE, **RUN, out_dir=out, stop_after=2)
    assert len(list((out / "points").glob("*.json"))) == 2
    resumed = plan(files["scenario"], slos=SLOS, **SPACE, **RUN, out_dir=out)
    assert resumed.meta["simulations_cached"] == 2 and resumed.meta["simulations_run"] == n - 2
    assert resumed.meta["resumed"] == {"cached": 2, "points": n}
    assert _answer(resumed) == _answer(whole)
    # the command says so; a changed seed is a different workload: nothing reused
    args = ["plan", "--scenario", files["scenario"], "--gpus", "l4,a100-40gb,h100-sxm", "--tp", "1,2", "--replicas",
            "1..4", "--max-num-seqs", "2,16", "--max-num-batched-tokens", "512", "--duration", "120",
            "--no-sensitivity", "--out", str(out)]
    ran = run_cli(*args, "--seed", "3")
    assert ran.code == 0
    assert f"resumed: {n} of {n} points from the cache" in ran.out
    d = run_cli(*args, "--seed", "4", "--json").json()
    assert d["resumed"]["cached"] == 0 and d["simulations_run"] >= 1


def test_calibration_refuses_two_models(files, tmp_path):
    line = _err(["plan", "--scenario", files["scenario"], "--models", "llama-3.1-8b,llama-3.1-70b",
                         "--gpus", "a100-40gb", "--tp", "1", "--calibration", str(files["calibration"]),
                         "--out", str(tmp_path / "o")])
    assert "--calibration" in line and "describes one model" in line and "--models" in line
    assert not (tmp_path / "o").exists()
