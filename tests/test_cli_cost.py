"""Tests of ``llmqueue cost``: tokens, error-budget and replicas subcommands, JSON and errors."""

from __future__ import annotations

import json

import pytest
from _cli import run_cli


def run(*args):
    return run_cli("cost", *args)


def run_json(*args):
    code, out, err = run(*args, "--json")
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def test_tokens_json():
    d = run_json("tokens", "--tokens-per-s", "2500", "--price-per-hour", "8", "--utilization", "0.5")
    assert d["tokens_per_dollar"] == pytest.approx(1_125_000)        # 3600 * 2500 / 8
    assert d["dollars_per_Mtok"] == pytest.approx(8e6 / 9e6)         # 8 * 1e6 / (3600 * 2500)
    assert d["tokens_per_dollar_eff"] == pytest.approx(562_500)
    assert d["dollars_per_Mtok_eff"] == pytest.approx(16 / 9)
    assert d["Q"] == 2500 and d["C_hour"] == 8 and d["u"] == 0.5


def test_tokens_table():
    code, out, err = run("tokens", "--tokens-per-s", "2500", "--price-per-hour", "8")
    assert code == 0 and err == ""
    assert "1,125,000" in out and "0.8889" in out


def test_error_budget_requests():
    d = run_json("error-budget", "--slo-target", "0.999", "--requests", "1000000", "--bad", "250")
    assert d["allowed"] == pytest.approx(1000)
    assert d["burned"] == pytest.approx(0.25) and d["remaining"] == pytest.approx(750)
    assert d["exhausted"] is False and d["window"] is None


def test_error_budget_rate_window():
    d = run_json("error-budget", "--slo-target", "0.999", "--rate", "100", "--window-s", "2592000")
    assert d["N"] == pytest.approx(259_200_000) and d["allowed"] == pytest.approx(259_200)
    assert d["downtime"] == pytest.approx(2592)
    assert d["bad"] is None and d["burned"] is None


def test_error_budget_table():
    code, out, _ = run("error-budget", "--slo-target", "0.999", "--requests", "1000000", "--bad", "1500")
    assert code == 0
    assert "150%" in out and "-500" in out and "yes" in out


def test_replicas():
    d = run_json("replicas", "--lam", "300", "--mu", "100", "--rho-target", "0.7")
    assert d["c"] == 5 and d["rho"] == pytest.approx(0.6) and d["c_stable"] == 4
    code, out, _ = run("replicas", "--lam", "300", "--mu", "100")
    assert code == 0 and "replicas c" in out


def test_help():
    code, out, _ = run("--help")
    assert code == 0
    for sub in ("tokens", "error-budget", "replicas"):
        assert sub in out
    code, out, _ = run("tokens", "--help")
    assert code == 0 and "--tokens-per-s" in out and "--price-per-hour" in out and "--utilization" in out


@pytest.mark.parametrize("args,flag", [
    (["tokens", "--tokens-per-s", "0", "--price-per-hour", "8"], "--tokens-per-s"),
    (["tokens", "--tokens-per-s", "nan", "--price-per-hour", "8"], "--tokens-per-s"),
    (["tokens", "--tokens-per-s", "100", "--price-per-hour", "-8"], "--price-per-hour"),
    (["tokens", "--tokens-per-s", "100", "--price-per-hour", "8", "--utilization", "0"], "--utilization"),
    (["tokens", "--tokens-per-s", "100", "--price-per-hour", "8", "--utilization", "1.5"], "--utilization"),
    (["error-budget", "--slo-target", "1.5", "--requests", "100"], "--slo-target"),
    (["error-budget", "--slo-target", "nan", "--requests", "100"], "--slo-target"),
    (["error-budget", "--slo-target", "0.999"], "--requests"),
    (["error-budget", "--slo-target", "0.999", "--requests", "-3"], "--requests"),
    (["error-budget", "--slo-target", "0.999", "--rate", "10"], "--window-s"),
    (["error-budget", "--slo-target", "0.999", "--rate", "0", "--window-s", "10"], "--rate"),
    (["error-budget", "--slo-target", "0.999", "--requests", "10", "--rate", "1", "--window-s", "10"], "--requests"),
    (["error-budget", "--slo-target", "0.999", "--requests", "10", "--bad", "11"], "--bad"),
    (["replicas", "--lam", "0", "--mu", "100"], "--rate"),
    (["replicas", "--lam", "10", "--mu", "nan"], "--mu"),
    (["replicas", "--lam", "10", "--mu", "100", "--rho-target", "1"], "--rho-target"),
])
def test_bad_input_one_line_exit_2(args, flag):
    code, out, err = run(*args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"llmqueue: error: {flag}"), lines[0]


@pytest.mark.parametrize("args", [["tokens", "--price-per-hour", "8"], ["nonsense"], ["replicas", "--lam", "x"]])
def test_usage_errors_exit_2(args):
    code, out, err = run(*args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("llmqueue: error:")


def test_bare_group_prints_help():
    code, out, err = run()
    assert code == 0 and "error-budget" in out and err == ""
