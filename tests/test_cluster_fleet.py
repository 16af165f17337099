"""A fleet of replicas behind routers, checked against queueing theory (Erlang C, M/M/1)."""

import numpy as np
import pytest

from llmqueue.cluster import ROUTERS, simulate_fleet
from llmqueue.engine import EngineConfig, simulate
from llmqueue.errors import InputError
from llmqueue.metrics.ci import batch_means_ci
from llmqueue.theory.classic import mm1, mmc
from llmqueue.workload import Workload

# one request at a time, one exponential step per request (prompt 1, output 1): each replica is
# an exponential server of rate mu = 1; Poisson arrivals at lam = 2 to c = 3 replicas
N = 120_000


@pytest.fixture(scope="module")
def mm3_runs():
    reqs = Workload("poisson:2", prompt="fixed:1", output="fixed:1").generate(seed=11, n=N)
    cfg = EngineConfig.from_capacity(1 << 30, max_num_seqs=1)
    out = {}
    for name in ("central", "least-outstanding", "power-of-two", "random"):
        r = simulate_fleet(cfg, "exp:1", reqs, replicas=3, router=name, seed=5)
        q = r.requests
        keep = q["arrival_s"] > 200  # past the start-up
        out[name] = (q["finish_s"][keep] - q["arrival_s"][keep], q["first_scheduled_s"][keep] - q["arrival_s"][keep], q)
    return out


def test_central_queue_is_erlang_c(mm3_runs):
    th = mmc(lam=2.0, mu=1.0, c=3)
    assert th.W == pytest.approx(1.4444, abs=1e-3) and th.P_wait == pytest.approx(4 / 9)
    e2el, wait, q = mm3_runs["central"]
    ci = batch_means_ci(e2el)
    assert ci.contains(th.W), (ci, th.W)
    pw = batch_means_ci((wait > 1e-12).astype(float))
    assert pw.contains(4 / 9), pw
    assert set(np.unique(q["replica"])) == {0, 1, 2} and (q["status"] == "ok").all()
    # a request waits at the gateway, not at a replica: dispatched when its service starts
    np.testing.assert_allclose(q["dispatched_s"], q["first_scheduled_s"])


def test_random_routing_is_three_independent_mm1_queues(mm3_runs):
    e2el, _, q = mm3_runs["random"]
    ci = batch_means_ci(e2el)
    assert ci.contains(mm1(lam=2 / 3, mu=1.0).W), ci  # W = 3 s
    shares = np.bincount(q["replica"]) / len(q["replica"])
    np.testing.assert_allclose(shares, 1 / 3, atol=0.01)


def test_mean_response_orders_central_jsq_power_of_two_random(mm3_runs):
    w = {k: v[0].mean() for k, v in mm3_runs.items()}
    assert w["central"] < w["least-outstanding"] < w["power-of-two"] < w["random"], w


def test_one_replica_fleet_equals_the_replica():
    reqs = Workload("poisson:30", prompt="uniform:1:300", output="uniform:1:100").generate(seed=2, n=400)
    cfg = EngineConfig.from_capacity(2000, block_size=4, max_num_batched_tokens=128, max_num_seqs=16)
    one = simulate(cfg, "linear:c0=0.005:decode=3e-4", reqs).requests
    for name in sorted(set(ROUTERS) - {"central"}):
        fleet = simulate_fleet(cfg, "linear:c0=0.005:decode=3e-4", reqs, replicas=1, router=name).requests
        for c in ("request_id", "status", "output_tokens", "preemptions"):
            assert (fleet[c] == one[c]).all(), (name, c)
        np.testing.assert_allclose(fleet["finish_s"], one["finish_s"], rtol=1e-9)


def test_bad_fleet_input_is_one_line():
    cfg = EngineConfig.from_capacity(1000)
    reqs = Workload("poisson:1", prompt="fixed:1", output="fixed:1").generate(seed=1, n=3)
    with pytest.raises(InputError, match="router"):
        simulate_fleet(cfg, 0.1, reqs, replicas=2, router="nearest")
    with pytest.raises(InputError, match="replicas"):
        simulate_fleet(cfg, 0.1, reqs, replicas=0)


@pytest.mark.parametrize("router,theory_w", [("central", 1.4444), ("random", 3.0)])
def test_the_command_line_fleet_meets_its_queueing_model(capsys, router, theory_w):
    """issue's command: one request at a time, exponential steps, 3 replicas, Poisson 2 req/s."""
    import json

    from llmqueue.cli.main import main

    code = main(["simulate", "--max-num-seqs", "1", "--prompt", "fixed:1", "--output", "fixed:1", "--step-time",
                 "exp:1", "--arrival", "poisson:2", "--num-requests", "60000", "--replicas", "3", "--router", router,
                 "--seed", "3", "--json", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    lo, hi = d["mean_e2el_ms_ci"]
    assert lo <= theory_w * 1e3 <= hi, (lo, hi)
    assert d["theory"]["per_replica"] == "lam / 3 replicas" and d["theory"]["rho"] == pytest.approx(2 / 3)
    if router == "central":
        assert d["theory"]["mg1"]["model"].startswith("M/M/3") and d["theory"]["mg1"]["mean_e2el_ms"] == pytest.approx(
            1444.44, abs=0.01)


def test_the_command_line_refuses_what_a_fleet_does_not_model_yet(capsys):
    from llmqueue.cli.main import main

    code = main(["simulate", "--capacity-tokens", "1000", "--step-time", "0.01", "--prompt", "fixed:1", "--output",
                 "fixed:1", "--arrival", "poisson:1", "--duration", "5", "--replicas", "2", "--early-stop", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--replicas" in err[0] and "--early-stop" in err[0], err
