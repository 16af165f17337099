"""The verdict of a whole run (summarize's ``verdict``/``stable``): the queue trend over the arrival
window only, failures, goodput. A system that throws work away, or whose backlog drains after the
last arrival, is never called stable."""

from __future__ import annotations

import numpy as np
import pytest
from _cli import run_cli
from _queue_sim import mm1_times, records_from_times

from llmqueue.metrics.stability import stability_verdict
from llmqueue.metrics.summary import summarize
from llmqueue.records import RequestRecords


def _with_status(recs, idx, status):
    cols = recs.to_dict()
    st = np.asarray(cols["status"], dtype=object).copy()
    st[idx] = status
    cols["status"] = st
    return RequestRecords.from_columns(cols)


def test_an_overloaded_run_with_a_drain_is_unstable():
    # M/M/1 at rho = 2 for 2,000 arrivals, then every request served: the backlog grows for ~1,000 s
    # and drains for ~1,000 s more. Over the arrival window the queue grows at lam - mu = 1 req/s.
    a, s, f = mm1_times(2.0, 1.0, 2000, seed=5)
    recs = records_from_times(a, s, f)
    out = summarize(recs)
    assert out["stable"] is False and out["verdict"].startswith("unstable: queue grows")
    assert out["stability"]["t1"] == pytest.approx(float(a.max()))
    assert out["queue_growth_per_s"] == pytest.approx(1.0, abs=0.15)
    # judged over the drain too, the same records show no growth: that was the old verdict
    whole = stability_verdict(recs)
    assert not whole.verdict.startswith("unstable")


def test_timeouts_make_an_overloaded_verdict():
    # a flat queue (rho = 0.5), but 30 % of the requests timed out: the system does not serve its load
    a, s, f = mm1_times(0.5, 1.0, 4000, seed=6)
    rng = np.random.default_rng(0)
    idx = rng.choice(len(a), 1200, replace=False)
    recs = _with_status(records_from_times(a, s, f), idx, "timeout")
    out = summarize(recs)
    assert out["queue_verdict"] == "stable"
    assert out["stable"] is False
    assert out["verdict"] == "overloaded: 30% failed (timeout 30%)"
    assert out["failed_share"] == pytest.approx(0.3)


def test_a_few_failures_are_not_an_overload():
    a, s, f = mm1_times(0.5, 1.0, 4000, seed=7)
    recs = _with_status(records_from_times(a, s, f), [3, 500, 1700], "rejected")
    out = summarize(recs)
    assert out["verdict"] == "stable" and out["stable"] is True
    assert out["failed_share"] == pytest.approx(3 / 4000)
    # 1 failure of 4 arrivals: a 25 % share that the data cannot tell from 5 %
    a, s, f = mm1_times(0.5, 1.0, 4, seed=8)
    out = summarize(_with_status(records_from_times(a, s, f), [1], "timeout"))
    assert out["verdict"] == "insufficient data"


def test_goodput_collapse_is_failing_slos_not_stable():
    a, s, f = mm1_times(0.5, 1.0, 4000, seed=9)
    recs = records_from_times(a, s, f)
    ttft = recs.derived()["ttft_s"]
    target_ms = float(np.percentile(ttft, 20)) * 1000  # about 20 % of the requests meet it
    out = summarize(recs, slos={"chat": {"p99_ttft_ms": target_ms}})  # per-class aggregate targets only
    assert out["request_goodput"] is not None
    assert out["good_share"] == pytest.approx(0.2, abs=0.01)
    assert out["verdict"].startswith("failing SLOs: 20")
    assert out["stable"] is True  # the queue is bounded and nothing was dropped
    # a reachable target leaves the verdict alone
    out = summarize(recs, slos={"chat": {"p99_ttft_ms": 1e6}})
    assert out["verdict"] == "stable" and out["good_share"] == pytest.approx(1.0)


def test_simulate_chat_with_one_seq_is_overloaded():
    # one sequence at a time against 20 req/s: the clients' timeouts keep the queue flat
    d = run_cli("simulate", "--scenario", "chat", "--max-num-seqs", "1", "--duration", "120", "--json").json()
    s = d.get("summary", d)
    assert s["stable"] is False and s["verdict"].startswith("overloaded: ")
    assert s["failed_share"] > 0.5
    assert s["request_goodput"] is not None  # the scenario's per-class p99 targets give a goodput
    code, text, err = run_cli("simulate", "--scenario", "chat", "--max-num-seqs", "1", "--duration", "120")
    assert code == 0, err
    assert "overloaded: " in text and "failed share" in text and "stable" not in text.split("verdict")[1].splitlines()[0]


def test_simulate_num_requests_overload_is_unstable():
    # rho ~ 3 with a fixed number of requests: the drain after the last arrival used to read "stable"
    d = run_cli("simulate", "--capacity-tokens", "456496", "--max-num-seqs", "1024",
                "--max-num-batched-tokens", "8192", "--step-time",
                "linear:c0=0.02:prefill=0.00002:decode=0.0001:ctx=0.0000001",
                "--prompt", "lognormal:mean=1260:sd=1400:max=8000",
                "--output", "lognormal:mean=190:sd=250:max=2000", "--arrival", "poisson:40",
                "--num-requests", "1500", "--json").json()
    s = d.get("summary", d)
    assert s["stable"] is False and s["verdict"].startswith("unstable: queue grows")


def test_caveats_and_class_slo_verdicts_in_the_table_and_the_report(tmp_path):
    """What the JSON said only (the roofline estimate, the fleet of four, per-class SLO verdicts)
    is in the table and the run report too."""
    code, text, err = run_cli("simulate", "--scenario", "rag", "--duration", "120", "--out", str(tmp_path / "run"))
    assert code == 0, err
    caveats = text.split("\nCaveats\n")[1]
    assert "4 replicas on one clock" in caveats and "roofline" in caveats
    slo = text.split("SLOs (per class)")[1].split("\nCaveats")[0]
    assert "p99_tpot_ms" in slo and " vs 100: " in slo and ("violated" in slo or "met" in slo)
    assert run_cli("report", str(tmp_path / "run"), "-o", str(tmp_path / "r.html")).code == 0
    html = (tmp_path / "r.html").read_text()
    assert "Caveats" in html and "4 replicas on one clock" in html and "p99_tpot_ms" in html
