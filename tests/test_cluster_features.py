"""The fleet's parts checked against closed forms and hand-computed outcomes: P/D as a tandem
(Jackson) network, lanes, the gateway's token bucket and admission, the autoscaler, faults."""

import math

import numpy as np
import pytest

from llmqueue.cluster import simulate_fleet
from llmqueue.cluster.spec import (Autoscaler, Disaggregation, Fallback, Fault, FleetSpec, Gateway, Lane, Pool,
                                   RateLimit)
from llmqueue.engine import EngineConfig
from llmqueue.engine.options import SimOptions
from llmqueue.errors import InputError
from llmqueue.metrics.ci import batch_means_ci
from llmqueue.workload import Workload
from llmqueue.workload.generate import RequestArrays

ONE = EngineConfig.from_capacity(1 << 30, max_num_seqs=1)


def _pd(step="exp:0.1", link=None, p=1, d=1, config=ONE, kvb=0.0):
    return FleetSpec(pools=[Pool("prefill", config, step, p, "least-outstanding", role="prefill", kv_bytes_per_token=kvb),
                            Pool("decode", config, step, d, "least-outstanding", role="decode", kv_bytes_per_token=kvb)],
                     disaggregation=Disaggregation("prefill", "decode", **(link or {})))


def test_pd_is_a_tandem_of_two_mm1_queues():
    """Prompt 1, output 2: the prefill pool makes the first token in one exponential step (mean
    0.1 s), the decode pool the second in another; Poisson 5 req/s through two M/M/1 queues in
    series (Jackson): each W = 1 / (mu - lam) = 0.2 s, so mean E2EL = 0.4 s."""
    reqs = Workload("poisson:5", prompt="fixed:1", output="fixed:2").generate(seed=3, n=60_000)
    r = simulate_fleet(_pd(), reqs, options=SimOptions(seed=2, sample_dt=0))
    q = r.requests
    keep = q["arrival_s"] > 100
    assert (q["status"] == "ok").all() and (q["output_tokens"] == 2).all()
    assert set(q["pool"]) == {"decode"} and (q["prefill_replica"] == 0).all() and (q["replica"] == 1).all()
    e2el = q["finish_s"][keep] - q["arrival_s"][keep]
    ci = batch_means_ci(e2el)
    assert ci.lo <= 0.4 <= ci.hi, (ci.estimate, ci.lo, ci.hi)
    # the first token comes from the prefill pool: TTFT is the first queue's sojourn, 0.2 s
    ttft = q["first_token_s"][keep] - q["arrival_s"][keep]
    ci = batch_means_ci(ttft)
    assert ci.lo <= 0.2 <= ci.hi, (ci.estimate, ci.lo, ci.hi)
    # the two sojourns are independent exponentials of rate mu - lam = 5 (Reich): E2EL is Erlang-2,
    # P(E2EL > t) = exp(-5t) (1 + 5t); at t = 0.6 that is 0.199
    t = 0.6
    tail = math.exp(-5 * t) * (1 + 5 * t)
    ci = batch_means_ci((e2el > t).astype(float))
    assert ci.lo <= tail <= ci.hi, (ci.estimate, tail)


def test_the_kv_link_is_a_fifo_queue():
    """A slow link (1 GB/s = 8 Gbps, 1 ms latency) and 1e6 bytes per token: a 1000-token prompt's
    KV takes 1 s on the link, so two prefills ending together deliver 1.001 s and 2.001 s later."""
    cfg = EngineConfig.from_capacity(1 << 20, max_num_seqs=4)
    reqs = RequestArrays([0, 1], [0.0, 0.0], [1000, 1000], [3, 3])
    spec = _pd(step=0.05, link=dict(kv_link_gbps=8.0, kv_link_latency_ms=1.0), config=cfg, kvb=1e6)
    q = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=0)).requests
    assert sorted(np.round(q["kv_transfer_s"], 6)) == [1.001, 2.001]
    assert (q["status"] == "ok").all()
    # decode: two more tokens after the KV arrives, at 0.05 s a step
    assert np.allclose(np.sort(q["finish_s"]), [0.05 + 1.001 + 0.1, 0.05 + 2.001 + 0.1])


def test_lanes_send_classes_to_their_pools():
    cfg = EngineConfig.from_capacity(1 << 20, max_num_seqs=8)
    rng = np.random.default_rng(1)
    n = 400
    reqs = RequestArrays(np.arange(n), np.cumsum(rng.exponential(0.05, n)), np.full(n, 100), np.full(n, 10),
                         rng.choice(["chat", "batch"], n))
    spec = FleetSpec(pools=[Pool("fast", cfg, 0.01, 2, model="big"), Pool("bulk", cfg, 0.01, 1, model="small")],
                     lanes=[Lane("interactive", "fast", classes=("chat",)), Lane("rest", "bulk")])
    q = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=1.0))
    r = q.requests
    chat = r["class"] == "chat"
    assert chat.any() and (~chat).any()
    assert set(r["pool"][chat]) == {"fast"} and set(r["pool"][~chat]) == {"bulk"}
    assert set(r["model"][chat]) == {"big"} and set(r["lane"][~chat]) == {"rest"}
    assert set(r["replica"][chat]) <= {0, 1} and set(r["replica"][~chat]) == {2}
    assert q.pools is not None and set(q.pools["pool"]) == {"fast", "bulk"}


def test_token_bucket_admits_rate_times_t_plus_burst():
    """A (sigma, rho) regulator: 10 req/s with burst 5 over 10 s of 100 req/s admits about
    5 + 10 x 10 = 105 requests; the others are rejected as rate limited."""
    reqs = Workload("poisson:100", prompt="fixed:10", output="fixed:2").generate(seed=1, duration=10)
    cfg = EngineConfig.from_capacity(1 << 20, max_num_seqs=256)
    spec = FleetSpec(pools=[Pool("p", cfg, 0.001, 1)], gateway=Gateway(rate_limits={"*": RateLimit(10.0, 5.0)}))
    r = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=0)).requests
    ok = (r["status"] == "ok").sum()
    assert 100 <= ok <= 106, ok
    assert (r["status"] == "rejected").sum() == len(r["status"]) - ok


def test_queue_depth_admission_bounds_the_waiting_room():
    """Twice the capacity arrives; admission at 4 waiting per replica keeps the wait bounded
    (about 4 service times) and rejects the excess."""
    reqs = Workload("poisson:20", prompt="fixed:1", output="fixed:1").generate(seed=2, duration=200)
    spec = FleetSpec(pools=[Pool("p", ONE, 0.1, 1)], gateway=Gateway(max_queue_depth=4))
    r = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=0)).requests
    ok = r["status"] == "ok"
    wait = r["first_scheduled_s"][ok] - r["arrival_s"][ok]
    assert wait.max() <= 0.1 * 6 + 1e-9
    assert 0.4 < (r["status"] == "rejected").mean() < 0.6


def test_fallback_moves_load_when_the_queue_ages():
    reqs = Workload("poisson:20", prompt="fixed:1", output="fixed:1").generate(seed=2, duration=100)
    spec = FleetSpec(pools=[Pool("main", ONE, 0.1, 1, model="big", quality=1.0),
                            Pool("small", ONE, 0.1, 1, model="tiny", quality=0.7)],
                     lanes=[Lane("all", "main")],
                     gateway=Gateway(fallbacks=[Fallback("main", "small", queue_age_s=0.5)]))
    res = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=0))
    r = res.requests
    small = r["model"] == "tiny"
    assert 0.2 < small.mean() < 0.8
    assert res.fleet["fallbacks"] == small.sum()
    assert (r["status"] == "ok").mean() > 0.99


def test_autoscaler_adds_replicas_after_the_provisioning_delay():
    """A pool of 1 replica (mu = 10 req/s) takes 25 req/s: the autoscaler (waiting per replica,
    target 2) orders replicas at its first evaluation (t = 5 s); they serve ``delay`` later. What
    queued on the first replica meanwhile stays there (no work stealing): the queue carries memory,
    so a longer delay gives a higher peak and a later drain."""
    reqs = Workload("poisson:25", prompt="fixed:1", output="fixed:1").generate(seed=2, duration=120)
    peak, drained = {}, {}
    for delay in (0.0, 30.0):
        spec = FleetSpec(pools=[Pool("p", ONE, 0.1, 1)],
                         autoscalers=[Autoscaler("p", metric="waiting", target=2.0, interval_s=5.0,
                                                 provisioning_delay_s=delay, cooldown_s=300.0, min_replicas=1,
                                                 max_replicas=6)])
        res = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=1.0, horizon_s=120))
        ps = res.pools
        up = ps["replicas"]
        first = res.fleet["scale_events"][0]
        assert first[0] == 5.0 and first[2:] == [1, 6]  # ceil(1 x waiting / 2) capped at 6
        t_up = ps["t_s"][np.argmax(up > 1)]
        assert delay + 5.0 <= t_up <= delay + 6.0
        assert (ps["provisioning"][(ps["t_s"] > 5) & (ps["t_s"] < t_up)] == 5).all()
        waiting = ps["num_waiting"]
        peak[delay] = waiting.max()
        drained[delay] = ps["t_s"][np.argmax((ps["t_s"] > t_up) & (waiting == 0))]
    # the backlog grows at lam - mu = 15 req/s until the new replicas serve
    assert peak[0.0] < 15 * 8 < 15 * 30 < peak[30.0]
    assert drained[0.0] < drained[30.0]


def test_a_fault_retries_in_flight_requests_elsewhere():
    reqs = Workload("poisson:8", prompt="fixed:1", output="fixed:20").generate(seed=2, duration=60)
    cfg = EngineConfig.from_capacity(1 << 20, max_num_seqs=16)
    spec = FleetSpec(pools=[Pool("p", cfg, 0.01, 2, "round-robin")],
                     faults=[Fault("p", 1, at_s=20.0, repair_s=10.0, inflight="retry")])
    res = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=1.0))
    r = res.requests
    err = r["status"] == "error"
    assert err.any() and (r["replica"][err] == 1).all() and np.allclose(r["finish_s"][err], 20.0)
    # each failed attempt came back as attempt 2 on replica 0 and finished
    for rid in r["request_id"][err]:
        again = (r["request_id"] == rid) & (r["attempt"] == 2)
        assert again.sum() == 1 and r["status"][again][0] == "ok" and r["replica"][again][0] == 0
    # nothing goes to replica 1 while it is down; it serves again after the repair
    on1 = r["replica"] == 1
    assert not ((r["arrival_s"][on1] > 20.0) & (r["arrival_s"][on1] < 30.0)).any()
    assert (r["arrival_s"][on1] > 30.0).any()


def test_bad_fleet_descriptions_name_the_field():
    cfg = ONE
    with pytest.raises(InputError, match=r"lanes\[0\]\.pool"):
        FleetSpec(pools=[Pool("a", cfg, 0.1)], lanes=[Lane("x", "b")])
    with pytest.raises(InputError, match="without a decode pool"):
        FleetSpec(pools=[Pool("a", cfg, 0.1, role="prefill")])
    with pytest.raises(InputError, match=r"autoscalers\[0\]\.provisioning_delay_s"):
        FleetSpec(pools=[Pool("a", cfg, 0.1)], autoscalers=[Autoscaler("a", provisioning_delay_s=-1)])
    with pytest.raises(InputError, match=r"pools\[0\]\.router"):
        FleetSpec(pools=[Pool("a", cfg, 0.1, router="nearest")])


def test_the_fleet_counts_return_to_zero_when_every_request_has_left():
    """Outstanding requests, the prefill backlog and the per-class counts the routers and the
    gateway read are kept incrementally; after a run that ends with every request gone (timeouts,
    retries, a fault, a P/D hand-over) they are all zero again."""
    from llmqueue.cluster.fleet import _Fleet

    cfg = EngineConfig.from_capacity(1 << 16, max_num_seqs=8)
    reqs = Workload("poisson:80", prompt="uniform:10:400", output="uniform:1:40").generate(seed=4, n=3000)
    spec = FleetSpec(pools=[Pool("p", cfg, "exp:0.02", 2, "least-prefill", role="prefill"),
                            Pool("d", cfg, "exp:0.02", 2, "least-outstanding", role="decode"),
                            Pool("m", cfg, "exp:0.02", 2, "power-of-two")],
                     lanes=[Lane("short", "m", prompt_max=100), Lane("long", "p")],
                     disaggregation=Disaggregation("p", "d"),
                     faults=[Fault("m", 0, at_s=20.0, repair_s=5.0, inflight="retry")])

    def retry(request_id, attempt, status, t_end):
        return t_end + 0.5 if attempt < 3 else None

    opts = SimOptions(sample_dt=0, timeout_s={"default": 2.0}, ttft_timeout_s={"default": 0.5}, retry=retry)
    f = _Fleet(spec, opts, seed=1, horizon_s=None, sample_dt=0.0, columns=True)
    res = f.run(reqs)
    st = res.requests["status"]
    assert (st == "timeout").any() and (st == "error").any() and (st == "ok").any()
    assert not (st == "unfinished").any()
    for pool in f.pools:
        assert all(x == 0 for x in pool.outstanding), (pool.name, pool.outstanding)
        assert all(x == 0 for x in pool.pending_prefill), (pool.name, pool.pending_prefill)
        assert all(v == 0 for v in pool.by_class.values()), (pool.name, pool.by_class)


def test_a_batch_window_sends_a_lane_together():
    """A static window of 2 s: every request of the batch lane is held at most 2 s and the batch
    leaves together; with batch_size 5 (dynamic) none waits for more than five to gather."""
    cfg = EngineConfig.from_capacity(1 << 20, max_num_seqs=64)
    rng = np.random.default_rng(3)
    n = 600
    reqs = RequestArrays(np.arange(n), np.cumsum(rng.exponential(0.1, n)), np.full(n, 50), np.full(n, 5),
                         rng.choice(["chat", "batch"], n))
    for size in (0, 5):
        spec = FleetSpec(pools=[Pool("p", cfg, 0.01, 2)],
                         lanes=[Lane("offline", "p", classes=("batch",), batch_window_s=2.0, batch_size=size),
                                Lane("online", "p")])
        r = simulate_fleet(spec, reqs, options=SimOptions(sample_dt=0)).requests
        b = r["class"] == "batch"
        hold = r["dispatched_s"][b] - r["arrival_s"][b]
        assert (hold >= -1e-12).all() and hold.max() <= 2.0 + 1e-9
        assert np.allclose(r["dispatched_s"][~b], r["arrival_s"][~b])  # the online lane is not held
        groups = np.unique(np.round(r["dispatched_s"][b], 9), return_counts=True)[1]
        if size == 0:
            assert hold.max() > 1.9 and groups.mean() > 5  # about 1 + 2 s x 5 req/s per batch
        else:
            assert groups.max() <= 5 and (groups == 5).mean() > 0.5
    with pytest.raises(InputError, match=r"lanes\[0\]\.batch_size"):
        FleetSpec(pools=[Pool("p", cfg, 0.01)], lanes=[Lane("x", "p", batch_size=4)])


def test_an_autoscaler_reading_queue_age_in_also_gets_the_age():
    """``also: {queue_age: X}`` makes the fleet track first tokens, so the age it reads is the
    pool's (it read 0 when only ``metric`` was looked at, and never scaled)."""
    from llmqueue.cluster.gateway import uses_queue_age

    def scaled(also):
        a = Autoscaler("p", metric="waiting", target=1000.0, also=also, interval_s=1.0, max_replicas=4)
        assert uses_queue_age(None, [a]) == bool(also)
        spec = FleetSpec(pools=[Pool("p", ONE, 0.1, 1)], autoscalers=[a])
        reqs = Workload("poisson:30", prompt="fixed:1", output="fixed:1").generate(seed=1, n=300)
        return simulate_fleet(spec, reqs, options=SimOptions(sample_dt=0, horizon_s=8.0)).fleet["scale_events"]

    assert scaled({"queue_age": 0.5})  # 30 req/s into 10 req/s: the head's wait passes 0.5 s
    assert not scaled({})
