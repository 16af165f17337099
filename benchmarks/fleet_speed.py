"""Fleet simulator speed: simulated requests per wall second against the number of replicas.

Each case is N replicas of Llama-3.1-8B behind a router, Azure-conversation-like lengths (the
lognormal fits of the shipped ``chat`` scenario: prompt mean ~1260, output mean ~190 tokens),
a linear step-time model (``linear:c0=0.02:prefill=1e-6:decode=4e-5``: composition-dependent
step times, so no vectorized epochs apply), Poisson arrivals at 0.8 x N x the replica's
capacity mu (from the theory: the KV bound M / (b E[g]) or the slot bound, whichever binds),
records and a 1 s time series kept. Cases:

- ``h100``: on H100-SXM (M = 456,496 tokens, max_num_seqs 1024, mu = 57.3 req/s): large
  batches, ~0.7 engine steps per request. ``--duration`` simulated seconds (one hour of 64
  replicas is 10.6 million requests, above the 3-million stream limit: the default is 600 s, cut
  to 2.5 million requests where more replicas would bring more).
- ``l4``: on L4 (M = 35,120 tokens, mu = 4.41 req/s): small, KV-bound batches, many more steps
  per request; 64 replicas for one hour is 0.81 million requests.

Each case runs in its own process; the table gives wall seconds, requests per wall second,
engine steps per request and the share of requests completed.

``--baseline-src OLD/src`` runs every case on another source tree too (e.g. a ``git worktree`` of
the commit before a change, built), alternating new and old ``--repeat`` times, and gives the
ratio of the medians: a speed comparison measured side by side in one run.

Usage: python benchmarks/fleet_speed.py [--replicas 1,8,64] [--routers least-outstanding,random] [--max-requests 2.5e6]
                                        [--gpus h100,l4] [--duration 600] [--baseline-src OLD/src --repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

PROMPT = "lognormal:mu=6.95:sigma=0.62:max=14050"
OUTPUT = "lognormal:mu=5.02:sigma=0.68:max=1000"
LINEAR = "linear:c0=0.02:prefill=1e-6:decode=4e-5"
GPUS = {"h100": "h100-sxm", "l4": "l4"}


def run_case(gpu: str, n: int, router: str, duration: float, max_requests: float = 2.5e6) -> dict:
    import numpy as np

    import llmqueue.workload.generate as gen

    from llmqueue.cluster import simulate_fleet
    from llmqueue.engine import EngineConfig
    from llmqueue.engine.options import SimOptions
    from llmqueue.hardware import kv_capacity
    from llmqueue.theory.kv import kv_stability
    from llmqueue.workload import Workload, parse_length

    M = kv_capacity("llama-3.1-8b", GPUS[gpu]).M
    cfg = EngineConfig.from_capacity(M, max_num_batched_tokens=8192, max_num_seqs=1024)
    p, o = parse_length(PROMPT), parse_length(OUTPUT)
    mu = min(kv_stability(M=M, b=0.03, chunk=8192, prompt=p, output=o).mu, 1024 / (0.03 * o.mean()))
    rate = 0.8 * mu * n
    if max_requests > gen.MAX_STREAM_REQUESTS:  # the benchmark's own choice: lift the user-facing memory guard
        gen.MAX_STREAM_REQUESTS = int(1.2 * max_requests)
    duration = min(duration, max_requests / rate)  # a stream holds at most 3 million requests by default
    reqs = Workload(f"poisson:{rate}", prompt=p, output=o).generate(seed=1, duration=duration)
    # a tiny run first: the modules the fleet imports lazily are loaded before the clock starts
    warm = type(reqs)(reqs.request_id[:20], reqs.arrival_s[:20], reqs.prompt_tokens[:20], reqs.output_tokens[:20])
    simulate_fleet(cfg, LINEAR, warm, replicas=n, router=router, seed=1, options=SimOptions(horizon_s=duration))
    t = time.perf_counter()
    r = simulate_fleet(cfg, LINEAR, reqs, replicas=n, router=router, seed=1,
                       options=SimOptions(horizon_s=duration, sample_dt=1.0))
    wall = time.perf_counter() - t
    k = len(reqs.arrival_s)
    return {"gpu": gpu, "replicas": n, "router": router, "duration_s": duration, "requests": k,
            "mu_per_replica": round(mu, 2), "wall_s": round(wall, 2), "requests_per_s": round(k / wall),
            "steps_per_request": round(r.num_steps / k, 2),
            "completed_share": round(float(np.mean(r.requests["status"] == "ok")), 4), "engine": _engine()}


def _engine() -> str:
    from llmqueue.compiled import status

    return status()


def _spawn(case: str, pure: bool = False, src: str | None = None) -> dict | None:
    """One case in a fresh process (``src``: the source tree it imports llmqueue from)."""
    env = {k: v for k, v in os.environ.items() if k != "LLMQUEUE_PURE_PYTHON"}
    if pure:
        env["LLMQUEUE_PURE_PYTHON"] = "1"
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    env["PYTHONPATH"] = os.path.abspath(src or here)
    out = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True, env=env)
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return None
    return json.loads(out.stdout)


def _side_by_side(case: str, baseline_src: str, repeat: int) -> dict | None:
    """The case on this tree and on ``baseline_src``, alternating ``repeat`` times: the medians."""
    import statistics

    new, old = [], []
    for _ in range(max(1, repeat)):
        for runs, src in ((new, None), (old, baseline_src)):
            r = _spawn(case, src=src)
            if r is None:
                return None
            runs.append(r)
    n_rate = statistics.median(r["requests_per_s"] for r in new)
    o_rate = statistics.median(r["requests_per_s"] for r in old)
    return {"new": new[0], "old": old[0], "new_requests_per_s": round(n_rate), "old_requests_per_s": round(o_rate),
            "ratio": n_rate / o_rate, "new_runs": [r["requests_per_s"] for r in new],
            "old_runs": [r["requests_per_s"] for r in old]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="1,8,64")
    ap.add_argument("--routers", default="least-outstanding,random")
    ap.add_argument("--gpus", default="h100,l4")
    ap.add_argument("--duration", type=float, default=600.0, help="simulated seconds of the h100 cases")
    ap.add_argument("--l4-duration", type=float, default=3600.0, help="simulated seconds of the l4 cases")
    ap.add_argument("--max-requests", type=float, default=2.5e6,
                    help="cut a case's duration to this many requests (above 3 million the user-facing stream "
                         "limit is lifted for the benchmark: records take ~500 bytes a request)")
    ap.add_argument("--source-too", action="store_true",
                    help="run each case from source as well (LLMQUEUE_PURE_PYTHON=1): the compiled build's gain")
    ap.add_argument("--baseline-src", help="src/ of the code to compare against (a built worktree of the old commit)")
    ap.add_argument("--repeat", type=int, default=1, help="with --baseline-src: runs of each, alternating")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case:
        gpu, n, router, d, m = a.case.split(",")
        print(json.dumps(run_case(gpu, int(n), router, float(d), float(m))))
        return 0
    rows = []
    for gpu in a.gpus.split(","):
        for router in a.routers.split(","):
            for n in a.replicas.split(","):
                d = a.duration if gpu == "h100" else a.l4_duration
                case = f"{gpu},{n},{router},{d},{a.max_requests}"
                if a.baseline_src:
                    row = _side_by_side(case, a.baseline_src, a.repeat)
                    if row is None:
                        return 1
                    rows.append(row)
                    if not a.json:
                        r = row["new"]
                        print(f"{r['gpu']:5} {r['router']:18} N={r['replicas']:3}  {r['requests']:>9,} req  new "
                              f"{row['new_requests_per_s']:>7,} req/s  old {row['old_requests_per_s']:>7,} req/s  "
                              f"new/old {row['ratio']:.3f}  (runs: {row['new_runs']} / {row['old_runs']})", flush=True)
                    continue
                for pure in ((False, True) if a.source_too else (False,)):
                    r = _spawn(case, pure=pure)
                    if r is None:
                        return 1
                    rows.append(r)
                    if not a.json:
                        print(f"{r['gpu']:5} {r['router']:18} N={r['replicas']:3}  {r['requests']:>9,} req  "
                              f"{r['wall_s']:7.1f} s  {r['requests_per_s']:>7,} req/s  "
                              f"{r['steps_per_request']:5.2f} steps/req  ok {r['completed_share']:.3f}  [{r['engine']}]",
                              flush=True)
    if a.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
