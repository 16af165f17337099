"""A host KV tier against recomputation on Nie et al.'s 1:1 setting past its cliff (issue 39).

The setting: M = 131,000 KV tokens, chunk 512, prompts and outputs U(10, 1600), Poisson arrivals at
``--factor`` (1.5) x the recompute engine's sustained throughput, one hour simulated, the first
600 s left out. The paper's constant step (b = 0.0372 s) prices no prefill, so recomputation
costs no time there; the tier is judged with a composition-dependent step instead (``--step``,
default a linear model with 50 us a prefill token: Llama-3.1-8B's 16 GFLOP a token on an A100's
312 TFLOP/s) and Llama-3.1-8B's KV (131,072 B a token, bf16). For each host-tier bandwidth the
sustained throughput against the recompute engine's; then the crossover bandwidth found by
bisection on the simulated throughput, against the closed form
:func:`llmqueue.theory.kv_tiers.offload_parity`: the first order ``BW* = B / p`` and the second,
``B / p x (1 + n / (2 (C - n)))`` with ``n`` the thrashing decode batch of the stream's own length
moments. ``--json`` prints the figures.

``--chunk`` changes the token budget (the paper's 512): the budget throttles a recomputed request's
rebuild, not a loaded one, and the two engines' preemption rates part below about 2,048.

Usage: python benchmarks/kv_offload.py [--factor 1.5] [--step linear:c0=0.015:prefill=5e-5:decode=2e-5:ctx=1e-8]
       [--chunk 512]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np

BYTES = 131072.0   # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
HORIZON, WARMUP = 3600.0, 600.0


def throughput(cfg, step, reqs) -> tuple[float, int, dict | None]:
    """Completions per second over [WARMUP, HORIZON], preemptions, the tier's account."""
    from llmqueue.engine import simulate
    from llmqueue.engine.options import SimOptions

    r = simulate(cfg, step, reqs, options=SimOptions(seed=1, sample_dt=0.0, horizon_s=HORIZON))
    q = r.requests
    fin = np.asarray(q["finish_s"])
    ok = (np.asarray(q["status"]) == "ok") & (fin > WARMUP) & (fin <= HORIZON)
    return float(ok.sum() / (HORIZON - WARMUP)), int(np.sum(q["preemptions"])), r.kv_tier


def main(argv=None) -> int:
    from llmqueue.engine import EngineConfig
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.theory.kv_tiers import offload_parity, thrashing_decode_batch
    from llmqueue.workload import Workload

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--step", default="linear:c0=0.015:prefill=5e-5:decode=2e-5:ctx=1e-8")
    ap.add_argument("--gbps", default="0.5,1,2,2.62,4,8,25,64")
    ap.add_argument("--prompt", default="uniform:10:1600")
    ap.add_argument("--output", default="uniform:10:1600")
    ap.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens (the paper's 512)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    cfg = EngineConfig.from_capacity(131000, max_num_batched_tokens=a.chunk)
    model = parse_step_time(a.step)
    p = float(model.c_prefill) if model.roofline is None and not model.is_constant else None
    if not p:
        raise SystemExit("--step: give a linear model (its prefill term prices recomputation)")

    def stream(lam):
        return Workload(f"poisson:{lam}", prompt=a.prompt, output=a.output).generate(
            seed=1, duration=HORIZON)

    # the recompute engine's sustained throughput, saturated (3 x the KV capacity's rate)
    mu_r, _, _ = throughput(cfg, a.step, stream(3 * 3.263))
    lam = a.factor * mu_r
    reqs = stream(lam)
    base, pre_r, _ = throughput(cfg, a.step, reqs)
    done = base * (HORIZON - WARMUP)
    rows = []

    def tier(gbps):
        c = dataclasses.replace(cfg, kv_offload_tokens=10**8, kv_offload_s_per_token=BYTES / (gbps * 1e9))
        return throughput(c, a.step, reqs)

    for g in [float(x) for x in a.gbps.split(",")]:
        thr, pre, acc = tier(g)
        rows.append({"gbps": g, "s_per_token": BYTES / (g * 1e9), "throughput": thr, "vs_recompute": thr / base - 1,
                     "preemptions": pre, "restores": acc["restores"]})
    lo, hi = 0.1, 1000.0   # log-bisection on the bandwidth: below the crossover the tier loses
    for _ in range(14):
        mid = (lo * hi) ** 0.5
        if tier(mid)[0] > base:
            hi = mid
        else:
            lo = mid
    cross = (lo * hi) ** 0.5
    P, O = np.asarray(reqs.prompt_tokens, dtype=float), np.asarray(reqs.output_tokens, dtype=float)
    n_dec = thrashing_decode_batch(cfg.capacity_tokens, P.mean(), O.mean(), (O ** 2).mean())
    parity = offload_parity(prefill_s_per_token=p, bytes_per_token=BYTES, max_num_batched_tokens=a.chunk,
                            decode_batch=n_dec)
    out = {"step": a.step, "factor": a.factor, "chunk": a.chunk, "mu_recompute": mu_r, "lam": lam, "recompute_throughput": base,
           "recompute_preemptions_per_completion": pre_r / max(done, 1), "rows": rows, "crossover_gbps": cross,
           "parity_gbps": parity["gbps"], "parity_error": parity["gbps"] / cross - 1, "decode_batch": n_dec,
           "second_order_gbps": parity["second_order_gbps"], "second_order_error": parity["second_order_gbps"] / cross - 1}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"chunk {a.chunk}; recompute engine: {mu_r:.4g} req/s saturated; at {lam:.4g} req/s ({a.factor:g}x) {base:.4g} req/s")
    print("| host tier GB/s | load us/token | throughput | vs recompute | preemptions |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gbps']:g} | {1e6 * r['s_per_token']:.3g} | {r['throughput']:.4g} | {r['vs_recompute']:+.1%} "
              f"| {r['preemptions']} |")
    print(f"crossover (simulated): {cross:.3g} GB/s; closed form, first order B/p: {parity['gbps']:.3g} GB/s "
          f"({out['parity_error']:+.1%}); second order B/p (1 + n/(2(C-n))), n = {n_dec:.1f}: "
          f"{parity['second_order_gbps']:.3g} GB/s ({out['second_order_error']:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
