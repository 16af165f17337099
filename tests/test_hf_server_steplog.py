"""``benchmarks/hf_server.py`` without torch: its step log is vLLM's iteration-detail format as the
project reads it, and its Llama-3.1-8B shape is the catalog's.

The GPU fidelity run (``benchmarks/gpu_fidelity.py``) serves transformers' continuous batching
through this server; calibrate, validate and ``llmqueue profile`` take the engine's steps from its
log exactly as from vLLM's (``llmqueue.bench.prom.parse_iteration_log``). A change of either side
that breaks the other would leave a GPU run without step records, found only after the GPU time
was spent: this test finds it here.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

from llmqueue.bench.prom import iteration_steps, read_iteration_log

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hf_server():
    spec = importlib.util.spec_from_file_location("hf_server", REPO / "benchmarks" / "hf_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fs(generated: int, query: int):
    """A scheduled request as transformers' scheduler hands it over (FutureRequestState's fields)."""
    return types.SimpleNamespace(state=types.SimpleNamespace(generated_len=lambda: generated), query_length=query)


def test_step_lines_parse_as_vllm_iteration_details(hf_server, tmp_path):
    path = tmp_path / "server.log"
    free = {"n": 100}
    log = hf_server.StepLog(str(path), lambda: (free["n"], 128))
    steps = [  # (scheduled requests, seconds the step takes)
        ([_fs(0, 512)], 0.020),                                    # one prompt chunk
        ([_fs(0, 200), _fs(3, 1), _fs(7, 1)], 0.030),              # a mixed step: a prompt's last chunk + 2 decodes
        ([_fs(1, 1), _fs(4, 1), _fs(8, 1)], 0.010),                # decode only
    ]
    for reqs, dur in steps:
        log.t0 = 1_800_000_000.0
        log.scheduled(reqs)
        import time as _t

        real = _t.time
        _t.time = lambda d=dur: 1_800_000_000.0 + d  # the step's end, as the engine loop would stamp it
        try:
            log.ended()
        finally:
            _t.time = real
        free["n"] -= 10
    log.f.close()
    cols = read_iteration_log(path)
    assert list(cols["prefill_reqs"]) == [1, 1, 0]
    assert list(cols["prefill_tokens"]) == [512, 200, 0]
    assert list(cols["decode_seqs"]) == [0, 2, 3]
    assert cols["duration_s"] == pytest.approx([0.020, 0.030, 0.010], abs=1e-5)
    assert cols["kv_usage"] == pytest.approx([1 - 100 / 128, 1 - 90 / 128, 1 - 80 / 128], abs=1e-3)
    assert cols["t_log"] == pytest.approx([1_800_000_000.02, 1_800_000_000.03, 1_800_000_000.01], abs=1e-5)
    # and into step records: the stamp is the step's end, so the start is the stamp less the duration
    rec = iteration_steps(cols, t0_wall=1_800_000_000.0, M=128 * 256)
    assert rec["start_s"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-5)


def test_no_log_file_writes_nothing(hf_server):
    log = hf_server.StepLog(None, lambda: (0, 0))
    log.scheduled([_fs(0, 4)])
    log.ended()  # no file: a no-op, not an error
    assert log.n == 0


def test_llama_31_8b_shape_is_the_catalogs(hf_server):
    from llmqueue.hardware import get_model

    cfg = hf_server.model_config("llama-3.1-8b")
    m = get_model("llama-3.1-8b")
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["vocab_size"]) == (m.n_layers, m.hidden_size, m.n_heads, m.n_kv_heads,
                                                             m.intermediate_size, m.vocab_size)
    with pytest.raises(SystemExit, match="unknown model"):
        hf_server.model_config("gpt-5")
