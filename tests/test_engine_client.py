"""Client behaviour inside the engine: timeouts, TTFT timeouts and retries, as records show them."""

import numpy as np

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.options import SimOptions
from llmqueue.workload import Workload


def _overloaded():
    reqs = Workload("poisson:20", prompt="uniform:100:400", output="uniform:20:60").generate(seed=3, n=600)
    cfg = EngineConfig.from_capacity(20_000, max_num_seqs=8)
    return reqs, cfg


def test_ttft_timeout_cancels_only_requests_without_a_first_token():
    reqs, cfg = _overloaded()
    r = simulate(cfg, 0.02, reqs, options=SimOptions(ttft_timeout_s={"default": 1.0}))
    q = r.requests
    st = q["status"]
    to = st == "timeout"
    assert to.sum() > 50 and (st == "ok").sum() > 50
    # timed-out requests had no first token by arrival + 1 s, and ended exactly then
    assert (np.isnan(q["first_token_s"][to]) | (q["first_token_s"][to] > q["arrival_s"][to] + 1.0)).all()
    np.testing.assert_allclose(q["finish_s"][to], q["arrival_s"][to] + 1.0)
    # finished ones got their first token in time (they may take longer overall)
    ok = st == "ok"
    assert (q["first_token_s"][ok] <= q["arrival_s"][ok] + 1.0 + 1e-9).all()
    assert (q["finish_s"][ok] - q["arrival_s"][ok] > 1.0).any()


def test_retries_share_the_request_id_and_count_attempts():
    reqs, cfg = _overloaded()
    cfg = cfg.with_(max_waiting=5)

    def retry(rid, attempt, status, t):
        return t + 0.5 if status == "rejected" and attempt < 3 else None

    r = simulate(cfg, 0.02, reqs, options=SimOptions(retry=retry))
    q = r.requests
    assert q["attempt"].max() == 3
    # every retry follows a rejected attempt of the same request, 0.5 s after it ended
    for rid in np.unique(q["request_id"][q["attempt"] > 1])[:50]:
        rows = np.nonzero(q["request_id"] == rid)[0]
        rows = rows[np.argsort(q["attempt"][rows])]
        for a, b in zip(rows[:-1], rows[1:]):
            assert q["status"][a] == "rejected"
            assert q["arrival_s"][b] == q["finish_s"][a] + 0.5
    # retry amplification: more attempts than requests
    assert len(q["request_id"]) > len(reqs)
    assert len(np.unique(q["request_id"])) == len(reqs)


def test_per_class_admission_control():
    from llmqueue.workload.generate import RequestArrays

    a = Workload("poisson:10", prompt="uniform:100:400", output="uniform:20:60", class_name="interactive").generate(seed=1, n=300)
    b = Workload("poisson:10", prompt="uniform:100:400", output="uniform:20:60", class_name="batch").generate(seed=2, n=300)
    reqs = RequestArrays.merge(a, b)
    cfg = EngineConfig.from_capacity(20_000, max_num_seqs=8, class_max_waiting={"batch": 3},
                                     class_max_queue_time_s={"interactive": 2.0})
    r = simulate(cfg, 0.02, reqs, options=SimOptions())
    q = r.requests
    cls, st = q["class"], q["status"]
    # batch: rejected at arrival when 3 of its own wait; interactive: shed after 2 s of waiting
    rb = (cls == "batch") & (st == "rejected")
    ri = (cls == "interactive") & (st == "rejected")
    assert rb.sum() > 0 and ri.sum() > 0
    np.testing.assert_allclose(q["finish_s"][rb], q["arrival_s"][rb])
    np.testing.assert_allclose(q["finish_s"][ri], q["arrival_s"][ri] + 2.0)
    assert np.isnan(q["first_scheduled_s"][rb | ri]).all()
    ok_i = (cls == "interactive") & (st == "ok")
    assert (q["first_scheduled_s"][ok_i] - q["arrival_s"][ok_i] <= 2.0 + 0.05).all()
