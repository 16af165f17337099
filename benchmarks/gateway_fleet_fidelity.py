"""Issue 35's fleet fidelity check: two vLLM CPU replicas behind ``llmqueue gateway``, against the
simulated fleet calibrated from the replicas themselves.

1. Two vLLM CPU servers (the vllm tests' tiny random Llama and settings, ``tests/conftest.py``'s
   VLLM_TEST_MODEL and VLLM_TEST_SERVER; each with its iteration log).
2. Calibration: a concurrency-capped saturation run against EACH server directly, both at once
   (two clients in two threads): the servers share the machine's cores, so a replica's speed alone
   is not its speed in the fleet. Each run is calibrated (``llmqueue calibrate``'s function) over
   the window both were saturated in, [warm-up, the earlier of the two last sends); the fleet's
   capacity is the sum of the two measured completion rates. A pooled calibration (replica A's
   run with replica B's steps joining the linear fit, ``calibrate --steps-from``) is the pool's
   one step model: both replicas are the same engine on the same host, and the pool has one.
3. A scenario: one pool of 2 replicas (``--routers``, least-outstanding by default), the servers'
   engine settings (max_num_seqs, max_num_batched_tokens, block_size, capacity_tokens = M from the
   calibration), step_time the pooled calibration's linear model (judged) and its constant b
   (``fitted:cal-pooled.yaml``, shown beside).
4. At 0.5x and 0.8x of the fleet's capacity (Poisson with exactly that mean rate, the saturation
   runs' shape): the client sends through the gateway; then ``llmqueue simulate --scenario S
   --trace RUN/workload.parquet`` replays the gateway's arrivals through the simulated fleet; p50
   and p99 TTFT and TPOT over the requests that arrived after warm-up, measured by the client and
   by the gateway, against the simulated; the verdict against the 15 % bar.

Usage: flock /work/.measure.lock python benchmarks/gateway_fleet_fidelity.py [--quick] [--out runs/gw-fidelity]
       [--run-s 90] [--sat-s 40] [--routers least-outstanding,central]
Needs: bash scripts/vllm_cpu_env.sh (LLMQUEUE_VLLM_VENV, LLMQUEUE_VLLM_WORK). Loopback only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import vllm_fidelity as vf  # noqa: E402  (the single-replica protocol's functions)
from conftest import VLLM_TEST_MODEL, VLLM_TEST_SERVER  # noqa: E402  (the vllm tests' engine)

SHAPE = "balanced"  # the single-replica protocol's 1:1 shape (uniform:10:200 / uniform:10:200)
FACTORS = (0.5, 0.8)
BAR = 0.15
QUANTILES = (("ttft", 50), ("ttft", 99), ("tpot", 50), ("tpot", 99))
KNOBS = {**VLLM_TEST_SERVER, "num_gpu_blocks_override": None}  # the flags recorded in server.json


def start_servers(model_dir, work: Path, out: Path):
    """The two replicas (contexts entered by the caller): the tests' settings, seeds 0 and 1, each
    engine worker bound to its own core (``VLLM_CPU_OMP_THREADS_BIND``: vLLM's ``auto`` binds both
    servers' workers to the same core, where their spinning OpenMP threads take turns)."""
    from llmqueue.bench.engine import VllmServer

    return [VllmServer(model_dir, work_dir=work, seed=k, log_path=out / f"server-{'AB'[k]}.log",
                       env={"VLLM_CPU_OMP_THREADS_BIND": str(k)}, **VLLM_TEST_SERVER) for k in range(2)]


def both_at_once(jobs) -> list:
    """Run the callables of ``jobs`` in threads started together; their results in order (the first
    error raised)."""
    res, errs = [None] * len(jobs), []

    def run(k, fn):
        try:
            res[k] = fn()
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            errs.append(e)

    ts = [threading.Thread(target=run, args=(k, fn)) for k, fn in enumerate(jobs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    return res


def calibrate_fleet(servers, out: Path, a) -> dict:
    """Step 2: both replicas saturated at once, each calibrated over the common saturated window,
    and the pooled calibration; the fleet's capacity is the sum of the measured rates."""
    from llmqueue.bench.calibrate import calibrate, last_send_s, load_calibration, write_calibration
    from llmqueue.bench.validate import validate
    from llmqueue.workload import Workload

    p, o = vf.SHAPES[SHAPE]
    runs = [out / f"sat-{'AB'[k]}" for k in range(2)]
    streams = [Workload(f"poisson:{a.sat_rate}", prompt=p, output=o).generate(a.seed + k, duration=a.sat_s)
               for k in range(2)]
    both_at_once([lambda k=k: vf.one_run(servers[k], runs[k], streams[k], warmup_s=a.warmup_s, knobs=KNOBS,
                                          concurrency=a.sat_concurrency) for k in range(2)])
    sends = [last_send_s(r) for r in runs]
    window = (a.warmup_s, min(sends))  # both replicas saturated, both competing for the cores
    res: dict = {"window": window, "last_sends": sends, "replicas": {}}
    for k, r in enumerate(runs):
        name = "AB"[k]
        cal = calibrate(r, window=window)
        write_calibration(cal, out / f"cal-{name}.yaml")
        c = load_calibration(out / f"cal-{name}.yaml")
        c["capacity_tokens"] = json.loads((r / "server.json").read_text())["M_usable"]
        v = validate(r, c, horizon_s=window[1], speed_band=0.0)
        res["replicas"][name] = {"mu_measured": vf.capacity(v, "measured"), "b": cal.b, "linear": cal.linear,
                                 "step_time_linear": cal.step_time_linear, "M": c["capacity_tokens"]}
    pooled = calibrate(runs[0], window=window, steps_from=(runs[1],))
    write_calibration(pooled, out / "cal-pooled.yaml")
    ra, rb = res["replicas"]["A"], res["replicas"]["B"]
    res.update(mu_fleet=ra["mu_measured"] + rb["mu_measured"], M=ra["M"], b_pooled=pooled.b,
               linear_pooled=pooled.linear, step_time_linear=pooled.step_time_linear,
               b_apart=rb["b"] / ra["b"] - 1, mu_apart=rb["mu_measured"] / ra["mu_measured"] - 1)
    return res


def scenario(out: Path, cal: dict, router: str, step: str, run_s: float, warmup_s: float) -> Path:
    """Step 3: the pool of two replicas with the servers' settings and ``step`` (a step-time spec)."""
    import yaml

    p, o = vf.SHAPES[SHAPE]
    doc = {"name": "gw-fleet-fidelity", "workload": {"arrival": "poisson:1", "prompt": p, "output": o},
           "deployment": {"capacity_tokens": cal["M"], "step_time": step,
                          "max_num_seqs": VLLM_TEST_SERVER["max_num_seqs"],
                          "max_num_batched_tokens": VLLM_TEST_SERVER["max_num_batched_tokens"],
                          "block_size": VLLM_TEST_SERVER["block_size"],
                          "pools": [{"name": "p", "replicas": 2, "router": router}]},
           "run": {"duration_s": run_s, "warmup_s": warmup_s}}
    path = out / f"scenario-{router}-{'constant' if step.startswith('fitted:') else 'linear'}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def quantiles(run_dir: Path, warmup_s: float) -> dict:
    """p50/p99 TTFT and TPOT (ms) of a run's finished requests that arrived ``warmup_s`` or more
    after its first arrival; with their count."""
    import numpy as np

    from llmqueue.records import read_records

    r = read_records(run_dir)
    d, cols = r.derived(), r.to_dict()
    a = cols["arrival_s"]
    keep = (cols["status"] == "ok") & (a >= np.nanmin(a) + warmup_s)
    out = {"n": int(keep.sum())}
    for q, pct in QUANTILES:
        x = d[f"{q}_s"][keep]
        x = x[np.isfinite(x)]
        out[f"{q}_p{pct}"] = float(1e3 * np.percentile(x, pct)) if len(x) else None
    return out


def simulate(sc: Path, trace: Path, out: Path) -> None:
    """``llmqueue simulate --scenario sc --trace trace --out out`` (the CLI, as a user runs it)."""
    cmd = [str(Path(sys.executable).with_name("llmqueue")), "simulate", "--scenario", str(sc), "--trace", str(trace),
           "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"simulate failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")


def load_run(servers, out: Path, a, cal: dict, router: str, f: float) -> dict:
    """Step 4 at load ``f`` x the fleet's capacity with ``router``: the client through the gateway,
    then the simulated fleet on the gateway's arrivals (linear and constant step models)."""
    from llmqueue.bench.client import run_bench
    from llmqueue.serve.launch import GatewayProcess

    p, o = vf.SHAPES[SHAPE]
    lam = f * cal["mu_fleet"]
    reqs = vf.exact_rate_stream(lam, p, o, a.seed + int(100 * f), a.run_s)
    rd = out / f"{router}-x{f}"
    rd.mkdir(parents=True, exist_ok=True)
    specs = {"linear": cal["step_time_linear"], "constant": f"fitted:{(out / 'cal-pooled.yaml').absolute()}"}
    scs = {k: scenario(out, cal, router, s, a.run_s, a.warmup_s) for k, s in specs.items()}
    with GatewayProcess("--scenario", str(scs["linear"]), "--backend", "p=" + ",".join(s.url for s in servers),
                        "--out", str(rd / "gateway"), log_path=rd / "gateway.log") as gw:
        run_bench(gw.url, servers[0].model, reqs, out_dir=rd / "client", warmup_s=a.warmup_s,
                  vocab_size=VLLM_TEST_MODEL["vocab_size"])
        gw.stop(timeout_s=60)
    row: dict = {"router": router, "factor": f, "lam": lam, "requests": len(reqs.request_id),
                 "client": quantiles(rd / "client", a.warmup_s), "gateway": quantiles(rd / "gateway", a.warmup_s)}
    for k, sc in scs.items():
        simulate(sc, rd / "gateway" / "workload.parquet", rd / f"sim-{k}")
        row[f"sim_{k}"] = quantiles(rd / f"sim-{k}", a.warmup_s)
    row["replica_share"] = replica_share(rd / "gateway")
    return row


def replica_share(run_dir: Path) -> list:
    """Requests each replica served in a gateway run (its records' ``replica``)."""
    import numpy as np

    from llmqueue.records import read_records

    rep = read_records(run_dir).to_dict()["replica"]
    return [int(np.sum(rep == k)) for k in range(2)]


def diagnose(out: Path, res: dict) -> dict:
    """Where the time went (a diagnosis beside the bar): each replica's speed in each load run
    against the pooled step model, from its iteration log (the busy step cycles over the model's
    price of the same steps, :func:`llmqueue.bench.calibrate.profile_level`; 1: the model's speed),
    over the run and per 10-s window (min, max), the same level on the saturation runs, and the
    client's send lateness (p50 / p99 ms: a client starved of CPU sends late)."""
    import numpy as np

    from llmqueue.bench.calibrate import profile_level
    from llmqueue.bench.steplog import steps_from_log
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.records import read_records, read_run

    cal = res["calibration"]
    model = parse_step_time(cal["step_time_linear"])
    bs = VLLM_TEST_SERVER["block_size"]

    def level(steps, lo, hi):
        x, n = profile_level(steps, model, (lo, hi), block_size=bs)
        return None if n < 20 else round(float(x), 3)

    diag: dict = {"saturation": {k: level(read_run(out / f"sat-{k}").steps, *cal["window"]) for k in "AB"}, "runs": []}
    for row in res["runs"]:
        rd = out / f"{row['router']}-x{row['factor']}"
        b = json.loads((rd / "client" / "summary.json").read_text())["bench"]
        c = read_records(rd / "client").to_dict()
        late = 1e3 * (c["dispatched_s"] - c["arrival_s"])
        d = {"run": rd.name, "send_lateness_ms": [float(np.nanpercentile(late, q)) for q in (50, 99)], "replicas": {}}
        for k in "AB":
            steps, _ = steps_from_log(out / f"server-{k}.log", t0_epoch_s=b["t0_epoch_s"], t_end_s=b["t_end_s"],
                                      M=cal["M"])
            wins = [level(steps, t, t + 10) for t in np.arange(0, b["t_end_s"], 10)]
            wins = [w for w in wins if w is not None]
            d["replicas"][k] = {"level": level(steps, 0, b["t_end_s"]), "level_10s_min": min(wins, default=None),
                                "level_10s_max": max(wins, default=None)}
        diag["runs"].append(d)
    return diag


def errors(row: dict, sim: str = "sim_linear") -> dict:
    """Relative errors of the simulated figures against the client's and the gateway's."""
    out = {}
    for who in ("client", "gateway"):
        for q, pct in QUANTILES:
            m, s = row[who].get(f"{q}_p{pct}"), row[sim].get(f"{q}_p{pct}")
            out[f"{who}:{q}_p{pct}"] = (s - m) / m if m and s is not None else None
    return out


def table(res: dict) -> str:
    """The figures as markdown: measured (client / gateway) vs simulated, the error, the verdict."""
    L = ["| router, load | quantity | client (ms) | gateway (ms) | simulated, linear (ms) | error vs client "
         "| error vs gateway | simulated, constant b (ms) | verdict (15 %) |", "|---|---|---|---|---|---|---|---|---|"]
    for row in res["runs"]:
        e = errors(row)
        for q, pct in QUANTILES:
            k = f"{q}_p{pct}"
            ec, eg = e[f"client:{k}"], e[f"gateway:{k}"]
            ok = ec is not None and eg is not None and abs(ec) <= BAR and abs(eg) <= BAR
            L.append(f"| {row['router']} {row['factor']}x | {q.upper()} p{pct} | {_ms(row['client'][k])} "
                     f"| {_ms(row['gateway'][k])} | {_ms(row['sim_linear'][k])} | {vf._pct(ec)} | {vf._pct(eg)} "
                     f"| {_ms(row['sim_constant'][k])} | {'within' if ok else 'MISS'} |")
    return "\n".join(L)


def _ms(x) -> str:
    return "-" if x is None else f"{x:,.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/gw-fidelity")
    ap.add_argument("--quick", action="store_true", help="a short smoke (15-s saturation, 20-s loads, 5-s warm-up)")
    ap.add_argument("--sat-s", type=float, default=40.0, help="arrival period (s) of each saturation run's schedule")
    ap.add_argument("--sat-rate", type=float, default=15.0,
                    help="each saturation run's Poisson rate (req/s), above a replica's capacity")
    ap.add_argument("--sat-concurrency", type=int, default=2 * VLLM_TEST_SERVER["max_num_seqs"],
                    help="requests at each server at once in its saturation run (a waiting line behind max_num_seqs)")
    ap.add_argument("--run-s", type=float, default=90.0, help="arrival period (s) of each load run")
    ap.add_argument("--warmup-s", type=float, default=15.0)
    ap.add_argument("--routers", default="least-outstanding", help="comma list of the pool's routers to run")
    ap.add_argument("--factors", default=",".join(map(str, FACTORS)))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--analyze-only", action="store_true",
                    help="no server: redo the figures, the verdicts and the diagnosis on the saved runs of --out")
    a = ap.parse_args(argv)
    if a.quick:
        a.sat_s, a.run_s, a.warmup_s = min(a.sat_s, 15.0), min(a.run_s, 20.0), min(a.warmup_s, 5.0)
    out = Path(a.out).absolute()
    path = out / "gateway_fidelity.json"
    if a.analyze_only:
        return finish(out, json.loads(path.read_text()))
    out.mkdir(parents=True, exist_ok=True)
    model_dir, work, version = vf.engine_setup(f"{VLLM_TEST_MODEL['hidden_size']}x{VLLM_TEST_MODEL['num_layers']}")
    res: dict = {"vllm": version, "model": VLLM_TEST_MODEL, "server": VLLM_TEST_SERVER, "shape": vf.SHAPES[SHAPE],
                 "args": vars(a), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": []}
    servers = start_servers(model_dir, work, out)
    with servers[0], servers[1]:
        cal = res["calibration"] = calibrate_fleet(servers, out, a)
        path.write_text(json.dumps(res, indent=2, default=str))
        print(f"replicas A / B: {cal['replicas']['A']['mu_measured']:.3f} / {cal['replicas']['B']['mu_measured']:.3f} "
              f"req/s at once (B {vf._pct(cal['mu_apart'])}), b {1e3 * cal['replicas']['A']['b']:.1f} / "
              f"{1e3 * cal['replicas']['B']['b']:.1f} ms; fleet capacity {cal['mu_fleet']:.3f} req/s; pooled "
              f"{cal['step_time_linear']}", flush=True)
        for router in a.routers.split(","):
            for f in (float(x) for x in a.factors.split(",")):
                row = load_run(servers, out, a, cal, router, f)
                res["runs"].append(row)
                path.write_text(json.dumps(res, indent=2, default=str))
                print(f"{router} {f}x: {row['requests']} requests, replicas {row['replica_share']}", flush=True)
    return finish(out, res)


def finish(out: Path, res: dict) -> int:
    """The errors, the verdict count and the diagnosis into ``gateway_fidelity.json``; the table printed."""
    path = out / "gateway_fidelity.json"
    for row in res["runs"]:
        row["errors"] = errors(row)
        row["errors_constant"] = errors(row, "sim_constant")
    res["within"] = sum(abs(v) <= BAR for row in res["runs"] for v in row["errors"].values() if v is not None)
    res["checks"] = sum(len(row["errors"]) for row in res["runs"])
    res["diagnosis"] = diagnose(out, res)
    path.write_text(json.dumps(res, indent=2, default=str))
    dg = res["diagnosis"]
    lines = [f"saturation runs: replica speed level A {dg['saturation']['A']}, B {dg['saturation']['B']} (1: the pooled model)"]
    for d in dg["runs"]:
        lines.append(f"{d['run']}: client send lateness p50/p99 {d['send_lateness_ms'][0]:.1f} / "
                     f"{d['send_lateness_ms'][1]:.1f} ms; " + "; ".join(
                         f"{k} level {x['level']} (10-s windows {x['level_10s_min']}-{x['level_10s_max']})"
                         for k, x in d["replicas"].items()))
    print("\n" + table(res) + f"\n\nwithin 15 %: {res['within']} of {res['checks']} ({path})\n\n" + "\n".join(lines),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
