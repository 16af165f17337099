"""Fleet routing on Mooncake's conversation trace: does prefix affinity pay on a loaded fleet?

Replays Mooncake's conversation trace (``hash_ids``: 512-token prefix units; a conversation's later
turns repeat its earlier turns' units) on a fleet of ``--replicas`` replicas of one engine
(``--model`` on ``--gpu``: vLLM's KV capacity arithmetic and the roofline step time; prefix
caching on) behind each router, and compares:

- the prefix-cache hit rate: cached prompt tokens / prompt tokens (the records' token counts);
- TTFT p50 and p99 (completed requests), and the p50 of first turns and of later turns apart
  (a later turn: its first two prefix ids, the shared system unit and the conversation's first
  unit, came earlier in the trace);
- the mean outstanding imbalance: the time average of ``max_i N_i - mean_i N_i``, ``N_i`` the
  requests replica ``i`` holds (0: perfectly balanced), from the records (routed at arrival,
  gone at finish), with the mean ``N_i`` beside it;
- the load: ``rho = lam / (replicas * mu)``, ``mu`` one replica's saturation throughput on this
  trace (its first 1,500 requests all present at 0, prefix caching on: requests over the makespan);
- busy: the share of the run's span each replica spent in steps (mean over replicas; near 1 on any
  loaded LLM replica, since one decoding request keeps it stepping).

The trace's arrival times are multiplied by ``--time-scale`` (below 1 compresses the hour of
traffic: higher load, and less time between a conversation's turns); ``--n`` takes the first
requests only. The trace is read with the project's own reader (``load_trace``) from the path
given; it is never copied.

Routers: the project's by name (``least-prefill``: join the least prefill backlog, prefix
affinity's load signal without the affinity), and two local to this benchmark:
``prefix-affinity-hash`` (``PrefixAffinity(new_keys="hash")``: stateless consistent hashing, bound
on the prefill backlog) and ``prefix-affinity-requests`` (``load="requests", new_keys="hash"``:
consistent hashing with the bound on the request count, the router before the prefill backlog).

Usage: python benchmarks/fleet_prefix_affinity.py --trace ../shared/traces/mooncake_fast25/conversation_trace.jsonl
       [--replicas 8] [--model qwen2.5-7b] [--gpu h100-sxm] [--time-scale 0.25] [--n 0]
       [--routers round-robin,least-outstanding,least-prefill,prefix-affinity,session]
       [--bound 1.25] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

ROUTERS = ("round-robin", "least-outstanding", "least-prefill", "prefix-affinity", "session")
EXTRA = ("prefix-affinity-hash", "prefix-affinity-requests")  # by --routers only


def load(path: str, *, n: int, time_scale: float):
    """The trace's first ``n`` requests (all with 0) as request columns, times scaled, and their hash ids."""
    from llmqueue.workload.generate import RequestArrays
    from llmqueue.workload.traces import load_trace

    tr = load_trace(path)
    m = len(tr) if n <= 0 else min(n, len(tr))
    t = np.asarray(tr.arrival_s[:m], dtype=np.float64) * time_scale
    reqs = RequestArrays(np.arange(m), t, tr.prompt_tokens[:m], tr.output_tokens[:m])
    if tr.hash_ids is None:
        raise SystemExit(f"{path}: the trace has no hash_ids (prefix ids); this benchmark needs them")
    return reqs, list(tr.hash_ids[:m])


def imbalance(q, replicas: int, dt: float = 1.0) -> tuple[float, float]:
    """Time averages of ``max_i N_i - mean_i N_i`` and of ``mean_i N_i`` on a grid of ``dt``."""
    a, f, rep = q["arrival_s"], q["finish_s"], q["replica"]
    end = float(np.nanmax(f))
    grid = np.arange(0.0, end, dt)
    n = np.zeros((replicas, grid.size))
    for i in range(replicas):
        mine = rep == i
        fi = f[mine]
        n[i] = np.searchsorted(np.sort(a[mine]), grid, side="right") - np.searchsorted(
            np.sort(np.where(np.isnan(fi), np.inf, fi)), grid, side="right")
    mean = n.mean(axis=0)
    return float((n.max(axis=0) - mean).mean()), float(mean.mean())


def saturation_rate(spec, reqs, hashes, m: int = 1500, seed: int = 1) -> float:
    """One replica's saturation throughput (req/s) on this trace: its first ``m`` requests all
    present at 0 (prefix caching on), served to the end; ``m`` over the makespan."""
    from llmqueue.engine import simulate
    from llmqueue.engine.options import SimOptions
    from llmqueue.workload.generate import RequestArrays

    m = min(m, len(reqs))
    sub = RequestArrays(np.arange(m), np.zeros(m), reqs.prompt_tokens[:m], reqs.output_tokens[:m])
    q = simulate(spec.engine, spec.step_time, sub, options=SimOptions(seed=seed, hash_ids=hashes[:m],
                                                                        hash_block_tokens=512)).requests
    return m / float(np.nanmax(q["finish_s"]))


def later_turns(hashes, units: int = 2) -> np.ndarray:
    """Which requests continue a conversation seen before: their first ``units`` prefix ids
    (the shared system unit and the conversation's first) came earlier in the trace."""
    seen, out = set(), np.zeros(len(hashes), dtype=bool)
    for j, h in enumerate(hashes):
        k = tuple(h[:units])
        out[j] = len(h) >= units and k in seen
        seen.add(k)
    return out


def one(spec, reqs, hashes, name, replicas: int, seed: int, later=None) -> dict:
    from llmqueue.cluster import simulate_fleet
    from llmqueue.engine.options import SimOptions

    opts = SimOptions(seed=seed, hash_ids=hashes, hash_block_tokens=512)
    t = time.perf_counter()
    res = simulate_fleet(spec.engine, spec.step_time, reqs, replicas=replicas, router=name, options=opts)
    wall = time.perf_counter() - t
    q = res.requests
    ok = q["status"] == "ok"
    order = np.argsort(q["request_id"], kind="stable")  # records in request order (ids 0..n-1)
    later = later_turns(hashes) if later is None else later
    all_ttft = (q["first_token_s"] - q["arrival_s"])[order]
    ok_o = ok[order]
    ttft = (q["first_token_s"] - q["arrival_s"])[ok]
    imb, mean_n = imbalance(q, replicas)
    span = float(np.nanmax(q["finish_s"]) - np.min(q["arrival_s"]))
    s = res.steps
    busy = np.bincount(np.asarray(s["replica"]), weights=np.asarray(s["duration_s"]), minlength=replicas)
    return {
        "router": name if isinstance(name, str) else name.name, "requests": int(len(q["status"])), "ok": int(ok.sum()),
        "hit_rate": float(q["cached_prompt_tokens"].sum() / q["prompt_tokens"].sum()),
        "ttft_p50_ms": float(np.percentile(ttft, 50) * 1e3), "ttft_p99_ms": float(np.percentile(ttft, 99) * 1e3),
        "ttft_p50_first_turns_ms": float(np.median(all_ttft[ok_o & ~later]) * 1e3),
        "ttft_p50_later_turns_ms": float(np.median(all_ttft[ok_o & later]) * 1e3),
        "mean_e2el_s": float(np.mean((q["finish_s"] - q["arrival_s"])[ok])),
        "imbalance": imb, "mean_outstanding": mean_n, "busy": float(busy.mean() / span),
        "preemptions": int(q["preemptions"].sum()), "share_max": float(np.bincount(q["replica"]).max() / len(q["replica"])),
        "wall_s": round(wall, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="Mooncake's conversation_trace.jsonl (timestamp, input_length, "
                    "output_length, hash_ids)")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--time-scale", type=float, default=0.25, help="multiply arrival times by this")
    ap.add_argument("--n", type=int, default=0, help="the first n requests (0: all)")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--bound", type=float, default=1.25, help="the load bound of prefix-affinity and session")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from llmqueue.spec import build_spec

    spec = build_spec(model=a.model, gpu=a.gpu, enable_prefix_caching=True, prefix_block_tokens=512,
                      capacity_tokens=None, arrival="poisson:1", prompt="fixed:1", output="fixed:1", num_requests=1)
    reqs, hashes = load(a.trace, n=a.n, time_scale=a.time_scale)
    mu = saturation_rate(spec, reqs, hashes, seed=a.seed)
    t = np.asarray(reqs.arrival_s)
    lam = (len(t) - 1) / float(t[-1] - t[0])
    later = later_turns(hashes)
    from llmqueue.cluster.affinity import PrefixAffinity, Session

    custom = {"prefix-affinity": lambda: PrefixAffinity(a.seed, bound=a.bound), "session": lambda: Session(a.seed, bound=a.bound),
              "prefix-affinity-hash": lambda: PrefixAffinity(a.seed, bound=a.bound, new_keys="hash"),
              "prefix-affinity-requests": lambda: PrefixAffinity(a.seed, bound=a.bound, load="requests", new_keys="hash")}
    rows = []
    for name in a.routers.split(","):
        row = one(spec, reqs, hashes, custom[name]() if name in custom else name, a.replicas, a.seed, later)
        row["router"] = name
        rows.append(row)
    cfg = spec.engine
    result = {"trace": a.trace, "requests": len(reqs), "time_scale": a.time_scale, "replicas": a.replicas,
              "bound": a.bound,
              "later_turn_share": float(later.mean()), "arrival_rate": lam, "replica_saturation_rate": mu, "rho": lam / (a.replicas * mu),
              "model": a.model, "gpu": a.gpu, "kv_tokens_per_replica": cfg.num_kv_blocks * cfg.block_size,
              "block_size": cfg.block_size, "max_num_seqs": cfg.max_num_seqs,
              "max_num_batched_tokens": cfg.max_num_batched_tokens, "rows": rows}
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{len(reqs):,} requests of {a.trace}, arrival times x{a.time_scale}; {a.replicas} x {a.model} on {a.gpu} "
          f"({result['kv_tokens_per_replica']:,} KV tokens each), prefix caching on")
    print(f"arrival rate {lam:.2f} req/s; one replica saturates at {mu:.2f} req/s: "
          f"load rho = {result['rho']:.2f}")
    print(f"{later.mean():.0%} of the requests continue a conversation seen before (later turns)")
    print(f"{'router':<24} {'hit rate':>8} {'TTFT p50':>10} {'TTFT p99':>10} {'p50 first':>10} {'p50 later':>10} "
          f"{'imbalance':>9} {'mean N':>7} "
          f"{'busy':>5} {'preempt':>7} {'wall':>6}")
    for r in rows:
        print(f"{r['router']:<24} {r['hit_rate']:>8.1%} {r['ttft_p50_ms']:>8.0f}ms {r['ttft_p99_ms']:>8.0f}ms "
              f"{r['ttft_p50_first_turns_ms']:>8.0f}ms {r['ttft_p50_later_turns_ms']:>8.0f}ms "
              f"{r['imbalance']:>9.2f} {r['mean_outstanding']:>7.2f} {r['busy']:>5.2f} {r['preemptions']:>7} "
              f"{r['wall_s']:>5.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
