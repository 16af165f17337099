"""The client judges only what its schedule promised (issue 38 item 7): no KS test of the gaps of an
all-at-once or deterministic schedule (deterministic gaps checked against their own value), no
"client fell behind" for all-at-once; ``validate`` of an all-at-once run takes lam from the send
times."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import yaml
from _cli import run_cli

from llmqueue.bench.checks import arrival_check, schedule_kind
from llmqueue.bench.stub_server import StubServer

WL = ("--prompt", "uniform:4:40", "--output", "uniform:1:6")


@pytest.fixture(scope="module")
def stub():
    with StubServer(token_delay_s=0.001) as s:
        yield s


def test_schedule_kinds():
    assert schedule_kind(np.zeros(50)) == "all at once"
    assert schedule_kind(np.arange(50) * 0.02) == "constant gaps"
    assert schedule_kind(np.cumsum(np.random.default_rng(1).exponential(0.02, 50))) == "random gaps"


def test_all_at_once_is_not_judged_on_lag_or_gaps():
    """1,000 requests due at 0, sent over 40 ms: the lag is how long sending took, not lateness."""
    a = np.zeros(1000)
    c = arrival_check(a, np.linspace(0, 0.04, 1000))
    assert c["schedule"] == "all at once" and c["ks_gaps"] is None and c["gap_check"] is None
    assert c["arrivals_ok"] and "fell behind" not in c["verdict"] and c["lag_ms"]["max"] == pytest.approx(40)


def test_deterministic_gaps_are_checked_against_their_own_value():
    """Constant 10-ms gaps: no KS test (any jitter gives D = 1); the realized gaps against 10 ms."""
    rng = np.random.default_rng(0)
    d = np.arange(2000) * 0.01
    ok = arrival_check(d, d + rng.uniform(0, 2e-4, len(d)))
    assert ok["schedule"] == "constant gaps" and ok["ks_gaps"] is None and ok["arrivals_ok"]
    assert ok["gap_check"]["gap_ms"] == pytest.approx(10.0) and ok["gap_check"]["p99_gap_error_ms"] < 0.5
    # every other send 5 ms late: the gaps are 5 and 15 ms, not 10
    jumpy = arrival_check(d, d + 0.005 * (np.arange(len(d)) % 2))
    assert not jumpy["arrivals_ok"] and "constant 10 ms" in jumpy["verdict"] and "KS" not in jumpy["verdict"]


def test_bench_all_at_once_and_deterministic_print_no_false_alarm(stub, tmp_path):
    code, out, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--request-rate", "inf",
                             "--num-prompts", "60", *WL, "--no-progress")
    assert code == 0, err
    assert "fell behind" not in out and "KS" not in out
    assert "none: all sent at once" in out
    s = run_cli("bench", "--url", stub.url, "--model", stub.model, "--arrival", "deterministic:50",
                "--num-requests", "40", *WL, "--no-progress", "--json").json()
    c = s["client"]
    assert c["schedule"] == "constant gaps" and c["ks_gaps"] is None
    assert c["gap_check"]["gap_ms"] == pytest.approx(20.0) and "KS" not in c["verdict"]


def test_validate_an_all_at_once_run_takes_lam_from_the_send_times(stub, tmp_path):
    """--request-rate inf --max-concurrency 4: the schedule puts every request at 0 (and validate
    replays the schedule of a capped run), so lam comes from the send times, finite; no numpy
    warning, no 'lam: must be finite'."""
    run = tmp_path / "inf"
    code, out, err = run_cli("bench", "--url", stub.url, "--model", stub.model, "--request-rate", "inf",
                             "--num-prompts", "60", "--max-concurrency", "4", *WL, "--out", str(run), "--no-progress")
    assert code == 0, err
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"b": 0.001, "capacity_tokens": 20000, "step_time": "0.001",
                                   "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 2048}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's divide by zero was one
        v = run_cli("validate", str(run), "--calibration", str(cal), "--speed-band", "0", "--drift", "0",
                    "--json").json()
    import pyarrow.parquet as pq

    sent = np.asarray(pq.read_table(run / "requests.parquet").column("dispatched_s").to_numpy(), dtype=float)
    assert v["arrivals"] == "intended" and v["lam_source"].startswith("send times")
    assert v["lam"] == pytest.approx((len(sent) - 1) / np.ptp(sent))
    assert v["theory"]["rho"] is not None and np.isfinite(v["theory"]["rho"])
    code, out, err = run_cli("validate", str(run), "--calibration", str(cal), "--speed-band", "0", "--drift", "0")
    assert code == 0, err
    assert "req/s from the send times" in out

