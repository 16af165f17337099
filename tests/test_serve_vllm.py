"""The emulator's ``/metrics`` against a real vLLM CPU server's (``scripts/ci_vllm.sh``): the same
metric families, types, label names and histogram buckets, scraped from both (nothing here is
written from memory). vLLM's ``http_*`` families come from its HTTP framework's instrumentation,
not from the engine, and are left out."""

from __future__ import annotations

import httpx
import pytest

from llmqueue.serve.launch import EmulatorProcess

pytestmark = pytest.mark.vllm


def _families(text: str) -> dict:
    """``{family: (type, {sample name: set of label-name tuples}, {sample name: le values})}``."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for f in text_string_to_metric_families(text):
        if f.name.startswith("http_"):
            continue
        labels, les = {}, {}
        for s in f.samples:
            labels.setdefault(s.name, set()).add(tuple(sorted(k for k in s.labels if k != "le")))
            if "le" in s.labels:
                les.setdefault(s.name, []).append(s.labels["le"])
        out[f.name] = (f.type, labels, {k: tuple(dict.fromkeys(v)) for k, v in les.items()})
    return out


def test_metric_names_types_labels_and_buckets_equal_vllms(vllm_server):
    from conftest import VLLM_TEST_SERVER

    s = VLLM_TEST_SERVER
    with httpx.Client(base_url=vllm_server.url, timeout=120, trust_env=False) as c:
        c.post("/v1/completions", json={"model": vllm_server.model, "prompt": [11, 12, 13], "max_tokens": 3})
        real = _families(c.get("/metrics").text)
    with EmulatorProcess("--step-time", "0.01", "--capacity-tokens", "131072", "--block-size", str(s["block_size"]),
                         "--max-num-seqs", str(s["max_num_seqs"]), "--max-model-len", str(s["max_model_len"]),
                         "--max-num-batched-tokens", str(s["max_num_batched_tokens"]),
                         "--served-model-name", vllm_server.model) as emu, \
            httpx.Client(base_url=emu.url, timeout=30, trust_env=False) as c:
        c.post("/v1/completions", json={"prompt": [11, 12, 13], "max_tokens": 3})
        emulated = _families(c.get("/metrics").text)
    vllm_names = {n for n in real if n.startswith("vllm:")}
    assert vllm_names == {n for n in emulated if n.startswith("vllm:")}
    for name in vllm_names:
        assert emulated[name][0] == real[name][0], name                  # type
        assert emulated[name][1] == real[name][1], name                  # samples and their label names
        assert emulated[name][2] == real[name][2], name                  # histogram buckets
    missing = set(real) - set(emulated)
    assert not missing, f"families vLLM exports and the emulator does not: {sorted(missing)}"
