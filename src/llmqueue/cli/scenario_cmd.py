"""``llmqueue scenario``: check a scenario file (workload + deployment + SLOs + run), list the examples."""

from __future__ import annotations

import click

from llmqueue.cli.common import command, fmt, json_option, print_json, print_kv, print_table

_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group("scenario", context_settings=_CTX)
def scenario():
    """Scenario files: one YAML file with a workload, a deployment, SLOs and run settings.

    FILE may be a path or the name of a shipped example (see `llmqueue scenario list`).
    """


@command("check")
@click.argument("file")
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
              help="Assign a field by path first, the value read as YAML (repeatable), e.g. "
                   "--set deployment.autoscalers[0].provisioning_delay_s=300 or --set deployment.autoscalers=[].")
@json_option
def check(file, sets, as_json):
    """Validate FILE (a path or a shipped example's name) and print it resolved.

    Prints the classes with their arrival rates, lengths, priorities, clients and SLOs, the
    deployment with its KV capacity M (from the hardware catalog, or capacity_tokens), the run
    settings, and notes. A problem prints one line naming the field, e.g.
    `deployment.max_num_seqs: must be >= 1 (got 0)`, and exits with code 2.

    A fleet (deployment.pools) prints its pools (role, replicas, router, model, GPU, M), lanes, P/D
    link, gateway, autoscalers and faults.

    Examples: llmqueue scenario check chat

      llmqueue scenario check noon-spike --set deployment.autoscalers[0].provisioning_delay_s=300
    """
    if sets:
        from llmqueue.scenario.override import scenario_with

        sc = scenario_with(file, sets=sets).scenario
    else:
        from llmqueue.scenario.load import load_scenario

        sc = load_scenario(file)
    s = sc.summary()
    if as_json:
        print_json(s)
        return
    _print(s)


@command("list")
@json_option
def list_(as_json):
    """List the shipped example scenarios."""
    from llmqueue.scenario.load import example_description, example_names, example_path

    rows = [{"name": n, "description": example_description(n), "path": str(example_path(n))}
            for n in example_names()]
    if as_json:
        print_json({"examples": rows})
        return
    print_table(["name", "description"], [[r["name"], r["description"]] for r in rows])
    click.echo("\nCheck one with: llmqueue scenario check NAME (or copy its file: see --json for the paths)")


scenario.add_command(check)
scenario.add_command(list_, "list")


def _client(c: dict) -> str:
    parts = []
    if c.get("timeout_s") is not None:
        parts.append(f"timeout {fmt(c['timeout_s'])} s")
    if c.get("ttft_timeout_s") is not None:
        parts.append(f"ttft timeout {fmt(c['ttft_timeout_s'])} s")
    r = c["retry"]
    if r["max_attempts"] > 1:
        parts.append(f"{r['max_attempts']} attempts on {'/'.join(r['retry_on'])}, backoff "
                     f"{fmt(r['backoff_s'])} s x{fmt(r['multiplier'])} <= {fmt(r['cap_s'])} s, "
                     f"jitter {fmt(r['jitter'])}")
    else:
        parts.append("no retries")
    return "; ".join(parts)


def _print(s: dict) -> None:
    title = f"scenario {s['name']}" if s.get("name") else "scenario"
    if s.get("source"):
        title += f" ({s['source']})"
    click.echo(title)
    if s.get("description"):
        click.echo(f"  {s['description']}")
    click.echo()

    w = s["workload"]
    pairs = []
    if "arrival" in w:
        a = w["arrival"]
        extra = ", ".join(f"{k} {fmt(a[k])}" for k in ("scv", "idc") if a.get(k) is not None)
        pairs.append(("total arrival", f"{a['spec']} (lam {fmt(a['rate'])} req/s{', ' + extra if extra else ''})"))
    if "trace" in w:
        t = w["trace"]
        txt = t["path"]
        if t.get("requests") is not None:
            txt += f" ({t['requests']:,} requests over {fmt(t['span_s'])} s, {fmt(t['mean_rate'])} req/s)"
        pairs.append(("trace", txt))
    pairs += [("arrival rate, all classes", f"{fmt(w['rate'])} req/s"),
              ("mean prompt / output", f"{fmt(w['mean_prompt'])} / {fmt(w['mean_output'])} tokens"),
              ("prompt / output tokens/s", f"{fmt(w['prompt_tokens_per_s'])} / {fmt(w['output_tokens_per_s'])}")]
    print_kv(pairs, title="workload")
    click.echo()

    rows, rows2 = [], []
    for c in s["classes"]:
        arrival = f"share {fmt(c['share'])}" if "share" in c else c["arrival"]
        if c.get("lengths"):
            prompt, output = c["lengths"], "(joint)"
        elif "prompt" in c:
            prompt, output = c["prompt"], c["output"]
        else:
            prompt = output = "(trace)"
        rows.append([c["name"], arrival, c["rate"], prompt, c["mean_prompt"], output, c["mean_output"], c["priority"]])
        rows2.append([c["name"], _client(c["client"]), ", ".join(c["slos"]) or "-"])
    print_table(["class", "arrival", "req/s", "prompt", "E[s]", "output", "E[o]", "priority"], rows,
                title="classes")
    click.echo()
    print_table(["class", "client", "SLOs"], rows2)
    click.echo()

    d = s["deployment"]
    if d.get("fleet"):
        gpus = ("tensor_parallel_size, pools", f"{d['tensor_parallel_size']} (top level); {d['total_gpus']} GPU(s) in "
                f"{len(d['fleet']['pools'])} pool(s), below")
    elif d.get("pipeline_parallel_size", 1) > 1:
        gpus = ("tensor_parallel_size x pipeline_parallel_size x replicas",
                f"{d['tensor_parallel_size']} x {d['pipeline_parallel_size']} x {d['replicas']} = {d['total_gpus']} GPU(s)")
    else:
        gpus = ("tensor_parallel_size x replicas", f"{d['tensor_parallel_size']} x {d['replicas']} = {d['total_gpus']} GPU(s)")
    pairs = [("model", d["model"] or "-"), ("gpu", d["gpu"] or "-"), gpus]
    kv = d.get("kv_capacity")
    if d["M_source"] == "capacity_tokens":
        m_txt = f"{d['M']:,} tokens (capacity_tokens)"
        if kv:
            m_txt += f"; the hardware gives {kv['M']:,}"
    else:
        m_txt = (f"{d['M']:,} tokens per replica ({kv['num_blocks']:,} blocks of {kv['block_size']}; "
                 f"{kv['kv_bytes_per_token']:,} KV bytes/token, {kv['kv_dtype']})")
    pairs.append(("KV capacity M", m_txt))
    for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "gpu_memory_utilization",
              "enable_chunked_prefill", "long_prefill_token_threshold", "max_model_len", "enable_prefix_caching",
              "scheduling_policy", "preemption_mode", "kv_cache_dtype", "dtype", "max_waiting", "max_queue_time_s",
              "step_time"):
        pairs.append((k, d[k]))
    print_kv(pairs, title="deployment")
    click.echo()
    if d.get("fleet"):
        _print_fleet(d["fleet"])


    r = s["run"]
    how = f"{fmt(r['duration_s'])} s" if r.get("duration_s") is not None else f"{r['num_requests']:,} requests"
    print_kv([("length", how), ("seed", r["seed"]), ("warmup_s", r["warmup_s"])], title="run")
    if s["notes"]:
        click.echo("\nnotes")
        for n in s["notes"]:
            click.echo(f"  - {n}")


def _print_fleet(f: dict) -> None:
    """Pools (name, role, replicas, model, gpu, M), lanes, P/D link, gateway, autoscalers, faults."""
    rows = [[p["name"], p["role"], p["replicas"], p["router"], p["model"] or "-", p.get("gpu") or "-",
             f"{p['M']:,}", p["max_num_seqs"], fmt(p["cost_per_replica_hour"]), fmt(p["quality"])]
            for p in f["pools"]]
    print_table(["pool", "role", "replicas", "router", "model", "gpu", "M (tokens)", "max_num_seqs", "$/replica-h",
                 "quality"], rows, title="pools")
    click.echo()
    if f["lanes"]:
        rows = [[ln["name"], ln["pool"], ", ".join(ln["classes"]) or "any",
                 f"{ln['prompt_min']}..{ln['prompt_max'] if ln['prompt_max'] is not None else ''}"]
                for ln in f["lanes"]]
        print_table(["lane", "pool", "classes", "prompt tokens"], rows, title="lanes (first match; else the entry pool)")
        click.echo()
    pairs = []
    if f.get("disaggregation"):
        x = f["disaggregation"]
        bw = "free" if x["kv_link_gbps"] is None else f"{fmt(x['kv_link_gbps'])} Gbit/s"
        pairs.append(("P/D", f"prefill {x['prefill']} -> KV link ({bw}, {fmt(x['kv_link_latency_ms'])} ms) -> "
                             f"decode {x['decode']}"))
    g = f.get("gateway")
    if g:
        for k, v in g["rate_limits"].items():
            pairs.append((f"rate limit {k}", f"{fmt(v['rate'])} req/s, burst {fmt(v['burst'])}"))
        for k in ("max_queue_depth", "max_queue_age_s"):
            if g[k] is not None:
                pairs.append((k, g[k]))
        for s in g["shed"]:
            pairs.append(("shed", f"priority >= {s['min_priority']} while queue age > {fmt(s['queue_age_s'])} s"))
        for fb in g["fallbacks"]:
            pairs.append(("fallback", f"{fb['pool']} -> {fb['to']} while queue age > {fmt(fb['queue_age_s'])} s"))
    from llmqueue.cluster.autoscaler import METRICS

    for a in f["autoscalers"]:
        unit = " s" if METRICS[a["metric"]].seconds else ""  # a target that is a time
        pairs.append((f"autoscaler {a['pool']}", f"{a['metric']} target {fmt(a['target'])}{unit} every {fmt(a['interval_s'])} s, "
                      f"{a['min_replicas']}..{a['max_replicas']} replicas, provisioning {fmt(a['provisioning_delay_s'])} s, "
                      f"cooldown {fmt(a['cooldown_s'])} s"))
    for x in f["faults"]:
        rep = "never repaired" if x["repair_s"] is None else f"repaired after {fmt(x['repair_s'])} s"
        pairs.append((f"fault {x['pool']}[{x['replica']}]", f"at {fmt(x['at_s'])} s, {rep}, in flight: {x['inflight']}"))
    if pairs:
        print_kv(pairs, title="fleet")
        click.echo()
