"""P:D splits in the planner's space (:mod:`llmqueue.plan.space`, :mod:`llmqueue.theory.pd`).

The same cheap scenario as ``test_plan_planner`` (Poisson 4 req/s, prompts 50-300, outputs
20-60) on a 60-configuration space that mixes aggregated deployments (1 or 2 replicas) and
P:D splits 1:1, 1:2, 2:1, small enough to simulate exhaustively: the tandem's bounds must never
prune a configuration that meets the SLOs when simulated anyway, every simulated p99 must be at
or above its configuration's single-request bound, and the planner's recommendation must be the
exhaustive search's cheapest configuration meeting the SLOs.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.plan.planner import PRUNED, SIMULATED, plan
from llmqueue.plan.space import Config, configurations, parse_splits

from test_plan_planner import simulate_all, write_tiny

SLOS = {"p99_ttft_ms": 35.0, "p99_tpot_ms": 40.0}
SPACE = dict(gpus=["l4", "a100-40gb", "h100-sxm"], tp=(1, 2), replicas=(1, 2), max_num_seqs=(2, 16),
             max_num_batched_tokens=(512,), routers=("least-outstanding",), pd_splits=((1, 1), (1, 2), (2, 1)),
             models=("llama-3.1-8b",))
RUN = dict(duration=120.0, seed=3)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return write_tiny(tmp_path_factory, "plan_pd")


@pytest.fixture(scope="module")
def planned(scenario):
    return plan(scenario, slos=SLOS, **SPACE, **RUN)


@pytest.fixture(scope="module")
def exhaustive(scenario):
    return simulate_all(scenario, SPACE, SLOS, RUN)[0]


def test_space_and_splits():
    assert parse_splits("pd_splits", "1:1, 1..2:3") == ((1, 1), (1, 3), (2, 3))
    assert parse_splits("pd_splits", "") == ()
    cfgs = configurations(**SPACE)
    assert len(cfgs) == 60
    pd = [c for c in cfgs if c.disaggregated]
    assert len(pd) == 36 and all(c.replicas == c.prefill_replicas + c.decode_replicas for c in pd)
    c = pd[0]
    assert c.split == "1:1" and c.gpus == 2 * c.tensor_parallel_size
    assert c.knobs()["disaggregate"] == "1:1" and c.knobs()["kv_link_gbps"] == 100.0
    p = c.point()
    assert "replicas" not in p and len(p["sets"]) == 2 and "kv_link_gbps: 100.0" in p["sets"][1]
    agg = Config("h100-sxm", 1, 2, 16, 512, "least-outstanding")
    assert agg.point() == {"gpu": "h100-sxm", "tensor_parallel_size": 1, "replicas": 2, "max_num_seqs": 16,
                           "max_num_batched_tokens": 512, "router": "least-outstanding"}
    assert agg.knobs()["disaggregate"] is None


def test_split_simulates_as_the_fleet_layer_builds_it(scenario):
    """The point's ``sets`` make the same P/D fleet as ``simulate --disaggregate``: two pools of the
    engine, the link, every pool behind the router."""
    from llmqueue.spec import scenario_spec

    cfg = Config("a100-40gb", 1, 3, 16, 512, "least-outstanding", 1, 2, 25.0, 0.5)
    spec = scenario_spec(scenario=scenario, **cfg.point())
    f = spec.fleet
    assert [(p.role, p.replicas, p.router, p.config.max_num_seqs) for p in f.pools] == [
        ("prefill", 1, "least-outstanding", 16), ("decode", 2, "least-outstanding", 16)]
    assert (f.disaggregation.kv_link_gbps, f.disaggregation.kv_link_latency_ms) == (25.0, 0.5)
    assert f.pools[0].kv_bytes_per_token > 0


def test_pd_pruning_is_sound(exhaustive):
    """No configuration pruned by theory (aggregated or split) meets the SLOs when simulated."""
    wrong = [(c.config.label(), c.reason) for c, b in exhaustive if c.status == PRUNED and b["meets"]]
    assert not wrong
    pruned_splits = [c for c, _ in exhaustive if c.status == PRUNED and c.config.disaggregated]
    assert {c.reason.split(":")[0] for c in pruned_splits} >= {"rate bound", "latency bound"}


def test_pd_latency_bounds_hold(exhaustive):
    """Every simulated p99 is at or above its configuration's single-request bound (the TPOT bound
    of a split includes its KV transfer), on every configuration of the space."""
    for c, b in exhaustive:
        if b["p99_ttft_ms"] is not None and c.ttft_bound_ms is not None:
            assert b["p99_ttft_ms"] >= c.ttft_bound_ms * (1 - 1e-9), c.config.label()
        if b["p99_tpot_ms"] is not None and c.tpot_bound_ms is not None:
            assert b["p99_tpot_ms"] >= c.tpot_bound_ms * (1 - 1e-9), c.config.label()


def test_pd_rate_bound_is_an_upper_bound(exhaustive):
    """A configuration whose rate bound is below the offered rate does not keep up: the queue
    grows, or the measured throughput stays below the arrivals."""
    for c, b in exhaustive:
        if c.rate_bound is not None and c.rho > 1.0:
            assert not b["meets"] and (b["verdict"] != "stable" or b["request_throughput"] < 4.0), c.config.label()


def test_recommendation_equals_exhaustive_search_with_splits(planned, exhaustive):
    meeting = [c for c, b in exhaustive if b["meets"]]
    assert meeting
    assert planned.recommended.config == meeting[0].config
    assert planned.count(SIMULATED) < len(exhaustive) / 4


@pytest.fixture(scope="module")
def splits_only(scenario):
    return plan(scenario, slos=SLOS, **dict(SPACE, replicas=()), **RUN)


def test_splits_only_recommendation_equals_exhaustive_search(splits_only, exhaustive):
    """The space's splits alone (no aggregated replicas): the answer is a split, a cheaper split
    was simulated and failed first, and it is the exhaustive search's cheapest split meeting the
    SLOs (the same simulations: common random numbers, one seed)."""
    res = splits_only
    meeting = [c for c, b in exhaustive if b["meets"] and c.config.disaggregated]
    rec = res.recommended
    assert rec.config.disaggregated and rec.config == meeting[0].config
    cheaper_sims = [c for c in res.candidates if c.status == SIMULATED and c.order() < rec.order()]
    assert cheaper_sims and all(not c.meets and c.reason for c in cheaper_sims)


def test_plan_json_shows_the_split(planned, splits_only):
    rec = splits_only.to_dict()["recommended"]
    assert rec["disaggregate"] == splits_only.recommended.config.split
    st = rec["stations"]
    assert st["prefill_mu"] > 0 and st["decode_mu"] > 0 and st["link_capacity"] > 0
    assert max(st["rho_prefill"], st["rho_decode"], st["rho_link"]) == pytest.approx(rec["rho"])
    d = planned.to_dict()
    assert d["space"]["pd_splits"] == ["1:1", "1:2", "2:1"] and d["space"]["kv_link_gbps"] == 100.0
    aggs = [c for c in d["candidates"] if c["disaggregate"] is None]
    assert len(aggs) == 24 and all(c["stations"] is None for c in aggs)


def test_theory_pd_closed_forms():
    """The tandem's formulas on a constant step (b = 10 ms): hand-computed values."""
    from llmqueue.theory import pd

    base = lambda P, D, C: 0.01  # noqa: E731
    s = np.array([100.0, 300.0])
    o = np.array([1.0, 21.0])
    cp = pd.prefill_capacity(base, M=1e9, max_num_seqs=4, max_num_batched_tokens=256, prompt_tokens=s)
    # slots: 4 / (0.01 * E[ceil(s / 256)] = 1.5) = 266.7; budget: 256 / (0.01 * 200) = 128
    assert cp.mu == pytest.approx(128.0) and cp.binding == "token budget"
    cd = pd.decode_capacity(base, M=1e9, max_num_seqs=4, max_num_batched_tokens=256, prompt_tokens=s,
                            output_tokens=o)
    # only the second request decodes: 20 steps; slots 4 / (0.01 * 20) = 20 req/s
    assert cd.mu == pytest.approx(20.0) and cd.binding == "max_num_seqs"
    cdk = pd.decode_capacity(base, M=1000.0, max_num_seqs=4, max_num_batched_tokens=256, prompt_tokens=s,
                             output_tokens=o)
    g = 20 * 300 + 20 * 21 / 2  # (o - 1) s + (o - 1) o / 2
    assert cdk.mu == pytest.approx(1000.0 / (0.01 * g)) and cdk.binding.startswith("KV cache")
    # link: 8 Gbit/s = 1e9 B/s; 1,000 B per token x 300 tokens = 3e5 B a decoding request
    assert pd.link_capacity(gbps=8.0, kv_bytes_per_token=1000.0, prompt_tokens=s, output_tokens=o) == \
        pytest.approx(1e9 / 3e5)
    assert math.isinf(pd.link_capacity(gbps=math.inf, kv_bytes_per_token=1000.0, prompt_tokens=s, output_tokens=o))
    # TPOT floor of the decoding request: 10 ms + (3e5 B / 1e9 B/s + 1 ms) / 20
    assert pd.tpot_floor(base, gbps=8.0, latency_ms=1.0, kv_bytes_per_token=1000.0, prompt_tokens=s,
                         output_tokens=o) == pytest.approx(0.01 + (3e-4 + 1e-3) / 20)


def test_cli_pd_splits(scenario, tmp_path, splits_only):
    planned = splits_only
    args = ["plan", "--scenario", scenario, "--gpus", "l4,a100-40gb,h100-sxm", "--tp", "1,2", "--replicas", "",
            "--max-num-seqs", "2,16", "--max-num-batched-tokens", "512", "--pd-splits", "1:1,1:2,2:1",
            "--slo-ttft-p99-ms", "35", "--slo-tpot-p99-ms", "40", "--duration", "120", "--seed", "3",
            "--no-sensitivity", "--out", str(tmp_path / "out")]
    code, out, err = run_cli(*args)
    assert code == 0
    assert "P:D" in out and f"P:D {planned.recommended.config.split}" in out and "KV link 100 Gbit/s" in out
    d = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert d["recommended"]["disaggregate"] == planned.recommended.config.split
    for bad, words in ((["--pd-splits", "2"], ["--pd-splits", "'2' is not P:D"]),
                       (["--pd-splits", "0:1"], ["--pd-splits", "0 is below 1"]),
                       (["--pd-splits", "1:1", "--kv-link-gbps", "0"], ["--kv-link-gbps", "must be positive"])):
        a = list(args)
        i = a.index("--pd-splits")
        del a[i:i + 2]
        code, out, err = run_cli(*a, *bad)
        assert code == 2
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and "Traceback" not in err
        for w in words:
            assert w in lines[0]


def test_splits_same_answer_on_local_and_ray(scenario, splits_only):
    """A split's points (their ``sets``) travel to worker processes and Ray tasks: the same
    recommendation and the same p99s for the same seed."""
    from llmqueue.plan.backends import get_backend

    def answer(res):
        return res.recommended.config, {c.config: (c.result["p99_ttft_ms"], c.result["p99_tpot_ms"])
                                        for c in res.candidates if c.result}

    rec, sims = answer(splits_only)
    with get_backend("local", workers=2) as be:
        lrec, lsims = answer(plan(scenario, slos=SLOS, **dict(SPACE, replicas=()), **RUN, backend=be))
    assert lrec == rec and all(lsims[k] == v for k, v in sims.items())
    pytest.importorskip("ray", reason="ray is not installed (pip install 'llmqueue[ray]')")
    with get_backend("ray", workers=2) as be:
        rrec, rsims = answer(plan(scenario, slos=SLOS, **dict(SPACE, replicas=()), **RUN, backend=be))
    assert rrec == rec and rsims == lsims
