"""``llmqueue plan``: the cheapest deployment meeting p99 SLOs (theory-pruned, simulation-verified).

See :mod:`llmqueue.plan.planner` for the search and :mod:`llmqueue.plan.bounds` for the theory.
"""

from __future__ import annotations

import click

from llmqueue.cli.common import InputPath, OutputPath, command, fmt, json_option, print_json, print_kv, print_table
from llmqueue.errors import InputError


def _plan_outputs(p):
    return [p / "plan.json"]


def _ci(b: dict, key: str) -> str:
    v, ci = b.get(key), b.get(key + "_ci")
    if v is None:
        return "-"
    return f"{fmt(v)}  [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else f"{fmt(v)}  (no CI: estimate judged)"


@command("plan")
@click.option("--scenario", help="Workload, model, deployment and SLO defaults: a scenario file or shipped example "
              "(llmqueue scenario list). Optional with --trace or --workload (then give --models and the SLOs).")
@click.option("--trace", type=InputPath("file"), help="Replay this trace (Azure CSV, Mooncake JSONL, canonical "
              "Parquet, ... as llmqueue simulate --trace) in place of the scenario's workload: the whole trace, "
              "or its first --duration seconds; theory takes its lengths and its rate (n-1)/span.")
@click.option("--workload", "fitted", type=InputPath("file"), help="A fitted workload (llmqueue workload fit -o "
              "FILE) in place of the scenario's: its arrival process and length distributions.")
@click.option("--models", help="Models to search, comma-separated (llmqueue kv --list), e.g. "
              "llama-3.1-8b,llama-3.1-70b. Default: the scenario's. A model changes answer quality, which the "
              "planner does not judge: the cheapest configuration meeting the latency SLOs wins, whatever its model.")
@click.option("--slo-ttft-p99-ms", "slo_ttft_ms", type=float, help="Target on p99 TTFT (ms). Default: the scenario's.")
@click.option("--slo-tpot-p99-ms", "slo_tpot_ms", type=float, help="Target on p99 TPOT (ms). Default: the scenario's.")
@click.option("--gpus", default=None, help="GPU types, comma-separated (llmqueue kv --list). Default: the whole catalog.")
@click.option("--tp", "tp", default="1,2,4", show_default=True, help="Tensor-parallel sizes: 1,2,4 or a range 1..8.")
@click.option("--pp", "pp", default="1", show_default=True,
              help="Pipeline-parallel sizes (vLLM's pipeline_parallel_size): 1,2 or a range; a replica rents "
              "tp x pp GPUs.")
@click.option("--replicas", default="1..16", show_default=True, help="Replica counts: a list or a range A..B.")
@click.option("--max-num-seqs", default="64,128,256", show_default=True, help="vLLM max_num_seqs values.")
@click.option("--max-num-batched-tokens", default="2048,8192", show_default=True,
              help="vLLM max_num_batched_tokens values (the token budget per step).")
@click.option("--routers", help="Fleet routers, comma-separated (simulate --help lists them) [default: a scenario "
              "pool's default, JSQ].")
@click.option("--pd-splits", default="", help="P:D splits added to the space (prefill:decode replicas of the same "
              "engine, the KV crossing a link), e.g. 1:1,1:2,2..3:4. Default: none (aggregated serving only). "
              "With --replicas '' the space holds the splits alone.")
@click.option("--kv-link-gbps", type=float, help="P:D splits: the KV link's bandwidth (Gbit/s) [default: 100].")
@click.option("--kv-link-latency-ms", type=float, help="P:D splits: the KV link's latency (ms) [default: 0.05].")
@click.option("--calibration", "calibration", type=InputPath("file"),
              help="A calibration (llmqueue calibrate) in place of the roofline: its step model and KV capacity. "
              "Measured on one GPU at one tp: give --gpus and --tp with those alone.")
@click.option("--step-time", help="A step-time spec in place of the roofline (0.0372, linear:..., fitted:FILE, any "
              "spec simulate takes), for the one GPU and tp of --gpus and --tp.")
@click.option("--budget-per-hour", type=float, help="Only configurations costing at most this (USD/h).")
@click.option("--rho-max", type=float, default=0.95, show_default=True,
              help="Prune configurations whose load lam / (R mu) exceeds this.")
@click.option("--duration", type=float, help="Simulated seconds per configuration (default: the warm-up plus "
              "12,000 requests, at least the scenario's run).")
@click.option("--seed", type=int, help="Seed of every simulation (default: the scenario's).")
@click.option("--backend", type=click.Choice(["serial", "local", "ray"]), default="serial", show_default=True,
              help="serial: one simulation at a time; local: a process pool; ray: Ray tasks (--workers per round). "
              "Every backend gives the same answer for the same seed.")
@click.option("--workers", type=int, help="With --backend local or ray: parallel simulations (default: every core).")
@click.option("--address", help="Ray cluster to join (with --backend ray), e.g. auto or ray://host:10001.")
@click.option("--out", "out_dir", required=True, type=OutputPath("dir", also=_plan_outputs),
              help="Directory for plan.json (every configuration and its status) and the cached points.")
@click.option("--sensitivity/--no-sensitivity", default=True, show_default=True,
              help="Simulate the recommendation with 20% more traffic, burstier arrivals, a 15-minute x2 spike "
              "and a 10% slower engine, and search its rate margin (adds wall time).")
@click.option("--speed-spread", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), metavar="FRACTION",
              help="With --sensitivity: the engine's run-to-run speed spread (log-scale sd) behind the probability "
              "that the recommendation misses the SLOs or preempts [default: the --calibration's, else 0.07].")
@click.option("--report/--no-report", "report", default=False, show_default=True,
              help="Also write OUT/report.html: the frontier, the sensitivity table, the margin "
              "(llmqueue report OUT writes it later).")
@click.option("--progress/--no-progress", default=None, help="Progress bar over simulations (default: on a terminal).")
@json_option
@click.pass_context
def plan(ctx, scenario, trace, fitted, models, slo_ttft_ms, slo_tpot_ms, gpus, tp, pp, replicas, max_num_seqs, max_num_batched_tokens, routers,
         pd_splits, kv_link_gbps, kv_link_latency_ms, calibration, step_time, budget_per_hour, rho_max, duration, seed,
         backend, workers, address, out_dir, sensitivity, speed_spread, report, progress, as_json):
    """The cheapest deployment whose simulated p99 TTFT and TPOT meet the targets.

    The space is model (--models) x GPU type x --tp x --pp x (--replicas, and the P:D splits of
    --pd-splits) x --max-num-seqs x --max-num-batched-tokens x --routers, for the workload of
    the scenario, of a replayed --trace or of a fitted --workload. Theory prices each configuration (catalog price x tp x pp x replicas), bounds its
    sustainable rate (replicas x the replica's capacity mu) and its single-request latencies,
    and prunes those that cannot meet the SLOs. The rest are simulated cheapest first until one
    meets them: the upper bound of each p99's 95% CI within its target (the estimate when the
    run gives no CI), at most 1% failed, the queue stable. Steps are priced by the roofline unless
    --calibration or --step-time gives a measured model. A rerun with the same --out resumes:
    the configurations already simulated are read from its cache.

    Examples:

      llmqueue plan --scenario chat --slo-ttft-p99-ms 2000 --slo-tpot-p99-ms 50 --out runs/plan

      llmqueue plan --scenario chat --gpus h100-sxm,a100-80gb,l40s --tp 1,2 --replicas 1..8
      --budget-per-hour 20 --out runs/plan --json

      llmqueue plan --scenario chat --models llama-3.1-8b,llama-3.1-70b --gpus h100-sxm --out runs/plan

      llmqueue plan --trace conv.parquet --models llama-3.1-8b --slo-ttft-p99-ms 2000
      --slo-tpot-p99-ms 50 --duration 600 --out runs/plan
    """
    import json
    from pathlib import Path

    from llmqueue._progress import wanted
    from llmqueue.hardware import gpu_names
    from llmqueue.knobs import check
    from llmqueue.plan.slo_judge import scenario_slos, slo_targets
    from llmqueue.plan.planner import plan as run_plan
    from llmqueue.plan.space import parse_ints, parse_names, parse_splits

    slos = slo_targets(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms)
    if scenario is None and trace is None and fitted is None:
        raise InputError("scenario", "is required without --trace or --workload",
                         "give --scenario NAME_OR_FILE (llmqueue scenario list), or --trace FILE / --workload FILE")
    if trace is not None and fitted is not None:
        raise InputError("trace", "give --trace or --workload, not both",
                         "a trace replays recorded requests, a fitted workload generates new ones: choose one")
    if scenario is None and models is None:
        raise InputError("models", "is required without --scenario: no model to plan for",
                         "give --models, e.g. --models llama-3.1-8b (llmqueue kv --list)")
    if not slos and scenario is not None:
        slos = {k: v for k, v in scenario_slos(scenario).items() if k in ("p99_ttft_ms", "p99_tpot_ms")}
    if not slos:
        raise InputError("slo_ttft_ms", "no SLO targets", "give --slo-ttft-p99-ms and/or --slo-tpot-p99-ms")
    gpu_list = parse_names("gpus", gpus) if gpus is not None else tuple(gpu_names())
    if routers is None:
        from llmqueue.cluster.spec import Pool

        routers = Pool.model_fields["router"].default
    router_list = tuple(check("router", r) for r in parse_names("routers", routers))
    if duration is not None and not duration > 0:
        raise InputError("duration", f"must be positive (got {duration:g})")
    res = run_plan(scenario, models=models, trace=trace, workload=fitted, slos=slos, gpus=gpu_list, tp=parse_ints("tp", tp), pp=parse_ints("pp", pp), replicas=parse_ints("replicas", replicas),
                   max_num_seqs=parse_ints("max_num_seqs", max_num_seqs),
                   max_num_batched_tokens=parse_ints("max_num_batched_tokens", max_num_batched_tokens),
                   routers=router_list, pd_splits=parse_splits("pd_splits", pd_splits), kv_link_gbps=kv_link_gbps,
                   kv_link_latency_ms=kv_link_latency_ms, calibration=calibration, step_time=step_time,
                   budget_per_hour=budget_per_hour, duration=duration, seed=seed,
                   rho_max=rho_max, backend=backend, workers=workers, address=address, out_dir=out_dir, progress=wanted(progress),
                   sensitivity=sensitivity, speed_spread=speed_spread)
    d = res.to_dict()
    from llmqueue._files import write_atomic

    write_atomic(Path(out_dir) / "plan.json", json.dumps(d, indent=1, allow_nan=False) + "\n")
    if report:
        from llmqueue.report.plan_page import plan_report

        d["report"] = str(plan_report(out_dir, Path(out_dir) / "report.html").html_path)
    if res.recommended is None:
        raise InputError("replicas", f"no configuration meets the SLOs: all {res.count('simulated')} simulated "
                         f"survivors of theory failed (see {out_dir}/plan.json)", "widen the space or relax the targets")
    if as_json:
        print_json(d)
        return
    print_plan(res, d, out_dir)


def print_plan(res, d, out_dir) -> None:
    c = res.recommended
    cfg, b = c.config, c.result
    split = (f"; P:D {cfg.split}: {cfg.prefill_replicas} prefill + {cfg.decode_replicas} decode, KV link "
             f"{fmt(cfg.kv_link_gbps)} Gbit/s + {fmt(cfg.kv_link_latency_ms)} ms" if cfg.disaggregated else "")
    rows = [("SLO targets", ", ".join(f"{k} <= {fmt(v)}" for k, v in res.slos.items())),
            ("arrival rate lam (req/s)", res.lam),
            ("workload", _workload_line(d)),
            ("model", cfg.model or "-"),
            ("GPU", f"{cfg.gpu} x {cfg.gpus} ({cfg.replicas} replica{'s' if cfg.replicas > 1 else ''} of "
                    f"tensor_parallel_size {cfg.tensor_parallel_size}"
                    f"{f' x pipeline_parallel_size {cfg.pipeline_parallel_size}' if cfg.pipeline_parallel_size > 1 else ''}"
                    f"{split})"),
            ("max_num_seqs", cfg.max_num_seqs), ("max_num_batched_tokens", cfg.max_num_batched_tokens),
            ("router", cfg.router),
            ("cost (USD/h)", c.cost_per_hour),
            ("cost per million output tokens (USD)", b.get("cost_per_million_output_tokens")),
            ("theory: rho = lam / rate bound", f"{fmt(c.rho)} (rate bound {fmt(c.rate_bound)} req/s, {c.binding} binds)"),
            ("step model", d.get("step_model_source"))]
    for k in res.slos:
        rows.append((f"simulated {k} [95% CI]", _ci(b, k)))
    rows += [("verdict", b.get("verdict")),
             ("configurations", f"{d['configurations']}: {d['pruned']} pruned by theory, {d['simulated']} simulated, "
                                f"{d['not_needed']} not needed"),
             ("resumed", resumed_line(d)),
             ("wall (s)", f"{fmt(d['wall_s'])} (theory {fmt(d['theory_wall_s'])}), {d['duration_s']:g} s simulated "
                          f"per configuration, seed {d['seed']}")]
    print_kv(rows, title="Plan: the cheapest deployment meeting the SLOs")
    sims = [x for x in sorted(res.candidates, key=lambda x: x.order()) if x.result is not None]
    keys = list(res.slos)
    pipe = any(x.config.pipeline_parallel_size > 1 for x in res.candidates)  # a pp column only when searched
    print_table(["model", "gpu", "tp", *(["pp"] if pipe else []), "replicas", "P:D", "max_num_seqs",
                 "max_num_batched_tokens", "USD/h", *keys, "meets", "why not"],
                [[x.config.model or "-", x.config.gpu, x.config.tensor_parallel_size,
                  *([x.config.pipeline_parallel_size] if pipe else []), x.config.replicas, x.config.split or "-",
                  x.config.max_num_seqs, x.config.max_num_batched_tokens, x.cost_per_hour,
                  *[x.result.get(k) for k in keys], "yes" if x.meets else "no", x.reason or "-"] for x in sims],
                title="\nSimulated")
    if d.get("sensitivity"):
        print_sensitivity(d["sensitivity"], res.lam)
    if d.get("tipping"):
        from llmqueue.plan.tipping import tipping_lines

        for line in tipping_lines(d["tipping"]):
            click.echo("engine speed spread: " + line)
    click.echo(f"\nwrote {out_dir}/plan.json" + (f" and {d['report']}" if d.get("report") else
                                                 f" (the page: llmqueue report {out_dir})"))


def _workload_line(d: dict) -> str:
    """Where the workload comes from: the scenario, or the replayed trace / fitted file."""
    src = d.get("workload_source") or {}
    if src.get("kind") == "trace":
        return f"trace {src.get('path')}: replays {src.get('replayed')}"
    if src.get("kind") == "fitted workload":
        return f"fitted workload {src.get('path')}: arrival {src.get('arrival')}"
    return f"scenario {d.get('scenario')}"


def resumed_line(d: dict) -> str:
    """``resumed: K of N points from the cache`` (the search's simulations), or that none were."""
    r = d.get("resumed") or {}
    k, n = r.get("cached", 0), r.get("points", 0)
    return f"resumed: {k} of {n} points from the cache" if k else f"no point cached: {n} simulated"


def print_sensitivity(sens: dict, lam: float) -> None:
    rows = [[r["case"], _ci(r, "p99_ttft_ms"), _ci(r, "p99_tpot_ms"), "yes" if r["meets"] else "no",
             r["failed_share"], r["verdict"]] if not r.get("refused") else
            [r["case"], "-", "-", "refused", "-", r["refused"]] for r in sens["rows"]]
    print_table(["case", "p99_ttft_ms [95% CI]", "p99_tpot_ms [95% CI]", "meets", "failed share", "verdict"], rows,
                title=f"\nSensitivity of the recommendation ({sens['duration_s']:g} s simulated each, "
                      f"{fmt(sens['wall_s'])} s wall)")
    m = sens.get("margin_rate")
    click.echo(f"margin: meets the SLOs up to {fmt(m)} req/s = {fmt(sens['margin_factor'])} x lam {fmt(lam)}"
               if m is not None else "margin: no rate found that meets the SLOs")
