"""The replica contract (``llmqueue.engine.api``): the fleet drives replicas through it alone.

Two checks. (1) The reference replica, the executable specification that shares no scheduling
code with the fast one, runs behind the same fleet (routers, lanes, the gateway, P/D, an
autoscaler, faults, client timeouts and retries) and gives the same records. (2) A replica that
offers nothing but the contract (every other attribute raises) runs a fleet to the end: the
fleet reads no replica internals, which is what lets a live engine stand in a slot.
"""

import numpy as np
import pytest

from llmqueue.cluster import simulate_fleet
from llmqueue.cluster.fleet import _Fleet
from _fleet_cases import CASES, KV_BOUND, STEP
from _fleet_cases import mixed as _mixed
from llmqueue.engine.api import ReplicaLoad
from llmqueue.engine.reference import ReferenceReplica
from llmqueue.workload import Workload

FLOAT_COLS = ("arrival_s", "dispatched_s", "first_scheduled_s", "first_token_s", "finish_s")


def _compare(a, b):
    ra, rb = a.requests, b.requests
    assert set(ra) == set(rb)
    assert len(ra["request_id"]) == len(rb["request_id"])
    for c, x in ra.items():
        y = rb[c]
        if c in FLOAT_COLS or c in ("kv_transfer_s", "decode_scheduled_s"):
            assert (np.isnan(x) == np.isnan(y)).all(), c
            m = ~np.isnan(x)
            np.testing.assert_allclose(x[m], y[m], rtol=1e-9, atol=1e-7, err_msg=c)
        else:
            assert (x == y).all(), c
    assert a.num_steps == b.num_steps
    assert a.steps["steps"].sum() == b.steps["steps"].sum() == a.num_steps
    for c in ("prefill_tokens", "preempted"):
        assert a.steps[c].sum() == b.steps[c].sum(), c
    assert (a.steps["decode_seqs"] * a.steps["steps"]).sum() == b.steps["decode_seqs"].sum()
    np.testing.assert_allclose(a.steps["duration_s"].sum(), b.steps["duration_s"].sum(), rtol=1e-9)
    if a.pools is not None:
        for c in a.pools:
            assert (a.pools[c] == b.pools[c]).all(), c


@pytest.mark.parametrize("case", list(CASES))
def test_the_reference_replica_behind_the_same_fleet_gives_the_same_records(case):
    make, opts = CASES[case]
    reqs = _mixed(11)
    fast = simulate_fleet(make(), reqs, options=opts)
    ref = simulate_fleet(make(), reqs, options=opts, reference=True)
    _compare(fast, ref)
    st = fast.requests["status"]
    assert (st == "ok").sum() > 0.3 * len(st)


def test_the_cases_exercise_what_they_name():
    """The equivalence above is not vacuous: preemptions, rejections, fallbacks, timeouts, errors
    and scaling all happen in the cases that name them."""
    reqs = _mixed(11)
    r = simulate_fleet(CASES["router-least-kv"][0](), reqs, options=CASES["router-least-kv"][1])
    assert r.requests["preemptions"].sum() > 0
    g = simulate_fleet(CASES["lanes-gateway"][0](), reqs, options=CASES["lanes-gateway"][1])
    assert (g.requests["status"] == "rejected").any() and g.fleet["fallbacks"] > 0
    a = simulate_fleet(CASES["autoscale-fault-retry"][0](), reqs, options=CASES["autoscale-fault-retry"][1])
    st = a.requests["status"]
    assert (st == "timeout").any() and (st == "error").any() and (a.requests["attempt"] > 1).any()
    assert a.fleet["scale_events"]


CONTRACT = ("submit", "accept", "step_at", "next_event_time", "load", "count_waiting", "drain", "run", "steps_taken",
            "step_chunks", "timeseries_chunks", "tier_account", "close")


class ContractOnly:
    """A replica that offers the contract and nothing else (a stand-in for a live engine)."""

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_inner", ReferenceReplica(*args, **kwargs))

    def __getattr__(self, name):
        if name in CONTRACT:
            return getattr(self._inner, name)
        raise AssertionError(f"the fleet read {name!r}, which is not in the replica contract")

    def __setattr__(self, name, value):
        raise AssertionError(f"the fleet set {name!r} on a replica")


@pytest.mark.parametrize("case", ["router-least-kv", "router-central", "lanes-gateway", "pd",
                                  "autoscale-fault-retry"])
def test_the_fleet_reads_replicas_only_through_the_contract(case):
    make, opts = CASES[case]
    reqs = _mixed(12, n=300)
    res = _Fleet(make(), opts, seed=opts.seed, horizon_s=None, sample_dt=opts.sample_dt, columns=True,
                 replica_cls=ContractOnly).run(reqs)
    ref = simulate_fleet(make(), reqs, options=opts)
    _compare(ref, res)


def test_load_is_the_same_numbers_on_both_replicas():
    """Mid-run, step by step on a shared clock, both replicas report the same load."""
    from llmqueue.engine.fast.replica import Replica

    reqs = Workload("poisson:40", prompt="uniform:50:600", output="uniform:5:60").generate(seed=1, n=200)
    fast, ref = Replica(KV_BOUND, STEP, seed=1), ReferenceReplica(KV_BOUND, STEP, seed=1)
    from llmqueue.engine.stream import RequestStream

    pairs = [RequestStream(reqs).requests() for _ in range(2)]
    seen = 0
    for a, b in zip(*pairs):
        t = a.arrival_time
        fast.step_at(t), ref.step_at(t)
        wa, wb = fast.accept(a), ref.accept(b)
        assert wa == wb
        la, lb = fast.load(), ref.load()
        assert la == lb, (t, la, lb)
        assert la.kv_blocks_total == KV_BOUND.num_kv_blocks
        seen += la.num_running > 1 and la.num_waiting > 0
    assert seen > 10  # a loaded replica, queue and batch both non-empty
    assert fast.count_waiting("default") == ref.count_waiting("default") == fast.load().num_waiting
    held = fast.drain()
    assert [r.request_id for r in held] == [r.request_id for r in ref.drain()]
    assert len(held) == la.num_running + la.num_waiting


def test_a_replica_load_reads_as_numbers():
    x = ReplicaLoad(3, 5, 25, 100, busy=True)
    assert x.kv_usage == 0.75 and x.age_s == 0.0
    assert x == ReplicaLoad(3, 5, 25, 100, True) != ReplicaLoad(3, 5, 24, 100, True)
    assert "num_waiting=3" in repr(x)
