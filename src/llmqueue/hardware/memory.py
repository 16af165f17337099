"""KV cache bytes per token, weight memory, and the KV capacity ``M`` of a GPU.

``M`` (tokens) is the memory side of the serving queue: the number of tokens whose
keys and values fit in GPU memory at once. Nie et al. 2026 divides it by the KV
memory-work of a request to get the service rate ``mu = M / (b E[g])``; Inference Foundations'
equation 3 ``M_KV = 2 * N_L * d * S * B * s_elem`` solved for ``B`` gives the
number of requests of ``S`` tokens that fit.

Equation 3 is the multi-head-attention case. With grouped-query attention each
layer stores keys and values only for ``n_kv_heads`` heads of ``head_dim``, so
``d`` becomes ``n_kv_heads * head_dim`` (Llama-3.1-8B: 8 * 128 = 1024, a quarter of
its 4096 hidden size).

Capacity follows vLLM: the engine may use ``gpu_memory_utilization`` of each GPU's
total memory; weights (split over ``tensor_parallel_size`` ranks), activations,
CUDA graphs and other non-KV allocations come out of that, and the rest is cut into
blocks of ``block_size`` tokens (``num_blocks`` is floored). vLLM measures the non-KV
part by profiling; here it is a fixed ``reserve_bytes`` per GPU, 1 GiB by default,
which is close for 7B-70B models at default batch settings and can be set to the
value a vLLM log reports ("non_torch_memory ... activation peak memory ...").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmqueue._result import Result
from llmqueue._validate import nonnegative, positive_int, probability
from llmqueue.errors import InputError
from llmqueue.hardware.catalog import get_gpu, get_model
from llmqueue.hardware.specs import GiB, GpuSpec, ModelSpec

#: Bytes per element of each storage type (int4 is a weight-only format: half a byte).
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
            "fp8-e4m3": "fp8", "fp8-e5m2": "fp8", "fp8-e4m3fn": "fp8", "e4m3": "fp8", "e5m2": "fp8",
            "float8": "fp8", "w8": "int8", "w4": "int4", "awq": "int4", "gptq": "int4"}

#: Default per-GPU memory kept for activations, CUDA graphs and the CUDA context (1 GiB).
DEFAULT_RESERVE_BYTES = 1 * GiB


def resolve_dtype(dtype: str, model: ModelSpec | None = None, *, field: str = "dtype", kv: bool = False) -> str:
    """Canonical dtype name (``fp32``, ``bf16``, ``fp16``, ``fp8``, ``int8``, ``int4``).

    ``"auto"`` follows vLLM: the checkpoint's dtype, except that FP32 checkpoints are
    served in FP16 (``bf16`` when no model is given). For the KV cache (``kv=True``)
    int4 is refused.
    """
    if not isinstance(dtype, str):
        raise InputError(field, f"expected a dtype name, got {dtype!r}")
    k = dtype.strip().lower().replace("_", "-")
    if k == "auto":
        base = model.dtype if model is not None else "bf16"
        return "fp16" if base == "fp32" else base
    k = _ALIASES.get(k, k)
    allowed = KV_DTYPES if kv else tuple(DTYPE_BYTES)
    if kv and k == "int4":
        raise InputError(field, "int4 is a weight-only format here", f"choose one of: auto, {', '.join(allowed)}")
    if k not in allowed:
        raise InputError(field, f"unknown dtype {dtype!r}", f"choose one of: auto, {', '.join(allowed)}")
    return k


def kv_bytes_per_token(model: ModelSpec | str, kv_dtype: str = "bf16") -> int:
    """KV cache bytes one token occupies in the whole model: ``2 * n_layers * n_kv_heads * head_dim * bytes``.

    The 2 is keys and values. This is Inference Foundations' equation 3 per token and per
    sequence (``S = B = 1``) with ``d = n_kv_heads * head_dim``, which is the hidden
    size ``d`` for multi-head attention and smaller for grouped-query attention.
    Assumes every layer keeps full attention (sliding-window and latent-attention
    savings are not modelled).
    """
    m = get_model(model)
    b = DTYPE_BYTES[resolve_dtype(kv_dtype, m, field="kv_dtype", kv=True)]
    return int(2 * m.n_layers * m.n_kv_heads * m.head_dim * b)


def param_count(model: ModelSpec | str) -> int:
    """Parameter count derived from the shape (all experts included).

    Token embeddings ``V*h`` (plus an LM head of the same size unless tied, plus learned
    position embeddings ``max_model_len*h`` for GPT-style models); per layer, attention
    ``h*(n_heads + 2*n_kv_heads)*head_dim`` for q, k, v and ``n_heads*head_dim*h`` for the
    output, the MLP (gated: 3 matrices ``h*I``; plain: 2), times ``n_experts`` plus a router
    ``h*n_experts`` for a mixture of experts, and the norms; biases where the model has them.
    Compare with ``params_published`` (within a few percent; exact for the Llama family).
    """
    return _count(get_model(model), active=False)


def active_param_count(model: ModelSpec | str) -> int:
    """Parameters used per token: as :func:`param_count` but with ``experts_per_token`` experts."""
    return _count(get_model(model), active=True)


def _count(m: ModelSpec, *, active: bool) -> int:
    h, hd = m.hidden_size, m.head_dim
    q_out, kv_out = m.n_heads * hd, m.n_kv_heads * hd
    attn = h * q_out + 2 * h * kv_out + q_out * h
    if m.linear_bias:
        attn += q_out + 2 * kv_out + h
    elif m.qkv_bias:
        attn += q_out + 2 * kv_out

    def mlp(width: int) -> int:
        mats = 3 if m.mlp == "gated" else 2
        p = mats * h * width
        if m.linear_bias:
            p += (mats - 1) * width + h
        return p

    if m.n_experts > 1:
        n_used = m.experts_per_token if active else m.n_experts
        ffn = n_used * mlp(m.moe_intermediate_size or m.intermediate_size) + h * m.n_experts
        if m.shared_expert_intermediate_size:
            ffn += mlp(m.shared_expert_intermediate_size) + h  # shared expert and its gate
    else:
        ffn = mlp(m.intermediate_size)
    norm = h if m.norm == "rms" else 2 * h
    per_layer = attn + ffn + 2 * norm
    embed = m.vocab_size * h
    total = m.n_layers * per_layer + embed + norm
    if not m.tie_embeddings:
        total += embed
    if m.learned_pos:
        total += m.max_model_len * h
    return int(total)


def weight_bytes(model: ModelSpec | str, dtype: str = "bf16") -> int:
    """Bytes of the model weights in ``dtype``: ``params * bytes_per_element``.

    Uses ``params_published`` when known, else :func:`param_count`. Quantized formats
    (int8, int4, fp8) count the packed weights only; their scales and zero points
    (typically 1-3% more) and any layers kept in 16 bits are not included.
    """
    m = get_model(model)
    b = DTYPE_BYTES[resolve_dtype(dtype, m, field="weight_dtype")]
    n = m.params_published if m.params_published is not None else param_count(m)
    return int(math.ceil(n * b))


def _check_tp(m: ModelSpec, tp: int) -> None:
    """vLLM's sharding rule: attention heads split evenly; KV heads split or replicated evenly."""
    if m.n_heads % tp:
        raise InputError("tensor_parallel_size",
                         f"{m.name} has {m.n_heads} attention heads, not divisible by {tp}",
                         f"use a divisor of {m.n_heads}")
    if (m.n_kv_heads >= tp and m.n_kv_heads % tp) or (m.n_kv_heads < tp and tp % m.n_kv_heads):
        raise InputError("tensor_parallel_size",
                         f"{m.name} has {m.n_kv_heads} KV heads, which {tp} ranks cannot split or replicate evenly")


def _check_pp(m: ModelSpec, pp) -> int:
    """A pipeline of ``pp`` stages needs at least one layer a stage."""
    pp = positive_int("pipeline_parallel_size", pp)
    if pp > m.n_layers:
        raise InputError("pipeline_parallel_size", f"{pp} stages exceed {m.name}'s {m.n_layers} layers",
                         f"use at most {m.n_layers}")
    return pp


def stage_layers(m: ModelSpec, pipeline_parallel_size: int = 1) -> int:
    """Layers of the largest pipeline stage: ``ceil(n_layers / pp)`` (vLLM splits the layers as
    evenly as it can; the largest stage bounds the KV cache, as vLLM takes the fewest blocks of all
    workers)."""
    return -(-m.n_layers // pipeline_parallel_size)


def per_gpu_kv_bytes_per_token(model: ModelSpec | str, tensor_parallel_size: int = 1, kv_dtype: str = "bf16",
                               pipeline_parallel_size: int = 1) -> int:
    """KV bytes per token held by *each* GPU of a tensor-parallel group (of the largest pipeline stage).

    Each rank keeps ``max(1, n_kv_heads // tensor_parallel_size)`` KV heads (vLLM): heads
    are split across ranks, and replicated when there are fewer KV heads than ranks
    (Llama-3.1-70B, 8 KV heads, at TP=16 keeps one head per rank, 2x the split share). With
    ``pipeline_parallel_size`` stages each GPU holds the KV of its stage's layers only
    (:func:`stage_layers`).
    """
    m = get_model(model)
    tp = positive_int("tensor_parallel_size", tensor_parallel_size)
    pp = _check_pp(m, pipeline_parallel_size)
    _check_tp(m, tp)
    b = DTYPE_BYTES[resolve_dtype(kv_dtype, m, field="kv_dtype", kv=True)]
    return int(2 * stage_layers(m, pp) * max(1, m.n_kv_heads // tp) * m.head_dim * b)


@dataclass(frozen=True)
class KvCapacity(Result):
    """KV capacity of one replica (``tensor_parallel_size x pipeline_parallel_size`` GPUs: a
    tensor-parallel group for each pipeline stage).

    Bytes are per GPU unless the name says otherwise. ``M`` = ``num_blocks * block_size``
    tokens is what the whole group holds (each token's KV is spread over the ranks).
    ``fits`` is False when the weights and reserve leave no room for one KV block; with
    ``strict=True`` (the default) that is an error instead, and ``short_bytes_per_gpu``
    says by how much.
    """

    model: str
    gpu: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    block_size: int
    kv_dtype: str
    weight_dtype: str
    kv_bytes_per_token: int
    per_gpu_kv_bytes_per_token: int
    kv_heads_per_gpu: int
    memory_bytes_per_gpu: int
    usable_bytes_per_gpu: float
    weight_bytes: int
    weight_bytes_per_gpu: float
    reserve_bytes: int
    kv_bytes_per_gpu: float
    short_bytes_per_gpu: float
    block_bytes_per_gpu: int
    num_blocks: int
    M: int
    fits: bool
    pipeline_parallel_size: int = 1

    @property
    def gpus(self) -> int:
        """GPUs of the replica: ``tensor_parallel_size x pipeline_parallel_size``."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


def _min_tp_that_fits(m: ModelSpec, usable: float, reserve: float, w: float, per_block) -> int | None:
    """Smallest valid tensor-parallel size (up to 128) leaving room for one KV block, or None."""
    for tp in range(1, 129):
        try:
            _check_tp(m, tp)
        except InputError:
            continue
        if usable - w / tp - reserve >= per_block(tp):
            return tp
    return None


def kv_capacity(model: ModelSpec | str, gpu: GpuSpec | str, *, tensor_parallel_size: int = 1,
                gpu_memory_utilization: float = 0.9, reserve_bytes: float = DEFAULT_RESERVE_BYTES,
                block_size: int = 16, kv_dtype: str = "bf16", weight_dtype: str = "bf16",
                strict: bool = True, pipeline_parallel_size: int = 1) -> KvCapacity:
    """KV capacity ``M`` (tokens) of ``model`` served on ``tensor_parallel_size x
    pipeline_parallel_size`` GPUs of type ``gpu``.

    Per GPU: ``kv_bytes_per_gpu = memory * gpu_memory_utilization - weights / (tp * pp) - reserve_bytes``
    (the weights split evenly over the stages: the first stage's embedding and the last's LM head
    are not placed apart); with ``pp > 1`` each GPU holds the KV of its stage's layers only
    (:func:`per_gpu_kv_bytes_per_token`);
    ``num_blocks = floor(kv_bytes_per_gpu / (block_size * per_gpu_kv_bytes_per_token))`` as in
    vLLM; ``M = num_blocks * block_size``. Example: Llama-2-7B (bf16, 524,288 KV bytes per
    token) on an A100 80GB at 0.9 keeps 72 GiB, minus 12.55 GiB of weights and 1 GiB of
    reserve, leaving 58.45 GiB = 7,481 blocks of 16 tokens, ``M = 119,696`` tokens.

    Raises :class:`InputError` (field ``tensor_parallel_size``) naming the shortfall and the
    smallest tensor-parallel size that fits when the weights leave no room for a KV block,
    unless ``strict=False``, which returns ``fits=False`` and ``M = 0`` instead.
    """
    m, g = get_model(model), get_gpu(gpu)
    tp = positive_int("tensor_parallel_size", tensor_parallel_size)
    pp = _check_pp(m, pipeline_parallel_size)
    util = probability("gpu_memory_utilization", gpu_memory_utilization, open_high=False)
    reserve = nonnegative("reserve_bytes", reserve_bytes)
    bs = positive_int("block_size", block_size)
    kvd = resolve_dtype(kv_dtype, m, field="kv_dtype", kv=True)
    wd = resolve_dtype(weight_dtype, m, field="weight_dtype")
    _check_tp(m, tp)

    kv_tok = kv_bytes_per_token(m, kvd)
    gpu_tok = per_gpu_kv_bytes_per_token(m, tp, kvd, pp)
    block_bytes = bs * gpu_tok
    w = weight_bytes(m, wd)
    w_gpu = w / tp if pp == 1 else w / (tp * pp)
    usable = g.memory_bytes * util
    free = usable - w_gpu - reserve
    num_blocks = int(free // block_bytes) if free > 0 else 0
    fits = num_blocks >= 1
    # Shortfall: of weights plus reserve against the usable memory, or of one KV block.
    short = 0.0 if fits else (-free if free <= 0 else block_bytes - free)

    if not fits and strict:
        def per_block(t):
            return bs * 2 * stage_layers(m, pp) * max(1, m.n_kv_heads // t) * m.head_dim * DTYPE_BYTES[kvd]

        best = _min_tp_that_fits(m, usable, reserve, w / pp, per_block)
        what = "the weights do not fit" if free <= 0 else "no room is left for the KV cache"
        fix = (f"use tensor_parallel_size >= {best}" if best is not None and best > tp
               else "use a smaller weight dtype")
        raise InputError(
            "tensor_parallel_size",
            f"{what}: {m.name} weights need {w_gpu / GiB:.2f} GiB per GPU ({wd}, tensor_parallel_size={tp}"
            f"{f', pipeline_parallel_size={pp}' if pp > 1 else ''}) "
            f"plus {reserve / GiB:.2f} GiB reserve, but {g.name} allows {usable / GiB:.2f} GiB "
            f"({util:g} of {g.memory_gib:.2f} GiB); short by {short / GiB:.2f} GiB per GPU",
            f"{fix}, a GPU with more memory, or a higher gpu_memory_utilization")

    return KvCapacity(
        model=m.name, gpu=g.name, tensor_parallel_size=tp, gpu_memory_utilization=util, block_size=bs,
        kv_dtype=kvd, weight_dtype=wd, kv_bytes_per_token=kv_tok, per_gpu_kv_bytes_per_token=gpu_tok,
        kv_heads_per_gpu=max(1, m.n_kv_heads // tp), memory_bytes_per_gpu=g.memory_bytes,
        usable_bytes_per_gpu=usable, weight_bytes=w, weight_bytes_per_gpu=w_gpu, reserve_bytes=int(reserve),
        kv_bytes_per_gpu=max(0.0, free), short_bytes_per_gpu=short, block_bytes_per_gpu=block_bytes,
        num_blocks=num_blocks, M=num_blocks * bs, fits=fits, pipeline_parallel_size=pp,
    )


@dataclass(frozen=True)
class Concurrency(Result):
    """How many requests of ``context_len`` tokens fit in the KV cache at once.

    ``B`` is Inference Foundations' equation 3 solved for the batch: ``floor(kv_bytes_per_gpu /
    (context_len * per_gpu_kv_bytes_per_token))`` (for TP=1, KV bytes available over
    KV bytes per request). ``B_from_M = M // context_len`` counts in whole blocks;
    ``B_paged`` also rounds each request up to whole blocks as PagedAttention allocates
    them; ``concurrency = M / context_len`` is the figure vLLM logs as "maximum
    concurrency". ``within_max_model_len`` is False when ``context_len`` exceeds the
    model's ``max_position_embeddings``.
    """

    context_len: int
    kv_bytes_per_request: int
    per_gpu_kv_bytes_per_request: int
    blocks_per_request: int
    B: int
    B_from_M: int
    B_paged: int
    concurrency: float
    within_max_model_len: bool
    capacity: KvCapacity


def max_concurrent_requests(model: ModelSpec | str, gpu: GpuSpec | str, context_len: int, **kwargs) -> Concurrency:
    """Requests of ``context_len`` tokens (prompt plus output) whose KV cache fits at once.

    Keyword arguments are those of :func:`kv_capacity`. Example (the Continuous Batching essay): Llama-2-7B at
    4096 tokens needs 2 GiB (2.147 GB) of KV per request; an A100 80GB at
    ``gpu_memory_utilization=0.9`` holds 29 of them after 12.55 GiB of weights and 1 GiB
    of reserve (the Continuous Batching essay says "around 24", with its own overhead assumptions).
    """
    m = get_model(model)
    S = positive_int("context_len", context_len)
    cap = kv_capacity(m, gpu, **kwargs)
    per_req_gpu = S * cap.per_gpu_kv_bytes_per_token
    blocks = -(-S // cap.block_size)
    return Concurrency(
        context_len=S, kv_bytes_per_request=S * cap.kv_bytes_per_token,
        per_gpu_kv_bytes_per_request=per_req_gpu, blocks_per_request=blocks,
        B=int(cap.kv_bytes_per_gpu // per_req_gpu), B_from_M=cap.M // S, B_paged=cap.num_blocks // blocks,
        concurrency=cap.M / S, within_max_model_len=S <= m.max_model_len, capacity=cap,
    )
