"""``llmqueue stability``: Nie et al.'s KV-memory stability threshold for one replica."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, json_option, print_json, print_kv, renamed_option


def capacity_from_flags(capacity_tokens, model, gpu, tensor_parallel_size, gpu_memory_utilization, block_size):
    """KV capacity M in tokens: given directly, or computed from a model on a GPU."""
    from llmqueue.errors import InputError

    if capacity_tokens is not None:
        if model is not None:
            raise InputError("capacity_tokens", "give either --capacity-tokens or --model/--gpu, not both")
        from llmqueue._validate import positive

        return positive("capacity_tokens", capacity_tokens), None
    if model is None:
        raise InputError("capacity_tokens", "the KV capacity M is missing",
                         "give --capacity-tokens N, or --model NAME [--gpu NAME] to compute it")
    from llmqueue.hardware import kv_capacity

    kv = kv_capacity(model, gpu, tensor_parallel_size=tensor_parallel_size,
                     gpu_memory_utilization=gpu_memory_utilization, block_size=block_size)
    return float(kv.M), kv


@command("stability")
@click.option("--capacity-tokens", "capacity_tokens", type=float, help="KV capacity M of one replica, in tokens.")
@click.option("--model", help="Compute M from a model (catalog name or config.json) instead of --capacity-tokens.")
@click.option("--gpu", default="a100-80gb", show_default=True, help="GPU used with --model.")
@click.option("--tensor-parallel-size", type=int, default=1, show_default=True, help="GPUs per replica (with --model).")
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True, help="With --model.")
@click.option("--block-size", type=int, default=16, show_default=True,
              help="KV block size in tokens (with --model, and with --paged).")
@click.option("--step-time", "b", type=float, required=True, help="Representative step (batch) time b in seconds.")
@click.option("--chunk", type=int, default=8192, show_default=True,
              help="Prefill chunk size s_hat in tokens (vLLM's default token budget, as simulate's).")
@renamed_option("--prompt-len", "prompt", old=("--prompt",), metavar="SPEC", help="Prompt length spec (tokens), e.g. uniform:10:1600.")
@renamed_option("--output-len", "output", old=("--output",), metavar="SPEC", help="Output length spec (tokens), e.g. uniform:10:1600.")
@click.option("--lengths", help="Joint (prompt, output) pairs instead: joint:FILE[:prompt=COL:output=COL].")
@click.option("--rate", "lam", type=float, help="Arrival rate lam (req/s): print the verdict.")
@click.option("--utilization", "rho_target", type=float, help="Target utilization: replicas G >= lam/(mu rho).")
@click.option("--paged", is_flag=True,
              help="Count E[g] in whole KV blocks of --block-size (what a paged engine such as vLLM holds).")
@json_option
def stability(capacity_tokens, model, gpu, tensor_parallel_size, gpu_memory_utilization, block_size, b, chunk,
              prompt, output, lengths, lam, rho_target, paged, as_json):
    """Service rate mu = M / (b E[g]) of one replica under KV-memory limits (Nie et al. 2026).

    g(s,o) is a request's lifetime KV memory-work in token-steps (chunked prefill, then decode).
    With --rate: "unstable" if lam > mu, "stable" if lam < mu(1 - delta), delta = max(s+o)/M,
    else "indeterminate". With --utilization too: replicas needed for that utilization.
    --paged counts the memory-work in whole KV blocks (half a block per request more, on average).

    Example (Nie et al. 2026, P/D 1:1; the paper's theory gives 3.263 req/s):

      llmqueue stability --capacity-tokens 131000 --step-time 0.0372 --chunk 512
      --prompt-len uniform:10:1600 --output-len uniform:10:1600 --rate 3
    """
    from llmqueue.errors import InputError
    from llmqueue.theory.kv import kv_stability

    M, kv = capacity_from_flags(capacity_tokens, model, gpu, tensor_parallel_size, gpu_memory_utilization, block_size)
    if lengths is not None:
        if prompt is not None or output is not None:
            raise InputError("lengths", "give either --lengths or --prompt-len/--output-len, not both")
        from llmqueue.workload import parse_joint

        dists = dict(pairs=parse_joint(lengths, field="lengths"))
    else:
        if prompt is None or output is None:
            raise InputError("prompt" if prompt is None else "output", "missing length distribution",
                             "give --prompt-len SPEC and --output-len SPEC (e.g. uniform:10:1600), or --lengths joint:FILE")
        from llmqueue.workload import parse_length

        dists = dict(prompt=parse_length(prompt, field="prompt"), output=parse_length(output, field="output"))
    if rho_target is not None and lam is None:
        raise InputError("rho_target", "a replica count needs an arrival rate", "give --rate too")
    r = kv_stability(M=M, b=b, chunk=chunk, lam=lam, rho_target=rho_target,
                     block_size=block_size if paged else None, **dists)
    if r.max_request_tokens > r.M:
        raise InputError("capacity_tokens", f"the largest request ({r.max_request_tokens:,.0f} prompt + output "
                         f"tokens) exceeds the KV capacity M = {r.M:,.0f} tokens: no replica can ever hold it, so "
                         "mu and the verdict do not apply", "raise --capacity-tokens (or --model/--gpu/"
                         "--tensor-parallel-size), or shorten --prompt-len/--output-len")
    out = r.to_dict()
    if kv is not None:
        out["capacity_from"] = {"model": kv.model, "gpu": kv.gpu, "tensor_parallel_size": tensor_parallel_size,
                                "gpu_memory_utilization": gpu_memory_utilization}
    if as_json:
        print_json(out)
        return
    rows = [
        ("M (KV capacity, tokens)", r.M),
        ("b (step time, s)", r.b),
        ("chunk (prefill, tokens)", r.chunk),
        ("E[g] (token-steps, step-exact)", r.E_g),
        ("E[g] (closed form)", r.E_g_closed),
        ("mu = M/(b E[g]) (req/s)", r.mu),
        ("mu, closed-form E[g] (req/s)", r.mu_closed_form),
        ("delta = max(s+o)/M", r.delta),
        ("stable below mu(1-delta) (req/s)", r.mu_stable_below),
    ]
    if r.lam is not None:
        rows += [("lam (req/s)", r.lam), ("rho = lam/mu", r.rho), ("verdict", r.verdict)]
        if r.verdict == "unstable":
            rows.append(("queue grows (req/s, at least)", r.lam - r.mu))
    if r.replicas is not None:
        rows += [("target utilization", r.rho_target), ("replicas G >= lam/(mu rho)", r.replicas)]
    print_kv(rows, title="KV-memory stability (Nie et al. 2026)")
