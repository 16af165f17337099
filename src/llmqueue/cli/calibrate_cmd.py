"""``llmqueue calibrate`` and ``llmqueue validate``: measured inputs, then predicted vs measured."""

from __future__ import annotations

import click

from llmqueue.bench.validate import VALIDATE_KNOBS
from llmqueue.cli.common import InputPath, OutputPath, command, json_option, print_json, print_kv, print_table, renamed_option
from llmqueue.cli.flags import given_flags, knob_options


def _run_second(run, value, option: str):
    """``value`` as run seconds: a number, ``last-send`` (the run's last request send), or None."""
    from llmqueue.errors import InputError

    if value is None:
        return None
    if str(value) == "last-send":
        from llmqueue.bench.calibrate import last_send_s

        return last_send_s(run)
    try:
        return float(value)
    except ValueError:
        raise InputError(option, f"expected seconds or last-send (got {value!r})") from None


@command("calibrate")
@click.argument("run", type=InputPath("dir"))
@renamed_option("-o", "--out", "out", old=("--output",), default="calibration.yaml", show_default=True, type=OutputPath("file"),
              help="Calibration file to write (missing parent directories are created).")
@click.option("--capacity-tokens", type=float, help="KV capacity M, when the run did not record the server's.")
@click.option("--estimator", default="auto", show_default=True,
              help="b-bar estimator: cycle (mean busy step cycle, needs step records), median, mean, "
                   "trimmed_0.05, trimmed_0.1 (Nie et al. 2026 appendix C); auto: cycle when the run has steps, else median.")
@click.option("--from", "t_from", type=float, default=None, help="Measure from this run second (e.g. after warm-up).")
@click.option("--to", "t_to", default=None, metavar="SECONDS|last-send",
              help="Measure up to this run second, or up to the client's last send (last-send: the end of a "
                   "concurrency-capped saturation run's saturated part, before the drain).")
@click.option("--probe", type=InputPath("dir"), default=None,
              help="A run of isolated requests (one at a time): measures the server's delay outside the engine "
                   "(HTTP, API server, streaming), added to simulated TTFT and E2EL by validate. A low-load run "
                   "with a step log (bench --server-log) stands in [default: the run's own step log, when it "
                   "has one].")
@click.option("--steps-from", "steps_from", type=InputPath("dir"), multiple=True,
              help="Another run of the same server whose step records join the linear step model's fit "
                   "(repeatable; e.g. a low-load run: the small batches a saturation run hardly samples).")
@click.option("--profile", "profile_dir", type=InputPath("dir", reads=("profile.json",)), default=None,
              help="A profile of the same server (llmqueue profile --out DIR): its step-time shape over batch "
                   "size and context, at this run's level (one factor from the run's step records), becomes "
                   "step_time (profile:DIR:scale=X).")
@click.option("--max-num-seqs", type=int, metavar="N", help="The server's --max-num-seqs, when the run did not "
              "record it (bench --server-max-num-seqs or --server-log) [default: the run's; never assumed].")
@click.option("--max-num-batched-tokens", type=int, metavar="N", help="The server's --max-num-batched-tokens, when "
              "the run did not record it [default: the run's; never assumed].")
@click.option("--progress/--no-progress", default=None, help="Progress bar over the stages (default: on a terminal).")
@json_option
def calibrate(run, out, capacity_tokens, estimator, t_from, t_to, probe, steps_from, profile_dir, max_num_seqs,
              max_num_batched_tokens, progress, as_json):
    """Measure M, b-bar (and a linear step-time model when step records exist) from a run directory.

    The file feeds the simulator (`--step-time fitted:FILE`, `--capacity-tokens`) and `llmqueue validate`.
    """
    import math

    from llmqueue.bench.calibrate import calibrate as cal_fn
    from llmqueue.bench.calibrate import write_calibration
    from llmqueue.errors import InputError

    window = None
    t_to = _run_second(run, t_to, "--to")
    if t_from is not None or t_to is not None:
        window = (t_from or 0.0, math.inf if t_to is None else t_to)
        if window[1] <= window[0]:
            raise InputError("--to", f"must be after --from (got {window[0]:g} .. {window[1]:g})")
    from llmqueue._progress import bar, wanted
    from llmqueue.bench.calibrate import CALIBRATE_STAGES

    stages = bar(len(CALIBRATE_STAGES) + (probe is not None), desc="calibrate", unit="stage", enabled=wanted(progress),
                 bar_format="{l_bar}{bar}| {n}/{total} stages [{elapsed}<{remaining}]{postfix}")

    def done(name):
        stages.set_postfix_str(name, refresh=False)
        stages.update(1)

    try:
        cal = cal_fn(run, capacity_tokens=capacity_tokens, estimator=estimator, window=window, steps_from=steps_from,
                     on_stage=done, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     profile=profile_dir)
        if probe is not None:
            from llmqueue.bench.calibrate import with_frontend_latency

            cal = with_frontend_latency(cal, probe)
            done("frontend latency (probe)")
    finally:
        stages.close()
    write_calibration(cal, out)
    if as_json:
        print_json({**cal.to_dict(), "written": out})
        return
    rows = [("run", cal.source), ("M (KV capacity, tokens)", cal.capacity_tokens), ("b (s), " + cal.b_estimator, cal.b)]
    rows += [(f"  b {k}", v) for k, v in cal.b_estimators.items()]
    rows += [("inter-token samples", cal.itl_samples), ("inter-token CV", cal.itl_cv)]
    if cal.frontend_latency_s is not None:
        rows.append(("frontend latency (s)", cal.frontend_latency_s))
        rows.append(("  from", cal.frontend_source or "-"))
    if cal.linear:
        rows.append(("linear step model", "c0={c0:.4g} prefill={prefill:.3g} decode={decode:.3g} ctx={ctx:.3g} (R2 {r2:.3f})"
                     .format(**cal.linear)))
    if cal.step_time_profile:
        rows.append(("profile step model", f"{cal.step_time_profile} (the step_time)"))
    if cal.speed_sd is not None:
        rows.append(("engine speed sd (10-s windows)", cal.speed_sd))
    rows += [("note", n) for n in cal.notes]
    print_kv(rows, title="Calibration")
    click.echo(f"\nwritten to {out}")


@command("validate")
@click.argument("run", type=InputPath("dir"))
@click.option("--calibration", "cal_path", default="calibration.yaml", show_default=True, type=InputPath("file"),
              help="The calibration file (llmqueue calibrate).")
@click.option("--warmup", type=float, help="Seconds left out (default: the run's).")
@click.option("--horizon", default=None, metavar="SECONDS|last-send",
              help="Measure up to this run second, or last-send: up to the client's last send (a "
                   "concurrency-capped saturation run's saturated part).")
@click.option("--step-model", type=click.Choice(["constant", "linear", "profile"]), default="constant",
              show_default=True, help="Simulate with the constant b-bar (Nie et al. 2026), the fitted linear "
              "step-time model, or the profile at the run's level (calibrate --profile).")
@click.option("--token-g", is_flag=True, help="Theory: count E[g] in tokens (the paper) instead of whole KV blocks.")
@click.option("--no-frontend", is_flag=True, help="Leave out the calibration's frontend latency.")
@click.option("--arrivals", type=click.Choice(["auto", "sent", "intended"]), default="auto", show_default=True,
              help="Replay and measure from the actual send times (sent) or the schedule (intended); auto: "
                   "intended for a concurrency-capped run, else sent.")
@click.option("--speed-band", type=float, default=None,
              help="Also simulate with steps this fraction faster and slower and give each prediction's "
                   "range (default: 2 x the calibration's measured speed_sd; 0: off).")
@click.option("--speed-factor", default=None,
              help="Simulate (and price the theory's b) with steps this many times as long, or 'run': at the "
                   "engine's speed in this run (from its step log; a diagnosis, not a prediction).")
@click.option("--drift", type=float, default=None,
              help="The engine's speed wander within a run (CV over 10-s windows) to simulate: each "
                   "prediction is the mean over --drift-reps draws (default: the calibration's speed_sd; 0: off).")
@click.option("--drift-reps", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Simulations (speed draws) averaged when drift is on.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar over the simulations (default: on a terminal).")
@click.option("--margin", type=float, metavar="FRACTION",
              help="Also the prediction's distance to the preemption cliff: the same stream re-simulated with a "
                   "slower engine and more traffic (about 15 more runs); within FRACTION (e.g. 0.1) the simulated "
                   "verdict is metastable (at the cliff when its path already preempts).")
@click.option("--verdict-copies", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Judge the simulated verdict on the run's stream replayed N times back to back: the system at "
                   "this rate, not one finite path (a few minutes at 1.2x capacity may not show growth).")
@knob_options(names=VALIDATE_KNOBS, default_from="the calibrated server's")
@json_option
@click.pass_context
def validate(ctx, run, cal_path, warmup, horizon, step_model, token_g, no_frontend, arrivals, speed_band,
             speed_factor, drift, drift_reps, progress, margin, verdict_copies, as_json, **flags):
    """Theory and simulation with calibrated inputs, against the measured run: relative errors.

    The engine flags given (--max-num-seqs, --max-num-batched-tokens, --policy, --capacity-tokens,
    --step-time, ...) override the calibrated server's: what the run would have done with them.
    """
    from llmqueue._progress import wanted
    from llmqueue.bench.calibrate import load_calibration
    from llmqueue.bench.validate import validate as val_fn

    horizon = _run_second(run, horizon, "--horizon")
    res = val_fn(run, load_calibration(cal_path), warmup_s=warmup, step_model=step_model, horizon_s=horizon,
                 paged=not token_g, frontend=not no_frontend, arrivals=arrivals, speed_band=speed_band,
                 speed_factor=speed_factor, drift=drift, drift_reps=drift_reps,
                 knobs={k: flags[k] for k in given_flags(ctx, flags)}, progress=wanted(progress), margin=margin,
                 verdict_copies=verdict_copies)
    if as_json:
        print_json(res)
        return

    def pct(x):
        return "-" if x is None else f"{100 * x:+.1f}%"

    cap = res["capacity"]
    name = cap["quantity"] + (f" [{cap['theory_binding']}]" if cap.get("theory_binding") else "")
    rows = [[name, cap.get("theory"), cap.get("simulated"), cap.get("measured"),
             pct(cap.get("rel_err_theory")), pct(cap.get("rel_err_sim"))]]
    band = bool(res.get("speed_band"))

    def rng(r):
        b = r.get("band")
        return "-" if not b else f"{b[0]:.4g}-{b[1]:.4g}" + ("" if r.get("in_band") else " (outside)")

    rows[0] += ["-"] if band else []
    for r in res["rows"]:
        rows.append([r["quantity"], "-", r["simulated"], r["measured"], "-", pct(r["rel_err_sim"])]
                    + ([rng(r)] if band else []))
    v = res["verdicts"]
    rows.append(["verdict", v["theory"], v["simulated"], v["measured"], "", ""] + ([""] if band else []))
    if v.get("simulated_copies"):
        rows.append([f"verdict, this path (simulated x{v['simulated_copies']} above)", "", v["simulated_path"], "",
                     "", ""] + ([""] if band else []))
    head = ["quantity", "theory", "simulation", "measured", "err theory", "err sim"]
    if band:
        head.append(f"sim, engine +-{100 * res['speed_band']:.0f}%")
    sf = res.get("speed_factor")
    lam = "-" if res.get("lam") is None else f"{res['lam']:.3f} req/s" + (
        " from the send times" if str(res.get("lam_source", "")).startswith("send") else "")
    title = f"Predicted vs measured ({res['run']}, lam = {lam}" + (
        f"; engine speed x{sf:.3f} applied" if sf else "") + (
        f"; speed drift {100 * res['drift']:.1f}% over 10-s windows, mean of {res['drift_reps']} draws)"
        if res.get("drift") else ")")
    print_table(head, rows, title=title)
    rp = res.get("replay") or {}
    notes = list(res.get("notes") or [])
    if rp.get("left_out_server_errors"):
        notes.append(f"{rp['left_out_server_errors']} request(s) the server answered with an error are left out "
                     f"of the replay ({rp['requests']} replayed)")
    if rp.get("client_timeout_s") or rp.get("client_ttft_timeout_s"):
        notes.append("the client's deadlines applied: " + ", ".join(
            f"{name} {c} {v:g} s" for name, d in (("timeout", rp.get("client_timeout_s")),
                                                  ("TTFT timeout", rp.get("client_ttft_timeout_s")))
            for c, v in (d or {}).items()))
    if rp.get("retries_replayed") is False:
        notes.append("the run retried failed attempts; the replay sends each request once")
    if v.get("theory_detail"):
        notes.append("theory: " + v["theory_detail"])
    for line in notes:
        click.echo(f"note: {line}")
    m = res.get("regime_margin")
    if m:
        from llmqueue.margin import margin_rows

        print_kv(margin_rows(m), title="Distance to the preemption cliff (simulated, the same stream)")
