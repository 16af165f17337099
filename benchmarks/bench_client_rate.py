"""Open-loop client speed: the highest request rate the benchmark client sustains on time.

The client (:func:`llmqueue.bench.client.run_bench`) sends Poisson arrivals to the stub server
(:mod:`llmqueue.bench.stub_server`, a subprocess on 127.0.0.1) answering at once with one-token
outputs (the client's cost per request, not the server's work, is measured), at increasing rates.
A rate is *sustained* when every request ends ``ok``, the completions keep up with the arrivals
(request throughput >= 95% of the offered rate), and the p99 scheduling lag (actual - intended
send time) is at most ``--lag-ms`` (2 ms). Records are written to a temporary run directory as in
a real run (requests.parquet, tokens.parquet every second). The stub shares the machine's cores
with the client, so the result is a lower bound for a client talking to a remote server.

Reports per rate: offered and achieved rate, lag p50/p99/max (ms), the KS check of the realized
gaps, peak requests in flight, client and server CPU microseconds per request. First, the
machine's floor: the lag of the same sleep schedule with no I/O at all, i.e. what the operating
system alone costs (on a busy shared machine it exceeds 2 ms at p99 by itself).

Usage: python benchmarks/bench_client_rate.py [--rates 500,1000,...] [--duration 5] [--json]

Measured on the project's 2-core machine (Python 3.11, uvloop 0.23, 5 s per rate), which other
developers' processes share, so results move with its load:

- quiet moment (load average ~1.9, floor p99 0.7 ms): sustained up to 3,000 req/s (p50 lag
  0.11-0.13 ms, p99 1.37 ms at 2,000/s, 1.5-1.6 ms at 3,000/s); 4,000/s kept up with a p99 of
  2.4 ms; at 5,000/s client and stub together run out of the two cores (about 200 us of CPU per
  request each) and fall behind.
- busy (load average 3-6, floor p99 1.7-5 ms): 500-1,000 req/s sustained; 2,000-2,500 req/s
  kept up (p50 lag 0.2-0.7 ms) but with a p99 of 3.5-20 ms, the operating system's stalls.

For comparison on the same stub: aiohttp's ClientSession costs about 230 us of CPU per
streamed request, this client's HTTP layer about 90 us.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_lag_ms(rate: float = 1000.0, duration: float = 3.0, use_uvloop: bool = True) -> dict:
    """The machine's floor: send-time lag of the same open-loop sleep schedule with no I/O at all
    (what the operating system's scheduling alone costs; on a shared, busy machine it is the
    p99 no client can beat)."""
    import asyncio

    import numpy as np

    async def run():
        _pc = time.perf_counter
        rng = np.random.default_rng(0)
        arr = np.cumsum(rng.exponential(1 / rate, int(rate * duration))).tolist()
        t0 = _pc()
        lags = []
        for a in arr:
            target = t0 + a
            while True:
                d = target - _pc()
                if d <= 0:
                    break
                await asyncio.sleep(d)
            lags.append(_pc() - target)
        return np.asarray(lags) * 1e3

    if use_uvloop:
        import uvloop

        lag = uvloop.run(run())
    else:
        lag = asyncio.run(run())
    return {"p50": float(np.percentile(lag, 50)), "p99": float(np.percentile(lag, 99)), "max": float(lag.max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="250,500,1000,1500,2000,2500,3000,4000",
                    help="comma-separated offered rates (req/s), tried in order")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per rate")
    ap.add_argument("--lag-ms", type=float, default=2.0, help="p99 scheduling-lag bound for 'sustained'")
    ap.add_argument("--prompt", default="fixed:16")
    ap.add_argument("--output", default="fixed:1")
    ap.add_argument("--spin-ms", type=float, default=None,
                    help="run_bench's spin_s in ms (default: None, nearest tick then poll; 0: never poll)")
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--keep-going", action="store_true", help="try every rate even after one fails")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from llmqueue.bench.client import run_bench
    from llmqueue.bench.stub_server import StubServer
    from llmqueue.workload import Workload

    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    rows = []
    best = best_floor = None
    use_uvloop = not args.no_uvloop
    floor = idle_lag_ms(use_uvloop=use_uvloop)
    if not args.json:
        print(f"machine floor (the same schedule at 1000/s, no I/O): lag p50 {floor['p50']:.3f} "
              f"p99 {floor['p99']:.3f} max {floor['max']:.1f} ms; load average {os.getloadavg()[0]:.2f}", flush=True)
    with StubServer(use_uvloop=use_uvloop) as srv, tempfile.TemporaryDirectory() as tmp:
        warm = Workload("poisson:200", prompt=args.prompt, output=args.output).generate(seed=0, n=200)
        run_bench(srv.url, srv.model, warm, use_uvloop=use_uvloop)  # imports, first connections
        failed_in_a_row = 0
        for k, rate in enumerate(rates):
            reqs = Workload(f"poisson:{rate}", prompt=args.prompt, output=args.output).generate(
                seed=args.seed + k, duration=args.duration)
            c0, s0, w0 = time.process_time(), _cpu_s(srv.pid), time.perf_counter()
            res = run_bench(srv.url, srv.model, reqs, out_dir=os.path.join(tmp, f"r{k}"), use_uvloop=use_uvloop,
                            spin_s=None if args.spin_ms is None else args.spin_ms / 1e3)
            wall = time.perf_counter() - w0
            c1, s1 = time.process_time(), _cpu_s(srv.pid)
            s = res.summary
            c = s["client"]
            n = len(reqs)
            ok = s["status_counts"]["ok"]
            lag = c["lag_ms"] or {}
            row = {
                "offered_rate": rate, "requests": n, "ok": ok,
                "achieved_rate": s["request_throughput"],
                "lag_p50_ms": lag.get("p50"), "lag_p99_ms": lag.get("p99"), "lag_max_ms": lag.get("max"),
                "ks_pvalue": (c["ks_gaps"] or {}).get("pvalue"), "arrivals_ok": c["arrivals_ok"],
                "max_in_flight": s["max_concurrent_requests"],
                "client_cpu_us_per_req": 1e6 * (c1 - c0) / n, "server_cpu_us_per_req": 1e6 * (s1 - s0) / n,
                "wall_s": wall, "errors": s["errors"],
            }
            keeps_up = ok == n and row["achieved_rate"] >= 0.95 * rate
            row["sustained"] = keeps_up and lag.get("p99", 1e9) <= args.lag_ms
            # the same, with the bound counted above the machine's own floor (no I/O) at p99
            row["sustained_over_floor"] = keeps_up and lag.get("p99", 1e9) <= floor["p99"] + args.lag_ms
            rows.append(row)
            if not args.json:
                print(f"rate {rate:7.0f}/s  ok {ok}/{n}  achieved {row['achieved_rate']:7.1f}/s  "
                      f"lag p50 {row['lag_p50_ms']:.3f} p99 {row['lag_p99_ms']:.3f} max {row['lag_max_ms']:.1f} ms  "
                      f"KS p {row['ks_pvalue']:.3g}  in flight <= {row['max_in_flight']}  "
                      f"cpu/req client {row['client_cpu_us_per_req']:.0f} us server {row['server_cpu_us_per_req']:.0f} us"
                      f"  {'SUSTAINED' if row['sustained'] else 'not sustained'}"
                      f"{' (within floor + bound)' if row['sustained_over_floor'] and not row['sustained'] else ''}",
                      flush=True)
            if row["sustained_over_floor"]:
                best_floor = rate if best_floor is None else max(best_floor, rate)
            if row["sustained"]:
                best = rate if best is None else max(best, rate)
                failed_in_a_row = 0
            elif not row["sustained_over_floor"]:
                failed_in_a_row += 1
                if failed_in_a_row >= 2 and not args.keep_going:
                    break
    load = os.getloadavg()
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
           "uvloop": use_uvloop, "spin_ms": args.spin_ms, "duration_s": args.duration, "lag_bound_ms": args.lag_ms,
           "prompt": args.prompt, "output": args.output, "load_average_after": [round(x, 2) for x in load],
           "highest_sustained_rate": best, "idle_floor_lag_ms": floor,
           "highest_sustained_rate_over_floor": best_floor, "rows": rows,
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"highest sustained rate: {best} req/s (p99 lag <= {args.lag_ms:g} ms, all ok, throughput >= 95%); "
              f"with the bound above the machine's floor (p99 <= {floor['p99']:.2f} + {args.lag_ms:g} ms): "
              f"{best_floor} req/s; load average after: {out['load_average_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
