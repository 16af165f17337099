"""The engine's speed drifting in time (``:drift=SD:span=S``): a service rate modulated by a
random environment, checked against an independent single-server recursion and against the
quasi-static mixture of M/D/1 queues it tends to when the windows are long."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.options import SimOptions
from llmqueue.engine.step_model import DriftStream
from llmqueue.engine.step_time import parse_step_time
from llmqueue.errors import InputError
from llmqueue.workload import Workload


def test_drift_factors_are_mean_one_with_the_given_cv_and_constant_within_a_window():
    d = DriftStream(0.2, 5.0, seed=3)
    f = np.array([d.at(5.0 * j + 2.5) for j in range(20000)])
    assert f.mean() == pytest.approx(1.0, abs=0.01)
    assert f.std(ddof=1) == pytest.approx(0.2, rel=0.05)
    assert d.at(10.0) == d.at(14.999) != d.at(15.0)
    assert d.next_boundary(12.0) == 15.0 and d.next_boundary(15.0) == 20.0
    # seeded: same seed, same speeds; another seed, others
    assert [DriftStream(0.2, 5.0, seed=3).at(t) for t in (0, 7, 99)] == [d.at(t) for t in (0, 7, 99)]
    assert DriftStream(0.2, 5.0, seed=4).at(7) != d.at(7)


def test_drift_spec_parses_in_either_order_and_rejects_bad_values():
    m = parse_step_time("linear:c0=0.01:decode=1e-4:drift=0.08:span=20:noise=gamma:cv=0.3")
    assert (m.c0, m.c_decode, m.drift_sd, m.drift_span_s, m.noise, m.noise_cv) == (0.01, 1e-4, 0.08, 20.0, "gamma", 0.3)
    m = parse_step_time("0.1:noise=exp:drift=0.1")
    assert (m.c0, m.noise, m.drift_sd, m.drift_span_s) == (0.1, "exp", 0.1, 10.0)
    assert parse_step_time(parse_step_time("linear:c0=0.01").with_drift(0.07).spec).drift_sd == 0.07
    again = parse_step_time(parse_step_time("0.1:drift=0.3:span=5:noise=exp").with_drift(0.07).spec)
    assert (again.drift_sd, again.drift_span_s, again.noise) == (0.07, 10.0, "exp")
    for bad, needle in [("0.1:drift=x", "not a number"), ("0.1:drift=0.1:foo=2", "unknown key"),
                        ("0.1:drift=0.1:drift=0.2", "twice"), ("drift=0.1", "no step-time model")]:
        with pytest.raises(InputError, match=needle):
            parse_step_time(bad)


def _one_at_a_time(lam: float, b: float, step: str, n: int, seed: int = 1):
    """One request at a time, one step per request (prompt 1, output 1): a single FCFS server."""
    cfg = EngineConfig.from_capacity(10_000, block_size=16, max_num_seqs=1)
    reqs = Workload(f"poisson:{lam}", prompt="fixed:1", output="fixed:1").generate(seed, n=n)
    res = simulate(cfg, step, reqs, options=SimOptions(seed=seed, sample_dt=0.0))
    return reqs, res


def test_single_server_with_drift_matches_the_recursion_with_window_speeds():
    """Each request's service is one step of ``b x f(window of its start)``: the FCFS recursion
    ``start_k = max(a_k, finish_{k-1})``, computed here by hand, gives every request's times."""
    b, span, sd, seed = 0.1, 7.0, 0.3, 5
    reqs, res = _one_at_a_time(7.0, b, f"{b}:drift={sd}:span={span}", 3000, seed)
    speed = DriftStream(sd, span, seed)
    a = np.asarray(reqs.arrival_s)
    start, finish = np.empty(len(a)), np.empty(len(a))
    free = 0.0
    for k, t in enumerate(a):
        start[k] = max(t, free)
        free = finish[k] = start[k] + b * speed.at(start[k])
    r = res.requests
    order = np.argsort(np.asarray(r["request_id"]))
    np.testing.assert_allclose(np.asarray(r["first_scheduled_s"])[order], start, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(r["finish_s"])[order], finish, rtol=1e-9, atol=1e-9)
    # and the drift is not a no-op: without it the finish times differ
    _, steady = _one_at_a_time(7.0, b, str(b), 3000, seed)
    assert not np.allclose(np.asarray(steady.requests["finish_s"]), np.asarray(r["finish_s"]))


def test_slow_drift_waits_are_the_mixture_of_md1_queues_and_longer_than_a_steady_engine():
    """Windows much longer than the queue's relaxation time: each window is an M/D/1 queue at
    its own speed, ``Wq_j = rho_j S_j / (2 (1 - rho_j))`` with ``S_j = b f_j``, ``rho_j = lam S_j``;
    the run's mean wait is their mean over the windows (equal arrivals in each). By Jensen
    that exceeds the steady engine's M/D/1 wait at the same mean speed."""
    lam, b, sd, span, seed = 6.0, 0.1, 0.2, 400.0, 7
    windows = 40
    reqs, res = _one_at_a_time(lam, b, f"{b}:drift={sd}:span={span}", int(lam * span * windows), seed)
    speed = DriftStream(sd, span, seed)
    f = np.array([speed.at(span * (j + 0.5)) for j in range(windows)])
    assert lam * b * f.max() < 0.95  # every window stable, so the quasi-static picture holds
    S = b * f
    rho = lam * S
    mixture = float(np.mean(rho * S / (2 * (1 - rho))))
    steady = (lam * b) * b / (2 * (1 - lam * b))
    r = res.requests
    wait = np.asarray(r["first_scheduled_s"]) - np.asarray(r["arrival_s"])
    a = np.asarray(r["arrival_s"])
    keep = a < span * windows
    assert wait[keep].mean() == pytest.approx(mixture, rel=0.08)
    assert mixture > 1.2 * steady  # the effect is there to be measured, not within the tolerance
    _, st = _one_at_a_time(lam, b, str(b), int(lam * span * windows), seed)
    w0 = np.asarray(st.requests["first_scheduled_s"]) - np.asarray(st.requests["arrival_s"])
    assert w0.mean() == pytest.approx(steady, rel=0.05)


def test_drift_keeps_the_mean_speed_of_a_batching_engine():
    """A saturated engine with drift completes about as many requests as without it (mean-one
    factors), while its step durations spread by the drift's CV window to window."""
    cfg = EngineConfig.from_capacity(4096, block_size=16, max_num_batched_tokens=512)
    reqs = Workload("poisson:40", prompt="uniform:10:200", output="uniform:10:200").generate(1, duration=600)
    step = "linear:c0=0.02:prefill=1e-5:decode=2e-4"
    opts = dict(horizon_s=600.0, sample_dt=0.0)
    base = simulate(cfg, step, reqs, options=SimOptions(seed=1, **opts))
    drifted = simulate(cfg, f"{step}:drift=0.1:span=10", reqs, options=SimOptions(seed=1, **opts))
    done = [int((np.asarray(x.requests["status"]) == "ok").sum()) for x in (base, drifted)]
    assert done[1] == pytest.approx(done[0], rel=0.05)
    s = drifted.steps
    model = parse_step_time(step)
    k = np.asarray(s["steps"], dtype=float)
    one = (k == 1)
    ratio = np.asarray(s["duration_s"])[one] / np.array([  # the model has no context term
        model.base(p, d, 0) for p, d in zip(np.asarray(s["prefill_tokens"])[one], np.asarray(s["decode_seqs"])[one])])
    window = (np.asarray(s["start_s"])[one] // 10).astype(int)
    per_window = np.array([ratio[window == w].mean() for w in np.unique(window)])
    assert np.allclose([ratio[window == w].std() for w in np.unique(window)], 0.0, atol=1e-9)  # constant in a window
    assert per_window.std(ddof=1) == pytest.approx(0.1, rel=0.35)
    assert math.isclose(float(np.mean(per_window)), 1.0, abs_tol=0.05)
