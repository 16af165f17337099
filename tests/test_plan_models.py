"""The planner's model axis (``llmqueue plan --models``).

The planner tests' cheap scenario (Poisson 4 req/s, short prompts; targets p99 TTFT 300 ms, TPOT 60 ms) on a space of two models,
llama-3.1-8b and llama-3.1-70b, on a100-40gb and h100-sxm at tp 1 and 2: the 70b fits only on two
h100s (its weights need 65.7 GiB per GPU at tp 2), so every other 70b configuration is pruned by
theory with that reason and never simulated; the 8b meets the SLOs on cheaper GPUs and is chosen.
The recommendation equals the exhaustive search's (every configuration that fits simulated).
"""

from __future__ import annotations

import json

import pytest
from _cli import run_cli

from llmqueue.plan.planner import PRUNED, plan

from test_plan_planner import RUN, simulate_all, write_tiny

#: loose enough for the 70b on two h100s (its decode step alone is about 27 ms), so cost decides
SLOS = {"p99_ttft_ms": 300.0, "p99_tpot_ms": 60.0}

MODELS = ("llama-3.1-8b", "llama-3.1-70b")
SPACE = dict(gpus=["a100-40gb", "h100-sxm"], tp=(1, 2), replicas=(1, 2, 3), max_num_seqs=(16,),
             max_num_batched_tokens=(512,), routers=("least-outstanding",), models=MODELS)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return write_tiny(tmp_path_factory, "plan_models")


@pytest.fixture(scope="module")
def planned(scenario):
    return plan(scenario, slos=SLOS, **SPACE, **RUN)


@pytest.fixture(scope="module")
def exhaustive(scenario):
    """Every configuration that fits, simulated, in the planner's order."""
    return simulate_all(scenario, SPACE, SLOS, RUN, keep=lambda c: not (c.reason or "").startswith("does not fit"))


def test_unfit_model_is_pruned_with_its_reason(planned):
    big = [c for c in planned.candidates if c.config.model == "llama-3.1-70b"]
    assert len(big) == 12
    unfit = [c for c in big if not (c.config.gpu == "h100-sxm" and c.config.tensor_parallel_size == 2)]
    assert len(unfit) == 9
    for c in unfit:
        assert c.status == PRUNED and c.result is None
        assert c.reason.startswith(f"does not fit: llama-3.1-70b on {c.config.tensor_parallel_size} x {c.config.gpu}")
        assert "weights do not fit" in c.reason
    fit = [c for c in big if c not in unfit]
    assert all(not (c.reason or "").startswith("does not fit") for c in fit)
    # its own M and step model: the 70b's TPOT bound is above the 8b's on the same two h100s
    small = {(c.config.gpu, c.config.tensor_parallel_size, c.config.replicas): c for c in planned.candidates
             if c.config.model == "llama-3.1-8b"}
    for c in fit:
        twin = small[(c.config.gpu, c.config.tensor_parallel_size, c.config.replicas)]
        assert c.tpot_bound_ms > 2 * twin.tpot_bound_ms
        assert c.cost_per_hour == pytest.approx(twin.cost_per_hour)  # the price is the GPUs'


def test_smaller_cheaper_model_is_chosen(planned, exhaustive):
    rec = planned.recommended
    assert rec is not None and rec.config.model == "llama-3.1-8b" and rec.meets
    sims, _ = exhaustive
    big_meets = [c for c, b in sims if c.config.model == "llama-3.1-70b" and b["meets"]]
    assert big_meets, "the 70b should meet the SLOs too, so that cost alone decides"
    assert min(c.cost_per_hour for c in big_meets) > rec.cost_per_hour


def test_recommendation_equals_exhaustive_search(planned, exhaustive):
    sims, cands = exhaustive
    assert len(cands) == len(planned.candidates) == 24
    meeting = [c for c, b in sims if b["meets"]]
    assert planned.recommended.config == meeting[0].config
    assert planned.recommended.cost_per_hour == pytest.approx(meeting[0].cost_per_hour)
    # pruning is sound: no configuration theory pruned (and that fits) meets the SLOs when simulated
    assert not [c.config.label() for c, b in sims if c.status == PRUNED and b["meets"]]


def test_cache_keys_hold_the_model(scenario):
    from llmqueue.plan.points import point_key
    from llmqueue.spec import scenario_spec

    base = {"scenario": scenario, "duration": 120.0, "seed": 3, "gpu": "h100-sxm", "tensor_parallel_size": 2}
    assert point_key(scenario_spec, {**base, "model": MODELS[0]}) != point_key(scenario_spec, {**base, "model": MODELS[1]})


def test_cli_shows_the_model(scenario, tmp_path, planned):
    out = tmp_path / "out"
    code, text, err = run_cli("plan", "--scenario", scenario, "--models", ",".join(MODELS), "--gpus", "a100-40gb,h100-sxm",
                              "--tp", "1,2", "--replicas", "1..3", "--max-num-seqs", "16", "--max-num-batched-tokens", "512",
                              "--duration", "120", "--seed", "3", "--no-sensitivity", "--slo-ttft-p99-ms", "300",
                              "--slo-tpot-p99-ms", "60", "--out", str(out))
    assert code == 0, err
    assert any(line.split()[:2] == ["model", "llama-3.1-8b"] for line in text.splitlines() if line.strip())
    table = text[text.index("Simulated"):]
    assert table.splitlines()[1].split()[0] == "model"
    d = json.loads((out / "plan.json").read_text())
    assert d["models"] == list(MODELS) and d["space"]["models"] == list(MODELS)
    assert d["recommended"]["model"] == "llama-3.1-8b"
    assert {c["model"] for c in d["candidates"]} == set(MODELS)
    assert all(p["model"] for p in d["pareto_cost_vs_p99_ttft"])
    assert "llama-3.1-70b" in d["step_model_source"]

    from llmqueue.report.plan_page import deployment_label, summary_table

    assert deployment_label(d["recommended"]).startswith("llama-3.1-8b on ")
    assert "llama-3.1-70b" in summary_table(d).html()
