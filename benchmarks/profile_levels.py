"""The default profile against a saturation run, per batch, and twice: issue 36's profile bars.

On one vLLM CPU server (``scripts/vllm_cpu_env.sh``; the fidelity protocol's settings and tiny
random-weight Llama, ``--model``):

1. a concurrency-capped saturation run of ``--shape`` (``vllm_fidelity.py``'s step 1);
2. profile A: ``llmqueue profile`` exactly as the README runs it (its defaults; the server's log
   and launch flags given, as a user gives them);
3. a low-load run at 0.5 x the measured capacity (150 s of Poisson arrivals);
4. profile B of the same server, minutes after A (the low-load run between them);
5. for each profile: ``calibrate --profile`` on the saturation run (the profile's surface at the
   run's level, one factor) and, at every decode batch the saturation run holds (decode-only
   steps, >= ``--min-steps`` of them), the run's busy step cycles over the calibrated profile's
   price of the same steps: the *level error at that batch* (0 where one factor is right at every
   batch); beside it the profile's own level at that batch (unscaled: the engine's speed between
   the run and the profile is in it); then ``validate --step-model profile`` on the low-load run:
   TPOT p50/p99 simulated against measured.

Bars (issue 36): the level error within 10 % at every batch, for each profile; low-load TPOT
within 10 % of the measured with either profile (and the two predictions within 10 % of each
other). Writes ``OUT/levels.json`` and prints a markdown table.

Usage: python benchmarks/profile_levels.py [--model 1024x8] [--shape balanced] [--out runs/profile-levels]
       [--analyze-only]
Needs: bash scripts/vllm_cpu_env.sh (the vLLM CPU venv). Loopback only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_fidelity as vf  # noqa: E402  (the protocol's server, saturation and run helpers)

BAR = 0.10
LOWLOAD_FACTOR = 0.5
LOWLOAD_S = 150.0


def profile_cli(srv, out_dir: Path, log: Path) -> float:
    """``llmqueue profile`` with its defaults against the running server; returns its wall seconds."""
    exe = Path(sys.executable).with_name("llmqueue")
    k = vf.SERVER
    cmd = [str(exe), "profile", "--url", srv.url, "--out", str(out_dir), "--server-log", str(log),
           "--server-max-num-seqs", str(k["max_num_seqs"]), "--server-max-num-batched-tokens",
           str(k["max_num_batched_tokens"]), "--server-block-size", str(k["block_size"]),
           "--server-max-model-len", str(k["max_model_len"]), "--server-num-gpu-blocks", str(k["num_gpu_blocks_override"]),
           "--vocab-size", str(vf.MODEL["vocab_size"])]
    t = time.monotonic()
    print("  $ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    return time.monotonic() - t


def per_batch_levels(run_dir: Path, prof: Path, window, scale: float, block: int, min_steps: int) -> list[dict]:
    """At each decode-only batch of the run: the profile's own level there (run cycles over its
    price) and the calibrated model's error there (that level over the calibration's one factor)."""
    import numpy as np

    from llmqueue.bench.calibrate import profile_level
    from llmqueue.engine.profile_step import load_profile_model
    from llmqueue.records import read_run

    steps = read_run(run_dir).steps
    pm = load_profile_model(prof, field="profile")
    d = np.asarray(steps["decode_seqs"], dtype=np.int64)
    pre = np.asarray(steps["prefill_tokens"], dtype=np.int64)
    top = max(int(c["batch"]) for c in json.loads((prof / "profile.json").read_text())["decode"])
    out = []
    for n in sorted(set(d[(pre == 0) & (d > 0)].tolist())):
        lev, k = profile_level(steps, pm, window, block_size=block, decode_only=True, batch=n)
        if k < min_steps or not np.isfinite(lev):
            continue
        out.append({"batch": n, "steps": k, "own_level": lev, "err": lev / scale - 1.0, "measured_by_profile": n <= top})
    return out


def analyze(out: Path, window, min_steps: int) -> dict:
    from llmqueue.bench.calibrate import calibrate, load_calibration, write_calibration
    from llmqueue.bench.validate import validate

    res = {"window": list(window), "profiles": {}}
    low = out / f"x{LOWLOAD_FACTOR}"
    for name in ("a", "b"):
        prof = out / f"profile-{name}"
        cal = calibrate(out / "sat", window=tuple(window), profile=prof)
        write_calibration(cal, out / f"calibration-{name}.yaml")
        c = load_calibration(out / f"calibration-{name}.yaml")
        c["capacity_tokens"] = json.loads((out / "sat" / "server.json").read_text())["M_usable"]
        levels = per_batch_levels(out / "sat", prof, window, cal.profile_scale, cal.block_size, min_steps)
        doc = json.loads((prof / "profile.json").read_text())
        row = {"scale": cal.profile_scale, "levels": levels,
               "max_abs_err": max(abs(x["err"]) for x in levels) if levels else None,
               "profile_batches": sorted({int(c["batch"]) for c in doc["decode"]}),
               "profile_elapsed_s": doc.get("elapsed_s"), "repeat_spread": doc.get("repeat_spread"),
               "notes": [n for n in cal.notes if n.startswith("step_time")]}
        if low.exists():
            v = validate(low, c, step_model="profile", speed_band=0.0)
            rows = {r["quantity"]: r for r in v["rows"]}
            row["lowload"] = {q: {"measured": rows[q]["measured"], "simulated": rows[q]["simulated"],
                                  "err": rows[q]["rel_err_sim"]} for q in ("median_tpot_ms", "p99_tpot_ms") if q in rows}
        res["profiles"][name] = row
    a, b = res["profiles"]["a"], res["profiles"]["b"]
    if "lowload" in a and "lowload" in b:
        pa, pb = a["lowload"]["median_tpot_ms"]["simulated"], b["lowload"]["median_tpot_ms"]["simulated"]
        res["lowload_between_profiles"] = abs(pa - pb) / min(pa, pb)
    res["pass"] = {
        "level_every_batch": all(r["max_abs_err"] is not None and r["max_abs_err"] <= BAR for r in (a, b)),
        "lowload_tpot": all("lowload" in r and abs(r["lowload"]["median_tpot_ms"]["err"]) <= BAR for r in (a, b)),
        "between_profiles": res.get("lowload_between_profiles", 1.0) <= BAR}
    return res


def text(res: dict) -> str:
    lines = ["| profile | scale | batches profiled | max abs level error | low-load TPOT p50 meas / sim (err) |",
             "|---|---|---|---|---|"]
    for name, r in res["profiles"].items():
        lo = r.get("lowload", {}).get("median_tpot_ms")
        lt = f"{lo['measured']:.2f} / {lo['simulated']:.2f} ({lo['err']:+.1%})" if lo else "-"
        lines.append(f"| {name} | x{r['scale']:.4f} | {r['profile_batches']} | "
                     f"{r['max_abs_err']:.1%} | {lt} |")
    lines += ["", "| batch | steps | " + " | ".join(f"{n}: own level, err" for n in res["profiles"]) + " |",
              "|---|---|" + "---|" * len(res["profiles"])]
    by = {n: {x["batch"]: x for x in r["levels"]} for n, r in res["profiles"].items()}
    for batch in sorted(set().union(*[set(v) for v in by.values()])):
        cells = []
        for n in by:
            x = by[n].get(batch)
            cells.append(f"x{x['own_level']:.3f}, {x['err']:+.1%}" + ("" if x["measured_by_profile"] else " (beyond)")
                         if x else "-")
        steps = next(by[n][batch]["steps"] for n in by if batch in by[n])
        lines.append(f"| {batch} | {steps} | " + " | ".join(cells) + " |")
    if "lowload_between_profiles" in res:
        lines.append(f"\nlow-load TPOT p50 between the two profiles: {res['lowload_between_profiles']:.1%}")
    lines.append("pass: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in res["pass"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="1024x8")
    ap.add_argument("--shape", default="balanced", choices=sorted(vf.SHAPES))
    ap.add_argument("--sat-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-steps", type=int, default=40, help="decode-only steps a batch needs to be judged")
    ap.add_argument("--out", default="runs/profile-levels")
    ap.add_argument("--analyze-only", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta_p = out / "meta.json"
    if not a.analyze_only:
        from llmqueue.bench.calibrate import calibrate, load_calibration, write_calibration
        from llmqueue.bench.validate import validate

        model_dir, work, version = vf.engine_setup(a.model)
        p, o = vf.SHAPES[a.shape]
        opts = SimpleNamespace(sat_s=a.sat_s, b_guess=0.03, warmup_s=vf.RUN_WARMUP_S, sat_concurrency=vf.SAT_CONCURRENCY)
        meta = {"model": a.model, "shape": a.shape, "vllm": version, "started": time.strftime("%Y-%m-%d %H:%M")}
        log = out / "server.log"
        with vf.open_server(model_dir, work, log) as srv:
            print("saturation run ...", file=sys.stderr, flush=True)
            lam_sat, window = vf.saturate(srv, out / "sat", opts, p, o, a.seed)
            meta.update(lam_sat=lam_sat, window=list(window))
            meta["profile_a_s"] = profile_cli(srv, out / "profile-a", log)
            meta["profile_a_end"] = time.time()
            cal = calibrate(out / "sat", window=window)
            write_calibration(cal, out / "calibration-linear.yaml")
            c = load_calibration(out / "calibration-linear.yaml")
            c["capacity_tokens"] = json.loads((out / "sat" / "server.json").read_text())["M_usable"]
            mu = vf.capacity(validate(out / "sat", c, horizon_s=window[1], speed_band=0.0), "measured")
            meta["mu_measured"] = mu
            lam = LOWLOAD_FACTOR * mu
            reqs = vf.exact_rate_stream(lam, p, o, a.seed + 50, LOWLOAD_S)
            print(f"low-load run at {lam:.3f} req/s ...", file=sys.stderr, flush=True)
            vf.one_run(srv, out / f"x{LOWLOAD_FACTOR}", reqs, warmup_s=vf.RUN_WARMUP_S, knobs=vf.SERVER)
            meta["profile_b_s"] = profile_cli(srv, out / "profile-b", log)
            meta["minutes_between_profiles"] = (time.time() - meta["profile_b_s"] - meta["profile_a_end"]) / 60
        meta_p.write_text(json.dumps(meta, indent=1))
    meta = json.loads(meta_p.read_text())
    res = analyze(out, meta["window"], a.min_steps)
    res["meta"] = meta
    (out / "levels.json").write_text(json.dumps(res, indent=1))
    print(text(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
