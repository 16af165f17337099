"""``llmqueue report``: one self-contained HTML report of a run or sweep directory, or a source's figure."""

from __future__ import annotations

import click

from llmqueue.cli.common import InputPath, OutputPath, command, json_option, print_json, print_kv, renamed_option


@command("report")
@click.argument("run_or_sweep_dir", nargs=-1, type=InputPath("any"))
@renamed_option("-o", "--out", "output", old=("--output",), type=OutputPath("file"),
              help="The HTML file to write (missing parent directories are created) [default: DIR/report.html "
                   "for one directory, report.html in the directories' common parent for several, "
                   "./report.html for a source's figure].")
@click.option("--png-dir", type=OutputPath("dir"),
              help="Where each figure is also written as PNG, created if missing [default: <report>_png/].")
@click.option("--compare", type=InputPath("any"),
              help="A run directory (e.g. the simulated twin of a measured run) drawn dashed over the run.")
@click.option("--title", help="The report's title.")
@click.option("--kv-stability-figure", "seed004", is_flag=True,
              help="Nie et al. 2026's Figure 2 (KV-memory stability): the 1:1 setting simulated at lam = 1, 3, 5, "
                   "20, 50; queue length over time.")
@click.option("--batch-figure", "seed002", is_flag=True,
              help="Inference Foundations' Figure 2 (batch service): throughput against latency over batch size "
                   "(lam 100, T_fixed 50 ms, t_req 0.5 ms).")
@click.option("--seed004-figure2", "seed004_old", is_flag=True, hidden=True, help="Old name of --kv-stability-figure.")
@click.option("--seed002-figure2", "seed002_old", is_flag=True, hidden=True, help="Old name of --batch-figure.")
@click.option("--duration", type=float, default=3600.0, show_default=True,
              help="--kv-stability-figure: simulated seconds per rate.")
@click.option("--seed", type=int, default=1, show_default=True, help="--kv-stability-figure: random seed.")
@click.option("--slo-ms", type=float, default=300.0, show_default=True,
              help="--batch-figure: the P99 latency target drawn as the SLO line.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar over the figures, or over the simulations of --kv-stability-figure "
                   "(default: on a terminal).")
@json_option
def report(run_or_sweep_dir, output, png_dir, compare, title, seed004, seed002, seed004_old, seed002_old, duration,
           seed, slo_ms, progress, as_json):
    """Write one self-contained HTML report (figures inlined, no network) of RUN_OR_SWEEP_DIR.

    The figures are interactive (hover, zoom, log axes; plotly.js is inlined). A run directory
    (llmqueue simulate/bench --out DIR) gets its summary table, queue length, KV cache, latency
    and output tokens per second over time, latency CDFs and tails, CDFs per request class and the
    latency decomposition; a sweep directory (sweep.json) gets latency against throughput,
    throughput and latency against offered load with the SLO, the theory's mu and the knee, and,
    when the sweep kept its runs (--keep-runs), queue length over time and latency CDFs per point.
    A figure without data is left out and named. The static figures are also written as PNG to
    --png-dir.

    A plan directory (llmqueue plan --out DIR) gets the recommendation, cost against p99 TTFT
    and TPOT with the Pareto frontier (pruned and failed configurations marked), the sensitivity
    table and the margin.

    A fleet's run (pools.parquet) also gets replicas over time, queue depth per pool and class and
    the recovery after a load spike. Several run directories (llmqueue report A B C) make one
    comparison page: summaries side by side, and the queue and fleet figures with the runs overlaid,
    labelled by directory name.
    """
    from llmqueue._validate import positive
    from llmqueue.errors import InputError

    dirs = list(run_or_sweep_dir or ())
    run_or_sweep_dir = dirs[0] if len(dirs) == 1 else (None if not dirs else tuple(dirs))
    seed004, seed002 = seed004 or seed004_old, seed002 or seed002_old
    seeds = [flag for flag, on in (("--kv-stability-figure", seed004), ("--batch-figure", seed002)) if on]
    if len(seeds) > 1:
        raise InputError("seed004", "give one of --kv-stability-figure and --batch-figure",
                         "write each to its own file with -o")
    if seeds and run_or_sweep_dir is not None:
        raise InputError("RUN_OR_SWEEP_DIR", f"{seeds[0]} makes its own data; it takes no directory",
                         f"drop {' '.join(dirs)} or {seeds[0]}")
    if seeds and compare is not None:
        raise InputError("compare", f"{seeds[0]} takes no --compare")
    if output is None:
        output = _default_output(dirs)
    if seed004:
        from llmqueue.report.seeds import seed004_figure2

        from llmqueue._progress import wanted

        res = seed004_figure2(output, png_dir=png_dir, duration_s=positive("duration", duration), seed=seed,
                              progress=wanted(progress))
    elif seed002:
        from llmqueue.report.seeds import seed002_figure2

        res = seed002_figure2(output, png_dir=png_dir, slo_ms=positive("slo_ms", slo_ms))
    elif run_or_sweep_dir is None:
        raise InputError("RUN_OR_SWEEP_DIR", "missing directory",
                         "give a run or sweep directory, or --kv-stability-figure / --batch-figure")
    elif len(dirs) > 1:
        if compare is not None:
            raise InputError("compare", "several directories are already compared with each other",
                             "drop --compare, or give one run directory")
        from llmqueue.report.build import build_comparison

        from llmqueue._progress import wanted

        res = build_comparison(dirs, output, png_dir=png_dir, title=title, progress=wanted(progress))
    else:
        from llmqueue.report.build import build_report

        from llmqueue._progress import wanted

        res = build_report(run_or_sweep_dir, output, png_dir=png_dir, compare=compare, title=title,
                           progress=wanted(progress))
    if as_json:
        print_json(res.to_dict())
        return
    rows = [("report", str(res.html_path)), ("kind", res.kind)]
    if res.source:
        rows.append(("source", res.source))
    rows += [("figure", str(p)) for p in res.png_paths]
    rows += [("note", n) for n in res.notes]
    print_kv(rows, title="Report written")


def _default_output(dirs: list) -> str:
    """Where a report goes without ``-o``: into the run (sweep, plan) directory it draws, the
    common parent of several, or the working directory for a source's figure (no directory)."""
    import os
    from pathlib import Path

    from llmqueue._files import output_path

    if not dirs:
        return "report.html"
    folder = dirs[0] if len(dirs) == 1 else os.path.commonpath([os.path.abspath(d) for d in dirs])
    return str(output_path("output", Path(folder) / "report.html"))
