"""``llmqueue example``: the README's main job recomputes the seeds' worked numbers."""

from _cli import run_cli


def test_example_reproduces_the_seeds():
    d = run_cli("example", "--json").json()
    assert [round(r["L"]) for r in d["little"]] == [r["source_L"] for r in d["little"]] == [108, 162, 189]
    for r in d["stability"]["settings"]:
        assert abs(r["mu"] - r["paper_mu_theory"]) / r["paper_mu_theory"] < 0.005
        assert r["verdicts"]["1"] == "stable" and r["verdicts"]["50"] == "unstable"
    rows = {r["B"]: r for r in d["batch"]["rows"]}
    assert not rows[1]["stable"] and not rows[4]["stable"]
    for B in (8, 16, 32):
        assert round(rows[B]["mean_response_ms"], 1) == rows[B]["source_mean_response_ms"]
        assert rows[B]["refined_mean_response_ms"] < rows[B]["mean_response_ms"]
    assert d["batch"]["B_min_rho_0.75_int"] == 8
    assert 2.1e9 < d["kv"]["llama-2-7b_4096_on_a100-80gb"]["kv_bytes_per_request"] < 2.2e9
    stable, sat = d["simulation"]
    assert stable["verdict"] == stable["theory_verdict"] == "stable"
    assert sat["verdict"].startswith("unstable") and sat["theory_verdict"] == "unstable"
    assert abs(sat["throughput"] - sat["mu_theory"]) / sat["mu_theory"] < 0.10


def test_example_table_prints():
    ran = run_cli("example")
    assert ran.code == 0
    out = ran.out
    assert "Little's law" in out and "KV-memory stability" in out and "Erlang-B/D/1" in out
