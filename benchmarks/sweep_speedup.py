"""Sweep speed-up: one 200-point sweep on one worker, on the local process pool and on Ray.

Seed 004's 1:1 setting (M = 131,000 tokens, b = 0.0372 s, chunk 512, U{10..1600} prompts and
outputs), 20 Poisson rates from 0.25 to 5 req/s x 10 values of max_num_seqs (4 ... 256), 300 s
simulated per point, seeds derived per point. The same sweep runs

- serially in this process (one worker: the baseline),
- on the local process pool with ``--workers`` processes (default 2: this machine's cores),
- on a local Ray instance with as many CPUs (skipped without ray, or with ``--skip-ray``),

and reports each wall time, the speed-ups over the baseline (goal: at least 1.8x on 2 cores) and
whether the tables are identical (every number but the wall-clock fields). Ray's start-up
(``ray.init``) is timed apart from its sweep. Nothing is cached (no output directory).

Usage: python benchmarks/sweep_speedup.py [--workers 2] [--duration 300] [--skip-ray] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from llmqueue.spec import build_spec
from llmqueue.knobs import flag_defaults
from llmqueue.plan.backends import LocalBackend, SerialBackend, get_backend
from llmqueue.plan.sweep_run import sweep

RATES = [0.25 * (i + 1) for i in range(20)]
MAX_NUM_SEQS = [4, 8, 16, 32, 48, 64, 96, 128, 192, 256]


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (the pool's workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(backend, base):
    t, c = time.perf_counter(), cpu_s()
    res = sweep(build_spec, base, rates=RATES, params={"max_num_seqs": MAX_NUM_SEQS}, backend=backend)
    return time.perf_counter() - t, res, cpu_s() - c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = flag_defaults(capacity_tokens=131000, step_time="0.0372", chunk=512, prompt="uniform:10:1600",
                          output="uniform:10:1600", duration=args.duration, seed=1)
    out = {"points": len(RATES) * len(MAX_NUM_SEQS), "duration_s": args.duration, "workers": args.workers,
           "cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_before": os.getloadavg()}
    _cpu0 = cpu_s()

    t_serial, serial, out["serial_cpu_s"] = timed(SerialBackend(), base)
    out["serial_s"] = t_serial
    with LocalBackend(workers=args.workers) as be:
        t_local, local, _ = timed(be, base)
    out["local_cpu_s"] = cpu_s() - out["serial_cpu_s"] - _cpu0  # workers count once the pool has shut down
    out["local_s"] = t_local
    out["local_speedup"] = t_serial / t_local
    out["local_identical"] = local.numbers() == serial.numbers()
    if not args.skip_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            out["ray"] = "not installed (pip install 'llmqueue[ray]')"
        else:
            t = time.perf_counter()
            be = get_backend("ray", workers=args.workers)
            out["ray_init_s"] = time.perf_counter() - t
            try:
                t_ray, ray_res, _ = timed(be, base)
            finally:
                be.close()
            out["ray_s"] = t_ray
            out["ray_speedup"] = t_serial / t_ray
            out["ray_speedup_with_init"] = t_serial / (t_ray + out["ray_init_s"])
            out["ray_identical"] = ray_res.numbers() == serial.numbers()
    out["load_avg_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['points']} points x {args.duration:g} s simulated, {os.cpu_count()} CPUs, "
              f"load average before {out['load_avg_before'][0]:.2f}")
        print(f"  one worker (serial)      {t_serial:7.1f} s   ({out['serial_cpu_s']:.1f} CPU s)")
        print(f"  local pool, {args.workers} workers   {t_local:7.1f} s   speed-up {out['local_speedup']:.2f}x   "
              f"({out['local_cpu_s']:.1f} CPU s)   identical numbers: {out['local_identical']}")
        if "ray_s" in out:
            print(f"  ray, {args.workers} CPUs            {out['ray_s']:7.1f} s   speed-up {out['ray_speedup']:.2f}x "
                  f"({out['ray_speedup_with_init']:.2f}x with ray.init {out['ray_init_s']:.1f} s)   "
                  f"identical numbers: {out['ray_identical']}")
        elif "ray" in out:
            print(f"  ray: {out['ray']}")
    ok = out["local_identical"] and out.get("ray_identical", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
