"""Re-analyse the run directories of benchmarks/vllm_fidelity.py without touching the server.

For each shape: calibrate with each b-bar estimator (median, mean, trimmed means, and the mean
busy step cycle), predict the saturated throughput by theory (E[g] in tokens as in the paper,
and in whole KV blocks) and by simulation (constant b, and the fitted linear step model),
measured over the arrival period of the saturation run after warm-up; stability verdicts at 0.5,
0.8, 0.9, 1.2, 1.3 and 1.5 x the measured capacity (those that were run) over each run's arrival
period; TTFT/TPOT p50/p99 at 0.5 and 0.8,
predicted with the engine's speed drift that calibration measured (validate's default: the mean
over 8 draws of 10-s window speeds) and without it (a steady engine), and with the step model
also fitted on the probe's (and a low-load run's, where there is one) steps, and on all the
shapes' saturation runs together ("pooled": one step model for the engine). For each load run,
the engine's speed against the step model and, without a model, against the saturation run's
steps of the same composition (``llmqueue.bench.speed.matched_speed``).

Usage: python benchmarks/vllm_fidelity_report.py [--dir runs/fidelity] [--sat-s SECONDS] [--warmup-s 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ESTIMATORS = ("median", "trimmed_0.1", "trimmed_0.05", "mean", "cycle")
FACTORS = (0.5, 0.8, 0.9, 1.2, 1.3, 1.5)  # vllm_fidelity.py's loads, the acceptance's and the earlier default's
LAT = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
EXTRA_FITS = {"lowload": "low-load run's steps", "probe": "probe's steps (isolated requests)",
              "pooled": "other shapes' saturation runs' steps (one step model for the engine)"}


def completion_rate_ci(run_dir: Path, window: tuple[float, float], level: float = 0.95):
    """Completion rate over ``window`` with a batch-means interval (completions per batch of
    ``max(5 s, window / 20)``)."""
    import numpy as np

    from llmqueue.metrics.ci import t_quantile
    from llmqueue.records import read_run

    r = read_run(run_dir).requests
    fin = np.asarray(r["finish_s"])[np.asarray(r["status"]) == "ok"]
    batch_s = max(5.0, (window[1] - window[0]) / 20.0)
    edges = np.arange(window[0], window[1] + 1e-9, batch_s)
    counts = np.histogram(fin, bins=edges)[0] / batch_s
    m, se = float(counts.mean()), float(counts.std(ddof=1) / np.sqrt(len(counts)))
    h = t_quantile(level, len(counts) - 1) * se
    return m, (m - h, m + h)


def by_load(runs: dict, field: str, keep=lambda key, r: True, with_speed: bool = False) -> dict:
    """``{(load factor, quantity): [per-run entry of runs[*][field][quantity], ...]}`` over the
    runs at 0.5x and 0.8x that have ``field`` and pass ``keep(key, run)``; ``with_speed``: each
    entry as ``(key, run speed, entry)``."""
    out: dict = {}
    for key, r in runs.items():
        if r["factor"] <= 0.8 and field in r and keep(key, r):
            for q in LAT:
                x = r[field][q]
                out.setdefault((r["factor"], q), []).append((key, r["run_speed"], x) if with_speed else x)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="runs/fidelity")
    ap.add_argument("--sat-s", type=float, default=None,
                    help="end of the saturation run's measured window (default: its last send, the end of its "
                         "saturated part)")
    ap.add_argument("--run-s", type=float, default=80.0, help="load runs' arrival period (default: each run's own)")
    ap.add_argument("--warmup-s", type=float, default=15.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from llmqueue.bench.calibrate import calibrate, frontend_latency, last_send_s, load_calibration
    from llmqueue.bench.speed import matched_speed
    from llmqueue.bench.validate import validate
    from llmqueue.errors import InputError
    from llmqueue.records import read_run

    out = {}
    shape_dirs = sorted(p for p in Path(a.dir).iterdir() if (p / "sat" / "server.json").is_file())  # finished saturation runs
    for sd in shape_dirs:
        M = json.loads((sd / "sat" / "server.json").read_text())["M_usable"]
        # the saturated run's steady part: after warm-up, up to the client's last send (the drain follows)
        sat_end = a.sat_s if a.sat_s is not None else last_send_s(sd / "sat")
        window = (a.warmup_s, sat_end)
        row = {"M": M, "estimators": {}, "window": window}
        for est in ESTIMATORS:
            cal = calibrate(sd / "sat", capacity_tokens=M, estimator=est, window=window).to_dict()
            row["estimators"][est] = {"b": cal["b"]}
            for paged in (False, True):
                v = validate(sd / "sat", cal, horizon_s=sat_end, paged=paged, speed_band=0.0, drift=0.0)  # steady engine
                cap = v["capacity"]
                meas = cap["measured"] or v["rows"][0]["measured"]
                row["mu_measured"] = meas
                key = "paged" if paged else "tokens"
                row["estimators"][est][f"mu_theory_{key}"] = cap["theory"]
                row["estimators"][est][f"err_theory_{key}"] = (cap["theory"] - meas) / meas
            simv = cap["simulated"] or v["rows"][0]["simulated"]
            row["estimators"][est].update(mu_sim=simv, err_sim=(simv - meas) / meas)
            if est == "cycle":
                row["itl_cv"] = cal["itl_cv"]
                row["linear"] = cal["linear"]
                lin_cal = cal
        saved = sd / "calibration.yaml"
        try:  # the frontend latency, measured again on the probe's isolated requests
            lin_cal["frontend_latency_s"] = frontend_latency(sd / "probe", lin_cal)["frontend_latency_s"]
        except (InputError, FileNotFoundError) as e:  # no usable probe: as vllm_fidelity.py measured it
            print(f"{sd.name}: {e}; frontend latency as saved", file=sys.stderr)
            if saved.exists():
                lin_cal["frontend_latency_s"] = load_calibration(saved).get("frontend_latency_s")
        row["frontend_latency_s"] = lin_cal.get("frontend_latency_s")
        row["speed_sd"] = lin_cal.get("speed_sd")
        if lin_cal.get("step_time_linear"):
            for key, dr in (("linear_sim", None), ("linear_sim_nodrift", 0.0)):  # None: the calibrated drift
                v = validate(sd / "sat", lin_cal, horizon_s=sat_end, step_model="linear", speed_band=0.0, drift=dr)
                simv = v["capacity"]["simulated"] or v["rows"][0]["simulated"]
                row[key] = {"mu_sim": simv, "err_sim": (simv - row["mu_measured"]) / row["mu_measured"]}
        # other step-model fits: the saturation run's steps joined by a low-load run's
        # (vllm_fidelity.py --lowload), by the probe's isolated requests (lone prefills, decodes
        # of 1), or by the other shapes' saturation runs
        extra_cals = {}
        for name in EXTRA_FITS:
            # pooled: the step time is the engine's, not the workload's; the other shapes'
            # saturation runs on the same server cover compositions this shape's run hardly samples
            extra = ([o / "sat" for o in shape_dirs if o != sd and (o / "sat" / "steps.parquet").exists()]
                     if name == "pooled" else [sd / name] if (sd / name / "steps.parquet").exists() else [])
            if extra:
                xc = calibrate(sd / "sat", capacity_tokens=M, estimator="cycle", window=window,
                               steps_from=extra).to_dict()
                xc["frontend_latency_s"] = lin_cal.get("frontend_latency_s")
                v = validate(sd / "sat", xc, horizon_s=sat_end, step_model="linear", speed_band=0.0)
                simv = v["capacity"]["simulated"] or v["rows"][0]["simulated"]
                row[f"{name}_sim"] = {"mu_sim": simv, "err_sim": (simv - row["mu_measured"]) / row["mu_measured"],
                                      "linear": xc["linear"]}
                extra_cals[name] = xc
        runs = {}
        sat_steps = read_run(sd / "sat").steps
        dirs = [(f, sd / f"x{f}") for f in FACTORS]
        dirs += [(f, d) for f in FACTORS for d in sorted(sd.glob(f"x{f}-r*"))]  # repetitions (--repeat)
        dirs += [(f, d) for f in FACTORS for d in sorted(sd.glob(f"x{f}-s*"))]  # replays (--repeat --same-seed)
        for f, d in dirs:
            if not d.is_dir():
                continue
            # each run's own arrival period (its last intended arrival), else --run-s
            horizon = a.run_s
            if (d / "workload.parquet").exists():
                import pyarrow.parquet as pq

                horizon = float(max(pq.read_table(d / "workload.parquet", columns=["arrival_s"])["arrival_s"].to_pylist()))
            v = validate(d, lin_cal, horizon_s=horizon, speed_band=0.0)
            vl = validate(d, lin_cal, horizon_s=horizon, step_model="linear") if lin_cal.get("step_time_linear") else None
            r = {"lam": v["lam"], "verdicts": v["verdicts"], "horizon_s": horizon}
            if vl is not None:
                r["verdict_sim_linear"] = vl["verdicts"]["simulated"]
                r["latency_linear"] = {x["quantity"]: [x["measured"], x["simulated"], x["rel_err_sim"],
                                                       x.get("band"), x.get("in_band")]
                                       for x in vl["rows"] if x["quantity"] in LAT}
                r["speed_band"] = vl["speed_band"]
                r["drift"] = vl["drift"]
                # the same prediction without the engine's speed drift (a steady engine)
                vn = validate(d, lin_cal, horizon_s=horizon, step_model="linear", speed_band=0.0, drift=0.0)
                r["latency_nodrift"] = {x["quantity"]: [x["measured"], x["simulated"], x["rel_err_sim"]]
                                        for x in vn["rows"] if x["quantity"] in LAT}
                # diagnosis, not prediction: the same simulation at the speed the engine had in
                # this run (its step log against the calibrated model)
                vd = validate(d, lin_cal, horizon_s=horizon, step_model="linear", speed_factor="run", speed_band=0.0)
                r["run_speed"] = vd["speed_factor"]
                # the same ratio without the model: the run's steps against the whole saturation run's
                # (ramp, saturation and drain) of the same composition (near 1 while run_speed is
                # not: the step model's error, not the engine's speed)
                ms = matched_speed(read_run(d).steps, sat_steps) if sat_steps is not None else None
                r["matched_speed"] = ms
                r["latency_at_run_speed"] = {x["quantity"]: [x["measured"], x["simulated"], x["rel_err_sim"]]
                                             for x in vd["rows"] if x["quantity"] in LAT}
            r["latency_constant_b"] = {x["quantity"]: [x["measured"], x["simulated"], x["rel_err_sim"]]
                                       for x in v["rows"] if x["quantity"] in LAT}
            for name, xc in extra_cals.items():
                if f <= 0.8:
                    vw = validate(d, xc, horizon_s=horizon, step_model="linear")
                    r[f"latency_{name}"] = {x["quantity"]: [x["measured"], x["simulated"], x["rel_err_sim"],
                                                            x.get("band"), x.get("in_band")]
                                            for x in vw["rows"] if x["quantity"] in LAT}
            r["factor"] = f
            runs[d.name[1:]] = r
        row["runs"] = runs
        row["mu_measured_batch_means"], row["mu_measured_ci95"] = completion_rate_ci(sd / "sat", window)
        out[sd.name] = row
    if a.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    for name, row in out.items():
        lo, hi = row["mu_measured_ci95"]
        print(f"\n## {name}: measured capacity {row['mu_measured']:.3f} req/s over [{row['window'][0]:g}, {row['window'][1]:.0f}) s "
              f"(batch means: 95% CI {lo:.3f} to {hi:.3f}), M = {row['M']}, inter-token CV {row['itl_cv']:.2f}, frontend latency "
              + ("-" if row.get("frontend_latency_s") is None else f"{1e3 * row['frontend_latency_s']:.1f} ms")
              + ("" if row.get("speed_sd") is None else f", engine speed sd {row['speed_sd']:.3f} (10-s windows)"))
        print("| b-bar estimator | b (ms) | theory mu, E[g] in tokens | err | theory mu, paged E[g] | err | "
              "simulated mu (constant b) | err |")
        print("|---|---|---|---|---|---|---|---|")
        for est, e in row["estimators"].items():
            print(f"| {est} | {1e3 * e['b']:.1f} | {e['mu_theory_tokens']:.3f} | {100 * e['err_theory_tokens']:+.1f}% | "
                  f"{e['mu_theory_paged']:.3f} | {100 * e['err_theory_paged']:+.1f}% | "
                  f"{e['mu_sim']:.3f} | {100 * e['err_sim']:+.1f}% |")
        if "linear_sim" in row:
            ls = row["linear_sim"]
            print(f"| linear step model (R2 {row['linear']['r2']:.2f}) | - | - | - | - | - | {ls['mu_sim']:.3f} | "
                  f"{100 * ls['err_sim']:+.1f}% |")
            ln = row["linear_sim_nodrift"]
            print(f"| linear step model, no drift | - | - | - | - | - | {ln['mu_sim']:.3f} | {100 * ln['err_sim']:+.1f}% |")
        print("\n| load | lam | window (s) | measured | simulated (cycle b) | simulated (linear) | theory (cycle b, paged) |")
        print("|---|---|---|---|---|---|---|")
        for f, r in row["runs"].items():
            v = r["verdicts"]
            print(f"| {f} | {r['lam']:.2f} | {a.warmup_s:g}-{r['horizon_s']:g} | {v['measured']} | {v['simulated']} | "
                  f"{r.get('verdict_sim_linear', '-')} | {v['theory']} |")
        same = by_load(row["runs"], "latency_linear", lambda key, r: key == f"{r['factor']}" or "-s" in key)
        if any(len(v) > 1 for v in same.values()):
            print("\n| load | quantity | identical-input runs | measured, in run order | measured max / min | "
                  "simulated (linear), errors |")
            print("|---|---|---|---|---|---|")
            for (f, q), v in sorted(same.items()):
                ms = [x[0] for x in v]
                print(f"| {f} | {q} | {len(v)} | " + ", ".join(f"{m:,.1f}" for m in ms)
                      + f" | {max(ms) / min(ms):.2f} | " + ", ".join(f"{x[1]:,.1f} ({100 * x[2]:+.0f}%)" for x in v) + " |")
        reps = by_load(row["runs"], "latency_linear", lambda key, r: "-s" not in key)
        if any(len(v) > 1 for v in reps.values()):
            print("\n| load | quantity | runs | measured (min-max) | within 20 % (linear + frontend) | errors | "
                  "in the engine-speed band |")
            print("|---|---|---|---|---|---|---|")
            for (f, q), v in sorted(reps.items()):
                ms = [x[0] for x in v]
                ok = sum(1 for x in v if x[2] is not None and abs(x[2]) <= 0.2)
                inb = sum(1 for x in v if x[4])
                print(f"| {f} | {q} | {len(v)} | {min(ms):,.1f}-{max(ms):,.1f} | {ok} of {len(v)} | "
                      + ", ".join(f"{100 * x[2]:+.0f}%" for x in v) + f" | {inb} of {len(v)} |")
        speeds = [(k, r["run_speed"], r.get("matched_speed")) for k, r in row["runs"].items() if r.get("run_speed")]
        if speeds:
            print("\n| run | engine speed against the step model (run_speed) | against the saturation run's steps "
                  "of the same composition (matched_speed) | matched cells, share of the run's steps |")
            print("|---|---|---|---|")
            for k, rs, ms in speeds:
                print(f"| x{k} | {rs:.3f} | " + ("- | -" if not ms else f"{ms['speed']:.3f} (cells' IQR "
                      f"{ms['ratios_iqr'][0]:.2f}-{ms['ratios_iqr'][1]:.2f}) | {ms['cells']}, {100 * ms['share']:.0f} %") + " |")
        diag = by_load(row["runs"], "latency_at_run_speed", with_speed=True)
        if diag:
            print("\n| load | quantity | runs | within 20 % at the run's own engine speed | errors (speed) |")
            print("|---|---|---|---|---|")
            for (f, q), v in sorted(diag.items()):
                ok = sum(1 for _, _, x in v if x[2] is not None and abs(x[2]) <= 0.2)
                print(f"| {f} | {q} | {len(v)} | {ok} of {len(v)} | "
                      + ", ".join(f"{100 * x[2]:+.0f}% (x{sp:.2f})" for _, sp, x in v) + " |")
        for name, what in EXTRA_FITS.items():
            if f"{name}_sim" not in row:
                continue
            ls, lin = row[f"{name}_sim"], row[f"{name}_sim"]["linear"]
            print(f"\nStep model fitted on the saturation run's and the {what}: c0={lin['c0']:.4g} "
                  f"prefill={lin['prefill']:.3g} decode={lin['decode']:.3g} ctx={lin['ctx']:.3g} (R2 {lin['r2']:.2f}); "
                  f"simulated capacity {ls['mu_sim']:.3f} ({100 * ls['err_sim']:+.1f}%)")
            print(f"\n| load | quantity | measured | simulated (linear, saturation + {name} steps) | err | "
                  "band (engine +-2 sd) |")
            print("|---|---|---|---|---|---|")
            ok = {}
            for f, r in row["runs"].items():
                for q, x in r.get(f"latency_{name}", {}).items():
                    bd = "-" if not x[3] else f"{x[3][0]:,.1f}-{x[3][1]:,.1f}" + ("" if x[4] else " (outside)")
                    print(f"| {f} | {q} | {x[0]:,.1f} | {x[1]:,.1f} | {100 * x[2]:+.0f}% | {bd} |")
                    t = ok.setdefault(r["factor"], [0, 0])
                    t[0] += x[2] is not None and abs(x[2]) <= 0.2
                    t[1] += 1
            print("\nWithin 20 %: " + "; ".join(f"{f}x {k} of {n}" for f, (k, n) in sorted(ok.items())))
        print("\n| load | quantity | measured | simulated (linear, drift) | err | band (engine +-2 sd) | "
              "simulated (linear, no drift) | err | simulated (cycle b) | err |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        tally: dict = {}
        for f, r in row["runs"].items():
            if r["factor"] > 0.8:
                continue
            for q in LAT:
                lm = r.get("latency_linear", {}).get(q, [None, None, None, None, None])
                nm = r.get("latency_nodrift", {}).get(q, [None, None, None])
                cm = r["latency_constant_b"][q]
                for kind, x in (("drift", lm), ("no drift", nm)):
                    t = tally.setdefault((r["factor"], kind), [0, 0])
                    t[0] += x[2] is not None and abs(x[2]) <= 0.2
                    t[1] += 1
                fmt = lambda x: "-" if x is None else f"{x:,.1f}"  # noqa: E731
                pe = lambda x: "-" if x is None else f"{100 * x:+.0f}%"  # noqa: E731
                bd = "-" if not lm[3] else f"{lm[3][0]:,.1f}-{lm[3][1]:,.1f}" + ("" if lm[4] else " (outside)")
                print(f"| {f} | {q} | {fmt(cm[0])} | {fmt(lm[1])} | {pe(lm[2])} | {bd} | {fmt(nm[1])} | {pe(nm[2])} | "
                      f"{fmt(cm[1])} | {pe(cm[2])} |")
        if tally:
            print("\nWithin 20 % (linear step model + frontend delay): " + "; ".join(
                f"{f}x {kind} {ok} of {n}" for (f, kind), (ok, n) in sorted(tally.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
