"""Prefix-cache hits from a host KV tier on a real trace (issue 39, KV tiers).

Mooncake's conversation trace (Qin et al., FAST 2025: 12,031 requests with 512-token prefix-block
hashes, 36.6 % of blocks reused, mostly at a long distance) rescaled to ``--rate`` req/s
(``llmqueue workload convert --rate``, the arrivals' shape kept), served by one Llama-3.1-8B on an
H100 (the roofline step, the KV capacity the model and GPU leave) with prefix caching, without a
host tier and with host tiers of several sizes (``--kv-offloading-size``) at ``--gbps``: the
prompt tokens served from the GPU's cache and from the host tier, TTFT, and the seconds the steps
waited for loads. Each run is ``llmqueue simulate`` as a user runs it (printed).

Usage: python benchmarks/kv_tier_prefix.py --trace ../shared/traces/mooncake_fast25/conversation_trace.jsonl
       [--rate 1.0] [--sizes 0,64,256,1024] [--gbps 25,5] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def llmqueue(*args: str) -> str:
    r = subprocess.run([sys.executable, "-c", "from llmqueue.cli.main import run; run()", *args],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"llmqueue {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, help="a Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids)")
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--sizes", default="0,64,256,1024", help="host tier sizes, GiB (0: none)")
    ap.add_argument("--gbps", default="25,5", help="host link bandwidths, GB/s (each size but 0 at each)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = str(Path(tmp) / "trace.parquet")
        llmqueue("workload", "convert", a.trace, "--rate", str(a.rate), "-o", trace)
        base = ["simulate", "--trace", trace, "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                "--enable-prefix-caching", "--no-progress", "--json"]
        runs = [(0.0, None)] + [(float(s), float(g)) for s in a.sizes.split(",") if float(s) for g in a.gbps.split(",")]
        for size, gbps in runs:
            extra = [] if not size else ["--kv-offloading-size", f"{size:g}", "--kv-offloading-gbps", f"{gbps:g}"]
            print("llmqueue", " ".join(base[:1] + ["--trace", "TRACE"] + base[3:] + extra), file=sys.stderr)
            d = json.loads(llmqueue(*base, *extra))
            t = d.get("kv_tier") or {}
            hr = d.get("prefix_hit_rate") or {}
            rows.append({"size_gib": size, "gbps": gbps, "gpu_hit": hr.get("gpu"), "host_hit": hr.get("host"),
                         "mean_ttft_ms": d["mean_ttft_ms"], "p50_ttft_ms": d["p50_ttft_ms"], "p99_ttft_ms": d["p99_ttft_ms"],
                         "p50_tpot_ms": d["p50_tpot_ms"], "load_s": t.get("load_s", 0.0), "preemptions": d.get("preemptions"),
                         "kv_capacity_tokens": d.get("kv_capacity_tokens"), "verdict": d["verdict"]})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"GPU KV: {rows[0]['kv_capacity_tokens']:,} tokens; {a.rate:g} req/s")
    print("| host tier | link GB/s | GPU hits | host hits | TTFT mean | p50 | p99 | TPOT p50 | load s | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        gpu = f"{r['gpu_hit']:.1%}"
        host = "-" if r["host_hit"] is None else f"{r['host_hit']:.1%}"
        print(f"| {r['size_gib']:g} GiB | {r['gbps'] or '-'} | {gpu} | {host} | {r['mean_ttft_ms']:,.0f} ms "
              f"| {r['p50_ttft_ms']:,.0f} | {r['p99_ttft_ms']:,.0f} | {r['p50_tpot_ms']:.1f} | {r['load_s']:.1f} | {r['verdict']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
