"""Tests of llmqueue.metrics.summary: closed-form M/M/1 truth inside the reported intervals,
vLLM key names, warm-up handling, step-based ITL/utilization/KV by hand, overloaded runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _queue_sim import mm1_times, records_from_times, table

from llmqueue.errors import InputError
from llmqueue.metrics import summarize
from llmqueue.records import StepRecords, TimeSeries, dump_summary

VLLM_KEYS = [
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    *[f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std")],
    *[f"p{p}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for p in ("50", "90", "95", "99",
                                                                        "99.9")],
]


@pytest.fixture(scope="module")
def mm1_run():
    """M/M/1, lam = 0.7, mu = 1, 100,000 requests; prefill = first 20% of the service, 5 tokens."""
    a, s, f = mm1_times(0.7, 1.0, 100_000, seed=41)
    return records_from_times(a, s, f, output_tokens=5, first_token_frac=0.2), a


def test_mm1_closed_forms_inside_intervals(mm1_run):
    recs, a = mm1_run
    lam, mu = 0.7, 1.0
    d = mu - lam
    out = summarize(recs, warmup_s=2000.0, level=0.99)  # 99%: six checks in one test
    truth = {  # ms
        "mean_e2el_ms": 1000 / d,                                   # W = 1/(mu - lam)
        "p99_e2el_ms": 1000 * math.log(100) / d,                    # -ln(1-p)/(mu - lam)
        "p50_e2el_ms": 1000 * math.log(2) / d,
        "mean_queue_ms": 1000 * (lam / mu) / d,                     # Wq = rho/(mu - lam)
        "mean_ttft_ms": 1000 * ((lam / mu) / d + 0.2 / mu),         # Wq + 20% of E[S]
        "mean_tpot_ms": 1000 * 0.2 / mu,                            # 80% of S over 4 tokens
    }
    for key, value in truth.items():
        lo, hi = out[f"{key}_ci"]
        assert lo <= value <= hi, (key, value, lo, hi)
        assert lo <= out[key] <= hi
    # p99.9 needs 10 batches x 10 tail observations = 100,000 requests; 98,600 are too few
    assert out["e2el_samples"] < 100_000 and out["p99.9_e2el_ms_ci"] is None
    assert out["p99.9_e2el_ms"] is not None
    # throughput: departures in the window per second ~ lam
    assert out["request_throughput"] == pytest.approx(lam, rel=0.02)
    assert out["output_throughput"] == pytest.approx(5 * out["request_throughput"])
    assert out["total_token_throughput"] == pytest.approx(105 * out["request_throughput"])
    assert out["verdict"] == "stable" and out["little_gap"] < 0.02


def test_vllm_key_names_and_json(mm1_run, tmp_path):
    recs, _ = mm1_run
    out = summarize(recs)
    for key in VLLM_KEYS:
        assert key in out, key
    for key in ("duration_s", "status_counts", "mean_ttft_ms_ci", "p99_ttft_ms_ci", "little_gap",
                "verdict", "queue_growth_per_s", "queue_growth_per_s_ci", "mean_queue_ms",
                "p99_queue_ms", "utilization", "kv_utilization"):
        assert key in out, key
    assert out["request_goodput"] is None  # vLLM: None without SLOs
    assert out["itl_source"] is None and out["mean_itl_ms"] is None  # no steps, no ITL
    # with no warm-up and no horizon, vLLM's definitions: all requests over the whole run
    assert out["completed"] == len(recs) and out["duration"] == pytest.approx(recs["finish_s"].max())
    assert out["std_e2el_ms"] == pytest.approx(1000 * np.std(recs["finish_s"] - recs["arrival_s"]))
    assert out["p90_e2el_ms"] == pytest.approx(
        1000 * np.percentile(recs["finish_s"] - recs["arrival_s"], 90))
    path = dump_summary(tmp_path / "summary.json", out)
    back = json.loads(path.read_text())  # strict JSON: NaN/inf became null
    assert back["completed"] == out["completed"]


def test_warmup_and_horizon_window():
    r = table([
        {"arrival_s": 0.0, "first_token_s": 9.0, "finish_s": 10.0, "prompt_tokens": 7},  # warm-up
        {"arrival_s": 11.0, "first_token_s": 11.5, "finish_s": 12.0, "prompt_tokens": 3},
        {"arrival_s": 12.0, "first_token_s": 12.5, "finish_s": 14.0, "output_tokens": 3},
        {"arrival_s": 13.0, "finish_s": 13.0, "status": "rejected", "output_tokens": 0},
        {"arrival_s": 18.0, "first_token_s": 19.0, "finish_s": 30.0},  # finishes after horizon
    ])
    out = summarize(r, warmup_s=10.5, horizon_s=20.0)
    assert out["duration"] == 9.5
    assert out["arrivals"] == 4
    assert out["status_counts"]["ok"] == 3 and out["status_counts"]["rejected"] == 1
    assert out["completed"] == 2 and out["failed"] == 1  # finishes at 12 and 14; rejection at 13
    assert out["total_input_tokens"] == 3 + 10 and out["total_output_tokens"] == 1 + 3
    assert out["request_throughput"] == pytest.approx(2 / 9.5)
    # latencies: ok requests arriving in the window (also the one finishing after the horizon)
    assert out["ttft_samples"] == 3
    assert out["mean_ttft_ms"] == pytest.approx(1000 * (0.5 + 0.5 + 1.0) / 3)
    assert out["tpot_samples"] == 1 and out["mean_tpot_ms"] == pytest.approx(1000 * 1.5 / 2)
    assert out["mean_ttft_ms_ci"] is None  # three samples: no interval
    assert out["verdict"] == "insufficient data"
    with pytest.raises(InputError):
        summarize(r, percentiles=(0, 50))


def test_steps_itl_utilization_kv_by_hand():
    r = table([{"arrival_s": 0.0, "first_token_s": 0.2, "finish_s": 1.0, "output_tokens": 12}])
    steps = StepRecords.from_columns(
        step=[0, 1, 4, 5], replica=[0, 0, 0, 0],
        start_s=[0.0, 0.2, 0.5, 0.55], duration_s=[0.2, 0.3, 0.05, 0.2],
        prefill_tokens=[100, 0, 0, 0], decode_seqs=[0, 2, 4, 1], num_running=[1, 2, 4, 1],
        num_waiting=[0, 0, 0, 0], kv_tokens=[100, 200, 300, 0], preempted=[0, 0, 0, 0],
        steps=[1, 3, 1, 1])
    out = summarize(r, steps=steps, kv_capacity=1000, percentiles=(50, 90, 99))
    # ITL samples: row 1 = 3 iterations of 0.1 s with 2 decodes each; 4 x 0.05; 1 x 0.2
    expanded = np.array([0.1] * 6 + [0.05] * 4 + [0.2])
    assert out["itl_samples"] == 11
    assert out["mean_itl_ms"] == pytest.approx(1000 * expanded.mean())
    assert out["std_itl_ms"] == pytest.approx(1000 * expanded.std())
    assert out["median_itl_ms"] == pytest.approx(1000 * np.median(expanded))
    for p in (50, 90, 99):
        assert out[f"p{p}_itl_ms"] == pytest.approx(1000 * np.percentile(expanded, p))
    assert out["utilization"] == pytest.approx(0.75)  # busy 0.75 s of the 1 s window
    assert out["mean_batch_size"] == pytest.approx((0.2 * 1 + 0.3 * 2 + 0.05 * 4 + 0.2 * 1) / 0.75)
    # KV at step ends, sample-and-hold: 100 to 0.5, 200 to 0.55, 300 to 0.75, then 0
    assert out["mean_kv_tokens"] == pytest.approx(0.5 * 100 + 0.05 * 200 + 0.2 * 300)
    assert out["kv_utilization"] == pytest.approx(0.12)
    # measured per-token gaps override step records
    out2 = summarize(r, steps=steps, itl_s=[0.01, 0.03])
    assert out2["mean_itl_ms"] == pytest.approx(20.0) and out2["itl_source"] == "itl_s"


def test_timeseries_kv_and_queue():
    r = table([{"arrival_s": 0.0, "first_token_s": 0.2, "finish_s": 4.0}])
    ts = TimeSeries.from_columns(t_s=[0.0, 2.0, 0.0, 2.0], replica=[0, 0, 1, 1],
                                 num_waiting=[0, 2, 1, 1], num_running=[1, 1, 2, 0],
                                 kv_tokens=[100, 300, 50, 50])
    out = summarize(r, timeseries=ts, kv_capacity=500)
    assert out["mean_kv_tokens"] == pytest.approx((200 + 50) / 2)  # per replica
    assert out["kv_utilization"] == pytest.approx(125 / 500)
    assert out["mean_num_waiting"] == pytest.approx((0 + 2) / 2 + 1)
    # waiting + running: replica 0 is 1 then 3, replica 1 is 3 then 1 -> 2 + 2
    assert out["little"]["L_timeseries"] == pytest.approx(4.0)


def test_overloaded_run_summary():
    lam, mu, H = 1.3, 1.0, 3000.0
    a, s, f = mm1_times(lam, mu, 5000, seed=42)
    recs = records_from_times(a, s, f, horizon=H)
    out = summarize(recs, horizon_s=H, slos={"ttft_ms": 60_000})
    assert out["verdict"].startswith("unstable: queue grows")
    lo, hi = out["queue_growth_per_s_ci"]
    assert lo <= lam - mu <= hi
    in_flight = int(np.sum(recs.in_flight() & (recs["arrival_s"] < H)))
    assert out["in_flight"] == in_flight > 0 and out["status_counts"]["unfinished"] == in_flight
    assert out["completed"] == int(np.sum(recs["status"] == "ok"))
    assert out["request_throughput"] == pytest.approx(mu, rel=0.05)
    assert 0 < out["request_goodput"] < out["request_throughput"]
    assert out["slo"]["overall"]["in_flight"] == in_flight
    json.dumps(out, allow_nan=False, default=float)  # plain numbers, no NaN


def test_goodput_in_summary_by_hand():
    r = table([
        {"arrival_s": 0.0, "first_token_s": 0.1, "finish_s": 1.0, "output_tokens": 10},
        {"arrival_s": 0.5, "first_token_s": 2.5, "finish_s": 3.0, "output_tokens": 2},
        {"arrival_s": 1.0, "first_token_s": 1.2, "finish_s": 4.0, "output_tokens": 2},
    ])
    # tpot: 0.9/9 = 0.1, 0.5/1 = 0.5, 2.8/1 = 2.8; ttft: 0.1, 2.0, 0.2
    out = summarize(r, slos={"ttft_ms": 500, "tpot_ms": 1000})
    assert out["request_goodput"] == pytest.approx(1 / 4.0)  # only the first; window [0, 4]
    assert out["request_throughput"] == pytest.approx(3 / 4.0)


def test_default_window_ends_at_last_observed_event():
    """Without horizon_s the records cannot say when the run stopped; the window ends at the last
    observed event, so arrivals recorded after it (in flight, no times) do not fake a growing
    queue. Stable M/M/1 stopped at H with 50 late arrivals kept."""
    a, s, f = mm1_times(0.5, 1.0, 30_000, seed=43)
    H = float(a[25_000])
    recs = records_from_times(a, s, f, horizon=H, late=50)
    out = summarize(recs, warmup_s=500.0)
    assert out["horizon_s"] <= H and out["horizon_s"] > H - 10
    assert out["verdict"] == "stable" and out["little_gap"] < 0.02
    explicit = summarize(recs, warmup_s=500.0, horizon_s=H)
    assert explicit["in_flight"] == int(np.sum(recs.in_flight() & (recs["arrival_s"] < H)))


def test_send_time_gives_vllm_keys_their_meaning_by_hand():
    """With send_s (a benchmark's dispatched_s) the vLLM-named latencies and goodput count from
    the actual send; the intended-time figures move to from_intended; TPOT and the window's
    selection (by intended arrival) do not change. Without send_s nothing changes."""
    r = table([
        {"arrival_s": 0.0, "dispatched_s": 0.0, "first_token_s": 0.1, "finish_s": 1.0, "output_tokens": 10},
        {"arrival_s": 0.5, "dispatched_s": 2.0, "first_token_s": 2.5, "finish_s": 3.0, "output_tokens": 2},
        {"arrival_s": 1.0, "dispatched_s": 1.0, "first_token_s": 1.2, "finish_s": 4.0, "output_tokens": 2},
    ])
    slos = {"ttft_ms": 600, "tpot_ms": 1000}
    plain = summarize(r, slos=slos)
    out = summarize(r, slos=slos, send_s=r["dispatched_s"])
    # from the send: ttft 0.1, 0.5, 0.2; e2el 1.0, 1.0, 3.0
    assert out["mean_ttft_ms"] == pytest.approx(1000 * 0.8 / 3)
    assert out["p50_ttft_ms"] == pytest.approx(200.0) and out["median_ttft_ms"] == pytest.approx(200.0)
    assert out["mean_e2el_ms"] == pytest.approx(1000 * 5.0 / 3)
    assert out["std_ttft_ms"] == pytest.approx(1000 * np.std([0.1, 0.5, 0.2]))
    # from the intended time: ttft 0.1, 2.0, 0.2; e2el 1.0, 2.5, 3.0 (what the keys meant before)
    fi = out["from_intended"]
    assert fi["mean_ttft_ms"] == pytest.approx(1000 * 2.3 / 3) == plain["mean_ttft_ms"]
    assert fi["mean_e2el_ms"] == pytest.approx(1000 * 6.5 / 3) == plain["mean_e2el_ms"]
    assert fi["p99_ttft_ms"] == pytest.approx(plain["p99_ttft_ms"])
    assert "mean_tpot_ms" not in fi and out["mean_tpot_ms"] == pytest.approx(plain["mean_tpot_ms"])
    # goodput: ttft <= 600 ms and tpot <= 1 s: from the send requests 0 and 1 (the second's ttft
    # is 0.5 s from its send, 2 s from its schedule); request 2's tpot is 2.8 s
    assert out["request_goodput"] == pytest.approx(2 / 4.0)
    assert fi["request_goodput"] == pytest.approx(1 / 4.0) == plain["request_goodput"]
    assert out["good_share"] == pytest.approx(2 / 3) and plain["good_share"] == pytest.approx(1 / 3)
    assert out["ttft_samples"] == 3 and out["completed"] == 3 and out["arrivals"] == 3
    # simulated records (no send_s): the keys keep their values, no from_intended
    assert "from_intended" not in plain
    with pytest.raises(InputError, match="send_s"):
        summarize(r, send_s=[0.0])
