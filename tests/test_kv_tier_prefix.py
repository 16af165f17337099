"""Prefix units in the host KV tier (llmqueue.engine.host_tier): a unit the GPU's free queue
evicts moves down to the tier; a request whose leading units miss the GPU but are held there loads
them at the tier's price instead of computing them (vLLM's external prefix-cache hits). Both
engines alike; the records carry each request's loaded tokens."""

import dataclasses

import numpy as np
import pytest
from test_engine_equivalence import _compare
from test_engine_prefix_cache import _hashes, _run

from llmqueue.engine import EngineConfig
from llmqueue.engine.host_tier import HostTier
from llmqueue.workload import Workload


class _R:
    def __init__(self, c, hash_ids=()):
        self.num_computed_tokens = c
        self.offloaded_tokens = 0
        self.loaded_tokens = 0
        self.hash_ids = hash_ids
        self.num_cached_tokens = -1   # not yet admitted


def test_units_are_kept_oldest_out_and_give_way_to_preempted_requests():
    t = HostTier(capacity=4 * 64, s_per_token=1e-6)
    t.unit_tokens = 64
    for h in (1, 2, 3, 4, 5):
        t.store_unit(h)
    assert list(t.units) == [2, 3, 4, 5] and t.evicted_units == 1 and t.free == 0
    t.store_unit(3)                      # stored again (computed again and evicted again): the newest
    assert list(t.units) == [2, 4, 5, 3]
    big = _R(5 * 64)                     # more than the whole tier: recomputed, no unit evicted for it
    assert not t.offload(big) and list(t.units) == [2, 4, 5, 3] and t.full == 1
    r = _R(100)                          # two units' room: the two oldest go
    assert t.offload(r) and list(t.units) == [5, 3] and t.free == 2 * 64 - 100
    t.store_unit(6)                      # 28 tokens free: the oldest unit (5) gives way to the newest
    assert list(t.units) == [3, 6] and t.free == 28
    t.units.clear()
    t.free = 28                          # only the pinned request's KV and 28 tokens: nothing to evict
    t.store_unit(7)
    assert t.unstored_units == 1 and not t.units
    assert t.restore(r) == 100 and t.free == 128 and r.loaded_tokens == 100

def test_lookup_take_and_return_keep_the_account():
    t = HostTier(capacity=10 * 64, s_per_token=1e-6)
    t.unit_tokens = 64
    for h in (10, 11, 12, 20):
        t.store_unit(h)
    r = _R(0, hash_ids=(1, 10, 11, 12, 13))
    assert t.lookup_units(r.hash_ids, 1, 4) == 3 and t.lookup_units(r.hash_ids, 1, 2) == 1
    assert t.lookup_units(r.hash_ids, 0, 5) == 0         # a run from the first GPU miss only
    free = t.free
    t.take_units(r.hash_ids, 1, 3)
    assert list(t.units) == [20] and t.free == free + 3 * 64
    t.return_units(r.hash_ids, 1, 3)                     # not admitted: back, as the newest
    assert list(t.units) == [20, 10, 11, 12] and t.free == free
    t.take_units(r.hash_ids, 1, 2)
    assert t.loaded_units(r, 2) == 128 and r.loaded_tokens == 128 and t.loaded_tokens == 128
    assert t.stats()["prefix_hit_tokens"] == 128 and t.stats()["prefix_units_held"] == 2


STEP = "linear:c0=0.005:prefill=2e-5:decode=2e-4"


@pytest.fixture(scope="module")
def documents():
    """30 documents of 6 units (64 tokens each) read with Zipf popularity by 400 requests, on a
    GPU cache of 3,000 tokens: the popular documents stay, the others are evicted between reads."""
    reqs = Workload("poisson:3", prompt="uniform:400:900", output="uniform:2:60").generate(seed=5, n=400)
    hashes = _hashes(reqs, np.random.default_rng(5), docs=30, shared_units=6, zipf=1.2)
    cfg = EngineConfig.from_capacity(3000, block_size=16, max_num_batched_tokens=1024, enable_prefix_caching=True)
    return cfg, reqs, hashes


def _tier(cfg, s_per_token, tokens=10**6):
    return dataclasses.replace(cfg, kv_offload_tokens=tokens, kv_offload_s_per_token=s_per_token)


def test_evicted_prefixes_are_loaded_from_the_tier_and_priced(documents):
    cfg, reqs, hashes = documents
    off = _run(cfg, reqs, hashes, step=STEP)
    fast = _run(_tier(cfg, 1e-7), reqs, hashes, step=STEP)
    t = fast.kv_tier
    q = fast.requests
    assert t["prefix_units_stored"] > 0 and t["prefix_hit_tokens"] > 0
    # every loaded token is in some request's record; resumptions and prefix hits make the total
    restored = t["loaded_tokens"] - t["prefix_hit_tokens"]
    assert q["kv_loaded_tokens"].sum() == t["loaded_tokens"] and restored >= 0
    assert "kv_loaded_tokens" not in off.requests
    # more of the prompts served without computing them; what was computed is the rest
    assert q["cached_prompt_tokens"].sum() >= off.requests["cached_prompt_tokens"].sum() + t["prefix_hit_tokens"] // 2
    if q["preemptions"].sum() == 0:
        s = fast.steps
        assert s["prefill_tokens"].sum() + (s["decode_seqs"] * s["steps"]).sum() == \
            (q["prompt_tokens"] - q["cached_prompt_tokens"]).sum() + (q["output_tokens"] - 1).sum()
    ttft = lambda r: np.nanmean(r.requests["first_token_s"] - r.requests["arrival_s"])  # noqa: E731
    assert ttft(fast) < ttft(off)
    # a slow link (64 ms a unit, 3x computing it): the loads are in the steps, and cost more than computing
    slow = _run(_tier(cfg, 1e-3), reqs, hashes, step=STEP)
    s = slow.steps
    priced = (s["steps"] * 0.005 + 2e-5 * s["prefill_tokens"] + 2e-4 * s["decode_seqs"] * s["steps"]).sum()
    assert s["duration_s"].sum() == pytest.approx(priced + slow.kv_tier["load_s"], rel=1e-9)
    assert slow.kv_tier["prefix_hit_tokens"] > 0 and ttft(slow) > ttft(off)


def test_a_small_tier_keeps_the_newest_units(documents):
    """A tier of 40 units for 180 distinct document units: it evicts, and still serves hits."""
    cfg, reqs, hashes = documents
    t = _run(_tier(cfg, 1e-7, tokens=40 * 64), reqs, hashes, step=STEP).kv_tier
    assert t["prefix_units_evicted"] > 0 and t["prefix_hit_tokens"] > 0 and t["prefix_units_held"] <= 40


def test_the_hit_rate_counts_first_admissions_as_the_records_do():
    """A tier too small for the preempted requests' KV: they are recomputed and, admitted again,
    hit the tier's prefix units again. The tier's traffic counts every load; the hit rate by tier
    counts each request's first admission, as its cached_prompt_tokens does, so the GPU's share is
    the rest of those tokens."""
    from llmqueue.simulate import _prefix_hit_rate

    reqs = Workload("poisson:40", prompt="uniform:300:900", output="uniform:50:300").generate(seed=0, n=300)
    hashes = _hashes(reqs, np.random.default_rng(0), docs=30, shared_units=6)
    cfg = EngineConfig.from_capacity(2500, block_size=16, max_num_batched_tokens=1024, max_num_seqs=64,
                                     enable_prefix_caching=True)
    r = _run(_tier(cfg, 1e-6, tokens=64 * 8), reqs, hashes, step=STEP)
    t, q = r.kv_tier, r.requests
    assert t["recomputed_tier_full"] > 0 and 0 < t["first_admission_hit_tokens"] < t["prefix_hit_tokens"]
    hr = _prefix_hit_rate(q, t)
    sched = np.isfinite(q["first_scheduled_s"])
    queried = q["prompt_tokens"][sched].sum()
    assert hr["gpu"] > 0 and hr["host"] == pytest.approx(t["first_admission_hit_tokens"] / queried)
    assert (hr["gpu"] + hr["host"]) * queried == pytest.approx(q["cached_prompt_tokens"][sched].sum())


@pytest.mark.parametrize("seed", range(10))
def test_fast_equals_reference_with_prefix_units_in_the_tier(seed):
    rng = np.random.default_rng(300 + seed)
    reqs = Workload(f"poisson:{rng.choice([3, 15, 40])}", prompt="uniform:50:900",
                    output="uniform:2:120").generate(seed=seed, n=300)
    hashes = _hashes(reqs, rng, docs=int(rng.choice([8, 30])), shared_units=int(rng.choice([1, 4, 10])))
    cfg = EngineConfig.from_capacity(int(rng.choice([2500, 8000])), block_size=16,
                                     max_num_batched_tokens=int(rng.choice([128, 1024])),
                                     max_num_seqs=int(rng.choice([4, 64])), enable_prefix_caching=True)
    cfg = _tier(cfg, float(rng.choice([1e-6, 1e-4])), tokens=int(rng.choice([64 * 20, 10**6])))
    step = str(rng.choice(["0.01", STEP]))
    a = _run(cfg, reqs, hashes, step=step)
    b = _run(cfg, reqs, hashes, step=step, reference=True)
    _compare(a, b)
    for c in ("cached_prompt_tokens", "kv_loaded_tokens"):
        assert (a.requests[c] == b.requests[c]).all(), c
    assert a.kv_tier == b.kv_tier


def _mooncake(path, n=600, docs=40, seed=2):
    """A Mooncake-format JSONL (timestamps in ms, 512-token hash blocks): each request reads one
    of ``docs`` 8-block documents (Zipf popularity), then its own 1-3 blocks."""
    import json

    rng = np.random.default_rng(seed)
    uid = 10**6
    t = 0.0
    with open(path, "w") as f:
        for _ in range(n):
            t += rng.exponential(250.0)
            d = int(min(docs - 1, rng.zipf(1.3) - 1))
            own = int(rng.integers(1, 4))
            h = [d * 100 + u for u in range(8)] + list(range(uid, uid + own))
            uid += own
            f.write(json.dumps({"timestamp": int(t), "input_length": 512 * len(h) - 100,
                                "output_length": int(rng.integers(20, 200)), "hash_ids": h}) + "\n")


def test_the_cli_reports_each_tiers_hit_rate_for_a_replica_and_a_fleet(tmp_path):
    import json

    from _cli import run_cli

    trace = tmp_path / "mc.jsonl"
    _mooncake(trace)
    base = ["simulate", "--trace", str(trace), "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
            "--enable-prefix-caching", "--capacity-tokens", "40000", "--no-progress"]
    r = run_cli(*base, "--kv-offloading-size", "32", "--json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    one, hr = d["kv_tier"], d["prefix_hit_rate"]
    assert one["prefix_hit_tokens"] > 0 and 0 < hr["host"] < 1 and 0 < hr["gpu"] < 1 and hr["gpu"] + hr["host"] < 1
    r = run_cli(*base, "--kv-offloading-size", "32")
    assert r.code == 0 and "prefix-cache hits" in r.out and "host tier" in r.out, r.out
    r = run_cli(*base, "--json")   # no tier: the GPU's hit rate alone, about the tiered run's
    assert r.code == 0, r.err
    alone = json.loads(r.out)
    assert "kv_tier" not in alone and set(alone["prefix_hit_rate"]) == {"gpu"}
    assert alone["prefix_hit_rate"]["gpu"] == pytest.approx(hr["gpu"], abs=0.05)
    out = tmp_path / "fleet"
    r = run_cli(*base, "--kv-offloading-size", "32", "--replicas", "2", "--router", "round-robin", "--json",
                "--out", str(out))
    assert r.code == 0, r.err
    two = json.loads(r.out)["kv_tier"]
    assert two["replicas"] == 2 and two["capacity_tokens"] == 2 * one["capacity_tokens"] and two["prefix_hit_tokens"] > 0
    import pyarrow.parquet as pq

    loaded = pq.read_table(out / "requests.parquet").column("kv_loaded_tokens").to_pylist()
    assert sum(loaded) == two["loaded_tokens"]
