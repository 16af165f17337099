"""Shared fixtures.

``vllm_server`` (session scope): a real vLLM CPU server on 127.0.0.1 serving a tiny random-weight
Llama, for the tests marked ``@pytest.mark.vllm`` (excluded by default; run them with
``bash scripts/ci_vllm.sh`` or ``python -m pytest -q -m vllm`` once ``scripts/vllm_cpu_env.sh``
has made the venv). They skip, saying why, when the venv is missing.

Environment: ``LLMQUEUE_VLLM_VENV`` (the venv, default ``.vllm-venv``), ``LLMQUEUE_VLLM_WORK``
(models, caches and server logs, default ``.vllm-work``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The server the vllm tests share: small enough to start and answer quickly on 2 cores.
VLLM_TEST_MODEL = dict(hidden_size=512, num_layers=4, heads=8, kv_heads=4, vocab_size=4096,
                       max_position_embeddings=2048, seed=0)
VLLM_TEST_SERVER = dict(block_size=32, max_num_seqs=16, max_num_batched_tokens=2048,
                        max_model_len=1024, kvcache_space_gib=1)


def _vllm_venv() -> Path:
    v = Path(os.environ.get("LLMQUEUE_VLLM_VENV") or REPO / ".vllm-venv")
    return v if v.is_absolute() else REPO / v


def _vllm_work() -> Path:
    w = Path(os.environ.get("LLMQUEUE_VLLM_WORK") or REPO / ".vllm-work")
    return w if w.is_absolute() else REPO / w


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The vLLM venv; skips the test when ``scripts/vllm_cpu_env.sh`` has not made it."""
    from llmqueue.bench.engine import vllm_version

    venv = _vllm_venv()
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no vLLM venv at {venv}: run scripts/vllm_cpu_env.sh (or set LLMQUEUE_VLLM_VENV)")
    if vllm_version(venv) is None:
        pytest.skip(f"the vLLM venv at {venv} is incomplete (no version marker): rerun scripts/vllm_cpu_env.sh")
    return venv


@pytest.fixture(scope="session")
def vllm_model_dir(vllm_venv) -> Path:
    """A tiny random-weight Llama (built once, reused across sessions under ``.vllm-work``)."""
    from llmqueue.bench.engine import build_tiny_model

    m = VLLM_TEST_MODEL
    name = f"tiny-llama-{m['hidden_size']}x{m['num_layers']}-v{m['vocab_size']}"
    return build_tiny_model(_vllm_work() / "models" / name, venv=vllm_venv, **m)


@pytest.fixture(scope="session")
def vllm_server(vllm_venv, vllm_model_dir):
    """A running :class:`llmqueue.bench.engine.VllmServer` (stopped at the end of the session)."""
    from llmqueue.bench.engine import VllmServer

    work = _vllm_work()
    log = work / "logs" / f"pytest-vllm-{os.getpid()}.log"
    with VllmServer(vllm_model_dir, venv=vllm_venv, work_dir=work, log_path=log,
                    **VLLM_TEST_SERVER) as srv:
        yield srv
