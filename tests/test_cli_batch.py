"""Tests of ``llmqueue batch``: seed 002's Table 1 through --json, B_min, the decision, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _cli import run_cli

TABLE1_ARGS = ["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sizes", "1,4,8,16,32"]

# Seed 002, Table 1, as printed: B -> (T_svc ms, req/s, rho %, E[W] ms, B/(2 lam) ms, E[T] ms).
TABLE1 = {
    1: (50.5, 19.8, 505, None, 5.0, None),
    4: (52.0, 76.9, 130, None, 20.0, None),
    8: (54.0, 148.1, 67.5, 56.1, 40.0, 150.1),
    16: (58.0, 275.9, 36.3, 16.5, 80.0, 154.5),
    32: (66.0, 484.8, 20.6, 8.6, 160.0, 234.6),
}


def run(*args):
    return run_cli("batch", *args)


def run_json(*args):
    code, out, err = run(*args, "--json")
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def rounds_to(x: float, printed: float) -> bool:
    """True when ``x`` rounds (half-up) to ``printed`` at the number of decimals ``printed`` shows."""
    decimals = len(repr(float(printed)).split(".")[1]) if float(printed) != int(printed) else 0
    return abs(x - printed) <= 0.5 * 10 ** -decimals + 1e-9


def test_table1_reproduced_through_json():
    d = run_json(*TABLE1_ARGS)
    rows = {r["batch_size"]: r for r in d["rows"]}
    assert sorted(rows) == sorted(TABLE1)
    for B, (t_svc, rps, rho_pct, wait, acc, resp) in TABLE1.items():
        r = rows[B]
        assert rounds_to(r["t_svc_ms"], t_svc), (B, r["t_svc_ms"])
        assert rounds_to(r["mu_eff_per_s"], rps), (B, r["mu_eff_per_s"])
        assert rounds_to(100 * r["rho"], rho_pct), (B, r["rho"])  # rho stored as a fraction
        assert rounds_to(r["mean_accumulation_ms"], acc)
        if wait is None:
            assert r["stable"] is False
            assert r["mean_wait_ms"] is None and r["mean_response_ms"] is None
        else:
            assert r["stable"] is True
            assert rounds_to(r["mean_wait_ms"], wait), (B, r["mean_wait_ms"])
            assert rounds_to(r["mean_response_ms"], resp), (B, r["mean_response_ms"])
    assert rows[1]["rho"] == pytest.approx(5.05) and rows[4]["rho"] == pytest.approx(1.30)


def test_b_min_in_json():
    d = run_json(*TABLE1_ARGS)
    assert round(d["b_min_target"], 2) == 7.14 and d["b_min_target_int"] == 8
    assert d["rho_target"] == 0.75
    assert d["b_min_stability"] == pytest.approx(100 * 0.05 / (1 - 0.05)) and d["b_min_stability_int"] == 6
    assert d["lowest_mean_response_batch_size"] == 8
    assert d["decision"] is None


def test_rho_target_flag():
    d = run_json(*TABLE1_ARGS, "--rho-target", "0.55")
    assert d["b_min_target"] == pytest.approx(5 / 0.5) and d["b_min_target_int"] == 10


def test_napkin_math_little():
    d = run_json(*TABLE1_ARGS)
    r16 = next(r for r in d["rows"] if r["batch_size"] == 16)
    # Seed 002: 100 req/s * 0.1545 s = 15.45 requests in system
    assert round(r16["in_system"], 2) == 15.45
    assert r16["in_system"] == pytest.approx(100 * r16["mean_response_ms"] / 1e3)
    assert round(16 * r16["rho"], 1) == 5.8


def test_refined_keys_beside_the_seed():
    d = run_json(*TABLE1_ARGS)
    rows = {r["batch_size"]: r for r in d["rows"]}
    for B, ms in [(8, 92), (16, 133), (32, 221)]:
        r = rows[B]
        assert abs(r["refined_mean_response_ms"] - ms) < 1
        assert r["refined_mean_accumulation_ms"] == pytest.approx((B - 1) / 200 * 1e3)
        assert r["refined_mean_response_ms"] == pytest.approx(
            r["refined_mean_wait_ms"] + r["refined_mean_accumulation_ms"] + r["t_svc_ms"])
    assert rows[1]["refined_mean_response_ms"] is None
    assert "E_B/D/1" in d["model"]


def test_table_output():
    code, out, err = run(*TABLE1_ARGS)
    assert code == 0 and err == ""
    for s in ["505.0% (unstable)", "130.0% (unstable)", "67.5%", "36.3%", "20.6%", "56.1", "150.1",
              "154.5", "234.6", "148.1", "484.8", "7.143 -> 8", "5.263 -> 6", "refined", "E_B/D/1"]:
        assert s in out, s
    assert "P99" not in out.split("\n\n")[0]  # no P99 columns without --slo-ms


def test_decision_with_b_max():
    d = run_json("--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--b-max", "32",
                 "--slo-ms", "300")
    assert [r["batch_size"] for r in d["rows"]] == [6, 12, 18, 24, 30, 32]
    dec = d["decision"]
    assert dec["candidates"] == [6, 12, 18, 24, 30, 32]
    assert dec["batch_size"] == dec["batch_size_normal"] == 12
    assert dec["batch_size_exponential"] is None
    assert dec["action_batch_size"] == 12 and dec["action"] == "consider reducing replicas to save cost"
    for r in d["rows"]:
        assert r["p99_exponential_ms"] == pytest.approx(4.605170185988092 * r["mean_response_ms"])
        assert r["p99_normal_ms"] == pytest.approx(r["mean_response_ms"] + 2.33 * r["sd_response_ms"])


def test_decision_exponential_and_sigma():
    d = run_json(*TABLE1_ARGS, "--slo-ms", "700", "--p99", "exponential")
    assert d["decision"]["batch_size"] == 8 and d["decision"]["p99_method"] == "exponential"
    d = run_json(*TABLE1_ARGS, "--slo-ms", "200", "--sigma-ms", "10")
    r16 = next(r for r in d["rows"] if r["batch_size"] == 16)
    assert r16["sd_response_ms"] == 10 and r16["p99_normal_ms"] == pytest.approx(r16["mean_response_ms"] + 23.3)
    assert d["decision"]["batch_size"] == 16


def test_decision_table_output():
    code, out, _ = run(*TABLE1_ARGS, "--slo-ms", "400")
    assert code == 0
    assert "P99 normal ms" in out and "largest B with P99 <= 400 ms (normal)" in out
    assert "increase batch size or add replicas" in out


def test_dynamic_batching_timeout():
    d = run_json("--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sizes", "8,16",
                 "--t-max-ms", "100")
    r8, r16 = d["rows"]
    assert r8["mean_accumulation_ms"] == pytest.approx(40.0)           # lam T_max = 10 >= 8: fills
    assert r16["mean_accumulation_ms"] == pytest.approx(50.0)          # 10 < 16: T_max / 2
    assert r16["effective_batch_size"] == pytest.approx(10.0)
    assert r16["refined_mean_response_ms"] is None
    code, out, _ = run("--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sizes", "8,16",
                       "--t-max-ms", "100")
    assert code == 0 and "B_eff" in out and "T_max = 100 ms" in out


def test_b_max_caps_sizes():
    d = run_json(*TABLE1_ARGS, "--b-max", "16")
    assert [r["batch_size"] for r in d["rows"]] == [1, 4, 8, 16]


def test_help_documents_json_keys():
    code, out, _ = run("--help")
    assert code == 0
    for key in ["t_svc_ms", "mean_wait_ms", "mean_response_ms", "refined_mean_response_ms", "b_min_target_int",
                "--slo-ms", "--t-max-ms", "--sigma-ms", "--rho-target", "--b-max"]:
        assert key in out, key


@pytest.mark.parametrize("args,flag", [
    (["--lam", "0", "--t-fixed-ms", "50", "--t-req-ms", "0.5"], "--rate"),
    (["--lam", "-5", "--t-fixed-ms", "50", "--t-req-ms", "0.5"], "--rate"),
    (["--lam", "nan", "--t-fixed-ms", "50", "--t-req-ms", "0.5"], "--rate"),
    (["--lam", "100", "--t-fixed-ms", "0", "--t-req-ms", "0.5"], "--t-fixed-ms"),
    (["--lam", "100", "--t-fixed-ms", "nan", "--t-req-ms", "0.5"], "--t-fixed-ms"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "-0.5"], "--t-req-ms"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "8"], "--rho-target"),      # lam t_req = 0.8 >= 0.75
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "7.5"], "--rho-target"),    # equal is not enough
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--rho-target", "1.2"], "--rho-target"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--rho-target", "0"], "--rho-target"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sizes", "0,8"], "--sizes"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sizes", "8,x"], "--sizes"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sizes", "2.5"], "--sizes"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--b-max", "0"], "--b-max"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--slo-ms", "-1"], "--slo-ms"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--t-max-ms", "0"], "--t-max-ms"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sigma-ms", "nan"], "--sigma-ms"),
    (["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "20", "--b-max", "8"], "--rate"),  # nothing stable
])
def test_bad_input_one_line_exit_2(args, flag):
    code, out, err = run(*args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"llmqueue: error: {flag}"), lines[0]


def test_unreachable_target_message():
    code, _, err = run("--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "8")
    assert code == 2 and "no batch size reaches utilization 0.75" in err and "0.8" in err


@pytest.mark.parametrize("args", [
    ["--t-fixed-ms", "50", "--t-req-ms", "0.5"],                       # --lam missing
    ["--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--p99", "median"],
])
def test_usage_errors_exit_2(args):
    code, out, err = run(*args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("llmqueue: error:")


def test_subprocess_json_and_no_traceback():
    p = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "batch", *TABLE1_ARGS, "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and json.loads(p.stdout)["b_min_target_int"] == 8
    p = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "batch", "--lam", "100", "--t-fixed-ms", "50",
                        "--t-req-ms", "8"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_batch_command_imports_no_numpy():
    code = ("import sys; from llmqueue.cli.main import main; "
            "main(['batch', '--lam', '100', '--t-fixed-ms', '50', '--t-req-ms', '0.5', '--json']); "
            "print('numpy' in sys.modules, 'scipy' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stderr.split() == ["False", "False"]
