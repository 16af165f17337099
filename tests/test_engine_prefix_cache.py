"""Prefix caching: hits skip prefill work, shared prefixes hold KV once, evictions follow the
free queue, and the fast replica equals the reference stepper."""

import numpy as np
import pytest

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.options import SimOptions
from llmqueue.engine.prefix_cache import PrefixCache
from llmqueue.workload import Workload

H = 64  # tokens per hash unit in these tests


def _hashes(reqs, rng, docs=5, shared_units=3, zipf=1.5):
    """Each request reads one of ``docs`` documents: its first ``shared_units`` units are the
    document's (shared), the rest unique to the request."""
    out = []
    uid = 10**9
    for s in np.asarray(reqs.prompt_tokens):
        units = -(-int(s) // H)
        d = int(min(docs - 1, rng.zipf(zipf) - 1))
        h = []
        for u in range(units):
            if u < shared_units:
                h.append(d * 1000 + u)
            else:
                uid += 1
                h.append(uid)
        out.append(h)
    return out


def _run(cfg, reqs, hashes, reference=False, step="linear:c0=0.01:prefill=1e-5:decode=1e-4"):
    opts = SimOptions(hash_ids=hashes, hash_block_tokens=H, sample_dt=0.5)
    return simulate(cfg, step, reqs, options=opts, reference=reference)


def test_hits_skip_prefill_and_are_recorded():
    rng = np.random.default_rng(0)
    reqs = Workload("poisson:5", prompt="uniform:200:600", output="uniform:5:30").generate(seed=1, n=400)
    hashes = _hashes(reqs, rng)
    cfg = EngineConfig.from_capacity(200_000, enable_prefix_caching=True)
    r = _run(cfg, reqs, hashes)
    q = r.requests
    cached = q["cached_prompt_tokens"]
    assert (cached > 0).mean() > 0.8  # after the first reader of each document
    assert (cached % H == 0).all() and (cached <= 3 * H).all() and (cached < q["prompt_tokens"]).all()
    # every prompt token not served from the cache was computed exactly once (no preemption here)
    assert q["preemptions"].sum() == 0
    assert r.steps["prefill_tokens"].sum() + (r.steps["decode_seqs"] * r.steps["steps"]).sum() == \
        (q["prompt_tokens"] - cached).sum() + (q["output_tokens"] - 1).sum()
    off = simulate(cfg.with_(enable_prefix_caching=False), "linear:c0=0.01:prefill=1e-5:decode=1e-4", reqs)
    assert off.requests["cached_prompt_tokens"].sum() == 0
    # less prefill work, so lower TTFT on average
    ttft = lambda x: np.nanmean(x.requests["first_token_s"] - x.requests["arrival_s"])  # noqa: E731
    assert ttft(r) < ttft(off)


def test_shared_prefix_blocks_are_counted_once():
    """Two identical long prompts running together hold the prefix once."""
    from llmqueue.workload.generate import RequestArrays

    reqs = RequestArrays(request_id=np.arange(2), arrival_s=np.array([0.0, 0.5]),
                         prompt_tokens=np.array([6 * H + 1, 6 * H + 1]), output_tokens=np.array([400, 400]))
    hashes = [list(range(7)), list(range(7))]
    cfg = EngineConfig.from_capacity(100_000, block_size=16, enable_prefix_caching=True)
    r = _run(cfg, reqs, hashes, step="0.01")
    q = r.requests
    assert q["cached_prompt_tokens"].tolist() == [0, 6 * H]
    ts = r.timeseries
    both = ts["num_running"] == 2
    assert both.any()
    # with sharing, KV in use = one copy of the 6 shared units + each request's own tail
    t_mid = ts["t_s"][both][len(ts["t_s"][both]) // 2]
    kv = ts["kv_tokens"][both][len(ts["t_s"][both]) // 2]
    comp1 = 6 * H + 1 + np.floor((t_mid - q["first_token_s"][0]) / 0.01) + 1
    comp2 = 6 * H + 1 + np.floor((t_mid - q["first_token_s"][1]) / 0.01) + 1
    unshared = 16 * (np.ceil(comp1 / 16) + np.ceil(comp2 / 16))
    assert kv < unshared - 6 * H + 2 * 16 and kv >= unshared - 6 * H - 2 * 16


def test_free_queue_evicts_oldest_units_first():
    pc = PrefixCache(total_blocks=10, unit_blocks=2)
    pc.consume(6)                          # 4 plain blocks left
    assert pc.register(1) and pc.register(2) and pc.register(3)
    freed = pc.free_request(0, [1, 2, 3])  # released deepest first: 3, 2, 1 join the tail
    assert freed == 6 and set(pc.evictable) == {1, 2, 3}
    pc.consume(4 + 2)                      # the 4 plain blocks, then unit 3
    assert set(pc.evictable) == {1, 2} and pc.evicted_units == 1
    assert pc.lookup([1, 2, 3], 3) == (2, 4)
    pc.take([1, 2], 2)
    assert pc.evictable == {} and pc.ref == {1: 1, 2: 1}


@pytest.mark.parametrize("seed", range(16))
def test_fast_equals_reference_with_prefix_caching(seed):
    rng = np.random.default_rng(seed)
    reqs = Workload(f"poisson:{rng.choice([3, 15, 40])}", prompt="uniform:50:900",
                    output="uniform:2:120").generate(seed=seed, n=300)
    hashes = _hashes(reqs, rng, docs=int(rng.choice([2, 8])), shared_units=int(rng.choice([1, 4, 10])))
    cfg = EngineConfig.from_capacity(int(rng.choice([2500, 8000, 100_000])), block_size=16,
                                     max_num_batched_tokens=int(rng.choice([128, 1024])),
                                     max_num_seqs=int(rng.choice([4, 64])), enable_prefix_caching=True)
    step = str(rng.choice(["0.01", "linear:c0=0.005:prefill=2e-5:decode=2e-4"]))
    a = _run(cfg, reqs, hashes, step=step)
    b = _run(cfg, reqs, hashes, step=step, reference=True)
    from test_engine_equivalence import _compare

    _compare(a, b)
    assert (a.requests["cached_prompt_tokens"] == b.requests["cached_prompt_tokens"]).all()
    assert (a.steps["kv_tokens"] <= cfg.capacity_tokens).all()
