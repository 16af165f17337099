"""``llmqueue sweep`` and ``llmqueue capacity``: load sweeps and the SLO-bounded capacity search.

Both take the simulate command's flags (or ``--scenario``) for the base point; see
:mod:`llmqueue.plan.sweep_run` and :mod:`llmqueue.plan.capacity` for what they compute.
"""

from __future__ import annotations

import click

from llmqueue.cli.common import OutputPath, command, fmt, json_option, print_json, print_kv, print_table
from llmqueue.cli.flags import given_flags, knob_options
from llmqueue.errors import InputError

_BACKENDS = ("local", "serial", "ray")


def _base(ctx: click.Context, scenario, flags: dict):
    """``(factory, base)`` from the command's flags: a scenario with the given flags overriding
    its fields (checked here, before any point runs), or the flags alone."""
    from llmqueue.spec import build_spec, scenario_spec

    if scenario is None:
        return build_spec, dict(flags)
    from pathlib import Path

    from llmqueue.scenario.override import scenario_with

    p = Path(scenario).expanduser()
    base = {"scenario": str(p.resolve()) if p.is_file() else scenario}
    base.update({k: flags[k] for k in given_flags(ctx, flags)})
    scenario_with(**base)  # a flag that cannot apply, or a bad value, fails now in one line
    return scenario_spec, base


def _convert(name: str, text: str):
    """A --param value converted to the knob's type (ints, floats, booleans...) and checked."""
    from llmqueue.knobs import convert

    try:
        return convert(name, text)
    except InputError as e:
        raise InputError("param", f"{name}={text.strip()}: {e.problem}", e.fix) from None


def _params(ctx, items) -> dict:
    out: dict = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise InputError("param", f"{item!r} is not NAME=V1,V2,...", "e.g. --param max_num_seqs=8,16,32")
        key = name.strip().replace("-", "_")
        if key in out:
            raise InputError("param", f"{key} is given twice", "list all its values in one --param")
        out[key] = [_convert(key, v) for v in values.split(",") if v.strip()]
    return out


def _rates(text):
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError("rates", f"{text!r} is not a comma-separated list of numbers", "e.g. --rates 1,3,5,20,50") \
            from None


def _slos(ctx, scenario, flags, percentile) -> dict:
    from llmqueue.plan.slo_judge import scenario_slos, slo_targets

    slos = slo_targets(ttft_ms=flags.get("slo_ttft_ms"), tpot_ms=flags.get("slo_tpot_ms"),
                       e2el_ms=flags.get("slo_e2el_ms"), percentile=percentile)
    if not slos and scenario is not None:
        slos = scenario_slos(scenario)
    return slos


def _sweep_outputs(p):
    return [p / n for n in ("sweep.parquet", "sweep.csv", "sweep.json", "capacity.json")]


def run_options(f):
    """Backend, output and progress flags shared by sweep and capacity."""
    opts = [
        click.option("--backend", type=click.Choice(_BACKENDS), default="local", show_default=True,
                     help="local: a process pool; serial: one at a time in this process; ray: Ray tasks."),
        click.option("--workers", type=int, help="Parallel simulations (default: every core; the Ray cluster's CPUs)."),
        click.option("--address", help="Ray cluster to join (with --backend ray), e.g. auto or ray://host:10001."),
        click.option("--out", "out_dir", type=OutputPath("dir", also=_sweep_outputs),
                     help="Output directory: cached points (resumable), the table and the JSON (created with "
                          "any missing parents; checked before any point runs)."),
        click.option("--progress/--no-progress", default=None, help="Progress bar over points (default: on a terminal)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _progress(progress):
    import sys

    return sys.stderr.isatty() if progress is None else progress


def _short_verdict(v):
    if not v or v == "stable":
        return v or "-"
    import re

    m = re.search(r"grows ([0-9.eE+-]+) req/s", v)
    return f"unstable +{m.group(1)}/s" if m else v.split("(")[0].strip()


def _ms_ci(row, key):
    v = row.get(key)
    if v is None:
        return "-"
    lo, hi = row.get(key + "_ci_lo"), row.get(key + "_ci_hi")
    return f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None else fmt(v)


@command("sweep")
@click.option("--scenario", help="Base point: a scenario file or shipped example (llmqueue scenario list); the "
              "flags given with it override its fields.")
@click.option("--rates", help="Arrival rates (req/s), comma-separated: rescales the arrival process, keeping its shape.")
@click.option("--param", "param_items", multiple=True, metavar="NAME=V1,V2,...",
              help="Sweep another simulate flag, e.g. max_num_seqs=8,16,32 (repeatable; the grid is the product).")
@knob_options()
@click.option("--percentile", type=float, default=99, show_default=True, help="Percentile the SLOs apply to.")
@click.option("--seeds", type=click.Choice(["derived", "common"]), default="derived", show_default=True,
              help="derived: each point its own seed from --seed and its coordinates; common: --seed everywhere.")
@click.option("--knee-metric", default="p99_ttft_ms", show_default=True, help="Latency whose curve gives the knee.")
@click.option("--knee-factor", type=float, default=2.0, show_default=True,
              help="Knee: where the latency first reaches this multiple of its lowest-rate value.")
@click.option("--keep-runs", is_flag=True, help="Also write each point's records to OUT/runs/KEY/.")
@click.option("--url", help="Run each point against this OpenAI-compatible server (llmqueue bench), one at a time; "
              "--model is then the served model's name, as bench's.")
@click.option("--served-model", help="With --url: the served model name, the same as --model with --url (default: "
              "the server's first).")
@click.option("--csv", "as_csv", is_flag=True, help="Write OUT/sweep.csv instead of OUT/sweep.parquet.")
@run_options
@json_option
@click.pass_context
def sweep(ctx, scenario, rates, param_items, percentile, seeds, knee_metric, knee_factor, keep_runs, url,
          served_model, as_csv, backend, workers, address, out_dir, progress, as_json, **flags):
    """Simulate a grid of arrival rates and engine knobs; tabulate latency versus load.

    Each point is one `llmqueue simulate` run with its own seed (derived from --seed and the
    point, so the numbers do not depend on the order or the backend). With --out, finished
    points are cached in OUT/points/ and a rerun simulates only the missing ones; the table goes
    to OUT/sweep.parquet (or .csv) and everything to OUT/sweep.json. Per curve: the knee (where
    the latency first reaches --knee-factor x its lowest-rate value), the theory's capacity mu,
    the simulated stability bracket and, with SLOs, the highest rate meeting them.

    Examples:

      llmqueue sweep --rates 1,3,5,20,50 --capacity-tokens 131000 --step-time 0.0372 --chunk 512
      --prompt-len uniform:10:1600 --output-len uniform:10:1600 --duration 1800 --out runs/kv-sweep

      llmqueue sweep --scenario chat --rates 5,10,15,20 --param max_num_seqs=64,256 --duration 900
    """
    from llmqueue.plan.sweep_run import sweep as run_sweep

    served = _served_model(url, served_model, scenario, flags)
    factory, base = _base(ctx, scenario, flags)
    slos = _slos(ctx, scenario, flags, percentile)
    metric = knee_metric.strip()
    from llmqueue.plan.sweep_run import LATENCIES

    valid = {f"{s}_{m}_ms" for m in LATENCIES for s in ("mean", "median", "p50", "p90", "p95", "p99")}
    if metric not in valid:
        raise InputError("knee_metric", f"unknown latency {metric!r}", "e.g. p99_ttft_ms, p99_e2el_ms, mean_ttft_ms")
    res = run_sweep(factory, base, rates=_rates(rates), params=_params(ctx, param_items), seeds=seeds,
                    backend=backend, workers=workers, address=address, out_dir=out_dir, keep_runs=keep_runs,
                    slos=slos or None, knee_metric=metric, knee_factor=knee_factor, progress=_progress(progress),
                    target=_target(url, served))
    written = res.write(out_dir, csv=as_csv) if out_dir else []
    if as_json:
        print_json(res.to_dict())
        return
    print_sweep(res, written, out_dir)


def _served_model(url, served_model, scenario, flags: dict) -> str | None:
    """With ``--url``, the model to ask the server for: ``--model``, the served model's name as
    ``llmqueue bench --model`` reads it (taken out of ``flags``: no catalog model is simulated
    against a server, each point sends only the workload), or ``--served-model`` (the same; both
    given must agree); None: the server's first listed. Without ``--url``, ``--model`` stays the
    catalog model and ``--served-model`` is refused."""
    if url is None:
        if served_model is not None:
            raise InputError("served_model", "--served-model needs --url")
        return None
    name = flags.pop("model", None)
    if name is not None and served_model is not None and name != served_model:
        raise InputError("model", f"--model {name!r} and --served-model {served_model!r} both name the served model",
                         "with --url, give one of them (the name the server lists at /v1/models)")
    if scenario is None and flags.get("step_time") is None:
        flags["step_time"] = "1"  # server points use only the workload; the engine model is not simulated
    return served_model or name


def _target(url, model):
    """``--url``: the server each point runs against and the model asked of it (the server's first
    listed one when ``model`` is None)."""
    if url is None:
        return None
    from llmqueue.bench.http import check_url

    check_url(url)
    if model is None:
        from llmqueue.bench.served_model import server_model

        model = server_model(url)
    return {"url": url, "model": model}


def print_sweep(res, written=(), out_dir=None) -> None:
    coords = list(res.grid)
    headers = [*coords] if coords else ["rate"]
    headers += ["throughput (req/s)", "p99 TTFT ms [CI]", "p99 TPOT ms [CI]", "p99 E2EL ms", "failed", "verdict",
                "Little gap", "theory mu"]
    goodput = any(r.get("request_goodput") is not None for r in res.rows)
    if goodput:
        headers.insert(headers.index("failed") + 1, "goodput (req/s)")
    slo = bool(res.meta.get("slos"))
    if slo:
        headers.append("SLO")
    rows = []
    for r in res.rows:
        row = [r.get(c) for c in coords] if coords else [r.get("rate")]
        fs = r.get("failed_share")
        row += [r.get("request_throughput"), _ms_ci(r, "p99_ttft_ms"), _ms_ci(r, "p99_tpot_ms"), r.get("p99_e2el_ms"),
                "-" if fs is None else f"{100 * fs:.3g}%"]
        if goodput:
            row.append(r.get("request_goodput"))
        row += [_short_verdict(r.get("verdict")), r.get("little_gap"), r.get("theory_mu")]
        if slo:
            row.append(("meets" if r.get("slo_met") else "fails") + (" (est.)" if r.get("slo_basis") == "estimate" else ""))
        rows.append(row)
    print_table(headers, rows, title=f"Sweep: {len(res.rows)} points on {res.meta.get('backend')}")
    for c in res.curves:
        g = ", ".join(f"{k}={v}" for k, v in c["group"].items())
        click.echo(f"\nCurve{' ' + g if g else ''} ({c['metric']} vs rate)")
        k = c["knee"]
        pairs = [("knee (rate, req/s)",
                  f"{fmt(k['rate'])} in [{fmt(k['bracket'][0])}, {fmt(k['bracket'][1])}] (throughput {fmt(k['throughput'])};"
                  f" {c['metric']} reaches {fmt(k['threshold'])} = {fmt(k['factor'])} x {fmt(k['low_load_latency'])})"
                  if k else "not reached")]
        pairs.append((f"theory mu (binding: {c.get('theory_binding')})", c.get("theory_mu")))
        pairs.append(("simulated: stable up to / unstable from", f"{fmt(c['stable_up_to'])} / {fmt(c['unstable_from'])}"))
        if "slo" in c:
            pairs.append(("highest rate meeting the SLO (all below too)", c.get("max_rate_meeting_slo")))
        print_kv(pairs)
    click.echo(f"\n{res.ran} simulated, {res.cached} from the cache" + (f" ({out_dir}/points)" if out_dir else "")
               + f"; {fmt(res.meta.get('wall_s'))} s wall")
    if written:
        click.echo("wrote " + ", ".join(str(p) for p in written))


@command("capacity")
@click.option("--scenario", help="Base point: a scenario file or shipped example (its slos: are the default targets); "
              "the flags given with it override its fields.")
@click.option("--percentile", type=float, default=99, show_default=True, help="Percentile the targets apply to.")
@knob_options()
@click.option("--rel-tol", type=float, default=0.02, show_default=True,
              help="Stop when the bracket [lo, hi] is narrower than this fraction of lo.")
@click.option("--confirm-factor", type=float, default=1.1, show_default=True,
              help="The second confirming simulation runs at this multiple of the answer; it must fail.")
@click.option("--lo", type=float, help="First rate to simulate (default: the base arrival rate).")
@click.option("--hi", type=float, help="A rate expected to fail (default: the theory's mu, then doubling).")
@click.option("--max-evals", type=int, default=60, show_default=True, help="At most this many simulations.")
@click.option("--replications", type=int, default=0, show_default=True,
              help="Extra runs at the answer with fresh seeds (how much the answer depends on the sample).")
@click.option("--url", help="Search against this OpenAI-compatible server instead of the simulator: each rate is "
              "one llmqueue bench run (open loop), one at a time; --model is then the served model's name, as bench's.")
@click.option("--served-model", help="With --url: the served model name, the same as --model with --url (default: "
              "the server's first).")
@click.option("--speed-spread", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), metavar="FRACTION",
              help="The engine's run-to-run speed spread (log-scale sd, e.g. 0.07): at the answer, the probability "
              "that it makes the deployment miss the SLOs or preempt (about 12 more simulations). On by default "
              "with --step-time fitted:CALIBRATION (the spread it records).")
@run_options
@json_option
@click.pass_context
def capacity(ctx, scenario, percentile, rel_tol, confirm_factor, lo, hi, max_evals, replications, url, served_model,
             speed_spread, backend, workers, address, out_dir, progress, as_json, **flags):
    """The highest arrival rate whose simulated percentiles meet the SLO targets.

    A run meets the targets when the upper bound of each percentile's 95% confidence interval
    is within its target (the estimate when the run is too short for an interval), at most
    1 - p/100 of the requests failed, and the queue does not grow. The rate is searched between
    the base rate and the theory's capacity mu (doubling when mu meets), every rate with the same
    seed; the answer is confirmed by a run that meets and one at --confirm-factor x the rate that
    does not.

    Examples:

      llmqueue capacity --scenario chat --duration 900

      llmqueue capacity --slo-ttft-ms 2000 --slo-tpot-ms 100 --capacity-tokens 131000 --step-time 0.0372
      --chunk 512 --prompt-len uniform:10:1600 --output-len uniform:10:1600 --arrival poisson:1 --duration 1800

      llmqueue capacity --url http://127.0.0.1:8000 --slo-ttft-ms 500 --prompt-len uniform:10:1600
      --output-len uniform:10:400 --arrival poisson:2 --duration 120 --out runs/cap

    With --url every rate is measured on the server (llmqueue bench, latencies from the actual
    send as vLLM's), with the same rule; there is no theory bound, so the bracket doubles from
    the first rate until one fails (give --hi to start higher). --model then names the served
    model, as in llmqueue bench (no engine, so no catalog model, is simulated).
    """
    import json
    from pathlib import Path

    from llmqueue.plan.capacity import capacity_search

    served = _served_model(url, served_model, scenario, flags)
    factory, base = _base(ctx, scenario, flags)
    slos = _slos(ctx, scenario, flags, percentile)
    if not slos:
        raise InputError("slo_ttft_ms", "no SLO targets", "give --slo-ttft-ms and/or --slo-tpot-ms (or a scenario "
                         "with slos:)")
    spread = None
    if url is not None and speed_spread is not None:
        raise InputError("speed_spread", "prices a simulated deployment's engine speed; with --url every rate is "
                         "measured", "drop --speed-spread, or --url")
    st = flags.get("step_time")
    if url is None and (speed_spread is not None or (isinstance(st, str) and st.lower().startswith("fitted:"))):
        from llmqueue.margin import speed_spread_for

        spread = speed_spread_for(speed_spread, st)
    res = capacity_search(factory, base, slos=slos, rel_tol=rel_tol, confirm_factor=confirm_factor, lo=lo, hi=hi,
                          max_evals=max_evals, replications=replications, backend=backend, workers=workers,
                          address=address, out_dir=out_dir, progress=_progress(progress),
                          target=_target(url, served), speed_spread=spread)
    d = res.to_dict()
    if out_dir:
        from llmqueue._files import write_atomic

        write_atomic(Path(out_dir) / "capacity.json", json.dumps(d, indent=1, allow_nan=False) + "\n")
    if as_json:
        print_json(d)
        return
    print_capacity(res, d, out_dir)


def print_capacity(res, d, out_dir=None) -> None:
    targets = ", ".join(f"{k} <= {fmt(v)}" for k, v in res.slos.items())
    rows = [("SLO targets", targets)]
    if res.rate is None:
        rows.append(("capacity (req/s)", "no rate meets the SLO"))
    else:
        width = d.get("bracket_rel_width")
        rows.append(("capacity (req/s)", res.rate))
        rows.append(("bracket [lo, hi] (req/s)", f"[{fmt(res.lo)}, {fmt(res.hi)}]"
                     + (f"  width {width:.1%} of lo" if width is not None else "")))
        at = res.confirm.get("at_rate") if res.confirm else None
        if at:
            rows.append(("throughput at the answer (req/s)", at.get("request_throughput")))
            for k in res.slos:
                ci = at.get(k + "_ci")
                rows.append((f"{k} at the answer [95% CI]",
                             f"{fmt(at.get(k))}" + (f"  [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "  (no CI: run too short)")))
            rows.append(("verdict at the answer", at.get("verdict")))
        if d.get("tipping"):
            from llmqueue.plan.tipping import tipping_lines

            for i, line in enumerate(tipping_lines(d["tipping"])):
                rows.append(("engine speed spread" if i == 0 else "", line))
        if res.confirm:
            ab = res.confirm["above"]
            rows.append(("confirm: at the answer", "meets" if res.confirm["at_rate"]["meets"] else "FAILS"))
            rows.append((f"confirm: at {fmt(res.confirm['factor'])} x ({fmt(ab['rate'])} req/s)",
                         ("fails: " + "; ".join(ab["reasons"])) if not ab["meets"] else "MEETS"))
        if res.replications:
            rows.append(("fresh-seed replications meeting", f"{d['replications_meeting']} / {len(res.replications)}"))
            for r in res.replications:
                vals = ", ".join(f"{k} {fmt(r.get(k))}" for k in res.slos)
                why = "meets" if r["meets"] else "fails (" + "; ".join(r["reasons"]) + ")"
                rows.append((f"replication, seed {r['seed']}", f"{why}: {vals}"))
    rows.append(("theory mu (at the base rate)", res.theory_mu))
    rows.append(("converged", res.converged))
    server = (d.get("target") or {}).get("url")
    rows.append(("measured runs" if server else "simulations",
                 f"{d['simulations']} run, {d['cached']} from the cache, {fmt(d['wall_s'])} s wall on "
                 + (f"the server {server}" if server else f"{d['backend']}")))
    print_kv(rows, title="Capacity (SLO-bounded)" + (", measured" if server else ""))
    ev = d["evaluations"]
    keys = list(res.slos)
    print_table(["rate", "meets", *keys, "failed share", "verdict", "why not"],
                [[e["rate"], "yes" if e["meets"] else "no", *[e.get(k) for k in keys], e["failed_share"],
                  _short_verdict(e.get("verdict")), "; ".join(e["reasons"]) or "-"] for e in ev],
                title="\nMeasured rates" if server else "\nSimulated rates")
    if out_dir:
        click.echo(f"\nwrote {out_dir}/capacity.json (points cached in {out_dir}/points)")
