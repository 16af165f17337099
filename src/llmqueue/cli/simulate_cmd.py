"""``llmqueue simulate``: a replica or a fleet, step by step; summary, verdict and theory side by side."""

from __future__ import annotations

import click

from llmqueue.cli.common import OutputPath, command, json_option, print_json, print_kv, print_table, run_outputs
from llmqueue.cli.flags import given_flags, knob_options


def _explain_steps(ctx, param, value):
    """``--explain``: a debugging output of this command, not a knob (sweeps and scenarios have no
    use for it), kept beside the knob flags in the context."""
    ctx.meta["explain"] = value


@command("simulate")
@click.option("--scenario", help="A scenario file or a shipped example name (see `llmqueue scenario list`); "
              "the flags given with it override its fields.")
@knob_options()
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
              help="With --scenario: assign one of its fields by path, the value read as YAML (repeatable), "
                   "e.g. --set deployment.autoscalers[0].provisioning_delay_s=300 or --set deployment.autoscalers=[].")
@click.option("--out", "out_dir", type=OutputPath("dir", also=run_outputs),
              help="Write requests/steps/timeseries Parquet and summary.json here (created with any missing "
                   "parents; checked before the simulation runs).")
@click.option("--margin", type=float, metavar="FRACTION",
              help="Also measure the distance to the preemption cliff: the same arrivals re-simulated with a "
                   "slower engine and with more traffic (bisection, about 15 more runs); a run a FRACTION (e.g. "
                   "0.1) of slow-down or extra traffic away from preempting is judged metastable. One replica. "
                   "On (0.1) by default with --step-time fitted:CALIBRATION, with the calibration's speed spread.")
@click.option("--speed-spread", type=click.FloatRange(0.0, 1.0), metavar="FRACTION",
              help="With --margin: the engine's run-to-run speed spread (log-scale sd, e.g. 0.07) turned into the "
                   "probability of tipping into preemption [default: the calibration's, with --step-time "
                   "fitted:FILE; else 0.07, stated].")
@click.option("--explain", metavar="STEP[,STEP...]", expose_value=False, callback=_explain_steps,
              help="Print the scheduler's decision of these engine steps (counted from 0, as the steps records' "
                   "step column): the requests scheduled with their new tokens, those preempted, the step's "
                   "composition, the free KV blocks and the queue lengths before and after (the summary's "
                   "\"explained\"). One replica; the records are the same with and without it.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@json_option
@click.pass_context
def simulate(ctx, scenario, sets, out_dir, progress, as_json, margin, speed_spread, **flags):
    """Simulate a serving replica, or a fleet of them, step by step with vLLM v1's scheduling semantics.

    One replica by default; --replicas N puts N behind --router, --disaggregate P:D splits prefill
    and decode, and a scenario's deployment.pools describes a fleet (pools, lanes, P/D, gateway,
    autoscalers, faults), all on one clock. Prints vLLM bench serve's metrics (TTFT, TPOT, ITL,
    E2EL percentiles with confidence intervals), the stability verdict from the queue-length
    trend, the Little's-law check, and the closed-form capacity (KV memory, slots, token budget)
    beside the simulated throughput (per replica); a fleet adds its per-pool and per-class tables.

    Examples:

      llmqueue simulate --capacity-tokens 131000 --step-time 0.0372 --chunk 512
      --prompt-len uniform:10:1600 --output-len uniform:10:1600 --arrival poisson:50 --duration 3600 --seed 1

      llmqueue simulate --max-num-seqs 1 --prompt-len fixed:1 --output-len fixed:1 --step-time exp:0.1
      --arrival poisson:8 --num-requests 200000 --seed 1

      llmqueue simulate --scenario chat --arrival poisson:20 --max-num-seqs 64 --duration 600

      llmqueue simulate --max-num-seqs 1 --prompt-len fixed:1 --output-len fixed:1 --step-time exp:0.1
      --arrival poisson:20 --num-requests 200000 --replicas 3 --router central

      llmqueue simulate --scenario noon-spike --duration 1800
    """
    import sys

    from llmqueue.engine.explain import parse_steps
    from llmqueue.simulate import CtrlC, run_simulation, write_outcome
    from llmqueue.spec import spec_from_flags

    if speed_spread is not None and margin is None:
        from llmqueue.errors import InputError

        raise InputError("--speed-spread", "turns the margin search into a tipping probability",
                         "give --margin FRACTION too (e.g. --margin 0.1)")
    steps = parse_steps(ctx.meta.get("explain"))
    spec = spec_from_flags(flags, scenario=scenario, given=given_flags(ctx, flags), sets=sets)
    spec.options.explain = steps
    st = flags.get("step_time")
    if (margin is None and isinstance(st, str) and st.strip().lower().startswith("fitted:") and spec.fleet is None
            and spec.replicas == 1):
        margin = DEFAULT_CALIBRATED_MARGIN  # a calibrated engine: its verdict with the spread's tipping probability
    if progress is None:
        progress = sys.stderr.isatty()
    with CtrlC() as ctrl_c:  # Ctrl-C: the run stops between two steps; what it simulated is kept
        out = run_simulation(spec, progress=progress, margin=margin, interrupt=ctrl_c,
                             speed_spread=_spread(speed_spread, flags.get("step_time")) if margin else None)
        if out_dir:
            write_outcome(out, out_dir)
    report = {**out.summary, "theory": out.theory}
    if as_json:
        print_json(report)
    else:
        print_report(out.summary, out.theory, out_dir)
        if spec.options.explain:
            print_explained(out.result.explained, spec.options.explain, out.result.num_steps)
    if out.result.interrupted_s is not None:
        raise KeyboardInterrupt  # exit 130, naming what was written


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.3g}%"


DEFAULT_CALIBRATED_MARGIN = 0.1
"""``--margin`` when the step model is a calibration (``--step-time fitted:FILE``) and one replica
serves: the verdict at the calibrated speed comes with the probability that the engine's
run-to-run speed spread (the calibration's) tips it (issue 36: "simulate --calibration")."""


def _spread(given, step_time):
    from llmqueue.margin import speed_spread_for

    return speed_spread_for(given, step_time)


def print_report(s: dict, th: dict, out_dir=None) -> None:
    """The readable summary: simulation and theory side by side."""

    def ms(key):
        v = s.get(key)
        ci = s.get(key + "_ci")
        if v is None:
            return "-"
        txt = f"{v:,.1f}"
        if ci:
            txt += f"  [{ci[0]:,.1f}, {ci[1]:,.1f}]"
        return txt

    verdict = s.get("verdict", "?")
    lb = s.get("lower_bounds")

    def mean_p99(label, m):
        return (f"mean / p99 {label} (ms)" + (" [CI]" if m == "ttft" else ""), f"{ms(f'mean_{m}_ms')} / {ms(f'p99_{m}_ms')}")

    if not lb:
        lat_rows = [mean_p99("TTFT", "ttft"), mean_p99("TPOT", "tpot"), mean_p99("ITL", "itl"),
                    mean_p99("E2EL", "e2el"), ("mean queue time (ms)", ms("mean_queue_ms"))]
    else:  # the queue grows: what was measured, as lower bounds, not means over the lucky finishers
        lat_rows = [mean_p99("TPOT", "tpot"), mean_p99("ITL", "itl")]
        for label, m in (("TTFT", "ttft"), ("E2EL", "e2el")):
            lat_rows.append((f"mean / p99 {label} (ms), lower bounds",
                             f">= {lb[f'mean_{m}_ms']:,.1f} / >= {lb[f'p99_{m}_ms']:,.1f}"))
        lat_rows.append(("mean queue time (ms), lower bound", f">= {lb['mean_queue_ms']:,.1f}"))
        lat_rows.append(("lower bounds (the queue grows)", f"{lb['unfinished']} of {lb['requests']} requests "
                         "unfinished at the stop, counted with their wait so far; no steady state"))
    t0, t1 = s.get("warmup_s"), s.get("horizon_s")
    rows = [
        ("completed / arrived (arrivals in window)", f"{s.get('completed')} / {s.get('arrivals')}"),
        ("status counts", ", ".join(f"{k} {v}" for k, v in (s.get("status_counts") or {}).items() if v)),
        ("simulated time (s)", t1),
        ("measured window (s)", "-" if t0 is None or t1 is None else
         f"{t0:g} to {t1:g}" + (f" ({t1 - t0:g} s after the {t0:g} s warm-up)" if t0 else "")),
        ("request throughput (req/s, finishing in window)", s.get("request_throughput")),
        ("output throughput (tok/s)", s.get("output_throughput")),
        *lat_rows,
        ("KV utilization", s.get("kv_utilization")),
        ("Little's law gap |L - lam W| / L", s.get("little_gap")),
        ("failed share (of arrivals)", _share(s.get("failed_share"))),
        ("verdict (queue, failures, goodput)", verdict),
    ]
    if s.get("request_goodput") is not None:
        rows.append(("request goodput (req/s)", s.get("request_goodput")))
        rows.append(("good share (met the SLOs)", _share(s.get("good_share"))))
    tier = s.get("kv_tier")
    if tier:
        rows.append(("preemptions", s.get("preemptions")))
        rows.append(("host KV tier",
                     f"{tier['offloads']} preempted requests' KV offloaded, {tier['recomputed_tier_full']} recomputed "
                     f"(tier full); {tier['restores']} resumed from it; {tier['loaded_tokens']:,} tokens loaded in all "
                     f"(resumptions{', prefix hits' if 'prefix_hit_tokens' in tier else ''}) in {tier['load_s']:.3g} s"))
    hr = s.get("prefix_hit_rate")
    if hr:
        rows.append(("prefix-cache hits (of prompt tokens)", f"GPU {hr['gpu']:.1%}" + (
            f", host tier {hr['host']:.1%} ({tier['prefix_hit_tokens']:,} tokens loaded; {tier['prefix_units_stored']} "
            f"units moved down, {tier['prefix_units_evicted']} evicted from it)" if "host" in hr else "")))
    m = s.get("regime_margin")
    if m:
        from llmqueue.margin import margin_rows

        rows += margin_rows(m)
    print_kv(rows, title="Simulation")
    if th:
        trows = [("b (s), " + th.get("b_source", ""), th.get("b"))] if th.get("b") else []
        for k, label in (("mu_kv", "mu, KV memory M/(b E[g]) (req/s)"), ("mu_seqs", "mu, max_num_seqs slots (req/s)"),
                         ("mu_tokens", "mu, token budget (req/s)")):
            if k in th:
                trows.append((label, th[k]))
        if "mu" in th:
            trows += [("capacity mu (binding: " + th["binding"] + ")", th["mu"])]
        if th.get("rho") is not None:
            trows += [("lam (req/s, mean over the run" + (", per replica)" if th.get("per_replica") else ")"),
                       th.get("lam")),
                      ("rho = lam / mu", th["rho"]), ("theory verdict (the mean rate)", th.get("verdict"))]
        if th.get("rho_peak") is not None:
            trows += [(f"peak lam ({th.get('peak_source')})", th.get("lam_peak")),
                      ("rho at the peak", th["rho_peak"]), ("theory verdict at the peak", th.get("verdict_peak"))]
        if th.get("retry_amplification"):
            trows.append((f"rho offered with retries (x{th['retry_amplification']:.3g} attempts, simulated)",
                          th.get("rho_offered")))
        if "mg1" in th and "mean_e2el_ms" in th["mg1"]:
            trows.append((th["mg1"]["model"].split(" ")[0] + " mean E2EL (ms)", th["mg1"]["mean_e2el_ms"]))
        if th.get("per_replica"):
            trows.append(("per replica", th["per_replica"]))
        if "note" in th:
            trows.append(("note", th["note"]))
        if th.get("verdict_detail"):
            trows.append(("theory verdict, said", th["verdict_detail"]))
        ab = th.get("abandonment")
        if ab:
            trows.append(("with the clients' patience" + (f": {ab['model']}" if ab.get("model") else ""),
                          ab.get("verdict") or ab.get("note")))
        if th.get("why_they_differ"):
            trows.append(("why theory and simulation differ", th["why_they_differ"]))
        print_kv(trows, title="\nTheory")
        if th.get("pools"):
            print_pool_theory(th["pools"], th.get("peak_source"))
    from llmqueue.metrics.slo import slo_verdict_rows

    slo_rows = slo_verdict_rows(s.get("slo"))
    if slo_rows:
        print_kv(slo_rows, title="\nSLOs (per class)")
    if s.get("fleet"):
        print_fleet(s["fleet"])
        if s["fleet"].get("stages"):
            print_stages(s["fleet"]["stages"], (th or {}).get("tandem"))
    if s.get("notes"):
        click.echo("\nCaveats")
        for n in s["notes"]:
            click.echo(f"- {n}")
    if out_dir:
        click.echo(f"\nrecords written to {out_dir}/ (requests, steps, timeseries .parquet; summary.json)")


def print_pool_theory(pools: dict, peak_source: str | None) -> None:
    """Each pool's (or P/D stage's) closed forms: lam per replica (from the simulated routing),
    mu and what binds, rho, its peak and the verdict."""
    def f(x, spec=".4g"):
        return "-" if x is None else format(x, spec)

    rows = [[name, p.get("stage", "-"), p.get("replicas", "-"), f(p.get("lam")), f(p.get("mu")),
             p.get("binding", "-"), f(p.get("rho")), f(p.get("rho_peak")),
             p.get("verdict") or p.get("note", "-")] for name, p in pools.items()]
    print_table(["pool", "stage", "replicas", "lam/replica", "mu/replica", "binding", "rho",
                 "rho at the peak", "verdict"], rows,
                title="\nTheory per pool (lam from the simulated routing" +
                      (f"; the peak: {peak_source})" if peak_source else ")"))


STAGES = (("prefill_wait", "prefill: wait (arrival -> first scheduled)"),
          ("prefill", "prefill: prompt steps (-> first token)"), ("transfer", "KV transfer (link queue + transfer)"),
          ("decode_wait", "decode: admission wait (KV arrived -> scheduled)"),
          ("decode", "decode: o - 1 steps (-> last token)"), ("decode_tpot", "decode: time per output token"))


def print_stages(st: dict, tandem: dict | None) -> None:
    """A P/D request's time station by station (:func:`llmqueue.metrics.fleet.pd_stages`), the
    means' sum beside the mean E2EL and, where exact, the Jackson tandem's prediction."""
    def ms(x):
        return "-" if x is None else f"{x:,.1f}"

    rows = [[label, ms(st[k]["mean_ms"]), ms(st[k]["p99_ms"])] for k, label in STAGES if k in st]
    rows.append(["sum of the stages' means (= mean E2EL)", ms(st.get("sum_ms")), "-"])
    if tandem is not None and tandem.get("mean_e2el_ms") is not None:
        rows.append([f"{tandem['model']}: mean E2EL", ms(tandem["mean_e2el_ms"]), "-"])
    elif tandem is not None:
        rows.append([f"{tandem['model']}: unstable ({tandem.get('note')})", "-", "-"])
    else:
        rows.append(["Jackson tandem: no closed form here (batching stations; each pool's capacity and rho "
                     "are in 'Theory per pool')", "-", "-"])
    click.echo("")
    print_table(["P/D stage", "mean ms", "p99 ms"], rows, title=f"Fleet: P/D stages ({st.get('requests')} requests)")


def print_explained(explained: list, steps: tuple, num_steps: int) -> None:
    """The decisions of the steps ``--explain`` asked for (:class:`~llmqueue.engine.explain.StepExplanation`)."""
    click.echo("\nExplained steps (the scheduler's decision as the step began)")
    seen = {e.step for e in explained}
    for e in explained:
        click.echo(e.text())
    for k in steps:
        if k not in seen:
            click.echo(f"engine step {k}: not taken (the run took {num_steps} steps)")


def _ms_pair(row: dict, a: str, b: str) -> str:
    x, y = row.get(a), row.get(b)
    return "-" if x is None and y is None else f"{'-' if x is None else f'{x:,.0f}'} / {'-' if y is None else f'{y:,.0f}'}"


def recovery_text(r: dict) -> str:
    """One line for a :func:`llmqueue.metrics.fleet.recovery_time` result."""
    if r.get("recovered") is None:
        return r.get("note") or "unknown"
    if r.get("recovered"):
        return f"{r['recovery_s']:.4g} s (peak {r.get('peak'):g} waiting, back within {r.get('threshold'):g})"
    return r.get("note") or "not recovered by the end"


def print_fleet(f: dict) -> None:
    """The fleet's tables (``summary["fleet"]``, :func:`llmqueue.metrics.fleet.fleet_summary`): per pool
    and per class, then retries, the model mix, cost and quality, and the recovery after the spike."""
    reps = f.get("replicas") or {}
    cost = (f.get("cost") or {}).get("pools") or {}
    rows = []
    for p, r in (f.get("pools") or {}).items():
        rp = reps.get(p) or {}
        rep = "-" if not rp else f"{rp['mean']:.3g} ({rp['min']:g}-{rp['max']:g})"
        c = cost.get(p) or {}
        rows.append([p, r["completed"], r["failed"], r["request_throughput"], r["output_throughput"],
                     r.get("request_goodput"), _ms_pair(r, "p50_ttft_ms", "p99_ttft_ms"),
                     _ms_pair(r, "p50_tpot_ms", "p99_tpot_ms"), _ms_pair(r, "mean_admission_wait_ms", "p99_admission_wait_ms"),
                     _ms_pair(r, "mean_kv_transfer_ms", "p99_kv_transfer_ms") if r.get("kv_transfers") else "-",
                     rep, c.get("replica_hours"), c.get("cost")])
    click.echo("")
    print_table(["pool", "completed", "failed", "req/s", "tok/s", "goodput", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
                 "admission wait mean/p99 ms", "KV transfer mean/p99 ms", "replicas mean (min-max)", "replica-h",
                 "cost"], rows, title="Fleet: per pool")
    crows = []
    retries = (f.get("retries") or {}).get("by_class") or {}
    for c, r in (f.get("classes") or {}).items():
        crows.append([c, r["completed"], r["failed"], r["request_throughput"], r.get("request_goodput"),
                      _ms_pair(r, "p50_ttft_ms", "p99_ttft_ms"), _ms_pair(r, "p50_tpot_ms", "p99_tpot_ms"),
                      (retries.get(c) or {}).get("amplification")])
    click.echo("")
    print_table(["class", "completed", "failed", "req/s", "goodput", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
                 "attempts per request"], crows, title="Fleet: per class")
    refused = [[c, why, n] for c, row in (f.get("refused") or {}).items() for why, n in row.items()]
    refused += [[c, f"served degraded: {how}", n] for c, row in (f.get("degraded") or {}).items()
                for how, n in row.items()]
    if refused:
        click.echo("")
        print_table(["class", "refused or degraded by", "requests"], refused,
                    title="Fleet: refused (arrivals in the window) and degraded (completed), by class")
    kv = [("attempts per user request (retries)", (f.get("retries") or {}).get("amplification"))]
    mix = f.get("model_mix")
    if mix:
        kv.append(("served model mix", ", ".join(f"{m} {100 * v['share']:.3g}%" for m, v in mix.items())))
    if f.get("cost"):
        total = f["cost"].get("total_cost")
        kv.append(("cost (replica-hours x price)" + ("" if f["cost"].get("complete") else ", pools without a price left out"),
                   total))
        if f["cost"].get("cost_per_request") is not None:
            kv.append(("cost per completed request", f["cost"]["cost_per_request"]))
    if f.get("quality") and f["quality"].get("quality_weighted_share") is not None:
        kv.append(("quality-weighted share of served requests", f["quality"]["quality_weighted_share"]))
    for p, qd in (f.get("queue_depth") or {}).items():
        kv.append((f"waiting in {p}: mean / max", f"{qd['mean_waiting']:.3g} / {qd['max_waiting']:g}"))
    if f.get("recovery"):
        t0, t1 = f.get("spike_s") or (None, None)
        for p, r in f["recovery"].items():
            label = "whole fleet" if p == "all" else p
            kv.append((f"recovery after the spike [{t0:g}, {t1:g}] s: {label}", recovery_text(r)))
    print_kv(kv, title="")
