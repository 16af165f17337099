"""Trace statistics against independent truths: the shared traces' ``summary_stats.json``
(computed by ``compute_stats.py`` with pandas), hand-counted small cases, the literal step
trajectory of g(s, o), and Monte Carlo Poisson and gamma-renewal streams."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.theory.kv import g_steps
from llmqueue.workload.stats import arrival_stats, prefix_reuse, spec_stats, trace_stats
from llmqueue.workload.trace import Trace
from llmqueue.workload.traces import load_trace

REPO = Path(__file__).resolve().parents[1]

TRACES = ["azure_llm_2023/AzureLLMInferenceTrace_code.csv", "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
          "mooncake_fast25/conversation_trace.jsonl", "mooncake_fast25/synthetic_trace.jsonl"]


def shared_traces() -> Path:
    """``../shared/traces`` beside the repository; skip when absent (a user's clone has none)."""
    d = REPO.parent / "shared" / "traces"
    if not (d / "summary_stats.json").is_file():
        pytest.skip(f"shared traces not found at {d} (only the team's workspace has ../shared)")
    return d


def flat(st) -> dict:
    """TraceStats in summary_stats.json's names."""
    d = st.to_dict()
    out = {"rows": d["n"], "span_s": d["span_s"], "mean_rps": d["mean_rate"], "iat_cv": d["iat_cv"],
           "frac_zero_iat": d["frac_zero_iat"]}
    for k, v in d["idc"].items():
        out[f"idc_{k}"] = v
    for k, v in d["peak_to_mean"].items():
        out[f"peak_to_mean_{k}"] = v
    for p, role in (("in", "prompt"), ("out", "output")):
        for q, v in d[role].items():
            out[f"{p}_{q}"] = v
    if d["prefix_reuse_frac"] is not None:
        out["prefix_block_reuse_frac"] = d["prefix_reuse_frac"]
    return out


@pytest.mark.parametrize("rel", TRACES)
def test_shared_traces_match_summary_stats(rel):
    d = shared_traces()
    ref = json.loads((d / "summary_stats.json").read_text())[rel]
    got = flat(trace_stats(load_trace(d / rel), bins=(1, 3, 60)))
    compared = 0
    for k, v in got.items():
        if k in ref:
            # summary_stats.json rounds to 4 decimals: allow that, else agree to 1e-6 relative.
            assert v == pytest.approx(ref[k], rel=1e-6, abs=5.1e-5), k
            compared += 1
    assert compared >= 22
    if rel.startswith("mooncake"):
        assert "prefix_block_reuse_frac" in got


def test_readme_headline_figures_within_one_percent():
    d = shared_traces()
    conv = trace_stats(load_trace(d / TRACES[1]))
    assert conv.mean_rate == pytest.approx(5.53, rel=0.01) and conv.iat_cv == pytest.approx(1.09, rel=0.01)
    assert conv.prompt.mean == pytest.approx(1155, rel=0.01) and conv.output.mean == pytest.approx(211, rel=0.01)
    assert conv.idc["1s"] == pytest.approx(1.39, rel=0.01) and conv.idc["60s"] == pytest.approx(16.1, rel=0.01)
    code = trace_stats(load_trace(d / TRACES[0]))
    assert code.iat_cv == pytest.approx(13.15, rel=0.01) and code.idc["60s"] == pytest.approx(164, rel=0.01)
    mc = trace_stats(load_trace(d / TRACES[2]), bins=(3, 60))
    assert mc.idc["3s"] == pytest.approx(5.79, rel=0.01) and mc.idc["60s"] == pytest.approx(2.90, rel=0.01)
    assert mc.prefix_reuse_frac == pytest.approx(0.366, abs=0.0005)
    syn = trace_stats(load_trace(d / TRACES[3]))
    assert syn.prefix_reuse_frac == pytest.approx(0.640, abs=0.0005)
    assert syn.iat_cv == pytest.approx(1.01, rel=0.01)


def test_counts_by_hand():
    t = [0, 0.5, 1.2, 1.3, 1.4, 2.5, 3.1]  # 1 s bins: counts 2, 3, 1 and a partial bin (dropped)
    a = arrival_stats(t, bins=(1, 2))
    assert a["idc"]["1s"] == pytest.approx((2 / 3) / 2) and a["peak_to_mean"]["1s"] == pytest.approx(1.5)
    assert math.isnan(a["idc"]["2s"])  # bins 0-2 (5) and a partial 2-4: one complete bin only
    assert a["mean_rate"] == pytest.approx(6 / 3.1)
    iat = np.diff(t)
    assert a["iat_cv"] == pytest.approx(iat.std() / iat.mean())


def test_lengths_correlation_and_e_g_by_hand():
    s = np.array([1, 2, 3, 4, 100])
    o = 2 * s + 1
    st = trace_stats(Trace(np.arange(5.0), s, o), chunk=2)
    assert (st.prompt.mean, st.prompt.p50, st.prompt.min, st.prompt.max) == (22, 3, 1, 100)
    assert st.prompt.p90 == pytest.approx(4 + 0.6 * 96)  # linear: position 0.9 * 4 = 3.6
    assert st.prompt.p99 == pytest.approx(4 + 0.96 * 96)
    assert st.corr == pytest.approx(1.0)
    # E[g]: the mean over requests of the KV tokens held, summed step by step.
    assert st.E_g == pytest.approx(np.mean([sum(g_steps(int(a), int(b), 2)) for a, b in zip(s, o)]))
    assert st.n == 5 and st.mean_rate == pytest.approx(1.0) and st.prefix_reuse_frac is None


def test_prefix_reuse_by_hand_and_against_the_literal_loop():
    # [1,2,3]: 0 reused; [1,2,4]: 1, 2; [5]: 0; [4,4]: both (4 was in request 1); [7,7]: 0
    # (a repeat inside one request is not reuse by an earlier request).
    assert prefix_reuse([[1, 2, 3], [1, 2, 4], [5], [4, 4], [7, 7]]) == pytest.approx(4 / 11)
    rng = np.random.default_rng(3)
    hs = [rng.integers(0, 200, k) for k in rng.integers(0, 30, 400)]
    seen, tot, hit = set(), 0, 0
    for h in hs:  # compute_stats.py's loop
        tot += len(h)
        hit += sum(int(b) in seen for b in h)
        seen.update(int(b) for b in h)
    assert prefix_reuse(hs) == pytest.approx(hit / tot, rel=1e-15)


def test_poisson_and_gamma_streams_monte_carlo():
    # Poisson: IAT CV 1 and IDC 1 at every bin width. 200k arrivals at 5/s, 40k one-second bins:
    # the sd of the IDC estimate is about sqrt(2/k) = 0.007.
    st = spec_stats("poisson:5", prompt="fixed:100", output="fixed:10", n=200_000, seed=11, bins=(1, 10))
    assert st.iat_cv == pytest.approx(1, abs=0.01)
    assert st.idc["1s"] == pytest.approx(1, abs=0.03) and st.idc["10s"] == pytest.approx(1, abs=0.1)
    assert st.mean_rate == pytest.approx(5, rel=0.01)
    assert st.prompt.mean == 100 and math.isnan(st.corr)
    assert st.generated == {"arrival": "poisson:5", "prompt": "fixed:100", "output": "fixed:10",
                            "class": "default", "n": 200_000, "seed": 11}
    # Gamma renewal with CV 2: IDC of long bins tends to cv^2 = 4 (renewal-process limit).
    g = spec_stats("gamma:5:cv=2", prompt="fixed:100", output="fixed:10", n=300_000, seed=5, bins=(200,))
    assert g.iat_cv == pytest.approx(2, rel=0.05)
    assert g.idc["200s"] == pytest.approx(4, rel=0.25)
    # Same seed, same numbers.
    assert spec_stats("poisson:5", prompt="fixed:100", output="fixed:10", n=1000, seed=11) == \
        spec_stats("poisson:5", prompt="fixed:100", output="fixed:10", n=1000, seed=11)


def test_bad_arguments():
    tr = Trace(np.arange(3.0), np.array([1, 2, 3]), np.array([1, 2, 3]))
    with pytest.raises(InputError, match="chunk"):
        trace_stats(tr, chunk=0)
    with pytest.raises(InputError, match="bins"):
        trace_stats(tr, bins=(0,))
    with pytest.raises(InputError, match="lengths"):
        spec_stats("poisson:5", prompt="fixed:1")
