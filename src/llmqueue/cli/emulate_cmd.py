"""``llmqueue emulate``: an OpenAI-compatible server whose answers come from the simulator's replica
on the wall clock (:mod:`llmqueue.serve.emulator`)."""

from __future__ import annotations

import click

from llmqueue.cli.common import command
from llmqueue.cli.flags import given_flags, knob_options

#: the knobs of one replica that ``emulate`` takes, as ``simulate`` takes them
ENGINE_KNOBS = ("model", "gpu", "tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs",
                "max_num_batched_tokens", "chunk", "block_size", "gpu_memory_utilization", "enable_chunked_prefill",
                "long_prefill_token_threshold", "max_model_len", "enable_prefix_caching", "policy", "preemption",
                "kv_cache_dtype", "dtype", "max_waiting", "max_queue_time", "step_time", "capacity_tokens", "seed")
READY = "llmqueue emulate: replica {i} of {n} serving {model} at {url}"


@command("emulate")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port of replica 0; replica i listens on PORT + i (0: free ports, printed).")
@click.option("--replicas", type=click.IntRange(1, 256), default=None,
              help="Independent replicas on consecutive ports, one process.  [default: 1, or the scenario's]")
@click.option("--served-model-name", "names", multiple=True, metavar="NAME",
              help="Model name(s) answered (vLLM's flag; repeatable).  [default: --model, else llmqueue-emulated]")
@click.option("--scenario", help="A scenario file or shipped example: its (pool's) engine settings; the flags given "
              "override them.")
@click.option("--pool", help="With --scenario: the pool of deployment.pools to emulate [default: the first].")
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE", help="With --scenario: assign one of its fields.")
@knob_options(names=ENGINE_KNOBS)
@click.option("--enable-logging-iteration-details", "iteration_details", is_flag=True,
              help="Log one vLLM-format line per engine step (what --server-log reads).")
@click.option("--log-file", metavar="PATH", help="Write the log here instead of stderr; with several replicas PATH "
              "must hold {port} or {replica}.")
@click.option("--fail-after", type=click.IntRange(0), metavar="N",
              help="Fault: the replica dies when request N+1 arrives (connections reset, later ones refused).")
@click.option("--slow-factor", "slow", multiple=True, metavar="F[@START:END]",
              help="Fault: steps starting in [START, END) seconds after the start take F times as long (repeatable).")
@click.option("--reject-fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fault: refuse this fraction of requests (drawn from --seed, in arrival order).")
@click.option("--reject-status", type=click.Choice(["429", "503"]), default="503", show_default=True,
              help="Status of the refused requests (vLLM-style error JSON).")
@click.option("--restart-after", type=float, metavar="SECONDS",
              help="Fault: at this time the replica drops everything in flight and restarts empty.")
@click.option("--restart-delay", type=float, default=1.0, show_default=True, metavar="SECONDS",
              help="How long a restarting replica refuses connections.")
@click.pass_context
def emulate(ctx, host, port, replicas, names, scenario, pool, sets, iteration_details, log_file, fail_after, slow,
            reject_fraction, reject_status, restart_after, restart_delay, **knobs):
    """Serve the simulator's replica behind vLLM's OpenAI API, on the wall clock.

    A request is submitted to the replica when it arrives; the replica advances as real time
    passes and each token is streamed when the step that produced it ends, so the schedule is
    the simulator's for the same arrivals. /v1/completions, /v1/chat/completions, /v1/models,
    /health and /metrics answer as vLLM does (its metric names); GET /emulator/stats gives the
    token emission lateness. Engine flags and step models are simulate's.

    Examples:

      llmqueue emulate --port 8000 --replicas 2 --step-time linear:c0=0.02:decode=0.0002 --capacity-tokens 65536

      llmqueue emulate --scenario chat --step-time profile:runs/profile --enable-logging-iteration-details
    """
    from llmqueue.errors import InputError
    from llmqueue.serve.faults import Faults, parse_slow
    from llmqueue.serve.launch import EngineSpec, serve_forever

    given = given_flags(ctx, knobs)
    if scenario is None:
        if pool is not None or sets:
            raise InputError("pool" if pool is not None else "set", "applies to a --scenario only",
                             "give --scenario too, or drop it")
        from llmqueue.knobs import check, flag_defaults
        from llmqueue.spec import engine_from_knobs

        f = {k: check(k, v) for k, v in flag_defaults(**{k: knobs[k] for k in knobs}).items()}
        engine, step_time, _, model = engine_from_knobs(f)
        seed, n, model_name = f["seed"], replicas or 1, (model.name if model is not None else None)
    else:
        from llmqueue.spec import scenario_engine

        e = scenario_engine(scenario, pool=pool, sets=sets, **{k: knobs[k] for k in given})
        engine, step_time = e["engine"], e["step_time"]
        seed = knobs["seed"] if "seed" in given else e["seed"]
        n, model_name = replicas or e["replicas"], e["model"]
    served = tuple(names) or (model_name or "llmqueue-emulated",)
    faults = dict(fail_after=fail_after, slow=[parse_slow(s) for s in slow], reject_fraction=reject_fraction,
                  reject_status=int(reject_status), restart_after=restart_after, restart_delay=restart_delay)
    if log_file is not None and n > 1 and "{port}" not in log_file and "{replica}" not in log_file:
        raise InputError("log_file", f"{n} replicas would share {log_file!r}",
                         "put {port} or {replica} in the path, e.g. emulate-{port}.log")
    specs = [EngineSpec(engine=engine, step_time=step_time, names=served, seed=seed + i,
                        faults=Faults(seed=seed + i, **faults), port=port + i if port else 0,
                        log_file=log_file.format(port=port + i, replica=i) if log_file else None,
                        gpu_memory_utilization=knobs.get("gpu_memory_utilization") or 0.9)
             for i in range(n)]
    serve_forever(specs, host=host, iteration_details=iteration_details,
                  on_ready=lambda i, url: click.echo(READY.format(i=i, n=n, model=served[0], url=url)))
