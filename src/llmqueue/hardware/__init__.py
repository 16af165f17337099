"""Hardware layer: model shapes, GPU specs, KV bytes per token, weight memory, KV capacity ``M``.

Pure arithmetic on the nouns of :mod:`~llmqueue.hardware.specs`, read from a small catalog
(:mod:`~llmqueue.hardware.catalog`) or a user's Hugging Face ``config.json``
(:mod:`~llmqueue.hardware.hf_config`); see :mod:`~llmqueue.hardware.memory` for the formulas.
Imports nothing heavy.
"""

from llmqueue.hardware.catalog import GPUS, MODELS, get_gpu, get_model, gpu_names, model_names
from llmqueue.hardware.hf_config import model_from_hf_config
from llmqueue.hardware.memory import (
    DEFAULT_RESERVE_BYTES,
    DTYPE_BYTES,
    Concurrency,
    KvCapacity,
    active_param_count,
    kv_bytes_per_token,
    kv_capacity,
    max_concurrent_requests,
    param_count,
    per_gpu_kv_bytes_per_token,
    resolve_dtype,
    weight_bytes,
)
from llmqueue.hardware.specs import GpuSpec, ModelSpec

__all__ = [
    "DEFAULT_RESERVE_BYTES", "DTYPE_BYTES", "GPUS", "MODELS", "Concurrency", "GpuSpec", "KvCapacity", "ModelSpec",
    "active_param_count", "get_gpu", "get_model", "gpu_names", "kv_bytes_per_token", "kv_capacity",
    "max_concurrent_requests", "model_from_hf_config", "model_names", "param_count", "per_gpu_kv_bytes_per_token",
    "resolve_dtype", "weight_bytes",
]
