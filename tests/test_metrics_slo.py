"""Tests of llmqueue.metrics.slo: vLLM goodput by hand on a tiny table, per-class attainment,
percentile targets with intervals."""

from __future__ import annotations

import math

import pytest
from _queue_sim import mm1_times, records_from_times, table

from llmqueue.errors import InputError
from llmqueue.metrics.slo import good_mask, parse_targets, request_goodput, slo_attainment


def _tiny():
    # ttft = first_token - arrival, e2el = finish - arrival, tpot = (e2el - ttft)/(out - 1)
    return table([
        # 0: ttft 1.0, tpot (5-1)/4 = 1.0, e2el 5 -> meets ttft<=1500, tpot<=1000
        {"arrival_s": 0.0, "first_token_s": 1.0, "finish_s": 5.0, "output_tokens": 5},
        # 1: ttft 2.0 -> misses ttft
        {"arrival_s": 1.0, "first_token_s": 3.0, "finish_s": 4.0, "output_tokens": 2},
        # 2: ttft 0.5, tpot (4.5-0.5)/2 = 2.0 -> misses tpot
        {"arrival_s": 2.0, "first_token_s": 2.5, "finish_s": 6.5, "output_tokens": 3,
         "class": "batch"},
        # 3: one output token: tpot counts as 0 (vLLM) -> good
        {"arrival_s": 3.0, "first_token_s": 3.2, "finish_s": 3.2, "output_tokens": 1},
        # 4: rejected -> never good
        {"arrival_s": 4.0, "finish_s": 4.0, "status": "rejected", "output_tokens": 0},
        # 5: ok but finishes at 10 -> good
        {"arrival_s": 5.0, "first_token_s": 5.1, "finish_s": 10.0, "output_tokens": 50,
         "class": "batch"},
    ])


def test_goodput_by_hand():
    r = _tiny()
    slos = {"ttft_ms": 1500, "tpot_ms": 1000}
    assert list(good_mask(r, slos)) == [True, False, False, True, False, True]
    # window [0, 10] (last event): 3 good / 10 s
    assert request_goodput(r, slos) == pytest.approx(0.3)
    # vLLM spelling without _ms
    assert request_goodput(r, {"ttft": 1500, "tpot": 1000}) == pytest.approx(0.3)
    # e2el <= 4.9 s: 0 (5.0) and 5 (5.0) miss, 1 (3.0), 2 (4.5), 3 (0.2) pass, 4 was rejected
    assert list(good_mask(r, {"e2el_ms": 4900})) == [False, True, True, True, False, False]
    # goodput counts finishes in the window: horizon 8 s drops request 5
    assert request_goodput(r, slos, horizon_s=8.0) == pytest.approx(2 / 8)
    # aggregate targets only: each target's threshold applies per request (DistServe's goodput):
    # TTFT <= 300 ms: requests 3 (0.2 s) and 5 (0.1 s)
    assert request_goodput(r, {"p99_ttft_ms": 300}) == pytest.approx(2 / 10)
    # per class: batch TTFT <= 600 ms (2 and 5), the others E2EL <= 1 s (3)
    assert request_goodput(r, {"batch": {"p99_ttft_ms": 600}, "*": {"mean_e2el_ms": 1000}}) == pytest.approx(3 / 10)
    assert request_goodput(r, {"p99_itl_ms": 100}) is None  # no target applies to one request


def test_per_class_targets_and_attainment():
    r = _tiny()
    slos = {"chat": {"ttft_ms": 1500}, "batch": {"e2el_ms": 4000}}
    # chat: 0 good, 1 misses ttft, 3 good, 4 rejected; batch: 2 (e2el 4.5) and 5 (5.0) miss
    assert list(good_mask(r, slos)) == [True, False, False, True, False, False]
    out = slo_attainment(r, slos)
    chat = out["by_class"]["chat"]
    assert (chat["requests"], chat["good"]) == (4, 2)
    assert chat["attainment"] == pytest.approx(0.5)
    assert chat["ttft_ms"] == {"target": 1500.0, "attainment": 0.5}
    assert out["by_class"]["batch"]["attainment"] == 0.0
    assert out["overall"]["attainment"] == pytest.approx(2 / 6)
    assert out["overall"]["attainment_ci"] is None  # six requests: no interval
    # "*" applies to classes not named
    assert list(good_mask(r, {"*": {"ttft_ms": 1500}, "batch": {}})) == \
        [True, False, True, True, False, True]


def test_parse_targets():
    per, agg = parse_targets({"ttft_ms": 200, "tpot": 50, "p99_ttft_ms": 1000,
                              "p99.9_e2el_ms": 9000, "mean_itl_ms": 30, "median_queue_ms": 5})
    assert per == {"ttft": 200.0, "tpot": 50.0}
    assert agg["p99.9_e2el_ms"] == ("p99.9", "e2el", 9000.0)
    assert set(agg) == {"p99_ttft_ms", "p99.9_e2el_ms", "mean_itl_ms", "median_queue_ms"}
    for bad in ({"ttfb_ms": 1}, {"ttft_ms": -1}, {"p100_ttft_ms": 1}, {"itl_ms": 5}):
        with pytest.raises(InputError):
            parse_targets(bad)


def test_percentile_targets_with_intervals():
    """M/M/1 rho = 0.5: e2el ~ Exp(0.5), p99 = ln(100)/0.5 = 9.21 s, mean 2 s."""
    a, s, f = mm1_times(0.5, 1.0, 40_000, seed=31)
    r = records_from_times(a, s, f, classes=("chat", "batch"))
    p99 = math.log(100) / 0.5
    out = slo_attainment(r, {"p99_e2el_ms": 1000 * p99 * 1.3, "mean_e2el_ms": 1000 * 2 * 0.8,
                             "p50_e2el_ms": 1000 * math.log(2) / 0.5, "e2el_ms": 1000 * p99},
                         warmup_s=1000.0)
    o = out["overall"]
    assert o["p99_e2el_ms"]["verdict"] == "met"
    assert o["p99_e2el_ms"]["ci"][0] <= o["p99_e2el_ms"]["value"] <= o["p99_e2el_ms"]["ci"][1]
    assert o["mean_e2el_ms"]["verdict"] == "violated"
    assert o["p50_e2el_ms"]["verdict"] == "inconclusive"  # target = true median
    lo, hi = o["attainment_ci"]
    assert lo <= 0.99 <= hi  # P(e2el <= p99) = 0.99
    assert set(out["by_class"]) == {"chat", "batch"}
    assert out["by_class"]["chat"]["p99_e2el_ms"]["value"] is not None
