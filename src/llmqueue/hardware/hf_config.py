"""Build a :class:`~llmqueue.hardware.specs.ModelSpec` from a Hugging Face ``config.json``.

Reads the standard keys (``num_hidden_layers``, ``hidden_size``,
``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``vocab_size``, ``max_position_embeddings``,
``num_local_experts``/``num_experts``, ``num_experts_per_tok``,
``tie_word_embeddings``, ``torch_dtype``), with the GPT-2 spellings (``n_layer``,
``n_embd``, ``n_head``, ``n_positions``, ``n_inner``) as fallbacks, and a nested
``text_config`` for multimodal checkpoints. The MLP type and biases follow
``model_type``: GPT-2/GPT-J/GPT-NeoX/OPT/BLOOM/Falcon/Phi-style models have a plain
two-matrix MLP, the rest (Llama, Mistral, Mixtral, Qwen, Gemma...) a gated one.
Parameter counts for architectures outside the Llama/Mistral/Qwen2/GPT-2 families
are approximate; KV bytes per token need only layers, KV heads and head_dim.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from llmqueue.errors import InputError
from llmqueue.hardware.specs import ModelSpec

# model_type values whose MLP is two matrices (up, down) rather than gate/up/down.
_PLAIN_MLP = {"gpt2", "gptj", "gpt_neox", "gpt_neo", "opt", "bloom", "falcon", "phi", "gpt_bigcode",
              "starcoder2", "mpt", "codegen"}
# model_type values with LayerNorm (weight and bias) rather than RMSNorm.
_LAYERNORM = _PLAIN_MLP | {"stablelm"}
# model_type values with biases on every linear layer.
_LINEAR_BIAS = {"gpt2", "gptj", "gpt_neo", "opt", "gpt_bigcode", "starcoder2", "phi", "codegen", "bloom"}
# model_type values with biases on q, k, v only.
_QKV_BIAS = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
# model_type values with learned absolute position embeddings.
_LEARNED_POS = {"gpt2", "opt", "gpt_bigcode", "gpt_neo"}

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16",
           "fp32": "fp32", "half": "fp16", "float": "fp32"}

# (our field, accepted config keys in order of preference)
_REQUIRED = (
    ("n_layers", ("num_hidden_layers", "n_layer", "num_layers")),
    ("hidden_size", ("hidden_size", "n_embd", "d_model")),
    ("n_heads", ("num_attention_heads", "n_head")),
    ("vocab_size", ("vocab_size",)),
    ("max_model_len", ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")),
)


def _load(path_or_dict: str | Path | Mapping[str, Any]) -> tuple[dict, str]:
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "<dict>"
    p = Path(path_or_dict).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InputError("model", f"no such config file '{p}'",
                         "pass a Hugging Face config.json path, a directory holding one, or a catalog name")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError("model", f"cannot read '{p}' as JSON ({e})") from None
    except RecursionError:
        raise InputError("model", f"'{p}' is nested too deeply to read") from None
    if not isinstance(cfg, dict):
        raise InputError("model", f"'{p}' is not a JSON object")
    return cfg, str(p)


def _int(cfg: dict, key: str, where: str) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or int(v) < 1:
        raise InputError("model", f"{where}: key '{key}' must be a positive whole number (got {v!r})")
    return int(v)


def model_from_hf_config(path_or_dict: str | Path | Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (path, directory or dict).

    ``num_key_value_heads`` defaults to ``num_attention_heads`` (MHA) and ``head_dim`` to
    ``hidden_size // num_attention_heads``. A missing required key raises
    :class:`~llmqueue.errors.InputError` naming the key and the file. Models with
    multi-head latent attention (``kv_lora_rank``, DeepSeek-V2/V3) are refused: their KV
    cache is not ``2 * layers * kv_heads * head_dim`` per token.
    """
    cfg, where = _load(path_or_dict)
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        outer = cfg
        cfg = {**cfg["text_config"]}
        cfg.setdefault("model_type", outer.get("model_type"))
        cfg.setdefault("torch_dtype", outer.get("torch_dtype") or outer.get("dtype"))
        cfg.setdefault("_name_or_path", outer.get("_name_or_path"))
    if cfg.get("kv_lora_rank"):
        raise InputError("model", f"{where}: multi-head latent attention (kv_lora_rank) is not supported",
                         "its KV cache per token is not 2 * layers * kv_heads * head_dim")

    vals: dict[str, int] = {}
    for field, keys in _REQUIRED:
        key = next((k for k in keys if cfg.get(k) is not None), None)
        if key is None:
            raise InputError("model", f"{where}: missing key '{keys[0]}'",
                             "a decoder config.json needs num_hidden_layers, hidden_size, num_attention_heads, "
                             "intermediate_size, vocab_size and max_position_embeddings")
        vals[field] = _int(cfg, key, where)

    model_type = str(cfg.get("model_type") or "").lower()
    mlp = "plain" if model_type in _PLAIN_MLP else "gated"
    h = vals["hidden_size"]

    ikey = next((k for k in ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim") if cfg.get(k) is not None),
                None)
    if ikey is not None:
        intermediate = _int(cfg, ikey, where)
    elif mlp == "plain":
        intermediate = 4 * h  # GPT-2 convention: n_inner null means 4 * n_embd
    else:
        raise InputError("model", f"{where}: missing key 'intermediate_size'",
                         "a gated-MLP config.json must give the MLP width")

    n_heads = vals["n_heads"]
    n_kv = _int(cfg, "num_key_value_heads", where) if cfg.get("num_key_value_heads") is not None else n_heads
    if cfg.get("multi_query") is True:  # gpt_bigcode / falcon spelling of MQA
        n_kv = 1
    if n_kv > n_heads or n_heads % n_kv:
        raise InputError("model", f"{where}: num_key_value_heads={n_kv} must divide num_attention_heads={n_heads}")
    head_dim = _int(cfg, "head_dim", where) if cfg.get("head_dim") is not None else h // n_heads
    if head_dim < 1:
        raise InputError("model", f"{where}: hidden_size {h} < num_attention_heads {n_heads}; give head_dim")

    ekey = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)), None)
    n_experts = _int(cfg, ekey, where) if ekey else 1
    tkey = next((k for k in ("num_experts_per_tok", "num_experts_per_token", "moe_topk") if cfg.get(k)), None)
    experts_per_token = _int(cfg, tkey, where) if (tkey and n_experts > 1) else 1
    moe_inter = _int(cfg, "moe_intermediate_size", where) if (n_experts > 1 and cfg.get("moe_intermediate_size")) \
        else None
    shared = _int(cfg, "shared_expert_intermediate_size", where) \
        if (n_experts > 1 and cfg.get("shared_expert_intermediate_size")) else 0

    dtype_raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    dtype = _DTYPES.get(str(dtype_raw).lower(), "bf16")

    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        tie = model_type in {"gpt2", "gpt_neo", "opt", "bloom", "gpt_bigcode", "gemma", "gemma2"}
    linear_bias = bool(cfg.get("mlp_bias")) or model_type in _LINEAR_BIAS
    qkv_bias = bool(cfg.get("attention_bias")) or bool(cfg.get("qkv_bias")) or model_type in _QKV_BIAS

    hf_id = cfg.get("_name_or_path") or None
    if name is None:
        if hf_id:
            name = str(hf_id)
        elif where != "<dict>":
            name = Path(where).parent.name or Path(where).stem
        else:
            name = model_type or "custom"
    return ModelSpec(
        name=str(name), hf_id=str(hf_id) if hf_id else None,
        n_layers=vals["n_layers"], hidden_size=h, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        intermediate_size=intermediate, vocab_size=vals["vocab_size"], max_model_len=vals["max_model_len"],
        n_experts=n_experts, experts_per_token=experts_per_token, params_published=None,
        tie_embeddings=bool(tie), mlp=mlp, norm="layer" if model_type in _LAYERNORM else "rms",
        qkv_bias=qkv_bias and not linear_bias, linear_bias=linear_bias, learned_pos=model_type in _LEARNED_POS,
        moe_intermediate_size=moe_inter, shared_expert_intermediate_size=shared, dtype=dtype,
        source=f"Hugging Face config.json: {where}",
        notes=f"model_type={model_type or '?'}; parameter count derived from the shape",
    )
