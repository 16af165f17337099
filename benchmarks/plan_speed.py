"""Planner speed: ``llmqueue plan`` over a ~1,000-configuration space for the shipped chat scenario.

Space: 7 GPU types (l4, l40s, a100-40gb, a100-80gb, h100-sxm, h200, b200) x tensor-parallel
sizes 1, 2, 4 x replicas 1..8 x max_num_seqs 64, 128, 256 x max_num_batched_tokens 2048, 8192 x
the least-outstanding router = 1,008 configurations; the chat scenario's SLOs (p99 TTFT 2 s,
p99 TPOT 50 ms), its seed, and the planner's default duration (its warm-up plus 12,000 requests).
Reports the wall time (theory and simulation), the configurations pruned, simulated and not
needed, and the recommendation. The bar: 60 s on the project's 2-core machine. Nothing is cached
(a fresh temporary output directory).

With ``--pd``: the same 1,008 configurations with P:D splits in: replicas 1..6 (756 aggregated)
plus splits 1:1 and 1:2 (252 disaggregated, a 100 Gbit/s KV link).

Usage: python benchmarks/plan_speed.py [--backend serial|local|ray] [--workers N] [--pd] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

from llmqueue.plan.slo_judge import scenario_slos
from llmqueue.plan.planner import plan

GPUS = ("l4", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200")
SPACE = dict(gpus=GPUS, tp=(1, 2, 4), replicas=tuple(range(1, 9)), max_num_seqs=(64, 128, 256),
             max_num_batched_tokens=(2048, 8192), routers=("least-outstanding",))
PD_SPACE = dict(SPACE, replicas=tuple(range(1, 7)), pd_splits=((1, 1), (1, 2)))
BAR_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("serial", "local", "ray"), default="serial")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--pd", action="store_true", help="P:D splits 1:1 and 1:2 in the space (replicas 1..6)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    slos = scenario_slos("chat")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        res = plan("chat", slos=slos, **(PD_SPACE if a.pd else SPACE), backend=a.backend, workers=a.workers, out_dir=d)
    wall = time.perf_counter() - t0
    rec = res.recommended
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "backend": res.meta["backend"], "configurations": len(res.candidates), "pruned": res.count("pruned"),
           "simulated": res.count("simulated"), "not_needed": res.count("not needed"), "wall_s": wall,
           "theory_wall_s": res.meta["theory_wall_s"], "duration_s_per_simulation": res.meta["duration_s"],
           "bar_s": BAR_S, "meets_bar": wall <= BAR_S,
           "splits": sum(c.config.disaggregated for c in res.candidates),
           "splits_simulated": sum(c.config.disaggregated and c.status == "simulated" for c in res.candidates),
           "recommended": None if rec is None else rec.config.label(),
           "cost_per_hour": None if rec is None else rec.cost_per_hour,
           "p99_ttft_ms": None if rec is None else rec.result["p99_ttft_ms"],
           "p99_tpot_ms": None if rec is None else rec.result["p99_tpot_ms"]}
    from collections import Counter

    out["pruned_by"] = dict(Counter((c.reason or "").split(":")[0] for c in res.candidates if c.status == "pruned"))
    if a.json:
        print(json.dumps(out, indent=1))
        return
    for k, v in out.items():
        print(f"{k:28s} {v}")


if __name__ == "__main__":
    main()
