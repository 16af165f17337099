"""Seed 004 (Nie, Si, Zhou, ICML 2026) Table 1 and Figure 2 in simulation.

For the paper's three P/D settings (M = 131,000 tokens, chunk 512, constant step time b):
theory mu = M / (b E[g]), the simulated saturated throughput (lam = 50 req/s), the paper's
measured vLLM throughput, and the simulated verdict at lam = 1, 3, 5, 20, 50.

Usage: python benchmarks/seed004_table.py [--duration 3600] [--seed 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from llmqueue.engine.config import EngineConfig
from llmqueue.engine.step_time import parse_step_time
from llmqueue.simulate import SimSpec, run_simulation
from llmqueue.workload import Workload

SETTINGS = [("1:1", "uniform:10:1600", "uniform:10:1600", 0.0372, 3.263, 3.387),
            ("2:1", "uniform:10:2133", "uniform:10:1066", 0.0430, 3.956, 3.650),
            ("1:2", "uniform:10:1066", "uniform:10:2133", 0.0337, 2.902, 2.969)]
RATES = (1, 3, 5, 20, 50)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--warmup", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for name, p, o, b, paper_theory, paper_measured in SETTINGS:
        row = {"setting": name, "b": b, "paper_mu_theory": paper_theory, "paper_mu_measured": paper_measured}
        for lam in RATES:
            spec = SimSpec(engine=EngineConfig.from_capacity(131000, max_num_batched_tokens=512),
                           step_time=parse_step_time(b), workload=Workload(f"poisson:{lam}", prompt=p, output=o),
                           duration_s=a.duration, seed=a.seed, warmup_s=a.warmup)
            out = run_simulation(spec)
            row["mu_theory"] = out.theory["mu_kv"]
            row[f"verdict_{lam}"] = out.summary["verdict"]
            if lam == 50:
                row["mu_sim"] = out.summary["request_throughput"]
        row["gap_sim_vs_theory"] = (row["mu_sim"] - row["mu_theory"]) / row["mu_theory"]
        row["gap_sim_vs_paper_measured"] = (row["mu_sim"] - paper_measured) / paper_measured
        rows.append(row)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| P/D | b (s) | mu theory (ours) | paper theory | simulated (lam=50) | sim vs theory | paper measured | sim vs measured |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['b']} | {r['mu_theory']:.3f} | {r['paper_mu_theory']:.3f} | {r['mu_sim']:.3f} | "
              f"{100 * r['gap_sim_vs_theory']:+.1f}% | {r['paper_mu_measured']:.3f} | {100 * r['gap_sim_vs_paper_measured']:+.1f}% |")
    print()
    print("| P/D | " + " | ".join(f"lam={x}" for x in RATES) + " |")
    print("|---|" + "---|" * len(RATES))
    for r in rows:
        print(f"| {r['setting']} | " + " | ".join(r[f"verdict_{x}"] for x in RATES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
