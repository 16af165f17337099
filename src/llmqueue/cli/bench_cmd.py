"""``llmqueue bench``: open-loop benchmark of an OpenAI-compatible server (records, summary, checks).

The command translates flags: the options of the run are :class:`~llmqueue.bench.options.BenchOptions`
(their flags generated from :data:`llmqueue.bench.options.OPTIONS`), the workload flags are the
simulator's (:mod:`llmqueue.knobs`), and ``vllm bench serve``'s names map onto both.

Exit codes: 0 the run completed (whatever the requests' statuses); 2 bad input, or the server
could not be reached before anything was sent (``llmqueue: error: --url: cannot connect ...``);
1 the run stopped early because the server stopped accepting connections (the report is printed,
every finished attempt is on disk), or because the records could not be written (a full disk: the
report is printed, the error line says how many records are on disk; they stay readable);
130 interrupted (Ctrl-C / SIGTERM; the same holds). Whatever a server answers (broken usage
counts, wrong types, oversized lines, more tokens than asked) is a status of its request, counted
in the summary, never the run's failure.
"""

from __future__ import annotations

import click

from llmqueue.bench.options import OPTIONS
from llmqueue.cli.common import (
    Command,
    InputPath,
    OutputPath,
    command,
    json_option,
    print_json,
    print_kv,
    run_outputs,
    server_setting_options,
    server_settings,
)
from llmqueue.cli.flags import TableFlags, given_flags, knob_options

_WORKLOAD = ("trace", "arrival", "prompt", "output", "lengths", "num_requests", "duration", "seed")
RUN_FLAGS = TableFlags(OPTIONS)  # the flags of the run's options, placed below in --help order


def build_requests(*, trace, arrival, prompt, output, lengths, num_requests, duration, seed):
    """The request stream from the workload flags (the same flags and rules as ``simulate``):
    ``(requests, hash_ids)``, ``hash_ids`` the trace's prefix-block hashes or None."""
    from llmqueue.spec import workload_from_flags

    wl, requests, hash_ids = workload_from_flags(trace=trace, arrival=arrival, prompt=prompt, output=output,
                                                 lengths=lengths, num_requests=num_requests, duration=duration)
    if requests is None:
        return wl.generate(seed, n=num_requests, duration=duration), None
    return requests, hash_ids


class _BenchCommand(Command):
    """Also reads vLLM's multi-value spelling ``--goodput ttft:500 tpot:50``."""

    def parse_args(self, ctx, args):
        from llmqueue.bench.vllm_flags import expand_multi

        return super().parse_args(ctx, expand_multi(list(args)))


@command("bench", cls=_BenchCommand)
@click.option("--url", required=True, help="The server, e.g. http://127.0.0.1:8000 (or a full .../v1/completions URL).")
@click.option("--model", help="Model name to request [default: the first one the server lists at /v1/models].")
@RUN_FLAGS.place("endpoint")
@click.option("--scenario", help="Take the workload (classes, timeouts, retries, SLOs) from a scenario file or example.")
@knob_options(names=_WORKLOAD)
@RUN_FLAGS.place("concurrency")
@click.option("--request-rate", metavar="R|inf", help="vLLM's rate (req/s): Poisson arrivals, or Gamma with "
              "--burstiness; inf sends every request at once (then give --num-prompts) [instead of --arrival].")
@click.option("--burstiness", type=float, help="vLLM's Gamma shape of the gaps with --request-rate: 1 Poisson, "
              "< 1 burstier, > 1 more even, inf evenly spaced [default: 1].")
@click.option("--max-concurrency", type=int, help="vLLM's name for --concurrency.")
@click.option("--num-prompts", type=int, help="vLLM's name for --num-requests.")
@click.option("--dataset-name", type=click.Choice(["random", "sharegpt", "custom"]),
              help="random: token-id prompts from --prompt-len/--output-len (the default); sharegpt: a ShareGPT JSON "
              "file's conversations; custom: a JSONL file of {\"prompt\": ...} lines. Text prompts; the records "
              "keep the server's token counts.")
@click.option("--dataset-path", type=InputPath("file"), help="The ShareGPT JSON or custom JSONL file.")
@click.option("--tokenizer", help="Count a dataset's tokens with this Hugging Face tokenizer (needs transformers) "
              "[default: estimate 4 characters a token; the records hold the server's counts anyway].")
@click.option("--goodput", multiple=True, metavar="METRIC:MS ...", help="vLLM's goodput thresholds, e.g. "
              "--goodput ttft:500 tpot:50 (ttft, tpot, e2el in ms): request_goodput counts requests meeting all.")
@RUN_FLAGS.place("extra_body")
@click.option("--percentile-metrics", metavar="ttft,tpot,itl,e2el",
              help="Metrics the --save-result file reports [default: ttft,tpot,itl, as vLLM].")
@RUN_FLAGS.place("percentiles")
@click.option("--save-result", is_flag=True, help="Also write vLLM bench serve's result JSON (its keys and "
              "definitions), into the run directory unless --result-dir.")
@click.option("--result-dir", type=OutputPath("dir"), help="With --save-result: the directory of the result file.")
@click.option("--result-filename", help="With --save-result: its file name [default: vLLM's "
              "{backend}-{rate}qps[-concurrency{N}]-{model}-{date}.json].")
@RUN_FLAGS.place("timeout_s", "ttft_timeout_s")
@click.option("--max-attempts", type=int, help="Retry failed attempts (rejected/timeout/error) up to this many tries, "
              "OpenAI SDK backoff [default: 1, or the scenario's].")
@RUN_FLAGS.place("vocab_size", "exact_output", "drain_timeout_s", "warmup_s", "warmup_requests", "metrics_url")
@click.option("--server-log", type=click.Path(), help="The server's log file, written while the run goes (vLLM with "
              "--enable-logging-iteration-details and VLLM_LOGGING_PREFIX='%(created).6f '): its per-step lines "
              "become steps.parquet, for calibrate's step cycle and linear step-time model.")
@server_setting_options
@click.option("--server-enable-chunked-prefill/--server-no-enable-chunked-prefill", default=None,
              help="Whether the server chunks prefills [default: from --server-log].")
@click.option("--prefix-hashes/--no-prefix-hashes", default=True, show_default=True,
              help="With a trace that has prefix-block hashes (Mooncake): requests sharing a hash share that "
              "prompt block, so the server's prefix cache sees the trace's reuse.")
@RUN_FLAGS.place("prefix_block_tokens")
@RUN_FLAGS.rest()
@click.option("--out", "out_dir", type=OutputPath("dir", also=run_outputs),
              help="Run directory, created with any missing parents [default: runs/bench-YYYYmmdd-HHMMSS].")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@json_option
@click.pass_context
def bench(ctx, **flags):
    """Benchmark an OpenAI-compatible server (vLLM) with an open-loop workload.

    Sends each request at its intended arrival time (never waiting for earlier answers),
    streams the answers, and writes one record per attempt in the simulator's schema
    (requests.parquet, tokens.parquet, workload.parquet, summary.json), so a measured run and a
    simulated one compare by a join. The summary carries vLLM bench serve's metric names
    (TTFT, TPOT, ITL, E2EL) plus the client's own checks (send lag, KS test of the gaps).

    Examples:

      llmqueue bench --url http://127.0.0.1:8000 --arrival poisson:5 --prompt-len uniform:100:1000
      --output-len fixed:128 --duration 120 --out runs/p5

      llmqueue bench --url http://127.0.0.1:8000 --scenario chat --duration 300 --json

      llmqueue bench --url http://127.0.0.1:8000 --trace mooncake.jsonl --duration 600 --vocab-size 32000

      llmqueue bench --url http://127.0.0.1:8000 --dataset-name sharegpt --dataset-path ShareGPT_V3.json
      --request-rate 20 --max-concurrency 8 --num-prompts 500 --goodput ttft:500 tpot:50 --save-result

    vLLM bench serve's flags are aliases of the native ones (--request-rate/--burstiness for
    --arrival, --max-concurrency for --concurrency, --num-prompts for --num-requests); giving
    both names of one knob is an error. Latencies with vLLM's names count from each request's
    actual send, as vLLM's do; the same from the intended send time are under from_intended.
    """
    import sys
    import time
    from pathlib import Path

    import numpy as np

    from llmqueue.bench import vllm_flags as vf
    from llmqueue.bench.client import run_bench
    from llmqueue.bench.http import check_url
    from llmqueue.bench.options import DEFAULT_TIMEOUT_S, BenchOptions
    from llmqueue.bench.served_model import server_model
    from llmqueue.errors import InputError

    f = flags
    url = check_url(f["url"])
    rate, burst, send_all = _vllm_aliases(f)
    file_dataset = _check_dataset(f)
    # the run's options given as flags, checked once; those not given take the scenario's, or
    # their defaults (below)
    given = RUN_FLAGS.values(f)
    if f["exact_output"] is None:
        given["exact_output"] = not file_dataset
    opts = BenchOptions(**given)
    goodput_slos = vf.parse_goodput(f["goodput"]) if f["goodput"] else None
    pmetrics = vf.parse_percentile_metrics(f["percentile_metrics"]) if f["percentile_metrics"] is not None else None
    if not f["save_result"]:
        for name in ("result_dir", "result_filename"):
            if f[name] is not None:
                raise InputError(name, "names the --save-result file, which is not asked for", "add --save-result")
    if f["result_filename"] is not None and (not f["result_filename"].strip() or "/" in f["result_filename"]):
        raise InputError("result_filename", f"{f['result_filename']!r} is not a file name",
                         "give a name like result.json (the directory is --result-dir)")
    max_attempts = f["max_attempts"]
    if max_attempts is not None and max_attempts < 1:
        raise InputError("max_attempts", f"must be a positive integer (got {max_attempts})")
    server_flags = {**server_settings(f), "enable_chunked_prefill": f["server_enable_chunked_prefill"]}
    opts.route(url)  # what is sent and through what, checked before anything is sent (/v1/models included)
    retry = slos = dataset = None
    hash_ids = None  # a trace's prefix-block hashes (a scenario carries none)
    timeouts = f["timeout_s"] if f["timeout_s"] is not None else DEFAULT_TIMEOUT_S
    ttft_timeouts = f["ttft_timeout_s"]
    warmup = f["warmup_s"]
    seed = f["seed"]
    wl = {k: f[k] for k in _WORKLOAD}
    if f["scenario"] is not None:
        from llmqueue.scenario.override import scenario_with
        from llmqueue.simulate import _slo_targets

        # the workload flags given override the scenario's (the run length is set below: a
        # benchmark keeps the scenario's warm-up whatever its length)
        sc = scenario_with(f["scenario"], **{k: wl[k] for k in ("trace", "arrival", "prompt", "output", "lengths")
                                             if wl[k] is not None}).scenario
        run = sc.run
        if wl["duration"] is not None or wl["num_requests"] is not None:
            if wl["duration"] is not None and wl["num_requests"] is not None:
                raise InputError("num_requests", "give --num-requests or --duration, not both")
            run = run.model_copy(update={"duration_s": wl["duration"], "num_requests": wl["num_requests"]})
            sc = sc.model_copy(update={"run": run})
        seed = seed if given_flags(ctx, ["seed"]) else run.seed
        requests = sc.requests(seed)
        mix = sc.mix
        retry = mix
        slos = _slo_targets(mix.slos)
        if f["timeout_s"] is None:
            timeouts = {c.name: (c.client.timeout_s if c.client.timeout_s is not None else DEFAULT_TIMEOUT_S)
                        for c in mix.classes}
        if f["ttft_timeout_s"] is None:
            ttft_timeouts = {c.name: c.client.ttft_timeout_s for c in mix.classes}
        if max_attempts is not None:
            retry = _retry_behavior(max_attempts)
        if warmup is None:
            warmup = run.warmup_s
    elif file_dataset:
        if wl["arrival"] is None:
            raise InputError("request_rate", "missing arrival process", "give --request-rate R (or inf) or --arrival SPEC")
        gen, _ = build_requests(**{**wl, "prompt": "fixed:1", "output": wl["output"] or "fixed:1"})
        from llmqueue.bench.datasets import load_dataset

        dataset = load_dataset(f["dataset_name"], f["dataset_path"], len(gen), seed=seed, tokenizer=f["tokenizer"],
                               output_len=gen.output_tokens if wl["output"] is not None else None)
        requests = _with(gen, prompt_tokens=dataset.prompt_tokens, output_tokens=dataset.output_tokens)
        if max_attempts is not None and max_attempts > 1:
            retry = _retry_behavior(max_attempts)
    else:
        requests, hash_ids = build_requests(**wl)
        if not f["prefix_hashes"]:
            hash_ids = None
        if max_attempts is not None and max_attempts > 1:
            retry = _retry_behavior(max_attempts)
    if len(requests) == 0:
        raise InputError("duration", "the workload has no request in that window", "give a longer --duration")
    if send_all:  # vLLM's --request-rate inf: every request at time 0
        requests = _with(requests, arrival_s=np.zeros(len(requests)))
    elif rate is not None and wl["duration"] is None and len(requests) and requests.arrival_s[-1] > 0:
        # as vLLM does: the gaps scaled so that the last request is sent at N / rate
        requests = _with(requests, arrival_s=np.asarray(requests.arrival_s) * (len(requests) / rate
                                                                             / float(requests.arrival_s[-1])))
    if goodput_slos is not None:
        slos = goodput_slos
    model = f["model"] if f["model"] is not None else server_model(url, opts=opts)
    out_dir = f["out_dir"] if f["out_dir"] is not None else str(Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S"))
    server_log = f["server_log"]
    if server_log is not None:
        from llmqueue.bench.steplog import log_offset

        log_start = log_offset(server_log)
    progress = f["progress"] if f["progress"] is not None else sys.stderr.isatty()
    opts = opts.replace(out_dir=out_dir, timeout_s=timeouts, ttft_timeout_s=ttft_timeouts, seed=seed, retry=retry,
                        warmup_s=warmup or 0.0, progress=progress, slos=slos, hash_ids=hash_ids,
                        prompt_texts=dataset.texts if dataset is not None else None)
    res = run_bench(url, model, requests, opts)
    b = res.summary.setdefault("bench", {})
    b["vllm"] = {"request_rate": "inf" if send_all else rate, "burstiness": burst if rate is not None else None,
                 "max_concurrency": opts.concurrency, "goodput": goodput_slos, "extra_body": opts.extra_body}
    if dataset is not None:
        b["dataset"] = dataset.describe()
    result_path = None
    if f["save_result"]:
        result_path = _save_vllm_result(res, out_dir=out_dir, result_dir=f["result_dir"],
                                        filename=f["result_filename"], model=model, endpoint=opts.endpoint,
                                        num_prompts=len(requests), rate=rate, arrival=wl["arrival"], burstiness=burst,
                                        max_concurrency=opts.concurrency, tokenizer=f["tokenizer"], metrics=pmetrics)
    _record_server(res, out_dir, server_flags, server_log)
    _dump_summary(res, out_dir)
    if server_log is not None and res.summary.get("bench", {}).get("t0_epoch_s") is not None:
        _server_log_steps(res, out_dir, server_log, log_start)
    if f["as_json"]:
        print_json(res.summary)
    else:
        print_report(res.summary, out_dir)
        if result_path is not None:
            click.echo(f"vLLM bench serve result written to {result_path}")
    if res.error is not None:
        click.echo(f"llmqueue: error: {res.error}; {res.written} attempt record(s) written to {out_dir}/", err=True)
        raise click.exceptions.Exit(130 if res.interrupted else 1)


def _vllm_aliases(f: dict) -> tuple:
    """vLLM bench serve's flags, each standing for a native one (both given: an error), written
    into ``f`` (``concurrency``, ``num_requests``, ``arrival``); returns ``(rate, burstiness,
    send_all)``: ``--request-rate`` (None when not given), its Gamma shape, and whether it is inf."""
    import math

    from llmqueue.bench import vllm_flags as vf
    from llmqueue.errors import InputError

    for name in ("max_concurrency", "num_prompts"):
        if f[name] is not None and f[name] < 1:
            raise InputError(name, f"must be a positive integer (got {f[name]})")
    f["concurrency"] = vf.one_of("concurrency", "max_concurrency", f["concurrency"], f["max_concurrency"])
    f["num_requests"] = vf.one_of("num_requests", "num_prompts", f["num_requests"], f["num_prompts"])
    rate = vf.parse_request_rate(f["request_rate"]) if f["request_rate"] is not None else None
    if rate is not None:
        for native in ("arrival", "trace"):
            if f[native] is not None:
                raise InputError("request_rate", f"--request-rate and --{native} both give the arrivals",
                                 f"drop --{native} or --request-rate")
    if f["burstiness"] is not None:
        vf.check_burstiness(f["burstiness"])
        if rate is None:
            raise InputError("burstiness", "shapes --request-rate's gaps, which is not given",
                             "give --request-rate R (or use --arrival gamma:R:cv=CV)")
    burst = 1.0 if f["burstiness"] is None else float(f["burstiness"])
    send_all = rate == math.inf
    if send_all:
        if f["duration"] is not None or f["num_requests"] is None:
            raise InputError("request_rate", "inf sends every request at once: the run needs a number of requests",
                             "give --num-prompts N (not --duration)")
        f["arrival"] = "poisson:1"  # only to draw the stream; every send time becomes 0 later
    elif rate is not None:
        f["arrival"] = vf.arrival_spec(rate, burst)
    return rate, burst, send_all


def _check_dataset(f: dict) -> bool:
    """Whether the prompts come from a dataset file (``--dataset-name sharegpt|custom``), checked
    against the flags that would bring prompts of their own."""
    from llmqueue.errors import InputError

    name, path = f["dataset_name"], f["dataset_path"]
    file_dataset = name in ("sharegpt", "custom")
    if path is not None and not file_dataset:
        raise InputError("dataset_path", "is read by --dataset-name sharegpt or custom" +
                         (" (random builds its prompts)" if name == "random" else ""),
                         "give --dataset-name sharegpt or custom, or drop --dataset-path")
    if file_dataset:
        if path is None:
            raise InputError("dataset_path", f"--dataset-name {name} needs the file", "give --dataset-path FILE")
        for native in ("scenario", "trace", "prompt", "lengths"):
            if f[native] is not None:
                raise InputError("dataset_name", f"a {name} dataset brings its own prompts: --{native} "
                                 "cannot be used with it", f"drop --{native} or --dataset-name")
    return file_dataset


def _server_log_steps(res, out_dir, server_log, log_start) -> None:
    """steps.parquet from the server's log lines written during the run (a note when none or when
    the disk is full), and summary.json again with the count."""
    import json
    from pathlib import Path

    from llmqueue.bench.steplog import write_run_steps
    from llmqueue.records import dump_summary

    sj = Path(out_dir) / "server.json"
    M = json.loads(sj.read_text()).get("M") if sj.exists() else None
    b = res.summary["bench"]
    try:
        n, note = write_run_steps(out_dir, server_log, offset=log_start, t0_epoch_s=b["t0_epoch_s"],
                                  t_end_s=b.get("t_end_s"), M=M, finish_s=res.records["finish_s"])
        res.summary["bench"]["server_log_steps"] = n
        if note:
            res.summary.setdefault("notes", []).append(note)
            click.echo(f"llmqueue: note: {note}", err=True)
        dump_summary(Path(out_dir) / "summary.json", res.summary)
    except OSError as e:  # a full disk after the run: the records are written, say so in one line
        click.echo(f"llmqueue: note: the server log's steps not saved in {out_dir} ({e.strerror or e})", err=True)


def _with(requests, **cols):
    """The request stream with some columns replaced."""
    from llmqueue.workload.generate import RequestArrays

    c = {"request_id": requests.request_id, "arrival_s": requests.arrival_s,
         "prompt_tokens": requests.prompt_tokens, "output_tokens": requests.output_tokens, **cols}
    return RequestArrays(c["request_id"], c["arrival_s"], c["prompt_tokens"], c["output_tokens"],
                         requests.class_name)


def _record_server(res, out_dir, flags: dict, server_log) -> None:
    """server.json: the engine settings the metrics, the server's log and the ``--server-*``
    flags state, each with its source (:mod:`llmqueue.bench.server_info`); the settings calibrate
    needs that none of them stated get a note (a full disk: one note line)."""
    from pathlib import Path

    from llmqueue.bench.server_info import REQUIRED, record

    if not Path(out_dir).is_dir():
        return
    try:
        server = record(out_dir, flags=flags, log=server_log)
    except OSError as e:
        click.echo(f"llmqueue: note: server.json not written in {out_dir} ({e.strerror or e})", err=True)
        return
    for n in server.get("notes") or []:  # the sources disagree
        res.summary.setdefault("notes", []).append(n)
        click.echo(f"llmqueue: note: {n}", err=True)
    missing = [k for k in REQUIRED if server.get(k) is None]
    if missing:  # in the report, not on stderr: most runs are not calibrated
        res.summary.setdefault("notes", []).append(
            f"server.json lacks {', '.join(missing)}: give them to calibrate ("
            + ", ".join(f"--{k.replace('_', '-')} N" for k in missing)
            + ", or --profile DIR of a profile given them), or to bench as "
            + ", ".join(f"--server-{k.replace('_', '-')}" for k in missing))


def _dump_summary(res, out_dir) -> None:
    """summary.json again, with what the command added (a full disk: one note line)."""
    from pathlib import Path

    from llmqueue.records import dump_summary

    if not (Path(out_dir) / "summary.json").exists():
        return
    try:
        dump_summary(Path(out_dir) / "summary.json", res.summary)
    except OSError as e:
        click.echo(f"llmqueue: note: summary.json not updated in {out_dir} ({e.strerror or e})", err=True)


def _save_vllm_result(res, *, out_dir, result_dir, filename, model, endpoint, num_prompts, rate, arrival,
                      burstiness, max_concurrency, tokenizer, metrics):
    """``--save-result``: vLLM bench serve's result JSON; its path, or None (a note) if unwritable."""
    import math
    from pathlib import Path

    from llmqueue.bench.vllm_result import DEFAULT_PERCENTILE_METRICS, result_filename, vllm_result, write_result

    if rate is None:  # the native --arrival (or a scenario): its rate, else the schedule's
        rate = res.summary.get("request_rate") or math.inf
        if arrival is not None:
            try:
                from llmqueue.workload import Workload

                rate = float(Workload(arrival, prompt="fixed:1", output="fixed:1").arrival.rate)
            except Exception:  # noqa: BLE001 - only the label of the file
                pass
    rate_v = "inf" if rate == math.inf else rate
    result = vllm_result(res.summary, res.records, res.tokens, model=model, endpoint=endpoint,
                         num_prompts=num_prompts, request_rate=rate_v, burstiness=burstiness,
                         max_concurrency=max_concurrency, tokenizer_id=tokenizer,
                         percentile_metrics=metrics or DEFAULT_PERCENTILE_METRICS)
    name = filename or result_filename(endpoint=endpoint, request_rate=rate_v, max_concurrency=max_concurrency,
                                       model=model, date=result["date"])
    path = Path(result_dir if result_dir is not None else out_dir) / name
    try:
        write_result(path, result)
    except OSError as e:
        click.echo(f"llmqueue: note: the vLLM result file {path} not written ({e.strerror or e})", err=True)
        return None
    res.summary.setdefault("bench", {})["vllm_result"] = str(path)
    return path


def _retry_behavior(max_attempts: int):
    from llmqueue.workload.client import ClientBehavior, RetryPolicy

    return ClientBehavior(retry=RetryPolicy(max_attempts=max_attempts))


def _gaps_row(c: dict) -> tuple[str, str]:
    """The client's test of its send gaps (``summary["client"]``,
    :func:`llmqueue.bench.checks.arrival_check`): what the schedule promised and how it was held."""
    ks, gaps = c.get("ks_gaps"), c.get("gap_check")
    if ks:
        return "gaps KS test (D, p)", f"{ks['statistic']:.3f}, {ks['pvalue']:.3g}"
    if gaps:
        return "constant gap, p99 error (ms)", f"{gaps['gap_ms']:.3g}, {gaps['p99_gap_error_ms']:.3f}"
    return "gaps test", "none: all sent at once" if c.get("schedule") == "all at once" else "-"


def print_report(s: dict, out_dir=None) -> None:
    """The readable summary of a measured run."""

    def ms(key, d=s):
        v = d.get(key)
        return "-" if v is None else f"{v:,.1f}"

    # the highest percentile the summary has (p99 by default; --metric-percentiles may change it)
    from llmqueue.metrics.summary import percentile_word

    pcts = s.get("percentiles") or [99]
    pw = "p" + percentile_word(99 if 99 in pcts else max(pcts))

    def pk(metric):
        return f"{pw}_{metric}_ms"

    b = s.get("bench", {})
    c = s.get("client", {})
    lag = c.get("lag_ms") or {}
    fi = s.get("from_intended") or {}
    rows = [
        ("server", f"{b.get('url')}  model {b.get('model')}"),
        ("load", b.get("load")),
        ("completed / arrived (in window)", f"{s.get('completed')} / {s.get('arrivals')}"),
        ("status counts", ", ".join(f"{k} {v}" for k, v in (s.get("status_counts") or {}).items() if v) or "-"),
        ("duration (s)", s.get("duration_s")),
        ("request throughput (req/s)", s.get("request_throughput")),
        ("output throughput (tok/s)", s.get("output_throughput")),
        (f"mean / {pw} TTFT (ms), from the send (vLLM)", f"{ms('mean_ttft_ms')} / {ms(pk('ttft'))}"),
        ("TTFT from the intended send time", f"{ms('mean_ttft_ms', fi)} / {ms(pk('ttft'), fi)}"),
        (f"mean / {pw} TPOT (ms)", f"{ms('mean_tpot_ms')} / {ms(pk('tpot'))}"),
        (f"mean / {pw} ITL (ms)", f"{ms('mean_itl_ms')} / {ms(pk('itl'))}"),
        (f"mean / {pw} E2EL (ms), from the send (vLLM)", f"{ms('mean_e2el_ms')} / {ms(pk('e2el'))}"),
        ("E2EL from the intended send time", f"{ms('mean_e2el_ms', fi)} / {ms(pk('e2el'), fi)}"),
        ("peak concurrent requests (vLLM: sent, not done)", s.get("max_concurrent_requests")),
        ("failed share (of arrivals)", "-" if s.get("failed_share") is None else f"{100 * s['failed_share']:.3g}%"),
        ("verdict (queue, failures, goodput)", s.get("verdict")),
        ("send lag p50 / p99 / max (ms)",
         f"{lag.get('p50', 0):.3f} / {lag.get('p99', 0):.3f} / {lag.get('max', 0):.3f}" if lag else "-"),
        _gaps_row(c),
        ("client check", c.get("verdict")),
    ]
    lb = s.get("lower_bounds")
    if lb:  # the queue grew: the means above are over the requests that finished, the lucky ones
        def ge(key):
            v = lb.get(key)
            return "-" if v is None else f">= {v:,.1f}"

        rows.append((f"mean / {pw} TTFT, E2EL (ms), lower bounds",
                     f"{ge('mean_ttft_ms')} / {ge(pk('ttft'))}, {ge('mean_e2el_ms')} / {ge(pk('e2el'))}"))
        rows.append(("lower bounds (the queue grows)", f"{lb['unfinished']} of {lb['requests']} requests "
                     "unfinished at the stop, counted with their wait so far; no steady state"))
    if s.get("request_goodput") is not None:
        rows.append(("request goodput (req/s)", s.get("request_goodput")))
    ph = b.get("prefix_hashes")
    if ph:
        rows.append(("prompts from prefix hashes", f"{ph['requests']} requests, {ph['block_tokens']} tokens a hash"))
    if s.get("not_sent"):
        rows.append(("requests not sent (run stopped)", s.get("not_sent")))
    if s.get("errors"):
        rows.append(("errors", ", ".join(f"{k} x{v}" for k, v in s["errors"].items())))
    if s.get("warnings"):
        rows.append(("warnings", ", ".join(f"{k} x{v}" for k, v in s["warnings"].items())))
    for note in s.get("notes") or ():
        rows.append(("note", note))
    print_kv(rows, title="Benchmark")
    if out_dir:
        click.echo(f"\nrecords written to {out_dir}/ (requests, tokens, workload .parquet; summary.json)")
