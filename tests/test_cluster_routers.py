"""The KV-aware routers (least-kv, prefix-affinity, session): their choices on hand-built views,
the load bound, consistent hashing's stability, and prefix-cache hits through a fleet."""

from types import SimpleNamespace

import numpy as np
import pytest

from llmqueue.cluster import ROUTERS, router, simulate_fleet
from llmqueue.cluster.affinity import PrefixAffinity, Session, load_cap, mix64, prefix_key
from llmqueue.cluster.view import PoolView
from llmqueue.engine import EngineConfig
from llmqueue.engine.api import ReplicaLoad
from llmqueue.engine.options import SimOptions
from llmqueue.engine.request import Request
from llmqueue.errors import InputError
from llmqueue.workload.generate import RequestArrays


def pool(outstanding, free=None, routable=None, total=100, pending=None):
    """A PoolView over stand-in replicas: ``outstanding`` per replica, ``free`` KV blocks each,
    ``pending`` prefill tokens each (0 unless given)."""
    n = len(outstanding)
    free = [total] * n if free is None else free
    loads = [ReplicaLoad(0, o, f, total) for o, f in zip(outstanding, free)]
    return PoolView("p", list(outstanding), list(range(n)) if routable is None else list(routable),
                    load=loads.__getitem__, max_num_seqs=8, kv_blocks_total=total, block_size=16,
                    pending_prefill=None if pending is None else list(pending))


def req(hash_ids=None, session_id=None, rid=0, prompt=100):
    r = Request(rid, 0.0, prompt, 10, hash_ids=None if hash_ids is None else tuple(hash_ids))
    r.session_id = session_id
    return r


def test_they_are_registered_and_the_knob_lists_every_router():
    from llmqueue.knobs import knob

    assert {"least-kv", "prefix-affinity", "session"} <= set(ROUTERS)
    assert set(ROUTERS) == set(knob("router").choices)
    for name in ("least-kv", "prefix-affinity", "session"):
        assert router(name, 3).name == name


def test_the_hash_is_splitmix64_and_keys_depend_on_the_leading_units_only():
    assert mix64(0) == 0xE220A8397B1DCDAF  # splitmix64's first output from state 0
    assert prefix_key((0, 7, 9), 2) == prefix_key((0, 7, 11, 12), 2) != prefix_key((0, 8, 9), 2)
    assert prefix_key((), 2) is None and prefix_key(None, 2) is None
    assert prefix_key((-1,), 1) == prefix_key(((1 << 64) - 1,), 1)  # ids taken mod 2**64


def test_least_kv_takes_the_most_free_blocks_then_fewest_outstanding_then_lowest_index():
    lk = router("least-kv")
    assert lk.route(req(), pool([5, 0, 0], free=[90, 40, 60])) == 0
    assert lk.route(req(), pool([3, 2, 2], free=[50, 50, 50])) == 1
    assert lk.route(req(), pool([0, 0, 0], free=[50, 50, 50])) == 0
    assert lk.route(req(), pool([0, 0, 0], free=[90, 40, 60], routable=[1, 2])) == 2


def hashing(**kw):
    """Prefix affinity as stateless consistent hashing (``new_keys="hash"``)."""
    return PrefixAffinity(new_keys="hash", **kw)


def test_prefix_affinity_hashing_is_deterministic_and_spreads_keys():
    a, b = PrefixAffinity(1, new_keys="hash"), PrefixAffinity(99, new_keys="hash")  # the seed does not move keys
    v = pool([0] * 4)
    picks = [a.route(req((0, k, k + 1)), v) for k in range(4000)]
    assert picks == [b.route(req((0, k, k + 1)), v) for k in range(4000)]
    shares = np.bincount(picks, minlength=4) / 4000
    np.testing.assert_allclose(shares, 0.25, atol=0.03)
    # every request of a prefix goes to one replica (load permitting)
    assert len({a.route(req((0, 42, x)), v) for x in range(50)}) == 1


def test_prefix_affinity_hashing_on_requests_spills_to_the_keys_second_choice_over_the_bound():
    pa = hashing(bound=1.25, load="requests")
    r = req((0, 5))
    key = prefix_key(r.hash_ids, 2)
    first, second, third = pa.order(key, [0, 1, 2, 3])[:3]
    out = [4, 4, 4, 4]
    v = pool(out)
    assert load_cap(v, 1.25) == pytest.approx(6.25)
    assert pa.route(r, v) == first
    out[first] = 7  # mean 4.75: cap 7.1875, still under
    assert pa.route(r, pool(out)) == first
    out[first] = 9  # mean 5.25: cap 7.8125
    assert pa.route(r, pool(out)) == second
    out[second] = 9  # mean 6.5: cap 9.375, the first is back under
    assert pa.route(r, pool(out)) == first
    out = [0, 0, 0, 0]
    out[first], out[second] = 12, 12  # mean 6: cap 8.75
    assert pa.route(r, pool(out)) == third
    # no bound: consistent hashing alone
    assert hashing(bound=float("inf"), load="requests").route(r, pool(out)) == first
    # the same view with the prefill backlog all 0: every replica is under the bound
    assert hashing(bound=1.25).route(r, pool(out)) == first


def test_prefix_affinity_hashing_bounds_the_prefill_backlog():
    pa = hashing(bound=1.25)
    r = req((0, 5), prompt=1000)
    first, second = pa.order(prefix_key(r.hash_ids, 2), [0, 1, 2, 3])[:2]
    pend = [2000, 2000, 2000, 2000]  # mean 2000: cap 1.25 * (2000 + 1000) = 3750
    assert pa.cap(pool([0] * 4, pending=pend), pend, 1000) == pytest.approx(3750)
    pend[first] = 3800  # mean 2450: cap 4312.5, under
    assert pa.route(r, pool([9, 0, 0, 0], pending=pend)) == first
    pend[first] = 6000  # mean 3000: cap 5000, over: its second choice, whatever the request counts
    out = [0, 0, 0, 0]
    out[second] = 50
    assert pa.route(r, pool(out, pending=pend)) == second


def test_a_replica_leaving_moves_only_its_keys():
    pa = hashing()
    keys = [(0, k) for k in range(3000)]
    before = [pa.route(req(h), pool([0] * 5)) for h in keys]
    after = [pa.route(req(h), pool([0] * 5, routable=[0, 1, 3, 4])) for h in keys]
    moved = [i for i, (x, y) in enumerate(zip(before, after)) if x != y]
    assert moved and all(before[i] == 2 for i in moved) and 2 not in after
    assert len(moved) == before.count(2)
    # the moved keys spread over the rest (their second choices), not onto one neighbour
    assert len({after[i] for i in moved}) == 4


def test_requests_without_prefix_ids_go_to_the_least_loaded_replica():
    v = pool([3, 1, 2, 1])
    for name in ("prefix-affinity", "session"):
        rt = router(name)
        assert rt.route(req(None), v) == 1 and rt.route(req(()), v) == 1
        assert rt.route(req(None), pool([3, 1, 2, 0], routable=[0, 1, 2])) == 1
    # prefix affinity's load is the prefill backlog (ties: fewest outstanding); session counts requests
    v = pool([3, 1, 2, 1], pending=[0, 900, 0, 50])
    assert router("prefix-affinity").route(req(None), v) == 2
    assert router("session").route(req(None), v) == 1
    assert PrefixAffinity(load="requests").route(req(None), v) == 1


def test_a_new_key_goes_to_the_least_prefill_backlog_and_its_later_requests_follow():
    pa = router("prefix-affinity")
    r = req((0, 7, 8), prompt=1000)
    v = pool([1, 5, 0, 2], pending=[3000, 0, 4000, 500])  # replica 1: most requests, least backlog
    assert pa.route(r, v) == 1
    # later requests of the key (a longer prompt, same two leading units) stay while under the bound
    later = req((0, 7, 8, 9, 10), prompt=2500)
    assert pa.route(later, pool([1, 5, 0, 2], pending=[0, 4000, 0, 0])) == 1  # cap 1.25 * (1000 + 2500)
    # over the bound (mean 1275: cap 4718.75): spill to the least backlog, and the key moves there
    assert pa.route(later, pool([1, 5, 0, 2], pending=[100, 5000, 0, 0])) == 2
    assert pa.homes[prefix_key(later.hash_ids, 2)] == 2
    assert pa.route(later, pool([0, 0, 0, 0], pending=[0, 0, 3000, 0])) == 2  # cap 1.25 * (750 + 2500)
    # the key's replica is not routable: placed as a new key
    assert pa.route(later, pool([0, 0, 0, 0], pending=[900, 0, 0, 800], routable=[0, 3])) == 3
    # a different key is new: least backlog, ties to fewest outstanding, then lowest index
    assert pa.route(req((0, 70)), pool([2, 1, 1, 3], pending=[0, 0, 0, 0])) == 1


def test_prefix_affinity_forgets_the_least_recently_routed_key_first():
    pa = PrefixAffinity(max_keys=2)
    v = pool([0, 0, 0])
    for k in (1, 2, 1, 3):  # key 1 routed again before key 3 arrives: key 2 is the oldest
        pa.route(req((0, k)), v)
    assert list(pa.homes) == [prefix_key((0, 1), 2), prefix_key((0, 3), 2)]


def test_a_session_sticks_to_its_first_turns_replica_under_the_bound():
    s = Session()
    assert s.route(req((0, 1), session_id=7), pool([2, 0, 1])) == 1  # first turn: JSQ, pinned
    assert s.route(req((0, 9), session_id=7), pool([0, 2, 0])) == 1  # sticks (cap 2.08)
    assert s.route(req((0, 9), session_id=7), pool([0, 4, 1])) == 0  # over the bound (cap 3.33): re-pinned
    assert s.route(req(None, session_id=7), pool([2, 0, 2])) == 0   # the new pin
    assert s.route(req(None, session_id=7), pool([2, 0, 2], routable=[1, 2])) == 1  # its replica left
    # without a session id the leading prefix is the session
    assert s.route(req((0, 50, 51)), pool([1, 1, 0])) == 2
    assert s.route(req((0, 50, 51, 52)), pool([1, 0, 1])) == 2
    assert s.key(req((0, 50), session_id=3)) != s.key(req((0, 50)))


def test_session_pins_are_bounded():
    s = Session(max_sessions=3)
    v = pool([0, 0])
    for sid in range(5):
        s.route(req(session_id=sid), v)
    assert list(s.pins) == [(0, 2), (0, 3), (0, 4)]


def test_bad_router_arguments_are_one_line():
    with pytest.raises(InputError, match="load bound"):
        PrefixAffinity(bound=0.5)
    with pytest.raises(InputError, match="load must be"):
        PrefixAffinity(load="tokens")
    with pytest.raises(InputError, match="new_keys"):
        PrefixAffinity(new_keys="random")
    with pytest.raises(InputError, match="max_keys"):
        PrefixAffinity(max_keys=0)
    with pytest.raises(InputError, match="prefix_units"):
        Session(prefix_units=0)


# --- end to end: a fleet with prefix caching ---------------------------------------------------

H = 64  # tokens per prefix unit


def conversations(n_conv=48, turns=6, seed=0):
    """Multi-turn chats: every prompt starts with a shared system unit (id 0), then the
    conversation's history (each turn repeats the earlier turns' units and adds 3 new ones).
    Conversations start as a Poisson stream; a turn follows the previous after a think time."""
    rng = np.random.default_rng(seed)
    rows = []
    t0 = np.cumsum(rng.exponential(0.15, n_conv))
    for c in range(n_conv):
        t = t0[c]
        for k in range(turns):
            units = 1 + 3 * (k + 1)
            hashes = [0] + [c * 1000 + 1 + u for u in range(units - 1)]
            rows.append((t, units * H, int(rng.integers(8, 24)), hashes, c))
            t += rng.exponential(1.0)
    rows.sort(key=lambda x: x[0])
    reqs = RequestArrays(np.arange(len(rows)), [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    return reqs, [r[3] for r in rows], np.asarray([r[4] for r in rows])


def run(reqs, hashes, name):
    cfg = EngineConfig.from_capacity(4096, block_size=16, max_num_batched_tokens=512, max_num_seqs=16,
                                     enable_prefix_caching=True)
    opts = SimOptions(hash_ids=hashes, hash_block_tokens=H, seed=1)
    return simulate_fleet(cfg, "linear:c0=0.005:prefill=2e-5:decode=2e-4", reqs, replicas=4, router=name,
                          options=opts).requests


@pytest.fixture(scope="module")
def chats():
    reqs, hashes, conv = conversations()
    return reqs, hashes, conv, {name: run(reqs, hashes, name) for name in
                                ("round-robin", "prefix-affinity", "session", "least-kv")}


def hit_rate(q):
    return q["cached_prompt_tokens"].sum() / q["prompt_tokens"].sum()


def test_prefix_affinity_hits_the_cache_far_more_than_round_robin(chats):
    _, _, _, res = chats
    rates = {k: hit_rate(q) for k, q in res.items()}
    for q in res.values():
        assert (q["status"] == "ok").all() and set(np.unique(q["replica"])) == {0, 1, 2, 3}
    assert rates["prefix-affinity"] > 1.5 * rates["round-robin"], rates
    assert rates["session"] > 1.5 * rates["round-robin"], rates


def test_a_conversation_stays_on_one_replica_under_affinity(chats):
    _, _, conv, res = chats
    for name in ("prefix-affinity", "session"):
        q = res[name]
        order = np.argsort(q["request_id"])
        rep = q["replica"][order]
        # most conversations never leave their replica (the bound may spill a few turns)
        stays = np.mean([len(set(rep[conv == c].tolist())) == 1 for c in np.unique(conv)])
        assert stays > 0.7, (name, stays)


def test_session_ids_from_the_stream_pin_conversations():
    """A ``session_id`` column on the request columns reaches the router through the stream."""
    reqs, hashes, conv = conversations(n_conv=12, turns=4, seed=2)
    reqs.session_id = conv  # conversation ids, in arrival order as the rows
    q = run(reqs, None, Session(bound=float("inf")))  # no prefix ids: only the session ids can pin
    rep = q["replica"][np.argsort(q["request_id"])]
    assert all(len(set(rep[conv == c].tolist())) == 1 for c in np.unique(conv))
    rr = run(reqs, None, "round-robin")["replica"][np.argsort(q["request_id"])]
    assert not all(len(set(rr[conv == c].tolist())) == 1 for c in np.unique(conv))


def test_least_prefill_joins_the_smallest_prefill_backlog():
    """JSQ in prefill tokens: the replica with 2 requests but no prompt to prefill beats the one
    with 1 request prefilling 8,000 tokens; ties go to fewer requests, then the lower index."""
    lp = router("least-prefill")
    assert lp.route(req(), pool([1, 2, 3], pending=[8000, 0, 0])) == 1
    assert lp.route(req(), pool([3, 2, 2], pending=[0, 0, 0])) == 1
    assert lp.route(req(), pool([1, 1, 1], pending=[500, 500, 500], routable=[1, 2])) == 1
