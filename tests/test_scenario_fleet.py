"""Fleets in scenario files: deployment.pools (inheriting the top-level engine knobs), lanes, P/D,
gateway, autoscalers, faults; the FleetSpec a scenario builds; --set; one-line errors at the
full field path through the CLI."""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml
from _cli import run_cli

from llmqueue.errors import InputError
from llmqueue.scenario import load_scenario, validate_scenario

BASE = {
    "workload": {"arrival": "poisson:5", "classes": [
        {"name": "chat", "share": 0.8, "prompt": "uniform:10:1600", "output": "uniform:10:600"},
        {"name": "batch", "share": 0.2, "prompt": "fixed:3000", "output": "fixed:500", "priority": 1}]},
    "deployment": {
        "model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 8192, "max_num_seqs": 128,
        "pools": [{"name": "chat", "replicas": 3, "max_num_seqs": 64, "router": "power-of-two"},
                  {"name": "batch", "replicas": 2, "model": "llama-3.1-70b", "tensor_parallel_size": 4,
                   "max_num_batched_tokens": 16384, "cost_per_replica_hour": 9.5, "quality": 1.2}],
        "lanes": [{"name": "fast", "pool": "chat", "classes": ["chat"], "prompt_max": 4096},
                  {"pool": "batch"}],
        "gateway": {"rate_limits": {"batch": {"rate": 2, "burst": 10}, "*": {"rate": 50}},
                    "max_queue_depth": 16, "shed": [{"min_priority": 1, "queue_age_s": 5}],
                    "fallbacks": [{"pool": "chat", "to": "batch", "queue_age_s": 2}]},
        "autoscalers": [{"pool": "chat", "provisioning_delay_s": 120, "min_replicas": 2, "max_replicas": 6}],
        "faults": [{"pool": "batch", "replica": 1, "at_s": 30, "repair_s": 60}],
    },
    "run": {"duration_s": 60},
}

PD = {
    "workload": {"arrival": "poisson:5", "prompt": "fixed:1000", "output": "fixed:100"},
    "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 8192,
                   "pools": [{"name": "P", "role": "prefill", "replicas": 2},
                             {"name": "D", "role": "decode", "replicas": 4, "max_num_seqs": 512}],
                   "disaggregation": {"prefill": "P", "decode": "D", "kv_link_gbps": 100}},
    "run": {"duration_s": 60},
}


def _with(base, mutate):
    d = copy.deepcopy(base)
    mutate(d)
    return d


def _error(data) -> str:
    with pytest.raises(InputError) as e:
        validate_scenario(data)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# -- the schema ---------------------------------------------------------------------------------

def test_pools_inherit_the_top_level_knobs():
    from llmqueue.hardware import get_gpu, kv_bytes_per_token, kv_capacity

    sc = validate_scenario(BASE)
    f = sc.fleet
    chat, batch = f.pools
    assert (chat.name, chat.replicas, chat.router, chat.role, chat.model) == (
        "chat", 3, "power-of-two", "mixed", "llama-3.1-8b")
    assert chat.config.max_num_seqs == 64 and chat.config.max_num_batched_tokens == 8192  # own, top level's
    assert batch.config.max_num_seqs == 128 and batch.config.max_num_batched_tokens == 16384  # top level's, own
    assert chat.config.max_model_len == batch.config.max_model_len == 8192
    M70 = kv_capacity("llama-3.1-70b", "h100-sxm", tensor_parallel_size=4).M
    assert batch.config.capacity_tokens == M70 - M70 % 16 and batch.model == "llama-3.1-70b"
    assert "llama-3.1-70b" in batch.step_time.spec and "tp=4" in batch.step_time.spec
    # the pool's engine is the one the single path builds from the same deployment
    cfg, st = sc.engine(sc.deployment.pool_deployments[0])
    assert cfg == chat.config and st.spec == chat.step_time.spec
    assert chat.config.class_priority == sc.mix.priorities
    assert chat.kv_bytes_per_token == kv_bytes_per_token("llama-3.1-8b") and batch.kv_bytes_per_token > 0
    assert chat.cost_per_replica_hour == get_gpu("h100-sxm").price_per_hour and batch.cost_per_replica_hour == 9.5
    assert batch.quality == 1.2 and chat.quality == 1.0


def test_lanes_gateway_autoscalers_faults():
    f = validate_scenario(BASE).fleet
    assert [(ln.name, ln.pool, ln.classes, ln.prompt_max) for ln in f.lanes] == [
        ("fast", "chat", ("chat",), 4096), ("batch", "batch", (), None)]
    assert f.lane_of("chat", 100) == ("fast", "chat") and f.lane_of("chat", 5000) == ("batch", "batch")
    g = f.gateway
    assert g.rate_limits["batch"].rate == 2 and g.rate_limits["batch"].burst == 10 and g.rate_limits["*"].burst == 1
    assert g.max_queue_depth == 16 and g.shed[0].min_priority == 1 and g.fallbacks[0].to == "batch"
    a = f.autoscalers[0]
    assert (a.pool, a.metric, a.provisioning_delay_s, a.min_replicas, a.max_replicas, a.interval_s) == (
        "chat", "waiting", 120, 2, 6, 15)
    assert (f.faults[0].pool, f.faults[0].replica, f.faults[0].repair_s, f.faults[0].inflight) == ("batch", 1, 60, "retry")
    never = validate_scenario(_with(BASE, lambda d: d["deployment"]["faults"][0].pop("repair_s")))
    assert never.fleet.faults[0].repair_s == math.inf


def test_pd_fleet():
    sc = validate_scenario(PD)
    f = sc.fleet
    assert [(p.name, p.role, p.replicas) for p in f.pools] == [("P", "prefill", 2), ("D", "decode", 4)]
    assert f.pools[1].config.max_num_seqs == 512
    assert (f.disaggregation.prefill, f.disaggregation.decode, f.disaggregation.kv_link_gbps,
            f.disaggregation.kv_link_latency_ms) == ("P", "D", 100, 0)
    free = validate_scenario(_with(PD, lambda d: d["deployment"]["disaggregation"].pop("kv_link_gbps")))
    assert free.fleet.disaggregation.kv_link_gbps == math.inf
    assert f.lane_of("default", 10) == ("", "P")


def test_no_pools_is_the_single_path():
    d = _with(PD, lambda d: [d["deployment"].pop(k) for k in ("pools", "disaggregation")])
    d["deployment"]["replicas"] = 3
    sc = validate_scenario(d)
    assert sc.fleet is None and sc.deployment.pool_deployments == []
    from llmqueue.simulate import spec_from_scenario

    spec = spec_from_scenario(sc)
    assert spec.fleet is None and spec.replicas == 3
    assert spec_from_scenario(validate_scenario(PD)).fleet is not None


def test_summary_describes_the_fleet():
    s = validate_scenario(BASE).summary()
    json.dumps(s, allow_nan=False)
    fl = s["deployment"]["fleet"]
    assert [(p["name"], p["role"], p["replicas"], p["model"], p["gpu"]) for p in fl["pools"]] == [
        ("chat", "mixed", 3, "llama-3.1-8b", "h100-sxm"), ("batch", "mixed", 2, "llama-3.1-70b", "h100-sxm")]
    assert all(p["M"] > 0 for p in fl["pools"]) and fl["lanes"][0]["classes"] == ["chat"]
    assert s["deployment"]["total_gpus"] == 3 * 1 + 2 * 4
    assert "pools" not in s["deployment"]


# -- errors at the full path --------------------------------------------------------------------

ERRORS = [
    ("lane-pool", lambda d: d["deployment"]["lanes"][0].update(pool="gpu-big"),
     "deployment.lanes[0].pool: no pool named 'gpu-big'; name one of: batch, chat"),
    ("lane-class", lambda d: d["deployment"]["lanes"][0].update(classes=["chta"]),
     "deployment.lanes[0].classes[0]: no class named 'chta' in workload.classes; did you mean 'chat'?"),
    ("lane-prompt-max", lambda d: d["deployment"]["lanes"][0].update(prompt_min=5000),
     "deployment.lanes[0].prompt_max: must be above prompt_min"),
    ("pool-knob", lambda d: d["deployment"]["pools"][0].update(max_num_seqs=0),
     "deployment.pools[0].max_num_seqs: must be >= 1 (got 0)"),
    ("pool-knob-pair", lambda d: d["deployment"]["pools"][0].update(max_num_seqs=10000),
     "deployment.pools[0].max_num_batched_tokens: 8192 is below max_num_seqs 10000"),
    ("pool-unknown-key", lambda d: d["deployment"]["pools"][0].update(max_num_seq=8),
     "deployment.pools[0].max_num_seq: unknown key; did you mean 'max_num_seqs'?"),
    ("pool-model", lambda d: d["deployment"]["pools"][1].update(model="nosuch"),
     "deployment.pools[1].model: unknown model 'nosuch'"),
    ("pool-router", lambda d: d["deployment"]["pools"][0].update(router="fastest"),
     "deployment.pools[0].router: unknown router 'fastest'"),
    ("pool-role", lambda d: d["deployment"]["pools"][0].update(role="both"), "deployment.pools[0].role: unknown role"),
    ("pool-twice", lambda d: d["deployment"]["pools"][1].update(name="chat"),
     "deployment.pools[1].name: pool 'chat' is named twice"),
    ("pool-replicas", lambda d: d["deployment"]["pools"][0].update(replicas=-1), "deployment.pools[0].replicas"),
    ("pools-empty", lambda d: d["deployment"].update(pools=[]), "deployment.pools: is empty"),
    ("replicas-with-pools", lambda d: d["deployment"].update(replicas=4), "deployment.replicas: is 4"),
    ("autoscaler-delay", lambda d: d["deployment"]["autoscalers"][0].update(provisioning_delay_s=-1),
     "deployment.autoscalers[0].provisioning_delay_s: must be >= 0"),
    ("autoscaler-metric", lambda d: d["deployment"]["autoscalers"][0].update(metric="cpu"),
     "deployment.autoscalers[0].metric: unknown metric 'cpu'"),
    ("autoscaler-p99-target", lambda d: d["deployment"]["autoscalers"][0].update(metric="p99_ttft", target=-2),
     "deployment.autoscalers[0].target: must be > 0 (got -2.0)"),
    ("autoscaler-also-metric", lambda d: d["deployment"]["autoscalers"][0].update(also={"p99": 2.0}),
     "deployment.autoscalers[0].also.p99: unknown metric 'p99'; choose from: waiting, kv, utilization, queue_age, "
     "p99_ttft"),
    ("autoscaler-range", lambda d: d["deployment"]["autoscalers"][0].update(max_replicas=1),
     "deployment.autoscalers[0].max_replicas"),
    ("autoscaler-twice", lambda d: d["deployment"]["autoscalers"].append({"pool": "chat"}),
     "deployment.autoscalers[1].pool: pool 'chat' already has an autoscaler"),
    ("fault-replica", lambda d: d["deployment"]["faults"][0].update(replica=2),
     "deployment.faults[0].replica: pool 'batch' has replicas 0..1 (got 2)"),
    ("fault-inflight", lambda d: d["deployment"]["faults"][0].update(inflight="drop"),
     "deployment.faults[0].inflight"),
    ("rate-limit-class", lambda d: d["deployment"]["gateway"]["rate_limits"].update(bulk={"rate": 1}),
     "deployment.gateway.rate_limits.bulk: no class named 'bulk'"),
    ("rate-limit-rate", lambda d: d["deployment"]["gateway"]["rate_limits"]["batch"].update(rate=0),
     "deployment.gateway.rate_limits.batch.rate: must be > 0"),
    ("fallback-pool", lambda d: d["deployment"]["gateway"]["fallbacks"][0].update(to="small"),
     "deployment.gateway.fallbacks[0].to: no pool named 'small'"),
    ("fallback-self", lambda d: d["deployment"]["gateway"]["fallbacks"][0].update(to="chat"),
     "deployment.gateway.fallbacks[0].to: falls back to its own pool"),
    ("lanes-without-pools", lambda d: d["deployment"].pop("pools"), "deployment.lanes: needs deployment.pools"),
    ("gateway-key", lambda d: d["deployment"]["gateway"].update(max_queue=3),
     "deployment.gateway.max_queue: unknown key; did you mean 'max_queue_depth'?"),
]


@pytest.mark.parametrize("mutate, expected", [pytest.param(m, e, id=i) for i, m, e in ERRORS])
def test_bad_fleet_is_one_line_at_its_path(mutate, expected):
    assert expected in _error(_with(BASE, mutate))


PD_ERRORS = [
    ("no-decode", lambda d: (d["deployment"].pop("disaggregation"), d["deployment"]["pools"].pop(1)),
     "deployment.pools: a P/D fleet without a decode pool"),
    ("no-section", lambda d: d["deployment"].pop("disaggregation"),
     "deployment.disaggregation: is missing: the fleet has prefill and decode pools"),
    ("decode-role", lambda d: d["deployment"]["pools"][1].update(role="mixed"),
     "deployment.disaggregation.decode: pool 'D' has role mixed; give pool 'D' role: decode"),
    ("decode-pool", lambda d: d["deployment"]["disaggregation"].update(decode="X"),
     "deployment.disaggregation.decode: no pool named 'X'"),
    ("same-pool", lambda d: d["deployment"]["disaggregation"].update(decode="P"),
     "deployment.disaggregation.decode: the decode pool must differ"),
    ("link-zero", lambda d: d["deployment"]["disaggregation"].update(kv_link_gbps=0),
     "deployment.disaggregation.kv_link_gbps: must be > 0"),
    ("link-latency", lambda d: d["deployment"]["disaggregation"].update(kv_link_latency_ms=-1),
     "deployment.disaggregation.kv_link_latency_ms: must be >= 0"),
    ("lane-to-decode", lambda d: d["deployment"].update(lanes=[{"pool": "D"}]),
     "deployment.lanes[0].pool: 'D' is the decode pool"),
    ("disaggregation-without-pools", lambda d: d["deployment"].pop("pools"),
     "deployment.disaggregation: needs deployment.pools"),
]


@pytest.mark.parametrize("mutate, expected", [pytest.param(m, e, id=i) for i, m, e in PD_ERRORS])
def test_bad_pd_is_one_line_at_its_path(mutate, expected):
    assert expected in _error(_with(PD, mutate))


# -- the shipped fleet examples ------------------------------------------------------------------

def test_example_pd():
    f = load_scenario("pd").fleet
    assert [(p.name, p.role, p.replicas, p.model) for p in f.pools] == [
        ("prefill", "prefill", 3, "llama-3.1-8b"), ("decode", "decode", 3, "llama-3.1-8b")]
    assert f.disaggregation.kv_link_gbps == 100 and f.pools[0].kv_bytes_per_token == 131072


def test_example_lanes():
    sc = load_scenario("lanes")
    f = sc.fleet
    pools = {p.name: p for p in f.pools}
    assert pools["latency"].model == "llama-3.1-70b" and pools["small"].model == "llama-3.1-8b"
    assert f.lane_of("interactive", 100)[1] == "latency" and f.lane_of("batch", 3000)[1] == "throughput"
    assert set(f.gateway.rate_limits) == {"batch"}
    fb = f.gateway.fallbacks[0]
    assert (fb.pool, fb.to, fb.queue_age_s) == ("latency", "small", 2)


def test_example_noon_spike_is_sized_for_the_base_load():
    from llmqueue.simulate import run_simulation
    from llmqueue.spec import scenario_spec

    sc = load_scenario("noon-spike")
    f = sc.fleet
    (pool,) = f.pools
    a = f.autoscalers[0]
    assert (a.pool, a.metric, a.provisioning_delay_s, a.min_replicas) == ("chat", "waiting", 120, pool.replicas)
    arr = sc.mix.arrival
    assert type(arr).__name__ == "Spike" and arr.k == 2 and arr.at == 900 and arr.duration == 900
    # the fleet carries the base load at utilization ~0.7 by the theory's per-replica capacity
    one = scenario_spec(scenario="noon-spike", sets=["deployment.pools=null", "deployment.autoscalers=null"],
                        arrival="poisson:10", duration=120)
    assert one.fleet is None
    mu = run_simulation(one).theory["mu"]  # one replica's capacity at the scenario's lengths and engine
    assert 0.65 < arr.base / (pool.replicas * mu) < 0.75
    assert 2 * arr.base > pool.replicas * mu  # the spike overloads the base fleet


@pytest.mark.parametrize("sets, check", [
    (["deployment.autoscalers[0].provisioning_delay_s=0"], lambda f: f.autoscalers[0].provisioning_delay_s == 0),
    (["deployment.autoscalers[0].provisioning_delay_s=300"], lambda f: f.autoscalers[0].provisioning_delay_s == 300),
    (["deployment.autoscalers=[]"], lambda f: f.autoscalers == []),
    (["deployment.pools[0].replicas=4", "deployment.autoscalers[0].min_replicas=4"],
     lambda f: f.pools[0].replicas == 4 and f.autoscalers[0].min_replicas == 4),
])
def test_noon_spike_variants_by_set(sets, check):
    from llmqueue.scenario.override import scenario_with

    assert check(scenario_with("noon-spike", sets=sets).scenario.fleet)


# -- the command line ---------------------------------------------------------------------------

def _one_line(code, err, fragment):
    assert code == 2 and "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error: ") and fragment in lines[0], err


@pytest.mark.parametrize("name", ["pd", "lanes", "noon-spike"])
def test_scenario_check_prints_the_pools(name):
    code, out, err = run_cli("scenario", "check", name)
    assert code == 0, err
    assert "pools" in out and "role" in out and "M (tokens)" in out
    sc = load_scenario(name)
    for p in sc.fleet.pools:
        assert p.name in out and p.model in out
    code, out, err = run_cli("scenario", "check", name, "--json")
    assert json.loads(out)["deployment"]["fleet"]["pools"]


def test_scenario_check_set():
    code, out, err = run_cli("scenario", "check", "noon-spike", "--set",
                         "deployment.autoscalers[0].provisioning_delay_s=300")
    assert code == 0, err
    assert "provisioning 300 s" in out
    code, out, err = run_cli("scenario", "check", "noon-spike", "--set", "deployment.autoscalers=[]")
    assert code == 0 and "autoscaler chat" not in out


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d["deployment"]["lanes"][0].update(pool="gpu-big"), "deployment.lanes[0].pool"),
    (lambda d: d["deployment"]["autoscalers"][0].update(provisioning_delay_s=-3),
     "deployment.autoscalers[0].provisioning_delay_s"),
    (lambda d: d["deployment"]["pools"][0].update(router="nope"), "deployment.pools[0].router"),
    (lambda d: d["deployment"]["faults"][0].update(replica=7), "deployment.faults[0].replica"),
])
def test_bad_fleet_files_through_the_cli(tmp_path, mutate, fragment):
    p = tmp_path / "f.yaml"
    p.write_text(yaml.safe_dump(_with(BASE, mutate), sort_keys=False))
    for args in (["scenario", "check", str(p)], ["simulate", "--scenario", str(p), "--no-progress"]):
        code, _, err = run_cli(*args)
        _one_line(code, err, fragment)


def test_pd_without_decode_through_the_cli(tmp_path):
    p = tmp_path / "pd.yaml"
    p.write_text(yaml.safe_dump(_with(PD, lambda d: (d["deployment"].pop("disaggregation"),
                                                     d["deployment"]["pools"].pop(1)))))
    code, _, err = run_cli("simulate", "--scenario", str(p), "--no-progress")
    _one_line(code, err, "deployment.pools: a P/D fleet without a decode pool")


@pytest.mark.parametrize("value", ["2", "a:b", "0:1", "1:0", "1:2:3", "", "1.5:2", "1:99999"])
def test_bad_disaggregate_values(value):
    code, _, err = run_cli("simulate", "--capacity-tokens", "131000", "--step-time", "0.03",
                       "--prompt-len", "fixed:10", "--output-len", "fixed:10", "--arrival", "poisson:1",
                       "--duration", "10", "--no-progress", "--disaggregate", value)
    _one_line(code, err, "--disaggregate")


def test_the_command_line_pd_fleet_is_a_jackson_tandem(tmp_path):
    """The issue's check: --disaggregate 1:1, prompt 1, output 2, exponential steps of mean 0.1 s
    in each pool, a free link, Poisson 5 req/s: two M/M/1 queues in series, mean E2EL 0.4 s."""
    import numpy as np

    from llmqueue.metrics.ci import batch_means_ci
    from llmqueue.records import read_records

    code, out, err = run_cli("simulate", "--max-num-seqs", "1", "--prompt-len", "fixed:1", "--output-len",
                         "fixed:2", "--step-time", "exp:0.1", "--arrival", "poisson:5", "--num-requests", "40000",
                         "--disaggregate", "1:1", "--no-progress", "--json", "--out", str(tmp_path))
    assert code == 0, err
    q = read_records(tmp_path / "requests.parquet")
    assert set(q["pool"]) == {"decode"} and (q["status"] == "ok").all()
    keep = q["arrival_s"] > 100
    ci = batch_means_ci(q["finish_s"][keep] - q["arrival_s"][keep])
    assert ci.lo <= 0.4 <= ci.hi, ci
    ci = batch_means_ci(q["first_token_s"][keep] - q["arrival_s"][keep])
    assert ci.lo <= 0.2 <= ci.hi, ci  # the first token leaves the prefill queue
    assert np.isfinite(q["kv_transfer_s"]).all() and (q["kv_transfer_s"] == 0).all()
    # the stages partition each request's time; the Jackson tandem's 0.4 s printed beside the sum
    d = json.loads(out)
    st, tandem = d["fleet"]["stages"], d["theory"]["tandem"]
    assert st["sum_ms"] == pytest.approx(st["mean_e2el_ms"], rel=1e-9)
    assert tandem["mean_e2el_ms"] == pytest.approx(400.0) and ci.lo <= 0.2 <= ci.hi
    for k in ("prefill_wait", "prefill", "decode_wait", "decode"):
        assert st[k]["mean_ms"] > 0
    # each M/M/1 station's sojourn 0.2 s: the prefill's wait + steps, the decode's wait + step
    assert st["prefill_wait"]["mean_ms"] + st["prefill"]["mean_ms"] == pytest.approx(200, rel=0.05)
    assert st["decode_wait"]["mean_ms"] + st["decode"]["mean_ms"] == pytest.approx(200, rel=0.05)
    dec = q["decode_scheduled_s"] - q["first_token_s"] - q["kv_transfer_s"]
    assert (dec >= -1e-9).all()


def test_the_shipped_pd_scenario_meets_its_slos(tmp_path):
    """Sized by its per-stage theory: every stage below rho 1 and the SLOs met (it once ran its
    prefill pool at rho 1.05 and met them for 1.46 % of requests)."""
    code, out, err = run_cli("simulate", "--scenario", "pd", "--no-progress", "--json", "--duration", "240",
                         "--out", str(tmp_path))
    assert code == 0, err
    d = json.loads(out)
    assert d["verdict"] == "stable" and d["good_share"] > 0.95, (d["verdict"], d["good_share"])
    assert all(p["rho"] < 1 for p in d["theory"]["pools"].values())


@pytest.mark.parametrize("name", ["pd", "lanes"])
def test_shipped_fleet_scenarios_run_cli(tmp_path, name):
    code, out, err = run_cli("simulate", "--scenario", name, "--no-progress", "--json", "--duration", "90",
                         "--warmup", "10", "--out", str(tmp_path))
    assert code == 0, err
    import json

    d = json.loads(out)
    s = d.get("summary", d)
    pools = s["fleet"]["pools"]
    assert len(pools) >= 2, pools
    # a P/D request's record is its decode side's; the prefill pool's row counts what it prefilled
    assert all(p["completed"] > 0 for p in pools.values()), pools
    if name == "pd":
        assert pools["prefill"]["completed"] >= pools["decode"]["completed"]
        # each station's own figures (issue 38 item 5): the first token is the prefill pool's,
        # the decode pool's wait is from the KV's arrival to its admission
        assert pools["prefill"]["p50_ttft_ms"] > 0 and pools["decode"]["p50_ttft_ms"] is None
        assert pools["prefill"]["p50_tpot_ms"] is None and pools["decode"]["p50_tpot_ms"] > 0
        assert pools["decode"]["mean_kv_transfer_ms"] > 0 and pools["prefill"]["mean_kv_transfer_ms"] is None
        assert s["fleet"]["stages"]["sum_ms"] == pytest.approx(s["fleet"]["stages"]["mean_e2el_ms"], rel=1e-9)
    assert (tmp_path / "pools.parquet").exists()
