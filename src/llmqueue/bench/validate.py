"""Validation: theory and simulation, fed with calibrated inputs, against a measured run.

The measured run's request stream (intended arrival times, prompt and requested output
lengths; ``workload.parquet`` written by the benchmark, else rebuilt from the records) is
replayed through the simulator with the calibration's ``M`` and step-time model and the
server's engine knobs; Nie et al.'s ``mu = M / (b E[g])`` is computed on the measured (prompt,
output) pairs. Each quantity is reported predicted against measured with its relative error:
throughput (and capacity ``mu`` when the measured run was saturated), TTFT and TPOT p50/p99, the
stability verdict.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmqueue.bench.calibrate import profile_level, run_speed
from llmqueue.bench.replay import (engine_config, measured_hashes, measured_stream, replaced, sent_stream, sent_view,
                                   server_errors, tiled_stream, without)
from llmqueue.errors import InputError

QUANTITIES = ("request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
              "mean_e2el_ms")


#: Knobs (flag names, :mod:`llmqueue.knobs`) that override the calibrated replica in a validation.
VALIDATE_KNOBS = ("capacity_tokens", "step_time", "max_num_seqs", "max_num_batched_tokens", "chunk", "block_size",
                  "enable_chunked_prefill", "long_prefill_token_threshold", "max_model_len", "policy", "preemption",
                  "srpt_predictor_cv", "max_waiting", "max_queue_time", "enable_prefix_caching", "seed")


def replica_theory(kv, *, b: float, max_num_seqs: int, chunk: int, s, o, lam: float | None) -> dict:
    """The theory side of a validation: the replica's capacity as the least of its three bounds
    (:func:`llmqueue.theory.replica.replica_capacity`): Nie et al.'s KV bound ``mu_kv = M / (b E[g])``
    (``kv``, paged as the engine allocates), the slot bound ``mu_seqs = max_num_seqs / (b E[ceil(s /
    chunk) + o - 1])`` and the token-budget bound ``mu_tokens = chunk / (b E[s + o - 1])``, with the
    same ``b``. An engine whose KV cache never fills (a GPU with a large cache and a few dozen
    sequences) is slot-bound: the KV bound alone overstates its capacity (x5 on the H100 runs).
    The verdict at ``lam``: the KV model's (with its ``delta`` band) when the KV bound binds, else
    ``unstable`` above ``mu`` and ``stable`` below. Returns the KV result's fields with ``mu``,
    ``verdict`` and ``rho`` those of the binding bound, plus ``mu_kv``, ``mu_seqs``, ``mu_tokens``
    and ``binding``."""
    from llmqueue.theory.replica import BINDING, replica_capacity

    rc = replica_capacity(b=b, max_num_seqs=max_num_seqs, max_num_batched_tokens=chunk, prompt_tokens=s,
                          output_tokens=o)
    bounds = {"mu_kv": kv.mu, "mu_seqs": rc.mu_seqs, "mu_tokens": rc.mu_tokens}
    name = min(bounds, key=bounds.get)
    mu = bounds[name]
    out = {**kv.to_dict(), **bounds, "mu": mu, "binding": BINDING[name]}
    if lam is not None:
        out["rho"] = lam / mu
        out["verdict"] = kv.verdict if name == "mu_kv" else ("unstable" if lam > mu else "stable")
    return out


def _rate(times) -> float | None:
    """Arrivals per second over a span of times: ``(n - 1) / (last - first)``; None when they do not
    span any time (one time, or every one equal)."""
    t = np.asarray(times, dtype=np.float64)
    t = t[np.isfinite(t)]
    span = float(np.ptp(t)) if len(t) > 1 else 0.0
    return (len(t) - 1) / span if span > 0 else None


def offered_rate(arrival_s, requests) -> tuple[float | None, str | None]:
    """The arrival rate ``lam`` the theory judges a run at, and where it came from: the replayed
    stream's arrival times (``arrival_s``: the schedule, or the send times with ``--arrivals sent``)
    when they span time; else, for a schedule with no times (all at once, vLLM's
    ``--request-rate inf``: every request at 0), the rate at which the client actually sent the
    first attempts (``requests["dispatched_s"]``: with a concurrency cap, the rate at which
    the server freed slots); ``(None, None)`` when neither spans time."""
    lam = _rate(arrival_s)
    if lam is not None:
        return lam, "arrivals"
    if "dispatched_s" in requests:
        lam = _rate(requests["dispatched_s"][requests["attempt"] == 1])
        if lam is not None:
            return lam, "send times (the schedule sends all at once)"
    return None, None


def validate(run_dir, calibration: dict, *, warmup_s: float | None = None, seed: int = 0,
             step_model: str = "constant", horizon_s: float | None = None, paged: bool = True,
             frontend: bool = True, arrivals: str = "auto", speed_band: float | None = None,
             speed_factor: float | str | None = None, drift: float | None = None, drift_reps: int = 8,
             knobs: dict | None = None, progress: bool = False, margin: float | None = None,
             verdict_copies: int = 1) -> dict:
    """Predict the run with theory and simulation; returns ``{"rows": [...], "theory": ..., ...}``.

    ``horizon_s``: measure both sides over ``[warm-up, horizon_s)`` (a saturation run's arrival
    period). ``paged``: Nie et al.'s ``E[g]`` counted in whole KV blocks of the engine's block size
    (what a paged engine allocates; ``False``: the paper's token count). ``frontend``: add the
    calibration's ``frontend_latency_s`` (the server's HTTP/API path, measured on isolated
    requests, see :func:`llmqueue.bench.calibrate.frontend_latency`) to the simulated first and
    last token times: TTFT and E2EL grow by it, TPOT does not. ``arrivals``: ``sent`` (default)
    replays each request at its actual send time and measures latencies from it (a benchmark
    client that fell behind its schedule, as it can on a machine it shares with the server, is
    then not counted as server delay); ``intended``: the schedule, both sides; ``auto``
    (default): ``intended`` for a concurrency-capped run (its sends follow the server's
    completions), else ``sent``. ``speed_band``: also simulate with every step ``1 - e`` and ``1 + e``
    times as long (``e = speed_band``; default ``2 x`` the calibration's ``speed_sd``, the engine's
    own speed wander measured on the calibration run; 0: off) and give each quantity's range
    (``band``) and whether the measured value lies in it (``in_band``): near capacity a few percent
    of engine speed move the queue, and so the latency, by tens of percent. ``speed_factor``: run
    the step model that many times slower (a number), or ``"run"``: at the speed the engine
    actually had in this run (its step log's busy cycles over the prediction of the step model in
    use for the same steps: :func:`~llmqueue.bench.calibrate.run_speed` for the linear model,
    :func:`~llmqueue.bench.calibrate.profile_level` for a profile or a given step time). Not a prediction (it reads the run's
    own steps): a diagnosis that tells a miss of the queueing model from an engine that ran at
    another speed than calibrated; the theory's ``b`` is scaled by the same factor. ``drift``: the engine's speed wandering within the run (CV of
    its speed over 10-s windows; default: the calibration's ``speed_sd``, measured on the
    calibration run; 0: off): each prediction is then the mean over ``drift_reps`` simulations
    of the same request stream, each with its own draw of window speeds (the step-time model's
    ``drift``; a service rate ``mu`` modulated in time, whose slow windows build the queue
    episodes behind the p99 TTFT near capacity), and ``drift_range`` gives each quantity's
    range over the draws. ``knobs``: engine knobs under their flag names (:data:`VALIDATE_KNOBS`)
    overriding the calibrated replica: ``capacity_tokens`` its ``M``, ``step_time`` the step model,
    ``enable_prefix_caching`` the choice made from the server's counters, ``seed`` the seed.
    ``progress``: one bar on stderr over every simulation (the prediction, the speed band's two, each
    drift draw), in simulated seconds. ``margin``: also the prediction's distance to the preemption
    cliff (:func:`llmqueue.margin.regime_margin` on the same stream, engine and seed; key
    ``regime_margin``); a simulated "stable" within ``1 + margin`` of it becomes "metastable",
    and one whose path already preempts without queue growth "at the cliff".
    ``verdict_copies``: the simulated verdict judges the system at the run's rate, not one finite
    path: the stream is replayed that many times back to back (:func:`~llmqueue.bench.replay.tiled_stream`) and the
    verdict is the long path's (the replay's own is kept as ``verdicts["simulated_path"]``). A run
    of a few minutes at 1.2x of capacity grows its queue by a few tenths of a request a second,
    which one path's confidence interval may not tell from zero; the simulator is cheap enough to
    look longer. 1 (default): the replay's own path. Refused with prefix caching (the copies would
    hit each other's prefixes).
    """
    from llmqueue.engine.options import SimOptions
    from llmqueue.engine.step_time import parse_step_time
    from llmqueue.records import read_run
    from llmqueue.simulate import SimSpec, run_simulation
    from llmqueue.theory.kv import kv_stability

    run_dir = Path(run_dir)
    from llmqueue.metrics.summary import summary_of

    run = read_run(run_dir)
    measured = summary_of(run)  # a benchmark killed outright: from its journals' records
    if not measured:
        raise InputError("run", f"{run_dir} has no summary.json")
    warm = measured.get("warmup_s", 0.0) if warmup_s is None else warmup_s
    if isinstance(verdict_copies, bool) or not isinstance(verdict_copies, int) or verdict_copies < 1:
        raise InputError("verdict_copies", f"must be a positive integer (got {verdict_copies!r})",
                         "1: the run's own path; e.g. 4 for the stream replayed 4 times")
    if arrivals not in ("auto", "sent", "intended"):
        raise InputError("arrivals", f"unknown arrival basis {arrivals!r}", "use auto, sent or intended")
    if arrivals == "auto":
        # a concurrency-capped (closed-loop) run's send times follow the server's completions:
        # replaying them would feed the measured throughput back into the prediction
        closed = bool(((run.summary or {}).get("bench") or {}).get("closed_loop"))
        arrivals = "intended" if closed else "sent"
    sent = arrivals == "sent" and "dispatched_s" in run.requests.to_dict()
    # a benchmark's summary.json counts its vLLM-named latencies from the actual send: the
    # intended basis (and any window) is measured again from the records
    if horizon_s is not None or sent or "from_intended" in measured:
        # measure both sides over the same window [warm, horizon_s] (e.g. a saturation run's
        # arrival period, leaving out the drain after the last arrival), from the same origin
        from llmqueue.metrics import summarize

        recs = sent_view(run.requests) if sent else run.requests
        measured = summarize(recs, warmup_s=warm, horizon_s=horizon_s or measured.get("horizon_s"))
    stream = measured_stream(run_dir, run.requests)
    if sent:
        stream = sent_stream(stream, run.requests)
    # what the replay leaves out or applies: requests the server answered with an error (no
    # engine work the simulator models), the client's deadlines as the run recorded them
    failed = server_errors(run.requests)
    if failed:
        stream = without(stream, failed)
    bench = (run.summary or {}).get("bench") or {}
    client_to = {str(k): float(v) for k, v in (bench.get("timeout_s") or {}).items()}
    client_ttft = {str(k): float(v) for k, v in (bench.get("ttft_timeout_s") or {}).items()}
    replay = {"requests": len(stream.arrival_s), "left_out_server_errors": len(failed),
              "client_timeout_s": client_to or None, "client_ttft_timeout_s": client_ttft or None,
              "retries_replayed": False if bench.get("retries") or int(np.max(run.requests["attempt"], initial=1)) > 1
              else None}
    knobs = {k: v for k, v in (knobs or {}).items() if v is not None}
    for k in knobs:
        if k not in VALIDATE_KNOBS:
            raise InputError(k, "is not a knob validate can override", f"knobs: {', '.join(VALIDATE_KNOBS)}")
    from llmqueue.knobs import check

    knobs = {k: check(k, v) for k, v in knobs.items()}
    M = knobs.pop("capacity_tokens", None) or calibration.get("capacity_tokens")
    if not M:
        raise InputError("calibration", "the calibration has no capacity_tokens (M)", "give --capacity-tokens to calibrate")
    seed = knobs.pop("seed", seed)
    step_time = knobs.pop("step_time", None)
    prefix_knob = knobs.pop("enable_prefix_caching", None)
    predictor_cv = knobs.pop("srpt_predictor_cv", 0.0)
    cfg = engine_config(calibration, M, **knobs)
    # prefix caching: the server had it on when it counted prefix-cache queries during the run;
    # the simulator then reuses the prompts' prefix blocks as the run built them (trace hash ids)
    counters = (run.summary or {}).get("server_counters") or {}
    hash_ids, H = measured_hashes(run_dir, stream)
    if prefix_knob and hash_ids is None:
        raise InputError("enable_prefix_caching", f"{run_dir} has no prefix hashes to model prefix caching with",
                         "benchmark a trace with hash ids (Mooncake), or drop the flag")
    prefix = (bool(counters.get("prefix_cache_queries")) if prefix_knob is None else prefix_knob) \
        and hash_ids is not None
    import dataclasses

    cfg = dataclasses.replace(cfg, enable_prefix_caching=prefix)
    if not prefix:
        hash_ids, H = None, 512
    elif verdict_copies > 1:
        raise InputError("verdict_copies", "cannot replay a run with prefix caching back to back (the copies would "
                         "hit each other's prefixes)", "use 1 (the run's own path)")
    if step_time is not None:
        step = parse_step_time(step_time)
    elif step_model == "linear":
        if not calibration.get("step_time_linear"):
            raise InputError("step_model", "the calibration has no linear step-time model (no step records)")
        step = parse_step_time(calibration["step_time_linear"])
    elif step_model == "profile":
        if not calibration.get("step_time_profile"):
            raise InputError("step_model", "the calibration has no profile step-time model",
                             "calibrate with --profile DIR (llmqueue profile's output)")
        step = parse_step_time(calibration["step_time_profile"])
    else:  # the constant b (step_time itself in a calibration made without a profile)
        step = parse_step_time(calibration.get("step_time_constant") or calibration["step_time"])
    horizon = horizon_s or measured.get("horizon_s") or float(np.nanmax(run.requests["finish_s"]))
    front = float(calibration.get("frontend_latency_s") or 0.0) if frontend else 0.0

    if drift is None:
        drift = float(calibration.get("speed_sd") or 0.0)
    if not 0.0 <= drift < 1.0:
        raise InputError("drift", f"must be in [0, 1) (got {drift})", "e.g. 0.08 for an engine whose speed "
                         "wanders by 8 % over 10-s windows; 0: off")
    if drift > 0 and drift_reps < 1:
        raise InputError("drift_reps", f"must be at least 1 (got {drift_reps})")
    draws: list[dict] = []
    if speed_band is None:
        speed_band = 2.0 * float(calibration.get("speed_sd") or 0.0)
    if not 0.0 <= speed_band < 1.0:
        raise InputError("speed_band", f"must be in [0, 1) (got {speed_band})", "e.g. 0.1 for +-10 % engine speed")

    def simulate_one(model, sim_seed):
        cb = bar.callback(f"simulation {next(count, sims)} of {sims}")
        spec = SimSpec(engine=cfg, step_time=model, requests=stream, seed=sim_seed, warmup_s=warm,
                       predictor_cv=predictor_cv, options=SimOptions(seed=sim_seed, horizon_s=horizon, hash_ids=hash_ids,
                                                                     hash_block_tokens=H, progress=cb,
                                                                     timeout_s=client_to, ttft_timeout_s=client_ttft))
        out = run_simulation(spec)
        bar.done()
        summ = {**out.summary, "preemptions": float(np.sum(out.records["preemptions"]))}
        if prefix:
            summ = {**summ, "prefix_cache_hits": float(np.sum(out.records["cached_prompt_tokens"]))}
        if front > 0:
            summ = {**summ, **_latencies_with_frontend(out.records, front, warm, horizon)}
        return summ

    def simulate(model, keep=False):
        if drift <= 0:
            return simulate_one(model, seed)
        reps = [simulate_one(model.with_drift(drift), seed + k) for k in range(drift_reps)]
        if keep:
            draws.extend(reps)
        return _mean_summary(reps)

    applied = None
    if speed_factor is not None:
        if speed_factor == "run":
            applied = _speed_against(run, run_dir, step, step_model, step_time, calibration, cfg.block_size)
        else:
            try:
                applied = float(speed_factor)
            except (TypeError, ValueError):
                raise InputError("speed_factor", f"expected a number or 'run' (got {speed_factor!r})") from None
        step = step.scaled(applied)
    from llmqueue._progress import SimSeconds

    sims = (3 if speed_band > 0 else 1) * (drift_reps if drift > 0 else 1)
    bar = SimSeconds(sims, horizon, desc="validate", enabled=progress)
    count = iter(range(1, sims + 1))
    try:
        sim = simulate(step, keep=True)
        banded = ([simulate(step.scaled(1.0 - speed_band)), simulate(step.scaled(1.0 + speed_band))]
                  if speed_band > 0 else [])
    finally:
        bar.close()
    long_verdict = None
    if verdict_copies > 1 and len(stream.arrival_s) > 1:
        long = tiled_stream(stream, verdict_copies)
        spec = SimSpec(engine=cfg, step_time=step.with_drift(drift) if drift > 0 else step, requests=long, seed=seed,
                       warmup_s=warm, predictor_cv=predictor_cv,
                       options=SimOptions(seed=seed, horizon_s=float(long.arrival_s[-1]), timeout_s=client_to,
                                          ttft_timeout_s=client_ttft))
        long_verdict = run_simulation(spec).summary.get("verdict")
    s = np.asarray(stream.prompt_tokens, dtype=np.float64)
    o = np.asarray(stream.output_tokens, dtype=np.float64)
    b = float(calibration["b"]) * (applied if applied is not None else 1.0)  # the engine speed applied: theory too
    lam, lam_source = offered_rate(stream.arrival_s, run.requests)
    # paged KV: memory-work in whole blocks, as the engine allocates it
    th = kv_stability(M=M, b=b, chunk=cfg.max_num_batched_tokens, pairs=(s, o), lam=lam,
                      block_size=cfg.block_size if paged else None)
    theory = replica_theory(th, b=b, max_num_seqs=cfg.max_num_seqs, chunk=cfg.max_num_batched_tokens, s=s, o=o,
                            lam=lam)
    rows = []
    for q in QUANTITIES:
        m, p = measured.get(q), sim.get(q)
        row = {"quantity": q, "measured": m, "simulated": p,
               "rel_err_sim": (p - m) / m if (m and p is not None) else None}
        if banded:
            vals = [x.get(q) for x in banded] + [p]
            vals = [v for v in vals if v is not None and np.isfinite(v)]
            if vals:
                row["band"] = [min(vals), max(vals)]
                row["in_band"] = bool(m is not None and min(vals) <= m <= max(vals))
        if draws:
            vals = [v for v in (x.get(q) for x in draws) if v is not None and np.isfinite(v)]
            if vals:
                row["drift_range"] = [min(vals), max(vals)]
        rows.append(row)
    if counters.get("preemptions") is not None:  # the whole run's, the server's counter beside the simulated
        m, p = counters["preemptions"], sim.get("preemptions")
        rows.append({"quantity": "preemptions", "measured": m, "simulated": p,
                     "rel_err_sim": (p - m) / m if (m and p is not None) else None})
    if prefix:   # the whole run's prompt tokens served from the prefix cache (the server's counter)
        m, p = counters.get("prefix_cache_hits"), sim.get("prefix_cache_hits")
        rows.append({"quantity": "prefix_cache_hits", "measured": m, "simulated": p,
                     "rel_err_sim": (p - m) / m if (m and p is not None) else None})
    sat = str(measured.get("verdict", "")).startswith("unstable")
    cap = {"quantity": "capacity mu (req/s)", "theory": theory["mu"], "theory_binding": theory["binding"],
           "simulated": sim.get("request_throughput") if sat else None,
           "measured": measured.get("request_throughput") if sat else None}
    if sat:
        cap["rel_err_theory"] = (theory["mu"] - cap["measured"]) / cap["measured"]
        cap["rel_err_sim"] = (cap["simulated"] - cap["measured"]) / cap["measured"]
    verdicts = {"measured": measured.get("verdict"), "simulated": sim.get("verdict"), "theory": theory["verdict"]}
    if long_verdict is not None:
        verdicts.update(simulated=long_verdict, simulated_path=sim.get("verdict"), simulated_copies=verdict_copies)
    regime = None
    if margin is not None:
        from llmqueue.margin import margin_verdict, regime_margin, tipping_text

        spec = SimSpec(engine=cfg, step_time=step, requests=stream, seed=seed, warmup_s=warm,
                       predictor_cv=predictor_cv, options=SimOptions(seed=seed, horizon_s=horizon, hash_ids=hash_ids,
                                                                     hash_block_tokens=H, timeout_s=client_to,
                                                                     ttft_timeout_s=client_ttft))
        regime = regime_margin(spec, stream, margin=margin)
        regime["tipping"] = speed_spread_tipping(regime, calibration)
        verdicts["tipping"] = tipping_text(regime["tipping"])
        said = margin_verdict(regime)
        if said is not None and str(verdicts["simulated"]).startswith("stable"):
            verdicts["simulated"] = said
    from llmqueue.theory.judged import indeterminate_text

    said = indeterminate_text({**theory, "lam": lam}, regime)
    if said:
        verdicts["theory_detail"] = said
    return {"run": str(run_dir), "lam": lam, "lam_source": lam_source, "arrivals": "sent" if sent else "intended", "saturated": sat, "capacity": cap, "rows": rows,
            "replay": replay, "notes": run.notes,
            "prefix_caching": ({"hash_block_tokens": H, "requests_with_hashes": sum(1 for h in hash_ids if h)}
                               if prefix else None),
            "verdicts": verdicts, "regime_margin": regime, "theory": theory, "simulation": sim,
            "step_model": step.spec,
            "frontend_latency_s": front, "speed_band": speed_band, "speed_factor": applied,
            "drift": drift, "drift_reps": drift_reps if drift > 0 else 0,
            "calibration": {k: calibration.get(k) for k in ("capacity_tokens", "b", "b_estimator", "step_time",
                                                            "step_time_linear", "step_time_profile", "frontend_latency_s",
                                                            "speed_sd", "speed_spread")}}


def speed_spread_tipping(regime: dict, calibration: dict) -> dict:
    """:func:`llmqueue.margin.tipping` with the calibration's run-to-run speed spread (else the
    stated default)."""
    from llmqueue.margin import DEFAULT_SPEED_SPREAD, tipping

    spread = calibration.get("speed_spread")
    if spread is None:
        return tipping(regime, DEFAULT_SPEED_SPREAD, "a stated default: the calibration measured none")
    return tipping(regime, float(spread), calibration.get("speed_spread_source") or "the calibration's")


def _mean_summary(reps: list[dict]) -> dict:
    """One summary from several simulations of the same stream (drift draws): each numeric
    quantity the mean over the draws (the expected value of one run's figure, e.g. of its p99),
    the verdict the most common one's, the rest from the first draw."""
    from collections import Counter

    out = dict(reps[0])
    for k, v in reps[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [r.get(k) for r in reps]
            vals = [float(x) for x in vals if isinstance(x, (int, float)) and np.isfinite(x)]
            out[k] = float(np.mean(vals)) if vals else v
    verdicts = [str(r.get("verdict", "")) for r in reps]
    kinds = Counter(v.split(":")[0].split(" ")[0] for v in verdicts)
    top = kinds.most_common(1)[0][0]
    pick = next(r for r, v in zip(reps, verdicts) if v.split(":")[0].split(" ")[0] == top)
    for k in ("verdict", "stable", "stability"):
        if k in pick:
            out[k] = pick[k]
    return out


def _latencies_with_frontend(records, front: float, warm: float, horizon: float) -> dict:
    """The simulated latency summary with ``front`` seconds added to every delivered token: the
    engine's first and last token reach the client that much later (a constant pipeline delay,
    not a server: it queues nothing)."""
    from llmqueue.metrics import summarize

    # NaN (never reached) stays NaN
    shifted = replaced(records, first_token_s=np.asarray(records["first_token_s"]) + front,
                       finish_s=np.asarray(records["finish_s"]) + front)
    s = summarize(shifted, warmup_s=warm, horizon_s=horizon)
    keep = [k for k in s if any(x in k for x in ("ttft", "e2el", "tpot", "itl"))]
    return {k: s[k] for k in keep}


def _speed_against(run, run_dir, step, step_model: str, step_time, calibration: dict, block_size: int) -> float:
    """``--speed-factor run``: the engine's speed during the run against the step model in use (its
    busy step cycles over that model's price of the same steps): the linear model's coefficients
    for ``linear``, the model itself for a profile or a given ``--step-time`` (measured against
    another model, the factor would carry that model's error into this one)."""
    if run.steps is None or not len(run.steps):
        raise InputError("speed_factor", f"'run' needs {run_dir}/steps.parquet",
                         "give a number, or benchmark with the server's step log")
    if step_time is None and step_model == "linear":
        lin = calibration.get("linear")
        if not lin:
            raise InputError("speed_factor", "'run' needs the calibration's linear step model")
        f = run_speed(run.steps, lin)
    else:
        f, _ = profile_level(run.steps, step, block_size=block_size)
        f = None if f != f else f
    if f is None:
        raise InputError("speed_factor", f"{run_dir} has too few busy steps to measure the engine's speed")
    return f
