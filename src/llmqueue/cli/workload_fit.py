"""``llmqueue workload fit``: fit an arrival and length model to a trace and write it as a spec file."""

from __future__ import annotations

import click

from llmqueue.cli.common import InputPath, OutputPath, command, echo_err, fmt, json_option, print_json, print_kv, \
    print_table, renamed_option
from llmqueue.cli.workload_convert import load, load_options


def _pairs_beside(p):
    return [p.parent / f"{p.stem}.pairs.csv"]


def _pair(d: dict, key: str, sub: str):
    v = (d.get(key) or {})
    return v.get(sub) if isinstance(v, dict) else None


@command("fit")
@click.argument("trace", metavar="TRACE", type=InputPath("file"))
@renamed_option("-o", "--out", "output", old=("--output",), type=OutputPath("file", also=_pairs_beside),
              help="Spec file (YAML) to write; empirical pairs go to <stem>.pairs.csv beside it (missing "
                   "parent directories are created). Without it the fit is only printed.")
@click.option("--window-s", type=float, default=60.0, show_default=True,
              help="Rate window (s): the arrival rate is piecewise constant over windows this long.")
@click.option("--lengths", type=click.Choice(("empirical", "lognormal"), case_sensitive=False),
              default="empirical", show_default=True,
              help="empirical: resample observed (prompt, output) pairs; lognormal: one per marginal.")
@click.option("--counts", type=click.Choice(("fixed", "random"), case_sensitive=False), default="fixed",
              show_default=True,
              help="fixed: each window gets the trace's count; random: Poisson/renewal counts around "
                   "shrunk window rates.")
@click.option("--sampling", type=click.Choice(("balanced", "iid"), case_sensitive=False), default="balanced",
              show_default=True, help="How empirical pairs are resampled (balanced: permutations).")
@click.option("--alpha", type=float, default=0.01, show_default=True,
              help="Level of the test of Poisson (scv = 1) on the time-rescaled gaps.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed for spreading quantized timestamps over their tick.")
@load_options
@json_option
def fit(trace, output, window_s, lengths, counts, sampling, alpha, seed, format, map, time_unit,  # noqa: A002
        spread_ties, drop_bad, request_rate, as_json):
    """Fit an arrival and a length model to TRACE and write them as a spec file.

    Arrivals: a piecewise-constant rate over --window-s windows and, inside them, Poisson or a
    renewal law (Gamma, or hyperexponential bursts) with the CV of the time-rescaled gaps.
    Lengths: the empirical joint (prompt, output) pairs, or lognormal marginals with their
    Kolmogorov-Smirnov distance. Prints the model, the test and the source's statistics beside
    those of one regenerated trace. Run the spec with llmqueue simulate/sweep/capacity --workload
    FILE (--arrival replaces its arrival process; --rates rescale it), or read it back with
    llmqueue.workload.load_fitted.

    Example:

      llmqueue workload fit AzureLLMInferenceTrace_conv.csv -o conv.yaml --window-s 60
    """
    from llmqueue.workload.fit import fit_workload

    tr = load(trace, format, map, time_unit, spread_ties, drop_bad, request_rate)
    fw = fit_workload(tr, window_s=window_s, lengths=lengths.lower(), counts=counts.lower(),
                      sampling=sampling.lower(), alpha=alpha, seed=seed)
    fw.source["path"] = trace
    written = {}
    if output is not None:
        written["spec"] = str(fw.save(output))
        if fw.pairs_path is not None:
            written["pairs"] = str(fw.pairs_path)
    pairs_name = None if fw.pairs_path is None else fw.pairs_path.name
    if as_json:
        print_json({**fw.to_dict(pairs_name), "written": written})
        return
    _print(fw, trace, written)


def _print(fw, trace: str, written: dict) -> None:
    a, ln = fw.arrival_fit, fw.length_fit
    src, mod = fw.source_stats, fw.model_stats
    law = {"poisson": "Poisson", "gamma": f"Gamma gaps, cv {fmt(a['cv'])}",
           "h2": f"hyperexponential (burst) gaps, cv {fmt(a['cv'])}"}[a["renewal"]]
    verdict = "not rejected" if a["renewal"] == "poisson" else "rejected"
    rows = [
        ("arrival model", f"piecewise rate, {a['windows']} windows of {fmt(a['window_s'])} s, counts "
                          f"{a['counts']}; {law}"),
        ("Poisson test", f"scv of rescaled gaps {fmt(a['cv_measured'] ** 2)}, z = {fmt(a['scv_z'])}, "
                         f"p = {fmt(a['scv_pvalue'])} (alpha {fmt(a['alpha'])}): {verdict}"),
        ("rate (req/s)", f"mean {fmt(a['lam'])}, min {fmt(a['rate_min'])}, max {fmt(a['rate_max'])}, "
                         f"peak/mean {fmt(a['peak_to_mean'])}, idle windows {a['idle_windows']}"),
    ]
    if a.get("tick_s"):
        rows.append(("timestamps", f"quantized to ~{fmt(a['tick_s'])} s ticks "
                                   f"({fmt(100 * a['frac_zero_gaps'], 3)} % of gaps are 0)"))
    if ln["model"] == "empirical":
        rows.append(("lengths", f"empirical joint pairs ({ln['pairs']:,}; {ln['distinct_pairs']:,} "
                                f"distinct), correlation {fmt(ln['correlation'])}, {ln['sampling']} "
                                "resampling"))
    else:
        for k in ("prompt", "output"):
            spec = getattr(fw, k).spec
            ks = ln.get(f"{k}_ks")
            tail = "" if ks is None else f", KS D = {fmt(ks)} (p = {fmt(ln[f'{k}_ks_pvalue'])})"
            rows.append((f"{k} lengths", f"{spec}{tail}"))
        rows.append(("correlation", f"{fmt(ln['correlation'])} in the trace, 0 in the model "
                                    "(independent marginals)"))
    print_kv(rows, title=f"Fitted workload for {trace}: {fw.source.get('requests', 0):,} requests over "
                         f"{fmt(fw.duration_s)} s")
    click.echo("")
    stat_rows = [["mean rate (req/s)", src.get("mean_rate"), mod.get("mean_rate")],
                 ["IAT CV", src.get("iat_cv"), mod.get("iat_cv")]]
    for key in (src.get("idc") or {}):
        stat_rows.append([f"IDC {key}", src["idc"].get(key), (mod.get("idc") or {}).get(key)])
    for k in ("prompt", "output"):
        for q in ("p50", "p99"):
            stat_rows.append([f"{k} {q}", _pair(src, k, q), _pair(mod, k, q)])
    print_table(["statistic", "source", "regenerated (seed 0)"], stat_rows)
    for note in fw.notes:
        click.echo(f"note: {note}")
    if written:
        click.echo("wrote " + " and ".join(written.values()))
    else:
        echo_err("(no spec file written; give -o SPEC.yaml to write one)")
