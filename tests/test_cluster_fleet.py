"""A fleet of replicas behind routers, checked against queueing theory (Erlang C, M/M/1)."""

import numpy as np
import pytest
from _cli import run_cli

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
    # the share that waits, against Erlang C at the arrival rate this stream realized (2.007 req/s:
    # P_wait 0.4479; at the nominal 2 req/s, 4/9): the runs share one arrival stream
    a = q["arrival_s"][q["arrival_s"] > 200]
    lam = (len(a) - 1) / (a.max() - a.min())
    pw = batch_means_ci((wait > 1e-12).astype(float))
    assert pw.contains(mmc(lam=lam, mu=1.0, c=3).P_wait), (pw, lam)
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
def test_the_command_line_fleet_meets_its_queueing_model(router, theory_w):
    """issue's command: one request at a time, exponential steps, 3 replicas, Poisson 2 req/s."""
    import json

    code, out, err = run_cli("simulate", "--max-num-seqs", "1", "--prompt", "fixed:1", "--output", "fixed:1",
                             "--step-time", "exp:1", "--arrival", "poisson:2", "--num-requests", "60000", "--replicas",
                             "3", "--router", router, "--seed", "3", "--json", "--no-progress")
    assert code == 0, err
    d = json.loads(out)
    lo, hi = d["mean_e2el_ms_ci"]
    assert lo <= theory_w * 1e3 <= hi, (lo, hi)
    assert d["theory"]["per_replica"] == "lam / 3 replicas" and d["theory"]["rho"] == pytest.approx(2 / 3)
    if router == "central":
        assert d["theory"]["mg1"]["model"].startswith("M/M/3") and d["theory"]["mg1"]["mean_e2el_ms"] == pytest.approx(
            1444.44, abs=0.01)


def test_the_command_line_refuses_what_a_fleet_does_not_model_yet():

    ran = run_cli("simulate", "--capacity-tokens", "1000", "--step-time", "0.01", "--prompt", "fixed:1", "--output",
                  "fixed:1", "--arrival", "poisson:1", "--duration", "5", "--replicas", "2", "--early-stop", "--no-progress")
    code = ran.code
    err = ran.err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--replicas" in err[0] and "--early-stop" in err[0], err


def _records(res):
    r = res.requests
    out = []
    for i in range(len(r["request_id"])):
        f = r["finish_s"][i]
        ft = r["first_token_s"][i]
        out.append((str(r["class"][i]), int(r["request_id"][i]), int(r["attempt"][i]), str(r["status"][i]),
                    round(float(r["arrival_s"][i]), 6), None if np.isnan(f) else round(float(f), 6),
                    None if np.isnan(ft) else round(float(ft), 6), int(r["preemptions"][i])))
    return sorted(out, key=str)


@pytest.mark.parametrize("seed", range(40))
def test_a_fleet_of_one_is_the_replica(seed):
    """The randomized equivalence scenarios (client timeouts, retries, admission limits, noisy and
    drifting steps, horizons) through a fleet of one replica give the single replica's records; the
    combination a fleet does not model yet is refused in one line."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_engine_equivalence import _scenario

    from llmqueue.engine import simulate
    from llmqueue.errors import InputError

    cfg, step, reqs, opts = _scenario(seed)
    if opts.retry is not None and (cfg.max_waiting or cfg.class_max_waiting):
        with pytest.raises(InputError, match="max_waiting: a fleet cannot combine"):
            simulate_fleet(cfg, step, reqs, replicas=1, options=opts)
        return
    fleet = simulate_fleet(cfg, step, reqs, replicas=1, options=opts)
    assert _records(fleet) == _records(simulate(cfg, step, reqs, options=opts))


def test_each_replica_of_a_random_fleet_serves_its_share_as_one_replica():
    """Three replicas behind a random router with client timeouts: each replica's records are those
    of a single replica simulated on the requests routed to it (constant steps: no noise streams)."""
    from llmqueue.engine import simulate
    from llmqueue.engine.options import SimOptions
    from llmqueue.workload.generate import RequestArrays

    cfg = EngineConfig.from_capacity(6000, max_num_batched_tokens=256, max_num_seqs=8)
    reqs = Workload("poisson:40", prompt="uniform:10:400", output="uniform:5:120").generate(seed=3, n=3000)
    opts = SimOptions(seed=3, timeout_s={"default": 4.0}, ttft_timeout_s={"default": 2.0}, horizon_s=60.0)
    fleet = simulate_fleet(cfg, 0.02, reqs, replicas=3, options=opts)
    r = fleet.requests
    assert (r["status"] == "timeout").sum() > 10 and set(np.unique(r["replica"])) == {0, 1, 2}
    cols = reqs.to_columns()
    for i in range(3):
        mine = set(r["request_id"][r["replica"] == i].tolist())
        keep = np.isin(np.asarray(cols["request_id"]), list(mine))
        sub = RequestArrays(**{("class_name" if k == "class" else k): np.asarray(v)[keep] for k, v in cols.items()})
        one = simulate(cfg, 0.02, sub, options=opts)
        assert _records(one) == [x for x in _records(fleet) if x[1] in mine]


def test_what_a_fleet_does_not_model_is_refused():
    from llmqueue.engine.options import SimOptions
    from llmqueue.errors import InputError

    cfg = EngineConfig.from_capacity(6000, max_num_batched_tokens=256, max_num_seqs=8)
    reqs = Workload("poisson:9", prompt="fixed:10", output="fixed:5").generate(seed=3, n=50)
    with pytest.raises(InputError, match="router: the central gateway"):
        simulate_fleet(cfg, 0.02, reqs, replicas=2, router="central", options=SimOptions(timeout_s={"default": 1.0}))


def test_a_scenario_with_replicas_runs_the_whole_fleet():
    from llmqueue.simulate import run_simulation, spec_from_scenario
    from llmqueue.scenario import load_scenario

    spec = spec_from_scenario(load_scenario("rag"), duration_s=300)
    assert spec.replicas == 4 and not any("replica 0 of" in n for n in spec.notes)
    out = run_simulation(spec)
    rep = out.records["replica"]
    assert set(np.unique(rep)) == {0, 1, 2, 3}
    after_warmup = int((np.asarray(spec.requests.arrival_s) >= spec.warmup_s).sum())
    assert out.summary["arrivals"] == after_warmup  # the whole stream, not one replica's share


@pytest.mark.parametrize("factor, stable", [(0.8, True), (1.1, False)])
def test_kv_provisioning_rule_on_a_fleet_of_eight_under_jsq(factor, stable):
    """Nie et al.'s rule for a fleet: N replicas, each of KV capacity mu = 3.263 req/s (their 1:1
    setting), behind JSQ: stable at an offered 0.8 N mu, unstable at 1.1 N mu (N = 8)."""
    mu, n = 3.263, 8
    d = run_cli("simulate", "--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512",
                "--prompt-len", "uniform:10:1600", "--output-len", "uniform:10:1600", "--rate", str(factor * n * mu),
                "--duration", "1800", "--replicas", str(n), "--router", "least-outstanding", "--seed", "1",
                "--json").json()
    assert d["theory"]["rho"] == pytest.approx(factor, rel=0.01)  # per replica: lam / N against mu
    assert d["stable"] is stable, d["verdict"]
    if stable:
        assert d["request_throughput"] == pytest.approx(d["arrival_rate"], rel=0.03)
    else:
        assert d["verdict"].startswith("unstable: queue grows") and d["request_throughput"] < n * mu
