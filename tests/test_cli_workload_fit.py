"""Tests of ``llmqueue workload fit``: table and JSON output, the spec files written, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from _cli import run_cli

from llmqueue.workload import load_fitted, parse_arrival

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
AZURE_CONV = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def run(*args):
    return run_cli("workload", "fit", *args)


@pytest.fixture
def trace_file(tmp_path):
    """A Mooncake-style JSONL trace: a piecewise Poisson stream over 30 minutes."""
    a = parse_arrival("piecewise:3,8,5:window=600:period=1800")
    t = a.sample_times(np.random.default_rng(0), horizon=1800.0)
    rng = np.random.default_rng(1)
    f = tmp_path / "trace.jsonl"
    with open(f, "w") as fh:
        for x in t:
            row = {"timestamp": int(round(x * 1000)), "input_length": int(rng.integers(10, 4000)),
                   "output_length": int(rng.integers(1, 500))}
            fh.write(json.dumps(row) + "\n")
    return f


def test_table_and_files(trace_file, tmp_path):
    spec = tmp_path / "out" / "fit.yaml"
    spec.parent.mkdir()
    code, out, err = run(trace_file, "-o", spec, "--window-s", 300)
    assert code == 0, err
    for fragment in ("Fitted workload for", "arrival model", "piecewise rate, 6 windows of 300 s",
                     "Poisson test", "lengths", "empirical joint pairs", "statistic", "IDC 60s",
                     "prompt p99", f"wrote {spec}"):
        assert fragment in out, fragment
    assert spec.is_file() and (spec.parent / "fit.pairs.csv").is_file()
    doc = yaml.safe_load(spec.read_text())
    assert doc["lengths"] == "joint:fit.pairs.csv" and doc["arrival"].startswith("piecewise:")
    fw = load_fitted(spec)
    assert len(fw.generate(0)) == doc["source"]["requests"]


def test_json(trace_file, tmp_path):
    spec = tmp_path / "fit.yaml"
    code, out, err = run(trace_file, "-o", spec, "--json", "--lengths", "lognormal",
                         "--counts", "random")
    assert code == 0, err
    d = json.loads(out)
    assert d["written"] == {"spec": str(spec)}
    assert d["prompt"].startswith("lognormal:mu=") and "lengths" not in d
    a = d["diagnostics"]["arrival"]
    assert a["counts"] == "random" and a["window_s"] == 60 and a["renewal"] in ("poisson", "gamma", "h2")
    assert d["diagnostics"]["lengths"]["prompt_ks"] is not None
    assert d["arrival"] == load_fitted(spec).arrival.spec
    assert d["diagnostics"]["source_stats"]["mean_rate"] > 0


def test_without_output_writes_nothing(trace_file, tmp_path):
    before = set(tmp_path.iterdir())
    code, out, err = run(trace_file)
    assert code == 0 and "no spec file written" in err
    assert set(tmp_path.iterdir()) == before


@pytest.mark.parametrize("args,fragment", [
    (["--window-s", "0"], "llmqueue: error: --window-s: must be > 0"),
    (["--window-s", "nan"], "llmqueue: error: --window-s:"),
    (["--alpha", "1"], "llmqueue: error: --alpha: must be in (0, 1)"),
    (["--lengths", "pareto"], "llmqueue: error: Invalid value for '--lengths'"),
    (["--counts", "some"], "llmqueue: error: Invalid value for '--counts'"),
    (["-o", "/proc/no-such/x.yaml"], "llmqueue: error: --out: cannot write"),
])
def test_bad_flags(trace_file, args, fragment):
    code, out, err = run(trace_file, *args)
    assert code == 2 and out == ""
    assert err.startswith(fragment) and err.count("\n") == 1, err


def test_missing_trace(tmp_path):
    code, out, err = run(tmp_path / "nope.csv")
    assert code == 2 and err.startswith("llmqueue: error:") and "does not exist" in err


def test_listed_in_the_workload_group():
    ran = run_cli("workload", "--help")
    assert ran.code == 0
    assert "fit" in ran.out
    ran = run_cli("workload", "fit", "--help")
    assert ran.code == 0
    out = ran.out
    for flag in ("--window-s", "--lengths", "--counts", "-o, --out", "--json"):
        assert flag in out


def test_shared_azure_trace(tmp_path):
    if not AZURE_CONV.is_file():
        pytest.skip(f"shared trace {AZURE_CONV} is absent")
    code, out, err = run(AZURE_CONV, "-o", tmp_path / "conv.yaml", "--json")
    assert code == 0, err
    d = json.loads(out)
    src, mod = d["diagnostics"]["source_stats"], d["diagnostics"]["model_stats"]
    assert d["diagnostics"]["arrival"]["renewal"] == "gamma"
    assert mod["mean_rate"] == pytest.approx(src["mean_rate"], rel=0.05)
    assert mod["idc"]["60s"] == pytest.approx(src["idc"]["60s"], rel=0.10)
    for k in ("prompt", "output"):
        for q in ("p50", "p99"):
            assert mod[k][q] == pytest.approx(src[k][q], rel=0.05)


def test_the_fitted_spec_runs_in_simulate_and_sweep(trace_file, tmp_path):
    """The file `workload fit` writes is a workload the other commands take (--workload)."""
    spec = tmp_path / "fit.yaml"
    code, _, err = run(trace_file, "-o", spec)
    assert code == 0, err
    n_trace = sum(1 for _ in open(trace_file))
    eng = ["--capacity-tokens", "200000", "--step-time", "0.03"]
    # its span (1,800 s) is the default duration: about as many arrivals as the trace
    d = run_cli("simulate", "--workload", str(spec), *eng, "--json").json()
    assert d["arrivals"] == pytest.approx(n_trace, rel=0.01)
    assert d["duration_s"] == pytest.approx(1800, rel=0.01)
    # --arrival replaces its arrival process, the lengths stay the fitted pairs
    d = run_cli("simulate", "--workload", str(spec), "--arrival", "poisson:2", "--duration", "600", *eng,
                "--json").json()
    assert d["arrival_rate"] == pytest.approx(2.0, rel=0.15)
    # a sweep's rates rescale the fitted process (its shape kept)
    pts = run_cli("sweep", "--workload", str(spec), "--rates", "2,4", "--duration", "1800", *eng,
                  "--backend", "serial", "--json").json()["points"]
    assert [p["arrival_rate"] for p in pts] == pytest.approx([2.0, 4.0], rel=0.1)
    # lengths cannot come from two places
    ran = run_cli("simulate", "--workload", str(spec), "--prompt", "fixed:3", *eng)
    assert ran.code == 2
    err = ran.err
    assert err.count("\n") == 1 and "--workload" in err and "drop" in err
