"""``llmqueue calibrate`` and ``llmqueue validate``: measured inputs, then predicted vs measured."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, json_option, print_json, print_kv, print_table


@command("calibrate")
@click.argument("run", type=click.Path())
@click.option("-o", "--output", "out", default="calibration.yaml", show_default=True, help="Calibration file to write.")
@click.option("--capacity-tokens", type=float, help="KV capacity M, when the run did not record the server's.")
@click.option("--estimator", default="median", show_default=True,
              help="b-bar estimator: median, mean, trimmed_0.05, trimmed_0.1 (seed 004 appendix C).")
@json_option
def calibrate(run, out, capacity_tokens, estimator, as_json):
    """Measure M, b-bar (and a linear step-time model when step records exist) from a run directory.

    The file feeds the simulator (`--step-time fitted:FILE`, `--capacity-tokens`) and `llmqueue validate`.
    """
    from llmqueue.bench.calibrate import calibrate as cal_fn
    from llmqueue.bench.calibrate import write_calibration

    cal = cal_fn(run, capacity_tokens=capacity_tokens, estimator=estimator)
    write_calibration(cal, out)
    if as_json:
        print_json({**cal.to_dict(), "written": out})
        return
    rows = [("run", cal.source), ("M (KV capacity, tokens)", cal.capacity_tokens), ("b (s), " + cal.b_estimator, cal.b)]
    rows += [(f"  b {k}", v) for k, v in cal.b_estimators.items()]
    rows += [("inter-token samples", cal.itl_samples), ("inter-token CV", cal.itl_cv)]
    if cal.linear:
        rows.append(("linear step model", "c0={c0:.4g} prefill={prefill:.3g} decode={decode:.3g} ctx={ctx:.3g} (R2 {r2:.3f})"
                     .format(**cal.linear)))
    rows += [("note", n) for n in cal.notes]
    print_kv(rows, title="Calibration")
    click.echo(f"\nwritten to {out}")


@command("validate")
@click.argument("run", type=click.Path())
@click.option("--calibration", "cal_path", default="calibration.yaml", show_default=True)
@click.option("--warmup", type=float, help="Seconds left out (default: the run's).")
@click.option("--step-model", type=click.Choice(["constant", "linear"]), default="constant", show_default=True,
              help="Simulate with the constant b-bar (seed 004) or the fitted linear step-time model.")
@json_option
def validate(run, cal_path, warmup, step_model, as_json):
    """Theory and simulation with calibrated inputs, against the measured run: relative errors."""
    from llmqueue.bench.calibrate import load_calibration
    from llmqueue.bench.validate import validate as val_fn

    res = val_fn(run, load_calibration(cal_path), warmup_s=warmup, step_model=step_model)
    if as_json:
        print_json(res)
        return

    def pct(x):
        return "-" if x is None else f"{100 * x:+.1f}%"

    cap = res["capacity"]
    rows = [[cap["quantity"], cap.get("theory"), cap.get("simulated"), cap.get("measured"),
             pct(cap.get("rel_err_theory")), pct(cap.get("rel_err_sim"))]]
    for r in res["rows"]:
        rows.append([r["quantity"], "-", r["simulated"], r["measured"], "-", pct(r["rel_err_sim"])])
    v = res["verdicts"]
    rows.append(["verdict", v["theory"], v["simulated"], v["measured"], "", ""])
    print_table(["quantity", "theory", "simulation", "measured", "err theory", "err sim"], rows,
                title=f"Predicted vs measured ({res['run']}, lam = {res['lam']:.3f} req/s)")
