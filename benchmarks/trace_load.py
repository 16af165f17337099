"""Load time and memory of ``load_trace`` on a one-million-row Azure-format CSV.

Goal (workload-realism issue): under 3 s and under 10x the file's size in memory.

Writes an Azure LLM inference 2023 style CSV (``TIMESTAMP`` with 100 ns digits,
``ContextTokens``, ``GeneratedTokens``; Poisson arrivals at 50 req/s) into a temporary
directory, then loads it in a fresh process per repeat (so the imports are warm but the memory
peak is the load's own) and reports the wall time, the peak resident-memory growth during the
load (``ru_maxrss`` after the load minus the resident size just before it, which counts
pyarrow's allocations that tracemalloc does not see), pyarrow's own pool peak, and both
against the file size.

Usage: python benchmarks/trace_load.py [--rows 1000000] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def make_csv(path: str, rows: int, seed: int = 0) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    start = np.datetime64("2023-11-16T18:15:46.680590000", "ns").astype(np.int64)
    gaps = np.maximum(1, np.round(rng.exponential(1e9 / 50, rows) / 100)).astype(np.int64) * 100
    ns = start + np.cumsum(gaps)
    text = pc.strftime(pa.array(ns, type=pa.timestamp("ns")), format="%Y-%m-%d %H:%M:%S")
    text = pc.utf8_slice_codeunits(text, 0, 27)  # 7 fractional digits, as in the Azure files
    table = pa.table({"TIMESTAMP": text,
                      "ContextTokens": np.round(rng.lognormal(6.7, 0.9, rows)).astype(np.int64) + 1,
                      "GeneratedTokens": np.round(rng.lognormal(4.9, 1.0, rows)).astype(np.int64) + 1})
    pcsv.write_csv(table, path, write_options=pcsv.WriteOptions(quoting_style="none"))


def _current_rss() -> int:
    """Resident memory now (bytes): /proc on Linux, else the peak so far (an upper bound)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(path: str) -> None:
    import pyarrow as pa

    from llmqueue.workload.traces import load_trace

    before = _current_rss()
    t0 = time.perf_counter()
    tr = load_trace(path)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"wall_s": wall, "rss_before": before, "rss_peak": peak,
                      "arrow_pool_peak": pa.default_memory_pool().max_memory(), "rows": len(tr),
                      "repairs": tr.repairs}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "AzureLLMInferenceTrace_bench.csv")
        t0 = time.perf_counter()
        make_csv(path, args.rows)
        gen_s = time.perf_counter() - t0
        size = os.path.getsize(path)
        runs = []
        for _ in range(args.repeat):
            p = subprocess.run([sys.executable, __file__, "--child", path], capture_output=True, text=True)
            if p.returncode != 0:
                print(p.stderr, file=sys.stderr)
                return 1
            runs.append(json.loads(p.stdout))
    walls = [r["wall_s"] for r in runs]
    grow = max(r["rss_peak"] - r["rss_before"] for r in runs)
    res = {"rows": args.rows, "file_bytes": size, "generate_s": gen_s, "load_wall_s_min": min(walls),
           "load_wall_s_median": statistics.median(walls), "load_wall_s_max": max(walls),
           "rss_growth_bytes": grow, "rss_growth_x_file": grow / size,
           "arrow_pool_peak_bytes": max(r["arrow_pool_peak"] for r in runs),
           "goal": "wall < 3 s and memory < 10x file size",
           "meets_goal": max(walls) < 3 and grow < 10 * size, "repairs": runs[0]["repairs"],
           "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        mb = 1 / 2**20
        print(f"file: {args.rows:,} rows, {size * mb:.1f} MiB (generated in {gen_s:.2f} s)")
        print(f"load_trace wall time: min {min(walls):.3f} s, median {statistics.median(walls):.3f} s, "
              f"max {max(walls):.3f} s over {args.repeat} fresh processes")
        print(f"peak RSS growth during load: {grow * mb:.1f} MiB = {grow / size:.2f}x the file "
              f"(pyarrow pool peak {res['arrow_pool_peak_bytes'] * mb:.1f} MiB)")
        print(f"goal (< 3 s, < 10x file size): {'met' if res['meets_goal'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
