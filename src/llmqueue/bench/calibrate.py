"""Calibration: the simulator's and the theory's inputs, measured on a real (or simulated) run.

Nie et al.'s recipe needs three measured inputs: the KV capacity ``M`` (tokens), a representative
step time ``b`` and the joint (prompt, output) length distribution. From a run directory:

- ``M``: the server's ``vllm:cache_config_info`` (``num_gpu_blocks x block_size``) recorded by the
  benchmark in ``server.json``, or given by the user;
- ``b``: Nie et al. 2026 appendix C's estimators (median and alpha-trimmed means) over the decode
  inter-token latencies of the run (one sample per decoded token, from ``tokens.parquet`` or
  from step records), measured where the engine is busy; and, when step records exist, the
  mean busy step *cycle* (start to next start: 1 / steps per second), the default then. On a
  CPU engine whose prefill steps cost several decode steps the median inter-token latency is
  the decode-only step and overestimates capacity by 30-60 % (docs/benchmarks.md);
- a linear step-time model ``c0 + c_prefill P + c_decode D + c_ctx C`` by non-negative least
  squares on the per-step composition and cycle time, when step records exist (the server's
  ``--enable-logging-iteration-details`` log, or a simulated run);
- the workload: the measured (prompt, output) pairs;
- the server's delay outside the engine (``frontend_latency_s``, HTTP and streaming, added by
  ``validate`` to every simulated token): from a probe run of isolated requests (``--probe``,
  :func:`frontend_latency`), else from ``--profile``'s lone prefill probes (their TTFT less the
  logged prefill step), else from the run's own step log, per request TTFT less the engine's
  time from its arrival (:mod:`llmqueue.bench.frontend_steps`: a low-load run serves);
- the engine's speed drift: the spread (``speed_sd``) of the measured step cycles over the
  linear model's prediction for the same steps, in 10-s windows of the run. A real engine on a
  shared machine is not stationary; ``validate`` turns this into a band around each predicted
  latency (a queue near capacity amplifies a few percent of speed into tens of percent of wait).

The result is written as YAML; ``step_time:`` holds the constant-b spec the simulator reads
(``--step-time fitted:calibration.yaml``), ``step_time_linear:`` the fitted linear model when
there was one, and ``capacity_tokens:`` the KV capacity.

With a profile (``llmqueue profile``, ``profile=DIR``) the profile gives the step time's shape
over batch size and context, and the run its level: one factor, the run's busy step cycles over
the profile's price of the same steps (:func:`profile_level`). ``step_time:`` is then the scaled
profile (``profile:DIR:scale=X``, so ``fitted:`` gives it to simulate, sweep and capacity),
``step_time_constant:`` the constant b and ``step_time_profile:`` the profile again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmqueue._result import Result
from llmqueue.bench.cycles import step_cycles
from llmqueue.errors import InputError


@dataclass(frozen=True)
class Calibration(Result):
    """Measured model inputs. ``b`` is the chosen estimator's value (seconds); ``b_estimators``
    holds all of them; ``linear`` the fitted step-time coefficients (or None)."""

    source: str
    capacity_tokens: float | None
    block_size: int | None
    b: float
    b_estimator: str
    b_estimators: dict
    itl_samples: int
    itl_cv: float
    linear: dict | None
    step_time: str
    step_time_linear: str | None = None
    engine: dict = field(default_factory=dict)
    notes: tuple = ()
    frontend_latency_s: float | None = None
    frontend_source: str | None = None
    speed_sd: float | None = None
    speed_windows: int = 0
    speed_spread: float | None = None
    speed_spread_source: str | None = None
    step_time_constant: str | None = None
    step_time_profile: str | None = None
    profile_scale: float | None = None


def _itl_from_tokens(path: Path, window: tuple[float, float] | None = None) -> np.ndarray:
    """Decode inter-token gaps (s) from per-token times: consecutive tokens of one request
    (a gap counts in ``window`` when its later token does)."""
    from llmqueue.records.journal import read_table

    t = read_table(path).to_pydict()  # the file, or the journal of a client killed outright
    keys = [k for k in ("request_id", "attempt") if k in t]
    order = np.lexsort([np.asarray(t["index"])] + [np.asarray(t[k]) for k in reversed(keys)])
    ts = np.asarray(t["t_s"], dtype=np.float64)[order]
    same = np.ones(len(ts) - 1, dtype=bool) if len(ts) > 1 else np.zeros(0, dtype=bool)
    for k in keys:
        v = np.asarray(t[k])[order]
        same &= v[1:] == v[:-1]
    if window is not None:
        same &= (ts[1:] >= window[0]) & (ts[1:] < window[1])
    gaps = np.diff(ts)[same]
    return gaps[gaps > 0]


def _itl_from_steps(steps) -> tuple[np.ndarray, np.ndarray]:
    """(durations, weights): each step's duration, weighted by the sequences it decoded."""
    d = np.asarray(steps["duration_s"], dtype=np.float64)
    k = np.asarray(steps["steps"], dtype=np.float64) if "steps" in steps else np.ones(len(d))
    w = np.asarray(steps["decode_seqs"], dtype=np.float64) * k
    per = d / np.maximum(k, 1)
    m = w > 0
    return per[m], w[m]


def _weighted_quantile(x, w, q):
    o = np.argsort(x)
    x, w = x[o], w[o]
    c = np.cumsum(w)
    return float(np.interp(q * c[-1], c - w / 2, x))


def _estimators(x: np.ndarray, w: np.ndarray | None, alphas=(0.05, 0.10)) -> dict:
    if w is None:
        w = np.ones(len(x))
    o = np.argsort(x)
    xs, ws = x[o], w[o]
    c = np.cumsum(ws) / ws.sum()
    out = {"mean": float(np.average(x, weights=w)), "median": _weighted_quantile(x, w, 0.5)}
    for a in alphas:
        keep = (c > a) & (c - ws / ws.sum() < 1 - a)
        out[f"trimmed_{a:g}"] = float(np.average(xs[keep], weights=ws[keep])) if keep.any() else out["mean"]
    return out


def _step_design(steps, window):
    """(X, y, k) of the busy steps of one run: the columns (1, P, D, C), the step cycle, and
    the steps each row stands for."""
    mask, y, k = step_cycles(steps, window)
    P = np.asarray(steps["prefill_tokens"], dtype=np.float64)[mask]
    D = np.asarray(steps["decode_seqs"], dtype=np.float64)[mask]
    C = np.asarray(steps["kv_tokens"], dtype=np.float64)[mask]
    return np.column_stack([np.ones(len(P)), P, D, C]), y[mask], k[mask]


def fit_linear(steps, *, window: tuple[float, float] | None = None, extra=()) -> dict | None:
    """Non-negative least squares of the step cycle on (1, prefill tokens, decode seqs, context).

    The target is each busy step's cycle (start to next start, see :func:`step_cycles`): the
    time the simulator must advance per step, the work between steps included (the engine's
    own elapsed time leaves it out). ``window``: (from, to) in run seconds, the steps used.
    ``extra``: step records of other runs of the same server, all their busy steps added to the
    fit (e.g. a low-load run: the small batches a saturation run hardly samples; each run's
    cycles are taken within that run).
    """
    from scipy.optimize import nnls

    parts = [_step_design(s, window if i == 0 else None) for i, s in enumerate([steps, *extra])
             if s is not None and len(s["duration_s"]) >= 2]
    if not parts or sum(len(p[1]) for p in parts) < 20:
        return None
    X = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    k = np.concatenate([p[2] for p in parts])
    sw = np.sqrt(k)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    coef, _ = nnls((X / scale) * sw[:, None], y * sw)
    coef = coef / scale
    pred = X @ coef
    ss_res = float(np.sum(k * (y - pred) ** 2))
    ss_tot = float(np.sum(k * (y - np.average(y, weights=k)) ** 2))
    return {"c0": float(coef[0]), "prefill": float(coef[1]), "decode": float(coef[2]), "ctx": float(coef[3]),
            "r2": 1 - ss_res / ss_tot if ss_tot > 0 else 0.0, "steps": int(k.sum()), "target": "cycle"}


def _speed_terms(steps, lin: dict):
    """Per step row: the busy mask, the time the row's steps took (cycle x k) and the time the
    linear model ``lin`` says they take; their ratio over any set of rows is the engine's speed
    against the model there."""
    mask, cyc, k = step_cycles(steps)
    said = (lin["c0"] + lin["prefill"] * np.asarray(steps["prefill_tokens"], dtype=np.float64)
            + lin["decode"] * np.asarray(steps["decode_seqs"], dtype=np.float64)
            + lin["ctx"] * np.asarray(steps["kv_tokens"], dtype=np.float64))
    return mask, np.where(mask, cyc, 0.0) * k, said * k, k


def speed_drift(steps, lin: dict, *, span_s: float = 10.0, min_steps: int = 20) -> dict | None:
    """How much the engine's speed wanders: per ``span_s`` window of busy steps, the ratio of the
    measured step cycles to the linear model ``lin``'s prediction for the same steps (1 = the
    model's speed). Returns ``{"sd", "windows", "min", "max"}`` (sd across windows, ddof 1), or
    None with fewer than 3 windows of ``min_steps`` busy steps."""
    mask, took, said, k = _speed_terms(steps, lin)
    if not mask.any():
        return None
    start = np.asarray(steps["start_s"], dtype=np.float64)
    win = np.floor((start - start[mask].min()) / span_s)
    ratios = []
    for w in np.unique(win[mask]):
        m = mask & (win == w)
        if k[m].sum() >= min_steps and said[m].sum() > 0:
            ratios.append(float(took[m].sum() / said[m].sum()))
    if len(ratios) < 3:
        return None
    r = np.asarray(ratios)
    return {"sd": float(r.std(ddof=1)), "windows": len(r), "min": float(r.min()), "max": float(r.max())}


def run_speed(steps, lin: dict) -> float | None:
    """The engine's speed during a run against the linear model ``lin``: the busy step cycles'
    total over the model's total for the same steps (1.2: the run's steps took 20 % longer than
    the calibration says). None without busy steps."""
    mask, took, said, _ = _speed_terms(steps, lin)
    if mask.sum() < 20:
        return None
    return float(took[mask].sum() / said[mask].sum())


def profile_level(steps, model, window: tuple[float, float] | None = None,
                  block_size: int | None = None, decode_only: bool = False,
                  max_batch: int | None = None, batch: int | None = None) -> tuple[float, int]:
    """The level of a profile's step times on a run: ``(scale, steps)``, scale the run's busy step
    cycles (:func:`step_cycles`, in ``window``) over ``model``'s price of the same steps (each row
    at its prefill tokens, decodes and KV tokens; the KV tokens are whole blocks, so half a block
    a sequence is taken off: the context it attends over). A profile measured on another day, or
    on an engine that has since slowed, keeps its shape and takes the run's speed. ``decode_only``: from
    the decode-only steps alone (the engine's speed, whatever the workload's shape). ``max_batch``:
    only the steps of at most that many sequences (the batches the profile measured: its surface
    beyond them is extrapolated, and one factor fitted there would carry the extrapolation's
    error into every small batch). ``batch``: only the steps of exactly that many decoding
    sequences (the level at one batch; the cycles still run from each step to the next)."""
    mask, cyc, k = step_cycles(steps, window)
    if batch is not None:
        mask &= np.asarray(steps["decode_seqs"], dtype=np.int64) == int(batch)
    if max_batch is not None:
        mask &= np.asarray(steps["decode_seqs"], dtype=np.int64) <= int(max_batch)
    if decode_only:  # the same work on any workload's shape: two runs' levels differ by the engine's speed alone
        mask &= (np.asarray(steps["prefill_tokens"]) == 0) & (np.asarray(steps["decode_seqs"]) > 0)
    if mask.sum() < 20:
        return math.nan, int(mask.sum())
    P = np.asarray(steps["prefill_tokens"], dtype=np.int64)[mask].tolist()
    D = np.asarray(steps["decode_seqs"], dtype=np.int64)[mask].tolist()
    C = np.asarray(steps["kv_tokens"], dtype=np.int64)[mask]
    if block_size:
        C = np.maximum(C - (np.asarray(steps["decode_seqs"], dtype=np.int64)[mask] * (int(block_size) - 1)) // 2, 0)
    C = C.tolist()
    K = k[mask].astype(np.int64).tolist()
    said = 0.0
    for p, d, c, n in zip(P, D, C, K):
        if n > 1 and p == 0 and d > 0:  # a simulated decode stretch: KV held at its end, context grew by d a step
            said += float(model.decode_stretch(d, max(c - d * (n - 1), d), n).sum())
        else:
            said += model.base(p, d, c) * n
    took = cyc[mask] * k[mask]
    return float(took.sum() / said), int(k[mask].sum())


def last_send_s(run_dir) -> float:
    """The run second of the client's last request send (``dispatched_s``).

    In a concurrency-capped saturation run the client holds a backlog and sends the next request
    as soon as one finishes, so the server is saturated (``cap`` requests in it, its KV cache full)
    from warm-up up to this moment; after it the server drains. Measuring capacity ``mu`` and
    ``b`` over ``[warm-up, last send)`` uses the whole saturated part, not only the scheduled
    arrival period: on a slow engine the completions of a short window are few (a +-17 % 95 %
    interval over 105 s at 0.75 req/s) and the engine's speed wanders over minutes.
    """
    from llmqueue.records import read_run

    r = read_run(Path(run_dir)).requests
    d = np.asarray(r["dispatched_s"], dtype=np.float64) if "dispatched_s" in r.to_dict() else np.array([])
    d = d[np.isfinite(d)]
    if not d.size:
        raise InputError("run", f"{run_dir} records no send times (dispatched_s)",
                         "give the window's end in seconds, or benchmark with llmqueue bench")
    return float(d.max())


#: What :func:`calibrate` does, in order (its ``on_stage`` callback names each as it ends).
CALIBRATE_STAGES = ("read the run", "inter-token latencies", "b estimators", "linear step model", "speed drift",
                    "frontend delay")


def calibrate(run_dir, *, capacity_tokens: float | None = None, estimator: str = "auto",
              busy_only: bool = True, window: tuple[float, float] | None = None, steps_from=(),
              on_stage=None, max_num_seqs: int | None = None,
              max_num_batched_tokens: int | None = None, profile=None) -> Calibration:
    """Measure ``M``, ``b`` (and a linear step model when step records exist) from a run directory.

    ``estimator``: ``auto`` (default) takes ``cycle``, the mean busy step cycle (steps per
    second, the quantity behind ``mu = M / (b E[g])``), when the run has step records with start
    times, else Nie et al.'s ``median`` inter-token latency. ``window``: (from, to) run seconds
    measured (default: the whole run); a saturation run's arrival period after warm-up is the
    steady part. ``steps_from``: other run directories of the same server whose step records
    join the linear step model's fit (``M`` and ``b`` stay this run's; the speed sd is this run's
    steps against the joint model): a
    saturation run samples batches of 30-40 sequences, and a decode step's time is concave in
    the batch size, so a line through them can miss small batches (measured on vLLM's CPU build:
    +35-45 % on a 4-sequence step after a prompt-heavy saturation run, whose steps confound c0
    with the prefill cost; with a 0.3x run's steps added, 0.99-1.06 on that shape's 0.5x steps,
    but on 2 cores that engine ran 10-15 % faster at 0.3x than at 0.5x for the same batch, so on
    the balanced and decode-heavy shapes the joint fit under-predicted by as much).
    ``on_stage``: called with the name of each of :data:`CALIBRATE_STAGES` as it ends (a progress bar).
    The frontend delay is estimated from the run's step log when it has one
    (:func:`llmqueue.bench.frontend_steps.frontend_from_steps`; a note says from how many
    requests, or why none); a probe run (:func:`with_frontend_latency`) replaces it.
    ``max_num_seqs``/``max_num_batched_tokens``: the server's, when the run did not record them
    (``server.json``, or a simulated run's summary); a setting neither gives is an
    :class:`InputError` naming the flag that supplies it (never a default: vLLM's differ by
    version and hardware, :mod:`llmqueue.bench.server_info`). ``profile``: a directory of
    ``llmqueue profile``: its step-time surface, set to this run's level (:func:`profile_level`,
    from the run's step records; without them, the profile's own level, x1), becomes
    ``step_time``; the engine settings the run lacks are taken from the profile's ``server.json``
    (a server that publishes neither log nor cache info: given to ``profile`` as flags).
    """
    from llmqueue.records import read_run

    stage = on_stage or (lambda name: None)

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("run", f"{run_dir} is not a run directory", "give the --out directory of bench or simulate")
    run = read_run(run_dir)
    stage(CALIBRATE_STAGES[0])
    notes = list(run.notes)  # a benchmark killed outright: read from its journals
    server = {}
    sj = run_dir / "server.json"
    if sj.exists():
        server = json.loads(sj.read_text())
    # the engine settings the simulator replays the run with: recorded, or given; never assumed
    from llmqueue.bench.server_info import require

    known = {**((run.summary or {}).get("engine") or {}), **{k: v for k, v in server.items() if v is not None}}
    if profile is not None:  # a server publishing neither log nor cache info: the profile's settings
        server = _settings_from_profile(profile, known, server, notes)
        known.update({k: v for k, v in server.items() if v is not None and k not in known})
    imported = "imported" in (run.summary or {})  # llmqueue import wrote it: its messages name import's flags
    for name, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        if v is not None:
            if isinstance(v, bool) or int(v) < 1:
                raise InputError(name, f"must be a positive integer (got {v})")
            known[name] = int(v)
            notes.append(f"{name} {int(v)} given (the run recorded {server.get(name, 'none')})")
        known[name] = require(known, name, where="server.json" if sj.exists() else f"{run_dir}/server.json",
                              here_flag=f"--{name.replace('_', '-')}", imported=imported)
    M = capacity_tokens
    block = server.get("block_size")
    if M is None:
        if server.get("M_usable"):
            M = float(server["M_usable"])
            notes.append("M from the server: usable KV blocks x block_size")
        elif server.get("num_gpu_blocks") and server.get("block_size"):
            M = float(server["num_gpu_blocks"]) * float(server["block_size"])
            notes.append("M from the server's cache_config_info (num_gpu_blocks x block_size)")
        elif run.summary and run.summary.get("kv_capacity_tokens"):
            M = float(run.summary["kv_capacity_tokens"])
            notes.append("M from the run summary")
        else:
            notes.append("M unknown: give --capacity-tokens")
    from llmqueue.records.journal import exists as journal_exists

    tok = run_dir / "tokens.parquet"
    steps = run.steps
    if journal_exists(tok):  # the file, or the journal of a client killed outright
        x = _itl_from_tokens(tok, window)
        w = None
        src = "decode inter-token latencies (tokens.parquet)"
    elif steps is not None and len(steps):
        x, w = _itl_from_steps(steps)
        src = "step durations weighted by decoded sequences (steps.parquet)"
    else:
        raise InputError("run", f"{run_dir} has neither tokens.parquet nor steps.parquet",
                         "import it with the chunk times (--map chunk_times=COLUMN or itl_s=COLUMN) or the server's "
                         "iteration log (--server-log FILE)" if imported else
                         "benchmark with per-token times, or simulate with --out")
    if len(x) < 10:
        raise InputError("run", f"only {len(x)} inter-token samples in {run_dir}", "run longer")
    stage(CALIBRATE_STAGES[1])
    est = _estimators(x, w)
    has_cycles = steps is not None and len(steps) > 1 and "start_s" in steps
    if has_cycles:
        mask, cyc, k = step_cycles(steps, window)
        if mask.sum() >= 10:
            est["cycle"] = float(np.average(cyc[mask], weights=k[mask]))
    if estimator == "auto":
        estimator = "cycle" if "cycle" in est else "median"
    if estimator not in est:
        raise InputError("estimator", f"unknown estimator {estimator!r}", f"choose one of {', '.join(est)}")
    b = est[estimator]
    mean = np.average(x, weights=w)
    cv = float(np.sqrt(np.average((x - mean) ** 2, weights=w)) / mean)
    stage(CALIBRATE_STAGES[2])
    notes.append("b from the busy step cycles (steps.parquet)" if estimator == "cycle" else f"b from {src}")
    if window is not None:
        notes.append(f"measured over [{window[0]:g}, {window[1]:g}) s")
    # the linear model is fitted on every busy step of the run, window or not: a saturated
    # window alone barely varies the batch (its decode coefficient would be unidentified)
    extra = []
    for other in steps_from:
        st = read_run(Path(other)).steps if Path(other).is_dir() else None
        if st is None or not len(st) or "prefill_tokens" not in st:
            raise InputError("steps_from", f"{other} has no step records (steps.parquet)",
                             "give a run benchmarked or imported with --server-log, or a simulated one")
        extra.append(st)
    lin = fit_linear(steps, extra=extra) if steps is not None and len(steps) and "prefill_tokens" in steps else None
    stage(CALIBRATE_STAGES[3])
    from llmqueue.bench.speed import run_to_run_spread

    spread, spread_src = run_to_run_spread(steps, extra, window, steps_from, notes)
    if lin is not None and extra:
        notes.append(f"linear step model fitted on this run's steps and those of {', '.join(map(str, steps_from))}")
    engine = {k: known[k] for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len",
                                    "enable_chunked_prefill", "num_gpu_blocks") if known.get(k) is not None}
    block = block or engine.get("block_size")
    step_linear = None
    drift = None
    if lin is not None:
        step_linear = "linear:c0={c0:.6g}:prefill={prefill:.6g}:decode={decode:.6g}:ctx={ctx:.6g}".format(**lin)
        drift = speed_drift(steps, lin)
        if drift is not None:
            notes.append(f"engine speed over {drift['windows']} 10-s windows: {drift['min']:.2f}-{drift['max']:.2f}"
                         f" x the linear model (sd {drift['sd']:.3f})")
    stage(CALIBRATE_STAGES[4])
    front = front_src = None
    if steps is not None and len(steps) and "prefill_tokens" in steps:
        from llmqueue.bench.frontend_steps import describe, frontend_from_steps

        fe = frontend_from_steps(run.requests, steps, max_num_seqs=known.get("max_num_seqs"), capacity_tokens=M)
        notes.append(describe(fe))
        if fe["frontend_latency_s"] is not None:
            front = fe["frontend_latency_s"]
            front_src = f"step log: {fe['samples']} low-load requests of {run_dir}"
    stage(CALIBRATE_STAGES[5])
    step_time, prof_spec, scale = f"{b:.6g}", None, None
    if profile is not None:
        from llmqueue.engine.profile_step import load_profile_model, profile_path

        pm = load_profile_model(profile, field="profile")
        if steps is None or not len(steps) or "prefill_tokens" not in steps:
            # no step log (a server that publishes none): the profile's own level, which its
            # probes measured on this server (a run's level differs by the engine's day-to-day
            # speed, which a run with --server-log would measure)
            scale, n = 1.0, 0
            notes.append(f"step_time: the profile {profile} at its own level (x1): {run_dir} has no step "
                         "records to measure this run's level ("
                         + ("import --server-log FILE" if imported else "bench --server-log") + " gives them)")
        else:
            top = _profile_top_batch(profile)
            scale, n = profile_level(steps, pm, window, block_size=block, max_batch=top)
            within = f"at batches <= {top}, those the profile measured"
            if not math.isfinite(scale):  # the run's steps lie beyond the profile's batches
                scale, n = profile_level(steps, pm, window, block_size=block)
                within = f"at every batch: fewer than 20 at batches <= {top}, the profile's largest"
            if not math.isfinite(scale):
                raise InputError("profile", f"{run_dir} has {n} busy steps; need >= 20 to set the profile's level",
                                 "run longer")
            notes.append(f"step_time: the profile {profile} at this run's level, x{scale:.4g} of its own "
                         f"(x1), from {n} busy steps {within}")
        prof_spec = f"profile:{profile_path(profile, 'profile').parent.resolve()}:scale={scale:.6g}"
        step_time = prof_spec
        front, front_src = _profile_frontend(profile, front, front_src, notes)
    return Calibration(source=str(run_dir), capacity_tokens=M, block_size=block, b=b, b_estimator=estimator,
                       b_estimators=est, itl_samples=int(len(x)), itl_cv=cv, linear=lin, step_time=step_time,
                       step_time_linear=step_linear, engine=engine, notes=tuple(notes),
                       frontend_latency_s=front, frontend_source=front_src,
                       speed_sd=drift["sd"] if drift else None, speed_windows=drift["windows"] if drift else 0,
                       speed_spread=spread, speed_spread_source=spread_src,
                       step_time_constant=f"{b:.6g}", step_time_profile=prof_spec, profile_scale=scale)


def _profile_top_batch(profile) -> int | None:
    """The largest decode batch the profile measured (None when it records none)."""
    from llmqueue.engine.profile_step import read_profile

    cells = read_profile(profile, field="profile").get("decode") or []
    b = [int(c["batch"]) for c in cells if isinstance(c, dict) and isinstance(c.get("batch"), int)]
    return max(b) if b else None


def _settings_from_profile(profile, known: dict, server: dict, notes: list) -> dict:
    """``server`` completed with the engine settings the profile recorded (its ``server.json``:
    read from the server, or given to ``profile`` as ``--server-*`` flags) that the run lacks:
    ``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``, ``num_gpu_blocks``, ``M_usable``
    (so ``M``). Each taken is named in ``notes``."""
    from llmqueue.engine.profile_step import profile_path

    pj = profile_path(profile, "profile").parent / "server.json"
    try:
        prof = json.loads(pj.read_text()) if pj.is_file() else {}
    except (OSError, ValueError):
        return server
    out, taken = dict(server), []
    for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks", "M_usable", "max_model_len"):
        if known.get(k) is None and out.get(k) is None and prof.get(k) is not None:
            out[k] = prof[k]
            taken.append(f"{k} {prof[k]}")
    if taken:
        notes.append(f"from the profile's server.json (the run recorded none): {', '.join(taken)}")
    return out


def _profile_frontend(profile, front, front_src, notes: list):
    """The frontend delay a profile measured (its lone prefill probes' TTFT less their logged prefill
    steps: the server's own delay outside the engine, measured on isolated requests) is taken over
    one estimated from the run's step log; the other is kept in a note."""
    from llmqueue.engine.profile_step import read_profile

    pf = (read_profile(profile, field="profile").get("prefill") or {}).get("frontend_latency_s")
    if pf is None or not math.isfinite(float(pf)):
        return front, front_src
    pf = max(float(pf), 0.0)
    if front is not None:
        notes.append(f"frontend delay: the profile's {1e3 * pf:.2f} ms (its lone prefill probes) over the run's "
                     f"step log's {1e3 * front:.2f} ms")
    return pf, f"profile: {profile} (lone prefill probes, TTFT less the logged prefill step)"


PROFILE_KEYS = ("step_time", "step_time_profile")  # the keys that may name a profile folder


def write_calibration(cal: Calibration, path) -> Path:
    import yaml

    from llmqueue.engine.profile_step import rebase_spec

    d = cal.to_dict()
    d["notes"] = list(d["notes"])
    p = Path(path)
    for k in PROFILE_KEYS:  # a profile under the file's folder is named relative to it: they move together
        d[k] = rebase_spec(d.get(k), p.parent, relative=True)
    from llmqueue._files import write_atomic

    write_atomic(p, "# llmqueue calibration (Nie et al.'s inputs measured on a run)\n" + yaml.safe_dump(d, sort_keys=False))
    return p


def load_calibration(path) -> dict:
    from llmqueue._files import load_yaml

    p = Path(path)
    if not p.exists():
        raise InputError("calibration", f"file not found: {p}")
    d = load_yaml("calibration", p, what="calibration file") or {}
    if not isinstance(d, dict) or "step_time" not in d:
        raise InputError("calibration", f"{p} is not a calibration file (no step_time)")
    from llmqueue.engine.profile_step import rebase_spec

    for k in PROFILE_KEYS:
        if k in d:
            d[k] = rebase_spec(d[k], p.parent, relative=False)
    return d


def frontend_latency(probe_dir, calibration: dict, *, step_model: str = "linear") -> dict:
    """The server's fixed delay outside the engine: HTTP, the API server, detokenizing and
    streaming, on the way in and out (a pipeline delay added to TTFT and E2EL, no queue).

    ``probe_dir``: a run of isolated requests (one at a time, spaced so that none waits: the
    benchmark with a low deterministic rate). Each request's measured TTFT (from its actual send)
    is compared with the time the engine spent on its prefill; the median difference is the
    delay (seconds). The engine's time comes from the probe's step log (``steps.parquet``: the
    prefill steps logged between the request's send and the next one's, when their prompt
    tokens add up to the request's), else from the simulated TTFT of the request under
    ``calibration``'s step model. The step log is preferred: the model's error on a lone
    prefill step is the engine's, not the frontend's (measured on vLLM's CPU build: lone
    prefills took 1.16 x the linear model fitted at saturation, and the model-based delay was
    62 ms against 9 ms from the step log). Only the requests that were alone at the server
    count (no other request between their send and their last token): a request that shares
    steps waits for the other's prefill, and that wait is the engine's too (a 2-per-second probe
    on an engine whose lone requests take 0.4-1 s put 199 ms on the frontend). Returns
    ``{"frontend_latency_s", "samples", "overlapping", "method", "p10", "p90"}``;
    ``frontend_latency_s`` is clamped at 0. Fewer than 5 isolated requests is an
    :class:`InputError` that says how far apart to send them.
    """
    from llmqueue.bench.replay import engine_config, measured_stream, sent_stream, sent_view
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.records import read_run
    from llmqueue.simulate import SimSpec, run_simulation

    probe_dir = Path(probe_dir)
    probe_run = read_run(probe_dir)
    sent = probe_run.requests
    r = sent_view(sent)  # from the actual send: the client's own lag is not the server's
    ok = (np.asarray(r["status"]) == "ok") & (np.asarray(r["attempt"]) == 1)
    if ok.sum() < 5:
        raise InputError("probe", f"{probe_dir} has {int(ok.sum())} finished requests; need >= 5")
    alone = ok & _alone(np.asarray(r["arrival_s"], dtype=float), np.asarray(r["finish_s"], dtype=float))
    if alone.sum() < 5:
        e2el = np.asarray(r["finish_s"], dtype=float)[ok] - np.asarray(r["arrival_s"], dtype=float)[ok]
        raise InputError("probe", f"{probe_dir}: {int(alone.sum())} of {int(ok.sum())} finished requests were "
                                  f"alone at the server (need >= 5): send them further apart than the longest "
                                  f"one took ({np.max(e2el):.2f} s), e.g. --arrival deterministic:"
                                  f"{1 / (1.5 * np.max(e2el)):.3g}")
    overlapping = int(ok.sum() - alone.sum())
    ok = alone
    rid = np.asarray(r["request_id"])[ok]
    meas = (np.asarray(r["first_token_s"]) - np.asarray(r["arrival_s"]))[ok]
    steps = probe_run.steps
    if steps is not None and len(steps) and "prefill_tokens" in steps:
        eng = _logged_prefill_s(steps, np.asarray(r["arrival_s"], dtype=float), ok,
                                np.asarray(r["prompt_tokens"], dtype=np.int64))
        d = meas - eng
        d = d[np.isfinite(d)]
        if len(d) >= 5:
            return {"frontend_latency_s": max(float(np.median(d)), 0.0), "samples": int(len(d)),
                    "overlapping": overlapping, "method": "step log",
                    "p10": float(np.percentile(d, 10)), "p90": float(np.percentile(d, 90))}
    spec_str = calibration.get("step_time_linear") if step_model == "linear" else None
    step = parse_step_time(spec_str or calibration["step_time"])
    cfg = engine_config(calibration, calibration.get("capacity_tokens") or 1e9)
    stream = sent_stream(measured_stream(probe_dir, sent), sent)
    sim = run_simulation(SimSpec(engine=cfg, step_time=step, requests=stream)).records
    sim_ttft = dict(zip(np.asarray(sim["request_id"]).tolist(),
                        (np.asarray(sim["first_token_s"]) - np.asarray(sim["arrival_s"])).tolist()))
    d = np.array([m - sim_ttft[i] for i, m in zip(rid.tolist(), meas.tolist()) if i in sim_ttft])
    d = d[np.isfinite(d)]
    return {"frontend_latency_s": max(float(np.median(d)), 0.0), "samples": int(len(d)), "overlapping": overlapping,
            "method": "step model", "p10": float(np.percentile(d, 10)), "p90": float(np.percentile(d, 90))}


def _logged_prefill_s(steps, send, keep, prompt):
    """For each kept request (in ``send`` order of the records), the engine's time on its
    prefill from the step log: first start to last end of the steps with prompt tokens logged
    after its send and by the next request's send, when those add up to its prompt (NaN when
    they do not: a step log that lags more than the idle gap, or a request not alone)."""
    start = np.asarray(steps["start_s"], dtype=np.float64)
    end = start + np.asarray(steps["duration_s"], dtype=np.float64)
    pf = np.asarray(steps["prefill_tokens"], dtype=np.int64)
    has = pf > 0
    order = np.argsort(send, kind="stable")
    nxt = np.full(len(send), np.inf)
    nxt[order[:-1]] = send[order[1:]]
    out = []
    for i in np.flatnonzero(keep):
        m = has & (end > send[i]) & (end <= nxt[i])
        ok = m.any() and int(pf[m].sum()) == int(prompt[i])
        out.append(float(end[m].max() - start[m].min()) if ok else np.nan)
    return np.array(out)


def _alone(start, finish):
    """Which of the intervals [start, finish) overlap no other (an unfinished request, NaN
    finish, lasts to the end)."""
    end = np.where(np.isfinite(finish), finish, np.inf)
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    prev_end = np.maximum.accumulate(np.concatenate(([-np.inf], e[:-1])))  # latest end among earlier sends
    next_start = np.concatenate((s[1:], [np.inf]))
    ok = (prev_end <= s) & (e <= next_start)
    out = np.empty_like(ok)
    out[o] = ok
    return out


def with_frontend_latency(cal: Calibration, probe_dir) -> Calibration:
    """``cal`` with :func:`frontend_latency` measured on ``probe_dir`` (and a note saying so).

    A ``probe_dir`` with too few isolated requests (an ordinary low-load run) stands in when it
    has a step log: the delay is then estimated against it
    (:func:`llmqueue.bench.frontend_steps.frontend_from_steps`); without one the error stands."""
    import dataclasses

    try:
        fl = frontend_latency(probe_dir, cal.to_dict())
    except InputError as e:
        from llmqueue.bench.frontend_steps import describe, frontend_from_steps
        from llmqueue.records import read_run

        run = read_run(Path(probe_dir))
        if "alone at the server" not in str(e) or run.steps is None or "prefill_tokens" not in run.steps:
            raise
        fe = frontend_from_steps(run.requests, run.steps, max_num_seqs=cal.engine.get("max_num_seqs"),
                                 capacity_tokens=cal.capacity_tokens)
        if fe["frontend_latency_s"] is None:
            raise InputError("probe", f"{probe_dir}: too few isolated requests for a probe, and {fe['reason']}",
                             "send a probe of isolated requests, or a lower-load run with --server-log") from None
        return dataclasses.replace(cal, frontend_latency_s=fe["frontend_latency_s"],
                                   frontend_source=f"step log: {fe['samples']} low-load requests of {probe_dir}",
                                   notes=tuple(cal.notes) + (describe(fe, str(probe_dir)),))
    skipped = f", {fl['overlapping']} overlapping ones left out" if fl.get("overlapping") else ""
    note = (f"frontend delay: {1e3 * fl['frontend_latency_s']:.1f} ms from {fl['samples']} isolated probes in "
            f"{probe_dir}{skipped}, engine time from the {fl['method']} "
            f"(p10 {1e3 * fl['p10']:.1f} ms, p90 {1e3 * fl['p90']:.1f} ms)")
    return dataclasses.replace(cal, frontend_latency_s=fl["frontend_latency_s"],
                               frontend_source=f"probe: {fl['samples']} isolated requests of {probe_dir}",
                               notes=tuple(cal.notes) + (note,))


def calibration_from_dict(d: dict) -> Calibration:
    """A :class:`Calibration` from :func:`load_calibration`'s mapping (unknown keys ignored)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(Calibration)}
    return Calibration(**{k: v for k, v in d.items() if k in names})
