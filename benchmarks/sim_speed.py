"""Simulator speed: one million requests, Azure-conversation-like lengths, utilization ~0.8.

Reports simulated requests per wall-clock second for the fast replica, and the fast path
against the plain reference stepper on the same prefix of the stream (same run, same machine).

Usage: python benchmarks/sim_speed.py [--requests 1000000] [--ref-requests 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from llmqueue.engine import EngineConfig, simulate
from llmqueue.hardware import kv_capacity
from llmqueue.theory.kv import kv_stability
from llmqueue.workload import Workload, parse_length

# Azure LLM inference trace 2023, conversation: prompt mean 1155 / p50 1020 / p99 4142, output mean
# 211 / p50 129 / p99 601 (../shared/traces/README.md); lognormal fits from the shipped `chat` scenario.
PROMPT = "lognormal:mu=6.95:sigma=0.62:max=14050"
OUTPUT = "lognormal:mu=5.02:sigma=0.68:max=1000"
STEP_S = 0.03            # a representative decode step of an 8B model on an H100 (assumption)
UTILIZATION = 0.8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--ref-requests", type=int, default=20_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    M = kv_capacity("llama-3.1-8b", "h100-sxm").M
    cfg = EngineConfig.from_capacity(M, max_num_batched_tokens=8192, max_num_seqs=1024)
    p, o = parse_length(PROMPT), parse_length(OUTPUT)
    mu_kv = kv_stability(M=M, b=STEP_S, chunk=8192, prompt=p, output=o).mu
    steps_per_req = o.mean()  # ~1 prefill step + (o - 1) decode steps
    mu_seqs = cfg.max_num_seqs / (STEP_S * steps_per_req)
    mu = min(mu_kv, mu_seqs)
    lam = UTILIZATION * mu
    out = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "python": platform.python_version(),
           "M_tokens": M, "step_s": STEP_S, "mu_kv": mu_kv, "mu_seqs": mu_seqs, "lam": lam, "rho": lam / mu}
    t = time.perf_counter()
    reqs = Workload(f"poisson:{lam}", prompt=p, output=o).generate(seed=1, n=args.requests)
    out["generate_s"] = time.perf_counter() - t
    r = simulate(cfg, STEP_S, reqs)
    out.update(requests=args.requests, fast_wall_s=r.wall_s, fast_req_per_s=args.requests / r.wall_s,
               steps=r.num_steps, epoch_steps=r.epoch_steps,
               ok=int((r.requests["status"] == "ok").sum()))
    # the same prefix on both steppers
    head = Workload(f"poisson:{lam}", prompt=p, output=o).generate(seed=1, n=args.ref_requests)
    f = simulate(cfg, STEP_S, head)
    ref = simulate(cfg, STEP_S, head, reference=True)
    out.update(ref_requests=args.ref_requests, prefix_fast_wall_s=f.wall_s, prefix_ref_wall_s=ref.wall_s,
               fast_over_reference=ref.wall_s / f.wall_s)
    # a composition-dependent step time (no vectorized epochs; decode stretches only)
    lin = "linear:c0=0.02:prefill=1e-6:decode=4e-5"
    g = simulate(cfg, lin, head)
    gref = simulate(cfg, lin, head, reference=True)
    out.update(linear_fast_req_per_s=args.ref_requests / g.wall_s, linear_fast_over_reference=gref.wall_s / g.wall_s)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:28s} {v:,.4g}" if isinstance(v, float) else f"{k:28s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
