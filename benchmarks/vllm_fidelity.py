"""Seed 004's methodology on a real engine: measure, calibrate, predict, compare.

For each workload shape (balanced, prompt-heavy, decode-heavy, scaled to the tiny model's
max_model_len), against vLLM's CPU build serving a random-weight Llama (scripts/vllm_cpu_env.sh):

1. saturate the server (Poisson arrivals above capacity, at most 32 requests at the server at
   once: a full KV cache and a waiting line, without hundreds of open streams competing with the
   engine for the two cores) and measure the completion rate after warm-up, up to the client's
   last send (the cap keeps a backlog at the client, so the sends go on past --sat-s: the whole
   saturated part is measured, not only the scheduled arrival period);
2. calibrate from that run's steady part (the same window): M from the server's
   cache_config_info (usable blocks), b-bar as the mean busy step cycle from the iteration log
   (the other estimators are kept in the file), a linear step-time model on the step cycles,
   and the server's delay outside the engine from 30 isolated requests (``probe/``, spaced
   1.5 x the longest one's calibrated time alone);
3. predict the capacity with seed 004's mu = M / (b E[g]) and with the simulator (replaying the
   run's request stream), and compare with the measured rate;
4. run at 0.5, 0.8, 0.9 and 1.3 x the measured capacity: stability verdicts (measured,
   simulated, theory) and TTFT/TPOT p50/p99 (measured vs simulated) at 0.5 and 0.8.

Usage: python benchmarks/vllm_fidelity.py [--shapes balanced,prompt,decode] [--sat-s 60] [--run-s 100]
       [--out runs/fidelity] [--json]
Needs: bash scripts/vllm_cpu_env.sh (the vLLM CPU venv). Loopback only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPES = {  # (prompt, output): seed 004's 1:1, 2:1, 1:2 mixes scaled to max_model_len 512
    "balanced": ("uniform:10:200", "uniform:10:200"),
    "prompt": ("uniform:10:266", "uniform:10:133"),
    "decode": ("uniform:10:133", "uniform:10:266"),
}
MODEL = dict(hidden_size=512, num_layers=4, heads=8, kv_heads=4, vocab_size=4096, max_position_embeddings=2048, seed=0)
SERVER = dict(block_size=32, max_num_seqs=64, max_num_batched_tokens=256, max_model_len=512,
              num_gpu_blocks_override=64)
FACTORS = (0.5, 0.8, 0.9, 1.3)
SAT_CONCURRENCY = 32
RUN_S = {0.5: 150.0, 0.8: 100.0, 0.9: 100.0, 1.3: 100.0}  # arrival period per load (--run-s scales them)
LOWLOAD_S = 200.0  # arrival period of the --lowload calibration run


def exact_rate_stream(lam: float, prompt: str, output: str, seed: int, duration: float):
    """A Poisson stream of ``round(lam * duration)`` requests whose realized mean rate is exactly
    ``lam`` (the seeded Poisson realization, its time axis rescaled): an 80-s Poisson stream's own
    rate is off by +-7 % (one sigma), enough to put a "0.9x" run above capacity."""
    from llmqueue.workload import Workload
    from llmqueue.workload.generate import RequestArrays

    n = max(int(round(lam * duration)), 2)
    r = Workload(f"poisson:{lam}", prompt=prompt, output=output).generate(seed, n=n)
    t = (r.arrival_s - r.arrival_s[0]) * ((n - 1) / lam) / (r.arrival_s[-1] - r.arrival_s[0])
    return RequestArrays(r.request_id, t, r.prompt_tokens, r.output_tokens, r.class_name)


def one_run(srv, run_dir: Path, reqs, *, warmup_s: float, knobs: dict, concurrency: int | None = None,
            **bench_kwargs) -> dict:
    """One benchmark run with the server's metrics and step log; ``server.json`` records the engine
    knobs (from the server's flags, log and metrics, each with its source) and ``M_usable``. ``bench_kwargs`` go to :func:`run_bench` (e.g. ``hash_ids``)."""
    from llmqueue.bench.client import run_bench
    from llmqueue.bench.steplog import write_run_steps

    offset = srv.log_path.stat().st_size if srv.log_path and srv.log_path.exists() else 0
    res = run_bench(srv.url, srv.model, reqs, out_dir=run_dir, metrics_url=srv.url, warmup_s=warmup_s,
                    vocab_size=MODEL["vocab_size"], concurrency=concurrency, **bench_kwargs)
    from llmqueue.bench.server_info import record

    # what `llmqueue bench --server-max-num-seqs ... --server-log FILE` records: the server's
    # launch flags as given, its log's startup lines and its /metrics, each with its source
    # (M_usable = (blocks - 1) x block_size: vLLM holds one null block back)
    server = record(run_dir, log=srv.log_path,
                    flags={**{k: knobs[k] for k in ("max_num_seqs", "max_num_batched_tokens", "block_size",
                                                    "max_model_len")},
                           "num_gpu_blocks": knobs["num_gpu_blocks_override"], "enable_chunked_prefill": True})
    if srv.log_path:  # the server's per-step log lines of this run, as steps.parquet
        b = res.summary["bench"]
        write_run_steps(run_dir, srv.log_path, offset=offset, t0_epoch_s=b["t0_epoch_s"], t_end_s=b["t_end_s"],
                        M=server["M_usable"], finish_s=res.records["finish_s"])
    return res.summary


PROBE_N = 30


def probe_gap_s(cal: dict, reqs) -> float:
    """Seconds between probe requests: 1.5 x the longest of them alone at the calibrated engine
    (linear step model), at least 0.5 s, so that each is done before the next is sent."""
    import numpy as np

    from llmqueue.bench.validate import engine_config
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.simulate import SimSpec, run_simulation
    from llmqueue.workload.generate import RequestArrays

    apart = RequestArrays(reqs.request_id, 1e4 * np.arange(len(reqs.request_id), dtype=float), reqs.prompt_tokens,
                          reqs.output_tokens, reqs.class_name)
    step = parse_step_time(cal.get("step_time_linear") or cal["step_time"])
    sim = run_simulation(SimSpec(engine=engine_config(cal, cal.get("capacity_tokens") or 1e9), step_time=step,
                                 requests=apart)).records
    e2el = np.asarray(sim["finish_s"]) - np.asarray(sim["arrival_s"])
    return max(0.5, 1.5 * float(np.nanmax(e2el)))


def probe(srv, sd: Path, prompt: str, seed: int) -> float:
    """Isolated requests (4 output tokens, spaced by :func:`probe_gap_s`: each is done before
    the next arrives) to measure the server's delay outside the engine; updates
    ``calibration.yaml``."""
    from llmqueue.bench.calibrate import (calibration_from_dict, load_calibration, with_frontend_latency,
                                          write_calibration)
    from llmqueue.workload import Workload

    reqs = Workload("deterministic:2", prompt=prompt, output="fixed:4").generate(seed + 7, n=PROBE_N)
    gap = probe_gap_s(load_calibration(sd / "calibration.yaml"), reqs)
    reqs = Workload(f"deterministic:{1 / gap}", prompt=prompt, output="fixed:4").generate(seed + 7, n=PROBE_N)
    one_run(srv, sd / "probe", reqs, warmup_s=0.0, knobs=SERVER)
    cal = with_frontend_latency(calibration_from_dict(load_calibration(sd / "calibration.yaml")), sd / "probe")
    write_calibration(cal, sd / "calibration.yaml")
    return cal.frontend_latency_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="balanced,prompt,decode")
    ap.add_argument("--sat-s", type=float, default=60.0,
                    help="arrival period (s) of the saturation run's schedule (its sends go on while the backlog lasts)")
    ap.add_argument("--run-s", type=float, default=100.0,
                    help="percent of the default arrival periods of the load runs (150/100/100/100 s)")
    ap.add_argument("--warmup-s", type=float, default=15.0)
    ap.add_argument("--out", default="runs/fidelity")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shape-seeds", action="store_true",
                    help="give each shape its own seed (--seed + 1,000,000 x its place in balanced,prompt,decode) so "
                         "that the shapes' length and arrival draws are independent; without it all shapes "
                         "share --seed's random numbers (a heavy draw is heavy on every shape)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--probe-only", action="store_true",
                    help="only (re)measure the frontend latency of existing runs (updates calibration.yaml)")
    ap.add_argument("--repeat", type=int, default=0,
                    help="only add this many repetitions (new seeds) of the --factors load runs to existing "
                         "results (x<f>-r<k>/), with the saved calibration and measured capacity")
    ap.add_argument("--same-seed", action="store_true",
                    help="with --repeat: replay the first run's own request stream (same seed, x<f>-s<k>/): "
                         "how far the engine's latencies move between runs of identical input")
    ap.add_argument("--factors", default=",".join(str(f) for f in FACTORS))
    ap.add_argument("--model", default="512x4", help="the random Llama's hidden size x layers (512x4, 1024x8)")
    ap.add_argument("--kv-blocks", type=int, default=SERVER["num_gpu_blocks_override"],
                    help="the server's KV blocks of 32 tokens (--num-gpu-blocks-override; one is held back): "
                         "64 gives M = 2,016 tokens, delta = max(s+o)/M = 0.2 for these shapes")
    ap.add_argument("--sat-concurrency", type=int, default=SAT_CONCURRENCY,
                    help="requests at the server at once in the saturation run (more than the KV cache holds)")
    ap.add_argument("--lowload", type=float, default=None,
                    help="only add a low-load run at this factor of the measured capacity (lowload/, 200 s of "
                         "arrivals, its own seed) to existing results: small-batch steps for the step model's fit "
                         "(the report then also predicts with calibrate --steps-from lowload)")
    ap.add_argument("--b-guess", type=float, default=0.03,
                    help="step time (s) for the first capacity guess that sets the saturation rate")
    a = ap.parse_args()

    def seed_of(shape: str) -> int:
        return a.seed + (1_000_000 * list(SHAPES).index(shape) if a.shape_seeds else 0)

    from llmqueue.bench.calibrate import calibrate, last_send_s, write_calibration
    from llmqueue.bench.engine import VllmServer, build_tiny_model, vllm_version
    from llmqueue.bench.validate import validate
    from llmqueue.theory.kv import kv_stability
    from llmqueue.workload import Workload, parse_length

    work = Path(".vllm-work").absolute()
    hidden, layers = (int(x) for x in a.model.split("x"))
    MODEL.update(hidden_size=hidden, num_layers=layers, heads=hidden // 64)  # head size 64, 4 KV heads
    model_dir = build_tiny_model(work / "models" / f"tiny-llama-{a.model}-v{MODEL['vocab_size']}", **MODEL)
    out = Path(a.out)
    SERVER["num_gpu_blocks_override"] = a.kv_blocks
    if a.probe_only:
        with VllmServer(model_dir, work_dir=work, log_path=out / "probe-server.log", **SERVER) as srv:
            for shape in a.shapes.split(","):
                fl = probe(srv, out / shape, SHAPES[shape][0], seed_of(shape))
                print(f"{shape}: frontend latency {1e3 * fl:.1f} ms", flush=True)
        return 0
    factors = [] if a.factors in ("", "none") else [float(f) for f in a.factors.split(",")]  # none: calibration only
    if a.lowload:
        saved = json.loads((out / "fidelity.json").read_text())
        with VllmServer(model_dir, work_dir=work, log_path=out / "lowload-server.log", **SERVER) as srv:
            for shape in a.shapes.split(","):
                p, o = SHAPES[shape]
                lam = a.lowload * saved["shapes"][shape]["mu_measured"]
                reqs = exact_rate_stream(lam, p, o, seed_of(shape) + 77, LOWLOAD_S)
                meas = one_run(srv, out / shape / "lowload", reqs, warmup_s=a.warmup_s, knobs=SERVER)
                print(f"{shape} lowload {a.lowload}x: {meas.get('completed')} requests, "
                      f"{meas.get('median_tpot_ms'):.1f} ms TPOT p50", flush=True)
        return 0
    if a.repeat:
        saved = json.loads((out / "fidelity.json").read_text())
        for shape in a.shapes.split(","):
            p, o = SHAPES[shape]
            sd = out / shape
            mu_meas = saved["shapes"][shape]["mu_measured"]
            with VllmServer(model_dir, work_dir=work, log_path=sd / "server-repeat.log", **SERVER) as srv:
                for k in range(1, a.repeat + 1):
                    for f in factors:
                        lam = f * mu_meas
                        seed = seed_of(shape) + int(100 * f) + (0 if a.same_seed else 1000 * k)
                        reqs = exact_rate_stream(lam, p, o, seed, RUN_S[f] * a.run_s / 100.0)
                        name = f"x{f}-s{k}" if a.same_seed else f"x{f}-r{k}"
                        meas = one_run(srv, sd / name, reqs, warmup_s=a.warmup_s, knobs=SERVER)
                        print(f"{shape} {name}: {meas.get('median_ttft_ms'):.1f} ms TTFT p50, "
                              f"{meas.get('median_tpot_ms'):.1f} ms TPOT p50", flush=True)
        return 0
    results = {"vllm": vllm_version(), "model": MODEL, "server": SERVER, "shapes": {}}
    for shape in a.shapes.split(","):
        p, o = SHAPES[shape]
        sd = out / shape
        sd.mkdir(parents=True, exist_ok=True)
        row: dict = {"prompt": p, "output": o, "seed": seed_of(shape)}
        with VllmServer(model_dir, work_dir=work, log_path=sd / "server.log", **SERVER) as srv:
            row["server_startup_s"] = srv.startup_s
            M_guess = (SERVER["num_gpu_blocks_override"] - 1) * SERVER["block_size"]
            mu_guess = kv_stability(M=M_guess, b=a.b_guess, chunk=SERVER["max_num_batched_tokens"],
                                    prompt=parse_length(p), output=parse_length(o)).mu
            lam_sat = 1.5 * mu_guess
            reqs = Workload(f"poisson:{lam_sat}", prompt=p, output=o).generate(seed_of(shape), duration=a.sat_s)
            # at most SAT_CONCURRENCY requests at the server: enough to keep its KV cache full, and
            # not the hundreds of open streams of an open-loop overload, whose handling by the
            # client and the API server takes CPU from the engine on a 2-core machine (measured:
            # 10 % fewer decode tokens per second at 2x the capacity than at 1.3x)
            one_run(srv, sd / "sat", reqs, warmup_s=a.warmup_s, knobs=SERVER, concurrency=a.sat_concurrency)
            # steady saturation: after warm-up, up to the client's last send (the drain follows;
            # with the concurrency cap the sends go on past --sat-s while the backlog lasts)
            window = (a.warmup_s, last_send_s(sd / "sat"))
            cal = calibrate(sd / "sat", capacity_tokens=None, window=window)
            if cal.capacity_tokens is None:
                raise SystemExit("no KV capacity recorded")
            write_calibration(cal, sd / "calibration.yaml")
            row["frontend_latency_s"] = probe(srv, sd, p, seed_of(shape))
            from llmqueue.bench.calibrate import load_calibration

            c = load_calibration(sd / "calibration.yaml")
            c["capacity_tokens"] = json.loads((sd / "sat" / "server.json").read_text())["M_usable"]
            v_sat = validate(sd / "sat", c, horizon_s=window[1], speed_band=0.0)  # the saturated part, not the drain
            mu_meas = v_sat["capacity"]["measured"] or v_sat["rows"][0]["measured"]
            row.update(lam_sat=lam_sat, sat_window=window, mu_measured=mu_meas, M=c["capacity_tokens"], b=cal.b, b_cv=cal.itl_cv,
                       linear=cal.linear, mu_theory=v_sat["capacity"]["theory"],
                       mu_sim=v_sat["capacity"].get("simulated") or v_sat["rows"][0]["simulated"],
                       sat_verdict=v_sat["verdicts"]["measured"])
            row["err_theory"] = (row["mu_theory"] - mu_meas) / mu_meas
            row["err_sim"] = (row["mu_sim"] - mu_meas) / mu_meas if row["mu_sim"] else None
            runs = {}
            for f in factors:
                lam = f * mu_meas
                run_s = RUN_S[f] * a.run_s / 100.0
                reqs = exact_rate_stream(lam, p, o, seed_of(shape) + int(100 * f), run_s)
                one_run(srv, sd / f"x{f}", reqs, warmup_s=a.warmup_s, knobs=SERVER)
                horizon = float(reqs.arrival_s[-1])
                vc = validate(sd / f"x{f}", c, horizon_s=horizon, speed_band=0.0)
                vl = validate(sd / f"x{f}", c, step_model="linear", horizon_s=horizon, speed_band=0.0) if c.get("step_time_linear") else None
                # the measured verdict over the arrival period (the bench summary's own includes the drain)
                rr = {"lam": lam, "measured_verdict": vc["verdicts"]["measured"], "sim_verdict": vc["verdicts"]["simulated"],
                      "theory_verdict": vc["verdicts"]["theory"]}
                for name, v in (("constant_b", vc), ("linear", vl)):
                    if v is None:
                        continue
                    rr[name] = {r["quantity"]: {"measured": r["measured"], "simulated": r["simulated"],
                                                "rel_err": r["rel_err_sim"]} for r in v["rows"]}
                runs[str(f)] = rr
            row["runs"] = runs
        results["shapes"][shape] = row
        (out / "fidelity.json").write_text(json.dumps(results, indent=2, default=str))
        print(f"{shape}: measured {row['mu_measured']:.3f} req/s, theory {row['mu_theory']:.3f} "
              f"({100 * row['err_theory']:+.1f}%), sim {row['mu_sim']:.3f} ({100 * (row['err_sim'] or 0):+.1f}%); "
              + ", ".join(f"x{f}: {runs[str(f)]['measured_verdict'][:8]} / sim {runs[str(f)]['sim_verdict'][:8]}"
                          f" / theory {runs[str(f)]['theory_verdict']}" for f in factors), flush=True)
    if a.json:
        print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
