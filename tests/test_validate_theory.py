"""``validate``'s theory: the least of the replica's KV, slot and token-budget bounds, with the
binding one's verdict (``llmqueue.bench.validate.replica_theory``).

Hand-computed cases: ``b`` = 0.1 s, requests of 100 prompt and 50 output tokens, chunk 512.
The slot bound is ``max_num_seqs / (b (ceil(100/512) + 50 - 1)) = seqs / 5``; the token bound
``512 / (0.1 x 149) = 34.36``; the KV bound ``M / (b E[g])``.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmqueue.bench.validate import replica_theory
from llmqueue.theory.kv import kv_stability

S = np.full(200, 100.0)
O = np.full(200, 50.0)


def _theory(M: float, seqs: int, lam: float):
    kv = kv_stability(M=M, b=0.1, chunk=512, pairs=(S, O), lam=lam)
    return kv, replica_theory(kv, b=0.1, max_num_seqs=seqs, chunk=512, s=S, o=O, lam=lam)


def test_a_cache_that_never_fills_is_slot_bound():
    kv, th = _theory(M=1e7, seqs=32, lam=7.0)  # mu_seqs = 32 / 5 = 6.4 req/s; the KV bound is huge
    assert th["binding"] == "max_num_seqs"
    assert th["mu"] == pytest.approx(6.4)
    assert th["mu_kv"] == pytest.approx(kv.mu) and kv.mu > 100
    assert th["verdict"] == "unstable" and kv.verdict == "stable"  # the KV bound alone said stable
    assert th["rho"] == pytest.approx(7.0 / 6.4)
    assert _theory(M=1e7, seqs=32, lam=6.0)[1]["verdict"] == "stable"


def test_a_small_cache_keeps_the_kv_models_verdict_and_band():
    kv, th = _theory(M=2000.0, seqs=256, lam=2.0)
    assert th["binding"].startswith("KV cache")
    assert th["mu"] == pytest.approx(kv.mu) and th["mu"] < th["mu_seqs"] and th["mu"] < th["mu_tokens"]
    assert th["verdict"] == kv.verdict
    assert th["delta"] == pytest.approx(kv.delta)  # the KV model's fields are kept


def test_the_token_budget_can_bind():
    _, th = _theory(M=1e9, seqs=100_000, lam=1.0)
    assert th["binding"] == "token budget"
    assert th["mu"] == pytest.approx(512 / (0.1 * 149))
