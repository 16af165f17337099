"""The reference replica driven live (an emulator's needs): every token as its step ends
(``on_token``), and aborts that free a request's KV at the next step boundary, as vLLM frees an
aborted request's blocks before its next schedule. Steps take 1 s, so the times are worked by hand.
"""

import math

from llmqueue.engine import EngineConfig
from llmqueue.engine.reference import ReferenceReplica
from llmqueue.engine.request import Request, RequestStatus


def _cfg(blocks, bs=4, budget=8192, seqs=256):
    return EngineConfig(num_kv_blocks=blocks, block_size=bs, max_num_batched_tokens=budget, max_num_seqs=seqs)


def _req(seq, arrival, prompt, out):
    return Request(request_id=seq, arrival_time=arrival, num_prompt_tokens=prompt, max_tokens=out, seq=seq)


def test_on_token_sees_every_token_at_its_steps_end_before_the_finish():
    events = []
    rep = ReferenceReplica(_cfg(20, budget=4), 1.0, on_token=lambda r, t: events.append(("tok", r.seq, t)),
                           on_finish=lambda r: events.append(("fin", r.seq, r.finish_time)))
    a, b = _req(0, 0.0, 6, 3), _req(1, 0.0, 2, 2)
    rep.submit(a)
    rep.submit(b)
    rep.run()
    # budget 4: step [0,1) prefills a:4; [1,2) a:2 + b:2 (both prompts end: a token each, in
    # schedule order); [2,3) a:1 b:1 (b's second token: it finishes); [3,4) a:1 (a finishes)
    assert events == [("tok", 0, 2.0), ("tok", 1, 2.0), ("tok", 0, 3.0), ("tok", 1, 3.0), ("fin", 1, 3.0),
                      ("tok", 0, 4.0), ("fin", 0, 4.0)]
    assert (a.first_token_time, a.finish_time) == (2.0, 4.0)


def test_on_token_counts_each_token_once_across_a_preemption():
    # 3 blocks of 4 tokens: two requests that each grow to 8 tokens cannot both hold their KV, so
    # one is preempted and recomputed; the tokens it recomputes are not emitted again
    seen = {}
    rep = ReferenceReplica(_cfg(3, budget=64), 1.0, on_token=lambda r, t: seen.setdefault(r.seq, []).append(t))
    reqs = [_req(0, 0.0, 4, 4), _req(1, 0.0, 4, 4)]
    for r in reqs:
        rep.submit(r)
    rep.run()
    assert sum(r.num_preemptions for r in reqs) >= 1
    for r in reqs:
        assert r.outcome == "ok" and len(seen[r.seq]) == r.max_tokens == r.num_output_tokens
        assert seen[r.seq][0] == r.first_token_time and seen[r.seq][-1] == r.finish_time


def test_abort_frees_the_kv_at_the_next_step_boundary():
    done = []
    rep = ReferenceReplica(_cfg(10), 1.0, on_finish=done.append)
    a, b = _req(0, 0.0, 4, 10), _req(1, 0.0, 4, 5)
    rep.submit(a)
    rep.submit(b)
    rep.step_at(2.5)                      # steps [0,1) prefill, [1,2) decode; [2,3) in progress
    used = rep.state()["kv_blocks_used"]
    rep.abort(a, at=2.5)
    assert not a.is_finished and rep.state()["kv_blocks_used"] == used  # the step in progress keeps it
    rep.step_at(3.0)                      # the boundary at 3: a leaves before the next schedule
    assert (a.outcome, a.finish_time, a.status) == ("cancelled", 3.0, RequestStatus.FINISHED)
    assert rep.state()["num_running"] == 1 and a not in rep.in_system()
    rep.step_at(math.inf)
    assert b.outcome == "ok" and [r.seq for r in done] == [0, 1]
    assert rep.state()["kv_blocks_free"] == 10 and rep.next_event_time() == math.inf


def test_abort_of_a_waiting_an_unseen_and_a_finished_request():
    rep = ReferenceReplica(_cfg(10, seqs=1), 1.0)
    a, b, c = _req(0, 0.0, 4, 2), _req(1, 0.0, 4, 2), _req(2, 5.0, 4, 2)
    for r in (a, b, c):
        rep.submit(r)
    rep.step_at(0.5)                      # a runs, b waits (max_num_seqs 1), c arrives at 5
    rep.abort(b, at=0.5)
    rep.abort(c, at=0.5)
    rep.step_at(1.0)
    assert (b.outcome, b.finish_time) == ("cancelled", 1.0) and (c.outcome, c.finish_time) == ("cancelled", 1.0)
    rep.step_at(10.0)
    assert a.outcome == "ok" and a.finish_time == 2.0
    rep.abort(a, at=10.0)                 # already finished: left alone
    rep.step_at(11.0)
    assert a.outcome == "ok" and rep.load().num_waiting == 0


def test_an_idle_replica_takes_an_abort_out_at_its_own_time():
    rep = ReferenceReplica(_cfg(10), 1.0)
    late = _req(0, 7.0, 4, 2)
    rep.submit(late)
    rep.step_at(3.0)
    rep.abort(late, at=3.25)
    assert rep.next_event_time() == 3.25
    rep.step_at(3.25)
    assert (late.outcome, late.finish_time) == ("cancelled", 3.25) and rep.next_event_time() == math.inf
