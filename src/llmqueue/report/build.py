"""Build the report of a run or a sweep directory: one HTML file of interactive figures, plus PNGs.

:func:`build_report` is what ``llmqueue report DIR -o report.html`` calls:

- a **run**: the summary table (with confidence intervals; the simulated twin's numbers beside
  it when there is one), the closed-form capacity, ``validate.json``'s predicted-versus-measured
  rows, then the figures of :mod:`llmqueue.report.run_panels`: queue length, KV cache, latency
  and output tokens per second over time, latency CDFs, their tails (log-log CCDFs), CDFs per
  request class and the latency decomposition. A panel without data is left out and named in one
  note. A twin (``compare``, or ``validate.json``'s ``sim_dir``) is drawn dashed.
- a **plan** (``llmqueue plan --out DIR``): :mod:`llmqueue.report.plan_page`, the frontier of cost
  against p99 TTFT and TPOT, the sensitivity table and the margin;
- a **sweep**: the table of points and the figures of :mod:`llmqueue.report.sweep_panels`:
  latency against throughput, throughput against offered load, latency percentiles and queue
  growth against offered load and, from the points' run directories (``llmqueue sweep
  --keep-runs``), queue length over time and latency CDFs per point.

The figures are interactive (plotly, inlined: the page needs no network). The figures that have a
static twin in :mod:`llmqueue.report.figures` (queue, KV, CDFs, decomposition, the sweep's two
curves, the seeds' figures) are also written as PNG to ``png_dir`` (default: ``<report
stem>_png/`` beside the HTML).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from llmqueue.errors import InputError
from llmqueue.report import html as H
from llmqueue.report import series, sources
from llmqueue.report.page import Report, check_output, fig, write
from llmqueue.report.plan_page import plan_report


def left_out_note(left_out: list) -> str:
    """One note naming the figures left out for want of data, or ``""``."""
    if not left_out:
        return ""
    return H.para("Not drawn, for want of data: " + "; ".join(left_out) + ".")


def build_report(source, out, *, png_dir=None, compare=None, title: str | None = None,
                 progress: bool = False) -> Report:
    """Write the report of a run or sweep directory ``source`` to ``out`` (an ``.html`` path).

    ``compare``: a run directory to overlay on a run (its simulated twin); without it, the twin
    named by the run's ``validate.json`` (``"sim_dir"``) is used when present. ``progress``: a
    bar on stderr over the figures, their PNGs and the page.
    """
    check_output(out)
    kind = sources.kind_of(source)
    if kind == "plan":
        if compare is not None:
            raise InputError("compare", "--compare overlays one run on another; a plan has no twin",
                             "drop --compare, or report a run directory")
        return plan_report(source, out, png_dir=png_dir, title=title)
    if kind == "sweep":
        if compare is not None:
            raise InputError("compare", "--compare overlays one run on another; a sweep has no twin",
                             "drop --compare, or report a run directory")
        sweep = sources.load_sweep(source)
        with _bar(progress, "sweep") as bar:
            return sweep_report(sweep, out, png_dir=png_dir, title=title, bar=bar)
    run = sources.load_run(source)
    twin = None
    notes = []
    if compare is not None:
        if sources.kind_of(compare, arg="compare") != "run":
            raise InputError("compare", f"{compare} is a sweep directory, not a run directory")
        twin = sources.load_run(compare, arg="compare")
    elif (td := sources.twin_dir(run)) is not None:
        if (td / "requests.parquet").exists():
            twin = sources.load_run(td)
            notes.append(f"overlaid the simulated twin {td} named by validate.json")
        else:
            notes.append(f"validate.json names {td} as its simulated twin, but it holds no run; not overlaid")
    if twin is not None and run.label == twin.label:  # two simulated runs: name them by directory
        names = (run.path.resolve().name, twin.path.resolve().name)
        run.label, twin.label = names if names[0] != names[1] else ("run", "compare")
    with _bar(progress, "run") as bar:
        return run_report(run, out, png_dir=png_dir, twin=twin, title=title, notes=notes, bar=bar)


@contextmanager
def _bar(enabled: bool, kind: str):
    """A progress bar over a report's steps: each figure, each PNG (an estimate until the figures
    are made) and the page."""
    from llmqueue._progress import bar

    if kind == "run":
        from llmqueue.report.run_panels import MAKERS

        total = len(MAKERS) + 4 + 1
    else:
        from llmqueue.report.sweep_panels import STEPS

        total = STEPS + 2 + 1
    b = bar(total, desc="report", unit="step", enabled=enabled)
    try:
        yield b
    finally:
        b.close()


# -- a run -----------------------------------------------------------------------------------------

def _ms_row(t: H.Table, label: str, key: str, summaries: list):
    t.add(label, *[H.Raw(H.with_ci(s.get(key), s.get(f"{key}_ci"))) for s in summaries])


def summary_table(summaries: list, labels: list) -> H.Table:
    """Key figures of one or more run summaries side by side."""
    t = H.Table(["", *labels])
    g = lambda k: [s.get(k) for s in summaries]  # noqa: E731
    t.group("Load and throughput")
    t.add("measurement window (s)", *[H.Raw(H.esc(f"{H.num(s.get('warmup_s'))} to {H.num(s.get('horizon_s'))}"))
                                      for s in summaries])
    t.add("arrivals / completed / in flight",
          *[H.Raw(H.esc(f"{H.num(s.get('arrivals'))} / {H.num(s.get('completed'))} / {H.num(s.get('in_flight'))}"))
            for s in summaries])
    t.add("arrival rate (req/s)", *g("arrival_rate"))
    t.add("request throughput (req/s)", *g("request_throughput"))
    if any(s.get("request_goodput") is not None for s in summaries):
        t.add("request goodput (req/s)", *g("request_goodput"))
        t.add("good share (met the SLOs)", *[None if s.get("good_share") is None else H.Raw(H.esc(f"{100 * s['good_share']:.3g}%"))
                                             for s in summaries])
    t.add("failed share (of arrivals)", *[None if s.get("failed_share") is None else H.Raw(H.esc(f"{100 * s['failed_share']:.3g}%"))
                                          for s in summaries])
    t.add("output throughput (tok/s)", *g("output_throughput"))
    for metric, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"), ("queue", "queue time")):
        if not any(s.get(f"mean_{metric}_ms") is not None for s in summaries):
            continue
        t.group(f"{name} (ms), 95% CI in brackets")
        _ms_row(t, "mean", f"mean_{metric}_ms", summaries)
        _ms_row(t, "median", f"p50_{metric}_ms", summaries)
        _ms_row(t, "p99", f"p99_{metric}_ms", summaries)
    t.group("Engine and queue")
    t.add("busy fraction", *g("utilization"))
    t.add("mean batch size (running)", *g("mean_batch_size"))
    t.add("mean waiting / running", *[H.Raw(H.esc(f"{H.num(s.get('mean_num_waiting'))} / "
                                                  f"{H.num(s.get('mean_num_running'))}")) for s in summaries])
    t.add("KV utilization (mean)", *g("kv_utilization"))
    t.add("Little's law gap |L - lam W| / L", *g("little_gap"))
    t.add("queue growth (req/s)", *[H.Raw(H.with_ci(s.get("queue_growth_per_s"), s.get("queue_growth_per_s_ci")))
                                    for s in summaries])
    t.add("verdict", *[str(s.get("verdict", "-")) for s in summaries])
    return t


def theory_table(theory: dict) -> H.Table | None:
    if not theory or "mu" not in theory:
        return None
    t = H.Table(["closed form (simulate's theory)", "value"])
    names = [("mu_kv", "mu, KV memory M / (b E[g]) (Nie et al. 2026), req/s"), ("mu_seqs", "mu, max_num_seqs slots, req/s"),
             ("mu_tokens", "mu, token budget, req/s"), ("mu", "capacity mu (min), req/s"), ("binding", "binding bound"),
             ("b", "step time b (s)"), ("lam", "arrival rate lam (req/s)"), ("rho", "rho = lam / mu"),
             ("verdict", "theory verdict")]
    for k, name in names:
        if k in theory:
            t.add(name, theory[k])
    return t


def validate_table(val: dict) -> H.Table | None:
    rows = val.get("rows")
    if not isinstance(rows, list):
        return None
    t = H.Table(["quantity", "theory", "simulated", "measured", "error (sim)"])
    pct = lambda x: "-" if not isinstance(x, (int, float)) else f"{100 * x:+.1f}%"  # noqa: E731
    cap = val.get("capacity") or {}
    if cap:
        t.add(cap.get("quantity", "capacity mu"), cap.get("theory"), cap.get("simulated"), cap.get("measured"),
              pct(cap.get("rel_err_sim")))
    for r in rows:
        if isinstance(r, dict):
            t.add(r.get("quantity", "?"), "-", r.get("simulated"), r.get("measured"), pct(r.get("rel_err_sim")))
    v = val.get("verdicts") or {}
    if v:
        t.add("verdict", str(v.get("theory", "-")), str(v.get("simulated", "-")), str(v.get("measured", "-")), "")
    return t


def run_report(run, out, *, png_dir=None, twin=None, title=None, notes=(), bar=None) -> Report:
    """The report of one :class:`~llmqueue.report.sources.RunData` (and its optional twin)."""
    s = run.summary or {}
    word, detail = series.verdict_note(s)
    body = [f'<p class="verdict">{H.badge(word)}{H.esc(detail)}</p>']
    notes = [*run.notes, *notes]
    if not s:
        notes.append("this run has no summary.json: the tables are empty; the figures use the records")
    for n in notes:
        body.append(H.para(n))
    caveats = [str(n) for n in (s.get("notes") or [])]
    if caveats:
        body.append(H.section("Caveats", "".join(H.para("- " + c) for c in caveats), anchor="caveats"))
    summaries, labels = [s], [run.label]
    if twin is not None:
        summaries.append(twin.summary or {})
        labels.append(twin.label)
    tables = [summary_table(summaries, labels).html()]
    th = theory_table(s.get("theory") or {})
    if th is not None:
        tables.append(th.html())
    from llmqueue.metrics.slo import slo_verdict_rows

    slo_rows = slo_verdict_rows(s.get("slo"))
    if slo_rows:
        st = H.Table(["SLO (per class)", "value vs target (ms): verdict"])
        for label, text in slo_rows:
            st.add(label, text)
        tables.append(st.html())
    body.append(H.section("Summary", f'<div class="cols">{"".join(tables)}</div>', anchor="summary"))
    ft = fleet_table(summaries, labels)
    if ft is not None:
        body.append(H.section("Fleet", ft.html(), anchor="fleet"))
    if run.validate:
        vt = validate_table(run.validate)
        if vt is not None:
            body.append(H.section("Predicted versus measured (validate.json)", vt.html(), anchor="validate"))
    from llmqueue.report.run_panels import run_panels

    panels, left_out = run_panels(run, twin, step=None if bar is None else bar.update)
    if left_out:
        body.append(left_out_note(left_out))
    for p in panels:
        body.append(H.section(p.title, fig(p.name), anchor=p.name))
    files = H.Table(["file", "rows"])
    for name, tab in (("requests.parquet", run.requests), ("steps.parquet", run.steps),
                      ("timeseries.parquet", run.timeseries)):
        files.add(name, len(tab) if tab is not None else "absent")
    body.append(H.section("Run directory", H.para(str(run.path)), files.html(), anchor="files"))
    return write("run", out, png_dir, title or f"llmqueue report: {run.path.name}",
                 f"run directory {run.path} ({run.label})", body, panels, source=str(run.path), notes=notes,
                 bar=_png_total(bar, panels))


def fleet_table(summaries: list, labels: list) -> H.Table | None:
    """Per pool and per class, side by side: a fleet's account (``summary.json``'s ``fleet``,
    :func:`llmqueue.metrics.fleet.fleet_summary`); None when no summary has one."""
    fleets = [(s or {}).get("fleet") or {} for s in summaries]
    if not any(fleets):
        return None
    from llmqueue.report.fleet_panels import recovery_words

    t = H.Table(["", *labels])

    def ms_pair(row, a, b):
        if not row or (row.get(a) is None and row.get(b) is None):
            return None
        return H.Raw(H.esc(f"{H.num(row.get(a))} / {H.num(row.get(b))}"))

    for kind, key in (("pool", "pools"), ("class", "classes")):
        names = list(dict.fromkeys(n for f in fleets for n in (f.get(key) or {})))
        for n in names:
            rows = [(f.get(key) or {}).get(n) or {} for f in fleets]
            t.group(f"{kind} {n}")
            t.add("completed / failed", *[H.Raw(H.esc(f"{H.num(r.get('completed'))} / {H.num(r.get('failed'))}"))
                                          if r else None for r in rows])
            t.add("request throughput (req/s)", *[r.get("request_throughput") for r in rows])
            t.add("output throughput (tok/s)", *[r.get("output_throughput") for r in rows])
            if any(r.get("request_goodput") is not None for r in rows):
                t.add("request goodput (req/s)", *[r.get("request_goodput") for r in rows])
            t.add("TTFT p50 / p99 (ms)", *[ms_pair(r, "p50_ttft_ms", "p99_ttft_ms") for r in rows])
            t.add("TPOT p50 / p99 (ms)", *[ms_pair(r, "p50_tpot_ms", "p99_tpot_ms") for r in rows])
            if kind == "pool":
                t.add("wait before admission mean / p99 (ms)",
                      *[ms_pair(r, "mean_admission_wait_ms", "p99_admission_wait_ms") for r in rows])
                if any(r.get("kv_transfers") for r in rows):
                    t.add("KV transfer mean / p99 (ms)", *[ms_pair(r, "mean_kv_transfer_ms", "p99_kv_transfer_ms")
                                                           for r in rows])
                reps = [((f.get("replicas") or {}).get(n) or {}) for f in fleets]
                if any(reps):
                    t.add("replicas mean (min to max)", *[H.Raw(H.esc(f"{H.num(x.get('mean'))} ({H.num(x.get('min'))} "
                                                                      f"to {H.num(x.get('max'))})")) if x else None
                                                          for x in reps])
                    t.add("replica-hours (serving + provisioning)",
                          *[None if not x else x["serving_replica_hours"] + x["provisioning_replica_hours"] for x in reps])
                qd = [((f.get("queue_depth") or {}).get(n) or {}) for f in fleets]
                if any(qd):
                    t.add("waiting mean / max", *[ms_pair(x, "mean_waiting", "max_waiting") for x in qd])
    t.group("fleet")
    t.add("attempts per user request", *[(f.get("retries") or {}).get("amplification") for f in fleets])
    if any(f.get("model_mix") for f in fleets):
        t.add("served model mix", *[", ".join(f"{m} {100 * v['share']:.3g}%" for m, v in (f.get("model_mix") or {}).items())
                                    or "-" for f in fleets])
    if any(f.get("cost") for f in fleets):
        t.add("cost (replica-hours x price)", *[(f.get("cost") or {}).get("total_cost") for f in fleets])
        t.add("cost per completed request", *[(f.get("cost") or {}).get("cost_per_request") for f in fleets])
    if any(f.get("quality") for f in fleets):
        t.add("quality-weighted share served", *[(f.get("quality") or {}).get("quality_weighted_share") for f in fleets])
    recs = [f.get("recovery") or {} for f in fleets]
    for n in dict.fromkeys(k for r in recs for k in r):
        t.add(f"recovery after the spike ({'whole fleet' if n == 'all' else n})",
              *[recovery_words(r[n]) if n in r else "-" for r in recs])
    return t


# -- several runs ----------------------------------------------------------------------------------

def dir_labels(paths) -> list[str]:
    """Legend labels of run directories: their names, with as many parent names as it takes to tell
    them apart."""
    parts = [Path(p).resolve().parts for p in paths]
    for k in range(1, max(len(x) for x in parts) + 1):
        labels = ["/".join(x[-k:]) for x in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{i}: {Path(p).name}" for i, p in enumerate(paths)]


def build_comparison(dirs, out, *, png_dir=None, title: str | None = None, progress: bool = False) -> Report:
    """Several run directories on one page (``llmqueue report DIR1 DIR2 ...``): their summaries and
    fleet accounts side by side, the waiting queue of each over time, and, for the runs with a pools
    series, the fleet's figures with the runs overlaid (:mod:`llmqueue.report.fleet_panels`), each run
    labelled by its directory name."""
    from llmqueue.report.fleet_panels import compare_queue_panel, fleet_panels

    check_output(out)
    runs = []
    for d in dirs:
        if sources.kind_of(d) != "run":
            raise InputError(sources.ARG, f"{d} is a sweep directory; several directories are compared as runs",
                             "give run directories only, or one sweep directory")
        runs.append(sources.load_run(d))
    for r, lab in zip(runs, dir_labels(dirs)):
        r.label = lab
    labels = [r.label for r in runs]
    summaries = [r.summary or {} for r in runs]
    body = []
    tables = [summary_table(summaries, labels).html()]
    body.append(H.section("Summary", f'<div class="cols">{"".join(tables)}</div>', anchor="summary"))
    ft = fleet_table(summaries, labels)
    if ft is not None:
        body.append(H.section("Fleet", ft.html(), anchor="fleet"))
    with _bar(progress, "run") as bar:
        panels = []
        q = compare_queue_panel(runs)
        if q is not None:
            panels.append(q)
        panels += fleet_panels(runs)
        without = [r.label for r in runs if r.pools is None]
        if without and len(without) < len(runs):
            body.append(H.para("No pools series (not a fleet run), left out of the fleet figures: " + ", ".join(without)))
        for p in panels:
            body.append(H.section(p.title, fig(p.name), anchor=p.name))
        files = H.Table(["run", "directory", "requests", "pools series rows"])
        for r in runs:
            files.add(r.label, str(r.path), len(r.requests), len(r.pools) if r.pools is not None else "absent")
        body.append(H.section("Run directories", files.html(), anchor="files"))
        return write("compare", out, png_dir, title or f"llmqueue report: {len(runs)} runs",
                     "runs " + ", ".join(labels), body, panels, source=", ".join(str(r.path) for r in runs),
                     bar=_png_total(bar, panels))


# -- a sweep ---------------------------------------------------------------------------------------

def sweep_table(sweep) -> H.Table:
    from llmqueue.report.figures import sweep_knees

    from llmqueue.report.figures import meets_slo, sweep_best_within_slo

    knees = {id(k.point) for k in sweep_knees(sweep).values() if k.point is not None}
    best = {id(p) for p in sweep_best_within_slo(sweep).values()}
    params = [k for k in sweep.swept if k not in sources.RATE_KEYS]
    t = H.Table([*params, "rate (req/s)", "throughput (req/s)", "p99 TTFT (ms)", "p99 TPOT (ms)", "p99 E2EL (ms)",
                 "failed share", "goodput (req/s)", "theory mu", "verdict", "SLO met", "mark"])
    for p in sweep.points:
        marks = [w for w, ids in (("knee", knees), ("best within SLO", best)) if id(p) in ids]
        met = meets_slo(sweep, p)
        t.add(*[p.params.get(k, "-") for k in params], p.rate, p.throughput,
              *[H.Raw(H.with_ci(*p.p99[m])) for m in ("ttft", "tpot", "e2el")],
              "-" if p.failed_share is None else f"{100 * p.failed_share:.3g}%", p.goodput, p.mu,
              p.verdict or "-", "-" if met is None else ("yes" if met else "no"), ", ".join(marks))
    return t


def sweep_report(sweep, out, *, png_dir=None, title=None, bar=None) -> Report:
    from llmqueue.report import figures as F

    n = len(sweep.points)
    unstable = sum(p.stable is False for p in sweep.points)
    knees = F.sweep_knees(sweep)
    best = F.sweep_best_within_slo(sweep)
    body = []
    info = H.Table(["sweep", ""])
    info.add("points", n)
    info.add("swept parameters", ", ".join(sweep.swept) or "-")
    info.add("unstable points", unstable)
    info.add("SLO targets", ", ".join(f"{k} = {v:g}" for k, v in sweep.slo.items()) or "none given")
    for label, k in knees.items():
        where = f"rate {H.num(k.rate)} req/s"
        if k.bracket:
            where += f" (between {H.num(k.bracket[0])} and {H.num(k.bracket[1])})"
        info.add(f"knee ({label})", f"{where}, throughput {H.num(k.throughput)} req/s")
    if knees:
        info.add("knee rule", next(iter(knees.values())).rule)
    if sweep.meta.get("slo_rule"):
        info.add("SLO rule", str(sweep.meta["slo_rule"]))
    for label, p in best.items():
        info.add(f"best within SLO ({label})", f"rate {H.num(p.rate)} req/s, throughput {H.num(p.throughput)} req/s")
    body.append(H.section("Sweep", info.html(), anchor="sweep"))
    from llmqueue.report.sweep_panels import sweep_panels

    panels, left_out = sweep_panels(sweep, step=None if bar is None else bar.update)
    if left_out:
        body.append(left_out_note(left_out))
    for p in panels:
        body.append(H.section(p.title, fig(p.name), anchor=p.name))
    body.append(H.section("Points", sweep_table(sweep).html(), anchor="points"))
    return write("sweep", out, png_dir, title or f"llmqueue sweep report: {sweep.path.name}",
                 f"sweep {sweep.path} ({n} points)", body, panels, source=str(sweep.path),
                 bar=_png_total(bar, panels))


def _png_total(bar, panels):
    """The bar's total once the figures are made: what is done, their PNGs and the page."""
    if bar is not None:
        bar.total = bar.n + sum(p.png is not None for p in panels) + 1
        bar.refresh()
    return bar
