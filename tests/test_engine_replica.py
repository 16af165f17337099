"""The replicas on a shared clock: submit / advance / state, the stream, bounded memory."""

import gc
import math

import numpy as np
import pytest

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.options import SimOptions
from llmqueue.engine.reference import ReferenceReplica
from llmqueue.engine.fast.replica import Replica
from llmqueue.engine.request import Request
from llmqueue.engine.run import request_columns
from llmqueue.engine.stream import RequestStream
from llmqueue.workload import Workload


def _stream(n=400, rate=30.0, seed=3):
    return Workload(f"poisson:{rate}", prompt="uniform:1:300", output="uniform:1:120").generate(seed=seed, n=n)


def _copy(r):
    return Request(r.request_id, r.arrival_time, r.num_prompt_tokens, r.max_tokens, seq=r.seq)


def _drive(rep_cls, cfg, step, reqs, *, dt=None):
    """Submit each request only once the replica has been advanced to its arrival (as a fleet
    would), optionally advancing in slices of ``dt`` too; returns the records."""
    done = []
    rep = rep_cls(cfg, step, on_finish=done.append)
    for r in RequestStream(reqs).requests():
        if dt is not None:
            while rep.clock + dt < r.arrival_time:
                rep.advance(rep.clock + dt)
        rep.advance(r.arrival_time)
        rep.submit(r)
    rep.advance(math.inf)
    assert not rep.in_system()
    return request_columns(sorted(done, key=lambda r: r.seq))


@pytest.mark.parametrize("step", ["0.02", "linear:c0=0.005:prefill=2e-5:decode=3e-4:ctx=1e-7"])
@pytest.mark.parametrize("kv", [700, 20000])
def test_replicas_advanced_arrival_by_arrival_give_the_records_of_one_run(step, kv):
    # a small KV cache (preemption by recompute) and a large one; chunked prefill binding
    cfg = EngineConfig.from_capacity(kv, block_size=4, max_num_batched_tokens=128, max_num_seqs=32)
    reqs = _stream()
    whole = simulate(cfg, step, reqs, reference=True).requests
    for rep_cls, dt in ((Replica, None), (Replica, 0.013), (ReferenceReplica, None), (ReferenceReplica, 0.05)):
        got = _drive(rep_cls, cfg, step, reqs, dt=dt)
        for c in ("request_id", "status", "output_tokens", "preemptions"):
            assert (got[c] == whole[c]).all(), (rep_cls.__name__, dt, c)
        for c in ("first_scheduled_s", "first_token_s", "finish_s"):
            np.testing.assert_allclose(got[c], whole[c], rtol=1e-9, atol=1e-9, err_msg=f"{rep_cls.__name__} {c}")
    if kv == 700:
        assert whole["preemptions"].sum() > 0


def test_state_is_a_consistent_snapshot():
    cfg = EngineConfig.from_capacity(2000, block_size=4, max_num_batched_tokens=64, max_num_seqs=8)
    reqs = _stream(n=200, rate=40.0)
    for rep_cls in (Replica, ReferenceReplica):
        done = []
        rep = rep_cls(cfg, 0.01, on_finish=done.append)
        stream = RequestStream(reqs).requests()
        for k, r in enumerate(stream):
            rep.advance(r.arrival_time)
            st = rep.state()
            # every request submitted before this one has either left or is waiting/running
            assert st["num_waiting"] + st["num_running"] == k - len(done), rep_cls.__name__
            assert st["num_running"] <= 8
            assert st["kv_blocks_used"] + st["kv_blocks_free"] == cfg.num_kv_blocks
            assert 0 <= st["kv_blocks_free"] <= cfg.num_kv_blocks
            assert st["queued_prefill_tokens"] >= 0
            rep.submit(r)
        rep.advance(math.inf)
        assert len(done) == len(reqs.arrival_s) and rep.state()["kv_blocks_free"] == cfg.num_kv_blocks


def test_next_event_time_of_an_idle_and_a_busy_replica():
    cfg = EngineConfig.from_capacity(1000, block_size=4)
    for rep_cls in (Replica, ReferenceReplica):
        rep = rep_cls(cfg, 0.5)
        assert rep.next_event_time() == math.inf
        rep.submit(Request(0, 2.0, 10, 3, seq=0))
        assert rep.next_event_time() == 2.0
        rep.advance(2.0)
        assert rep.next_event_time() <= 2.5  # busy: the request's first step is under way or next
        rep.advance(100.0)
        assert rep.next_event_time() == math.inf


def test_a_fed_stream_holds_only_the_requests_in_flight():
    """200,000 requests through a replica that keeps no records: at the end no Request object
    is alive (they are made as they arrive and dropped as they leave)."""
    reqs = Workload("poisson:100", prompt="uniform:10:200", output="uniform:10:100").generate(seed=1, n=200_000)
    cfg = EngineConfig.from_capacity(200_000, max_num_batched_tokens=4096, max_num_seqs=256)
    count = [0, 0]
    peak = [0]
    rep = Replica(cfg, "linear:c0=0.01:decode=1e-4", on_finish=lambda r: count.__setitem__(0, count[0] + 1))
    rep.feed(RequestStream(reqs))
    t = 0.0
    while t < 2400:
        t += 100.0
        rep.advance(t)
        peak[0] = max(peak[0], rep.state()["num_running"] + rep.state()["num_waiting"])
    rep.advance(math.inf)
    assert count[0] == 200_000
    gc.collect()
    alive = sum(isinstance(o, Request) for o in gc.get_objects())
    assert alive <= 10, alive
    assert peak[0] < 2000  # a stable run: a few hundred in the system at once


@pytest.mark.parametrize("retry", [False, True])
def test_simulate_leaves_no_reference_cycle_holding_its_requests(retry):
    """After ``simulate`` returns, its requests are freed by reference counting: no cycle (the
    replica and its departures callback, a retry resubmitting to the replica) keeps them for the
    cycle collector to find, which costs a walk over every request of the run."""
    reqs = Workload("poisson:40", prompt="uniform:10:400", output="uniform:10:200").generate(seed=2, n=3000)
    cfg = EngineConfig.from_capacity(4000, max_num_batched_tokens=512)
    opts = SimOptions(horizon_s=60.0, timeout_s={"default": 5.0},
                      retry=(lambda rid, attempt, status, t: t + 1.0 if attempt < 2 else None) if retry else None)
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        res = simulate(cfg, 0.02, reqs, options=opts)
        found = gc.collect()  # objects only the cycle collector could free
    finally:
        if was:
            gc.enable()
    assert len(res.requests["request_id"]) > 2000  # the arrivals of the 60-s horizon
    assert not retry or (res.requests["attempt"] > 1).any()
    assert found < 100, found


def test_the_readme_example_of_a_replica_on_a_shared_clock_runs_as_printed(capsys):
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "Replica(" in b)
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out.split("\n")
    said = [c.split(":")[0].strip() for c in re.findall(r"# (.*)", block) if c[:1].isdigit() or c.startswith("ok")]
    assert [p.strip() for p in printed if p.strip()] == said


def test_early_stop_ends_a_certainly_overloaded_run_and_leaves_a_stable_one_alone():
    from llmqueue.engine.options import SimOptions

    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=512)

    def run(rate, early):
        reqs = Workload(f"poisson:{rate}", prompt="uniform:10:1600", output="uniform:10:1600").generate(seed=2, duration=1800)
        return simulate(cfg, 0.0372, reqs, options=SimOptions(horizon_s=1800, early_stop=early))

    # seed 004's 1:1 setting, mu = 3.263 req/s: at 3x the queue grows by ~2/3 of the arrivals
    over = run(10.0, True)
    assert over.stopped_early_s is not None and 360 <= over.stopped_early_s < 400  # a fifth of the horizon
    assert over.horizon_s == over.stopped_early_s
    assert np.nanmax(over.requests["arrival_s"]) <= over.stopped_early_s
    assert (over.requests["status"] == "unfinished").sum() > 2000  # the queue it left behind
    # at 0.8x it runs to the end, and slicing the run changes nothing
    calm, whole = run(2.6, True), run(2.6, False)
    assert calm.stopped_early_s is None and calm.horizon_s == 1800
    for c in ("request_id", "status", "output_tokens", "preemptions"):
        assert (calm.requests[c] == whole.requests[c]).all(), c
    np.testing.assert_allclose(calm.requests["finish_s"], whole.requests["finish_s"], rtol=1e-9)
    assert calm.num_steps == whole.num_steps


def test_events_out_first_tokens_and_preemptions_as_they_happen():
    cfg = EngineConfig.from_capacity(700, block_size=4, max_num_batched_tokens=128, max_num_seqs=32)
    reqs = _stream(n=300)
    seen = {}
    for rep_cls in (Replica, ReferenceReplica):
        first, pre, done = [], [], []
        rep = rep_cls(cfg, 0.02, on_finish=done.append, on_preempt=lambda r: pre.append((r.seq, r.num_preemptions)),
                      on_first_token=lambda r: first.append((r.seq, r.first_token_time)))
        rep.feed(RequestStream(reqs)) if rep_cls is Replica else [rep.submit(r) for r in RequestStream(reqs).requests()]
        rep.run()
        assert sorted(first) == sorted((r.seq, r.first_token_time) for r in done)  # one each, at its time
        assert len(pre) == sum(r.num_preemptions for r in done) > 0
        seen[rep_cls] = (sorted(first), sorted(pre))
    (f1, p1), (f2, p2) = seen[Replica], seen[ReferenceReplica]
    assert [s for s, _ in f1] == [s for s, _ in f2] and p1 == p2
    np.testing.assert_allclose([t for _, t in f1], [t for _, t in f2], rtol=1e-9)


@pytest.mark.parametrize("step", ["0.02", "linear:c0=0.005:prefill=2e-5:decode=3e-4:ctx=1e-7", "exp:0.02"])
def test_both_replicas_show_the_same_state_at_any_time(step):
    """Advanced to the same times (arrivals submitted as they come, and random times between),
    the fast replica and the reference show the same state, including a step in progress."""
    cfg = EngineConfig.from_capacity(900, block_size=4, max_num_batched_tokens=96, max_num_seqs=16)
    reqs = _stream(n=250, rate=25.0, seed=7)
    rng = np.random.default_rng(1)
    reps = [Replica(cfg, step, seed=3), ReferenceReplica(cfg, step, seed=3)]
    keys = ("num_waiting", "num_running", "kv_blocks_used", "queued_prefill_tokens")
    checks = busy = 0
    for r in RequestStream(reqs).requests():
        for t in sorted(rng.uniform(reps[0].clock, r.arrival_time, 2)) + [r.arrival_time]:
            for rep in reps:
                rep.advance(t)
            a, b = (rep.state() for rep in reps)
            assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, t
            assert reps[0].next_event_time() == pytest.approx(reps[1].next_event_time(), rel=1e-9, abs=1e-12)
            checks += 1
            busy += reps[1]._pending is not None
        for rep, twin in zip(reps, (r, _copy(r))):  # each replica gets its own Request object
            rep.submit(twin)
    for rep in reps:
        rep.advance(math.inf)
    assert checks > 700 and busy > 300


def test_merge_by_seq_puts_rows_in_seq_order_dense_or_not():
    """Record chunks merge into ``seq`` order: scattered by ``seq`` when the chunks hold 0..n-1 once
    each, by stable rank otherwise (gaps: a horizon that cut the stream; repeats), the same rows
    a stable sort would give."""
    import numpy as np

    from llmqueue.engine.run import merge_by_seq

    rng = np.random.default_rng(5)
    for seqs in (rng.permutation(50), np.sort(rng.choice(200, 50, replace=False))[rng.permutation(50)],
                 rng.integers(0, 20, 50)):
        vals = rng.random(50)
        names = np.asarray([f"c{k % 3}" for k in range(50)], dtype=object)
        cuts = [0, 7, 7, 30, 50]  # one empty chunk
        parts = [{"x": vals[a:b], "cls": names[a:b], "replica": np.zeros(b - a, np.int64), "seq": seqs[a:b]}
                 for a, b in zip(cuts, cuts[1:])]
        out = merge_by_seq(parts, fill={"replica": 3})
        order = np.argsort(seqs, kind="stable")
        assert np.array_equal(out["x"], vals[order])
        assert list(out["cls"]) == list(names[order]) and out["cls"].dtype == object
        assert out["replica"].dtype == np.int64 and (out["replica"] == 3).all()
        assert "seq" not in out
