"""Tests of llmqueue.theory.batch: seed 002's Table 1, equation 2, the five-step decision and
Table 2, and the E_B/D/1 refinement against a Lindley-recursion Monte Carlo written here
(checked within 99% batch-means confidence intervals, fixed seeds)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.theory.batch import (
    ACTIONS,
    EXP_P99,
    Z_P99,
    accumulation_delay,
    b_min_stability,
    b_min_target,
    batch_action,
    batch_row,
    batch_table,
    candidate_sizes,
    choose_batch_size,
    erlang_batch_wait,
    service_time,
)

# Seed 002, worked example (GPT-3 at 100 QPS): lam = 100 req/s, T_fixed = 50 ms, t_req = 0.5 ms.
SEED = dict(lam=100.0, T_fixed=0.050, t_req=0.0005)

# Seed 002, Table 1, as printed: B -> (T_svc ms, req/s, rho %, E[W] ms, B/(2 lam) ms, E[T] ms).
TABLE1 = {
    1: (50.5, 19.8, 505, None, 5.0, None),
    4: (52.0, 76.9, 130, None, 20.0, None),
    8: (54.0, 148.1, 67.5, 56.1, 40.0, 150.1),
    16: (58.0, 275.9, 36.3, 16.5, 80.0, 154.5),
    32: (66.0, 484.8, 20.6, 8.6, 160.0, 234.6),
}

T_995_19 = 2.8609346064649794  # Student t, 99% two-sided, 19 degrees of freedom


def rounds_to(x: float, printed: float) -> bool:
    """True when ``x`` rounds (half-up) to ``printed`` at the number of decimals ``printed`` shows."""
    decimals = len(repr(float(printed)).split(".")[1]) if float(printed) != int(printed) else 0
    return abs(x - printed) <= 0.5 * 10 ** -decimals + 1e-9


def ci_halfwidth(x: np.ndarray, blocks: int = 20) -> tuple[float, float]:
    """Mean and 99% batch-means half-width of a (correlated) sample."""
    m = np.array([b.mean() for b in np.array_split(x, blocks)])
    return float(m.mean()), T_995_19 * float(m.std(ddof=1)) / math.sqrt(blocks)


# --- Table 1 -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("B", sorted(TABLE1))
def test_table1_rows(B):
    t_svc, rps, rho_pct, wait, acc, resp = TABLE1[B]
    r = batch_row(B=B, **SEED)
    assert rounds_to(r.T_svc * 1e3, t_svc)
    assert rounds_to(r.mu_eff, rps)
    assert rounds_to(r.rho * 100, rho_pct)
    assert rounds_to(r.T_batch * 1e3, acc)
    if wait is None:
        assert not r.stable and math.isinf(r.Wq) and math.isinf(r.W) and math.isinf(r.L)
        assert r.to_dict()["W"] is None and r.to_dict()["Wq"] is None
    else:
        assert r.stable
        assert rounds_to(r.Wq * 1e3, wait)
        assert rounds_to(r.W * 1e3, resp)


def test_table1_exact_values():
    # E[W] = lam T^2 / (2B(1 - rho)) by hand at B = 8: 100 * 0.054^2 / (16 * 0.325).
    r = batch_row(B=8, **SEED)
    assert r.T_svc == pytest.approx(0.054)
    assert r.rho == pytest.approx(0.675)
    assert r.Wq == pytest.approx(100 * 0.054**2 / (16 * 0.325))
    assert r.W == pytest.approx(r.Wq + 0.040 + 0.054)
    assert r.B_eff == 8


def test_napkin_math_little_at_b16():
    # Seed 002, Napkin Math 0.1: 100 req/s * 154.5 ms = 15.45 in system; 16 * 0.363 = 5.8 in service.
    r = batch_row(B=16, **SEED)
    assert r.L == pytest.approx(SEED["lam"] * r.W)
    assert round(r.L, 2) == 15.45
    in_service = r.B * r.rho
    assert in_service == pytest.approx(SEED["lam"] * r.T_svc) and round(in_service, 1) == 5.8
    assert round(r.L - in_service, 2) == pytest.approx(9.65, abs=0.011)  # seed prints 9.64 (rounded terms)


def test_table_whole_and_json_nulls():
    t = batch_table(sizes=[32, 1, 16, 8, 4, 8], **SEED)
    assert [r.B for r in t.rows] == [1, 4, 8, 16, 32]
    assert t.B_mean_opt == 8  # "Batch size 8 gives the lowest mean latency in this model"
    assert t.b_min_target.B_min_int == 8 and t.b_min_stability.B_min_int == 6
    d = json.loads(json.dumps(t.to_dict(), allow_nan=False))
    assert d["rows"][0]["W"] is None and d["rows"][0]["stable"] is False
    assert d["decision"] is None


def test_service_time():
    assert service_time(T_fixed=0.05, t_req=0.0005, B=16) == pytest.approx(0.058)


# --- B_min ------------------------------------------------------------------------------------------

def test_b_min_target_equation_2():
    r = b_min_target(rho_target=0.75, **SEED)
    assert r.B_min == pytest.approx(5 / 0.70)
    assert round(r.B_min, 2) == 7.14 and r.B_min_int == 8
    # 8 meets the target, 7 does not
    assert batch_row(B=8, **SEED).rho <= 0.75 < batch_row(B=7, **SEED).rho


def test_b_min_stability_step_2():
    r = b_min_stability(**SEED)
    assert r.B_min == pytest.approx(5 / 0.95)
    assert r.B_min_int == 6
    assert batch_row(B=6, **SEED).stable and not batch_row(B=5, **SEED).stable


def test_b_min_integer_boundaries():
    # t_req = 0: stability bound 100 * 0.05 = 5 exactly; B = 5 gives mu_eff = lam (not stable) -> 6.
    s = b_min_stability(lam=100, T_fixed=0.05, t_req=0)
    assert s.B_min == pytest.approx(5) and s.B_min_int == 6
    # target 0.5: bound 10 exactly, and rho(10) = 0.5 <= 0.5 meets it.
    g = b_min_target(lam=100, T_fixed=0.05, t_req=0, rho_target=0.5)
    assert g.B_min == pytest.approx(10) and g.B_min_int == 10


def test_b_min_target_unreachable():
    with pytest.raises(InputError, match="no batch size reaches") as e:
        b_min_target(lam=100, T_fixed=0.05, t_req=0.008, rho_target=0.75)  # lam t_req = 0.8
    assert e.value.field == "rho_target"
    with pytest.raises(InputError, match="rho_target"):
        b_min_target(lam=100, T_fixed=0.05, t_req=0.0075, rho_target=0.75)  # equal: not enough
    with pytest.raises(InputError, match="even stable"):
        b_min_target(lam=100, T_fixed=0.05, t_req=0.02, rho_target=0.75)


def test_b_min_stability_impossible():
    with pytest.raises(InputError, match="no batch size is stable"):
        b_min_stability(lam=100, T_fixed=0.05, t_req=0.01)


# --- accumulation and dynamic batching ---------------------------------------------------------------

def test_accumulation_regimes():
    assert accumulation_delay(lam=100, B=8) == pytest.approx(0.04)
    assert accumulation_delay(lam=100, B=8, T_max=0.1) == pytest.approx(0.04)   # 10 >= 8: fills
    assert accumulation_delay(lam=100, B=8, T_max=0.08) == pytest.approx(0.04)  # 8 >= 8: fills
    assert accumulation_delay(lam=100, B=8, T_max=0.05) == pytest.approx(0.025)  # 5 < 8: timeout


def test_timeout_row_uses_mean_batch():
    # lam T_max = 5 < 8: batches hold 5 requests on average, so T_svc = 52.5 ms and rho = 1.05.
    r = batch_row(B=8, T_max=0.05, **SEED)
    assert r.B_eff == pytest.approx(5) and r.T_batch == pytest.approx(0.025)
    assert r.T_svc == pytest.approx(0.0525) and r.rho == pytest.approx(1.05) and not r.stable
    assert math.isnan(r.W_refined) and r.action == ACTIONS[0]
    # a longer timeout: lam T_max = 12 >= 8, the batch fills, same as no timeout
    assert batch_row(B=8, T_max=0.12, **SEED) == batch_row(B=8, **SEED)
    # B = 16 capped at lam T_max = 10: stable
    r = batch_row(B=16, T_max=0.1, **SEED)
    assert r.B_eff == pytest.approx(10) and r.rho == pytest.approx(100 * 0.055 / 10)
    assert r.W == pytest.approx(r.Wq + 0.05 + 0.055)


# --- sigma and P99 ----------------------------------------------------------------------------------

def test_sigma_and_p99_by_hand():
    r = batch_row(B=8, **SEED)
    T, lam_b, rho, Wq = 0.054, 100 / 8, 0.675, r.Wq
    var = Wq**2 + lam_b * T**3 / (3 * (1 - rho)) + 0.04**2 / 3
    assert r.sigma_T == pytest.approx(math.sqrt(var))
    assert r.P99_normal == pytest.approx(r.W + 2.33 * math.sqrt(var))
    assert r.P99_exponential == pytest.approx(-math.log(0.01) * r.W)
    assert Z_P99 == 2.33 and round(EXP_P99, 1) == 4.6
    u = batch_row(B=8, sigma=0.02, **SEED)
    assert u.sigma_T == 0.02 and u.P99_normal == pytest.approx(r.W + 2.33 * 0.02)


def test_md1_moments_against_monte_carlo():
    """The seed's E[W] and the Takacs variance behind sigma_T are M/D/1 results: batches
    arriving as a Poisson stream at lam/B with deterministic service (B = 8 row)."""
    r = batch_row(B=8, **SEED)
    lam_b, T = 100 / 8, r.T_svc
    rng = np.random.default_rng(20260)
    n = 200_000
    a = rng.exponential(1 / lam_b, n)
    w = np.empty(n)
    x = 0.0
    for i in range(n):  # Lindley: W_{i+1} = max(0, W_i + T - A_i)
        w[i] = x
        x = max(0.0, x + T - a[i])
    w = w[2000:]
    m, h = ci_halfwidth(w)
    assert abs(m - r.Wq) <= h
    var_takacs = r.Wq**2 + lam_b * T**3 / (3 * (1 - r.rho))
    m2, h2 = ci_halfwidth(w * w)
    assert abs(m2 - (var_takacs + r.Wq**2)) <= h2  # E[W^2] = Var(W) + E[W]^2


# --- Table 2 and the decision -----------------------------------------------------------------------

@pytest.mark.parametrize("state,action", [
    (dict(B=4, B_min=5.26, rho=1.3), ACTIONS[0]),
    (dict(B=4, B_min=5.26, rho=1.3, P99=9.0, slo=0.2), ACTIONS[0]),       # unstable wins
    (dict(B=6, B_min=6.0, rho=1.0), ACTIONS[0]),
    (dict(B=16, B_min=5.26, rho=0.36, P99=0.3, slo=0.2), ACTIONS[1]),     # P99 > SLO before rho < 0.5
    (dict(B=16, B_min=5.26, rho=0.36, P99=0.2, slo=0.2), ACTIONS[2]),     # P99 == SLO is fine
    (dict(B=16, B_min=5.26, rho=0.36), ACTIONS[2]),
    (dict(B=6, B_min=5.26, rho=0.883, P99=0.1, slo=0.2), ACTIONS[3]),
    (dict(B=8, B_min=5.26, rho=0.675, P99=0.1, slo=0.2), ACTIONS[4]),
    (dict(B=8, B_min=5.26, rho=0.5), "ok"),
    (dict(B=8, B_min=5.26, rho=0.85), "ok"),
])
def test_table2_action(state, action):
    assert batch_action(**state) == action


def test_table2_wording():
    assert ACTIONS == ("increase batch size or add replicas", "reduce batch size or add replicas",
                       "consider reducing replicas to save cost", "add replicas for headroom", "ok")


def test_candidate_sizes():
    assert candidate_sizes(B_min=6, B_max=32) == [6, 12, 18, 24, 30, 32]
    assert candidate_sizes(B_min=8, B_max=32) == [8, 16, 24, 32]
    assert candidate_sizes(B_min=8, B_max=5) == [5]


def p99_normal_by_hand(B, lam=100.0, T_fixed=0.05, t_req=0.0005):
    T = T_fixed + t_req * B
    rho = lam * T / B
    wq = lam * T * T / (2 * B * (1 - rho))
    acc = B / (2 * lam)
    var = wq * wq + (lam / B) * T**3 / (3 * (1 - rho)) + acc * acc / 3
    return wq + acc + T + 2.33 * math.sqrt(var), wq + acc + T


def test_decision_five_steps():
    d = choose_batch_size(slo=0.300, B_max=32, **SEED)
    assert d.candidates == (6, 12, 18, 24, 30, 32)
    assert d.B_min_int == 6 and d.B_min == pytest.approx(5 / 0.95)
    p99 = {B: p99_normal_by_hand(B)[0] for B in d.candidates}
    for r in d.rows:
        assert r.P99_normal == pytest.approx(p99[r.B])
    assert max(B for B, p in p99.items() if p <= 0.3) == 12
    assert d.B_slo == d.B_slo_normal == 12
    assert d.B_slo_exponential is None              # 4.6 E[T] > 0.3 s everywhere
    means = {B: p99_normal_by_hand(B)[1] for B in d.candidates}
    assert d.B_mean_opt == min(means, key=means.get) == 12
    assert d.B_action == 12 and d.action == ACTIONS[2]  # rho(12) = 0.467 < 0.5


def test_decision_exponential_and_user_list():
    d = choose_batch_size(slo=0.700, candidates=[1, 4, 8, 16, 32], p99="exponential", **SEED)
    # 4.605 * 150.1 ms = 691 ms <= 700; 4.605 * 154.5 ms = 711 ms > 700
    assert d.B_slo == d.B_slo_exponential == 8
    assert d.B_mean_opt == 8 and d.B_mean_opt_refined == 8
    assert d.action == "ok"
    s = choose_batch_size(slo=0.200, candidates=[8, 16], sigma=0.01, **SEED)
    assert s.B_slo_normal == 16  # 154.5 + 23.3 = 177.8 ms; 150.1 + 23.3 = 173.4 ms: largest is 16


def test_decision_none_meets_slo():
    d = choose_batch_size(slo=0.100, B_max=32, **SEED)
    assert d.B_slo is None and d.B_slo_normal is None
    assert d.action == ACTIONS[1]
    assert d.B_action == min(d.rows, key=lambda r: r.P99_normal).B


def test_decision_everything_unstable():
    d = choose_batch_size(lam=100, T_fixed=0.05, t_req=0.011, slo=1.0, B_max=64)
    assert d.candidates == (64,) and d.B_slo is None and d.B_min_int is None
    assert not d.rows[0].stable and d.action == ACTIONS[0]


def test_decision_needs_candidates():
    with pytest.raises(InputError, match="B_max"):
        choose_batch_size(slo=0.3, **SEED)


def test_table_with_slo_has_decision():
    t = batch_table(sizes=[1, 4, 8, 16, 32], slo=0.4, **SEED)
    assert t.decision is not None and t.decision.B_slo == 16
    assert [r.action for r in t.rows] == [ACTIONS[0], ACTIONS[0], ACTIONS[4], ACTIONS[2], ACTIONS[1]]


# --- refinement: E_B/D/1 -----------------------------------------------------------------------------

def test_refinement_b1_is_md1():
    # Erlang-1 batch arrivals are Poisson: the refinement must equal the seed's M/D/1 wait.
    for lam, T in [(10, 0.05), (15, 0.06), (19, 0.05)]:  # rho = 0.5, 0.9, 0.95
        md1 = lam * T * T / (2 * (1 - lam * T))
        methods = ("spitzer", "roots", "auto") if lam * T <= 0.9 else ("roots", "auto")  # series slow at 0.95
        for method in methods:
            assert erlang_batch_wait(lam=lam, T_svc=T, B=1, method=method) == pytest.approx(md1, rel=1e-10)


@pytest.mark.parametrize("B,rho", [(2, 0.5), (8, 0.675), (8, 0.9), (4, 0.97), (16, 0.8), (32, 0.95)])
def test_refinement_two_exact_methods_agree(B, rho):
    lam = 100.0
    T = rho * B / lam
    w_roots = erlang_batch_wait(lam=lam, T_svc=T, B=B, method="roots")
    w_auto = erlang_batch_wait(lam=lam, T_svc=T, B=B)
    assert w_auto == pytest.approx(w_roots, rel=1e-8)
    if rho <= 0.9:
        w_sp = erlang_batch_wait(lam=lam, T_svc=T, B=B, method="spitzer")
        assert w_sp == pytest.approx(w_roots, rel=1e-8)


def test_refinement_unstable_and_below_md1():
    assert math.isinf(erlang_batch_wait(lam=100, T_svc=0.08, B=8))
    for B in (2, 8, 32):
        T = 0.8 * B / 100
        md1 = (100 / B) * T * T / (2 * 0.2)
        assert 0 < erlang_batch_wait(lam=100, T_svc=T, B=B) < md1  # more regular arrivals wait less


def test_refinement_issue_check_values():
    # Independent check quoted in the issue: about 92, 133 and 221 ms for B = 8, 16, 32.
    for B, ms in [(8, 92), (16, 133), (32, 221)]:
        r = batch_row(B=B, **SEED)
        assert r.T_batch_refined == pytest.approx((B - 1) / 200)
        assert abs(r.W_refined * 1e3 - ms) < 1.0
        assert r.L_refined == pytest.approx(100 * r.W_refined)


def simulate_full_batches(lam: float, T: float, B: int, n_batches: int, seed: int):
    """Requests Poisson(lam); every B consecutive requests form a batch, dispatched at its B-th
    arrival to one FIFO server with deterministic service T (Lindley recursion on batches).
    Returns per-request response times and per-batch queue waits, warm-up dropped."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / lam, n_batches * B))
    form = arr[B - 1::B]
    gaps = np.diff(form)
    wait = np.empty(n_batches)
    w = 0.0
    for j in range(n_batches):
        wait[j] = w
        if j < n_batches - 1:
            w = max(0.0, w + T - gaps[j])
    done = form + wait + T
    resp = np.repeat(done, B) - arr
    warm = n_batches // 20
    return resp[warm * B:], wait[warm:]


@pytest.mark.parametrize("B,n_batches", [(8, 40_000), (16, 20_000), (32, 10_000), (4, 60_000)])
def test_refinement_against_monte_carlo(B, n_batches):
    lam, T_fixed, t_req = (100.0, 0.05, 0.0005) if B != 4 else (60.0, 0.05, 0.0005)  # B=4: rho = 0.78
    r = batch_row(lam=lam, T_fixed=T_fixed, t_req=t_req, B=B)
    resp, wait = simulate_full_batches(lam, r.T_svc, B, n_batches, seed=1000 + B)
    m, h = ci_halfwidth(resp)
    assert abs(m - r.W_refined) <= h, (B, m, h, r.W_refined)
    mw, hw = ci_halfwidth(wait)
    assert abs(mw - r.Wq_refined) <= max(hw, 1e-9), (B, mw, hw, r.Wq_refined)
    # and the seed's M/D/1 mean response lies far outside the interval
    assert abs(m - r.W) > 5 * h


# --- validation --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,field", [
    (dict(lam=0, T_fixed=0.05, t_req=0.0005, B=8), "lam"),
    (dict(lam=-1, T_fixed=0.05, t_req=0.0005, B=8), "lam"),
    (dict(lam=float("nan"), T_fixed=0.05, t_req=0.0005, B=8), "lam"),
    (dict(lam=100, T_fixed=0, t_req=0.0005, B=8), "T_fixed"),
    (dict(lam=100, T_fixed=0.05, t_req=-0.1, B=8), "t_req"),
    (dict(lam=100, T_fixed=0.05, t_req=float("nan"), B=8), "t_req"),
    (dict(lam=100, T_fixed=0.05, t_req=0.0005, B=0), "B"),
    (dict(lam=100, T_fixed=0.05, t_req=0.0005, B=2.5), "B"),
    (dict(lam=100, T_fixed=0.05, t_req=0.0005, B=8, T_max=0), "T_max"),
    (dict(lam=100, T_fixed=0.05, t_req=0.0005, B=8, sigma=-1), "sigma"),
    (dict(lam=100, T_fixed=0.05, t_req=0.0005, B=8, p99="median"), "p99"),
])
def test_batch_row_rejects(kwargs, field):
    with pytest.raises(InputError) as e:
        batch_row(**kwargs)
    assert e.value.field == field


@pytest.mark.parametrize("rho_target", [0, 1, 1.5, float("nan")])
def test_rho_target_range(rho_target):
    with pytest.raises(InputError, match="rho_target"):
        b_min_target(rho_target=rho_target, **SEED)


def test_sizes_and_method_rejected():
    with pytest.raises(InputError, match="sizes"):
        batch_table(sizes=[], **SEED)
    with pytest.raises(InputError, match="sizes"):
        batch_table(sizes=[8, -1], **SEED)
    with pytest.raises(InputError, match="method"):
        erlang_batch_wait(lam=100, T_svc=0.05, B=8, method="fast")


def test_module_is_light():
    import subprocess
    import sys

    code = ("import sys, llmqueue.theory.batch; "
            "print('numpy' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
