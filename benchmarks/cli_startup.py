"""Wall time of `llmqueue --help` and the theory commands (issue: "well under half a second").

Runs each command several times in a fresh process and reports min / median / max seconds.
Usage: python benchmarks/cli_startup.py [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [
    ["--help"],
    ["queue", "mmc", "--lam", "2", "--mu", "1", "--c", "3"],
    ["batch", "--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--sizes", "1,4,8,16,32"],
    ["stability", "--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512",
     "--prompt", "uniform:10:1600", "--output", "uniform:10:1600", "--rate", "3"],
    ["kv", "--model", "llama-2-7b", "--context", "4096"],
    ["cost", "tokens", "--tokens-per-s", "2500", "--price-per-hour", "2.5"],
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    exe = shutil.which("llmqueue")
    if exe is None:
        print("llmqueue is not installed on PATH (pip install -e .)", file=sys.stderr)
        return 2
    results = []
    for cmd in COMMANDS:
        times = []
        rc = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            p = subprocess.run([exe, *cmd], capture_output=True)
            times.append(time.perf_counter() - t0)
            rc = p.returncode
        results.append({"command": "llmqueue " + " ".join(cmd), "rc": rc, "min_s": min(times),
                        "median_s": statistics.median(times), "max_s": max(times)})
    baseline = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"])
        baseline.append(time.perf_counter() - t0)
    if args.json:
        print(json.dumps({"python_startup_median_s": statistics.median(baseline), "commands": results}, indent=2))
    else:
        print(f"bare python startup: median {statistics.median(baseline):.3f} s")
        for r in results:
            print(f"{r['median_s']:.3f} s median ({r['min_s']:.3f}-{r['max_s']:.3f}) rc={r['rc']}  {r['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
