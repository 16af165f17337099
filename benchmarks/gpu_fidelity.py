"""Fidelity on a GPU: profile, saturate, load and predict an engine serving Llama-3.1-8B's shape.

Two halves, because a lent GPU machine has minutes and no network:

``run`` (on the GPU machine, one call, about six minutes; ``benchmarks/gpu_fidelity.sh`` is the
whole device command): starts ``benchmarks/hf_server.py`` (transformers' continuous batching
behind vLLM's OpenAI API, a random-weight Llama-3.1-8B in bf16 built on the device, its step log
in vLLM's iteration-detail format) and, against it, with llmqueue's own client:

1. a warm-up (16 requests, not kept);
2. ``llmqueue profile`` (decode ladders 1, 2, 4, ... max_num_seqs at two prompt lengths, prefill
   probes; within ``--profile-budget`` seconds);
3. a saturation run: Poisson arrivals at twice the capacity the profile implies, at most
   ``--sat-concurrency`` requests at the server (a waiting line there, a backlog at the client);
4. the capacity mu measured over its saturated part (after warm-up, up to the last send);
5. load runs at 0.5x and 0.8x of mu (and 1.2x when time is left), Poisson with the exact rate;

each run directory holding the engine settings (``server.json``, from the server's flags), the
step records from the server's log, and the requests and tokens. After every stage the whole
output folder is packed again into ``$OUT/gpu_run.tar.gz``, so a run cut short returns what it
measured. A deadline (``--deadline-s``) drops the stages that would not fit.

``analyze RUN`` (here, on the CPU): calibrates from the saturation run plus the profile (the
profile gives the shape, the run the level), predicts the capacity (simulator, theory) and each
load run's TTFT and TPOT (p50, p99) with the constant b, the linear and the profile step models,
and compares llmqueue's roofline model for H100 + Llama-3.1-8B with the measured decode steps.
Writes ``RUN/gpu_fidelity.json`` and prints the tables ``docs/benchmarks.md`` quotes.

Usage:
  python benchmarks/gpu_fidelity.py run --out /tmp/gpu [--device cuda] [--model llama-3.1-8b]
  python benchmarks/gpu_fidelity.py analyze runs/gpu_h100
CPU rehearsal (the same code path on a tiny model; minutes):
  python benchmarks/gpu_fidelity.py run --out /tmp/gpu --device cpu --model tiny:256x2 --dtype fp32 --small
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PROMPT, OUTPUT = "uniform:32:1024", "uniform:32:256"  # mean 528 prompt and 144 output tokens
SERVER = dict(max_num_seqs=32, max_num_batched_tokens=512, block_size=256, num_blocks=512, max_model_len=4096)
VOCAB = 128256
WARMUP_S = 10.0
LOAD_S = {0.5: 75.0, 0.8: 70.0, 1.2: 50.0}  # arrival period per load factor
LATENCY_FACTORS = (0.5, 0.8)
SEED = 11


def server_flags(s: dict = SERVER) -> dict:
    """The engine's settings under llmqueue's names (what ``--server-*`` flags record). The cache
    is ``num_blocks`` blocks (transformers keeps no null block: usable is ``num_blocks x
    block_size``, vLLM's rule subtracts one block, which never binds here)."""
    return {"max_num_seqs": s["max_num_seqs"], "max_num_batched_tokens": s["max_num_batched_tokens"],
            "block_size": s["block_size"], "max_model_len": s["max_model_len"], "num_gpu_blocks": s["num_blocks"],
            "enable_chunked_prefill": True}


class HfServer:
    """``benchmarks/hf_server.py`` in a subprocess (a context manager): ``url``, ``model``, ``log_path``."""

    def __init__(self, *, model: str, device: str, dtype: str, port: int, log_path: Path, err_path: Path,
                 start_timeout_s: float = 300.0, settings: dict = SERVER):
        self.model = "llama-3.1-8b-random" if model == "llama-3.1-8b" else model
        self.log_path = log_path
        log_path.touch()
        cmd = [sys.executable, str(HERE / "hf_server.py"), "--model", model, "--served-model-name", self.model,
               "--device", device, "--dtype", dtype, "--port", str(port), "--step-log", str(log_path),
               "--max-num-seqs", str(settings["max_num_seqs"]),
               "--max-num-batched-tokens", str(settings["max_num_batched_tokens"]),
               "--block-size", str(settings["block_size"]), "--num-blocks", str(settings["num_blocks"]),
               "--max-model-len", str(settings["max_model_len"])]
        self.err = open(err_path, "w")
        t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True)
        from hf_server import READY_PREFIX

        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.close()
                raise SystemExit(f"the server exited before it was ready; see {err_path}")
            if line.startswith(READY_PREFIX):
                self.url = line[len(READY_PREFIX):].strip()
                break
            if time.time() - t0 > start_timeout_s:
                self.close()
                raise SystemExit(f"the server was not ready in {start_timeout_s:.0f} s")
        self.startup_s = time.time() - t0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.err.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pack(out: Path, dest: Path | None) -> None:
    """The output folder as ``dest/gpu_run.tar.gz`` (written beside, then renamed: never half a file)."""
    if dest is None:
        return
    tmp = dest / "gpu_run.tar.gz.part"
    with tarfile.open(tmp, "w:gz") as t:
        t.add(out, arcname=out.name)
    os.replace(tmp, dest / "gpu_run.tar.gz")


def environment(device: str) -> dict:
    """What the run ran on: the machine, the GPU, the library versions, the date."""
    import platform

    import torch
    import transformers

    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__, "cpus": os.cpu_count(),
           "device": device}
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=p.total_memory / 2 ** 30, sms=p.multi_processor_count,
                   cuda=torch.version.cuda)
        try:
            env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                                                "clocks.max.sm,power.limit", "--format=csv"], capture_output=True,
                                               text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = f"unavailable: {e}"
    return env


def capacity_guess(profile_dir: Path, seqs: int) -> float:
    """mu from the profile alone, for the saturation run's arrival rate: ``seqs`` sequences decode
    at the profile's step time of its largest batch (longest context), each request holding a
    slot for its mean output plus its prefill chunks (Little's law on the running set)."""
    from llmqueue.workload import parse_length

    doc = json.loads((profile_dir / "profile.json").read_text())
    cells = [c for c in doc["decode"] if c.get("median_s")]
    top = max(c["batch"] for c in cells)
    b = max(c["median_s"] for c in cells if c["batch"] == top)
    Eo = float(parse_length(OUTPUT).mean())
    Es = float(parse_length(PROMPT).mean())
    steps = Eo + Es / SERVER["max_num_batched_tokens"]
    return seqs / (b * steps)


def measured_capacity(run_dir: Path, window) -> float:
    """Completions per second in ``window`` (the saturated part of a run): the run's summary
    over that window (:func:`llmqueue.metrics.summarize`)."""
    from llmqueue.metrics import summarize
    from llmqueue.records import read_run

    return float(summarize(read_run(run_dir).requests, warmup_s=window[0], horizon_s=window[1])["request_throughput"])


def run(a) -> int:
    """The GPU half (see the module docstring)."""
    import vllm_fidelity as vf

    from llmqueue.bench.calibrate import last_send_s
    from llmqueue.bench.client import run_bench
    from llmqueue.workload import Workload

    t_begin = time.time()
    deadline = t_begin + a.deadline_s
    out = Path(a.out).absolute()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    dest = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    vf.MODEL["vocab_size"] = a.vocab
    knobs = dict(SERVER, num_gpu_blocks_override=SERVER["num_blocks"])
    vf.server_flags = lambda k: server_flags(SERVER)  # the settings one_run and take_profile record
    stages: dict = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "prompt": PROMPT,
                    "output": OUTPUT, "server": dict(SERVER), "argv": sys.argv[1:]}

    def note(k, v):  # a stage done: recorded, printed, and the whole folder packed again
        stages[k] = v
        (out / "stages.json").write_text(json.dumps(stages, indent=2))
        print(f"[{time.time() - t_begin:6.1f} s] {k}: {v}", flush=True)
        pack(out, dest)

    (out / "environment.json").write_text(json.dumps(environment(a.device), indent=2))
    note("environment", "written")
    with HfServer(model=a.model, device=a.device, dtype=a.dtype, port=a.port, log_path=out / "server.log",
                  err_path=out / "server.err") as srv:
        note("server_startup_s", round(srv.startup_s, 1))
        warm = Workload("poisson:1000", prompt="fixed:512", output="fixed:32").generate(SEED + 1, n=16)
        t = time.time()
        run_bench(srv.url, srv.model, warm, vocab_size=a.vocab, concurrency=16)
        note("warmup_s", round(time.time() - t, 1))
        t = time.time()
        prof = vf.take_profile(srv, out / "profile", knobs=knobs, contexts=a.profile_contexts,
                               output_tokens=a.profile_output_tokens, budget_s=a.profile_budget, passes=a.profile_passes)
        note("profile", {"elapsed_s": round(time.time() - t, 1), "cells": prof["cells"], "skipped": prof["skipped"]})
        mu_guess = capacity_guess(out / "profile", SERVER["max_num_seqs"])
        lam_sat = 2.0 * mu_guess
        note("mu_guess", round(mu_guess, 3))
        reqs = Workload(f"poisson:{lam_sat}", prompt=PROMPT, output=OUTPUT).generate(SEED, duration=a.sat_s)
        t = time.time()
        vf.one_run(srv, out / "sat", reqs, warmup_s=WARMUP_S, knobs=knobs, concurrency=a.sat_concurrency,
                   drain_timeout_s=a.sat_drain_s)
        window = (WARMUP_S, last_send_s(out / "sat"))
        mu = measured_capacity(out / "sat", window)
        note("sat", {"elapsed_s": round(time.time() - t, 1), "lam_sat": lam_sat, "n": len(reqs.request_id),
                     "window": window, "mu_measured": mu})
        for f in (0.5, 0.8, 1.2):
            need = LOAD_S[f] + 25.0
            if time.time() + need > deadline:
                note(f"x{f}", f"skipped: {deadline - time.time():.0f} s left, needs about {need:.0f}")
                continue
            lam = f * mu
            reqs = vf.exact_rate_stream(lam, PROMPT, OUTPUT, SEED + int(100 * f), LOAD_S[f])
            t = time.time()
            vf.one_run(srv, out / f"x{f}", reqs, warmup_s=WARMUP_S, knobs=knobs,
                       drain_timeout_s=max(5.0, min(60.0, deadline - time.time() - LOAD_S[f] - 5.0)))
            note(f"x{f}", {"elapsed_s": round(time.time() - t, 1), "lam": lam, "n": len(reqs.request_id)})
    note("done_s", round(time.time() - t_begin, 1))
    return 0


def capacity_by_model(run_dir: Path, c: dict, window, mu: float) -> dict:
    """The saturation run's capacity predicted with calibration ``c`` by step model (constant b,
    linear, profile): simulated and theory, each with its error against the measured ``mu``."""
    from llmqueue.bench.validate import validate

    out = {}
    for name in ("constant_b", "linear", "profile"):
        kw = {} if name == "constant_b" else {"step_model": name}
        if name != "constant_b" and not c.get(f"step_time_{name}"):
            continue
        v = validate(run_dir / "sat", c, horizon_s=window[1], speed_band=0.0, **kw)
        mu_sim = v["capacity"].get("simulated") or v["rows"][0]["simulated"]
        out[name] = {"mu_sim": mu_sim, "err_sim": (mu_sim - mu) / mu, "mu_theory": v["capacity"]["theory"],
                     "err_theory": (v["capacity"]["theory"] - mu) / mu}
    return out


def analyze(a) -> int:
    """The CPU half (see the module docstring)."""
    import vllm_fidelity as vf

    from llmqueue.bench.calibrate import calibrate, load_calibration, write_calibration
    from llmqueue.engine.step_time import parse_step_time, roofline_model

    run_dir = Path(a.run)
    stages = json.loads((run_dir / "stages.json").read_text())
    sat = stages["sat"]
    window = tuple(sat["window"])
    cal = calibrate(run_dir / "sat", capacity_tokens=None, window=window, profile=run_dir / "profile")
    write_calibration(cal, run_dir / "calibration.yaml")
    c = load_calibration(run_dir / "calibration.yaml")
    c["capacity_tokens"] = json.loads((run_dir / "sat" / "server.json").read_text())["M_usable"]
    res: dict = {"environment": json.loads((run_dir / "environment.json").read_text()), "stages": stages,
                 "b": cal.b, "step_time_linear": c.get("step_time_linear"),
                 "step_time_profile": c.get("step_time_profile"), "capacity": {}, "loads": {}}
    mu = sat["mu_measured"]
    res["capacity"] = {**capacity_by_model(run_dir, c, window, mu), "mu_measured": mu}
    for f in (0.5, 0.8, 1.2):
        d = run_dir / f"x{f}"
        if not (d / "requests.parquet").exists():
            continue
        lam = stages[f"x{f}"]["lam"]
        res["loads"][str(f)] = vf.judge_load(d, c, lam=lam, horizon=vf.last_arrival_s(d), step_model="profile", margin=a.margin,
                                             verdict_copies=vf.VERDICT_COPIES)
    # the roofline model against the measured decode steps (the profile's cells)
    prof = json.loads((run_dir / "profile" / "profile.json").read_text())
    roof = roofline_model("llama-3.1-8b", "h100-sxm")
    pm = parse_step_time(c["step_time_profile"]) if c.get("step_time_profile") else None
    rows = []
    for cell in prof["decode"]:
        if not cell.get("median_s"):
            continue
        n = cell["batch"]
        ctx = int(round(n * cell["context_tokens"]))  # the step's total context (the cell's is per sequence)
        rows.append({"batch": n, "prompt_tokens": cell["prompt_tokens"], "measured_ms": 1e3 * cell["median_s"],
                     "roofline_ms": 1e3 * roof.base(0, n, ctx),
                     "profile_model_ms": 1e3 * pm.base(0, n, ctx) if pm is not None else None})
    res["roofline"] = {"spec": roof.spec, "rows": rows}
    (run_dir / "gpu_fidelity.json").write_text(json.dumps(res, indent=2, default=float))
    print(json.dumps({k: res[k] for k in ("capacity",)}, indent=2, default=float))
    for f, rr in res["loads"].items():
        print(f"x{f}: measured {rr['measured_verdict']} | sim {rr.get('model_verdict', {}).get('simulated')} | "
              f"theory {rr['theory_verdict']}")
        for name in ("constant_b", "linear", "profile"):
            if name in rr:
                print("  ", name, {q: (round(v["measured"], 4), round(v["simulated"], 4), f"{100 * v['rel_err']:+.1f}%")
                                   for q, v in rr[name].items() if q in vf.LAT and v["measured"] is not None})
    for r in rows:
        print(f"decode n={r['batch']:3d} prompt={r['prompt_tokens']:5d}: measured {r['measured_ms']:7.2f} ms, "
              f"roofline {r['roofline_ms']:7.2f} ms")
    return 0


def cross(a) -> int:
    """``RUN``'s measurements predicted from ``--calibration-from OTHER``'s calibration alone (another
    GPU run: another machine of the same kind, another output-length mix): capacity from the
    saturation run and the load runs' latencies, by step model."""
    import vllm_fidelity as vf

    from llmqueue.bench.calibrate import load_calibration

    run_dir, other = Path(a.run), Path(a.calibration_from)
    stages = json.loads((run_dir / "stages.json").read_text())
    c = load_calibration(other / "calibration.yaml")
    c["capacity_tokens"] = json.loads((run_dir / "sat" / "server.json").read_text())["M_usable"]
    window = tuple(stages["sat"]["window"])
    mu = stages["sat"]["mu_measured"]
    res: dict = {"run": str(run_dir), "calibration_from": str(other), "mu_measured": mu, "capacity": {}, "loads": {}}
    res["capacity"] = capacity_by_model(run_dir, c, window, mu)
    for name, x in res["capacity"].items():
        print(f"capacity, {name}: sim {x['mu_sim']:.3f} ({100 * x['err_sim']:+.1f} %), theory "
              f"{x['mu_theory']:.3f} ({100 * x['err_theory']:+.1f} %), measured {mu:.3f}")
    for f in LATENCY_FACTORS:
        d = run_dir / f"x{f}"
        if not (d / "requests.parquet").exists():
            continue
        rr = vf.judge_load(d, c, lam=stages[f"x{f}"]["lam"], horizon=vf.last_arrival_s(d),
                           step_model="profile" if c.get("step_time_profile") else "linear", margin=None)
        res["loads"][str(f)] = rr
        for name in ("linear", "profile"):
            if name in rr:
                print(f"x{f} {name}:", ", ".join(f"{q} {100 * v['rel_err']:+.1f} %" for q, v in rr[name].items()
                                                  if q in vf.LAT and v["rel_err"] is not None))
    (run_dir / f"cross_from_{other.parent.name}.json").write_text(json.dumps(res, indent=2, default=float))
    return 0


def main(argv=None) -> int:
    global PROMPT, OUTPUT
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the GPU half: serve, profile, saturate, load, pack")
    r.add_argument("--out", default="gpu_run")
    r.add_argument("--device", default="cuda")
    r.add_argument("--model", default="llama-3.1-8b")
    r.add_argument("--dtype", default="bf16")
    r.add_argument("--port", type=int, default=8011)
    r.add_argument("--vocab", type=int, default=VOCAB)
    r.add_argument("--deadline-s", type=float, default=420.0, help="stages that would end after this are skipped")
    r.add_argument("--profile-budget", type=float, default=75.0)
    r.add_argument("--profile-contexts", type=lambda s: [int(x) for x in s.split(",")], default=[128, 1024])
    r.add_argument("--profile-output-tokens", type=int, default=64)
    r.add_argument("--profile-passes", type=int, default=2)
    r.add_argument("--sat-s", type=float, default=40.0, help="arrival period of the saturation run")
    r.add_argument("--sat-concurrency", type=int, default=48)
    r.add_argument("--sat-drain-s", type=float, default=60.0)
    r.add_argument("--prompt", default=None, help=f"prompt lengths (default {PROMPT})")
    r.add_argument("--output", default=None, help=f"output lengths (default {OUTPUT})")
    r.add_argument("--load-s", default=None, help="arrival periods, e.g. 0.5=90,0.8=80")
    r.add_argument("--small", action="store_true", help="a CPU rehearsal: short runs, a small server")
    z = sub.add_parser("analyze", help="the CPU half: calibrate, validate, compare with the roofline")
    z.add_argument("run")
    z.add_argument("--margin", type=float, default=0.10)
    x = sub.add_parser("cross", help="predict a run from another run's calibration (run analyze on both first)")
    x.add_argument("run")
    x.add_argument("--calibration-from", required=True, help="the other run's folder (its calibration.yaml)")
    a = p.parse_args(argv)
    if a.cmd == "analyze":
        return analyze(a)
    if a.cmd == "cross":
        return cross(a)
    if a.small:
        PROMPT, OUTPUT = "uniform:8:128", "uniform:8:48"
        SERVER.update(max_num_seqs=8, max_num_batched_tokens=128, block_size=32, num_blocks=128, max_model_len=512)
        LOAD_S.update({0.5: 30.0, 0.8: 30.0, 1.2: 20.0})
        a.vocab = 4096
        a.profile_contexts = [16, 128]
        a.profile_output_tokens = 16
        a.profile_passes = 1
        a.sat_concurrency = 12
    if a.prompt:
        PROMPT = a.prompt
    if a.output:
        OUTPUT = a.output
    if a.load_s:
        LOAD_S.update({float(k): float(v) for k, v in (x.split("=") for x in a.load_s.split(","))})
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
