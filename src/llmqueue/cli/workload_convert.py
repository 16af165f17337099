"""``llmqueue workload convert``: any supported trace file to the canonical Parquet trace.

The loading options (``--format``, ``--map``, ``--time-unit``, ``--spread-ties``,
``--drop-bad``, ``--request-rate``) are shared with ``llmqueue workload stats``.
"""

from __future__ import annotations

import click

from llmqueue.cli.common import InputPath, OutputPath, command, json_option, print_json, print_kv, renamed_option

FORMAT_CHOICES = ("azure", "mooncake", "burstgpt", "vllm", "csv", "jsonl", "json", "parquet", "canonical")


def load_options(f):
    """The trace-loading flags, in the order they show in ``--help``."""
    opts = [
        click.option("--format", "format", type=click.Choice(FORMAT_CHOICES, case_sensitive=False),
                     help="Trace format (default: detected from the extension and the header)."),
        click.option("--map", "map", metavar="time=COL,prompt=COL,output=COL[,class=COL][,time_unit=U]",
                     help="Which columns hold the arrival time, prompt and output lengths (and class)."),
        click.option("--time-unit", type=click.Choice(("s", "ms", "us", "ns")),
                     help="Unit of a numeric time column (default: from its name, else seconds, "
                          "checked for plausibility)."),
        click.option("--spread-ties", is_flag=True,
                     help="Spread requests that share a timestamp evenly over their tick "
                          "(quantized traces such as Mooncake's conversation trace)."),
        click.option("--drop-bad", is_flag=True,
                     help="Drop rows with missing, negative or non-integer lengths or missing times "
                          "(reported) instead of stopping at the first."),
        click.option("--request-rate", type=float,
                     help="vLLM results without start_times: the rate (req/s) to space arrivals at."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def load(path, format, map, time_unit, spread_ties, drop_bad, request_rate):  # noqa: A002
    from llmqueue.workload.traces import load_trace

    return load_trace(path, format=format, mapping=map, time_unit=time_unit, drop_bad=drop_bad,
                      spread_ties=spread_ties, request_rate=request_rate)


def _window(text: str):
    from llmqueue.errors import InputError

    start, sep, end = text.partition(":")
    if not sep:
        raise InputError("window", f"{text!r} is not START:END", "e.g. 600:1200, 600: or :1200 (seconds)")
    try:
        return float(start) if start.strip() else 0.0, float(end) if end.strip() else None
    except ValueError:
        raise InputError("window", f"{text!r}: START and END must be numbers of seconds") from None


@command("convert")
@click.argument("input_path", metavar="INPUT", type=InputPath("file"))
@renamed_option("-o", "--out", "output_path", old=("--output",), required=True, type=OutputPath("file"),
              help="Canonical Parquet file to write (never the input; missing parent directories are created).")
@load_options
@click.option("--scale", type=float, help="Multiply arrival times by K (K < 1 compresses: rate x 1/K).")
@click.option("--rate", type=float, help="Rescale time so the mean rate (n-1)/span becomes R req/s.")
@click.option("--window", "window", metavar="START:END", help="Keep arrivals in [START, END) s (rebased to 0).")
@click.option("--loop", "loop", type=int, metavar="N", help="Repeat the trace N times back to back.")
@json_option
def convert(input_path, output_path, format, map, time_unit, spread_ties, drop_bad, request_rate, scale,  # noqa: A002
            rate, window, loop, as_json):
    """Convert a trace to the canonical Parquet file (arrival_s, prompt_tokens, output_tokens).

    Reads Azure 2023 CSV, Mooncake JSONL, BurstGPT CSV, vLLM bench serve JSON
    (--save-result --save-detailed) and any CSV/JSONL/Parquet with --map. Every repair
    (dropped rows, sorting, ties) is printed and stored in the file's metadata. Replay
    options apply in this order: --window, then --scale or --rate, then --loop.

    Example:

      llmqueue workload convert AzureLLMInferenceTrace_conv.csv -o conv.parquet --window 0:600
    """
    from llmqueue.errors import InputError
    from llmqueue.workload import traces as tr

    if scale is not None and rate is not None:
        raise InputError("scale", "give --scale or --rate, not both")
    trace = load(input_path, format, map, time_unit, spread_ties, drop_bad, request_rate)
    fmt = format or tr.detect_format(input_path)
    n_read = len(trace)
    loaded_notes = len(trace.repairs)
    if window is not None:
        start, end = _window(window)
        trace = tr.window(trace, start, end)
    if scale is not None:
        trace = tr.time_scale(trace, scale)
    if rate is not None:
        trace = tr.rescale_rate(trace, rate)
    if loop is not None:
        trace = tr.loop(trace, loop)
    out = tr.write_trace(trace, output_path)
    summary = {"input": str(input_path), "format": fmt, "rows_read": n_read, "output": str(out),
               "n": len(trace), "span_s": trace.span_s, "mean_rate": trace.mean_rate,
               "classes": None if trace.class_name is None else sorted(set(trace.class_name.tolist())),
               "hash_ids": trace.hash_ids is not None,
               "repairs": trace.repairs[:loaded_notes], "transforms": trace.repairs[loaded_notes:]}
    if as_json:
        print_json(summary)
        return
    click.echo(f"read {n_read:,} requests from {input_path} (format {fmt})")
    for note in summary["repairs"]:
        click.echo(f"  repair: {note}")
    for note in summary["transforms"]:
        click.echo(f"  replay: {note}")
    rows = [("requests", len(trace)), ("span (s)", trace.span_s), ("mean rate (req/s)", trace.mean_rate)]
    if summary["classes"]:
        rows.append(("classes", ", ".join(summary["classes"][:8])))
    if trace.hash_ids is not None:
        rows.append(("prefix hash_ids", "kept"))
    print_kv(rows, title=f"wrote {out}")
