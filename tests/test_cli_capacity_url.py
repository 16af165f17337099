"""``llmqueue capacity --url``: the SLO search measured on a server (the stub, loopback only)."""

from __future__ import annotations

import json

import pytest
from _cli import run_cli

from llmqueue.bench.stub_server import StubServer


@pytest.fixture(scope="module")
def stub():
    with StubServer(first_token_delay_s=0.05, token_delay_s=0.001) as s:
        yield s


WL = ("--prompt", "fixed:8", "--output", "fixed:2", "--arrival", "poisson:20", "--num-requests", "20", "--json",
      "--no-progress")


def test_capacity_url_measures_each_rate_on_the_server(stub, tmp_path):
    seen = stub.stats()["requests"]
    code, out, err = run_cli("capacity", "--url", stub.url, "--slo-ttft-ms", "1000", *WL, "--hi", "40",
                             "--max-evals", "2", "--out", str(tmp_path / "cap"))
    assert code == 0, err
    d = json.loads(out)
    assert d["measured"] is True and d["target"] == {"url": stub.url, "model": stub.model}
    rates = [e["rate"] for e in d["evaluations"]]
    assert rates == [20.0, 40.0, 80.0, 160.0]  # no theory bound: doubling until the budget ends
    assert stub.stats()["requests"] - seen == 20 * len(rates)  # every rate was sent to the server
    for e in d["evaluations"]:  # the server's 50 ms first token, measured from the send
        assert e["meets"] and 45 <= e["p99_ttft_ms"] <= 500
    assert d["rate"] == 160.0 and d["theory_mu"] is None
    assert len(list((tmp_path / "cap" / "points").glob("*.json"))) == 4
    # a rerun reads the measured points from the cache: nothing is sent
    seen = stub.stats()["requests"]
    code, out, err = run_cli("capacity", "--url", stub.url, "--slo-ttft-ms", "1000", *WL, "--hi", "40",
                             "--max-evals", "2", "--out", str(tmp_path / "cap"))
    assert code == 0, err
    assert json.loads(out)["cached"] == 4 and stub.stats()["requests"] == seen


def test_capacity_url_no_rate_meets_an_slo_below_the_servers_ttft(stub):
    code, out, err = run_cli("capacity", "--url", stub.url, "--served-model", stub.model, "--slo-ttft-ms", "10",
                             *WL, "--arrival", "poisson:400", "--max-evals", "2")
    assert code == 0, err
    d = json.loads(out)
    assert d["rate"] is None and d["measured"] is True
    assert all(not e["meets"] and any("p99_ttft_ms" in r for r in e["reasons"]) for e in d["evaluations"])
    code, out, err = run_cli("capacity", "--slo-ttft-ms", "10", "--served-model", "m", *WL)
    assert code == 2 and "--served-model" in err and len(err.strip().splitlines()) == 1


def test_capacity_url_model_is_the_served_models_name(stub):
    """--model with --url names the served model, as bench --model does (it was read as a catalog
    model: 'unknown model'); --model and --served-model that disagree fail in one line."""
    seen = stub.stats()["requests"]
    code, out, err = run_cli("capacity", "--url", stub.url, "--model", stub.model, "--slo-ttft-ms", "1000", *WL,
                             "--hi", "40", "--max-evals", "1")
    assert code == 0, err
    d = json.loads(out)
    assert d["measured"] is True and d["target"] == {"url": stub.url, "model": stub.model}
    assert stub.stats()["requests"] > seen
    code, out, err = run_cli("capacity", "--url", stub.url, "--model", stub.model, "--served-model", "other",
                             "--slo-ttft-ms", "1000", *WL)
    assert code == 2 and "--model" in err and len(err.strip().splitlines()) == 1
    # sweep --url reads it the same way
    code, out, err = run_cli("sweep", "--url", stub.url, "--model", stub.model, "--rates", "20", "--prompt", "fixed:8",
                             "--output", "fixed:2", "--num-requests", "10", "--json", "--no-progress")
    assert code == 0, err
