"""llmqueue.metrics.fleet on a hand-built fleet run whose answers are known by construction
(tests/_fleet_fixture.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _fleet_fixture import HORIZON, SPIKE, fleet_run

from llmqueue.errors import InputError
from llmqueue.metrics.fleet import fleet_summary, recovery_time, retry_amplification
from llmqueue.records import dump_summary

COSTS = {"main": 4.0, "fallback": 1.0}
QUALITY = {"main": 1.0, "fallback": 0.7}


@pytest.fixture(scope="module")
def summary():
    req, _, pools = fleet_run()
    return fleet_summary(req, pools, horizon_s=HORIZON, slos={"ttft_ms": 1500}, pool_costs=COSTS,
                         pool_quality=QUALITY, spike=SPIKE)


def test_per_pool_and_class_rows(summary):
    main, fb = summary["pools"]["main"], summary["pools"]["fallback"]
    # 300 users, every 3rd to fallback (100), the rest to main (200); every 10th retried once (30 retries:
    # 10 of them fallback's, i = 0, 30, ...); the last arrival (599 s) finishes after the horizon
    assert (fb["completed"], fb["failed"], fb["arrivals"]) == (100, 10, 110)
    assert (main["completed"], main["failed"], main["arrivals"]) == (199, 20, 220)
    assert main["request_throughput"] == pytest.approx(199 / 600)
    assert main["output_throughput"] == pytest.approx(1990 / 600)
    assert main["p50_ttft_ms"] == pytest.approx(1000) and main["p99_tpot_ms"] == pytest.approx(20)
    assert main["mean_admission_wait_ms"] == pytest.approx(500) and main["p99_queue_ms"] == pytest.approx(600)
    assert main["kv_transfers"] == 220 and main["mean_kv_transfer_ms"] == pytest.approx(10)
    assert fb["kv_transfers"] == 0 and fb["mean_kv_transfer_ms"] is None
    assert main["request_goodput"] == pytest.approx(199 / 600)  # TTFT 1 s meets 1.5 s
    assert main["good_share"] == pytest.approx(200 / 220)  # the timed-out attempts are not good
    assert main["served_share"] + fb["served_share"] == pytest.approx(1)
    chat, batch = summary["classes"]["chat"], summary["classes"]["batch"]
    assert chat["failed"] == 30 and batch["failed"] == 0  # every 10th is even: chat
    assert chat["completed"] + batch["completed"] == 299
    assert summary["pool_class"]["main"]["chat"]["completed"] + summary["pool_class"]["fallback"]["chat"]["completed"] \
        == chat["completed"]


def test_model_mix_retries_cost_and_quality(summary):
    assert summary["model_mix"]["small"]["completed"] == 100 and summary["model_mix"]["big"]["completed"] == 199
    r = summary["retries"]
    assert (r["attempts"], r["user_requests"], r["amplification"]) == (330, 300, pytest.approx(1.1))
    assert r["by_class"]["chat"]["amplification"] == pytest.approx(1.2)
    assert r["by_class"]["batch"]["amplification"] == pytest.approx(1.0)
    rep = summary["replicas"]["main"]
    assert (rep["min"], rep["max"]) == (2, 3)
    assert rep["serving_replica_hours"] == pytest.approx(1570 / 3600)
    assert rep["provisioning_replica_hours"] == pytest.approx(20 / 3600)
    assert rep["mean"] == pytest.approx(1570 / 600)
    cost = summary["cost"]
    assert cost["pools"]["main"]["cost"] == pytest.approx(4.0 * 1590 / 3600)
    assert cost["pools"]["fallback"]["cost"] == pytest.approx(600 / 3600)
    assert cost["total_cost"] == pytest.approx((4 * 1590 + 600) / 3600) and cost["complete"]
    assert cost["cost_per_request"] == pytest.approx(cost["total_cost"] / 299)
    assert summary["quality"]["quality_weighted_share"] == pytest.approx((199 + 0.7 * 100) / 299)


def test_queue_depth(summary):
    qd = summary["queue_depth"]["main"]
    assert qd["max_waiting"] == 50 and qd["by_class"]["batch"]["max_waiting"] == 0
    assert qd["mean_running"] == pytest.approx(12)
    assert summary["queue_depth"]["fallback"]["max_waiting"] == 80


def test_recovery_after_the_spike(summary):
    rec = summary["recovery"]
    main = rec["main"]
    # the queue decays linearly back to its baseline 42 s after the spike's end (1 s samples)
    assert main["recovered"] is True and abs(main["recovery_s"] - 42) <= 1
    assert main["baseline_max"] == 2 and main["threshold"] == 3 and main["peak"] == 50
    assert main["pre_window_s"] == [140.0, 200.0]
    fb = rec["fallback"]
    assert fb["recovered"] is False and math.isinf(fb["recovery_s"]) and "not recovered by the end" in fb["note"]
    assert rec["all"]["recovered"] is False


def test_json_ready(summary, tmp_path):
    back = json.loads(dump_summary(tmp_path / "s.json", {"fleet": summary}).read_text())["fleet"]
    assert back["recovery"]["fallback"]["recovery_s"] is None and back["recovery"]["fallback"]["recovered"] is False


def test_recovery_time_by_construction():
    t = np.arange(0.0, 400.0, 2.0)
    base = np.full(len(t), 10.0)
    # the queue drains 2 per second after the spike [100, 150] from 90 above its baseline: back at 10
    # (within 10 x 1.1 = 11) 45 s after the end
    w = base + np.where((t >= 100) & (t < 150), (t - 100) * 1.8, 0) + np.where(t >= 150, np.maximum(90 - 2 * (t - 150), 0), 0)
    r = recovery_time(t, w, (100, 150), end_s=400)
    assert r["recovered"] and abs(r["recovery_s"] - 45) <= 2 and r["hold_s"] == 30
    # a brief dip under the threshold that does not hold is not recovery
    w2 = w.copy()
    w2[(t >= 160) & (t < 170)] = 10
    r2 = recovery_time(t, w2, (100, 150), end_s=400)
    assert abs(r2["recovery_s"] - r["recovery_s"]) < 1e-9
    # a queue that never returns
    w3 = base + np.where(t >= 100, t - 100, 0)
    r3 = recovery_time(t, w3, (100, 150), end_s=400)
    assert r3["recovered"] is False and math.isinf(r3["recovery_s"]) and r3["recovered_at_s"] is None
    # back only just before the end: not confirmed
    w4 = base + np.where((t >= 100) & (t < 390), 50, 0)
    r4 = recovery_time(t, w4, (100, 150), end_s=400)
    assert r4["recovered"] is False and "only for" in r4["note"]
    # a queue that never rose recovers at once
    assert recovery_time(t, base, (100, 150))["recovery_s"] == 0
    # no sample before the spike: the range is unknown
    assert recovery_time(t[t >= 100], w[t >= 100], (100, 150))["recovered"] is None
    # a short history: the pre-spike window is what is there
    r5 = recovery_time(t[t >= 80], w[t >= 80], (100, 150))
    assert r5["pre_window_s"] == [80.0, 100.0] and "shortened" in r5["note"]
    with pytest.raises(InputError, match="spike"):
        recovery_time(t, w, (150, 100))


def test_without_pools_series_or_fleet_columns():
    req, _, _ = fleet_run(optional=False)
    s = fleet_summary(req, None, horizon_s=HORIZON)
    assert list(s["pools"]) == ["fleet"] and s["model_mix"] is None and s["quality"] is None
    assert "replicas" not in s and "recovery" not in s and "kv_transfers" not in s["pools"]["fleet"]
    assert s["pools"]["fleet"]["request_goodput"] is None
    assert retry_amplification(req)["amplification"] == pytest.approx(1.1)


def test_missing_costs_are_said():
    req, _, pools = fleet_run()
    s = fleet_summary(req, pools, horizon_s=HORIZON, pool_costs={"main": 2.0})
    assert s["cost"]["complete"] is False and s["cost"]["pools"]["fallback"]["cost"] is None
    assert s["cost"]["total_cost"] == pytest.approx(2.0 * 1590 / 3600)


def test_with_a_warm_up_no_pool_completes_more_than_arrived():
    """Completed and failed count the window's arrivals, as arrivals does (issue 38 item 6): with a
    warm-up, requests arriving before it and finishing after it count in the throughput
    (finished_in_window) but not in completed, which never exceeds arrivals."""
    req, _, pools = fleet_run()
    s = fleet_summary(req, pools, warmup_s=100.0, horizon_s=HORIZON)
    for name, row in [*s["pools"].items(), *s["classes"].items()]:
        assert row["completed"] + row["failed"] + row["in_flight"] <= row["arrivals"], (name, row)
        assert row["finished_in_window"] >= row["completed"]
    assert any(r["finished_in_window"] > r["completed"] for r in s["pools"].values())
