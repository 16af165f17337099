"""The live view of an engine (serve/live.py): a scrape of its /metrics read as a ReplicaLoad the
policies can trust, capped by what the gateway knows now."""

from __future__ import annotations

import pytest

from llmqueue.cli.gateway_cmd import fleet_of
from llmqueue.serve.live import FULL_KV, LivePool


def _pool(max_num_seqs: int = 16, now: float = 10.0) -> LivePool:
    fleet, _ = fleet_of("chat", (f"deployment.max_num_seqs={max_num_seqs}",))
    return LivePool(fleet.pools[0], 0, ["http://127.0.0.1:1"], seed=0, clock=lambda: now)


def _metrics(waiting: int, running: int, kv: float) -> str:
    lab = '{engine="0",model_name="m"}'
    return (f"vllm:num_requests_waiting{lab} {waiting}.0\nvllm:num_requests_running{lab} {running}.0\n"
            f"vllm:kv_cache_usage_perc{lab} {kv}\n")


def test_without_a_scrape_the_gateways_own_count_fills_the_slots_first():
    p = _pool(max_num_seqs=4)
    p.outstanding[0] = 6
    x = p.load(0)
    assert (x.num_running, x.num_waiting, x.busy, x.age_s) == (4, 2, True, 0.0)


def test_a_scrape_never_counts_more_than_the_gateway_has_there_now():
    p = _pool()
    p.backends[0].read_metrics(_metrics(0, 9, 0.2), t=9.5)
    p.outstanding[0] = 3  # six ended since the scrape
    x = p.load(0)
    assert (x.num_running, x.num_waiting) == (3, 0) and x.age_s == pytest.approx(0.5)


@pytest.mark.parametrize("first,second,kv,want_waiting", [
    ((0, 8), (2, 8), 0.1, 0),      # arrived during the step the scrape caught: they start next step
    ((2, 8), (2, 8), 0.1, 2),      # waiting on two scrapes in a row: a queue
    ((0, 16), (3, 16), 0.1, 3),    # every slot taken: a queue
    ((0, 8), (2, 8), FULL_KV, 2),  # KV full: waiting for memory
])
def test_waiting_is_a_queue_only_when_it_stands(first, second, kv, want_waiting):
    p = _pool(max_num_seqs=16)
    b = p.backends[0]
    b.read_metrics(_metrics(first[0], first[1], kv), t=8.0)
    b.read_metrics(_metrics(second[0], second[1], kv), t=9.0)
    p.outstanding[0] = second[0] + second[1]
    x = p.load(0)
    assert x.num_waiting == want_waiting and x.num_running + x.num_waiting == p.outstanding[0]
    assert x.kv_blocks_free == round(x.kv_blocks_total * (1 - kv))


def test_the_kept_queue_sum_is_the_sum_of_the_loads():
    """``replicas_waiting()`` (one read, kept as counts and scrapes change) equals the queues the
    replicas' loads report, summed, through random hand-overs, ends and scrapes; an admission rule
    reading the pool's depth sees the same number either way."""
    import random

    fleet, _ = fleet_of("chat", ("deployment.max_num_seqs=4",))
    n = 5
    p = LivePool(fleet.pools[0], 0, [f"http://127.0.0.1:{1 + i}" for i in range(n)], seed=0, clock=lambda: 10.0)
    rng = random.Random(3)
    seen = set()
    for step in range(3000):
        i = rng.randrange(n)
        u = rng.random()
        if u < 0.45:
            p.count(i, 1)
        elif u < 0.85 and p.outstanding[i]:
            p.count(i, -1)
        else:
            p.read_metrics(i, _metrics(rng.randrange(6), rng.randrange(6), rng.choice((0.1, 0.95))), t=step / 300)
        want = sum(p.load(k).num_waiting for k in range(n))
        assert p.replicas_waiting() == want == p.view._waiting_from_loads()
        assert p.view.queue_depth() == len(p.held) + want
        seen.add(want)
    assert len(seen) > 5  # the queues moved
