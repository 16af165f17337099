"""``llmqueue profile``: measure a server's step-time surface (decode ladders, prefill probes)."""

from __future__ import annotations

import click

from llmqueue.bench.options import option
from llmqueue.cli.common import (InputPath, OutputPath, command, json_option, print_json, print_kv, print_table,
                                 server_setting_options, server_settings)
from llmqueue.cli.flags import knob_options


def _ints(text: str | None, option: str):
    """``"1,2,4"`` -> ``[1, 2, 4]`` (positive integers), None for None; else one-line InputError."""
    from llmqueue.errors import InputError

    if text is None:
        return None
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise InputError(option, f"expected comma-separated whole numbers (got {text!r})", "e.g. 64,512") from None
    if not out or min(out) < 1:
        raise InputError(option, f"expected positive whole numbers (got {text!r})", "e.g. 64,512")
    return out


def _profile_outputs(p) -> list:
    return [p / "profile.json", p / "server.json"]


@command("profile")
@click.option("--url", required=True, help="The server, e.g. http://127.0.0.1:8000.")
@click.option("--model", help="Model name to request [default: the first one the server lists at /v1/models].")
@click.option("--out", "out_dir", required=True, type=OutputPath("dir", also=_profile_outputs),
              help="Directory for profile.json, server.json and runs/ (the raw per-request records).")
@click.option("--contexts", metavar="P,P,...", help="Prompt lengths of the decode ladders [default: 64, 512, 2048 "
              "where prompt + output fit max_model_len].")
@click.option("--batches", metavar="N,N,...", help="Concurrency ladder [default: 1, 2, 4, ... up to max_num_seqs "
              "or the KV cache's limit, and the limit itself].")
@click.option("--output-tokens", type=int, default=128, show_default=True,
              help="Output tokens of each ladder request (long: the gaps are read while every request decodes).")
@click.option("--prefill-lengths", metavar="P,P,...", help="Prompt lengths of the isolated prefill probes "
              "[default: 16, 128, 512, 2048 up to one prefill step].")
@click.option("--prefill-repeats", type=int, default=5, show_default=True, help="Probes per prompt length.")
@click.option("--passes", type=int, default=2, show_default=True,
              help="Times over the ladder; each level's samples are pooled (an engine's speed wanders over seconds).")
@click.option("--budget", type=float, default=180.0, show_default=True,
              help="Seconds the whole profile may take; levels that would not fit are skipped (noted), and a "
                   "server that does not answer within it stops the profile.")
@click.option("--server-log", type=InputPath("file", reads=()), help="The server's log file, written while the "
              "profile runs (vLLM with --enable-logging-iteration-details and VLLM_LOGGING_PREFIX='%(created).6f '): "
              "its step times are preferred to the client's inter-token gaps; its startup lines give the settings.")
@server_setting_options
@knob_options(knobs=[option("vocab_size"), option("api_key")])  # the benchmark's own declarations
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the prompts' token ids.")
@click.option("--progress/--no-progress", default=None, help="Progress bar over the levels (default: on a terminal).")
@json_option
def profile(url, model, out_dir, contexts, batches, output_tokens, prefill_lengths, prefill_repeats, passes, budget,
            server_log, vocab_size, api_key, seed, progress, as_json, **server):
    """Measure a server's step-time surface through the OpenAI API, within a time budget.

    Decode ladders (closed loops of 1, 2, 4, ... requests with long outputs, at two or three
    prompt lengths) give the decode step at each batch size from the inter-token gaps (or the
    server's iteration log); isolated requests at several prompt lengths give the prefill line.
    The result, DIR/profile.json, is a step-time model: --step-time profile:DIR in simulate,
    sweep, capacity, validate, and `calibrate --profile DIR` to set its level from a saturation run.

    Example:

      llmqueue profile --url http://127.0.0.1:8000 --out runs/profile --server-log vllm.log
    """
    from llmqueue._progress import bar, wanted
    from llmqueue._validate import positive
    from llmqueue.bench.http import check_url
    from llmqueue.bench.options import BenchOptions
    from llmqueue.bench.profile import run_profile
    from llmqueue.bench.served_model import server_model

    check_url(url)
    flags = server_settings(server)
    BenchOptions(vocab_size=vocab_size, api_key=api_key)  # checked as the runs will check them
    ctx_list = _ints(contexts, "contexts")
    batch_list = _ints(batches, "batches")
    pre_list = _ints(prefill_lengths, "prefill_lengths")
    budget = positive("budget", budget)
    if model is None:  # within the budget: a server that does not answer stops here, in one line
        model = server_model(url, api_key, timeout_s=min(10.0, max(budget / 2, 1.0)))
    state = {"bar": None}

    def on_level(text, total):
        b = state["bar"]
        if b is None:
            b = state["bar"] = bar(total, desc="profile", unit="level", enabled=wanted(progress))
        else:
            b.update(1)
        b.set_postfix_str(text)

    try:
        doc = run_profile(url, model, out_dir, contexts=ctx_list, batches=batch_list, output_tokens=output_tokens,
                          prefill_lengths=pre_list, prefill_repeats=prefill_repeats, budget_s=budget,
                          server_log=server_log, server_flags=flags, api_key=api_key, vocab_size=vocab_size,
                          seed=seed, passes=passes, on_level=on_level)
    finally:
        if state["bar"] is not None:
            state["bar"].close()
    if as_json:
        print_json({**doc, "written": str(out_dir)})
        return
    rows = [[c["prompt_tokens"], c["batch"], round(c["context_tokens"]), 1e3 * c["median_s"],
             f"{1e3 * c['p25_s']:.2f}-{1e3 * c['p75_s']:.2f}", c["count"], c["source"]] for c in doc["decode"]]
    print_table(["prompt", "batch", "context/seq", "step ms (median)", "IQR ms", "samples", "from"], rows,
                title=f"Decode steps ({doc['model']} at {doc['url']})")
    pre = doc["prefill"]
    kv = [("prefill", f"{1e3 * pre['intercept_s']:.2f} ms + {1e6 * pre['per_token_s']:.2f} us/token "
                      f"(R2 {pre['r2']:.3f}, from {pre['source']})")]
    if pre.get("frontend_latency_s") is not None:
        kv.append(("frontend delay (ms)", 1e3 * pre["frontend_latency_s"]))
    kv += [("elapsed (s)", doc["elapsed_s"])]
    kv += [("skipped", s) for s in doc["skipped"]] + [("note", n) for n in doc["notes"]]
    print_kv(kv, title="Prefill and run")
    click.echo(f"\nwritten to {out_dir}/ (use --step-time profile:{out_dir})")
