"""The hardware nouns: a model's shape (:class:`ModelSpec`) and an accelerator (:class:`GpuSpec`).

The catalog (:mod:`~llmqueue.hardware.catalog`) holds published instances of both, and
:mod:`~llmqueue.hardware.hf_config` reads a :class:`ModelSpec` from a Hugging Face
``config.json``; :mod:`~llmqueue.hardware.memory` turns them into KV bytes per token and the
KV capacity ``M``. ``GiB``/``MiB`` are the binary units the memory figures use.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmqueue._result import Result

GiB = 2**30
MiB = 2**20


@dataclass(frozen=True, kw_only=True)
class ModelSpec(Result):
    """Shape of a decoder-only transformer, enough for KV-cache and weight arithmetic.

    ``n_kv_heads < n_heads`` is grouped-query attention (GQA); equal is multi-head
    attention (MHA). ``mlp`` is ``"gated"`` (SwiGLU: gate, up, down projections,
    Llama/Mistral/Qwen) or ``"plain"`` (two projections, GPT-2/GPT-3). ``n_experts > 1``
    is a mixture of experts with ``experts_per_token`` routed experts per token.
    ``max_model_len`` is ``max_position_embeddings``. ``params_published`` is the
    published parameter count (None when unknown, e.g. a user's config.json).
    """

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    aliases: tuple[str, ...] = ()
    n_experts: int = 1
    experts_per_token: int = 1
    params_published: int | None = None
    tie_embeddings: bool = False
    mlp: str = "gated"            # "gated" (SwiGLU) or "plain" (4x MLP, GPT-style)
    norm: str = "rms"             # "rms" (weight only) or "layer" (weight and bias)
    qkv_bias: bool = False        # biases on q, k, v projections only (Qwen2)
    linear_bias: bool = False     # biases on every linear layer (GPT-2/GPT-3)
    learned_pos: bool = False     # learned absolute position embeddings (GPT-3) instead of RoPE
    moe_intermediate_size: int | None = None      # expert MLP width when it differs from intermediate_size
    shared_expert_intermediate_size: int = 0      # always-on shared expert (Qwen-MoE style), 0 if none
    dtype: str = "bf16"           # checkpoint dtype (torch_dtype)
    hf_id: str | None = None
    source: str = ""
    notes: str = ""

    @property
    def attention(self) -> str:
        """``"MHA"``, ``"GQA"`` or ``"MQA"`` (one KV head)."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1


@dataclass(frozen=True, kw_only=True)
class GpuSpec(Result):
    """One accelerator: memory, dense BF16 tensor throughput, memory bandwidth, indicative price.

    ``memory_bytes`` is the total as the driver reports it where known (see the module
    docstring); ``memory_label`` is the datasheet's wording; ``reported_mib`` the
    ``nvidia-smi`` total in MiB, or None where not known. ``bf16_dense_flops`` is without
    2:4 structured sparsity (datasheets print the sparse figure, twice as large, first).
    ``price_per_hour`` is an indicative on-demand $/GPU-hour, not a quote.

    ``link`` names the GPU-to-GPU interconnect of one server (NVLink through NVSwitch, or PCIe);
    ``link_bytes_per_s`` is its bandwidth per GPU *per direction* (datasheets print the
    bidirectional sum, twice as large) and ``link_latency_s`` the fixed cost of one collective or
    send on it (the alpha of the alpha-beta model: launch and synchronisation; the catalog's figures
    come from a published profile or are stated assumptions). The roofline prices tensor- and pipeline-parallel communication with
    them (:func:`llmqueue.engine.step_time.parallel_comm`); 0 means unknown (no communication term).
    """

    name: str
    memory_bytes: int
    bf16_dense_flops: float
    hbm_bytes_per_s: float
    price_per_hour: float
    aliases: tuple[str, ...] = ()
    memory_label: str = ""
    reported_mib: int | None = None
    link: str = ""
    link_bytes_per_s: float = 0.0
    link_latency_s: float = 0.0
    source: str = ""
    notes: str = ""

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB
