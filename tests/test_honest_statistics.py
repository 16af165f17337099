"""Figures that cannot contradict themselves (issue 38 item 6): latency intervals never below zero,
completed never above arrived, the simulated time as asked (the measured window beside it), and an
unstable run's latencies reported as the lower bounds they are."""

from __future__ import annotations

import numpy as np
import pytest
from _cli import run_cli
from _queue_sim import mm1_times, records_from_times, table

from llmqueue.metrics import summarize
from llmqueue.metrics.ci import batch_means_ci

ONE_AT_A_TIME = ("--max-num-seqs", "1", "--prompt-len", "fixed:1", "--output-len", "fixed:1",
                 "--step-time", "exp:0.1", "--seed", "3", "--no-progress")


def _skewed_latencies() -> np.ndarray:
    """200 latencies (s): 199 of 1 ms and one of 100 s, in 20 batches of 10; the linear batch-means
    interval of their mean (0.5 s) reaches to about -0.55 s."""
    x = np.full(200, 0.001)
    x[57] = 100.0
    return x


def test_mean_latency_interval_never_below_zero():
    x = _skewed_latencies()
    linear = batch_means_ci(x)
    assert linear.lo < 0  # what the linear interval of a skewed positive quantity does
    ci = batch_means_ci(x, positive=True)
    assert 0 < ci.lo <= ci.estimate <= ci.hi and ci.method == "batch_means_log"
    assert ci.estimate == pytest.approx(x.mean())
    # a batch of zeros (a queue that never waited): the linear interval cut at 0
    z = np.zeros(200)
    z[5] = 1.0
    cz = batch_means_ci(z, positive=True)
    assert cz.lo == 0.0 and cz.hi > cz.estimate > 0
    # the summary's latency intervals are those
    recs = table([{"arrival_s": float(i), "first_token_s": i + t, "finish_s": i + t + 0.01}
                  for i, t in enumerate(x)])
    out = summarize(recs)
    for key in ("mean_ttft_ms_ci", "mean_e2el_ms_ci", "mean_queue_ms_ci"):
        if out[key] is not None:
            assert out[key][0] >= 0, (key, out[key])
    assert out["mean_ttft_ms_ci"][0] > 0


def test_completed_never_above_arrived_with_a_warmup():
    """Requests arriving in the warm-up and finishing after it were counted as completed, not as
    arrived: 2,512 / 2,509. Both count the window's arrivals now; the throughput keeps the
    departures in the window (``finished_in_window``)."""
    r = table([
        {"arrival_s": 0.0, "first_token_s": 9.0, "finish_s": 11.0},    # warm-up arrival, finishes in the window
        {"arrival_s": 1.0, "first_token_s": 10.0, "finish_s": 12.0},   # the same
        {"arrival_s": 1.5, "finish_s": 13.0, "status": "timeout", "output_tokens": 0},
        {"arrival_s": 11.0, "first_token_s": 11.5, "finish_s": 14.0},
    ])
    out = summarize(r, warmup_s=10.0, horizon_s=20.0)
    assert out["arrivals"] == 1
    assert out["completed"] == 1 and out["failed"] == 0
    assert out["completed"] + out["failed"] + out["in_flight"] <= out["arrivals"]
    assert out["finished_in_window"] == 3 and out["request_throughput"] == pytest.approx(3 / 10)
    # an M/M/1 run with a warm-up: the same inequality on thousands of requests
    a, s, f = mm1_times(0.9, 1.0, 5000, seed=7)
    recs = records_from_times(a, s, f, horizon=float(a[-1]))
    out = summarize(recs, warmup_s=float(a[2000]) - 1e-9, horizon_s=float(a[-1]))
    assert out["completed"] + out["failed"] + out["in_flight"] <= out["arrivals"]
    assert out["completed"] == out["status_counts"]["ok"]


def test_simulate_prints_the_asked_duration_and_the_window():
    code, out, err = run_cli("simulate", *ONE_AT_A_TIME, "--arrival", "poisson:5", "--duration", "600",
                             "--warmup", "60")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("simulated time"))
    assert line.split()[-1] == "600", line
    window = next(ln for ln in out.splitlines() if ln.startswith("measured window"))
    assert "60 to 600" in window and "540 s after the 60 s warm-up" in window
    completed, arrived = (int(v) for v in
                          next(ln for ln in out.splitlines() if ln.startswith("completed / arrived")).split()[-3::2])
    assert completed <= arrived


def test_unstable_run_reports_lower_bounds_not_means():
    """lam = 20 > mu = 10: the queue grows 10 req/s; the finishers' mean TTFT is a figure of the
    run's length. The summary holds lower bounds over everything that arrived, the print shows
    those (>=) and how many requests were cut off."""
    code, out, err = run_cli("simulate", *ONE_AT_A_TIME, "--arrival", "poisson:20", "--duration", "300",
                             "--json")
    assert code == 0, err
    import json

    s = json.loads(out)
    assert s["stable"] is False and s["verdict"].startswith("unstable")
    lb = s["lower_bounds"]
    assert lb["unfinished"] == s["status_counts"]["unfinished"] > 0
    assert lb["requests"] == s["arrivals"]
    assert lb["p99_e2el_ms"] >= s["p99_e2el_ms"]  # the waiting ones' waits so far are the longest
    code, out, err = run_cli("simulate", *ONE_AT_A_TIME, "--arrival", "poisson:20", "--duration", "300")
    assert code == 0, err
    ttft = next(ln for ln in out.splitlines() if "TTFT" in ln)
    assert "lower bound" in ttft and ">= " in ttft and f"{lb['mean_ttft_ms']:,.1f}" in ttft
    assert f"{lb['unfinished']} of {lb['requests']} requests unfinished" in out
    # a stable run has none
    code, out, err = run_cli("simulate", *ONE_AT_A_TIME, "--arrival", "poisson:5", "--duration", "300", "--json")
    assert json.loads(out)["lower_bounds"] is None


def test_lower_bounds_by_hand():
    """M/M/1 at lam = 1.3 > mu = 1 stopped at H: every arrival served or still waiting counts, its
    TTFT (E2EL, queueing time) when it has one, else H - arrival."""
    lam, mu, H = 1.3, 1.0, 3000.0
    a, s, f = mm1_times(lam, mu, 5000, seed=42)
    recs = records_from_times(a, s, f, horizon=H)
    out = summarize(recs, horizon_s=H, percentiles=(50, 99))
    lb = out["lower_bounds"]
    arr = recs["arrival_s"]
    for name, col in (("ttft", "first_token_s"), ("e2el", "finish_s"), ("queue", "first_scheduled_s")):
        x = np.where(np.isfinite(recs[col]), recs[col], H) - arr
        assert lb[f"mean_{name}_ms"] == pytest.approx(1000 * x.mean())
        assert lb[f"p99_{name}_ms"] == pytest.approx(1000 * np.percentile(x, 99))
    assert lb["requests"] == len(recs) and lb["unfinished"] == int(np.sum(recs["status"] == "unfinished"))
    # the true figures are above: the unfinished would have waited longer than the stop allowed
    true_e2el = np.where(np.isfinite(recs["finish_s"]), recs["finish_s"], f[: len(recs)]) - arr
    assert lb["mean_e2el_ms"] < 1000 * true_e2el.mean()


def test_bench_prints_an_unstable_runs_lower_bounds(capsys):
    """bench's table shows the lower bounds a summary of a growing queue carries (issue 38 item 6)."""
    from llmqueue.cli.bench_cmd import print_report

    lb = {"requests": 120, "unfinished": 40, "mean_ttft_ms": 5000.0, "p99_ttft_ms": 20000.0, "mean_e2el_ms": 9000.0,
          "p99_e2el_ms": 30000.0, "mean_queue_ms": 4000.0}
    s = {"percentiles": [50, 99], "completed": 80, "arrivals": 120, "verdict": "unstable: queue grows 2 req/s",
         "lower_bounds": lb, "bench": {"url": "http://127.0.0.1:1", "model": "m"}, "client": {}}
    print_report(s)
    out = capsys.readouterr().out
    assert ">= 5,000.0 / >= 20,000.0, >= 9,000.0 / >= 30,000.0" in out and "40 of 120 requests unfinished" in out
    s.pop("lower_bounds")
    print_report(s)
    assert "lower bounds" not in capsys.readouterr().out
