"""Random client patience (llmqueue.workload.patience) in the simulator, checked against Erlang A
(M/M/c+M, llmqueue.theory.abandonment): abandonment probability and mean wait within the
simulation's 95 % confidence intervals in three settings (issue 39 item 4)."""

import json

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.options import SimOptions
from llmqueue.metrics.ci import batch_means_ci
from llmqueue.theory.abandonment import erlang_a
from llmqueue.workload import Workload
from llmqueue.workload.patience import Patience

DELTA = 0.002   # the constant step: one token a step, so a request of K tokens is served in K delta


def _erlang_a_run(lam, c, mean_service, mean_patience, *, n=60_000, seed=3):
    """One replica as c exponential servers: max_num_seqs = c, ample KV, a constant step and
    geometric outputs (service K delta, nearly exponential with mean ``mean_service``); prompts of
    one token; every client's patience exponential with mean ``mean_patience``."""
    reqs = Workload(f"poisson:{lam}", prompt="fixed:1",
                    output=f"geometric:mean={mean_service / DELTA:g}").generate(seed=seed, n=n)
    cfg = EngineConfig.from_capacity(1 << 30, max_num_seqs=c)
    opts = SimOptions(seed=seed, sample_dt=0.0,
                      patience={"default": Patience.parse(f"exp:{mean_patience}").bind(seed)})
    q = simulate(cfg, f"{DELTA}", reqs, options=opts).requests
    keep = np.asarray(q["arrival_s"]) > 200.0   # past the empty start
    st = np.asarray(q["status"])[keep]
    arr = np.asarray(q["arrival_s"])[keep]
    left = st == "cancelled"
    wait = np.where(left, np.asarray(q["finish_s"])[keep], np.asarray(q["first_scheduled_s"])[keep]) - arr
    return st, left, wait


@pytest.mark.parametrize("lam,c,patience", [(10, 10, 1.0), (12, 10, 2.0), (4, 3, 0.5)])
def test_abandonment_and_wait_match_erlang_a(lam, c, patience):
    """rho 1.0, 1.2 (overloaded, stable only through abandonment) and 1.33 with impatient
    clients: the simulated share that abandoned and the mean wait (until service or
    abandonment) within their 95 % batch-means intervals of the closed forms."""
    st, left, wait = _erlang_a_run(lam, c, 1.0, patience)
    th = erlang_a(lam=lam, mu=1.0, c=c, theta=1.0 / patience)
    assert set(st) <= {"ok", "cancelled"}
    ab = batch_means_ci(left.astype(float))
    wq = batch_means_ci(wait)
    assert ab.contains(th.P_abandon), (ab, th.P_abandon)
    assert wq.contains(th.Wq), (wq, th.Wq)
    assert 0.05 < th.P_abandon < 0.5   # a setting where abandonment matters


def test_each_request_draws_its_own_patience_the_same_on_every_run():
    law = Patience.parse("exp:30")
    a = [law.draw(7, i) for i in range(20_000)]
    assert a == [law.draw(7, i) for i in range(20_000)]              # a pure function of (seed, id)
    assert a != [law.draw(8, i) for i in range(20_000)]
    assert np.mean(a) == pytest.approx(30, rel=0.03) and np.std(a) == pytest.approx(30, rel=0.05)
    u = Patience.parse("uniform:2:4")
    assert all(2 <= u.draw(1, i) <= 4 for i in range(100)) and Patience.parse(5).spec == "fixed:5"


SCENARIO = """
workload:
  arrival: poisson:14
  prompt: fixed:1
  output: geometric:mean=500
  client: {patience: "exp:1"}
deployment: {step_time: 0.002, capacity_tokens: 100000000, max_num_seqs: 10}
run: {duration_s: 600, seed: 1, warmup_s: 60}
"""


def test_a_scenario_with_patience_abandons_and_says_so(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(SCENARIO)
    r = run_cli("simulate", "--scenario", str(f), "--json", "--no-progress")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    th = erlang_a(lam=14, mu=1.0, c=10, theta=1.0)
    # the window's arrivals that failed (every one cancelled by its patience) against Erlang A
    # (one path of 600 s: a loose bar; the tests above hold the CIs)
    share = d["failed"] / d["arrivals"]
    assert share == pytest.approx(th.P_abandon, abs=0.03), (share, th.P_abandon)
    assert set(d["reject_reasons"]) == {"patience"} and "cancelled" in d["verdict"]
    # the theory block reads the same queue as Erlang A: 10 slots, each at mu_seqs / 10
    ab = d["theory"]["abandonment"]
    assert ab["c"] == 10 and ab["P_abandon"] == pytest.approx(share, abs=0.03) and "stable with abandonment" in ab["verdict"]
    # without patience the same load (rho 1.4) is unstable
    f.write_text(SCENARIO.replace('  client: {patience: "exp:1"}\n', ""))
    r = run_cli("simulate", "--scenario", str(f), "--json", "--no-progress")
    assert r.code == 0, r.err
    assert not json.loads(r.out)["stable"]


@pytest.mark.parametrize("bad", ["exp", "exp:-1", "gauss:3", "uniform:4:2", "exp:x"])
def test_a_bad_patience_is_one_line(tmp_path, bad):
    f = tmp_path / "s.yaml"
    f.write_text(SCENARIO.replace('"exp:1"', f'"{bad}"'))
    r = run_cli("simulate", "--scenario", str(f), "--no-progress")
    assert r.code == 2 and "patience" in r.err and "Traceback" not in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1


def test_geometric_lengths_are_memoryless_token_counts():
    """geometric:mean=M: P(K = k) = (1 - q)^(k-1) q, q = 1/M: mean M, squared CV 1 - q; draws
    whose mean and memorylessness (P(K > a + b | K > a) = P(K > b)) hold."""
    from llmqueue.workload.parse import parse_length

    g = parse_length("geometric:mean=200", "output")
    assert g.mean() == pytest.approx(200, rel=1e-9) and g.scv() == pytest.approx(1 - 1 / 200, rel=1e-9)
    k = g.sample(np.random.default_rng(0), 400_000)
    assert k.min() >= 1 and k.mean() == pytest.approx(200, rel=0.01)
    assert np.mean(k[k > 300] > 400) == pytest.approx(np.mean(k > 100), abs=0.01)
    capped = parse_length("geometric:mean=200:max=100", "output")
    assert capped.support() == (1, 100) and capped.spec == "geometric:mean=200:max=100"
    assert parse_length("geometric:mean=1", "output").support() == (1, 1)
