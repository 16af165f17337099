"""``llmqueue bench``: open-loop benchmark of an OpenAI-compatible server (records, summary, checks).

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

from llmqueue.cli.common import (
    Command,
    InputPath,
    OutputPath,
    command,
    json_option,
    server_setting_options,
    print_json,
    print_kv,
    run_outputs,
)
from llmqueue.cli.flags import given_flags, knob_options

_WORKLOAD = ("trace", "arrival", "prompt", "output", "lengths", "num_requests", "duration", "seed")


def build_requests(*, trace, arrival, prompt, output, lengths, num_requests, duration, seed):
    """The request stream from the workload flags (the same flags and rules as ``simulate``):
    ``(requests, hash_ids)``, ``hash_ids`` the trace's prefix-block hashes or None."""
    from llmqueue.spec import workload_from_flags

    wl, requests, hash_ids = workload_from_flags(trace=trace, arrival=arrival, prompt=prompt, output=output,
                                                 lengths=lengths, num_requests=num_requests, duration=duration)
    if requests is None:
        return wl.generate(seed, n=num_requests, duration=duration), None
    return requests, hash_ids


def check_url(url: str, field: str = "url") -> str:
    """``url`` when it is an http(s) URL with a host (and a valid port, if any); else one-line InputError."""
    from urllib.parse import urlsplit

    from llmqueue.errors import InputError

    fix = "e.g. http://127.0.0.1:8000 or http://[::1]:8000"
    try:
        p = urlsplit(str(url).strip())
        host, _ = p.hostname, p.port  # both raise ValueError on a malformed host or port
    except ValueError as e:
        raise InputError(field, f"{url!r} is not a valid URL ({e})", fix) from None
    if p.scheme not in ("http", "https") or not host:
        raise InputError(field, f"{url!r} is not an http(s) URL with a host", fix)
    return url


def server_model(url: str, api_key: str | None = None, *, headers=None, proxy: str | None = None,
                 trust_env: bool = False, allow_key_over_http_proxy: bool = False) -> str:
    """The first model the server lists at ``/v1/models``, asked with the run's key and headers,
    directly or through the proxy the run uses (:mod:`llmqueue.bench.credentials`). A redirect is
    followed only within ``url``'s origin (scheme, host, port): one to another origin is refused,
    so the key never goes there. httpx, with ``trust_env=False``: proxy variables are read only
    when ``trust_env`` asks for them."""
    import ssl
    from urllib.parse import urljoin, urlsplit

    import httpx

    from llmqueue.bench.client import BenchConnectError
    from llmqueue.bench.credentials import check_key_over_proxy, origin, origin_text, proxy_for, request_headers
    from llmqueue.errors import InputError, LlmqueueError

    check_url(url)
    p = urlsplit(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise InputError("url", f"{url!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000")
    base = f"{p.scheme}://{p.netloc.rsplit('@', 1)[-1]}"
    hdrs = request_headers(api_key, headers)
    px = proxy_for(base, proxy=proxy, trust_env=trust_env)
    check_key_over_proxy(base, px, any(k.lower() == "authorization" for k in hdrs), allow_key_over_http_proxy)
    home = origin(base)
    target = base + "/v1/models"
    try:
        # the trust store the run's own connections use (the system's, or SSL_CERT_FILE)
        verify = ssl.create_default_context()
        with httpx.Client(proxy=px, trust_env=False, follow_redirects=False, timeout=10, verify=verify) as client:
            for _ in range(6):
                r = client.get(target, headers=hdrs)
                if not r.is_redirect:
                    break
                nxt = urljoin(target, r.headers["location"])
                if origin(nxt) != home:
                    raise InputError("url", f"{base}/v1/models redirects to another origin "
                                     f"({origin_text(origin(nxt))}): the API key and headers go only to "
                                     f"{origin_text(home)}", "give --model, or the server's own address as --url")
                target = nxt
            else:
                raise InputError("model", f"not given, and {base}/v1/models redirects too many times", "give --model")
            if r.status_code != 200:
                raise InputError("model", f"not given, and {base}/v1/models answered HTTP {r.status_code}",
                                 "give --model")
            data = r.json()
        return str(data["data"][0]["id"])
    except LlmqueueError:
        raise
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError) as e:
        msg = str(e) or type(e).__name__
        problem = "connection refused" if "refused" in msg.lower() else msg
        if px is not None:
            problem += ", through the proxy"
        raise BenchConnectError(base, problem) from None
    except httpx.HTTPError as e:
        raise InputError("model", f"not given, and {base}/v1/models could not be read ({type(e).__name__})",
                         "give --model") from None
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise InputError("model", f"not given, and {base}/v1/models did not list a model ({e})",
                         "give --model") from None


class _BenchCommand(Command):
    """Also reads vLLM's multi-value spelling ``--goodput ttft:500 tpot:50``."""

    def parse_args(self, ctx, args):
        from llmqueue.bench.vllm_flags import expand_multi

        return super().parse_args(ctx, expand_multi(list(args)))


@command("bench", cls=_BenchCommand)
@click.option("--url", required=True, help="The server, e.g. http://127.0.0.1:8000 (or a full .../v1/completions URL).")
@click.option("--model", help="Model name to request [default: the first one the server lists at /v1/models].")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
              help="completions: token-id prompts, exact lengths; chat: text prompts, the server's token counts.")
@click.option("--scenario", help="Take the workload (classes, timeouts, retries, SLOs) from a scenario file or example.")
@knob_options(names=_WORKLOAD)
@click.option("--concurrency", type=int, help="Cap on requests in flight (makes the run closed-loop).")
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
@click.option("--extra-body", metavar="JSON", help="A JSON object merged into every request body (its keys win), "
              "e.g. '{\"temperature\": 0}'.")
@click.option("--percentile-metrics", metavar="ttft,tpot,itl,e2el",
              help="Metrics the --save-result file reports [default: ttft,tpot,itl, as vLLM].")
@click.option("--metric-percentiles", metavar="P,P,...", help="Percentiles of the summary and the result file, "
              "e.g. 25,50,99 [default: 50,90,95,99,99.9].")
@click.option("--save-result", is_flag=True, help="Also write vLLM bench serve's result JSON (its keys and "
              "definitions), into the run directory unless --result-dir.")
@click.option("--result-dir", type=OutputPath("dir"), help="With --save-result: the directory of the result file.")
@click.option("--result-filename", help="With --save-result: its file name [default: vLLM's "
              "{backend}-{rate}qps[-concurrency{N}]-{model}-{date}.json].")
@click.option("--timeout", type=float, help="Client deadline per attempt, from its intended send time (s) [default: 600, "
              "or the scenario's].")
@click.option("--ttft-timeout", type=float, help="Deadline for the first token (s) [default: none, or the scenario's].")
@click.option("--max-attempts", type=int, help="Retry failed attempts (rejected/timeout/error) up to this many tries, "
              "OpenAI SDK backoff [default: 1, or the scenario's].")
@click.option("--vocab-size", type=int, help="Tokenizer vocabulary size: prompt ids come from its middle 90% "
              "[default: ids 100-499].")
@click.option("--exact-output/--no-exact-output", default=None,
              help="Send vLLM's ignore_eos and min_tokens so every request yields exactly its output length "
              "[default: on; off with a sharegpt/custom dataset, as vLLM sends ignore_eos only for random].")
@click.option("--drain-timeout", type=float, metavar="S", help="After the last send, wait at most S seconds for the "
              "answers; the client then cancels what is still in flight (status cancelled) [default: wait for "
              "every answer, up to --timeout].")
@click.option("--warmup", type=float, help="Seconds left out of the statistics [default: 0, or the scenario's].")
@click.option("--warmup-requests", type=int, default=0, show_default=True,
              help="Requests sent one by one before the run, not recorded.")
@click.option("--metrics-url", help="Sample the server's Prometheus /metrics into timeseries.parquet "
              "(needs llmqueue.bench.prom).")
@click.option("--server-log", type=click.Path(), help="The server's log file, written while the run goes (vLLM with "
              "--enable-logging-iteration-details and VLLM_LOGGING_PREFIX='%(created).6f '): its per-step lines "
              "become steps.parquet, for calibrate's step cycle and linear step-time model.")
@server_setting_options
@click.option("--server-enable-chunked-prefill/--server-no-enable-chunked-prefill", default=None,
              help="Whether the server chunks prefills [default: from --server-log].")
@click.option("--prefix-hashes/--no-prefix-hashes", default=True, show_default=True,
              help="With a trace that has prefix-block hashes (Mooncake): requests sharing a hash share that "
              "prompt block, so the server's prefix cache sees the trace's reuse.")
@knob_options(names=("prefix_block_tokens",))
@click.option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True, help="Bearer token, if the server wants one "
              "(sent only to --url's origin).")
@click.option("--header", "header", multiple=True, metavar="'NAME: VALUE'",
              help="A header for every request (repeatable); sent only to --url's origin.")
@click.option("--proxy", help="Send the requests through this http:// proxy (an https server through a CONNECT "
              "tunnel) [default: none; proxy variables are ignored].")
@click.option("--trust-env", is_flag=True, help="Use the proxy that http_proxy / https_proxy / all_proxy name "
              "(no_proxy exempts hosts) [default: ignore them].")
@click.option("--allow-key-over-http-proxy", is_flag=True, help="Let the API key cross a proxy to a plain http:// "
              "server, where the proxy reads it [default: refused].")
@click.option("--out", "out_dir", type=OutputPath("dir", also=run_outputs),
              help="Run directory, created with any missing parents [default: runs/bench-YYYYmmdd-HHMMSS].")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@json_option
@click.pass_context
def bench(ctx, url, model, endpoint, scenario, concurrency, request_rate, burstiness, max_concurrency, num_prompts,
          dataset_name, dataset_path, tokenizer, goodput, extra_body, percentile_metrics, metric_percentiles,
          save_result, result_dir, result_filename, timeout, ttft_timeout, max_attempts, vocab_size,
          exact_output, drain_timeout, warmup, warmup_requests, metrics_url, server_log, server_max_num_seqs,
          server_max_num_batched_tokens, server_block_size, server_max_model_len, server_num_gpu_blocks,
          server_enable_chunked_prefill, prefix_hashes, prefix_block_tokens, api_key,
          header, proxy, trust_env, allow_key_over_http_proxy, out_dir, progress, as_json, **flags):
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

    from llmqueue.bench.client import DEFAULT_TIMEOUT_S, run_bench
    from llmqueue.errors import InputError

    import math

    from llmqueue.bench import vllm_flags as vf

    check_url(url)
    if metrics_url is not None:
        check_url(metrics_url, "metrics_url")
    # vLLM bench serve's flags: each alias stands for a native knob (both given: an error)
    for name, v in (("max_concurrency", max_concurrency), ("num_prompts", num_prompts)):
        if v is not None and v < 1:
            raise InputError(name, f"must be a positive integer (got {v})")
    concurrency = vf.one_of("concurrency", "max_concurrency", concurrency, max_concurrency)
    flags["num_requests"] = vf.one_of("num_requests", "num_prompts", flags["num_requests"], num_prompts)
    rate = vf.parse_request_rate(request_rate) if request_rate is not None else None
    if rate is not None:
        for native in ("arrival", "trace"):
            if flags[native] is not None:
                raise InputError("request_rate", f"--request-rate and --{native} both give the arrivals",
                                 f"drop --{native} or --request-rate")
    if burstiness is not None:
        vf.check_burstiness(burstiness)
        if rate is None:
            raise InputError("burstiness", "shapes --request-rate's gaps, which is not given",
                             "give --request-rate R (or use --arrival gamma:R:cv=CV)")
    burst = 1.0 if burstiness is None else float(burstiness)
    send_all = rate == math.inf
    if send_all:
        if flags["duration"] is not None or flags["num_requests"] is None:
            raise InputError("request_rate", "inf sends every request at once: the run needs a number of requests",
                             "give --num-prompts N (not --duration)")
        flags["arrival"] = "poisson:1"  # only to draw the stream; every send time becomes 0 below
    elif rate is not None:
        flags["arrival"] = vf.arrival_spec(rate, burst)
    file_dataset = dataset_name in ("sharegpt", "custom")
    if dataset_path is not None and not file_dataset:
        raise InputError("dataset_path", "is read by --dataset-name sharegpt or custom" +
                         (" (random builds its prompts)" if dataset_name == "random" else ""),
                         "give --dataset-name sharegpt or custom, or drop --dataset-path")
    if file_dataset:
        if dataset_path is None:
            raise InputError("dataset_path", f"--dataset-name {dataset_name} needs the file",
                             "give --dataset-path FILE")
        for native in ("scenario", "trace", "prompt", "lengths"):
            if (scenario if native == "scenario" else flags[native]) is not None:
                raise InputError("dataset_name", f"a {dataset_name} dataset brings its own prompts: --{native} "
                                 "cannot be used with it", f"drop --{native} or --dataset-name")
    if exact_output is None:
        exact_output = not file_dataset
    body = vf.parse_extra_body(extra_body) if extra_body is not None else None
    goodput_slos = vf.parse_goodput(goodput) if goodput else None
    pmetrics = vf.parse_percentile_metrics(percentile_metrics) if percentile_metrics is not None else None
    pcts = vf.parse_metric_percentiles(metric_percentiles) if metric_percentiles is not None else None
    if not save_result:
        for name, v in (("result_dir", result_dir), ("result_filename", result_filename)):
            if v is not None:
                raise InputError(name, "names the --save-result file, which is not asked for", "add --save-result")
    if result_filename is not None and (not result_filename.strip() or "/" in result_filename):
        raise InputError("result_filename", f"{result_filename!r} is not a file name",
                         "give a name like result.json (the directory is --result-dir)")
    for name, v in (("concurrency", concurrency), ("max_attempts", max_attempts)):
        if v is not None and v < 1:
            raise InputError(name, f"must be a positive integer (got {v})")
    for name, v in (("timeout", timeout), ("ttft_timeout", ttft_timeout)):
        if v is not None and not v > 0:
            raise InputError(name, f"must be > 0 seconds (got {v:g})")
    if drain_timeout is not None and not (drain_timeout >= 0 and math.isfinite(drain_timeout)):
        raise InputError("drain_timeout", f"must be a finite number of seconds >= 0 (got {drain_timeout:g})")
    if warmup is not None and not warmup >= 0:
        raise InputError("warmup", f"must be >= 0 seconds (got {warmup:g})")
    if prefix_block_tokens < 1:
        raise InputError("prefix_block_tokens", f"must be a positive number of tokens (got {prefix_block_tokens})")
    if warmup_requests < 0:
        raise InputError("warmup_requests", f"must be >= 0 (got {warmup_requests})")
    server_flags = {"max_num_seqs": server_max_num_seqs, "max_num_batched_tokens": server_max_num_batched_tokens,
                    "block_size": server_block_size, "max_model_len": server_max_model_len,
                    "num_gpu_blocks": server_num_gpu_blocks, "enable_chunked_prefill": server_enable_chunked_prefill}
    for name, v in server_flags.items():
        if v is not None and not isinstance(v, bool) and v < 1:
            raise InputError(f"server_{name}", f"must be a positive integer (got {v})")
    if vocab_size is not None and vocab_size < 40:
        raise InputError("vocab_size", f"must be at least 40 (got {vocab_size})")
    from llmqueue.bench.credentials import check_key_over_proxy, proxy_for, request_headers

    # what is sent and through what, checked before anything is sent (the /v1/models lookup included)
    headers = request_headers(api_key, header)
    proxy = proxy_for(url, proxy=proxy, trust_env=trust_env)
    check_key_over_proxy(url, proxy, any(k.lower() == "authorization" for k in headers), allow_key_over_http_proxy)
    net = dict(headers=header, proxy=proxy, allow_key_over_http_proxy=allow_key_over_http_proxy)
    retry = None
    slos = None
    dataset = None
    hash_ids = None  # a trace's prefix-block hashes (a scenario carries none)
    timeouts = timeout if timeout is not None else DEFAULT_TIMEOUT_S
    ttft_timeouts = ttft_timeout
    seed = flags["seed"]
    if scenario is not None:
        from llmqueue.scenario.override import scenario_with
        from llmqueue.simulate import _slo_targets

        # the workload flags given override the scenario's (the run length is set below: a
        # benchmark keeps the scenario's warm-up whatever its length)
        sc = scenario_with(scenario, **{k: flags[k] for k in ("trace", "arrival", "prompt", "output", "lengths")
                                        if flags[k] is not None}).scenario
        run = sc.run
        if flags["duration"] is not None or flags["num_requests"] is not None:
            if flags["duration"] is not None and flags["num_requests"] is not None:
                raise InputError("num_requests", "give --num-requests or --duration, not both")
            run = run.model_copy(update={"duration_s": flags["duration"], "num_requests": flags["num_requests"]})
            sc = sc.model_copy(update={"run": run})
        seed = seed if given_flags(ctx, ["seed"]) else run.seed
        requests = sc.requests(seed)
        mix = sc.mix
        retry = mix
        slos = _slo_targets(mix.slos)
        if timeout is None:
            timeouts = {c.name: (c.client.timeout_s if c.client.timeout_s is not None else DEFAULT_TIMEOUT_S)
                        for c in mix.classes}
        if ttft_timeout is None:
            ttft_timeouts = {c.name: c.client.ttft_timeout_s for c in mix.classes}
        if max_attempts is not None:
            retry = _retry_behavior(max_attempts)
        if warmup is None:
            warmup = run.warmup_s
    elif file_dataset:
        if flags["arrival"] is None:
            raise InputError("request_rate", "missing arrival process", "give --request-rate R (or inf) or --arrival SPEC")
        gen, _ = build_requests(**{**flags, "prompt": "fixed:1", "output": flags["output"] or "fixed:1"})
        from llmqueue.bench.datasets import load_dataset

        dataset = load_dataset(dataset_name, dataset_path, len(gen), seed=seed, tokenizer=tokenizer,
                               output_len=gen.output_tokens if flags["output"] is not None else None)
        requests = _with(gen, prompt_tokens=dataset.prompt_tokens, output_tokens=dataset.output_tokens)
        if max_attempts is not None and max_attempts > 1:
            retry = _retry_behavior(max_attempts)
    else:
        requests, hash_ids = build_requests(**flags)
        if not prefix_hashes:
            hash_ids = None
        if max_attempts is not None and max_attempts > 1:
            retry = _retry_behavior(max_attempts)
    if len(requests) == 0:
        raise InputError("duration", "the workload has no request in that window", "give a longer --duration")
    if send_all:  # vLLM's --request-rate inf: every request at time 0
        requests = _with(requests, arrival_s=np.zeros(len(requests)))
    elif rate is not None and flags["duration"] is None and len(requests) and requests.arrival_s[-1] > 0:
        # as vLLM does: the gaps scaled so that the last request is sent at N / rate
        requests = _with(requests, arrival_s=np.asarray(requests.arrival_s) * (len(requests) / rate
                                                                             / float(requests.arrival_s[-1])))
    if goodput_slos is not None:
        slos = goodput_slos
    if model is None:
        model = server_model(url, api_key, **net)
    if out_dir is None:
        out_dir = str(Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S"))
    if server_log is not None:
        from llmqueue.bench.steplog import log_offset

        log_start = log_offset(server_log)
    if progress is None:
        progress = sys.stderr.isatty()
    res = run_bench(url, model, requests, endpoint=endpoint, out_dir=out_dir, concurrency=concurrency,
                    timeout_s=timeouts, ttft_timeout_s=ttft_timeouts, seed=seed, vocab_size=vocab_size, retry=retry,
                    warmup_s=warmup or 0.0, warmup_requests=warmup_requests, progress=progress,
                    metrics_url=metrics_url, exact_output=exact_output, api_key=api_key, slos=slos,
                    hash_ids=hash_ids, hash_block_tokens=prefix_block_tokens, extra_body=body, percentiles=pcts,
                    prompt_texts=dataset.texts if dataset is not None else None, drain_timeout_s=drain_timeout,
                    **net)
    b = res.summary.setdefault("bench", {})
    b["vllm"] = {"request_rate": "inf" if send_all else rate, "burstiness": burst if rate is not None else None,
                 "max_concurrency": concurrency, "goodput": goodput_slos, "extra_body": body}
    if dataset is not None:
        b["dataset"] = dataset.describe()
    result_path = None
    if save_result:
        result_path = _save_vllm_result(res, out_dir=out_dir, result_dir=result_dir, filename=result_filename,
                                        model=model, endpoint=endpoint, num_prompts=len(requests),
                                        rate=rate, arrival=flags.get("arrival"), burstiness=burst,
                                        max_concurrency=concurrency, tokenizer=tokenizer, metrics=pmetrics)
    _record_server(res, out_dir, server_flags, server_log)
    _dump_summary(res, out_dir)
    if server_log is not None and res.summary.get("bench", {}).get("t0_epoch_s") is not None:
        import json

        from llmqueue.bench.steplog import write_run_steps

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
            from llmqueue.records import dump_summary

            dump_summary(Path(out_dir) / "summary.json", res.summary)
        except OSError as e:  # a full disk after the run: the records are written, say so in one line
            click.echo(f"llmqueue: note: the server log's steps not saved in {out_dir} ({e.strerror or e})", err=True)
    if as_json:
        print_json(res.summary)
    else:
        print_report(res.summary, out_dir)
        if result_path is not None:
            click.echo(f"vLLM bench serve result written to {result_path}")
    if res.error is not None:
        click.echo(f"llmqueue: error: {res.error}; {res.written} attempt record(s) written to {out_dir}/", err=True)
        raise click.exceptions.Exit(130 if res.interrupted else 1)


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
            f"server.json lacks {', '.join(missing)}: calibrate and validate will ask for "
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
    ks = c.get("ks_gaps") or {}
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
        ("gaps KS test (D, p)", f"{ks['statistic']:.3f}, {ks['pvalue']:.3g}" if ks else "-"),
        ("client check", c.get("verdict")),
    ]
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
