"""``llmqueue workload convert`` and ``llmqueue workload stats``: acceptance figures, round trip,
reported repairs and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import re

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.theory.kv import g_exact
from llmqueue.workload.traces import load_trace

REPO = Path(__file__).resolve().parents[1]


def shared_traces() -> Path:
    """``../shared/traces`` beside the repository; skip when absent (a user's clone has none)."""
    d = REPO.parent / "shared" / "traces"
    if not (d / "summary_stats.json").is_file():
        pytest.skip(f"shared traces not found at {d} (only the team's workspace has ../shared)")
    return d


def run(*args):
    return run_cli("workload", *args)


def test_acceptance_azure_conv_stats_json():
    d = shared_traces()
    rel = "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    code, out, err = run("stats", d / rel, "--json")
    assert code == 0, err
    got = json.loads(out)
    ref = json.loads((d / "summary_stats.json").read_text())[rel]
    for ours, theirs in ((got["mean_rate"], ref["mean_rps"]), (got["iat_cv"], ref["iat_cv"]),
                         (got["prompt"]["mean"], ref["in_mean"]), (got["output"]["mean"], ref["out_mean"]),
                         (got["idc"]["1s"], ref["idc_1s"]), (got["idc"]["60s"], ref["idc_60s"]),
                         (got["peak_to_mean"]["60s"], ref["peak_to_mean_60s"]),
                         (got["prompt"]["p99"], ref["in_p99"]), (got["output"]["p50"], ref["out_p50"])):
        assert ours == pytest.approx(theirs, rel=0.01)
    # The README's rounded figures.
    assert (round(got["mean_rate"], 2), round(got["iat_cv"], 2), round(got["prompt"]["mean"]),
            round(got["output"]["mean"])) == (5.53, 1.09, 1155, 211)
    assert got["n"] == 19366 and got["prefix_reuse_frac"] is None


@pytest.mark.parametrize("rel,bins,keys", [
    ("azure_llm_2023/AzureLLMInferenceTrace_code.csv", "1,60", ("1s", "60s")),
    ("mooncake_fast25/conversation_trace.jsonl", "3,60", ("3s", "60s")),
    ("mooncake_fast25/synthetic_trace.jsonl", "3,60", ("3s", "60s")),
])
def test_acceptance_code_and_mooncake(rel, bins, keys):
    d = shared_traces()
    code, out, err = run("stats", d / rel, "--bins", bins, "--json")
    assert code == 0, err
    got = json.loads(out)
    ref = json.loads((d / "summary_stats.json").read_text())[rel]
    assert got["mean_rate"] == pytest.approx(ref["mean_rps"], rel=0.01)
    assert got["iat_cv"] == pytest.approx(ref["iat_cv"], rel=0.01)
    assert got["prompt"]["mean"] == pytest.approx(ref["in_mean"], rel=0.01)
    assert got["output"]["mean"] == pytest.approx(ref["out_mean"], rel=0.01)
    for k in keys:
        assert got["idc"][k] == pytest.approx(ref[f"idc_{k}"], rel=0.01)
        assert got["peak_to_mean"][k] == pytest.approx(ref[f"peak_to_mean_{k}"], rel=0.01)
    if "prefix_block_reuse_frac" in ref:
        assert got["prefix_reuse_frac"] == pytest.approx(ref["prefix_block_reuse_frac"], abs=1e-4)
        assert round(100 * got["prefix_reuse_frac"], 1) in (36.6, 64.0)


def test_stats_table():
    d = shared_traces()
    code, out, _ = run("stats", d / "mooncake_fast25/conversation_trace.jsonl", "--bins", "3,60")
    assert code == 0
    assert "12,031 requests" in out and re.search(r"mean rate \(n-1\)/span \(req/s\)\s+3\.401", out)
    assert re.search(r"prefix-block reuse\s+36\.6%", out)
    assert "repair: 10851 rows share the timestamp" in out  # the 3 s ticks are reported


def test_convert_round_trip_and_replay(tmp_path):
    d = shared_traces()
    src = d / "azure_llm_2023/AzureLLMInferenceTrace_code.csv"
    out = tmp_path / "code.parquet"
    code, text, err = run("convert", src, "-o", out)
    assert code == 0, err
    assert "read 8,819 requests" in text and "format azure" in text and f"wrote {out}" in text
    a, b = load_trace(src), load_trace(out)
    for k in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, k), getattr(b, k))
    # Window, then rate, then loop, reported and applied in that order.
    out2 = tmp_path / "w.parquet"
    code, text, err = run("convert", src, "-o", out2, "--window", "600:1200", "--rate", "4",
                          "--loop", "2", "--json")
    assert code == 0, err
    s = json.loads(text)
    assert [t.split(" ")[0] for t in s["transforms"]] == ["window", "rescaled", "looped"]
    w = load_trace(out2)
    sel = a.arrival_s[(a.arrival_s >= 600) & (a.arrival_s < 1200)]
    assert len(w) == s["n"] == 2 * sel.size
    assert w.prompt_tokens.tolist() == a.prompt_tokens[(a.arrival_s >= 600) & (a.arrival_s < 1200)].tolist() * 2
    assert (sel.size - 1) / (w.arrival_s[sel.size - 1]) == pytest.approx(4, rel=1e-12)
    assert w.repairs[-3:] == s["transforms"]


def test_convert_reports_repairs_and_drop_bad(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n3,-1,5\n1,4,-2\n1,7,7\n2,8,NaN\n1,9,9\n")
    code, out, err = run("convert", p, "-o", tmp_path / "x.parquet")
    assert code == 2 and out == ""
    assert err.startswith("llmqueue: error: prompt_tokens: data row 2 of ") and "--drop-bad" in err
    assert err.count("\n") == 1
    code, out, err = run("convert", p, "-o", tmp_path / "x.parquet", "--drop-bad")
    assert code == 0, err
    assert "repair: dropped 2 rows with negative lengths" in out
    assert "repair: dropped 1 rows with missing or non-numeric lengths" in out
    assert "repair: 1 rows share the timestamp" in out
    q = tmp_path / "u.csv"
    q.write_text("arrival_s,prompt_tokens,output_tokens\n5,1,1\n0,2,2\n1,3,3\n")
    code, out, _ = run("convert", q, "-o", tmp_path / "u.parquet")
    assert code == 0 and "repair: sorted 2 out-of-order rows" in out
    assert load_trace(tmp_path / "u.parquet").repairs[0].startswith("sorted 2 out-of-order rows")


def test_errors_are_one_line_with_the_flag(tmp_path):
    ms = tmp_path / "ms.csv"
    ms.write_text("timestamp,prompt,output\n" + "".join(f"{200 * i},10,5\n" for i in range(100)))
    cases = [
        (["stats", ms], "llmqueue: error: --time-unit: time column 'timestamp' read as seconds"),
        (["stats", ms, "--map", "time=nope"], "llmqueue: error: --map: time='nope'"),
        (["stats", ms, "--bins", "a,b"], "llmqueue: error: --bins:"),
        (["stats"], "llmqueue: error: trace: give a trace file"),
        (["stats", ms, "--arrival", "poisson:5"], "llmqueue: error: --arrival: give a trace file or a spec"),
        (["stats", "--arrival", "poisson:5", "--prompt", "fixed:5"], "llmqueue: error: --output-len: missing"),
        (["convert", ms, "-o", tmp_path / "o.parquet", "--time-unit", "ms", "--window", "9"],
         "llmqueue: error: --window: '9' is not START:END"),
        (["convert", ms, "-o", tmp_path / "o.parquet", "--time-unit", "ms", "--scale", "2", "--rate", "3"],
         "llmqueue: error: --scale: give --scale or --rate, not both"),
        (["convert", tmp_path / "none.csv", "-o", tmp_path / "o.parquet"], "llmqueue: error: file:"),
    ]
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    cases.append((["stats", empty], "llmqueue: error: file:"))
    for args, start in cases:
        code, out, err = run(*args)
        assert code == 2, (args, err)
        assert err.startswith(start), (args, err)
        assert err.count("\n") == 1
    code, out, err = run("stats", ms, "--time-unit", "ms", "--json")
    assert code == 0 and json.loads(out)["mean_rate"] == pytest.approx(5)


def test_stats_of_a_spec():
    code, out, err = run("stats", "--arrival", "poisson:5", "--prompt", "fixed:100", "--output", "fixed:10",
                         "--num-requests", "2000", "--seed", "3", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["n"] == 2000 and d["prompt"]["mean"] == 100 and d["output"]["p99"] == 10
    assert d["E_g"] == pytest.approx(g_exact(100, 10, 512))
    assert d["generated"]["seed"] == 3 and d["generated"]["arrival"] == "poisson:5"
    assert d["mean_rate"] == pytest.approx(5, rel=0.1) and d["corr"] is None
    code, out2, _ = run("stats", "--arrival", "poisson:5", "--prompt", "fixed:100", "--output", "fixed:10",
                        "--num-requests", "2000", "--seed", "3", "--json")
    assert out2 == out
    code, table, _ = run("stats", "--arrival", "poisson:5", "--prompt", "uniform:10:20", "--output",
                         "fixed:10", "--num-requests", "500")
    assert code == 0 and "500 requests generated from a spec (seed 0)" in table


def test_cli_modules_do_not_import_pyarrow():
    code = ("import sys, llmqueue.cli.workload_convert, llmqueue.cli.workload_stats; "
            "bad = [m for m in ('pyarrow', 'scipy', 'pandas') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
