"""Records before and after an engine change, on the same seeds.

Runs the equivalence tests' randomized scenarios (chunked and unchunked prefill, tiny KV caches,
every policy, noisy, drifting and linear step times, timeouts, retries, admission limits) plus
seed 004's 1:1 setting at 0.9x and 3x of capacity (10 minutes each) with this checkout's engine
and with another source tree's (``--baseline-src``, e.g. a ``git worktree`` of the commit before
the change), and reports which runs' request records differ and how.

Usage: python benchmarks/engine_records_diff.py --baseline-src ../base/src [--seeds 0:300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = r'''
import sys, numpy as np
sys.path.insert(0, sys.argv[3])
try:
    from llmqueue.engine.options import SimOptions
except ImportError:  # an engine from before engine/options.py
    import llmqueue.engine.base as base
    sys.modules["llmqueue.engine.options"] = base
    SimOptions = base.SimOptions
from test_engine_equivalence import _scenario
from llmqueue.engine import EngineConfig, simulate
from llmqueue.workload import Workload
lo, hi = map(int, sys.argv[1].split(":"))
out = {}
def keep(name, r):
    for c in ("request_id", "attempt", "status", "preemptions", "output_tokens", "first_scheduled_s", "first_token_s",
              "finish_s"):
        out[f"{name}/{c}"] = np.asarray(r.requests[c]).astype(str if c == "status" else None)
    out[f"{name}/num_steps"] = np.asarray([r.num_steps])
for seed in range(lo, hi):
    cfg, step, reqs, opts = _scenario(seed)
    keep(f"s{seed}", simulate(cfg, step, reqs, options=opts))
for f in (0.9, 3.0):
    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=512)
    reqs = Workload(f"poisson:{f * 3.263}", prompt="uniform:10:1600", output="uniform:10:1600").generate(seed=1, duration=600)
    keep(f"seed004x{f}", simulate(cfg, 0.0372, reqs, options=SimOptions(horizon_s=600)))
np.savez(sys.argv[2], **out)
'''


def run(src: str, seeds: str, path: str) -> None:
    env = {**os.environ, "PYTHONPATH": src}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(RUNNER)
    subprocess.run([sys.executable, f.name, seeds, path, os.path.join(HERE, "..", "tests")], env=env, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--baseline-src", required=True, help="the src/ folder of the engine to compare against")
    ap.add_argument("--seeds", default="0:300")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    run(os.path.abspath(args.baseline_src), args.seeds, os.path.join(tmp, "old.npz"))
    run(os.path.join(HERE, "..", "src"), args.seeds, os.path.join(tmp, "new.npz"))
    old, new = np.load(os.path.join(tmp, "old.npz")), np.load(os.path.join(tmp, "new.npz"))
    runs = sorted({k.split("/")[0] for k in old.files})
    differ = []
    for name in runs:
        bad = []
        for c in ("request_id", "attempt", "status", "preemptions", "output_tokens", "num_steps",
                  "first_scheduled_s", "first_token_s", "finish_s"):
            a, b = old[f"{name}/{c}"], new[f"{name}/{c}"]
            if a.shape != b.shape:
                bad.append(f"{c}: {a.shape} vs {b.shape} rows")
            elif a.dtype.kind == "f":
                if not np.allclose(a, b, rtol=1e-9, atol=1e-7, equal_nan=True):
                    bad.append(f"{c}: {int((~np.isclose(a, b, rtol=1e-9, atol=1e-7, equal_nan=True)).sum())} rows")
            elif not (a == b).all():
                bad.append(f"{c}: {int((a != b).sum())} rows")
        if bad:
            differ.append((name, bad))
    print(f"{len(runs)} runs, {len(differ)} differ")
    for name, bad in differ:
        print(f"  {name}: " + "; ".join(bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
