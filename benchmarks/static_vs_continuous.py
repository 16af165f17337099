"""Head-of-line blocking: static batching against continuous batching at equal p99.

Same heterogeneous workload (short prompts, heavy-tailed outputs), same concurrency (32), same
step-time model. For each scheduler, the highest Poisson arrival rate whose p99 end-to-end
latency stays under the SLO is found by bisection; the throughput there is reported.

Usage: python benchmarks/static_vs_continuous.py [--slo-s 30] [--requests 4000]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from llmqueue.engine import EngineConfig, simulate
from llmqueue.engine.baselines import static_batching
from llmqueue.workload import Workload

PROMPT = "uniform:10:500"
OUTPUT = "lognormal:mean=200:sd=300:max=2000"
STEP = "linear:c0=0.015:prefill=5e-6:decode=2e-4"
SLOTS = 32


def p99_and_throughput(kind: str, rate: float, n: int, seed: int = 1):
    reqs = Workload(f"poisson:{rate}", prompt=PROMPT, output=OUTPUT).generate(seed=seed, n=n)
    if kind == "static":
        r = static_batching(reqs, B=SLOTS, step_time=STEP)
    else:
        r = simulate(EngineConfig.from_capacity(10**7, max_num_seqs=SLOTS), STEP, reqs)
    req = r.requests
    e2e = req["finish_s"] - req["arrival_s"]
    span = np.nanmax(req["finish_s"]) - req["arrival_s"][0]
    return float(np.percentile(e2e[n // 10:], 99)), n / span


def capacity_at_slo(kind: str, slo_s: float, n: int) -> tuple[float, float, float]:
    lo, hi = 0.05, 40.0
    for _ in range(14):
        mid = (lo * hi) ** 0.5
        p99, _ = p99_and_throughput(kind, mid, n)
        lo, hi = (mid, hi) if p99 <= slo_s else (lo, mid)
    p99, thr = p99_and_throughput(kind, lo, n)
    return lo, thr, p99


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slo-s", type=float, default=30.0)
    ap.add_argument("--requests", type=int, default=4000)
    a = ap.parse_args()
    print(f"workload: prompt {PROMPT}, output {OUTPUT}; step {STEP}; {SLOTS} slots; p99 E2EL <= {a.slo_s} s")
    res = {}
    for kind in ("static", "continuous"):
        rate, thr, p99 = capacity_at_slo(kind, a.slo_s, a.requests)
        res[kind] = thr
        print(f"{kind:10s}: highest rate meeting the SLO {rate:.3f} req/s, throughput {thr:.3f} req/s, p99 {p99:.1f} s")
    print(f"continuous / static throughput at equal p99: {res['continuous'] / res['static']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
