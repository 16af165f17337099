"""``llmqueue kv``: KV cache per token and per request, weights, and the KV capacity ``M`` of a GPU."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, fmt, json_option, print_json, print_kv, print_table

_GB, _GiB = 1e9, 2**30


def _size(n: float) -> str:
    """Bytes as ``decimal GB = binary GiB`` (both, since vendors and tools differ)."""
    return f"{n / _GB:.4g} GB = {n / _GiB:.4g} GiB"


def _print_catalog(as_json: bool) -> None:
    from llmqueue.hardware import GPUS, MODELS, kv_bytes_per_token, param_count

    if as_json:
        print_json({"models": [dict(m.to_dict(), kv_bytes_per_token_bf16=kv_bytes_per_token(m),
                                    param_count=param_count(m)) for m in MODELS],
                    "gpus": [g.to_dict() for g in GPUS]})
        return
    print_table(
        ["model", "layers", "hidden", "heads", "KV heads", "head_dim", "KV B/token (bf16)", "params", "max len"],
        [[m.name, m.n_layers, m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim, kv_bytes_per_token(m),
          f"{(m.params_published or param_count(m)) / 1e9:.3g}B", m.max_model_len] for m in MODELS],
        title="Models (Hugging Face config.json values; --model also takes a config.json path)")
    click.echo("")
    print_table(
        ["gpu", "memory", "GiB", "nvidia-smi MiB", "BF16 dense TFLOP/s", "mem BW TB/s", "link (GB/s each way)",
         "$/h (indicative)"],
        [[g.name, g.memory_label, f"{g.memory_gib:.2f}", g.reported_mib, f"{g.bf16_dense_flops / 1e12:,.1f}",
          f"{g.hbm_bytes_per_s / 1e12:.3g}", f"{g.link} ({g.link_bytes_per_s / 1e9:g})" if g.link else "-",
          f"{g.price_per_hour:.2f}"] for g in GPUS],
        title="GPUs (vendor datasheets; prices are indicative on-demand list prices, not quotes)")


@command("kv")
@click.option("--model", help="Catalog name or alias (see --list), or a Hugging Face config.json path or directory.")
@click.option("--gpu", default="a100-80gb", show_default=True, help="GPU name or alias (see --list).")
@click.option("--context", "context_len", type=int,
              help="Tokens per request (prompt + output). Default: the model's max_position_embeddings.")
@click.option("--tensor-parallel-size", type=int, default=1, show_default=True, help="GPUs per pipeline stage.")
@click.option("--pipeline-parallel-size", type=int, default=1, show_default=True,
              help="Pipeline stages per replica (tp x pp GPUs; each holds 1/pp of the layers' weights and KV).")
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True,
              help="Fraction of each GPU's memory the engine may use, in (0, 1].")
@click.option("--block-size", type=int, default=16, show_default=True, help="KV block size in tokens.")
@click.option("--kv-cache-dtype", "kv_dtype", default="auto", show_default=True,
              help="KV cache dtype: auto (the model's dtype, bf16/fp16), fp8, int8, fp32...")
@click.option("--dtype", "weight_dtype", default="auto", show_default=True,
              help="Weight dtype: auto (the model's), bf16, fp16, fp8, int8, int4.")
@click.option("--reserve-gib", type=float, default=1.0, show_default=True,
              help="Per-GPU memory kept for activations, CUDA graphs and the CUDA context.")
@click.option("--list", "list_", is_flag=True, help="Print the catalog of models and GPUs and exit.")
@json_option
def kv(model, gpu, context_len, tensor_parallel_size, pipeline_parallel_size, gpu_memory_utilization, block_size,
       kv_dtype, weight_dtype, reserve_gib, list_, as_json):
    """KV bytes per token and per request, weight memory, and the KV capacity M of one replica.

    KV bytes per token = 2 * layers * KV heads * head_dim * bytes (Inference Foundations eq. 3 with
    GQA). Per GPU, memory * utilization - weights / (TP x PP) - reserve is cut into blocks of
    --block-size tokens; M = blocks * block size. Max concurrent requests at --context =
    floor(KV memory / KV per request).

    Example (the Continuous Batching essay): llmqueue kv --model llama-2-7b --context 4096
    """
    if list_:
        _print_catalog(as_json)
        return
    from llmqueue._validate import nonnegative
    from llmqueue.errors import InputError
    from llmqueue.hardware import get_gpu, get_model, max_concurrent_requests, param_count

    if model is None:
        raise InputError("model", "is required", "give a catalog name (see --list) or a config.json path")
    m, g = get_model(model), get_gpu(gpu)
    reserve = nonnegative("reserve_gib", reserve_gib) * _GiB
    S = m.max_model_len if context_len is None else context_len
    r = max_concurrent_requests(m, g, S, tensor_parallel_size=tensor_parallel_size,
                                pipeline_parallel_size=pipeline_parallel_size,
                                gpu_memory_utilization=gpu_memory_utilization, reserve_bytes=reserve,
                                block_size=block_size, kv_dtype=kv_dtype, weight_dtype=weight_dtype)
    c = r.capacity
    if as_json:
        print_json({"model": m.to_dict(), "gpu": g.to_dict(), "context_len": S, "capacity": c.to_dict(),
                    **{k: v for k, v in r.to_dict().items() if k != "capacity"}})
        return
    tp = c.tensor_parallel_size
    params = m.params_published or param_count(m)
    rows = [
        ("model", f"{m.name} ({m.n_layers} layers, {m.n_kv_heads} KV heads x {m.head_dim}, {m.attention})"),
        ("gpu", f"{g.name} x {c.gpus} ({g.memory_label}; {g.memory_gib:.2f} GiB per GPU"
                f"{f'; tp {tp} x pp {c.pipeline_parallel_size}' if c.pipeline_parallel_size > 1 else ''})"),
        ("KV cache dtype / weights", f"{c.kv_dtype} / {c.weight_dtype}"),
        ("KV bytes per token", f"{c.kv_bytes_per_token:,} ({c.kv_bytes_per_token / 1024:g} KiB)"),
    ]
    if c.gpus > 1:
        stage = f", 1/{c.pipeline_parallel_size} of the layers" if c.pipeline_parallel_size > 1 else ""
        rows.append(("KV bytes per token per GPU", f"{c.per_gpu_kv_bytes_per_token:,} "
                                                   f"({c.kv_heads_per_gpu} KV heads per GPU{stage})"))
    rows += [
        (f"KV per request ({S:,} tokens)", _size(r.kv_bytes_per_request)),
        ("weights", f"{_size(c.weight_bytes)} ({params / 1e9:.4g}B params)"),
        ("usable memory per GPU", f"{_size(c.usable_bytes_per_gpu)} ({fmt(c.gpu_memory_utilization)} of "
                                  f"{g.memory_gib:.2f} GiB)"),
        ("weights per GPU", _size(c.weight_bytes_per_gpu)),
        ("reserve per GPU", _size(c.reserve_bytes)),
        ("KV memory per GPU", _size(c.kv_bytes_per_gpu)),
        (f"KV blocks ({c.block_size} tokens)", f"{c.num_blocks:,}"),
        ("M (KV capacity, tokens)", f"{c.M:,}"),
        (f"max concurrent requests at {S:,} tokens", f"{r.B:,} (M // context = {r.B_from_M:,}; "
                                                      f"M / context = {r.concurrency:.2f})"),
    ]
    if not r.within_max_model_len:
        rows.append(("note", f"--context {S:,} exceeds the model's max_position_embeddings {m.max_model_len:,}"))
    elif r.B == 0:
        rows.append(("note", f"one {S:,}-token request does not fit (vLLM would refuse max_model_len={S:,})"))
    print_kv(rows, title=f"KV cache: {m.name} on {g.name}")
