"""Weighted fair queueing by tokens at the gateway (``llmqueue.cluster.fairness``), checked
against the generalized-processor-sharing shares it should converge to."""

import numpy as np
import pytest

from llmqueue.cluster import simulate_fleet
from llmqueue.cluster.fairness import FairQueue
from llmqueue.cluster.spec import FleetSpec, Gateway, Pool
from llmqueue.engine import EngineConfig
from llmqueue.engine.options import SimOptions
from llmqueue.engine.request import Request
from llmqueue.workload import Workload
from llmqueue.workload.generate import RequestArrays


def _req(rid, tenant, prompt=10):
    return Request(rid, 0.0, prompt, 1, class_name=tenant)


def test_the_smallest_counter_goes_first_and_ties_to_the_first_backlogged():
    q = FairQueue({"b": 2.0})
    for i in range(3):
        q.append(_req(i, "a"))
        q.append(_req(10 + i, "b"))
    assert len(q) == 6 and q[0].request_id == 0  # equal counters: a was backlogged first
    served = []
    while q:
        r = q.popleft()
        served.append(r.class_name)
        q.charge(r.class_name, 10)  # a prompt of 10 tokens
    # b's counter grows half as fast: b, b after a's first (a 10, b 5, 10 -> a? tie to a; ...)
    assert served == ["a", "b", "b", "a", "b", "a"]


def test_an_idle_tenant_saves_no_credit():
    """A tenant returning after idling starts at the backlogged tenants' floor, not at its old,
    lower counter: it cannot burst past the others for as long as it was away."""
    q = FairQueue()
    q.append(_req(0, "a"))
    q.popleft()
    q.charge("a", 10)
    for i in range(20):  # b alone for a while
        q.append(_req(1 + i, "b"))
        q.charge("b", 10)
        q.popleft()
    q.append(_req(30, "b"))
    q.append(_req(31, "a"))  # a returns: lifted to b's counter (200), not left at 10
    assert q.counters["a"] == q.counters["b"] == 200.0
    assert q[0].class_name == "b"  # the tie goes to b, backlogged first


def test_only_the_head_is_shown():
    q = FairQueue()
    with pytest.raises(IndexError):
        q[0]
    q.append(_req(0, "a"))
    with pytest.raises(IndexError):
        q[1]
    assert [r.request_id for r in q] == [0]


def _two_tenants(rate_a, rate_b, n, seed=1):
    wa = Workload(f"poisson:{rate_a}", prompt="fixed:20", output="fixed:20", class_name="a").generate(seed=seed, n=n)
    wb = Workload(f"poisson:{rate_b}", prompt="fixed:20", output="fixed:20", class_name="b").generate(
        seed=seed + 1, n=n)
    return RequestArrays.merge(wa, wb)


ONE_SEQ = EngineConfig.from_capacity(1 << 20, max_num_seqs=1)


def _token_share(rec, tenant, t0, t1):
    """The tenant's share of the tokens served by requests that finished in [t0, t1)."""
    fin = rec["finish_s"]
    m = (rec["status"] == "ok") & (fin >= t0) & (fin < t1)
    tok = rec["prompt_tokens"][m] + rec["output_tokens"][m]
    return tok[rec["class"][m] == tenant].sum() / tok.sum()


@pytest.mark.parametrize("weights", [{"a": 1.0, "b": 3.0}, {"a": 1.0, "b": 1.0}, {"a": 2.0}])
def test_backlogged_tenants_get_their_gps_shares(weights):
    """Both tenants always backlogged (the pool serves about 47.6 req/s; a offers 150, b 50, each
    more than its share): the tokens served split as w_k / sum w (GPS), whatever the offered
    rates; FIFO splits them as offered (b 1/4)."""
    reqs = _two_tenants(150.0, 50.0, 9000)
    spec = FleetSpec(pools=[Pool("p", ONE_SEQ, 0.002, 2, "central")], gateway=Gateway(fair_share=weights))
    rec = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=0, horizon_s=60.0)).requests
    w_a, w_b = weights.get("a", 1.0), weights.get("b", 1.0)
    share = _token_share(rec, "b", 10.0, 60.0)
    assert share == pytest.approx(w_b / (w_a + w_b), abs=0.02)
    fifo = simulate_fleet(FleetSpec(pools=[Pool("p", ONE_SEQ, 0.002, 2, "central")]), reqs,
                          options=SimOptions(sample_dt=0, horizon_s=60.0)).requests
    assert _token_share(fifo, "b", 10.0, 60.0) == pytest.approx(0.25, abs=0.03)


def test_a_burst_does_not_starve_a_tenant_within_its_share():
    """Tenant b asks for less than its share; tenant a floods. Under fair queueing b's requests
    wait about one service time; under FIFO they wait behind a's whole backlog."""
    reqs = _two_tenants(200.0, 5.0, 3000)
    kw = dict(pools=[Pool("p", ONE_SEQ, 0.002, 2, "central")])
    opts = SimOptions(sample_dt=0, horizon_s=30.0)
    fair = simulate_fleet(FleetSpec(**kw, gateway=Gateway(fair_share={"a": 1, "b": 1})), reqs, options=opts).requests
    fifo = simulate_fleet(FleetSpec(**kw), reqs, options=opts).requests

    def b_wait(rec):
        m = (rec["class"] == "b") & (rec["status"] == "ok")
        return np.median(rec["first_scheduled_s"][m] - rec["arrival_s"][m])

    service = 21 * 0.002  # prefill step + 20 decode steps
    assert b_wait(fair) < 2 * service < 10 * service < b_wait(fifo)


def test_forgetting_full_tenant_buckets_changes_no_decision(monkeypatch):
    """A client naming many tenants (keys, ``X-Tenant``): the gateway forgets the tenants whose
    buckets are full (a full bucket admits as a new one does) and decides exactly as when it keeps
    every one, with a bounded table."""
    import random

    from llmqueue.cluster import gateway as gwmod
    from llmqueue.cluster.gateway import GatewayRuntime
    from llmqueue.cluster.spec import TenantLimit

    spec = Gateway(tenant_limits={"*": TenantLimit(rate=2.0, burst=3.0, tokens_per_s=400.0, token_burst=900.0),
                                  "big": TenantLimit(rate=50.0, burst=20.0)})

    from types import SimpleNamespace

    view = SimpleNamespace(name="p")  # no rule here reads the pool

    def run(sweep_at):
        monkeypatch.setattr(gwmod, "TENANT_SWEEP", sweep_at)
        g = GatewayRuntime(spec)
        rng = random.Random(9)
        out, t, most = [], 0.0, 0
        for k in range(20_000):
            t += rng.expovariate(400.0)
            tenant = rng.choice(("big", f"hot{rng.randrange(5)}", f"new{k}" if rng.random() < 0.5 else f"warm{rng.randrange(40)}"))
            r = Request(k, t, rng.randrange(1, 300), rng.randrange(1, 400), class_name=tenant)
            _, why = g.decide(r, view, {"p": view}, t)
            out.append((why, round(g.retry_after_s, 12) if why else None))
            most = max(most, len(g.tenant_buckets))
        return out, most

    kept, n_kept = run(10**9)
    forgot, n_forgot = run(64)
    assert kept == forgot
    assert sum(1 for why, _ in kept if why) > 1000 and sum(1 for why, _ in kept if not why) > 1000  # both ways
    assert n_kept > 3000 and n_forgot < n_kept / 4, (n_kept, n_forgot)
