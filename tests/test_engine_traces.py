"""Hand-worked traces that pin the reference replica to vLLM v1's scheduler.

Each test is a tiny configuration whose schedule was worked out by hand, step by step, from
vLLM's ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``) and ``KVCacheManager.allocate_slots``;
the comment above each expectation names the rule of the source it exercises. Steps take 1 s
(a constant step time), so step ``k`` of a busy period spans ``[k, k + 1)`` and a token made in
it is stamped at its end. Notation: ``{name: tokens}`` is a step's schedule in order.

The fast replica is checked against this reference in ``test_engine_equivalence.py``.
"""

import math

import pytest

from llmqueue.engine import EngineConfig
from llmqueue.engine.reference import ReferenceReplica
from llmqueue.engine.request import Request, RequestStatus


def _cfg(blocks, bs=4, budget=8192, seqs=256, **kw):
    return EngineConfig(num_kv_blocks=blocks, block_size=bs, max_num_batched_tokens=budget, max_num_seqs=seqs, **kw)


def _req(name, seq, arrival, prompt, out, **kw):
    r = Request(request_id=seq, arrival_time=arrival, num_prompt_tokens=prompt, max_tokens=out, seq=seq, **kw)
    r.class_name = kw.get("class_name", name)
    return r


def _run(cfg, reqs, *, step=1.0, horizon=math.inf, **kw):
    """Run the reference replica; returns (schedules, step rows, requests by name)."""
    names = {id(r): r.class_name for r in reqs}
    schedules = []
    rows = []
    rep = ReferenceReplica(cfg, step, on_step=rows.append, **kw)
    orig = rep.scheduler.schedule

    def schedule():
        out = orig()
        if out.scheduled or out.preempted:
            schedules.append(({names[id(r)]: n for r, n in out.scheduled}, [names[id(r)] for r in out.preempted]))
        return out

    rep.scheduler.schedule = schedule
    for r in reqs:
        rep.submit(r)
    rep.run(horizon)
    return schedules, rows, {names[id(r)]: r for r in reqs}, rep


def _times(r):
    return (r.first_scheduled_time, r.first_token_time, r.finish_time)


def test_chunked_prefill_of_one_request_then_decodes():
    # budget 4 = the chunk: a 10-token prompt takes ceil(10/4) = 3 steps; the step that computes
    # the prompt's last token samples the first output token (num_computed_tokens == num_tokens)
    sched, rows, r, _ = _run(_cfg(10, budget=4), [_req("A", 0, 0.0, 10, 3)])
    assert [s for s, _ in sched] == [{"A": 4}, {"A": 4}, {"A": 2}, {"A": 1}, {"A": 1}]
    # composition: (prefill tokens, decode seqs); decodes attend over num_computed_tokens + 1
    assert [(row[3], row[4]) for row in rows] == [(4, 0), (4, 0), (2, 0), (0, 1), (0, 1)]
    # KV in use after each step's allocation: ceil(tokens / 4) blocks of 4
    assert [row[7] for row in rows] == [4, 8, 12, 12, 12]
    assert _times(r["A"]) == (0.0, 3.0, 5.0) and r["A"].outcome == "ok" and r["A"].num_output_tokens == 3


def test_running_requests_first_then_waiting_ones_share_the_budget():
    # schedule(): the RUNNING loop spends the budget first, then WAITING requests take what is
    # left, chunked (min(num_new_tokens, token_budget))
    sched, rows, r, _ = _run(_cfg(100, budget=6), [_req("A", 0, 0.0, 5, 2), _req("B", 1, 0.0, 5, 2)])
    assert [s for s, _ in sched] == [{"A": 5, "B": 1}, {"A": 1, "B": 4}, {"B": 1}]
    assert [(row[3], row[4]) for row in rows] == [(6, 0), (4, 1), (0, 1)]
    assert _times(r["A"]) == (0.0, 1.0, 2.0)
    assert _times(r["B"]) == (0.0, 2.0, 3.0)


def test_max_num_seqs_keeps_the_second_request_waiting():
    # WAITING loop: `if len(self.running) == self.max_num_running_reqs: break`
    sched, _, r, _ = _run(_cfg(100, seqs=1), [_req("A", 0, 0.0, 2, 2), _req("B", 1, 0.0, 2, 1)])
    assert [s for s, _ in sched] == [{"A": 2}, {"A": 1}, {"B": 2}]
    assert _times(r["A"]) == (0.0, 1.0, 2.0)
    assert _times(r["B"]) == (2.0, 3.0, 3.0)


def test_fcfs_preempts_the_newest_and_recomputes_its_prompt_and_outputs():
    # allocate_slots returns None -> `preempted_req = self.running.pop()` (the newest), its blocks
    # freed and num_computed_tokens = 0; no WAITING request is scheduled in a step that preempted
    # (`if not preempted_reqs`); the resumed request recomputes prompt + its outputs
    # (num_new_tokens = num_tokens - num_computed_tokens) and samples its next token.
    # M = 4 blocks of 2 tokens.
    sched, rows, r, _ = _run(_cfg(4, bs=2, budget=16), [_req("A", 0, 0.0, 3, 4), _req("B", 1, 0.0, 3, 4)])
    assert sched == [
        ({"A": 3, "B": 3}, []),   # 2 + 2 blocks: the cache is full
        ({"A": 1, "B": 1}, []),   # 4 tokens each: still 2 blocks each
        ({"A": 1}, ["B"]),        # A's 5th token needs a 3rd block: B (newest) goes
        ({"A": 1}, []),           # B needs ceil(5/2) = 3 blocks, 1 is free: it waits
        ({"B": 5}, []),           # A finished and freed 3: B recomputes 3 prompt + 2 output tokens
        ({"B": 1}, []),
    ]
    assert [row[8] for row in rows] == [0, 0, 1, 0, 0, 0]  # preemptions per step
    assert _times(r["A"]) == (0.0, 1.0, 4.0)
    assert _times(r["B"]) == (0.0, 1.0, 6.0)  # the first token of the first try stands
    assert (r["A"].num_preemptions, r["B"].num_preemptions) == (0, 1)
    assert r["B"].num_output_tokens == 4


def test_priority_preemption_takes_back_a_request_scheduled_earlier_in_the_step():
    # PRIORITY policy: victim = max(running, key=(priority, arrival_time)); a victim already in
    # scheduled_running_reqs gives its tokens back (`token_budget += ...; req_index -= 1`).
    # bs = 1, M = 6 tokens. X (priority 1) runs first, Y (priority 0) arrives at 0.5.
    cfg = _cfg(6, bs=1, budget=100, policy="priority", preemption="lowest-priority")
    X = _req("X", 0, 0.0, 2, 4, priority=1)
    Y = _req("Y", 1, 0.5, 2, 4, priority=0)
    sched, _, r, _ = _run(cfg, [X, Y])
    assert sched == [
        ({"X": 2}, []),
        ({"X": 1, "Y": 2}, []),
        ({"Y": 1}, ["X"]),   # X was scheduled first in this step, then preempted for Y
        ({"Y": 1}, []),      # X needs 4 blocks for its recompute, 2 are free
        ({"Y": 1}, []),
        ({"X": 4}, []),      # Y finished at 5 and freed its blocks
        ({"X": 1}, []),
    ]
    assert _times(r["Y"]) == (1.0, 2.0, 5.0)
    assert _times(r["X"]) == (0.0, 1.0, 7.0) and r["X"].num_preemptions == 1


def test_a_request_that_preempts_itself_ends_the_running_pass():
    # `if preempted_req == request: break` and then `if new_blocks is None: break`: the RUNNING
    # loop stops, so C (behind B in the running list) is not scheduled in that step although it
    # needs no new block. bs = 2, M = 6 blocks; priorities A 0, B 2, C 1; C arrives at 0.5.
    cfg = _cfg(6, bs=2, budget=100, policy="priority", preemption="lowest-priority")
    A = _req("A", 0, 0.0, 1, 8, priority=0)
    B = _req("B", 1, 0.0, 2, 8, priority=2)
    C = _req("C", 2, 0.5, 2, 8, priority=1)
    sched, _, r, _ = _run(cfg, [A, B, C])
    assert sched[:4] == [
        ({"A": 1, "B": 2}, []),
        ({"A": 1, "B": 1, "C": 2}, []),
        ({"A": 1, "B": 1, "C": 1}, []),  # the 6 blocks are all taken
        ({"A": 1}, ["B"]),               # B needs a block and is itself the lowest priority
    ]
    # worked on: A's 7th token needs a block, C (priority 1) goes; A finishes at 8; C and B are
    # readmitted together and B (priority 2) is preempted again for C's next block
    assert sched[4:10] == [
        ({"A": 1, "C": 1}, []),
        ({"A": 1, "C": 1}, []),
        ({"A": 1}, ["C"]),
        ({"A": 1}, []),                  # C's recompute needs 3 blocks, 2 are free
        ({"C": 6, "B": 5}, []),
        ({"C": 1}, ["B"]),
    ]
    assert (r["A"].finish_time, r["C"].finish_time, r["B"].finish_time) == (8.0, 12.0, 16.0)
    assert (r["A"].num_preemptions, r["B"].num_preemptions, r["C"].num_preemptions) == (0, 2, 1)


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    # `if not enable_chunked_prefill and num_new_tokens > token_budget: break`
    cfg = _cfg(100, budget=8, enable_chunked_prefill=False)
    sched, _, r, _ = _run(cfg, [_req("A", 0, 0.0, 5, 2), _req("B", 1, 0.0, 5, 1)])
    assert [s for s, _ in sched] == [{"A": 5}, {"A": 1, "B": 5}]
    assert _times(r["B"]) == (1.0, 2.0, 2.0) and _times(r["A"]) == (0.0, 1.0, 2.0)


def test_long_prefill_token_threshold_caps_each_prefill_chunk():
    # `if 0 < long_prefill_token_threshold < num_new_tokens: num_new_tokens = threshold`,
    # for running and waiting requests alike
    cfg = _cfg(100, budget=100, long_prefill_token_threshold=3)
    sched, _, r, _ = _run(cfg, [_req("A", 0, 0.0, 7, 1), _req("B", 1, 0.0, 2, 1)])
    assert [s for s, _ in sched] == [{"A": 3, "B": 2}, {"A": 3}, {"A": 1}]
    assert _times(r["A"]) == (0.0, 3.0, 3.0) and _times(r["B"]) == (0.0, 1.0, 1.0)


@pytest.mark.parametrize("reserve", [True, False])
def test_the_whole_sequence_admission_gate(reserve):
    # scheduler_reserve_full_isl: a waiting request is admitted only if its whole prompt fits in
    # the free blocks (True), or only its first chunk (False: admitted, then preempted when its
    # second chunk finds no block). bs = 4, M = 3 blocks, budget 4.
    cfg = _cfg(3, bs=4, budget=4, scheduler_reserve_full_isl=reserve)
    sched, _, r, _ = _run(cfg, [_req("A", 0, 0.0, 4, 3), _req("B", 1, 0.0, 8, 1)])
    if reserve:
        assert sched == [({"A": 4}, []), ({"A": 1}, []), ({"A": 1}, []), ({"B": 4}, []), ({"B": 4}, [])]
        assert r["B"].num_preemptions == 0
    else:
        assert sched == [({"A": 4}, []), ({"A": 1, "B": 3}, []), ({"A": 1}, ["B"]), ({"B": 4}, []), ({"B": 4}, [])]
        assert r["B"].num_preemptions == 1
    assert _times(r["A"]) == (0.0, 1.0, 3.0)
    assert r["B"].finish_time == 5.0 and r["B"].first_scheduled_time == (3.0 if reserve else 1.0)


def test_prefix_cache_hit_skips_the_cached_units():
    # get_computed_blocks(): the longest run of cached leading blocks (never the prompt's last
    # token); the hit counts as computed tokens and as num_cached_tokens. Units of 4 tokens = 1 block.
    cfg = _cfg(20, bs=4, budget=16, enable_prefix_caching=True)
    A = _req("A", 0, 0.0, 9, 2, hash_ids=(1, 2))
    B = _req("B", 1, 1.5, 9, 1, hash_ids=(1, 2))
    sched, rows, r, rep = _run(cfg, [A, B], hash_block_tokens=4)
    assert [s for s, _ in sched] == [{"A": 9}, {"A": 1}, {"B": 1}]
    assert r["A"].num_cached_tokens == 0 and r["B"].num_cached_tokens == 8
    assert _times(r["B"]) == (2.0, 3.0, 3.0)
    kv = rep.scheduler.kv
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (18, 8)
    assert kv.num_free_blocks == 20  # everything returned (the units stay cached, evictable)


def test_client_timeout_and_queue_time_shedding_apply_at_step_boundaries():
    # one request at a time; B's client gives up 2 s after arriving (at 2.2) while it waits,
    # C is shed after 1 s in the queue (at 1.5); both are applied at the next step boundary
    # and stamped with the deadline itself
    cfg = _cfg(100, seqs=1, class_max_queue_time_s={"C": 1.0})
    A = _req("A", 0, 0.0, 1, 5)
    B = _req("B", 1, 0.2, 1, 1)
    C = _req("C", 2, 0.5, 1, 1)
    sched, _, r, _ = _run(cfg, [A, B, C], timeout_s={"B": 2.0})
    assert [s for s, _ in sched] == [{"A": 1}] + [{"A": 1}] * 4
    assert (r["B"].outcome, r["B"].finish_time) == ("timeout", 2.2)
    assert (r["C"].outcome, r["C"].finish_time, r["C"].reason) == ("rejected", 1.5, "queue time limit")
    assert r["A"].finish_time == 5.0 and r["A"].outcome == "ok"


def test_admission_control_rejects_arrivals_when_the_queue_is_full():
    # max_waiting = 1: arrivals are taken at the step boundary (t = 1), B joins the queue, C
    # finds it full and is rejected at its arrival time; an over-long request never enters
    cfg = _cfg(10, seqs=1, max_waiting=1)
    A = _req("A", 0, 0.0, 1, 3)
    B = _req("B", 1, 0.1, 1, 1)
    C = _req("C", 2, 0.2, 1, 1)
    D = _req("D", 3, 0.3, 30, 20)  # 50 tokens > M = 40
    sched, _, r, _ = _run(cfg, [A, B, C, D])
    assert (r["C"].outcome, r["C"].finish_time, r["C"].reason) == ("rejected", 0.2, "waiting queue full")
    assert r["D"].outcome == "rejected" and "exceeds the KV cache" in r["D"].reason
    assert _times(r["B"]) == (3.0, 4.0, 4.0)


def test_a_replica_on_a_shared_clock():
    # advance(until) applies the steps that end by `until`; a step in progress is visible in
    # state() and next_event_time() is its end
    done = []
    rep = ReferenceReplica(_cfg(10, budget=4), 1.0, on_finish=done.append)
    A = _req("A", 0, 0.5, 6, 2)
    rep.submit(A)
    assert rep.next_event_time() == 0.5
    rep.advance(0.7)  # A arrived at 0.5 and its first chunk runs in [0.5, 1.5)
    st = rep.state()
    assert st["busy"] and st["num_running"] == 1 and st["kv_blocks_used"] == 1
    assert st["queued_prefill_tokens"] == 6  # the prompt is not computed yet
    assert rep.next_event_time() == 1.5 and A.num_computed_tokens == 0
    rep.advance(1.5)
    assert A.num_computed_tokens == 4 and rep.next_event_time() == 2.5  # the second chunk began at 1.5
    rep.advance(10.0)
    assert done == [A] and A.outcome == "ok" and A.finish_time == 3.5 and A.status is RequestStatus.FINISHED
    assert rep.next_event_time() == math.inf and rep.state()["kv_blocks_free"] == 10
