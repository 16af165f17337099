"""Fleet records before and after a change, on the same seeds.

Runs the fleet cases of ``tests/_fleet_cases.py`` (every router on a KV-bound pool with noisy
steps, lanes with a batch window and the gateway's rate limits, depth and age bounds, tier shedding
and fallback, P/D over a KV link, an autoscaler with a fault, client timeouts and retries) on
several request seeds, with this checkout's code and with another source tree's
(``--baseline-src``, e.g. a built ``git worktree`` of the commit before the change), each in its own
process, and reports which runs' request, step or pool records differ and in which columns.

Usage: python benchmarks/fleet_records_diff.py --baseline-src ../base/src [--seeds 11:14]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fingerprints(seeds: list[int]) -> dict:
    """Per case and seed, a hash of every record column (this process's llmqueue)."""
    import numpy as np

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from _fleet_cases import CASES, mixed

    from llmqueue.cluster import simulate_fleet

    out: dict = {}
    for name, (make, opts) in CASES.items():
        for seed in seeds:
            r = simulate_fleet(make(), mixed(seed), options=opts)
            cols = {}
            for part, table in (("requests", r.requests), ("steps", r.steps), ("pools", r.pools or {})):
                for c, v in table.items():
                    a = np.asarray(v)
                    cols[f"{part}.{c}"] = hashlib.sha256(a.astype(str).tobytes() if a.dtype == object
                                                         else a.tobytes()).hexdigest()[:16]
            out[f"{name}/{seed}"] = cols
    return out


def spawn(src: str, seeds: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--seeds", seeds], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def seed_list(spec: str) -> list[int]:
    if ":" in spec:
        a, b = spec.split(":")
        return list(range(int(a), int(b)))
    return [int(x) for x in spec.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-src", help="the src/ folder of the code to compare against")
    ap.add_argument("--seeds", default="11:14", help="request seeds, A:B or a list (default 11:14)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(fingerprints(seed_list(a.seeds))))
        return 0
    if not a.baseline_src:
        ap.error("--baseline-src is required")
    new = spawn(os.path.join(HERE, "..", "src"), a.seeds)
    old = spawn(a.baseline_src, a.seeds)
    differ = {run: sorted(c for c in new[run] if old.get(run, {}).get(c) != new[run][c]) for run in new}
    differ = {run: cols for run, cols in differ.items() if cols}
    for run, cols in differ.items():
        print(f"{run}: differs in {', '.join(cols)}")
    print(f"{len(new)} fleet runs, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
