"""Capacity search: the SLO judgement, the bracket logic, and the acceptance on the chat scenario."""

from __future__ import annotations

import json
import math

import pytest
from _cli import run_cli

from llmqueue.errors import InputError
from llmqueue.plan import sweep_run as sweep_mod
from llmqueue.plan.capacity import capacity_search
from llmqueue.plan.points import scenario_spec
from llmqueue.plan.slo_judge import judge, scenario_slos, slo_targets
from llmqueue.plan.sweep_run import PointResult

SLOS = {"p99_ttft_ms": 2000.0, "p99_tpot_ms": 50.0}


def summary(ttft=1000.0, tpot=30.0, ci=0.1, failed=0, arrivals=10_000, stable=True):
    s = {"p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "arrivals": arrivals, "stable": stable,
         "verdict": "stable" if stable else "unstable: queue grows 1 req/s",
         "status_counts": {"ok": arrivals - failed, "timeout": failed}}
    s["p99_ttft_ms_ci"] = [ttft * (1 - ci), ttft * (1 + ci)] if ci is not None else None
    s["p99_tpot_ms_ci"] = [tpot * (1 - ci), tpot * (1 + ci)] if ci is not None else None
    return s


# --- the judgement --------------------------------------------------------------------------------

def test_judge_uses_the_upper_confidence_bound():
    assert judge(summary(), SLOS)["meets"]
    j = judge(summary(tpot=48.0), SLOS)  # estimate 48 <= 50, but the CI reaches 52.8
    assert not j["meets"] and j["basis"] == "ci"
    assert j["checks"]["p99_tpot_ms"]["bound"] == pytest.approx(52.8)
    assert "p99_tpot_ms CI upper bound 52.8 > 50" in j["reasons"][0]


def test_judge_falls_back_to_the_estimate_without_an_interval():
    j = judge(summary(tpot=48.0, ci=None), SLOS)
    assert j["meets"] and j["basis"] == "estimate"
    assert not judge(summary(tpot=51.0, ci=None), SLOS)["meets"]


def test_judge_counts_failed_requests_and_growing_queues():
    # 1% may fail for a p99 target (they would be that percentile's tail), not more
    assert judge(summary(failed=100), SLOS)["meets"]
    j = judge(summary(failed=101), SLOS)
    assert not j["meets"] and "failed" in j["reasons"][0]
    assert not judge(summary(stable=False), SLOS)["meets"]
    j = judge({**summary(), "p99_ttft_ms": None, "p99_ttft_ms_ci": None}, SLOS)
    assert not j["meets"] and "no completed request" in j["reasons"][0]
    with pytest.raises(InputError):
        judge(summary(), {})


def test_slo_targets():
    assert slo_targets(ttft_ms=2000, tpot_ms=50) == SLOS
    assert slo_targets(e2el_ms=100, percentile=90) == {"p90_e2el_ms": 100}
    with pytest.raises(InputError, match="percentile"):
        slo_targets(ttft_ms=1, percentile=97)
    assert scenario_slos("chat") == SLOS  # chat.yaml: ttft p99 2 s, tpot p99 0.05 s


# --- the search, on a model whose answer is known --------------------------------------------------

def fake_points(p99_of_rate, mu=10.0, calls=None):
    """A stand-in for run_points: p99 TTFT = p99_of_rate(rate) with a +-10% interval."""

    def run_points(factory, base, coords_list, *, seeds="derived", backend=None, cache_dir=None,
                   keep_runs=False, progress=False, desc="", stats=None, bar=None):
        out = []
        for c in coords_list:
            if bar is not None:
                bar.update(1)
            r = c["rate"]
            if calls is not None:
                calls.append(r)
            v = p99_of_rate(r)
            s = summary(ttft=v, tpot=10.0) if v is not None else summary(failed=5000)
            out.append(PointResult(key=f"k{r}", coords=c, params={}, seed=0, summary=s, theory={"mu": mu}))
            if stats is not None:
                stats.ran += 1
        return out

    return run_points


def search(monkeypatch, p99_of_rate, *, mu=10.0, start=1.0, workers=2, **kw):
    calls = []
    monkeypatch.setattr(sweep_mod, "run_points", fake_points(p99_of_rate, mu, calls))
    from llmqueue.plan.backends import LocalBackend

    be = LocalBackend(workers=workers)  # never started: the fake simulates in this process
    res = capacity_search(scenario_spec, {"scenario": "chat"}, slos={"p99_ttft_ms": 1000.0}, lo=start,
                          backend=be, **kw)
    return res, calls


def hyperbolic(r):
    """An M/M/1-like p99 (ms) growing as 1 / (mu - r), mu = 10; no completions beyond."""
    return 1000 / (10 - r) if r < 10 else None


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_search_converges_to_the_known_threshold(monkeypatch, workers):
    # p99 = 1000 / (10 - r) ms, judged by its upper bound 1.1 x against 1000 ms: meets up to r = 8.9
    res, calls = search(monkeypatch, hyperbolic, workers=workers)
    truth = 10 - 1.1
    assert res.converged and res.accepted
    assert truth / 1.02 <= res.rate <= truth
    assert res.hi is not None and (res.hi - res.lo) <= 0.02 * res.lo
    assert res.confirm["above"]["rate"] == pytest.approx(1.1 * res.rate)
    assert not res.confirm["above"]["meets"] and res.confirm["at_rate"]["meets"]
    assert len(calls) == len(set(calls))  # no rate simulated twice
    assert len(calls) <= 14 if workers == 1 else len(calls) <= 16


def test_search_doubles_past_an_optimistic_mu(monkeypatch):
    f = lambda r: 1000.0 * r / 30 / 1.1  # noqa: E731 - meets up to r = 30, above the theory's mu of 10
    res, _ = search(monkeypatch, f, mu=10.0)
    assert res.accepted and 30 / 1.02 <= res.rate <= 30


def test_search_goes_on_when_ten_percent_more_still_meets(monkeypatch):
    # non-monotone: meets below 5 and again in the band (5.4, 5.6), where 1.1 x ~5 lands
    def f(r):
        return 500.0 if r < 5 or 5.4 < r < 5.6 else 2000.0

    res, _ = search(monkeypatch, f, rel_tol=0.01)
    assert res.accepted
    assert 5.4 < res.rate < 5.6
    assert res.meta["non_monotone_failures_below"]  # reported, not hidden


def test_search_reports_no_rate_when_nothing_meets(monkeypatch):
    res, calls = search(monkeypatch, lambda r: 5000.0)
    assert res.rate is None and not res.accepted and not res.converged
    assert min(calls) < 1e-3 * 1.0 * 2


def test_one_progress_bar_over_the_whole_search(monkeypatch):
    """capacity --progress: one bar for the whole search (not one per round), whose total is
    the simulations so far plus an estimate of those to come, never below what has run."""
    from llmqueue import _progress

    bars = []

    class Recorder(_progress._Silent):
        def __init__(self, total, **kw):
            self.total, self.kw, self.seen = total, kw, []
            bars.append(self)

        def update(self, n=1):
            super().update(n)
            self.seen.append((self.n, self.total))

    monkeypatch.setattr(_progress, "bar", lambda total, **kw: Recorder(total, **kw))
    res, calls = search(monkeypatch, hyperbolic, workers=2, progress=True)
    assert len(bars) == 1 and bars[0].kw["desc"] == "capacity" and bars[0].kw["enabled"] is True
    b = bars[0]
    assert b.n == len(calls) and [n for n, _ in b.seen] == list(range(1, len(calls) + 1))  # never restarts
    assert all(total >= n for n, total in b.seen)
    first = b.seen[0][1]
    assert 0.5 * len(calls) <= first <= 2 * len(calls)  # the first estimate is of the right size


def test_evals_left_estimate():
    from llmqueue.plan.capacity import _evals_left

    # [10, 20] to 2%: (20 - 10) / 0.2 = 50 -> ceil(log 50 / log 3) = 4 rounds of 2, one confirmation
    assert _evals_left(10.0, 20.0, width=2, rel_tol=0.02, replications=0) == 4 * 2 + 1
    assert _evals_left(10.0, 10.1, width=2, rel_tol=0.02, replications=3) == 1 + 3  # narrow: confirm, replicate
    assert _evals_left(10.0, None, width=1, rel_tol=0.02, replications=0) == (1 + 6) * 1 + 1


def test_budget_is_respected(monkeypatch):
    res, calls = search(monkeypatch, hyperbolic, max_evals=5, rel_tol=1e-6, confirm_factor=1.1)
    assert len(calls) <= 7 and not res.converged


# --- the acceptance: the chat scenario --------------------------------------------------------------

def test_capacity_of_the_chat_scenario_is_confirmed(tmp_path):
    """``llmqueue capacity --scenario chat``: the rate meets the SLO and 10% more does not.

    Shortened to 300 s (60 s warm-up): too few requests for p99 intervals, so the judgement
    uses the estimates (basis ``estimate``). The confirmations are simulated again here, outside
    the search, with the scenario's seed that the search used at every rate.
    """
    from llmqueue.simulate import run_simulation

    code, out, err = run_cli("capacity", "--scenario", "chat", "--duration", "300", "--json", "--no-progress",
                             "--out", str(tmp_path))
    assert code == 0, err
    d = json.loads(out)
    assert d["slos"] == SLOS
    assert d["accepted"] and d["converged"]
    rate = d["rate"]
    lo, hi = d["bracket"]
    assert lo == rate and hi > rate and d["bracket_rel_width"] <= 0.02
    assert d["theory_mu"] > rate  # the SLO binds long before the queue would grow without bound
    assert json.loads((tmp_path / "capacity.json").read_text())["rate"] == rate
    for factor, meets in ((1.0, True), (1.1, False)):
        out = run_simulation(scenario_spec(scenario="chat", rate=rate * factor, duration=300.0))
        assert judge(out.summary, SLOS)["meets"] is meets, (factor, judge(out.summary, SLOS)["reasons"])
    # the answer is a real operating point: chat's p99 TPOT target binds, TTFT is far below 2 s
    at = d["confirm"]["at_rate"]
    assert at["p99_tpot_ms"] <= 50 and at["p99_ttft_ms"] < 2000 and at["verdict"] == "stable"


# --- an independent truth: M/M/1 ------------------------------------------------------------------

@pytest.mark.slow
def test_capacity_of_mm1_matches_the_closed_form():
    """One request at a time, exponential service (mean 0.1 s): M/M/1 with mu = 10. The sojourn
    time is Exp(mu - lam), so p99 E2EL <= S holds up to lam* = mu - ln(100) / S (5.395 for S = 1 s).
    The CI rule is conservative: the answer lies a little below lam*."""
    from llmqueue.spec import build_spec
    from llmqueue.knobs import flag_defaults

    base = flag_defaults(max_num_seqs=1, prompt="fixed:1", output="fixed:1", step_time="exp:0.1",
                          arrival="poisson:1", duration=20_000.0, seed=1)
    res = capacity_search(build_spec, base, slos={"p99_e2el_ms": 1000.0}, backend="local")
    truth = 10 - math.log(100) / 1.0
    assert res.accepted
    assert 0.85 * truth <= res.rate <= 1.02 * truth
