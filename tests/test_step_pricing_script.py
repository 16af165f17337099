"""``benchmarks/step_pricing.py``: a run simulated with a known step model is priced exactly by that
model in every batch group, and mispriced by another; bad input is one line, exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from _cli import run_cli

REPO = Path(__file__).resolve().parents[1]
TRUE = "linear:c0=0.01:prefill=1e-5:decode=1e-3"  # no context term: a decode stretch's steps cost the same


def _script():
    spec = importlib.util.spec_from_file_location("step_pricing_under_test", REPO / "benchmarks" / "step_pricing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_true_model_prices_every_group_exactly(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli("simulate", "--capacity-tokens", "30000", "--step-time", TRUE, "--prompt", "uniform:10:300",
                   "--output", "uniform:10:200", "--arrival", "poisson:12", "--duration", "60", "--max-num-seqs", "64",
                   "--out", str(run), "--no-progress", "--json").code == 0
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"step_time": TRUE, "step_time_linear": TRUE, "b": 0.05, "block_size": 16}))
    assert _script().main([str(run), "--calibration", str(cal), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)[0]
    groups = {g["group"]: g for g in res["groups"]}
    assert "with prompt tokens" in groups and any(k.startswith("decode") for k in groups)
    assert sum(g["steps"] for g in groups.values()) == res["steps"] > 100
    for g in groups.values():
        assert g["linear"] == pytest.approx(0.0, abs=1e-9), g
    assert any(abs(g["constant"]) > 0.1 for g in groups.values())  # a constant 50 ms step is wrong somewhere


def test_a_run_without_steps_is_one_line(tmp_path, capsys):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"step_time": TRUE, "b": 0.05}))
    (tmp_path / "empty").mkdir()
    assert _script().main([str(tmp_path / "empty"), "--calibration", str(cal)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1
