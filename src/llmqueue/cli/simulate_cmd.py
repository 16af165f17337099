"""``llmqueue simulate``: one replica, step by step; summary, verdict and theory side by side."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, json_option, print_json, print_kv


def build_spec(*, capacity_tokens, model, gpu, tensor_parallel_size, gpu_memory_utilization, block_size,
               step_time, chunk, max_num_batched_tokens, max_num_seqs, enable_chunked_prefill,
               long_prefill_token_threshold, max_model_len, policy, preemption, max_waiting, max_queue_time,
               arrival, prompt, output, lengths, num_requests, duration, seed, warmup, sample_dt, slo_ttft_ms,
               slo_tpot_ms, slo_e2el_ms, trace=None, enable_prefix_caching=False, prefix_block_tokens=512,
               srpt_predictor_cv=0.0):
    """Turn the command's flags into a :class:`llmqueue.simulate.SimSpec`."""
    from llmqueue.engine.options import SimOptions
    from llmqueue.engine.config import EngineConfig
    from llmqueue.engine.step_time import parse_step_time, roofline_model
    from llmqueue.errors import InputError
    from llmqueue.simulate import UNLIMITED_KV_TOKENS, SimSpec

    if chunk is not None and max_num_batched_tokens is not None:
        raise InputError("chunk", "give --chunk or --max-num-batched-tokens, not both (they are the same knob)")
    budget = chunk if chunk is not None else (max_num_batched_tokens if max_num_batched_tokens is not None else 8192)
    kv_unlimited = False
    if capacity_tokens is not None and model is not None:
        raise InputError("capacity_tokens", "give either --capacity-tokens or --model/--gpu, not both")
    if capacity_tokens is not None:
        M = capacity_tokens
    elif model is not None:
        from llmqueue.hardware import kv_capacity

        M = kv_capacity(model, gpu, tensor_parallel_size=tensor_parallel_size,
                        gpu_memory_utilization=gpu_memory_utilization, block_size=block_size).M
    else:
        M, kv_unlimited = UNLIMITED_KV_TOKENS, True
    engine = EngineConfig.from_capacity(
        M, block_size=block_size, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
        enable_chunked_prefill=enable_chunked_prefill, long_prefill_token_threshold=long_prefill_token_threshold,
        max_model_len=max_model_len, policy=policy, preemption=preemption, max_waiting=max_waiting,
        max_queue_time_s=max_queue_time, enable_prefix_caching=enable_prefix_caching)
    if step_time is None:
        if model is None:
            raise InputError("step_time", "no step-time model",
                             "give --step-time (e.g. 0.0372, exp:0.1, linear:c0=..:decode=..) or --model/--gpu for a roofline")
        st = roofline_model(model, gpu, tensor_parallel_size=tensor_parallel_size)
    else:
        st = parse_step_time(step_time, field="step_time")
    wl, requests, hash_ids = workload_from_flags(trace=trace, arrival=arrival, prompt=prompt, output=output,
                                                 lengths=lengths, num_requests=num_requests, duration=duration)
    from llmqueue._validate import nonnegative, positive

    nonnegative("warmup", warmup)
    positive("sample_dt", sample_dt)
    slos = {k: v for k, v in (("ttft_ms", slo_ttft_ms), ("tpot_ms", slo_tpot_ms), ("e2el_ms", slo_e2el_ms))
            if v is not None} or None
    opts = SimOptions(seed=seed, sample_dt=sample_dt, hash_ids=hash_ids, hash_block_tokens=prefix_block_tokens)
    return SimSpec(engine=engine, step_time=st, workload=wl, requests=requests,
                   num_requests=None if requests is not None else num_requests,
                   duration_s=duration, seed=seed, warmup_s=warmup, slos=slos, options=opts,
                   kv_unlimited=kv_unlimited, predictor_cv=nonnegative("srpt_predictor_cv", srpt_predictor_cv))


def workload_from_flags(*, trace, arrival, prompt, output, lengths, num_requests, duration):
    """The workload flags shared by ``simulate`` and ``bench``: ``(workload, requests, hash_ids)``,
    a Workload to generate from, or (with ``--trace``) the replayed requests and their prefix hashes."""
    from llmqueue._validate import positive, positive_int
    from llmqueue.errors import InputError
    from llmqueue.workload import Workload

    if num_requests is not None and duration is not None:
        raise InputError("num_requests", "give --num-requests or --duration, not both")
    if num_requests is not None:
        positive_int("num_requests", num_requests)
    if duration is not None:
        positive("duration", duration)
    if trace is not None:
        if arrival is not None or prompt is not None or output is not None or lengths is not None:
            raise InputError("trace", "a trace brings its own arrivals and lengths",
                             "drop --arrival/--prompt/--output/--lengths, or drop --trace")
        from llmqueue.workload.traces import load_trace, trace_to_requests, window

        tr = load_trace(trace)
        if duration is not None:
            tr = window(tr, 0.0, duration)
        if num_requests is not None and len(tr):
            tr = window(tr, 0.0, float(tr.arrival_s[min(num_requests, len(tr)) - 1]) + 1e-9)
        return None, trace_to_requests(tr), tr.hash_ids
    if arrival is None:
        raise InputError("arrival", "missing arrival process",
                         "give --arrival, e.g. poisson:3.5 or gamma:3.5:cv=2, or --trace FILE, or --scenario NAME")
    if lengths is not None:
        if prompt is not None or output is not None:
            raise InputError("lengths", "give either --lengths or --prompt/--output, not both")
        wl = Workload(arrival, joint=lengths)
    else:
        if prompt is None or output is None:
            raise InputError("prompt" if prompt is None else "output", "missing length distribution",
                             "give --prompt SPEC and --output SPEC (e.g. uniform:10:1600), or --lengths joint:FILE")
        wl = Workload(arrival, prompt=prompt, output=output)
    if num_requests is None and duration is None:
        raise InputError("num_requests", "the run has no end", "give --num-requests N or --duration SECONDS")
    return wl, None, None


prefix_block_tokens_option = click.option(
    "--prefix-block-tokens", type=int, default=512, show_default=True,
    help="Tokens per prefix hash id (Mooncake: 512; a multiple of the KV block size).")


def engine_options(f):
    """The engine and hardware flags shared with other commands (vLLM's names)."""
    opts = [
        click.option("--capacity-tokens", type=float, help="KV capacity M of the replica in tokens (default: unlimited)."),
        click.option("--model", help="Model (catalog name or config.json): M from the hardware module, roofline step time."),
        click.option("--gpu", default="a100-80gb", show_default=True, help="GPU used with --model."),
        click.option("--tensor-parallel-size", type=int, default=1, show_default=True),
        click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True),
        click.option("--block-size", type=int, default=16, show_default=True, help="KV block size (tokens)."),
        click.option("--step-time", help="Step-time model: 0.0372 | exp:0.1 | linear:c0=..:prefill=..:decode=..:ctx=.. | fitted:FILE."),
        click.option("--chunk", type=int, help="Prefill chunk = per-step token budget (alias of --max-num-batched-tokens)."),
        click.option("--max-num-batched-tokens", type=int, help="Per-step token budget [default: 8192]."),
        click.option("--max-num-seqs", type=int, default=256, show_default=True),
        click.option("--enable-chunked-prefill/--no-enable-chunked-prefill", default=True, show_default=True),
        click.option("--long-prefill-token-threshold", type=int, default=0, show_default=True),
        click.option("--max-model-len", type=int, default=0, help="Reject prompt+output above this (0: no limit)."),
        click.option("--policy", type=click.Choice(["fcfs", "priority", "sjf", "srpt"]), default="fcfs", show_default=True),
        click.option("--preemption", type=click.Choice(["newest", "lowest-priority"]), default="newest", show_default=True),
        click.option("--srpt-predictor-cv", type=float, default=0.0, show_default=True,
                     help="srpt policy: output-length predictor noise (lognormal CV; 0 = oracle)."),
        click.option("--max-waiting", type=int, default=0, help="Admission control: reject when this many wait (0: off)."),
        click.option("--max-queue-time", type=float, default=0.0, help="Shed requests waiting longer (s; 0: off)."),
        click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=False, show_default=True,
                     help="Reuse cached prompt prefixes (needs hash ids, e.g. a Mooncake --trace)."),
        prefix_block_tokens_option,
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def workload_options(f):
    opts = [
        click.option("--trace", help="Replay a trace file (Azure CSV, Mooncake JSONL, canonical Parquet, ...)."),
        click.option("--arrival", help="Arrival process: poisson:RATE | gamma:RATE:cv=CV | deterministic:RATE | onoff:..."),
        click.option("--prompt", help="Prompt length spec, e.g. uniform:10:1600."),
        click.option("--output", help="Output length spec, e.g. uniform:10:1600."),
        click.option("--lengths", help="Joint (prompt, output) pairs: joint:FILE[:prompt=COL:output=COL]."),
        click.option("--num-requests", type=int, help="Number of requests."),
        click.option("--duration", type=float, help="Simulated seconds (also the horizon)."),
        click.option("--seed", type=int, default=0, show_default=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@command("simulate")
@click.option("--scenario", help="A scenario file or a shipped example name (see `llmqueue scenario list`).")
@engine_options
@workload_options
@click.option("--warmup", type=float, default=0.0, show_default=True, help="Seconds left out of the statistics.")
@click.option("--sample-dt", type=float, default=1.0, show_default=True, help="Time-series sampling interval (s).")
@click.option("--slo-ttft-ms", type=float, help="SLO for goodput: TTFT (ms).")
@click.option("--slo-tpot-ms", type=float, help="SLO for goodput: TPOT (ms).")
@click.option("--slo-e2el-ms", type=float, help="SLO for goodput: end-to-end latency (ms).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Write requests/steps/timeseries Parquet and summary.json here.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@json_option
def simulate(scenario, out_dir, progress, as_json, **flags):
    """Simulate one serving replica step by step with vLLM v1's scheduling semantics.

    Prints vLLM bench serve's metrics (TTFT, TPOT, ITL, E2EL percentiles with confidence
    intervals), the stability verdict from the queue-length trend, the Little's-law check, and
    the closed-form capacity (KV memory, slots, token budget) beside the simulated throughput.

    Examples:

      llmqueue simulate --capacity-tokens 131000 --step-time 0.0372 --chunk 512
      --prompt uniform:10:1600 --output uniform:10:1600 --arrival poisson:50 --duration 3600 --seed 1

      llmqueue simulate --max-num-seqs 1 --prompt fixed:1 --output fixed:1 --step-time exp:0.1
      --arrival poisson:8 --num-requests 200000 --seed 1
    """
    import sys

    from llmqueue.simulate import run_simulation, write_outcome

    if scenario is not None:
        from llmqueue.scenario import load_scenario
        from llmqueue.simulate import spec_from_scenario

        spec = spec_from_scenario(load_scenario(scenario), seed=flags["seed"] if flags["seed"] else None,
                                  duration_s=flags["duration"], num_requests=flags["num_requests"])
    else:
        spec = build_spec(**flags)
    if progress is None:
        progress = sys.stderr.isatty()
    out = run_simulation(spec, progress=progress)
    if out_dir:
        write_outcome(out, out_dir)
    report = {**out.summary, "theory": out.theory}
    if as_json:
        print_json(report)
        return
    print_report(out.summary, out.theory, out_dir)


def print_report(s: dict, th: dict, out_dir=None) -> None:
    """The readable summary: simulation and theory side by side."""

    def ms(key):
        v = s.get(key)
        ci = s.get(key + "_ci")
        if v is None:
            return "-"
        txt = f"{v:,.1f}"
        if ci:
            txt += f"  [{ci[0]:,.1f}, {ci[1]:,.1f}]"
        return txt

    verdict = s.get("verdict", "?")
    rows = [
        ("completed / arrived (in window)", f"{s.get('completed')} / {s.get('arrivals')}"),
        ("status counts", ", ".join(f"{k} {v}" for k, v in (s.get("status_counts") or {}).items() if v)),
        ("simulated time (s)", s.get("duration_s")),
        ("request throughput (req/s)", s.get("request_throughput")),
        ("output throughput (tok/s)", s.get("output_throughput")),
        ("mean / p99 TTFT (ms) [CI]", f"{ms('mean_ttft_ms')} / {ms('p99_ttft_ms')}"),
        ("mean / p99 TPOT (ms)", f"{ms('mean_tpot_ms')} / {ms('p99_tpot_ms')}"),
        ("mean / p99 ITL (ms)", f"{ms('mean_itl_ms')} / {ms('p99_itl_ms')}"),
        ("mean / p99 E2EL (ms)", f"{ms('mean_e2el_ms')} / {ms('p99_e2el_ms')}"),
        ("mean queue time (ms)", ms("mean_queue_ms")),
        ("KV utilization", s.get("kv_utilization")),
        ("Little's law gap |L - lam W| / L", s.get("little_gap")),
        ("verdict (queue trend)", verdict),
    ]
    if s.get("request_goodput") is not None:
        rows.append(("request goodput (req/s)", s.get("request_goodput")))
    print_kv(rows, title="Simulation")
    if th:
        trows = [("b (s), " + th.get("b_source", ""), th.get("b"))] if th.get("b") else []
        for k, label in (("mu_kv", "mu, KV memory M/(b E[g]) (req/s)"), ("mu_seqs", "mu, max_num_seqs slots (req/s)"),
                         ("mu_tokens", "mu, token budget (req/s)")):
            if k in th:
                trows.append((label, th[k]))
        if "mu" in th:
            trows += [("capacity mu (binding: " + th["binding"] + ")", th["mu"])]
        if th.get("rho") is not None:
            trows += [("rho = lam / mu", th["rho"]), ("theory verdict", th.get("verdict"))]
        if "mg1" in th and "mean_e2el_ms" in th["mg1"]:
            trows.append(("M/G/1 mean E2EL (ms)", th["mg1"]["mean_e2el_ms"]))
        if "note" in th:
            trows.append(("note", th["note"]))
        print_kv(trows, title="\nTheory")
    if out_dir:
        click.echo(f"\nrecords written to {out_dir}/ (requests, steps, timeseries .parquet; summary.json)")
