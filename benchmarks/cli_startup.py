"""Wall time of `llmqueue --help` and the theory commands (issue: "well under half a second").

Runs each command several times in a fresh process and reports min / median / max seconds.
``--baseline-src OLD/src`` runs another checkout's package (its ``src``; built or not) the same
way beside this one, the two interleaved so that the machine's load falls on both alike; both
then start through ``llmqueue.cli.main`` as the console script does (``run``, else ``main``).
Usage: python benchmarks/cli_startup.py [--repeat 7] [--baseline-src OLD/src] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
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


#: the console script's entry, run from a source tree (older trees have only ``main``)
ENTRY = "import sys\nimport llmqueue.cli.main as m\nsys.argv[0] = 'llmqueue'\nsys.exit((getattr(m, 'run', None) or m.main)())"


def _starts(label: str, argv: list[str], env: dict | None) -> dict:
    return {"label": label, "argv": argv, "env": env, "times": [], "rc": None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--baseline-src", help="another checkout's src directory, run beside this one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    exe = shutil.which("llmqueue")
    if exe is None and args.baseline_src is None:
        print("llmqueue is not installed on PATH (pip install -e .)", file=sys.stderr)
        return 2
    results = []
    for cmd in COMMANDS:
        if args.baseline_src is None:
            runs = [_starts("this", [exe, *cmd], None)]
        else:
            here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
            runs = [_starts(label, [sys.executable, "-c", ENTRY, *cmd], {**os.environ, "PYTHONPATH": src})
                    for label, src in (("baseline", os.path.abspath(args.baseline_src)), ("this", os.path.abspath(here)))]
        for _ in range(args.repeat):
            for r in runs:  # interleaved
                t0 = time.perf_counter()
                p = subprocess.run(r["argv"], capture_output=True, env=r["env"])
                r["times"].append(time.perf_counter() - t0)
                r["rc"] = p.returncode
        for r in runs:
            t = r["times"]
            results.append({"command": "llmqueue " + " ".join(cmd), "build": r["label"], "rc": r["rc"],
                            "min_s": min(t), "median_s": statistics.median(t), "max_s": max(t)})
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
            print(f"{r['median_s']:.3f} s median ({r['min_s']:.3f}-{r['max_s']:.3f}) rc={r['rc']} {r['build']:>8}  "
                  f"{r['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
