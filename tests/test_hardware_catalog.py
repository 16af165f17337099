"""Catalog lookups, catalog figures against published values, and Hugging Face config.json loading.

Expected numbers are typed in from the published config.json files, model cards and
datasheets (or worked by hand in the comments), not computed by the code under test.
"""

import json

import pytest

from llmqueue.errors import InputError
from llmqueue.hardware import (
    GPUS,
    MODELS,
    get_gpu,
    get_model,
    kv_bytes_per_token,
    model_from_hf_config,
    param_count,
)

MiB = 2**20
GiB = 2**30

# (name, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, max_position_embeddings)
# from each model's Hugging Face config.json (GPT-3: Brown et al. 2020 table 2.1).
PUBLISHED_SHAPES = [
    ("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
    ("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096),
    ("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096),
    ("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192),
    ("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072),
    ("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072),
    ("llama-3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, 131072),
    ("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768),
    ("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768),
    ("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 131072),
    ("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, 131072),
    ("gpt-3-175b", 96, 12288, 96, 96, 128, 49152, 50257, 2048),
]


@pytest.mark.parametrize("row", PUBLISHED_SHAPES, ids=[r[0] for r in PUBLISHED_SHAPES])
def test_catalog_shapes_match_published_configs(row):
    name, L, h, nh, nkv, hd, inter, vocab, maxlen = row
    m = get_model(name)
    assert (m.n_layers, m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim) == (L, h, nh, nkv, hd)
    assert (m.intermediate_size, m.vocab_size, m.max_model_len) == (inter, vocab, maxlen)


def test_catalog_covers_the_required_models_and_gpus():
    assert {r[0] for r in PUBLISHED_SHAPES} <= {m.name for m in MODELS}
    want_gpus = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l4", "l40s", "mi300x"}
    assert want_gpus <= {g.name for g in GPUS}


def test_mixtral_is_a_moe_and_others_are_dense():
    m = get_model("mixtral-8x7b")
    assert (m.n_experts, m.experts_per_token) == (8, 2)
    assert all(x.n_experts == 1 for x in MODELS if x.name != "mixtral-8x7b")


def test_gpt3_has_plain_mlp_and_others_gated():
    assert get_model("gpt-3").mlp == "plain"
    assert {m.mlp for m in MODELS if m.name != "gpt-3-175b"} == {"gated"}


@pytest.mark.parametrize("alias,name", [
    ("llama-2-7b", "llama-2-7b"),
    ("LLAMA-2-7B", "llama-2-7b"),
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    ("meta-llama/llama-2-7b-chat-hf", "llama-2-7b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("Qwen/Qwen2.5-72B", "qwen2.5-72b"),
    ("gpt3", "gpt-3-175b"),
])
def test_model_lookup_by_name_or_alias(alias, name):
    assert get_model(alias).name == name


@pytest.mark.parametrize("alias,name", [
    ("a100-80gb", "a100-80gb"),
    ("A100", "a100-80gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),   # nvidia-smi's name
    ("a100_40gb", "a100-40gb"),
    ("h100", "h100-sxm"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("H100-PCIe", "h100-pcie"),
    ("H200", "h200"),
    ("MI300X", "mi300x"),
])
def test_gpu_lookup_by_name_or_alias(alias, name):
    assert get_gpu(alias).name == name


def test_unknown_model_lists_choices():
    with pytest.raises(InputError) as e:
        get_model("llama-9-1b")
    err = e.value
    assert err.field == "model"
    assert "unknown model 'llama-9-1b'" in str(err)
    assert "llama-2-7b" in str(err) and "gpt-3-175b" in str(err) and "config.json" in str(err)


def test_unknown_gpu_lists_choices():
    with pytest.raises(InputError) as e:
        get_gpu("v100")
    assert e.value.field == "gpu"
    assert "unknown GPU 'v100'" in str(e.value)
    assert "a100-80gb" in str(e.value) and "mi300x" in str(e.value)


def test_gpu_memory_is_what_nvidia_smi_reports():
    # A100 80GB: nvidia-smi 81920 MiB = 80 GiB = 85,899,345,920 bytes (not 80e9).
    assert get_gpu("a100-80gb").memory_bytes == 85_899_345_920 == 80 * GiB
    # A100 40GB: 40960 MiB = 40 GiB = 42,949,672,960 bytes.
    assert get_gpu("a100-40gb").memory_bytes == 42_949_672_960
    # H100 80GB HBM3: 81559 MiB; 81559 * 1,048,576 = 81,559,000,000 + 81559 * 48,576
    # = 81,559,000,000 + 3,961,809,984 = 85,520,809,984 bytes.
    assert get_gpu("h100").memory_bytes == 85_520_809_984
    assert get_gpu("l4").reported_mib == 23034 and get_gpu("l40s").reported_mib == 46068


def test_gpu_datasheet_figures():
    # Dense BF16 (half the 2:4-sparse datasheet figure) and memory bandwidth, vendor datasheets.
    assert get_gpu("a100-80gb").bf16_dense_flops == pytest.approx(312e12)
    assert get_gpu("a100-80gb").hbm_bytes_per_s == pytest.approx(2039e9)
    assert get_gpu("a100-40gb").hbm_bytes_per_s == pytest.approx(1555e9)
    assert get_gpu("h100-sxm").bf16_dense_flops == pytest.approx(1979e12 / 2, rel=1e-3)
    assert get_gpu("h100-sxm").hbm_bytes_per_s == pytest.approx(3.35e12)
    assert get_gpu("h100-pcie").bf16_dense_flops == pytest.approx(1513e12 / 2, rel=1e-3)
    assert get_gpu("h200").hbm_bytes_per_s == pytest.approx(4.8e12)
    assert get_gpu("mi300x").bf16_dense_flops == pytest.approx(1307.4e12)
    assert get_gpu("l4").bf16_dense_flops == pytest.approx(242e12 / 2)


def test_every_entry_is_documented_and_sane():
    for g in GPUS:
        assert g.source and g.notes and g.memory_label
        assert 20 * GiB < g.memory_bytes < 200 * GiB
        assert 50e12 < g.bf16_dense_flops < 3e15
        assert 0 < g.price_per_hour < 20
    for m in MODELS:
        assert m.source and m.notes
        assert m.n_heads % m.n_kv_heads == 0
        assert m.params_published is not None


# -- Hugging Face config.json ------------------------------------------------------------------

LLAMA31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B config.json (the keys that matter)
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}

LLAMA2_7B_CONFIG = {  # meta-llama/Llama-2-7b-hf config.json: no num_key_value_heads key in early revisions
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000,
}


def _write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def test_hf_config_file_matches_catalog_entry(tmp_path):
    p = _write(tmp_path, LLAMA31_8B_CONFIG)
    m = model_from_hf_config(p)
    cat = get_model("llama-3.1-8b")
    for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "intermediate_size", "vocab_size",
              "max_model_len", "tie_embeddings", "dtype"):
        assert getattr(m, f) == getattr(cat, f), f
    # 2 * 32 layers * 8 KV heads * 128 * 2 bytes = 131,072
    assert kv_bytes_per_token(m) == kv_bytes_per_token(cat) == 131_072
    # Published 8,030,261,248 parameters (safetensors total); the shape gives the same count.
    assert param_count(m) == 8_030_261_248


def test_hf_config_directory_and_get_model_path(tmp_path):
    _write(tmp_path, LLAMA2_7B_CONFIG)
    loaded = [model_from_hf_config(tmp_path), get_model(tmp_path), get_model(str(tmp_path)),
              get_model(str(tmp_path / "config.json"))]
    for m in loaded:
        # num_key_value_heads absent -> MHA with 32 KV heads; head_dim absent -> 4096 / 32 = 128
        assert (m.n_kv_heads, m.head_dim) == (32, 128)
        # 2 * 32 * 32 * 128 * 2 = 524,288 bytes per token
        assert kv_bytes_per_token(m) == 524_288
        # Llama-2-7B: 6,738,415,616 parameters (see test_hardware_memory for the hand count)
        assert param_count(m) == 6_738_415_616


def test_hf_config_dict_and_moe():
    mixtral = {  # mistralai/Mixtral-8x7B-v0.1 config.json
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "num_experts_per_tok": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
    }
    m = model_from_hf_config(mixtral)
    assert (m.n_experts, m.experts_per_token) == (8, 2)
    # Published: 46,702,792,704 parameters (46.7B)
    assert param_count(m) == 46_702_792_704


def test_hf_config_qwen2_biases():
    qwen = {  # Qwen/Qwen2.5-7B config.json
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072,
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 152064,
    }
    m = model_from_hf_config(qwen)
    assert m.qkv_bias
    # Model card: 7.61B parameters. Hand count: per layer q 3584*3584 + k,v 2*3584*512 + o 3584*3584
    # = 29,360,128, + qkv biases 3584 + 2*512 = 4,608, + MLP 3*3584*18944 = 203,685,888, + norms 7,168
    # = 233,057,792; * 28 = 6,525,618,176; + embeddings and LM head 2*152064*3584 = 1,089,994,752
    # + final norm 3,584 = 7,615,616,512.
    assert param_count(m) == 7_615_616_512


def test_hf_config_gpt2_style_keys():
    gpt2 = {  # openai-community/gpt2 config.json
        "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "n_inner": None,
        "vocab_size": 50257, "torch_dtype": "float32",
    }
    m = model_from_hf_config(gpt2)
    assert (m.mlp, m.intermediate_size, m.tie_embeddings, m.learned_pos) == ("plain", 3072, True, True)
    # GPT-2 small has 124,439,808 parameters: wte 50257*768 = 38,597,376, wpe 1024*768 = 786,432,
    # 12 layers * (12*768^2 + 13*768 = 7,087,872) = 85,054,464, final LayerNorm 1,536.
    assert param_count(m) == 124_439_808
    # 2 * 12 * 12 * 64 * 2 = 36,864 bytes per token in fp16 ("auto" serves fp32 checkpoints in fp16)
    assert kv_bytes_per_token(m, "auto") == 36_864


def test_hf_config_text_config_is_used():
    outer = {"model_type": "llava", "torch_dtype": "bfloat16", "text_config": dict(LLAMA31_8B_CONFIG)}
    assert kv_bytes_per_token(model_from_hf_config(outer)) == 131_072


def test_hf_config_missing_key_names_key_and_file(tmp_path):
    cfg = {k: v for k, v in LLAMA31_8B_CONFIG.items() if k != "num_hidden_layers"}
    p = _write(tmp_path, cfg)
    with pytest.raises(InputError) as e:
        model_from_hf_config(p)
    assert e.value.field == "model"
    assert "num_hidden_layers" in str(e.value) and str(p) in str(e.value)

    cfg = {k: v for k, v in LLAMA31_8B_CONFIG.items() if k != "intermediate_size"}
    with pytest.raises(InputError, match="intermediate_size"):
        model_from_hf_config(_write(tmp_path, cfg, "c2.json"))


def test_hf_config_bad_files(tmp_path):
    with pytest.raises(InputError, match="no such config file"):
        get_model(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="JSON"):
        model_from_hf_config(bad)
    with pytest.raises(InputError, match="num_key_value_heads"):
        model_from_hf_config({**LLAMA31_8B_CONFIG, "num_key_value_heads": 5})
    with pytest.raises(InputError, match="latent attention"):
        model_from_hf_config({**LLAMA31_8B_CONFIG, "kv_lora_rank": 512})
