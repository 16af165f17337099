"""Tipping under the engine's run-to-run speed spread for a deployment (llmqueue.plan.tipping),
as `capacity` and `plan` report it (issue 36 item 5): checked against a simulated lab."""

import json

import numpy as np
import pytest
from _cli import run_cli
from scipy.stats import norm

from llmqueue.plan.points import factory_name
from llmqueue.plan.slo_judge import judge
from llmqueue.plan.sweep_run import run_points
from llmqueue.plan.tipping import scaled_spec, speed_tipping
from llmqueue.spec import build_spec

# Nie et al.'s 1:1 setting on two replicas behind the default router, near both cliffs
LAB = dict(capacity_tokens=131000, step_time="0.0372", chunk=512, prompt="uniform:10:1600",
           output="uniform:10:1600", duration=300, seed=1, rate=4.6, replicas=2)
SLOS = {"p99_ttft_ms": 1500}
SPREAD = 0.05


def test_the_stated_probabilities_match_a_lab_whose_engine_speed_varies():
    """A lab of 120 runs of the same two-replica deployment and arrivals, each at an engine speed
    drawn from the stated spread (step time x exp(0.05 Z), at Z's 120 evenly spaced quantiles, so
    the lab's own draws add no sampling noise): the share of runs that missed the SLOs, and the
    share that preempted, each within 10 points of the probability stated from the cliff search."""
    t = speed_tipping(build_spec, LAB, slos=SLOS, spread=SPREAD, source="the lab's", backend="local")
    speeds = np.exp(SPREAD * norm.ppf((np.arange(120) + 0.5) / 120))
    pts = run_points(scaled_spec, {**LAB, "factory": factory_name(build_spec)},
                     [{"step_scale": float(s)} for s in speeds], seeds="common", backend="local")
    missed = np.mean([not judge(p.summary, SLOS)["meets"] for p in pts])
    preempted = np.mean([p.summary["preemptions"] > 0 for p in pts])
    assert abs(t["slo"]["probability"] - missed) <= 0.10, (t["slo"], missed)
    assert abs(t["preemption"]["probability"] - preempted) <= 0.10, (t["preemption"], preempted)
    # cases where the spread matters, not certainties: the test could fail either way
    assert 0.02 < t["preemption"]["probability"] < 0.98 and 0.02 < preempted < 0.98
    assert t["slo"]["at_calibrated_speed"] == t["preemption"]["at_calibrated_speed"] == "holds"
    assert t["simulations"] <= 14


def test_a_deployment_that_already_fails_searches_below_the_calibrated_speed():
    """At a rate where the modelled engine already misses the SLOs and preempts, each cliff lies
    below one (a faster engine would hold) and the probability is above one half."""
    t = speed_tipping(build_spec, dict(LAB, rate=5.0), slos=SLOS, spread=SPREAD, source="x", backend="serial")
    for k in ("slo", "preemption"):
        assert t[k]["at_calibrated_speed"] == "fails"
        assert t[k]["probability"] > 0.5 and (t[k]["cliff_speed_factor"] < 1 or t[k]["bound"])


def test_capacity_states_the_tipping_probability_at_its_answer(tmp_path):
    r = run_cli("capacity", "--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512",
                "--prompt", "uniform:10:1600", "--output", "uniform:10:1600", "--replicas", "2", "--arrival", "poisson:3",
                "--duration", "300", "--slo-ttft-ms", "1500", "--speed-spread", "0.05", "--backend", "serial",
                "--no-progress")
    assert r.code == 0, r.err
    assert "engine speed spread" in r.out and "of engine speeds (run-to-run spread 5 %, --speed-spread)" in r.out
    r = run_cli("capacity", "--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512",
                "--prompt", "uniform:10:1600", "--output", "uniform:10:1600", "--arrival", "poisson:1.5",
                "--duration", "300", "--slo-ttft-ms", "1500", "--speed-spread", "0.05", "--backend", "serial",
                "--no-progress", "--json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    t = d["tipping"]
    assert t["spread"] == pytest.approx(0.05) and set(t) >= {"slo", "preemption", "simulations"}
    # the answer meets the SLOs and x1.1 the rate does not: a slower engine tips it with a real chance
    assert t["slo"]["at_calibrated_speed"] == "holds" and t["slo"]["cliff_speed_factor"] < 1.25
    assert t["slo"]["probability"] > 0.01


def test_capacity_against_a_server_refuses_a_speed_spread():
    r = run_cli("capacity", "--url", "http://127.0.0.1:9", "--slo-ttft-ms", "500", "--rate", "1",
                "--speed-spread", "0.05")
    assert r.code == 2
    assert "speed_spread" in r.err.replace("-", "_") and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", ["0", "1.5", "x"])
def test_a_bad_speed_spread_is_one_line(bad):
    r = run_cli("capacity", "--scenario", "chat", "--speed-spread", bad)
    assert r.code == 2 and "--speed-spread" in r.err and "Traceback" not in r.err
