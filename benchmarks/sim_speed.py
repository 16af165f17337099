"""Simulator speed and memory, this checkout's engine beside another (the old one), in one run.

Cases (each in its own process, so that peak memory is its own):

- ``azure-const``: 1,000,000 Azure-conversation-like requests (the lognormal fits of the shipped
  ``chat`` scenario: prompt mean ~1260, output mean ~190) on Llama-3.1-8B / H100 (M = 456,496
  tokens, max_num_seqs 1024, token budget 8192), Poisson at 0.8 x capacity, constant step 0.03 s:
  simulated requests per wall second.
- ``azure-linear``: the same stream, a composition-dependent step (``linear:c0=0.02:prefill=1e-6:
  decode=4e-5``): no vectorized epochs apply.
- ``seed004-0.9`` / ``seed004-3``: seed 004's 1:1 setting (M = 131,000, chunk 512, b = 0.0372,
  U(10,1600) prompts and outputs) for one hour at 0.9 and 3 times its KV capacity mu = 3.263
  req/s: simulated engine steps per wall second (the KV-bound, preemption-heavy setting).
- ``seed004-3-linear``: the 3x run with a linear step time (the slowest realistic case).

Each case reports wall seconds, the rate, peak RSS, the RSS growth over the run per simulated
request (the records are the output: about 150 bytes a request) and per request in the system
(the growth divided by the most requests waiting or running at once: meaningful where the queue
grows, as at 3x).

Each row says which build ran (``compiled`` by mypyc, or ``source``: ``llmqueue/compiled.py``);
``--source-too`` runs this checkout from source as well (``LLMQUEUE_PURE_PYTHON=1``).

Usage: python benchmarks/sim_speed.py [--baseline-src OLD/src] [--source-too] [--cases a,b] [--requests 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

CASES = ("azure-const", "azure-linear", "seed004-0.9", "seed004-3", "seed004-3-linear")
PROMPT = "lognormal:mu=6.95:sigma=0.62:max=14050"
OUTPUT = "lognormal:mu=5.02:sigma=0.68:max=1000"
LINEAR = "linear:c0=0.02:prefill=1e-6:decode=4e-5"


def _workload(case: str, n: int):
    from llmqueue.engine import EngineConfig
    from llmqueue.workload import Workload

    if case.startswith("azure"):
        from llmqueue.hardware import kv_capacity
        from llmqueue.theory.kv import kv_stability
        from llmqueue.workload import parse_length

        M = kv_capacity("llama-3.1-8b", "h100-sxm").M
        cfg = EngineConfig.from_capacity(M, max_num_batched_tokens=8192, max_num_seqs=1024)
        p, o = parse_length(PROMPT), parse_length(OUTPUT)
        mu = min(kv_stability(M=M, b=0.03, chunk=8192, prompt=p, output=o).mu, 1024 / (0.03 * o.mean()))
        reqs = Workload(f"poisson:{0.8 * mu}", prompt=p, output=o).generate(seed=1, n=n)
        return cfg, (LINEAR if case.endswith("linear") else 0.03), reqs, None
    f = float(case.split("-")[1])
    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=512)
    reqs = Workload(f"poisson:{f * 3.263}", prompt="uniform:10:1600", output="uniform:10:1600").generate(
        seed=1, duration=3600)
    return cfg, (LINEAR if case.endswith("linear") else 0.0372), reqs, 3600.0


def run_case(case: str, n: int) -> dict:
    """One case in this process: the engine importable here (PYTHONPATH decides which)."""
    import numpy as np

    from llmqueue.engine import simulate

    try:
        from llmqueue.engine.options import SimOptions
    except ImportError:  # the engine before engine/options.py
        from llmqueue.engine.base import SimOptions
    cfg, step, reqs, horizon = _workload(case, n)
    # a tiny run first: every module the engine imports lazily is loaded before the clock starts
    # (with PYTHONDONTWRITEBYTECODE set, an import compiles its source each time: milliseconds that
    # would land on the short cases)
    warm = type(reqs)(reqs.request_id[:20], reqs.arrival_s[:20], reqs.prompt_tokens[:20], reqs.output_tokens[:20])
    simulate(cfg, step, warm, options=SimOptions(horizon_s=horizon, sample_dt=1.0))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    r = simulate(cfg, step, reqs, options=SimOptions(horizon_s=horizon, sample_dt=1.0))
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ts = r.timeseries
    in_system = int((np.asarray(ts["num_waiting"]) + np.asarray(ts["num_running"])).max()) if len(ts["t_s"]) else 0
    ok = int((r.requests["status"] == "ok").sum())
    return {"case": case, "requests": len(reqs), "ok": ok, "wall_s": wall, "steps": int(r.num_steps),
            "requests_per_s": len(reqs) / wall, "steps_per_s": r.num_steps / wall,
            "peak_rss_mb": rss / 1024, "rss_growth_mb": (rss - rss0) / 1024, "max_in_system": in_system,
            "bytes_per_request": (rss - rss0) * 1024 / len(reqs),
            "kb_per_request_in_system": (rss - rss0) / max(in_system, 1), "engine": engine_status()}


def engine_status() -> str:
    """The build the running engine comes from: ``compiled``, ``source: <why>``, or ``old`` (no compiled.py)."""
    try:
        from llmqueue.compiled import status
    except ImportError:
        return "old (before the compiled build)"
    return status()


def spawn(case: str, n: int, src: str | None, pure: bool = False) -> dict:
    env = dict(os.environ)
    env.pop("LLMQUEUE_PURE_PYTHON", None)
    if pure:
        env["LLMQUEUE_PURE_PYTHON"] = "1"
    if src:
        env["PYTHONPATH"] = src
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", case, "--requests", str(n)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--baseline-src", help="src/ of the engine to compare against (e.g. a worktree of main)")
    ap.add_argument("--source-too", action="store_true",
                    help="also run this checkout from source (LLMQUEUE_PURE_PYTHON=1): the compiled build's gain")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests of the azure cases")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.requests)))
        return 0
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    rows = []
    for case in args.cases.split(","):
        new = spawn(case, args.requests, here)
        row = {"case": case, "new": new}
        if args.source_too:
            row["source"] = spawn(case, args.requests, here, pure=True)
        if args.baseline_src:
            row["old"] = spawn(case, args.requests, os.path.abspath(args.baseline_src))
        rows.append(row)
        if not args.json:
            unit = "requests_per_s" if case.startswith("azure") else "steps_per_s"
            line = (f"{case:18s} {new[unit]:>10,.0f} {unit.split('_')[0]}/s  wall {new['wall_s']:6.2f} s  "
                    f"peak {new['peak_rss_mb']:5.0f} MB, +{new['bytes_per_request']:4.0f} B/request, "
                    f"{new['kb_per_request_in_system']:7.2f} kB per request in the system (max {new['max_in_system']:,})"
                    f"  [{new['engine']}]")
            if "source" in row:
                src_row = row["source"]
                line += f"  | source {src_row[unit]:>10,.0f} (compiled {new[unit] / src_row[unit]:.2f}x)"
            if "old" in row:
                old = row["old"]
                line += f"  | old {old[unit]:>10,.0f} ({new[unit] / old[unit]:.2f}x)  peak {old['peak_rss_mb']:6.0f} MB"
            print(line, flush=True)
    if args.json:
        print(json.dumps({"machine": f"{platform.machine()} {platform.processor()}".strip(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
