"""Model shapes and GPU specs: the data behind KV bytes per token, weights and KV capacity ``M``.

Model shapes are the published Hugging Face ``config.json`` values (layers, hidden
size, attention heads, KV heads for grouped-query attention, head dimension,
MLP intermediate size, vocabulary, ``max_position_embeddings``). GPU figures are
vendor datasheet values: memory, *dense* (not 2:4-sparse) BF16 tensor FLOP/s and
HBM bandwidth. Each entry's ``source`` says where its numbers come from and its
``notes`` what to watch (GiB vs GB, variants with other shapes).

Memory convention: ``GpuSpec.memory_bytes`` is the total the driver reports
(``nvidia-smi`` "MiB" x 2**20) where known, which is what vLLM's
``--gpu-memory-utilization`` fraction is applied to (vLLM reads the CUDA total,
a few hundred MiB below nvidia-smi's figure). Marketing "80GB" on an A100 is
80 GiB = 81920 MiB = 85.9e9 bytes, not 80e9.

Interconnect (``link``, per GPU, per direction; datasheets print the bidirectional sum):
NVLink 3 on the A100 SXM is 600 GB/s bidirectional (12 links x 50 GB/s), 300 GB/s each way;
NVLink 4 on the H100/H200 SXM is 900 GB/s bidirectional (18 links x 50 GB/s), 450 GB/s each way;
NVLink 5 on the B200 is 1.8 TB/s bidirectional, 900 GB/s each way (NVIDIA's A100, H100, H200 and
HGX B200 datasheets). PCIe cards without a bridge talk over PCIe: Gen4 x16 (L4, L40S) is
64 GB/s bidirectional, 32 GB/s each way; Gen5 x16 (H100 PCIe) 128 GB/s, 64 GB/s each way (the
H100 PCIe's optional NVLink bridge, 600 GB/s, is not modelled). The MI300X's seven Infinity
Fabric links give 896 GB/s bidirectional to its peers (AMD datasheet), 448 GB/s each way. The
per-collective latency ``link_latency_s`` is no datasheet value: 25 us on NVLink (and Infinity
Fabric) is the intercept of Vidur's profiled NCCL all-reduce on an H100 DGX (microsoft/vidur,
``data/profiling/network/h100_dgx/all_reduce.csv``: a least-squares line through the medians gives
24, 28 and 35 us at 2, 4 and 8 GPUs, and 305-366 GB/s of bus bandwidth on large messages, 0.68-0.81
of the 450 GB/s); 40 us on PCIe is an assumption (no profile found; not below NVLink's).
Bandwidth figures from memory of the datasheets.

Prices are *indicative* on-demand $/GPU-hour list prices (mid-2025 cloud and
"neocloud" offers, from memory); they vary by provider, region and commitment.
Pass your own price where a cost matters.
"""

from __future__ import annotations

from pathlib import Path

from llmqueue.errors import InputError
from llmqueue.hardware.hf_config import model_from_hf_config
from llmqueue.hardware.specs import GiB, GpuSpec, MiB, ModelSpec

_HF = "Hugging Face config.json"

MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="llama-2-7b", hf_id="meta-llama/Llama-2-7b-hf",
        aliases=("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf", "llama-2-7b-chat", "llama2-7b",
                 "llama-2-7b-hf"),
        n_layers=32, hidden_size=4096, n_heads=32, n_kv_heads=32, head_dim=128, intermediate_size=11008,
        vocab_size=32000, max_model_len=4096, params_published=6_738_415_616, dtype="fp16",
        source=f"{_HF} of meta-llama/Llama-2-7b-hf; params = safetensors total",
        notes="MHA. The Continuous Batching essay: ~2 GB of KV per 4096-token request. Shape checked against config.json copies; "
              "param count from memory, equal to the shape-derived count."),
    ModelSpec(
        name="llama-2-13b", hf_id="meta-llama/Llama-2-13b-hf",
        aliases=("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf", "llama-2-13b-chat", "llama2-13b",
                 "llama-2-13b-hf"),
        n_layers=40, hidden_size=5120, n_heads=40, n_kv_heads=40, head_dim=128, intermediate_size=13824,
        vocab_size=32000, max_model_len=4096, params_published=13_015_864_320, dtype="fp16",
        source=f"{_HF} of meta-llama/Llama-2-13b-hf; params = safetensors total",
        notes="MHA. Shape checked against config.json copies; param count from memory (equals the shape count)."),
    ModelSpec(
        name="llama-2-70b", hf_id="meta-llama/Llama-2-70b-hf",
        aliases=("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf", "llama-2-70b-chat", "llama2-70b",
                 "llama-2-70b-hf"),
        n_layers=80, hidden_size=8192, n_heads=64, n_kv_heads=8, head_dim=128, intermediate_size=28672,
        vocab_size=32000, max_model_len=4096, params_published=68_976_648_192, dtype="fp16",
        source=f"{_HF} of meta-llama/Llama-2-70b-hf; params = safetensors total",
        notes="GQA, 8 KV heads. Shape and param count from memory (param count equals the shape count)."),
    ModelSpec(
        name="llama-3-8b", hf_id="meta-llama/Meta-Llama-3-8B",
        aliases=("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b-instruct",
                 "llama3-8b", "meta-llama-3-8b"),
        n_layers=32, hidden_size=4096, n_heads=32, n_kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=128256, max_model_len=8192, params_published=8_030_261_248,
        source=f"{_HF} of meta-llama/Meta-Llama-3-8B; params = safetensors total",
        notes="GQA, 8 KV heads; 8K context (Llama 3.1 extends it to 128K with the same shape). "
              "Shape checked against config.json copies; param count from memory."),
    ModelSpec(
        name="llama-3.1-8b", hf_id="meta-llama/Llama-3.1-8B",
        aliases=("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B",
                 "meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct", "llama3.1-8b"),
        n_layers=32, hidden_size=4096, n_heads=32, n_kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=128256, max_model_len=131072, params_published=8_030_261_248,
        source=f"{_HF} of meta-llama/Llama-3.1-8B (checked); params = safetensors total",
        notes="GQA, 8 KV heads; 128K context via llama3 RoPE scaling. Param count from memory."),
    ModelSpec(
        name="llama-3.1-70b", hf_id="meta-llama/Llama-3.1-70B",
        aliases=("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B",
                 "meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b-instruct", "llama3.1-70b"),
        n_layers=80, hidden_size=8192, n_heads=64, n_kv_heads=8, head_dim=128, intermediate_size=28672,
        vocab_size=128256, max_model_len=131072, params_published=70_553_706_496,
        source=f"{_HF} of meta-llama/Llama-3.1-70B (checked); params = safetensors total",
        notes="GQA, 8 KV heads. Param count from memory (equals the shape count)."),
    ModelSpec(
        name="llama-3.1-405b", hf_id="meta-llama/Llama-3.1-405B",
        aliases=("meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Meta-Llama-3.1-405B",
                 "meta-llama/Meta-Llama-3.1-405B-Instruct", "llama-3.1-405b-instruct", "llama3.1-405b"),
        n_layers=126, hidden_size=16384, n_heads=128, n_kv_heads=8, head_dim=128, intermediate_size=53248,
        vocab_size=128256, max_model_len=131072, params_published=405_853_388_800,
        source=f"{_HF} of meta-llama/Llama-3.1-405B(-Instruct), current revision (checked); Llama 3 paper table 3",
        notes="GQA, 8 KV heads. The first Hugging Face upload (and the MP16 checkpoint) had num_key_value_heads=16 "
              "(KV heads duplicated for 16-way model parallelism), which doubles KV per token; pass that "
              "config.json to model it. Param count from memory (equals the shape count)."),
    ModelSpec(
        name="mistral-7b", hf_id="mistralai/Mistral-7B-v0.1",
        aliases=("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b-v0.1",
                 "mistral-7b-instruct-v0.1"),
        n_layers=32, hidden_size=4096, n_heads=32, n_kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=32000, max_model_len=32768, params_published=7_241_732_096,
        source=f"{_HF} of mistralai/Mistral-7B-v0.1; params = safetensors total",
        notes="GQA, 8 KV heads; sliding_window=4096 in config.json (KV here is full attention, as vLLM "
              "allocates for it). v0.3 has vocab 32768. Shape checked against config.json copies; param count "
              "from memory (equals the shape count)."),
    ModelSpec(
        name="mixtral-8x7b", hf_id="mistralai/Mixtral-8x7B-v0.1",
        aliases=("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-v0.1",
                 "mixtral-8x7b-instruct-v0.1", "mixtral"),
        n_layers=32, hidden_size=4096, n_heads=32, n_kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=32000, max_model_len=32768, n_experts=8, experts_per_token=2, params_published=46_702_792_704,
        source=f"{_HF} of mistralai/Mixtral-8x7B-v0.1 (checked); params = safetensors total",
        notes="Sparse MoE: 8 experts, 2 routed per token (~12.9B active). All experts' weights are resident. "
              "Param count from memory (equals the shape count)."),
    ModelSpec(
        name="qwen2.5-7b", hf_id="Qwen/Qwen2.5-7B",
        aliases=("Qwen/Qwen2.5-7B", "qwen2.5-7b-base", "qwen-2.5-7b"),
        n_layers=28, hidden_size=3584, n_heads=28, n_kv_heads=4, head_dim=128, intermediate_size=18944,
        vocab_size=152064, max_model_len=131072, params_published=7_615_616_512, qkv_bias=True,
        source=f"{_HF} of Qwen/Qwen2.5-7B (checked); model card: 7.61B parameters",
        notes="GQA, 4 KV heads; q/k/v biases. The Instruct config.json says max_position_embeddings=32768 "
              "(YaRN for longer); pass --context to match."),
    ModelSpec(
        name="qwen2.5-72b", hf_id="Qwen/Qwen2.5-72B",
        aliases=("Qwen/Qwen2.5-72B", "qwen2.5-72b-base", "qwen-2.5-72b"),
        n_layers=80, hidden_size=8192, n_heads=64, n_kv_heads=8, head_dim=128, intermediate_size=29568,
        vocab_size=152064, max_model_len=131072, params_published=72_706_203_648, qkv_bias=True,
        source=f"{_HF} of Qwen/Qwen2.5-72B (checked); model card: 72.7B parameters",
        notes="GQA, 8 KV heads; q/k/v biases. The Instruct config.json says max_position_embeddings=32768. "
              "Exact param count from memory (equals the shape count)."),
    ModelSpec(
        name="gpt-3-175b", hf_id=None,
        aliases=("gpt-3", "gpt3", "gpt3-175b", "davinci"),
        n_layers=96, hidden_size=12288, n_heads=96, n_kv_heads=96, head_dim=128, intermediate_size=4 * 12288,
        vocab_size=50257, max_model_len=2048, params_published=175_000_000_000, tie_embeddings=True,
        mlp="plain", norm="layer", linear_bias=True, learned_pos=True, dtype="fp16",
        source="Brown et al. 2020, table 2.1 (n_layers, d_model, n_heads, d_head, n_ctx); GPT-2 vocabulary",
        notes="Not released: no config.json. MHA, plain 4x MLP with biases, tied embeddings, learned positions. "
              "Inference Foundations' worked table uses this model. From memory."),
)

GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="a100-40gb", aliases=("a100-sxm4-40gb", "a100-40g", "a100-sxm-40gb"),
        memory_bytes=40960 * MiB, reported_mib=40960, memory_label="40 GB HBM2",
        bf16_dense_flops=312e12, hbm_bytes_per_s=1555e9, price_per_hour=1.29,
        link="NVLink 3 (NVSwitch)", link_bytes_per_s=300e9, link_latency_s=25e-6,
        source="NVIDIA A100 datasheet (SXM4): BF16 312 TFLOPS dense (624 sparse), 1,555 GB/s",
        notes="'40 GB' is 40 GiB: nvidia-smi reports 40960 MiB (checked: Modal docs PR). Datasheet figures "
              "from memory."),
    GpuSpec(
        name="a100-80gb", aliases=("a100", "a100-sxm4-80gb", "a100-80g", "a100-sxm-80gb", "a100-sxm"),
        memory_bytes=81920 * MiB, reported_mib=81920, memory_label="80 GB HBM2e",
        bf16_dense_flops=312e12, hbm_bytes_per_s=2039e9, price_per_hour=1.79,
        link="NVLink 3 (NVSwitch)", link_bytes_per_s=300e9, link_latency_s=25e-6,
        source="NVIDIA A100 datasheet (SXM4 80GB): BF16 312 TFLOPS dense (624 sparse), 2,039 GB/s",
        notes="'80 GB' is 80 GiB = 85.9e9 bytes: nvidia-smi reports 81920 MiB (checked; CUDA/PyTorch report "
              "~79.2 GiB total). The PCIe 80GB card has 1,935 GB/s. Datasheet figures from memory."),
    GpuSpec(
        name="h100-sxm", aliases=("h100", "h100-sxm5", "h100-80gb", "h100-80gb-hbm3", "h100-sxm-80gb"),
        memory_bytes=81559 * MiB, reported_mib=81559, memory_label="80 GB HBM3",
        bf16_dense_flops=989.4e12, hbm_bytes_per_s=3.35e12, price_per_hour=2.99,
        link="NVLink 4 (NVSwitch)", link_bytes_per_s=450e9, link_latency_s=25e-6,
        source="NVIDIA H100 datasheet (SXM5): BF16 1,979 TFLOPS with sparsity = 989.4 dense, 3.35 TB/s",
        notes="nvidia-smi reports 81559 MiB (79.6 GiB = 85.5e9 bytes) for 'H100 80GB HBM3' (checked: Modal docs "
              "PR). Datasheet figures from memory."),
    GpuSpec(
        name="h100-pcie", aliases=("h100-pcie-80gb", "h100-pcie5"),
        memory_bytes=81559 * MiB, reported_mib=81559, memory_label="80 GB HBM2e",
        bf16_dense_flops=756e12, hbm_bytes_per_s=2.0e12, price_per_hour=2.49,
        link="PCIe Gen5 x16", link_bytes_per_s=64e9, link_latency_s=40e-6,
        source="NVIDIA H100 datasheet (PCIe): BF16 1,513 TFLOPS with sparsity = 756 dense, 2.0 TB/s",
        notes="nvidia-smi reports 81559 MiB (from memory, as for the SXM part). H100 NVL (94 GB, 3.9 TB/s) is a "
              "different card. Figures from memory."),
    GpuSpec(
        name="h200", aliases=("h200-sxm", "h200-141gb", "h200-sxm-141gb"),
        memory_bytes=143771 * MiB, reported_mib=143771, memory_label="141 GB HBM3e",
        bf16_dense_flops=989.4e12, hbm_bytes_per_s=4.8e12, price_per_hour=3.79,
        link="NVLink 4 (NVSwitch)", link_bytes_per_s=450e9, link_latency_s=25e-6,
        source="NVIDIA H200 datasheet (SXM): BF16 1,979 TFLOPS with sparsity = 989.4 dense, 4.8 TB/s",
        notes="nvidia-smi reports 143771 MiB (140.4 GiB = 150.8e9 bytes), from memory. Datasheet figures from "
              "memory (989 TFLOPS, 141 GB, 4.8 TB/s also in allenai/open-instruct's GPU table)."),
    GpuSpec(
        name="b200", aliases=("b200-sxm", "b200-180gb", "hgx-b200"),
        memory_bytes=183359 * MiB, reported_mib=183359, memory_label="180 GB HBM3e",
        bf16_dense_flops=2.25e15, hbm_bytes_per_s=7.7e12, price_per_hour=5.99,
        link="NVLink 5 (NVSwitch)", link_bytes_per_s=900e9, link_latency_s=25e-6,
        source="NVIDIA HGX B200 datasheet: BF16 4.5 PFLOPS with sparsity = 2.25 dense, 7.7 TB/s per GPU",
        notes="nvidia-smi reports 183359 MiB (179 GiB = 192.3e9 bytes; checked in a TensorRT-LLM issue). Early "
              "announcements said 192 GB and 8 TB/s; the 7,680-bit bus at 3,996 MHz gives 7.67 TB/s "
              "(pytorch/ao roofline PR). BF16 figure from memory, matching torchao's 2.25e15."),
    GpuSpec(
        name="l4", aliases=("l4-24gb",),
        memory_bytes=23034 * MiB, reported_mib=23034, memory_label="24 GB GDDR6",
        bf16_dense_flops=121e12, hbm_bytes_per_s=300e9, price_per_hour=0.80,
        link="PCIe Gen4 x16", link_bytes_per_s=32e9, link_latency_s=40e-6,
        source="NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity = 121 dense, 300 GB/s",
        notes="GDDR6, not HBM. nvidia-smi reports 23034 MiB (22.5 GiB = 24.15e9 bytes; checked: Modal docs PR). "
              "Datasheet figures from memory."),
    GpuSpec(
        name="l40s", aliases=("l40s-48gb",),
        memory_bytes=46068 * MiB, reported_mib=46068, memory_label="48 GB GDDR6",
        bf16_dense_flops=362.05e12, hbm_bytes_per_s=864e9, price_per_hour=1.50,
        link="PCIe Gen4 x16", link_bytes_per_s=32e9, link_latency_s=40e-6,
        source="NVIDIA L40S datasheet: BF16 733 TFLOPS with sparsity = 362 dense, 864 GB/s",
        notes="GDDR6 with ECC, not HBM. nvidia-smi reports 46068 MiB (45 GiB = 48.3e9 bytes; checked: Modal docs "
              "PR). Datasheet figures from memory."),
    GpuSpec(
        name="mi300x", aliases=("instinct-mi300x", "amd-mi300x"),
        memory_bytes=192 * GiB, reported_mib=None, memory_label="192 GB HBM3",
        bf16_dense_flops=1307.4e12, hbm_bytes_per_s=5.3e12, price_per_hour=2.50,
        link="Infinity Fabric (7 peer links)", link_bytes_per_s=448e9, link_latency_s=25e-6,
        source="AMD Instinct MI300X datasheet: BF16 1,307.4 TFLOPS dense (2,614.9 sparse), 5.3 TB/s",
        notes="Memory taken as 192 GiB; rocm-smi reports slightly less (about 191.7 GiB, from memory). "
              "Figures from memory."),
)


def _key(name: str) -> str:
    """Normalise a lookup name: case, spaces/underscores, an ``nvidia``/``amd`` prefix."""
    k = "-".join(str(name).strip().lower().replace("_", "-").split())
    for prefix in ("nvidia-", "amd-"):
        if k.startswith(prefix) and k != prefix:
            k = k[len(prefix):]
    return k


def _index(specs) -> dict[str, object]:
    idx: dict[str, object] = {}
    for s in specs:
        for n in (s.name, *s.aliases):
            k = _key(n)
            if k in idx and idx[k] is not s:  # pragma: no cover - catalog consistency
                raise RuntimeError(f"duplicate catalog name {n!r}")
            idx[k] = s
    return idx


_MODEL_INDEX = _index(MODELS)
_GPU_INDEX = _index(GPUS)


def model_names() -> list[str]:
    """Canonical names of the catalog models."""
    return [m.name for m in MODELS]


def gpu_names() -> list[str]:
    """Canonical names of the catalog GPUs."""
    return [g.name for g in GPUS]


def _looks_like_path(s: str) -> bool:
    return s.lower().endswith(".json") or Path(s).is_dir() or Path(s).is_file()


def get_model(model: ModelSpec | str) -> ModelSpec:
    """A :class:`ModelSpec` from a spec, a catalog name or alias (case-insensitive), or a
    path to a Hugging Face ``config.json`` (or a directory holding one)."""
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, (str, Path)) or not str(model).strip():
        raise InputError("model", f"expected a model name or config.json path, got {model!r}")
    s = str(model).strip()
    found = _MODEL_INDEX.get(_key(s))
    if found is not None:
        return found  # type: ignore[return-value]
    if isinstance(model, Path) or _looks_like_path(s):
        return model_from_hf_config(s)
    raise InputError("model", f"unknown model {s!r}",
                     f"choose one of: {', '.join(model_names())} or pass a Hugging Face config.json path")


def get_gpu(gpu: GpuSpec | str) -> GpuSpec:
    """A :class:`GpuSpec` from a spec or a catalog name or alias (case-insensitive;
    ``nvidia-smi`` names such as ``NVIDIA A100-SXM4-80GB`` work too)."""
    if isinstance(gpu, GpuSpec):
        return gpu
    if not isinstance(gpu, str) or not gpu.strip():
        raise InputError("gpu", f"expected a GPU name, got {gpu!r}")
    found = _GPU_INDEX.get(_key(gpu))
    if found is None:
        raise InputError("gpu", f"unknown GPU {gpu.strip()!r}", f"choose one of: {', '.join(gpu_names())}")
    return found  # type: ignore[return-value]
