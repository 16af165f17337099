"""The simulated fleet against a real one: two vLLM CPU replicas behind ``llmqueue gateway``
(issue 35, "Fleet fidelity").

1. Two vLLM CPU servers (the fidelity protocol's tiny Llama and settings,
   ``benchmarks/vllm_fidelity.py``: SERVER, the ``balanced`` shape), each with its iteration log.
2. Each replica calibrated from a saturation run against it directly, both at once: the two
   servers share this machine's two cores, so a replica's speed alone is not its speed in the
   fleet. The fleet's capacity is the sum of the two saturated completion rates.
3. A scenario: one pool of two replicas behind ``--router`` (least-outstanding), the servers'
   settings, ``capacity_tokens`` the calibration's M and the step time one replica's calibrated
   linear model (a pool has one step model: replica A's; B's own figures are kept beside).
4. At ``--factors`` (0.5, 0.8) x the fleet's capacity: a Poisson stream of exactly that rate
   through the gateway (``--run-s`` seconds of arrivals), the gateway's records in ``gw-F/``; then
   ``llmqueue simulate --scenario S --trace gw-F/workload.parquet`` (the same arrivals, each with
   its lengths), and p50 / p99 TTFT and TPOT of the gateway's records against the simulated
   (TTFT also with the calibration's frontend delay, the server's time outside the engine, added
   to the simulated), judged against 15 %.

    python benchmarks/gateway_fleet_fidelity.py [--sat-s 60] [--run-s 100] [--out runs/fleet-fidelity]

Needs the vLLM CPU venv (bash scripts/vllm_cpu_env.sh; LLMQUEUE_VLLM_VENV / LLMQUEUE_VLLM_WORK).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import vllm_fidelity as vf  # noqa: E402  (the single-replica protocol's setup and runs)

LAT = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")


def saturate_both(servers, out: Path, a, p: str, o: str) -> list:
    """Saturation runs against both servers at once (threads); returns each run's
    ``(run_dir, window, summary)``."""
    from llmqueue.bench.calibrate import last_send_s
    from llmqueue.workload import Workload

    res: list = [None, None]

    def one(k, srv):
        d = out / f"sat-{'AB'[k]}"
        reqs = Workload(f"poisson:{a.sat_rate}", prompt=p, output=o).generate(a.seed + k, duration=a.sat_s)
        s = vf.one_run(srv, d, reqs, warmup_s=a.warmup_s, knobs=vf.SERVER, concurrency=vf.SAT_CONCURRENCY)
        res[k] = (d, (a.warmup_s, last_send_s(d)), s)

    ts = [threading.Thread(target=one, args=(k, s)) for k, s in enumerate(servers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res


def saturated_rate(run_dir: Path, window) -> float:
    """Completions a second inside ``window`` (the saturated part of the run)."""
    import numpy as np

    from llmqueue.records import read_records

    r = read_records(run_dir).to_dict()
    fin = np.asarray(r["finish_s"], dtype=float)
    ok = (np.asarray(r["status"]) == "ok") & (fin >= window[0]) & (fin < window[1])
    return float(ok.sum() / (window[1] - window[0]))


def scenario(path: Path, cal_file: Path, cal: dict, router: str) -> Path:
    import yaml

    s = vf.SERVER
    doc = {"name": "fleet-fidelity",
           "workload": {"arrival": "poisson:1", "prompt": vf.SHAPES["balanced"][0], "output": vf.SHAPES["balanced"][1]},
           "deployment": {"capacity_tokens": int(cal["capacity_tokens"]), "step_time": cal.get("step_time_linear") or f"fitted:{cal_file}",
                          "max_num_seqs": s["max_num_seqs"], "max_num_batched_tokens": s["max_num_batched_tokens"],
                          "block_size": s["block_size"], "max_model_len": s["max_model_len"],
                          "pools": [{"name": "p", "replicas": 2, "router": router}]},
           "run": {"duration_s": 10}}
    path.write_text(yaml.safe_dump(doc))
    return path


def summary_of(run_dir: Path) -> dict:
    from llmqueue.metrics import summarize
    from llmqueue.records import read_records

    return summarize(read_records(run_dir))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sat-s", type=float, default=60.0)
    ap.add_argument("--sat-rate", type=float, default=12.0, help="each saturation run's offered rate (capped at "
                    f"{vf.SAT_CONCURRENCY} at the server)")
    ap.add_argument("--warmup-s", type=float, default=15.0)
    ap.add_argument("--run-s", type=float, default=100.0)
    ap.add_argument("--factors", default="0.5,0.8")
    ap.add_argument("--router", default="least-outstanding")
    ap.add_argument("--model", default="512x4")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", default="runs/fleet-fidelity")
    a = ap.parse_args(argv)
    import subprocess

    from llmqueue.bench.calibrate import calibrate, write_calibration
    from llmqueue.serve.launch import GatewayProcess

    out = Path(a.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    p, o = vf.SHAPES["balanced"]
    model_dir, work, version = vf.engine_setup(a.model)
    result: dict = {"vllm": version, "model": a.model, "server": vf.SERVER, "shape": [p, o], "router": a.router}
    with vf.open_server(model_dir, work, out / "vllm-A.log") as A, vf.open_server(model_dir, work, out / "vllm-B.log") as B:
        sat = saturate_both([A, B], out, a, p, o)
        cals, rates = [], []
        for k, (d, window, _) in enumerate(sat):
            c = calibrate(d, window=window)
            f = write_calibration(c, out / f"calibration-{'AB'[k]}.yaml")
            cals.append((f, c.to_dict()))
            rates.append(saturated_rate(d, window))
        mu = sum(rates)
        result["calibration"] = [{"b": c["b"], "linear": c.get("linear"), "M": c["capacity_tokens"],
                                  "frontend_latency_s": c.get("frontend_latency_s"), "saturated_req_s": r}
                                 for (_, c), r in zip(cals, rates)]
        print(f"saturated: A {rates[0]:.3f} req/s, B {rates[1]:.3f} req/s; fleet mu {mu:.3f} req/s", flush=True)
        sc = scenario(out / "fleet.yaml", cals[0][0], cals[0][1], a.router)
        front = float(cals[0][1].get("frontend_latency_s") or 0.0)
        result["loads"] = {}
        for f in (float(x) for x in a.factors.split(",")):
            lam = f * mu
            reqs = vf.exact_rate_stream(lam, p, o, a.seed + 10, a.run_s)
            gw_dir, sim_dir = out / f"gw-{f:g}", out / f"sim-{f:g}"
            with GatewayProcess("--scenario", str(sc), "--backend", f"p={A.url},{B.url}", "--out", str(gw_dir)) as gw:
                from llmqueue.bench.client import run_bench

                run_bench(gw.url, A.model, reqs, out_dir=out / f"bench-{f:g}", vocab_size=vf.MODEL["vocab_size"])
            subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "simulate", "--scenario", str(sc), "--trace",
                            str(gw_dir / "workload.parquet"), "--out", str(sim_dir), "--no-progress", "--json"],
                           check=True, stdout=subprocess.DEVNULL)
            live, sim = summary_of(gw_dir), summary_of(sim_dir)
            rows = {}
            for q in LAT:
                m, s = live.get(q), sim.get(q)
                s_front = s + 1e3 * front if (s is not None and "ttft" in q) else s
                rows[q] = {"gateway": m, "simulated": s, "simulated_with_frontend": s_front,
                           "rel_err": (s - m) / m if m and s is not None else None,
                           "rel_err_with_frontend": (s_front - m) / m if m and s_front is not None else None}
            result["loads"][f"{f:g}"] = {"lam": lam, "rows": rows, "completed": live.get("completed")}
            for q, r in rows.items():
                print(f"{f:g}x  {q:16s} gateway {r['gateway']:9.2f}  simulated {r['simulated']:9.2f} "
                      f"({100 * r['rel_err']:+.1f} %; with the frontend delay {100 * r['rel_err_with_frontend']:+.1f} %)",
                      flush=True)
    (out / "fleet_fidelity.json").write_text(json.dumps(result, indent=1, default=str))
    print("results in", out / "fleet_fidelity.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
