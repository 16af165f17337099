"""``llmqueue workload stats``: statistics of a trace file or of a workload spec."""

from __future__ import annotations

import click

from llmqueue.cli.common import InputPath, command, fmt, json_option, print_json, print_kv, print_table, renamed_option
from llmqueue.cli.workload_convert import load, load_options


def _bins(text: str) -> tuple[float, ...]:
    from llmqueue.errors import InputError

    try:
        out = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError("bins", f"{text!r} is not a comma-separated list of seconds", "e.g. 1,60") from None
    if not out:
        raise InputError("bins", "give at least one bin width in seconds", "e.g. 1,60")
    return out


@command("stats")
@click.argument("trace", metavar="[TRACE]", required=False, type=InputPath("file"))
@load_options
@click.option("--arrival", help="Instead of a trace: an arrival spec, e.g. poisson:5 or gamma:5:cv=2.")
@renamed_option("--prompt-len", "prompt", old=("--prompt",), metavar="SPEC",
                help="With --arrival: prompt length spec (tokens), e.g. uniform:10:1600.")
@renamed_option("--output-len", "output", old=("--output",), metavar="SPEC", help="With --arrival: output length spec (tokens).")
@click.option("--lengths", help="With --arrival: joint (prompt, output) pairs, joint:FILE[:prompt=COL:output=COL].")
@click.option("--num-requests", type=int, default=10_000, show_default=True,
              help="Requests to generate from a spec.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for a spec.")
@click.option("--chunk", type=int, default=8192, show_default=True,
              help="Prefill chunk size for E[g] (tokens; vLLM's default token budget, as simulate's).")
@click.option("--bins", "bins", default="1,60", show_default=True,
              help="Bin widths (s) for the index of dispersion and peak/mean of counts.")
@json_option
def stats(trace, format, map, time_unit, spread_ties, drop_bad, request_rate, arrival, prompt, output,  # noqa: A002
          lengths, num_requests, seed, chunk, bins, as_json):
    """Statistics of a trace (any format `convert` reads) or of a workload spec.

    Mean rate (n-1)/span, inter-arrival CV, index of dispersion IDC(b) and peak/mean of
    b-second counts (last partial bin dropped), prompt/output mean and percentiles, their
    correlation, E[g] for the chunk size (Nie et al. 2026) and, with hash_ids, prefix-block reuse.

    Examples:

      llmqueue workload stats AzureLLMInferenceTrace_conv.csv --bins 1,3,60

      llmqueue workload stats --arrival gamma:5:cv=2 --prompt-len uniform:10:1600 --output-len fixed:128
    """
    from llmqueue.errors import InputError
    from llmqueue.workload.stats import spec_stats, trace_stats

    bins = _bins(bins)
    spec_given = any(x is not None for x in (arrival, prompt, output, lengths))
    if trace is not None and spec_given:
        raise InputError("arrival", "give a trace file or a spec (--arrival with --prompt-len/--output-len or "
                         "--lengths), not both")
    if trace is not None:
        st = trace_stats(load(trace, format, map, time_unit, spread_ties, drop_bad, request_rate),
                         chunk=chunk, bins=bins)
    elif spec_given:
        if arrival is None:
            raise InputError("arrival", "a spec needs an arrival process", "e.g. --arrival poisson:5")
        if lengths is not None:
            if prompt is not None or output is not None:
                raise InputError("lengths", "give either --lengths or --prompt-len/--output-len, not both")
            dists = dict(joint=lengths)
        else:
            if prompt is None or output is None:
                raise InputError("prompt" if prompt is None else "output", "missing length distribution",
                                 "give --prompt-len SPEC and --output-len SPEC, or --lengths joint:FILE")
            dists = dict(prompt=prompt, output=output)
        st = spec_stats(arrival, n=num_requests, seed=seed, chunk=chunk, bins=bins, **dists)
    else:
        raise InputError("trace", "give a trace file, or a workload spec with --arrival",
                         "e.g. llmqueue workload stats trace.csv, or --arrival poisson:5 "
                         "--prompt-len uniform:10:1600 --output-len fixed:128")
    if as_json:
        print_json(st)
        return
    title = (f"{st.n:,} requests generated from a spec (seed {seed})" if st.generated
             else f"{st.n:,} requests from {st.source}")
    for note in st.repairs:
        click.echo(f"repair: {note}")
    rows = [("span (s)", st.span_s), ("mean rate (n-1)/span (req/s)", st.mean_rate),
            ("inter-arrival CV", st.iat_cv), ("fraction of zero gaps", st.frac_zero_iat)]
    for key in st.idc:
        rows.append((f"IDC {key} / peak-to-mean {key}", f"{fmt(st.idc[key])} / {fmt(st.peak_to_mean[key])}"))
    rows += [("prompt-output correlation", st.corr), (f"E[g] (chunk {st.chunk}, token-steps)", st.E_g)]
    if st.prefix_reuse_frac is not None:
        rows.append(("prefix-block reuse", f"{st.prefix_reuse_frac:.1%}"))
    if st.n_classes > 1:
        rows.append(("classes", st.n_classes))
    print_kv(rows, title=title)
    click.echo("")
    print_table(["tokens", "mean", "p50", "p90", "p99", "min", "max"],
                [[name, d.mean, d.p50, d.p90, d.p99, d.min, d.max] for name, d in
                 (("prompt", st.prompt), ("output", st.output))])
