"""Closed forms of one replica (llmqueue.theory.replica) against hand arithmetic and textbook queues."""

import pytest
from _cli import run_cli

from llmqueue.theory.replica import one_at_a_time, replica_capacity
from llmqueue.workload import parse_length


def test_slot_and_budget_bounds_by_hand():
    # s = 1000, o = 200, chunk 512: ceil(1000/512) + 199 = 201 steps a request, b = 0.03
    cap = replica_capacity(b=0.03, max_num_seqs=64, max_num_batched_tokens=512, prompt_tokens=[1000] * 4,
                           output_tokens=[200] * 4, lam=5.0)
    assert cap.mu_seqs == pytest.approx(64 / (0.03 * 201))
    assert cap.mu_tokens == pytest.approx(512 / (0.03 * 1199))
    assert cap.mu_kv is None and cap.mu == pytest.approx(min(cap.mu_seqs, cap.mu_tokens))
    assert cap.binding == "max_num_seqs" and cap.rho == pytest.approx(5.0 * 0.03 * 201 / 64) and cap.verdict == "stable"
    assert replica_capacity(b=0.03, max_num_seqs=64, max_num_batched_tokens=512, prompt_tokens=[1000],
                            output_tokens=[200], lam=11.0).verdict == "unstable"


def test_the_kv_bound_is_seed_004s_and_binds_in_its_setting():
    # seed 004's 1:1 setting: mu = 3.263 req/s in the paper's theory
    p = o = parse_length("uniform:10:1600")
    cap = replica_capacity(b=0.0372, max_num_seqs=256, max_num_batched_tokens=512, prompt_tokens=[805] * 10,
                           output_tokens=[805] * 10, M=131000, prompt=p, output=o, lam=3.0)
    assert cap.binding == "KV cache (Nie et al. 2026)" and cap.mu == pytest.approx(3.263, rel=2e-3)
    assert cap.verdict in ("stable", "indeterminate") and cap.delta is not None


def test_one_at_a_time_is_mm1_with_exponential_one_step_service():
    # one step per request, exponential steps of mean 0.1 s: M/M/1, W = 1 / (mu - lam) = 0.5 s at lam 8
    r = one_at_a_time(lam=8.0, b=0.1, prompt_tokens=1, output_tokens=1, chunk=512, scv_step=1.0)
    assert r.stable and r.service_steps == 1 and r.mean_e2el_ms == pytest.approx(500.0)
    # k deterministic steps: M/D/1, W = k b + rho k b / (2 (1 - rho))
    r = one_at_a_time(lam=2.0, b=0.1, prompt_tokens=1, output_tokens=3, chunk=512)
    rho = 2.0 * 0.3
    assert r.mean_e2el_ms == pytest.approx(1e3 * (0.3 + rho * 0.3 / (2 * (1 - rho))))
    assert not one_at_a_time(lam=4.0, b=0.1, prompt_tokens=1, output_tokens=3, chunk=512).stable


def test_saturated_capacity_solves_the_step_at_the_capacity_point():
    # prompts of one token, outputs of 101: k = 1 + 100 steps a request; 64 slots bind. At capacity a
    # step starts N / k = 64 / 101 requests and decodes D = 64 * 100 / 101 sequences, so
    # b = c0 + c_prefill * (64 / 101) + c_decode * D, and mu = 64 / (b k)
    from llmqueue.theory.replica import saturated_capacity

    c0, cp, cd = 0.01, 1e-3, 2e-4

    def base(P, D, C):
        return c0 + cp * P + cd * D

    cap = saturated_capacity(base, max_num_seqs=64, max_num_batched_tokens=8192, prompt_tokens=[1] * 10,
                             output_tokens=[101] * 10)
    b = c0 + cp * 64 / 101 + cd * 64 * 100 / 101
    assert cap.b == pytest.approx(b, rel=1e-6)
    assert cap.mu == pytest.approx(64 / (b * 101), rel=1e-6) and cap.binding == "max_num_seqs"


def test_theory_beside_a_linear_step_run_is_the_saturation_capacity():
    """The capacity printed beside a run does not depend on the run's load (it was the run's mean
    step: twice the capacity at a low load), and meets the simulated saturation throughput."""
    args = ["simulate", "--capacity-tokens", "1000000", "--max-num-seqs", "64", "--step-time",
            "linear:c0=0.01:prefill=2e-5:decode=2e-4", "--prompt", "uniform:10:200", "--output", "uniform:50:150",
            "--duration", "300", "--json"]
    out = {}
    for rate in (5, 100):
        out[rate] = run_cli(*args, "--arrival", f"poisson:{rate}").json()
    th_low, th_high = out[5]["theory"], out[100]["theory"]
    assert th_low["mu"] == pytest.approx(th_high["mu"], rel=1e-9)
    assert th_low["b_mean_simulated"] < 0.6 * th_low["b"]  # the low-load mean step is far shorter
    assert out[100]["request_throughput"] == pytest.approx(th_high["mu"], rel=0.03)
    assert th_low["verdict"] == "stable" and th_high["verdict"] == "unstable"
