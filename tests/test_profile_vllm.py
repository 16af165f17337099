"""``llmqueue profile`` against vLLM's CPU build (marked ``vllm``; ``bash scripts/ci_vllm.sh``).

The shared test server (tests/conftest.py: max_num_seqs 16, the tiny 512x4 Llama) is profiled
within a minute, then held-out closed-loop runs at a prompt length the profile did not use
measure the decode step at batch 1, 2, 4 and 16 from the iteration log: the profile model must
predict each within 30 %, and the median of their absolute errors within 15 %. This is a gate
against a broken profile (a wrong unit, context or batch axis), not issue 17's bar: that is 10 %
a batch, measured by ``benchmarks/profile_vllm.py`` (the same 512x4 model on a 64-sequence server,
batch 30 held out, four held-out rounds; figures in docs/benchmarks.md). Why the gate here is
this wide: this tiny model's steps take 7-18 ms, and on a 2-core AMD EPYC VM a single cell of
either side moves by 10-20 % between runs a minute apart. That engine's decode step at batch 4
runs *faster* than at batch 2 (6.6 against 8.5 ms in both passes of a profile); the model keeps
such a dip when it exceeds two standard errors of the levels (their wander between the
profile's two passes included) and pools it otherwise. With the dips pooled always (the model
before), batch 4 came out +13 to +22 % in six of seven runs; with the rule, two runs gave
+6.0 / +2.7 / -2.3 / +2.2 % and +4.0 / -2.0 / -3.8 / -0.5 % at batch 1 / 2 / 4 / 16. The held-out runs bracket the profile
(one pass before it, one after, after a warm-up level) so that a drift of the engine's speed over
the test, or a fresh server warming up, moves both sides alike (held out after the profile only,
two runs were biased +10 % on the mean).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.vllm


def test_profile_predicts_held_out_decode_steps(vllm_server, tmp_path):
    from llmqueue.bench.profile import measure_level, pool_cells, run_profile
    from llmqueue.engine.step_time import parse_step_time

    srv = vllm_server
    runs: dict = {}

    def held_out(k: int) -> None:
        for c in (1, 2, 4, 16):
            cell = measure_level(srv.url, srv.model, 200, c, 96, tmp_path / f"held-b{c}-{k}", server_log=srv.log_path,
                                 vocab_size=4096, seed=7 + k, progress=False)
            assert cell is not None and cell["source"] == "iteration log"
            runs.setdefault((200, c), []).append(cell)

    # a warm-up level (discarded), then the held-out pass 0, the profile, the held-out pass 1
    measure_level(srv.url, srv.model, 200, 16, 32, tmp_path / "warm-up", server_log=srv.log_path,
                  vocab_size=4096, seed=3, progress=False)
    held_out(0)
    doc = run_profile(srv.url, srv.model, tmp_path / "p", contexts=[64, 384], output_tokens=64, budget_s=60,
                      server_log=srv.log_path, vocab_size=4096, passes=2)
    held_out(1)
    assert doc["source"] == "iteration log"
    assert max(c["batch"] for c in doc["decode"]) == 16                 # the ladder stops at max_num_seqs
    assert doc["prefill"]["r2"] > 0.9 and doc["prefill"]["per_token_s"] > 0
    model = parse_step_time(f"profile:{tmp_path / 'p'}")
    errs = {}
    for cell in pool_cells(runs):
        n = cell["batch"]
        pred = model.base(0, n, int(round(n * cell["context_tokens"])))
        errs[n] = pred / cell["median_s"] - 1
    shown = {n: f"{100 * e:+.1f}%" for n, e in errs.items()}
    print("held-out decode steps, profile error:", shown)
    assert sorted(errs) == [1, 2, 4, 16]
    assert all(abs(e) <= 0.30 for e in errs.values()), shown
    assert float(np.median(np.abs(list(errs.values())))) <= 0.15, shown
    assert np.isfinite(list(errs.values())).all()
