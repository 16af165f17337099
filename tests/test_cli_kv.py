"""``llmqueue kv``: table and JSON output, the catalog listing, config.json models, and errors.

Expected numbers are worked by hand in tests/test_hardware_memory.py's comments (Llama-2-7B on an
A100 80GB: 524,288 B/token, 2 GiB per 4096-token request, 7,481 blocks, M = 119,696, 29 requests).
"""

import json

import pytest
from _cli import run_cli


def run(*args):
    return run_cli("kv", *args)


def test_llama2_7b_4096_table():
    code, out, err = run("--model", "llama-2-7b", "--context", "4096")
    assert code == 0 and err == ""
    assert "a100-80gb" in out                       # the default GPU is printed
    assert "524,288" in out                          # 2 * 32 * 32 * 128 * 2 bytes per token
    assert "2.147 GB = 2 GiB" in out                 # 524,288 * 4096 = 2^31 bytes per request
    assert "13.48 GB = 12.55 GiB" in out             # 6,738,415,616 params * 2 bytes
    assert "7,481" in out and "119,696" in out       # blocks and M
    line = next(ln for ln in out.splitlines() if ln.startswith("max concurrent requests"))
    # floor(62,758,838,272 B free / 2,147,483,648 B per request) = 29; 119,696 // 4096 = 29
    assert line.split("tokens", 1)[1].split()[:1] == ["29"], line
    assert "M // context = 29;" in line


def test_llama2_7b_json():
    code, out, _ = run("--model", "llama-2-7b", "--context", "4096", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["gpu"]["name"] == "a100-80gb" and d["model"]["name"] == "llama-2-7b"
    assert d["context_len"] == 4096
    assert d["kv_bytes_per_request"] == 2_147_483_648
    assert d["capacity"]["kv_bytes_per_token"] == 524_288
    assert d["capacity"]["num_blocks"] == 7481 and d["capacity"]["M"] == 119_696
    assert d["B"] == 29 and d["B_from_M"] == 29


def test_default_context_is_max_model_len():
    code, out, _ = run("--model", "llama-2-7b", "--json")
    assert code == 0 and json.loads(out)["context_len"] == 4096  # Llama-2 max_position_embeddings


def test_tensor_parallel_json():
    # Llama-3.1-70B, TP=4 on H100 SXM: 81,920 B/token/GPU, 30,989 blocks, M = 495,824; 60 requests of 8192.
    code, out, _ = run("--model", "llama-3.1-70b", "--gpu", "h100", "--tensor-parallel-size", "4",
                       "--context", "8192", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["capacity"]["per_gpu_kv_bytes_per_token"] == 81_920
    assert d["capacity"]["M"] == 495_824 and d["B"] == 60


def test_tensor_parallel_table_shows_per_gpu_share():
    code, out, _ = run("--model", "llama-3.1-70b", "--gpu", "h100", "--tensor-parallel-size", "4",
                       "--context", "8192")
    assert code == 0 and "81,920" in out and "2 KV heads per GPU" in out and "h100-sxm x 4" in out


def test_knobs():
    # fp8 KV: 14,962 blocks -> M = 239,392; no reserve: 7609 blocks -> M = 121,744.
    code, out, _ = run("--model", "llama-2-7b", "--kv-cache-dtype", "fp8", "--json")
    assert code == 0 and json.loads(out)["capacity"]["M"] == 239_392
    code, out, _ = run("--model", "llama-2-7b", "--reserve-gib", "0", "--json")
    assert code == 0 and json.loads(out)["capacity"]["M"] == 7609 * 16
    code, out, _ = run("--model", "llama-2-7b", "--block-size", "32", "--json")
    assert code == 0 and json.loads(out)["capacity"]["M"] == 119_680
    code, out, _ = run("--model", "llama-2-7b", "--dtype", "int4", "--json")
    assert code == 0 and json.loads(out)["capacity"]["weight_bytes"] == 3_369_207_808


def test_list():
    code, out, _ = run("--list")
    assert code == 0
    for name in ("llama-2-7b", "llama-3.1-405b", "mixtral-8x7b", "qwen2.5-72b", "gpt-3-175b",
                 "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l4", "l40s", "mi300x"):
        assert name in out
    assert "indicative" in out
    code, out, _ = run("--list", "--json")
    d = json.loads(out)
    assert code == 0 and len(d["models"]) >= 12 and len(d["gpus"]) >= 9
    assert next(m for m in d["models"] if m["name"] == "gpt-3-175b")["kv_bytes_per_token_bf16"] == 4_718_592


def test_config_json_model_matches_catalog(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
           "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _, cat, _ = run("--model", "llama-2-7b", "--context", "4096", "--json")
    for arg in (str(tmp_path), str(tmp_path / "config.json")):
        code, out, _ = run("--model", arg, "--context", "4096", "--json")
        assert code == 0
        a, b = json.loads(out), json.loads(cat)
        for k in ("kv_bytes_per_token", "weight_bytes", "num_blocks", "M"):
            assert a["capacity"][k] == b["capacity"][k], k
        assert a["B"] == b["B"] == 29


def _one_error_line(err, flag):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"llmqueue: error: {flag}"), lines[0]
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("args,flag,text", [
    (["--model", "llama-9"], "--model", "unknown model 'llama-9'"),
    (["--model", "llama-2-7b", "--gpu", "v100"], "--gpu", "unknown GPU 'v100'"),
    (["--model", "llama-2-7b", "--gpu-memory-utilization", "0"], "--gpu-memory-utilization", "(0, 1]"),
    (["--model", "llama-2-7b", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization", "(0, 1]"),
    (["--model", "llama-3.1-70b"], "--tensor-parallel-size", "short by 60.42 GiB"),
    (["--model", "llama-2-7b", "--tensor-parallel-size", "3"], "--tensor-parallel-size", "not divisible"),
    (["--model", "llama-2-7b", "--kv-cache-dtype", "int4"], "--kv-cache-dtype", "int4"),
    (["--model", "llama-2-7b", "--dtype", "fp4x"], "--dtype", "unknown dtype"),
    (["--model", "llama-2-7b", "--block-size", "0"], "--block-size", ">= 1"),
    (["--model", "llama-2-7b", "--context", "0"], "--context", ">= 1"),
    (["--model", "llama-2-7b", "--reserve-gib", "-1"], "--reserve-gib", ">= 0"),
    ([], "--model", "required"),
])
def test_errors_exit_2_with_one_line_naming_the_flag(args, flag, text):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert text in _one_error_line(err, flag)


def test_missing_config_key_names_key_and_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    code, _, err = run("--model", str(p))
    line = _one_error_line(err, "--model")
    assert code == 2 and "num_hidden_layers" in line and str(p) in line


def test_context_beyond_capacity_is_reported():
    code, out, _ = run("--model", "llama-3.1-8b", "--gpu", "l4")  # default context 131,072
    assert code == 0 and "does not fit" in out
    code, out, _ = run("--model", "llama-2-7b", "--context", "8192")
    assert code == 0 and "exceeds the model's max_position_embeddings" in out
