"""``llmqueue simulate`` against queueing truth and seed 004's capacity model."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.records import STATUSES, read_run

SEED004 = [  # setting, prompt, output, b, paper mu_theory, paper measured mu_gpu
    ("1:1", "uniform:10:1600", "uniform:10:1600", "0.0372", 3.263, 3.387),
    ("2:1", "uniform:10:2133", "uniform:10:1066", "0.0430", 3.956, 3.650),
    ("1:2", "uniform:10:1066", "uniform:10:2133", "0.0337", 2.902, 2.969),
]


def run_json(*args):
    code, out, err = run_cli("simulate", *args, "--json", "--no-progress")
    assert code == 0, err
    return json.loads(out)


def check_invariants(d, capacity=None):
    """Every run: statuses from the schema and all accounted for; KV within capacity; on stable
    runs Little's law within 2 %."""
    counts = d["status_counts"]
    assert set(counts) <= set(STATUSES)
    assert sum(counts.values()) == d["arrivals"]
    if capacity is not None:
        assert d["mean_kv_tokens"] <= capacity
    if d["verdict"] == "stable" and d.get("little_gap") is not None:
        assert d["little_gap"] < 0.02


@pytest.mark.parametrize("step,theory_ms", [("exp:0.1", 500.0), ("0.1", 300.0)])
def test_one_request_at_a_time_is_mm1_or_md1(step, theory_ms):
    """max_num_seqs 1, one step per request: M/M/1 (W = 1/(mu - lam) = 0.5 s) or M/D/1 (0.3 s)."""
    d = run_json("--max-num-seqs", "1", "--prompt", "fixed:1", "--output", "fixed:1", "--step-time", step,
                 "--arrival", "poisson:8", "--num-requests", "200000", "--seed", "1")
    lo, hi = d["mean_e2el_ms_ci"]
    assert lo <= theory_ms <= hi, (d["mean_e2el_ms"], lo, hi)
    assert d["theory"]["mg1"]["mean_e2el_ms"] == pytest.approx(theory_ms)
    assert d["verdict"] == "stable"
    check_invariants(d)


@pytest.mark.slow
@pytest.mark.parametrize("setting,prompt,output,b,paper_theory,paper_measured", SEED004)
def test_seed004_saturated_throughput_and_verdicts(capsys, setting, prompt, output, b, paper_theory, paper_measured):
    base = ["--capacity-tokens", "131000", "--step-time", b, "--chunk", "512", "--prompt", prompt,
            "--output", output, "--seed", "1", "--warmup", "300"]
    sat = run_json(*base, "--arrival", "poisson:50", "--duration", "1500")
    mu = sat["theory"]["mu_kv"]
    assert abs(mu - paper_theory) / paper_theory < 0.005
    assert abs(sat["request_throughput"] - mu) / mu < 0.10
    with capsys.disabled():
        print(f"\nseed 004 {setting}: simulated {sat['request_throughput']:.3f} req/s, theory {mu:.3f}, "
              f"paper measured {paper_measured}")
    check_invariants(sat, 131000)
    for lam, duration in ((1, "1200"), (3, "3600"), (5, "1200"), (20, "600")):
        d = run_json(*base, "--arrival", f"poisson:{lam}", "--duration", duration)
        expected = "stable" if lam < mu else "unstable"
        assert d["verdict"].split(":")[0] == expected, (lam, d["verdict"])
        check_invariants(d, 131000)
    assert sat["verdict"].startswith("unstable")
    assert sat["queue_growth_per_s"] == pytest.approx(50 - sat["request_throughput"], rel=0.05)


def test_request_that_can_never_fit_is_rejected_with_reason(tmp_path):
    d = run_json("--capacity-tokens", "2000", "--step-time", "0.01", "--prompt", "uniform:10:1500",
                 "--output", "uniform:10:1500", "--arrival", "poisson:5", "--num-requests", "400",
                 "--out", str(tmp_path / "run"))
    run = read_run(tmp_path / "run")
    rec = run.requests
    from llmqueue.workload import Workload

    # the same stream the command generated (seed 0): the requested output lengths
    want = Workload("poisson:5", prompt="uniform:10:1500", output="uniform:10:1500").generate(seed=0, n=400)
    target = np.asarray(want.output_tokens)[rec["request_id"]]
    too_big = rec["prompt_tokens"] + target > 2000
    st = rec["status"]
    assert too_big.any() and (st == "rejected").sum() == too_big.sum()
    assert (st[too_big] == "rejected").all()
    assert set(st) <= {"ok", "rejected"}  # no livelock: everything that fits finished
    assert d["status_counts"]["ok"] + d["status_counts"]["rejected"] == 400
    assert d["reject_reasons"] == {"prompt+output N exceeds the KV cache (N tokens)": too_big.sum()}
    assert np.isnan(rec["first_scheduled_s"][st == "rejected"]).all()  # a rejected request never ran
    assert (run.steps["kv_tokens"] <= 2000).all()


def test_out_dir_round_trip(tmp_path):
    d = run_json("--capacity-tokens", "50000", "--step-time", "linear:c0=0.01:decode=1e-4",
                 "--prompt", "uniform:10:500", "--output", "uniform:10:200", "--arrival", "gamma:5:cv=2",
                 "--duration", "120", "--out", str(tmp_path / "r"))
    run = read_run(tmp_path / "r")
    assert len(run.requests) == d["arrivals"]
    assert run.summary["request_throughput"] == pytest.approx(d["request_throughput"])
    assert (run.timeseries["kv_tokens"] <= 50000).all() and (run.steps["kv_tokens"] <= 50000).all()
    check_invariants(d, 50000)


@pytest.mark.parametrize("args,needle", [
    (["--capacity-tokens", "0"], "--capacity-tokens"),
    (["--capacity-tokens", "1000", "--max-num-batched-tokens", "-5"], "--max-num-batched-tokens"),
    (["--capacity-tokens", "1000", "--max-num-seqs", "0"], "--max-num-seqs"),
    (["--capacity-tokens", "1000", "--step-time", "-1"], "--step-time"),
    (["--capacity-tokens", "1000", "--step-time", "linear:c0=0.01:bogus=1"], "--step-time"),
    (["--capacity-tokens", "1000", "--num-requests", "0"], "--num-requests"),
])
def test_nonsensical_knobs_one_line_error(args, needle):
    base = ["--step-time", "0.01", "--prompt", "fixed:10", "--output", "fixed:10", "--arrival", "poisson:1",
            "--num-requests", "10"]
    # later flags win in click, so the bad value comes last
    p = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "simulate", *base, *args],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error:") and needle in lines[0], p.stderr


def test_a_stream_too_large_for_memory_is_refused_before_it_is_generated():
    """poisson:1e6 for an hour is 3.6e9 requests: one line with the estimate and the fix, exit 2,
    in well under a second (nothing is allocated); the same for --num-requests."""
    import time

    base = [sys.executable, "-m", "llmqueue.cli.main", "simulate", "--step-time", "0.03", "--prompt", "fixed:100",
            "--output", "fixed:100", "--capacity-tokens", "100000", "--json"]
    t = time.perf_counter()
    p = subprocess.run([*base, "--arrival", "poisson:1e6", "--duration", "3600"], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "--duration" in p.stderr and "3.6e+09 requests" in p.stderr and "give --duration 2.7" in p.stderr
    assert time.perf_counter() - t < 30
    p = subprocess.run([*base, "--arrival", "poisson:1", "--num-requests", str(10 ** 12)], capture_output=True, text=True)
    assert p.returncode == 2 and "--num-requests" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_trace_replay_with_prefix_caching(tmp_path):
    """A Mooncake-format trace whose requests share prefix blocks: caching serves the shared
    512-token units from the cache and cuts prefill work."""
    import json as _json

    rng = np.random.default_rng(0)
    lines = []
    t = 0.0
    for i in range(300):
        t += rng.exponential(0.5)
        doc = int(rng.integers(0, 4))
        units = int(rng.integers(3, 8))
        hashes = [doc * 100 + u for u in range(min(units, 3))] + [10_000 + i * 10 + u for u in range(3, units)]
        lines.append(_json.dumps({"timestamp": int(t * 1000), "input_length": units * 512 - 100,
                                  "output_length": int(rng.integers(10, 100)), "hash_ids": hashes}))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    base = ["--trace", str(path), "--capacity-tokens", "200000", "--step-time", "linear:c0=0.01:prefill=5e-5:decode=1e-4",
            "--out"]
    off = run_json(*base, str(tmp_path / "off"))
    on = run_json(*base, str(tmp_path / "on"), "--enable-prefix-caching")
    assert off["arrivals"] == on["arrivals"] == 300
    ron, roff = read_run(tmp_path / "on").requests, read_run(tmp_path / "off").requests
    assert roff["cached_prompt_tokens"].sum() == 0
    hit = ron["cached_prompt_tokens"]
    assert (hit > 0).mean() > 0.9 and (hit % 512 == 0).all() and hit.max() <= 3 * 512
    assert on["mean_ttft_ms"] < off["mean_ttft_ms"]


# --- flags given with --scenario override its fields ------------------------------------------------

def test_scenario_with_arrival_flag_arrives_at_that_rate():
    """`--arrival poisson:20` replaces chat's own process (5.5 req/s): about 20 req/s arrive."""
    d = run_json("--scenario", "chat", "--arrival", "poisson:20", "--duration", "120", "--seed", "1")
    rate = d["arrivals"] / d["duration_s"]
    assert d["duration_s"] == pytest.approx(60.0)  # 120 s less chat's 60 s warm-up
    assert rate == pytest.approx(20.0, rel=0.06)  # 1200 expected arrivals: sd 2.9 %
    assert d["theory"]["lam"] == pytest.approx(20.0)
    own = run_json("--scenario", "chat", "--duration", "120", "--seed", "1")
    assert own["arrivals"] / own["duration_s"] < 10  # chat's own rate (5.53 req/s) without the flag


def test_scenario_with_engine_flags_changes_the_result():
    """The issue's example: engine flags were silently dropped with --scenario."""
    base = ["--scenario", "chat", "--duration", "120", "--seed", "1"]
    own = run_json(*base)
    one = run_json(*base, "--max-num-seqs", "1", "--step-time", "0.05")
    assert own["engine"]["max_num_seqs"] == 256 and one["engine"]["max_num_seqs"] == 1
    assert one["step_time"] == "0.05" and own["step_time"] != "0.05"
    # one request at a time at 0.05 s a step (~10 s an answer) cannot keep up with 5.5 req/s: the
    # chat clients time out and retry, and few requests complete
    assert one["mean_ttft_ms"] > 10 * own["mean_ttft_ms"]
    assert one["request_throughput"] < 0.5 and own["request_throughput"] > 3.0
    assert one["status_counts"]["timeout"] > 0 == own["status_counts"]["timeout"]


@pytest.mark.parametrize("args, needle", [
    (["--scenario", "chat", "--policy", "lifo"], "--policy"),
    (["--scenario", "chat", "--max-num-seqs", "0"], "--max-num-seqs"),
    (["--scenario", "chat", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--scenario", "chat", "--max-model-len", "200000"], "--max-model-len"),
    (["--scenario", "chat", "--trace", "t.csv"], "--trace"),
    (["--scenario", "mixed", "--prompt", "fixed:10"], "--prompt"),
    (["--scenario", "chat", "--duration", "30"], "--duration"),
    (["--scenario", "chat", "--chunk", "512", "--max-num-batched-tokens", "512"], "--chunk"),
    (["--step-time", "0.01", "--arrival", "poisson:1", "--prompt", "fixed:9", "--output", "fixed:9",
      "--num-requests", "5", "--chunk", "512", "--max-num-batched-tokens", "512"], "--chunk"),
    (["--step-time", "0.01", "--arrival", "poisson:1", "--prompt", "fixed:9", "--output", "fixed:9",
      "--num-requests", "5", "--model", "llama-3.1-8b"], "--gpu"),
])
def test_bad_flags_with_a_scenario_one_line_exit_2(args, needle):
    code, out, err = run_cli("simulate", *args, "--json", "--no-progress")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error:") and needle in lines[0], err


def test_scenario_field_of_the_wrong_type_one_line_exit_2(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("workload: {arrival: poisson:1, prompt: fixed:10, output: fixed:5}\n"
                 "deployment: {capacity_tokens: 50000, step_time: 0.01, enable_chunked_prefill: sometimes}\n"
                 "run: {duration_s: 60}\n")
    code, _, err = run_cli("simulate", "--scenario", str(f), "--json")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("llmqueue: error: deployment.enable_chunked_prefill: must be true or false"), err
