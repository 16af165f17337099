"""Tests of the planner (:mod:`llmqueue.plan.planner`) and ``llmqueue plan``.

A cheap scenario (Poisson 4 req/s, prompts of 50-300 tokens, outputs of 20-60, two minutes) on a
48-configuration space small enough to simulate exhaustively: the planner's recommendation must
be the exhaustive search's cheapest configuration meeting the SLOs (same simulate function, same
seed, same order among equal costs), and no configuration theory pruned may meet them.
"""

from __future__ import annotations

import json

import pytest
from _cli import run_cli

from llmqueue.plan.planner import PRUNED, SIMULATED, Candidate, plan, scenario_workload, simulate_configs, theory
from llmqueue.plan.space import configurations, parse_ints

TINY = """\
name: tiny
description: a cheap workload for the planner's tests
workload:
  arrival: poisson:4
  prompt: uniform:50:300
  output: uniform:20:60
deployment:
  model: llama-3.1-8b
  gpu: h100-sxm
  max_model_len: 4096
slos:
  ttft_ms: {p99: 45}
  tpot_ms: {p99: 40}
run:
  duration_s: 120
  seed: 3
  warmup_s: 10
"""
SLOS = {"p99_ttft_ms": 45.0, "p99_tpot_ms": 40.0}
SPACE = dict(gpus=["l4", "a100-40gb", "h100-sxm"], tp=(1, 2), replicas=(1, 2, 3, 4), max_num_seqs=(2, 16),
             max_num_batched_tokens=(512,), routers=("least-outstanding",), models=("llama-3.1-8b",))
RUN = dict(duration=120.0, seed=3)


def write_tiny(tmp_path_factory, name: str) -> str:
    """The tiny scenario in a fresh directory (shared by the plan test modules)."""
    p = tmp_path_factory.mktemp(name) / "tiny.yaml"
    p.write_text(TINY)
    return str(p)


def simulate_all(scenario, space: dict, slos: dict, run: dict, keep=lambda c: True) -> tuple[list, list]:
    """Every configuration of ``space`` that ``keep`` keeps, simulated (pruned ones included), in
    the planner's order, as (candidate, brief) pairs; and all the candidates."""
    wl = scenario_workload(scenario, seed=run["seed"], duration=run["duration"])
    cands = theory(scenario, configurations(**space), wl, slos=slos)
    kept = [c for c in cands if keep(c)]
    briefs = simulate_configs(scenario, [c.config for c in kept], slos, **run)
    return sorted(zip(kept, briefs), key=lambda x: Candidate.order(x[0])), cands


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return write_tiny(tmp_path_factory, "plan")


@pytest.fixture(scope="module")
def planned(scenario):
    return plan(scenario, slos=SLOS, **SPACE, **RUN)


@pytest.fixture(scope="module")
def exhaustive(scenario):
    """Every configuration simulated (pruned ones included), in the planner's order."""
    return simulate_all(scenario, SPACE, SLOS, RUN)[0]


def test_space_size():
    assert len(configurations(**SPACE)) == 48
    assert parse_ints("replicas", "1..4,8") == (1, 2, 3, 4, 8)


def test_recommendation_equals_exhaustive_search(planned, exhaustive):
    meeting = [c for c, b in exhaustive if b["meets"]]
    assert meeting, "the space must hold a configuration meeting the SLOs"
    best = meeting[0]
    assert planned.recommended is not None
    assert planned.recommended.config == best.config
    assert planned.recommended.cost_per_hour == pytest.approx(best.cost_per_hour)
    # the planner simulated far fewer than the exhaustive search
    assert planned.count(SIMULATED) < len(exhaustive) / 4


def test_pruning_is_sound(exhaustive):
    """No configuration that theory pruned meets the SLOs when simulated anyway."""
    wrong = [(c.config.label(), c.reason) for c, b in exhaustive if c.status == PRUNED and b["meets"]]
    assert not wrong


def test_recommended_meets_and_cheaper_ones_do_not(planned):
    rec = planned.recommended
    r = rec.result
    assert r["meets"] and r["stable"] and not r["reasons"]
    for k, target in SLOS.items():
        assert r[k] <= target
    before = [c for c in sorted(planned.candidates, key=Candidate.order) if c.order() < rec.order()]
    assert before
    for c in before:  # every cheaper one: pruned for a stated reason, or simulated and failed
        assert c.status in (PRUNED, SIMULATED)
        assert c.reason
        if c.status == SIMULATED:
            assert c.result["meets"] is False and c.result["reasons"]
    sims = [c for c in before if c.status == SIMULATED]
    assert sims, "the test space should make the planner reject a cheaper simulated configuration"
    assert sims[-1].cost_per_hour <= rec.cost_per_hour


def test_plan_json_statuses(planned):
    d = planned.to_dict()
    assert d["configurations"] == 48 == d["pruned"] + d["simulated"] + d["not_needed"]
    assert {c["status"] for c in d["candidates"]} <= {"pruned", "simulated", "not needed"}
    assert d["recommended"]["simulation"]["cost_per_million_output_tokens"] > 0
    assert all(c["reason"] for c in d["candidates"] if c["status"] == "pruned")
    assert d["pareto_cost_vs_p99_ttft"][-1]["p99_ttft_ms"] <= d["recommended"]["simulation"]["p99_ttft_ms"]


def _run(*args):
    return run_cli("plan", *args)


def _space_args(scenario, tmp_path):
    return ["--scenario", scenario, "--gpus", "l4,a100-40gb,h100-sxm", "--tp", "1,2", "--replicas", "1..4",
            "--max-num-seqs", "2,16", "--max-num-batched-tokens", "512", "--duration", "120", "--seed", "3",
            "--out", str(tmp_path / "out")]


def test_cli_json_and_plan_file(scenario, tmp_path, planned):
    code, out, err = _run(*_space_args(scenario, tmp_path), "--json")
    assert code == 0, err
    d = json.loads(out)
    rec = d["recommended"]
    assert (rec["gpu"], rec["tensor_parallel_size"], rec["replicas"], rec["max_num_seqs"]) == (
        planned.recommended.config.gpu, planned.recommended.config.tensor_parallel_size,
        planned.recommended.config.replicas, planned.recommended.config.max_num_seqs)
    on_disk = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert on_disk["recommended"] == rec and len(on_disk["candidates"]) == 48
    assert [r["case"] for r in d["sensitivity"]["rows"]][0] == "base" and d["sensitivity"]["margin_rate"] > 0


def test_cli_table(scenario, tmp_path):
    code, out, err = _run(*_space_args(scenario, tmp_path))
    assert code == 0, err
    assert "cost per million output tokens" in out and "pruned by theory" in out and "plan.json" in out
    assert "Sensitivity" in out and "margin: meets the SLOs up to" in out and "engine 10% slower" in out


@pytest.mark.parametrize("extra, words", [
    (["--slo-ttft-p99-ms", "1"], ["--slo-ttft-p99-ms", "p99 TTFT 1 ms is below the fastest single-request prefill",
                                  "h100-sxm tp2"]),
    (["--slo-tpot-p99-ms", "0.5"], ["--slo-tpot-p99-ms", "below the fastest single-request decode step"]),
    (["--budget-per-hour", "0.5"], ["--budget-per-hour", "$0.5/h is below the cheapest candidate $0.80/h"]),
    (["--tp", ","], ["configuration space is empty"]),
    (["--replicas", "0"], ["--replicas", "0 is below 1"]),
    (["--gpus", "l4", "--tp", "1", "--replicas", "1", "--max-num-seqs", "2", "--slo-ttft-p99-ms", "1000",
      "--slo-tpot-p99-ms", "1000"], ["--replicas", "no candidate carries lam = 4 req/s at rho <= 0.95"]),
])
def test_cli_impossible_requests(scenario, tmp_path, extra, words):
    args = _space_args(scenario, tmp_path)
    for flag in extra[::2]:  # an extra flag replaces the space's own
        if flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    code, out, err = _run(*args, *extra)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0]


# --- the burst bound: bursty arrivals -------------------------------------------------------------

BURSTY = TINY.replace("arrival: poisson:4", "arrival: onoff:9:on=40:off=40:rate_off=1").replace("name: tiny", "name: bursty")


def test_burst_bound_is_sound_and_prunes(tmp_path):
    """On/off arrivals (9 and 1 req/s, mean 5): the burst bound prunes configurations that the
    mean-rate bound lets through, and none of them meets the SLOs when simulated anyway."""
    from llmqueue.plan.burst import fluid_backlog

    p = tmp_path / "bursty.yaml"
    p.write_text(BURSTY)
    space = dict(SPACE, gpus=["l4", "a100-40gb"])
    wl = scenario_workload(str(p), seed=RUN["seed"], duration=RUN["duration"])
    cands = theory(str(p), configurations(**space), wl, slos=SLOS)
    burst = [c for c in cands if (c.reason or "").startswith("burst bound")]
    assert burst, "the bursty space should give the burst bound something to prune"
    assert all(c.rho <= 0.95 for c in burst)  # the mean-rate bound alone would keep them
    briefs = simulate_configs(str(p), [c.config for c in burst], SLOS, **RUN)
    assert not [c.config.label() for c, b in zip(burst, briefs) if b["meets"]]
    # a constant stream below the ceiling builds no backlog beyond one request
    assert fluid_backlog([0.0, 1.0, 2.0, 3.0], 2.0).max() == 1.0


# --- backends: the same answer everywhere ---------------------------------------------------------

def _answer(res):
    sims = {c.config: (c.result["p99_ttft_ms"], c.result["p99_tpot_ms"]) for c in res.candidates if c.result}
    return res.recommended.config, sims


def test_same_plan_on_serial_local_and_ray(scenario, planned):
    """The same recommendation and the same simulated p99s for the same seed on every backend
    (each simulation carries its seed; rounds of ``workers`` only add configurations after the answer)."""
    from llmqueue.plan.backends import get_backend

    serial_rec, serial_sims = _answer(planned)
    with get_backend("local", workers=2) as be:
        local_rec, local_sims = _answer(plan(scenario, slos=SLOS, **SPACE, **RUN, backend=be))
    assert local_rec == serial_rec
    assert all(local_sims[k] == v for k, v in serial_sims.items() if k in local_sims)
    assert serial_sims.keys() <= local_sims.keys()
    pytest.importorskip("ray", reason="ray is not installed (pip install 'llmqueue[ray]')")
    with get_backend("ray", workers=2) as be:
        assert be.name == "ray"
        ray_rec, ray_sims = _answer(plan(scenario, slos=SLOS, **SPACE, **RUN, backend=be))
    assert ray_rec == serial_rec
    assert ray_sims == local_sims


# --- sensitivity ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sens(scenario, planned):
    from llmqueue.plan.sensitivity import sensitivity

    return sensitivity(scenario, planned.recommended.config, SLOS, lam=planned.lam, warmup_s=10.0,
                       duration=RUN["duration"], seed=RUN["seed"])


def test_sensitivity_rows_are_consistent(sens, planned):
    from llmqueue.plan.sensitivity import SPEC_ROWS

    rows = {r["case"]: r for r in sens["rows"]}
    assert tuple(rows) == SPEC_ROWS
    for r in rows.values():
        assert r["p99_ttft_ms"] > 0 and r["p99_tpot_ms"] > 0 and 0 <= r["failed_share"] <= 1
        assert isinstance(r["meets"], bool) and r["verdict"]
    assert sens["duration_s"] >= 10.0 + 900.0  # the spike fits after the warm-up

    def lower_ci(r, k):
        return r[k + "_ci"][0] if r[k + "_ci"] else r[k]

    base, more, slow = rows["base"], rows["+20% traffic"], rows["engine 10% slower"]
    for k in ("p99_ttft_ms", "p99_tpot_ms"):  # more load or a slower engine: not faster beyond the noise
        width = (base[k + "_ci"][1] - base[k + "_ci"][0]) if base[k + "_ci"] else 0.05 * base[k]
        assert more[k] >= base[k] - width
        assert slow[k] >= base[k] - width
    assert slow["p99_tpot_ms"] > base["p99_tpot_ms"]  # every step 10% longer
    if base["meets"]:
        assert sens["margin_rate"] >= planned.lam
        assert sens["margin_factor"] == pytest.approx(sens["margin_rate"] / planned.lam)
    if not more["meets"]:
        assert sens["margin_rate"] is None or sens["margin_rate"] < 1.2 * planned.lam * 1.1
