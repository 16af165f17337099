"""Calibrate and validate on simulated runs, where the truth is known."""

import json

import pytest

from llmqueue.cli.main import main


def _sim(tmp_path, name, step, extra=()):
    out = tmp_path / name
    code = main(["simulate", "--capacity-tokens", "20000", "--step-time", step, "--prompt", "uniform:10:400",
                 "--output", "uniform:10:200", "--arrival", "poisson:12", "--duration", "400", "--out", str(out),
                 "--no-progress", "--json", *extra])
    assert code == 0
    return out


def test_calibrate_recovers_the_step_model_and_capacity(tmp_path, capsys):
    run = _sim(tmp_path, "lin", "linear:c0=0.01:prefill=2e-5:decode=3e-4")
    capsys.readouterr()
    cal = tmp_path / "cal.yaml"
    assert main(["calibrate", str(run), "-o", str(cal), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["capacity_tokens"] == 20000  # from the run's summary (block-rounded M)
    lin = d["linear"]
    assert lin["c0"] == pytest.approx(0.01, rel=1e-6)
    assert lin["prefill"] == pytest.approx(2e-5, rel=1e-6)
    assert lin["decode"] == pytest.approx(3e-4, rel=1e-6)
    assert lin["r2"] > 0.999999
    # validating the run against its own calibrated linear model reproduces it exactly
    assert main(["validate", str(run), "--calibration", str(cal), "--step-model", "linear", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    for r in v["rows"]:
        if r["measured"] is not None:
            assert r["rel_err_sim"] == pytest.approx(0.0, abs=1e-9), r


def test_constant_step_calibration_predicts_capacity(tmp_path, capsys):
    run = _sim(tmp_path, "sat", "0.03", ["--arrival", "poisson:60"])
    capsys.readouterr()
    cal = tmp_path / "cal.yaml"
    assert main(["calibrate", str(run), "-o", str(cal), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["b"] == pytest.approx(0.03)
    assert main(["validate", str(run), "--calibration", str(cal), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["saturated"]
    cap = v["capacity"]
    assert abs(cap["rel_err_sim"]) < 1e-9          # the same simulator with the same inputs
    assert abs(cap["rel_err_theory"]) < 0.10       # seed 004's bar for the closed form


def test_calibrate_errors(tmp_path):
    assert main(["calibrate", str(tmp_path / "nope")]) == 2
