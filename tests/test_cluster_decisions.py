"""Decisions recorded with the view each saw, and replayed: fresh policy objects on the recorded
numbers make the same decisions (what a live gateway's run is checked with), and recording does
not change a run."""

import json

import numpy as np
import pytest

from _fleet_cases import CASES, mixed
from llmqueue.cluster import simulate_fleet
from llmqueue.cluster.decisions import DecisionLog, encode, fresh_policies, replay


@pytest.mark.parametrize("case", ["router-random", "router-least-kv", "router-central", "router-power-of-two",
                                  "lanes-gateway", "pd", "autoscale-fault-retry"])
def test_replaying_the_recorded_views_gives_every_decision_again(case):
    make, opts = CASES[case]
    reqs = mixed(21, n=400)
    log = DecisionLog()
    rec = simulate_fleet(make(), reqs, options=opts, decisions=log)
    plain = simulate_fleet(make(), reqs, options=opts)
    for c in ("status", "replica", "finish_s"):  # recording changes nothing
        np.testing.assert_array_equal(rec.requests[c], plain.requests[c])
    kinds = {r["kind"] for r in log.records}
    assert "route" in kinds and len(log.records) >= len(reqs)
    records = json.loads(json.dumps(log.records, default=encode))  # as a live run writes and reads them
    routers, gateway = fresh_policies(make(), opts.seed)
    again = replay(records, routers=routers, gateway=gateway)
    assert again == [r["out"] for r in records]


def test_a_replay_notices_a_different_policy():
    make, opts = CASES["router-least-kv"]
    log = DecisionLog()
    simulate_fleet(make(), mixed(21, n=400), options=opts, decisions=log)
    from llmqueue.cluster.routers import router

    again = replay(log.records, routers={"p": router("least-outstanding")})
    assert again != [r["out"] for r in log.records]


def test_gateway_decisions_are_recorded_with_every_pool_they_read():
    make, opts = CASES["lanes-gateway"]
    log = DecisionLog()
    simulate_fleet(make(), mixed(21, n=400), options=opts, decisions=log)
    admits = [r for r in log.records if r["kind"] == "admit"]
    assert admits and all(set(r["views"]) == {"fast", "bulk"} for r in admits)
    reasons = {r["out"][1] for r in admits}
    assert None in reasons and len(reasons) > 1  # admitted and refused, both recorded
