"""Theory that says what it judges (issue 38 item 4): the peak of a time-varying arrival, the
retries' offered load, per-pool closed forms for a fleet, and a stated reason whenever the
theory's verdict and the simulation's differ."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmqueue.theory.judged import peak_rate, reconcile
from llmqueue.workload.arrivals import OnOff, Poisson
from llmqueue.workload.nonstationary import Diurnal, Piecewise, Spike


def test_the_peak_of_a_spike_is_k_times_its_rate_over_the_spike():
    p = peak_rate(Spike(34.0, 2.0, 900.0, 900.0), [], 3600.0)
    assert p["lam_peak"] == pytest.approx(68.0, rel=1e-12)
    assert 900.0 <= p["t0"] and p["t1"] <= 1800.0


def test_the_peak_of_a_daily_cycle_is_its_crest_averaged_over_the_window():
    d = Diurnal(10.0, 0.5, period=86400.0)
    p = peak_rate(d, [], 86400.0)
    # the 60-s mean of R (1 + A sin) around its crest: R (1 + A sinc(pi W / P)) to first order
    crest = 10.0 * (1 + 0.5 * math.sin(math.pi * 60 / 86400) / (math.pi * 60 / 86400))
    assert p["lam_peak"] == pytest.approx(crest, rel=1e-4)
    assert abs((p["t0"] + p["t1"]) / 2 - 86400 / 4) < 60


def test_a_piecewise_peak_starts_at_its_level_and_a_short_burst_is_averaged():
    p = peak_rate(Piecewise([(0.0, 5.0), (100.0, 40.0), (130.0, 5.0)]), [], 600.0)
    # 30 s at 40 req/s inside a 60-s window: (30 x 40 + 30 x 5) / 60
    assert p["lam_peak"] == pytest.approx((30 * 40 + 30 * 5) / 60, rel=1e-9)


def test_a_stationary_process_has_no_peak_and_an_on_off_source_peaks_in_its_on_state():
    assert peak_rate(Poisson(5.0), np.arange(100.0), 100.0) is None
    assert peak_rate(OnOff(25.0, 300.0, 300.0, 14.0), [], 600.0)["lam_peak"] == 25.0


def test_the_busiest_window_of_a_trace_is_counted():
    rng = np.random.default_rng(0)
    a = np.sort(np.concatenate([rng.uniform(0, 600, 600), rng.uniform(200, 260, 300)]))
    p = peak_rate(None, a, 600.0)
    brute = max(np.sum((a >= t) & (a < t + 60)) for t in a if t + 60 <= 600) / 60
    assert p["lam_peak"] == pytest.approx(brute)
    assert 140 <= p["t0"] <= 260


def _simulate(args):
    from llmqueue.cli.main import cli
    from click.testing import CliRunner

    r = CliRunner().invoke(cli, ["simulate", *args, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    import json

    return json.loads(r.output[r.output.index("{"):])


def test_noon_spike_theory_judges_the_peak_and_says_why_the_simulation_is_overloaded(tmp_path):
    d = _simulate(["--scenario", "noon-spike", "--out", str(tmp_path / "r")])
    th, s = d["theory"], d
    assert th["verdict"].startswith("stable")          # the mean rate
    assert th["rho_peak"] > 1 and th["verdict_peak"].startswith("overloaded")
    assert s["verdict"].startswith("overloaded")
    assert "at the peak" in th["why_they_differ"]


def test_retries_count_in_the_offered_load(tmp_path):
    d = _simulate(["--scenario", "chat", "--rate", "20", "--out", str(tmp_path / "r")])
    th = d["theory"]
    assert th["retry_amplification"] > 1.2
    assert th["rho_offered"] == pytest.approx(th["rho"] * th["retry_amplification"])
    assert d["verdict"].startswith("overloaded") and th["why_they_differ"]


def test_a_fleet_of_several_pools_is_judged_pool_by_pool(tmp_path):
    d = _simulate(["--scenario", "lanes", "--duration", "300", "--out", str(tmp_path / "r")])
    pools = d["theory"]["pools"]
    assert set(pools) == {"latency", "throughput", "small"}   # small: the fallback pool
    for name in ("latency", "throughput"):
        p = pools[name]
        assert p["lam"] > 0 and p["mu"] > 0 and p["rho"] == pytest.approx(p["lam"] / p["mu"])
    assert d["theory"]["verdict"].startswith("stable")


def test_a_pd_fleet_is_judged_stage_by_stage(tmp_path):
    d = _simulate(["--scenario", "pd", "--duration", "300", "--out", str(tmp_path / "r")])
    pools = d["theory"]["pools"]
    assert {p["stage"] for p in pools.values()} >= {"prefill", "decode"}
    pre = next(p for p in pools.values() if p["stage"] == "prefill")
    dec = next(p for p in pools.values() if p["stage"] == "decode")
    assert dec["lam"] * dec["replicas"] <= pre["lam"] * pre["replicas"] + 1e-9  # o > 1 only


@pytest.mark.parametrize("theory,summary,differs", [
    ({"verdict": "stable"}, {"verdict": "stable"}, False),
    ({"verdict": "stable", "rho_peak": 1.4, "peak_source": "x"}, {"verdict": "overloaded: 12% failed"}, True),
    ({"verdict": "stable"}, {"verdict": "overloaded: 3% failed", "status_counts": {"timeout": 9}}, True),
    ({"verdict": "stable"}, {"verdict": "unstable: queue grows 4 req/s"}, True),
    ({"verdict": "unstable"}, {"verdict": "stable"}, True),
    ({"verdict": "unstable"}, {"verdict": "unstable: queue grows 4 req/s"}, False),
])
def test_a_theory_verdict_never_contradicts_the_simulation_without_a_reason(theory, summary, differs):
    why = reconcile(theory, summary)
    assert bool(why) == differs


def test_an_indeterminate_theory_verdict_says_its_gap_and_names_the_margin(tmp_path):
    """Inside seed 004's gap [mu (1 - delta), mu] the theorems decide nothing (issue 36 item 6):
    the verdict says so, with the gap, and names the simulator's margin verdict (or how to get it)."""
    flags = ["--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512", "--prompt-len",
             "uniform:10:1600", "--output-len", "uniform:10:1600", "--duration", "900", "--seed", "1", "--rate", "3.2"]
    d = _simulate([*flags, "--out", str(tmp_path / "a")])
    th = d["theory"]
    assert th["verdict"] == "indeterminate"
    lo, hi = th["mu"] * (1 - th["delta"]), th["mu"]
    assert lo < 3.2 < hi
    assert "gap" in th["verdict_detail"] and "--margin" in th["verdict_detail"]
    d = _simulate([*flags, "--margin", "0.1", "--out", str(tmp_path / "b")])
    assert f"the simulator's margin: {d['regime_margin']['regime']}" in d["theory"]["verdict_detail"]
