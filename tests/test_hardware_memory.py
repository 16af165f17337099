"""KV bytes per token, parameter counts, weight bytes, KV capacity M and max concurrency.

Every expected number is worked by hand in the comments (seed 002 eq. 3 with GQA:
2 * layers * kv_heads * head_dim * bytes per token) or typed in from model cards.
"""

import json
import math
import subprocess
import sys

import pytest

from llmqueue.errors import InputError
from llmqueue.hardware import (
    DEFAULT_RESERVE_BYTES,
    MODELS,
    active_param_count,
    get_model,
    kv_bytes_per_token,
    kv_capacity,
    max_concurrent_requests,
    param_count,
    per_gpu_kv_bytes_per_token,
    weight_bytes,
)

GiB = 2**30


# -- KV bytes per token ------------------------------------------------------------------------

@pytest.mark.parametrize("name,expected", [
    ("llama-2-7b", 524_288),        # 2 * 32 layers * 32 KV heads * 128 * 2 B = 64 * 4096 * 2 = 524,288 (MHA)
    ("llama-2-13b", 819_200),       # 2 * 40 * 40 * 128 * 2 = 80 * 5120 * 2 = 819,200 (MHA)
    ("llama-3.1-8b", 131_072),      # 2 * 32 * 8 * 128 * 2 = 64 * 1024 * 2 = 131,072 (GQA, 8 KV heads)
    ("llama-3.1-70b", 327_680),     # 2 * 80 * 8 * 128 * 2 = 160 * 1024 * 2 = 327,680
    ("llama-3.1-405b", 516_096),    # 2 * 126 * 8 * 128 * 2 = 252 * 1024 * 2 = 516,096
    ("qwen2.5-7b", 57_344),         # 2 * 28 * 4 * 128 * 2 = 56 * 512 * 2 = 57,344
    ("gpt-3-175b", 4_718_592),      # MHA: 2 * 96 layers * 12288 (= d) * 2 B = 192 * 24576 = 4,718,592
])
def test_kv_bytes_per_token(name, expected):
    assert kv_bytes_per_token(name) == expected


def test_llama2_7b_kv_per_4096_token_request_is_2_gib():
    # 524,288 * 4096 = 2^19 * 2^12 = 2^31 = 2,147,483,648 bytes = 2 GiB = 2.147 GB (seed 001: "roughly 2 GB")
    assert kv_bytes_per_token("llama-2-7b") * 4096 == 2 * GiB == 2_147_483_648


def test_gpt3_matches_seed_002_equation_3():
    # Eq. 3: M_KV = 2 * N_L * d * S * B * s_elem with N_L = 96, d = 12288, S = 2048, B = 1, fp16:
    # 2 * 96 * 12288 * 2048 * 2 = 9,663,676,416 bytes (9 GiB) per full-context sequence.
    assert kv_bytes_per_token("gpt-3") * 2048 == 9_663_676_416


def test_kv_dtypes():
    # bf16/fp16/auto = 2 bytes, fp8/int8 = 1, fp32 = 4 (Llama-3.1-8B: 65,536 values per token).
    assert kv_bytes_per_token("llama-3.1-8b", "fp16") == 131_072
    assert kv_bytes_per_token("llama-3.1-8b", "auto") == 131_072
    assert kv_bytes_per_token("llama-3.1-8b", "fp8") == 65_536
    assert kv_bytes_per_token("llama-3.1-8b", "fp8_e5m2") == 65_536
    assert kv_bytes_per_token("llama-3.1-8b", "int8") == 65_536
    assert kv_bytes_per_token("llama-3.1-8b", "float32") == 262_144
    with pytest.raises(InputError) as e:
        kv_bytes_per_token("llama-3.1-8b", "int4")
    assert e.value.field == "kv_dtype"
    with pytest.raises(InputError, match="unknown dtype"):
        kv_bytes_per_token("llama-3.1-8b", "fp6")


# -- parameters and weights --------------------------------------------------------------------

# Published parameter counts (model cards / Hugging Face safetensors totals, rounded as printed there).
PUBLISHED_PARAMS = {
    "llama-2-7b": 6.74e9, "llama-2-13b": 13.0e9, "llama-2-70b": 69.0e9, "llama-3-8b": 8.03e9,
    "llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 406e9, "mistral-7b": 7.24e9,
    "mixtral-8x7b": 46.7e9, "qwen2.5-7b": 7.61e9, "qwen2.5-72b": 72.7e9, "gpt-3-175b": 175e9,
}


@pytest.mark.parametrize("m", MODELS, ids=[m.name for m in MODELS])
def test_param_count_within_3_percent_of_published(m):
    assert param_count(m) == pytest.approx(PUBLISHED_PARAMS[m.name], rel=0.03)
    assert param_count(m) == pytest.approx(m.params_published, rel=0.03)


def test_param_count_llama2_7b_by_hand():
    # Embeddings + LM head: 2 * 32000 * 4096 = 262,144,000.
    # Per layer: attention 4 * 4096^2 = 67,108,864; gated MLP 3 * 4096 * 11008 = 135,266,304;
    # two RMSNorms 8,192 -> 202,383,360; * 32 layers = 6,476,267,520. Final norm 4,096.
    # Total 262,144,000 + 6,476,267,520 + 4,096 = 6,738,415,616.
    assert param_count("llama-2-7b") == 6_738_415_616


def test_param_count_gpt3_plain_mlp_by_hand():
    # Per layer (plain 4x MLP, biases, two LayerNorms): 12 d^2 + 13 d with d = 12288:
    # 12 * 150,994,944 = 1,811,939,328 + 159,744 = 1,812,099,072; * 96 = 173,961,510,912.
    # Token embeddings 50257 * 12288 = 617,558,016 (tied); positions 2048 * 12288 = 25,165,824;
    # final LayerNorm 24,576. Total 174,604,259,328 (the paper rounds to 175.0B).
    assert param_count("gpt-3-175b") == 174_604_259_328


def test_mixtral_active_params():
    # Mistral AI: "12.9B active parameters" (2 of 8 experts per token).
    assert active_param_count("mixtral-8x7b") == pytest.approx(12.9e9, rel=0.01)
    assert active_param_count("llama-2-7b") == param_count("llama-2-7b")


def test_weight_bytes():
    # Llama-2-7B, published 6,738,415,616 params: bf16 2 B -> 13,476,831,232; fp8 1 B; int4 0.5 B.
    assert weight_bytes("llama-2-7b", "bf16") == 13_476_831_232
    assert weight_bytes("llama-2-7b", "fp8") == 6_738_415_616
    assert weight_bytes("llama-2-7b", "int4") == 3_369_207_808
    assert weight_bytes("llama-2-7b", "fp32") == 26_953_662_464
    # GPT-3 uses the published 175e9, not the 174.6e9 shape count: 350 GB in fp16.
    assert weight_bytes("gpt-3", "fp16") == 350_000_000_000
    with pytest.raises(InputError) as e:
        weight_bytes("llama-2-7b", "int3")
    assert e.value.field == "weight_dtype"


# -- KV capacity -------------------------------------------------------------------------------

def test_default_reserve_is_1_gib():
    assert DEFAULT_RESERVE_BYTES == 1_073_741_824


def test_kv_capacity_llama2_7b_a100_80gb_by_hand():
    c = kv_capacity("llama-2-7b", "a100-80gb")
    # usable = 0.9 * 85,899,345,920 = 77,309,411,328 (72 GiB)
    assert c.usable_bytes_per_gpu == pytest.approx(77_309_411_328)
    # free = 77,309,411,328 - 13,476,831,232 (weights) - 1,073,741,824 (reserve) = 62,758,838,272
    assert c.kv_bytes_per_gpu == pytest.approx(62_758_838_272)
    # block = 16 * 524,288 = 8,388,608; 7481 * 8,388,608 = 62,755,176,448 <= free < 7482 blocks
    assert c.block_bytes_per_gpu == 8_388_608
    assert c.num_blocks == 7481
    assert c.M == 7481 * 16 == 119_696
    assert c.fits and c.short_bytes_per_gpu == 0
    assert c.weight_bytes_per_gpu == 13_476_831_232


def test_kv_capacity_knobs_by_hand():
    # No reserve: free grows by 1 GiB = 128 blocks of 8 MiB -> 7481 + 128 = 7609 blocks.
    assert kv_capacity("llama-2-7b", "a100-80gb", reserve_bytes=0).num_blocks == 7609
    # fp8 KV: blocks of 4 MiB -> floor(62,758,838,272 / 4,194,304) = 14,962 (14,962.87).
    assert kv_capacity("llama-2-7b", "a100-80gb", kv_dtype="fp8").num_blocks == 14_962
    # Block size 32: floor(62,758,838,272 / 16,777,216) = 3740 blocks -> M = 119,680.
    assert kv_capacity("llama-2-7b", "a100-80gb", block_size=32).M == 119_680
    # Utilization 1.0 is allowed: free = 85,899,345,920 - 13,476,831,232 - 1,073,741,824 = 71,348,772,864
    # -> floor(/ 8,388,608) = 8505 blocks (8505.4).
    assert kv_capacity("llama-2-7b", "a100-80gb", gpu_memory_utilization=1.0).num_blocks == 8505


def test_tensor_parallel_splits_kv_heads_and_weights():
    # Llama-3.1-70B on H100 SXM, TP=4: 2 KV heads per GPU -> 2 * 80 * 2 * 128 * 2 = 81,920 B/token/GPU.
    c = kv_capacity("llama-3.1-70b", "h100", tensor_parallel_size=4)
    assert c.kv_bytes_per_token == 327_680 and c.per_gpu_kv_bytes_per_token == 81_920
    assert c.kv_heads_per_gpu == 2
    # weights 70,553,706,496 * 2 = 141,107,412,992; / 4 = 35,276,853,248 per GPU
    assert c.weight_bytes_per_gpu == pytest.approx(35_276_853_248)
    # free = 0.9 * 85,520,809,984 - 35,276,853,248 - 1,073,741,824
    #      = 76,968,728,985.6 - 36,350,595,072 = 40,618,133,913.6
    # blocks = floor(40,618,133,913.6 / (16 * 81,920 = 1,310,720)) = 30,989 (30,989.18)
    assert c.num_blocks == 30_989 and c.M == 495_824


def test_tensor_parallel_replicates_kv_heads_beyond_their_number():
    # 8 KV heads over 16 ranks: each rank keeps one (replicated), 2 * 80 * 1 * 128 * 2 = 40,960, not 20,480.
    assert per_gpu_kv_bytes_per_token("llama-3.1-70b", 16) == 40_960
    assert per_gpu_kv_bytes_per_token("llama-3.1-70b", 8) == 40_960
    assert per_gpu_kv_bytes_per_token("llama-3.1-70b", 2) == 163_840
    # MHA splits all the way: Llama-2-7B over 4 ranks keeps 8 of 32 heads, 524,288 / 4 = 131,072.
    assert per_gpu_kv_bytes_per_token("llama-2-7b", 4) == 131_072


@pytest.mark.parametrize("name,tp", [("llama-2-7b", 3), ("qwen2.5-7b", 8), ("qwen2.5-7b", 7)])
def test_tensor_parallel_must_split_heads_evenly(name, tp):
    # 32 % 3 != 0; Qwen2.5-7B has 28 heads (28 % 8 != 0) and 4 KV heads (7 ranks cannot replicate 4).
    with pytest.raises(InputError) as e:
        kv_capacity(name, "h100", tensor_parallel_size=tp)
    assert e.value.field == "tensor_parallel_size"


def test_weights_that_do_not_fit_raise_with_shortfall_and_fix():
    # Llama-3.1-70B bf16 on one A100 80GB: 141,107,412,992 B = 131.42 GiB of weights + 1 GiB reserve
    # against 72 GiB usable: short by 60.42 GiB. TP=2 leaves 72 - 65.71 - 1 = 5.29 GiB for KV.
    with pytest.raises(InputError) as e:
        kv_capacity("llama-3.1-70b", "a100-80gb")
    msg = str(e.value)
    assert e.value.field == "tensor_parallel_size"
    assert "short by 60.42 GiB" in msg and "tensor_parallel_size >= 2" in msg and "GPU with more memory" in msg


def test_not_strict_reports_instead_of_raising():
    c = kv_capacity("llama-3.1-70b", "a100-80gb", strict=False)
    assert not c.fits and c.M == 0 and c.num_blocks == 0 and c.kv_bytes_per_gpu == 0
    assert c.short_bytes_per_gpu / GiB == pytest.approx(60.42, abs=0.01)


def test_weights_fit_but_no_room_for_kv():
    # Llama-3.1-8B bf16 on an L4: weights 8,030,261,248 * 2 = 16,060,522,496 B (14.957 GiB); usable
    # 0.7 * 23034 MiB = 16,907,029,708.8 B (15.746 GiB); difference 846,507,212.8 B = 0.7884 GiB.
    # Reserve 1 GiB -> -0.2116 GiB: the weights do not fit. Reserve 0.7 GiB -> 0.0884 GiB (90.5 MiB)
    # free: fits (blocks are 16 * 131,072 = 2 MiB). Reserve 0.787 GiB -> 1.41 MiB free < one block.
    with pytest.raises(InputError, match="do not fit"):
        kv_capacity("llama-3.1-8b", "l4", gpu_memory_utilization=0.7)
    assert kv_capacity("llama-3.1-8b", "l4", gpu_memory_utilization=0.7, reserve_bytes=0.7 * GiB).fits
    with pytest.raises(InputError, match="no room is left for the KV cache"):
        kv_capacity("llama-3.1-8b", "l4", gpu_memory_utilization=0.7, reserve_bytes=0.787 * GiB)


@pytest.mark.parametrize("util", [0, -0.1, 1.01, 2, float("nan"), float("inf")])
def test_gpu_memory_utilization_must_be_in_0_1(util):
    with pytest.raises(InputError) as e:
        kv_capacity("llama-2-7b", "a100-80gb", gpu_memory_utilization=util)
    assert e.value.field == "gpu_memory_utilization"


@pytest.mark.parametrize("kw,field", [
    ({"block_size": 0}, "block_size"), ({"block_size": 1.5}, "block_size"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"), ({"reserve_bytes": -1}, "reserve_bytes"),
    ({"kv_dtype": "int4"}, "kv_dtype"), ({"weight_dtype": "fp4x"}, "weight_dtype"),
])
def test_bad_capacity_inputs_name_the_field(kw, field):
    with pytest.raises(InputError) as e:
        kv_capacity("llama-2-7b", "a100-80gb", **kw)
    assert e.value.field == field


# -- max concurrent requests -------------------------------------------------------------------

def test_max_concurrent_llama2_7b_a100_seed_001():
    r = max_concurrent_requests("llama-2-7b", "a100-80gb", 4096)
    assert r.kv_bytes_per_request == 2_147_483_648
    # eq. 3 solved for B: floor(62,758,838,272 / 2,147,483,648) = 29 (29.22)
    assert r.B == 29
    # M // S = 119,696 // 4096 = 29 (29 * 4096 = 118,784); M / S = 29.22; 256 blocks per request -> 7481 // 256 = 29
    assert r.B_from_M == 29 and r.B_paged == 29 and r.blocks_per_request == 256
    assert r.concurrency == pytest.approx(119_696 / 4096)
    # Seed 001 says "around 24" with its own (unstated) overheads; same order, and ours is the
    # 0.9-utilization, 1 GiB-reserve figure.
    assert 20 <= r.B <= 30
    assert r.within_max_model_len


def test_max_concurrent_tp_and_paging():
    # Llama-3.1-70B, TP=4 on H100 (free per GPU 40,618,133,913.6 B from above), 8192-token requests:
    # per-GPU KV per request 8192 * 81,920 = 671,088,640 -> floor(60.53) = 60; M // 8192 = 495,824 // 8192 = 60.
    r = max_concurrent_requests("llama-3.1-70b", "h100", 8192, tensor_parallel_size=4)
    assert (r.B, r.B_from_M, r.B_paged) == (60, 60, 60)
    # 1000-token requests on Llama-2-7B/A100: 63 blocks (1008 tokens) each -> 7481 // 63 = 118;
    # M // 1000 = 119; bytes: floor(62,758,838,272 / 524,288,000) = 119.
    r = max_concurrent_requests("llama-2-7b", "a100-80gb", 1000)
    assert (r.B, r.B_from_M, r.B_paged, r.blocks_per_request) == (119, 119, 118, 63)


def test_max_concurrent_flags_context_beyond_model_and_zero():
    r = max_concurrent_requests("llama-2-7b", "a100-80gb", 8192)
    assert not r.within_max_model_len and r.B == 14  # floor(62,758,838,272 / 4,294,967,296) = 14
    r = max_concurrent_requests("llama-3.1-8b", "l4", 131072)
    assert r.B == 0 and r.B_from_M == 0  # one 128K request needs 16 GiB of KV; an L4 has ~4.3 GiB left
    with pytest.raises(InputError) as e:
        max_concurrent_requests("llama-2-7b", "a100-80gb", 0)
    assert e.value.field == "context_len"


def test_results_serialise_to_json():
    r = max_concurrent_requests("mixtral-8x7b", "h100", 4096, tensor_parallel_size=2)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["capacity"]["M"] == r.capacity.M and d["B"] == r.B
    assert json.loads(json.dumps(get_model("gpt-3").to_dict()))["mlp"] == "plain"


def test_hardware_import_is_cheap():
    code = ("import sys, llmqueue.hardware; "
            "print(any(m in sys.modules for m in ('numpy', 'scipy', 'pandas', 'pyarrow')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_catalog_model_fits_somewhere():
    # H200 usable at 0.9: 0.9 * 140.4 GiB = 126.4 GiB. 405B: 811.7 GB / 8 = 94.5 GiB per GPU; GPT-3:
    # 350 GB / 4 = 81.5 GiB; 70B-class: ~141 GB / 4 = 33 GiB; the rest fit on one GPU (Mixtral 87 GiB).
    for m in MODELS:
        tp = 1 if m.params_published < 60e9 else (4 if m.params_published < 300e9 else 8)
        c = kv_capacity(m, "h200", tensor_parallel_size=tp)
        assert c.fits and c.M > 0 and math.isfinite(c.kv_bytes_per_gpu)
