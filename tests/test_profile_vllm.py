"""``llmqueue profile`` against vLLM's CPU build (marked ``vllm``; ``bash scripts/ci_vllm.sh``).

The shared test server (tests/conftest.py: max_num_seqs 16, the tiny 512x4 Llama) is profiled
within a minute, then held-out closed-loop runs at a prompt length the profile did not use
measure the decode step at batch 1, 2, 4 and 16 from the iteration log: the profile model must
predict each within 15 %. Issue 17's bar is 10 %, measured by ``benchmarks/profile_vllm.py`` (batch
30 on a 64-sequence server, figures in docs/benchmarks.md); this machine's engine speed moves by
10-25 % between runs minutes apart, so the gate here is wider (a CI run must not fail on that noise).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.vllm


def test_profile_predicts_held_out_decode_steps(vllm_server, tmp_path):
    from llmqueue.bench.profile import measure_level, pool_cells, run_profile
    from llmqueue.engine.step_time import parse_step_time

    srv = vllm_server
    doc = run_profile(srv.url, srv.model, tmp_path / "p", contexts=[64, 384], output_tokens=64, budget_s=60,
                      server_log=srv.log_path, vocab_size=4096, passes=2)
    assert doc["source"] == "iteration log"
    assert max(c["batch"] for c in doc["decode"]) == 16                 # the ladder stops at max_num_seqs
    assert doc["prefill"]["r2"] > 0.9 and doc["prefill"]["per_token_s"] > 0
    model = parse_step_time(f"profile:{tmp_path / 'p'}")
    runs: dict = {}
    for k in range(2):
        for c in (1, 2, 4, 16):
            cell = measure_level(srv.url, srv.model, 200, c, 96, tmp_path / f"held-b{c}-{k}", server_log=srv.log_path,
                                 vocab_size=4096, seed=7 + k, progress=False)
            assert cell is not None and cell["source"] == "iteration log"
            runs.setdefault((200, c), []).append(cell)
    errs = {}
    for cell in pool_cells(runs):
        n = cell["batch"]
        pred = model.base(0, n, int(round(n * cell["context_tokens"])))
        errs[n] = pred / cell["median_s"] - 1
    assert all(abs(e) <= 0.15 for e in errs.values()), {n: f"{100 * e:+.1f}%" for n, e in errs.items()}
    assert np.isfinite(list(errs.values())).all()
