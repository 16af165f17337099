"""``llmqueue sweep`` and ``llmqueue capacity``: seed 004's verdicts, grids, files, resume, errors."""

from __future__ import annotations

import json

import pytest
from _cli import run_cli

# seed 004's 1:1 setting: M = 131,000 tokens, b = 0.0372 s, chunk 512, prompt and output U{10..1600}
SEED004 = ["--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512",
           "--prompt", "uniform:10:1600", "--output", "uniform:10:1600"]


def test_seed004_rates_give_the_papers_verdicts(tmp_path):
    """Seed 004, Figure 2 (1:1): stable at 1 and 3 req/s, unstable at 5, 20 and 50 (mu = 3.263)."""
    code, out, err = run_cli("sweep", "--rates", "1,3,5,20,50", *SEED004, "--duration", "600",
                             "--out", str(tmp_path), "--json", "--no-progress")
    assert code == 0, err
    d = json.loads(out)
    verdicts = ["stable" if p["stable"] else "unstable" for p in d["points"]]
    assert verdicts == ["stable", "stable", "unstable", "unstable", "unstable"]
    assert [p["rate"] for p in d["points"]] == [1, 3, 5, 20, 50]
    assert all(p["verdict"].startswith("unstable: queue grows") for p in d["points"][2:])
    (c,) = d["curves"]
    assert c["theory_mu"] == pytest.approx(3.263, abs=0.002)  # seed 004, Table 1
    assert c["stable_up_to"] == 3 and c["unstable_from"] == 5
    # saturated throughput near mu (seed 004 measured 3.387 on vLLM; the theory says 3.263)
    assert 3.0 < d["points"][-1]["request_throughput"] < 3.35
    assert c["knee"] is not None and 1 < c["knee"]["rate"] <= 3 and c["knee"]["bracket"] == [1, 3]
    # files: the table (one row per point) and the JSON; one cached point per rate
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "sweep.parquet")
    assert t.num_rows == 5 and {"rate", "verdict", "little_gap", "theory_mu", "p99_ttft_ms_ci_hi"} <= set(t.column_names)
    assert json.loads((tmp_path / "sweep.json").read_text())["points"] == d["points"]
    assert len(list((tmp_path / "points").glob("*.json"))) == 5
    # resume: nothing left to simulate, identical table
    code, out2, _ = run_cli("sweep", "--rates", "1,3,5,20,50", *SEED004, "--duration", "600",
                            "--out", str(tmp_path), "--json", "--no-progress", "--backend", "serial")
    d2 = json.loads(out2)
    assert (d2["ran"], d2["cached"]) == (0, 5)
    assert [{k: v for k, v in p.items() if k != "wall_s"} for p in d2["points"]] == \
        [{k: v for k, v in p.items() if k != "wall_s"} for p in d["points"]]


def test_param_grid_table_and_slo_line(tmp_path):
    code, out, err = run_cli("sweep", "--rates", "1,2", "--param", "max_num_seqs=4,256", *SEED004,
                             "--duration", "120", "--backend", "serial", "--slo-ttft-ms", "5000",
                             "--slo-tpot-ms", "100", "--out", str(tmp_path), "--csv", "--keep-runs")
    assert code == 0, err
    assert "Sweep: 4 points on serial" in out
    assert out.count("Curve max_num_seqs=") == 2 and "knee" in out and "theory mu" in out
    assert "highest rate meeting the SLO" in out
    assert (tmp_path / "sweep.csv").is_file() and not (tmp_path / "sweep.parquet").exists()
    assert len(list((tmp_path / "runs").glob("*/requests.parquet"))) == 4
    d = json.loads((tmp_path / "sweep.json").read_text())
    assert [(p["max_num_seqs"], p["rate"]) for p in d["points"]] == [(4, 1), (4, 2), (256, 1), (256, 2)]
    # four slots bind: mu_seqs = 4 / (b E[steps]) is the theory's capacity at max_num_seqs=4
    assert d["points"][0]["theory_binding"] == "max_num_seqs"
    assert d["points"][2]["theory_binding"] == "KV cache (Nie et al. 2026)"
    assert all(isinstance(p["slo_met"], bool) for p in d["points"])
    # every row carries the failed share and the goodput, the table shows them
    assert all(p["failed_share"] is not None and p["request_goodput"] is not None for p in d["points"])
    assert "failed" in out and "goodput (req/s)" in out


def test_scenario_sweep_with_knob_override():
    code, out, err = run_cli("sweep", "--scenario", "chat", "--rates", "4,8", "--duration", "120",
                             "--max-num-seqs", "32", "--backend", "serial", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["base"]["max_num_seqs"] == 32 and d["slos"] == {"p99_ttft_ms": 2000.0, "p99_tpot_ms": 50.0}
    assert [round(p["offered_rate"], 6) for p in d["points"]] == [4, 8]
    assert all(p["theory_mu_seqs"] is not None for p in d["points"])


@pytest.mark.parametrize("args, flag", [
    (["--param", "max_num_seqs"], "--param"),
    (["--param", "max_num_seq=4"], "max_num_seqs"),
    (["--param", "max_num_seqs=four"], "param"),
    (["--rates", "1,x"], "--rates"),
    (["--rates", "1,-2"], "--rates"),
    (["--backend", "threads"], "--backend"),
    (["--address", "auto"], "--address"),
    (["--knee-factor", "1"], "--knee-factor"),
])
def test_errors_are_one_line_with_exit_2(args, flag):
    code, out, err = run_cli("sweep", "--rates", "1", *SEED004, "--duration", "60", "--backend", "serial", *args)
    assert code == 2
    assert err.startswith("llmqueue: error: ") and err.count("\n") == 1 and flag in err, err
    assert out == ""


@pytest.mark.parametrize("cmd", ["sweep", "capacity"])
@pytest.mark.parametrize("args, flag", [
    (["--trace", "t.csv"], "--trace"),                   # a scenario's workload cannot replay a trace flag
    (["--prompt", "fixed:10"], "--prompt"),              # "mixed" has several classes
    (["--max-num-seqs", "0"], "--max-num-seqs"),         # out of range
    (["--max-num-batched-tokens", "8"], "--max-num-batched-tokens"),  # below max_num_seqs: vLLM refuses
    (["--model", "llama-9"], "--model"),                 # unknown model, found by the scenario's validation
])
def test_scenario_flags_that_cannot_apply_fail_before_any_point(cmd, args, flag):
    """A flag given with --scenario overrides the scenario's field, or fails in one line naming the
    flag (exit 2) before any point is simulated; never a silent drop."""
    code, out, err = run_cli(cmd, "--scenario", "mixed", "--rates" if cmd == "sweep" else "--lo", "1",
                             "--backend", "serial", *args)
    assert code == 2 and out == ""
    assert err.startswith(f"llmqueue: error: {flag}") and err.count("\n") == 1, err


def test_scenario_sweep_arrival_override_sets_the_base_rate():
    """--arrival with --scenario replaces the scenario's arrival process: the capacity search
    starts from its rate, and a sweep's --rates rescale it."""
    from llmqueue.plan.points import base_rate
    from llmqueue.spec import scenario_spec

    assert base_rate(scenario_spec, {"scenario": "chat", "arrival": "gamma:3:cv=2"}) == pytest.approx(3.0)
    code, out, err = run_cli("sweep", "--scenario", "chat", "--arrival", "gamma:3:cv=2", "--rates", "2",
                             "--duration", "120", "--max-num-seqs", "16", "--backend", "serial", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["base"]["arrival"] == "gamma:3:cv=2" and d["base"]["max_num_seqs"] == 16
    (p,) = d["points"]
    assert p["offered_rate"] == pytest.approx(2.0)
    assert p["arrival_rate"] == pytest.approx(2.0, rel=0.25)  # 120 s of a CV-2 process: a loose check


def test_capacity_cli_on_seed004(tmp_path):
    """Seed 004's 1:1 setting, p99 TTFT <= 10 s: the queue of KV-bound requests binds below mu."""
    args = ["capacity", "--slo-ttft-ms", "10000", "--slo-tpot-ms", "100", *SEED004, "--arrival", "poisson:1",
            "--duration", "600", "--no-progress", "--out", str(tmp_path)]
    code, out, err = run_cli(*args)
    assert code == 0, err
    assert "capacity (req/s)" in out and "confirm: at 1.1 x" in out and "Simulated rates" in out
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["simulations"] == 0 and d["cached"] > 5  # every rate came from the cache
    assert d["accepted"] and d["converged"]
    assert d["theory_mu"] == pytest.approx(3.263, abs=0.002)
    assert 2.0 < d["rate"] < 3.2
    assert d["confirm"]["above"]["rate"] == pytest.approx(1.1 * d["rate"])
    assert d["confirm"]["at_rate"]["p99_ttft_ms"] <= 10000 < d["confirm"]["above"]["p99_ttft_ms"]


def test_capacity_needs_targets():
    code, _, err = run_cli("capacity", *SEED004, "--arrival", "poisson:1", "--duration", "60")
    assert code == 2 and "--slo-ttft-ms" in err


def test_sweep_against_a_server_with_url():
    """`--url`: each point's request stream is sent to a real (here: stub) server, one point at a time."""
    import json as _json

    from llmqueue.bench.stub_server import StubServer

    with StubServer() as srv:
        ran = run_cli("sweep", "--url", srv.url, "--rates", "4,8", "--prompt", "fixed:20", "--output", "fixed:5",
                      "--duration", "4", "--json", "--no-progress")
        code = ran.code
        served = srv.stats()
    assert code == 0
    d = _json.loads(ran.out)
    assert d["ran"] == 2 and d["backend"].startswith("serial")
    thr = d["curves"][0]["throughput"]
    assert thr[1] > thr[0] > 0  # the server saw both offered rates
    assert served  # the stub answered requests
