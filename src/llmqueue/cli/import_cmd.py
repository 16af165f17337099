"""``llmqueue import FORMAT FILE --out RUN``: another client's measurements as a run directory."""

from __future__ import annotations

import click

from llmqueue.bench.importers import IMPORTERS
from llmqueue.bench.options import RUN_WARMUP_S
from llmqueue.cli.common import InputPath, OutputPath, command, json_option, print_json, print_kv, run_outputs


def _origin(text):
    from llmqueue.errors import InputError

    if text is None or str(text).strip().lower() == "first":
        return None
    try:
        return float(text)
    except ValueError:
        raise InputError("time_origin", f"{text!r} is not a number of seconds",
                         "e.g. --time-origin 1715000000.0 (subtracted from every time), or first") from None


_HELP = """Import per-request measurements taken by another client as a run directory that
    validate, calibrate and report read.

    FORMAT: {formats}.

    Examples:

      llmqueue import vllm-bench result.json --out runs/vllm --max-num-seqs 256 --max-num-batched-tokens 8192

      llmqueue import guidellm benchmarks.json --benchmark 3 --out runs/guidellm-3 --server-log vllm.log

      llmqueue import aiperf artifacts/my-run/profile_export.jsonl --out runs/aiperf --max-num-seqs 256

      llmqueue import jsonl client.jsonl --out runs/mine --map send_s=t0,ttft_s=ttft,e2el_s=latency,prompt_tokens=n_in,output_tokens=n_out

      llmqueue import jsonl run.jsonl.gz --out runs/theirs --time-zero 1764000000.25 --status-map aborted_drain_cap=cancelled --metrics metrics.csv --server-log vllm.log
    """


@command("import", help=_HELP.format(formats="; ".join(f"{i.name} ({i.help})" for i in IMPORTERS.values())))
@click.argument("format", metavar="FORMAT", type=click.Choice(tuple(IMPORTERS), case_sensitive=False))
@click.argument("file", type=InputPath("file"))
@click.option("--out", "out_dir", required=True, type=OutputPath("dir", also=run_outputs),
              help="Run directory to write (requests.parquet, workload.parquet, tokens.parquet, summary.json, "
                   "server.json), created with any missing parents.")
@click.option("--map", "mapping", metavar="FIELD=COLUMN,...",
              help="jsonl/csv: which column holds each record field (send_s, ttft_s or first_token_s, e2el_s or "
                   "finish_s, prompt_tokens, output_tokens, status, error, request_id, class, arrival_s, "
                   "chunk_times, itl_s, ...) [default: columns named like the fields].")
@click.option("--time-origin", metavar="SECONDS|first", help="Subtracted from every absolute time [default: first, "
              "the earliest send: the run starts at 0; with --time-zero, the file's 0].")
@click.option("--time-zero", type=float, metavar="EPOCH", help="The epoch second the file's times count from (a file "
              "whose times count from the run's start): added to every time, so the server log's steps and the "
              "/metrics samples line up [default: the times are the file's own clock].")
@click.option("--status-map", metavar="FROM=TO,...", help="The file's own status words onto the record schema's "
              "(ok, rejected, timeout, cancelled, error, unfinished), e.g. aborted_drain_cap=cancelled.")
@click.option("--metrics", "metrics", type=InputPath("file"), help="The server's /metrics samples, brought in as "
              "bench's sampler records them (metrics.parquet, timeseries.parquet, the summary's server_counters): "
              "Prometheus text scrapes, each after a '# time T' line (T on the requests' clock and unit) or with the "
              "exposition's own timestamps (epoch ms); or a CSV with a time column (t_s, time_s, time or timestamp) "
              "and a column per metric (num_waiting, preemptions, ... or vllm:num_requests_waiting, ...) or "
              "name,value.")
@click.option("--warmup", "warmup_s", type=float, default=RUN_WARMUP_S, show_default=True, metavar="S",
              help="Seconds left out of the statistics, as a bench run's warm-up (ignored, with a note, when not "
                   "shorter than the run).")
@click.option("--time-unit", type=click.Choice(("s", "ms", "us", "ns")), default="s", show_default=True,
              help="jsonl/csv: the unit of the time columns.")
@click.option("--request-rate", type=float, help="vllm-bench without start_times: the rate (req/s) to space the "
              "sends at [default: the file's].")
@click.option("--benchmark", type=int, metavar="K", help="guidellm: which benchmark of the report (1 = the "
              "first) [default: the only one; a report of several is refused with their list].")
@click.option("--max-num-seqs", type=int, metavar="N", help="The server's --max-num-seqs (server.json, for "
              "calibrate/validate).")
@click.option("--max-num-batched-tokens", type=int, metavar="N", help="The server's --max-num-batched-tokens.")
@click.option("--block-size", type=int, metavar="N", help="The server's KV block size.")
@click.option("--num-gpu-blocks", type=int, metavar="N", help="The server's KV blocks (M = (N - 1) x block size).")
@click.option("--capacity-tokens", type=float, metavar="M", help="The server's KV capacity in tokens.")
@click.option("--server-log", type=InputPath("file"), help="The server's log: its startup lines give the engine "
              "settings (vLLM's non-default args, the engine config, the KV cache size).")
@json_option
def import_(format, file, out_dir, mapping, time_origin, time_zero, status_map, metrics, warmup_s,  # noqa: A002
            time_unit, request_rate, benchmark, max_num_seqs, max_num_batched_tokens, block_size, num_gpu_blocks,
            capacity_tokens, server_log, as_json):
    """``llmqueue import``: the help is :data:`_HELP`, listing the formats of the registry."""
    from llmqueue.bench.importers import import_run
    from llmqueue.errors import InputError

    settings = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                "block_size": block_size, "num_gpu_blocks": num_gpu_blocks}
    for k, v in settings.items():
        if v is not None and v < 1:
            raise InputError(k, f"must be a positive integer (got {v})")
    if capacity_tokens is not None:
        if not capacity_tokens > 0:
            raise InputError("capacity_tokens", f"must be > 0 (got {capacity_tokens:g})")
        settings["M_usable"] = capacity_tokens
    settings = {k: v for k, v in settings.items() if v is not None}
    if warmup_s is not None and not warmup_s >= 0:
        raise InputError("warmup", f"must be a number of seconds >= 0 (got {warmup_s:g})", "e.g. --warmup 15, or 0")
    s = import_run(format.lower(), file, out_dir, mapping=mapping, time_origin=_origin(time_origin),
                   time_zero=time_zero, time_unit=time_unit, request_rate=request_rate, settings=settings or None,
                   server_log=server_log, benchmark=benchmark, status_map=status_map, metrics=metrics,
                   warmup_s=warmup_s)
    if as_json:
        print_json(s)
        return
    counts = ", ".join(f"{k} {v}" for k, v in (s.get("status_counts") or {}).items() if v) or "-"
    rows = [("source", f"{file} ({format})"), ("requests", s["imported"]["requests"]),
            ("dropped (impossible times)", s["imported"]["dropped"]), ("status counts", counts),
            ("per-chunk times", "yes (tokens.parquet)" if s["imported"]["chunk_times"] else "no"),
            ("request throughput (req/s)", s.get("request_throughput")),
            ("median / p99 TTFT (ms)", f"{s.get('median_ttft_ms') or float('nan'):,.1f} / "
                                        f"{s.get('p99_ttft_ms') or float('nan'):,.1f}")]
    rows += [("note", n) for n in s.get("notes") or ()]
    print_kv(rows, title="Imported")
    click.echo(f"\nrun directory written to {out_dir}/ (validate, calibrate and report read it)")
