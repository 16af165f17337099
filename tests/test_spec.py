"""From flags to a SimSpec: every knob given with --scenario reaches the spec; defaults never do."""

from __future__ import annotations

import pytest

from llmqueue.errors import InputError
from llmqueue.knobs import KNOBS
from llmqueue.spec import build_spec, engine_config, scenario_spec, spec_from_flags


def spec_of(*args, scenario="chat"):
    """The spec ``llmqueue simulate --scenario SCENARIO ARGS`` would simulate: the command's own
    parsing, and click's record of which flags were given."""
    from llmqueue.cli.flags import given_flags
    from llmqueue.cli.simulate_cmd import simulate

    ctx = simulate.make_context("simulate", ["--scenario", scenario, *args])
    flags = {k: v for k, v in ctx.params.items() if k not in ("scenario", "out_dir", "progress", "as_json")}
    return spec_from_flags(flags, scenario=ctx.params["scenario"], given=given_flags(ctx, flags))


def _M(**kw):
    from llmqueue.hardware import kv_capacity

    args = dict(tensor_parallel_size=1, gpu_memory_utilization=0.9, block_size=16, kv_dtype="auto",
                weight_dtype="auto")
    args.update(kw)
    model, gpu = args.pop("model", "llama-3.1-8b"), args.pop("gpu", "h100-sxm")
    M = kv_capacity(model, gpu, **args).M
    return M - M % args["block_size"]


# (knob, flags given with --scenario chat, check on the spec). The chat scenario: llama-3.1-8b on
# an h100-sxm, max_num_seqs 256, budget 8192, block 16, max_model_len 16384, prefix caching on,
# fcfs, roofline steps; onoff arrivals at 5.53 req/s, lognormal lengths; 1800 s, seed 0, warm-up 60 s.
OVERRIDES = [
    ("max_num_seqs", ["--max-num-seqs", "8"], lambda s: s.engine.max_num_seqs == 8),
    ("max_num_batched_tokens", ["--max-num-batched-tokens", "2048"], lambda s: s.engine.max_num_batched_tokens == 2048),
    ("chunk", ["--chunk", "1024"], lambda s: s.engine.max_num_batched_tokens == 1024),
    ("block_size", ["--block-size", "32"],
     lambda s: s.engine.block_size == 32 and s.engine.capacity_tokens == _M(block_size=32)),
    ("step_time", ["--step-time", "0.05"], lambda s: s.step_time.is_constant and s.step_time.c0 == pytest.approx(0.05)),
    ("capacity_tokens", ["--capacity-tokens", "50000"], lambda s: s.engine.capacity_tokens == 50000),
    ("policy", ["--policy", "priority"],
     lambda s: (s.engine.policy, s.engine.preemption) == ("priority", "lowest-priority")),
    ("preemption", ["--preemption", "lowest-priority"],
     lambda s: (s.engine.policy, s.engine.preemption) == ("fcfs", "lowest-priority")),
    ("enable_prefix_caching", ["--no-enable-prefix-caching"], lambda s: s.engine.enable_prefix_caching is False),
    ("enable_chunked_prefill", ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "16384"],
     lambda s: s.engine.enable_chunked_prefill is False),
    ("long_prefill_token_threshold", ["--long-prefill-token-threshold", "512"],
     lambda s: s.engine.long_prefill_token_threshold == 512),
    ("max_model_len", ["--max-model-len", "8192"], lambda s: s.engine.max_model_len == 8192),
    ("max_waiting", ["--max-waiting", "10"], lambda s: s.engine.max_waiting == 10),
    ("max_queue_time", ["--max-queue-time", "5"], lambda s: s.engine.max_queue_time_s == pytest.approx(5.0)),
    # the host KV tier: Llama-3.1-8B's KV is 131,072 B a token (bf16); 25 GB/s by default
    ("kv_offloading_size", ["--kv-offloading-size", "8"],
     lambda s: s.engine.kv_offload_tokens == 8 * 2**30 // 131072
     and s.engine.kv_offload_s_per_token == pytest.approx(131072 / 25e9)),
    ("kv_offloading_gbps", ["--kv-offloading-size", "8", "--kv-offloading-gbps", "5"],
     lambda s: s.engine.kv_offload_s_per_token == pytest.approx(131072 / 5e9)),
    ("kv_bytes_per_token", ["--kv-offloading-size", "8", "--kv-bytes-per-token", "65536"],
     lambda s: s.engine.kv_offload_tokens == 8 * 2**30 // 65536),
    ("model", ["--model", "qwen2.5-7b", "--max-model-len", "8192"],
     lambda s: s.engine.capacity_tokens == _M(model="qwen2.5-7b")),
    ("gpu", ["--gpu", "a100-80gb"], lambda s: s.engine.capacity_tokens == _M(gpu="a100-80gb")),
    ("tensor_parallel_size", ["--tensor-parallel-size", "2"],
     lambda s: s.engine.capacity_tokens == _M(tensor_parallel_size=2)),
    ("pipeline_parallel_size", ["--pipeline-parallel-size", "2"],
     lambda s: s.engine.capacity_tokens == _M(pipeline_parallel_size=2) and s.step_time.spec.endswith(":pp=2")),
    ("gpu_memory_utilization", ["--gpu-memory-utilization", "0.5"],
     lambda s: s.engine.capacity_tokens == _M(gpu_memory_utilization=0.5)),
    ("kv_cache_dtype", ["--kv-cache-dtype", "fp8"], lambda s: s.engine.capacity_tokens == _M(kv_dtype="fp8")),
    ("dtype", ["--dtype", "fp8"], lambda s: s.engine.capacity_tokens == _M(weight_dtype="fp8")),
    ("srpt_predictor_cv", ["--srpt-predictor-cv", "0.3"], lambda s: s.predictor_cv == pytest.approx(0.3)),
    ("prefix_block_tokens", ["--prefix-block-tokens", "256"], lambda s: s.options.hash_block_tokens == 256),
    ("arrival", ["--arrival", "poisson:20"],
     lambda s: s.workload.arrival.spec == "poisson:20" and abs(len(s.requests) / 1800 - 20) < 0.5),
    ("rate", ["--rate", "20"], lambda s: s.workload.arrival.rate == pytest.approx(20.0)
     and type(s.workload.arrival).__name__ == "OnOff"),  # the scenario's on-off process, rescaled
    ("prompt", ["--prompt-len", "fixed:100"], lambda s: (s.requests.prompt_tokens == 100).all()),
    ("output", ["--output-len", "fixed:7"], lambda s: (s.requests.output_tokens == 7).all()),
    ("prompt_old_flag", ["--prompt", "fixed:100"], lambda s: (s.requests.prompt_tokens == 100).all()),
    ("duration", ["--duration", "120"], lambda s: s.duration_s == 120 and s.num_requests is None),
    ("num_requests", ["--num-requests", "300"],
     lambda s: s.num_requests == 300 and s.duration_s is None and len(s.requests) == 300),
    ("seed", ["--seed", "7"], lambda s: s.seed == 7 and s.options.seed == 7),
    ("warmup", ["--warmup", "10"], lambda s: s.warmup_s == 10),
    ("sample_dt", ["--sample-dt", "0.5"], lambda s: s.options.sample_dt == 0.5),
    ("early_stop", ["--early-stop"], lambda s: s.options.early_stop is True),
    ("slo_ttft_ms", ["--slo-ttft-ms", "500"],
     lambda s: s.slos["default"] == {"p99_tpot_ms": pytest.approx(50.0), "ttft_ms": 500.0}),
    ("slo_tpot_ms", ["--slo-tpot-ms", "80"],
     lambda s: s.slos["default"] == {"p99_ttft_ms": pytest.approx(2000.0), "tpot_ms": 80.0}),
    ("slo_e2el_ms", ["--slo-e2el-ms", "9000"], lambda s: s.slos["default"].get("e2el_ms") == 9000.0),
    ("router", ["--router", "least-outstanding"], lambda s: s.router == "least-outstanding"),
]
# scenario-file knobs without a flag, through the library's keywords
LIBRARY_ONLY = {"replicas", "preemption_mode", "lengths", "trace"}
# knobs of a P/D fleet, given with --scenario pd (2 prefill + 4 decode, a 100 Gbit/s link, 0.05 ms)
PD_OVERRIDES = [
    ("kv_link_gbps", ["--kv-link-gbps", "25"], lambda s: s.fleet.disaggregation.kv_link_gbps == 25),
    ("kv_link_latency_ms", ["--kv-link-latency-ms", "2"], lambda s: s.fleet.disaggregation.kv_link_latency_ms == 2),
    ("router_pd", ["--router", "power-of-two"], lambda s: {p.router for p in s.fleet.pools} == {"power-of-two"}),
]


@pytest.mark.parametrize("name, args, ok", PD_OVERRIDES, ids=[o[0] for o in PD_OVERRIDES])
def test_a_fleet_flag_given_with_a_pd_scenario_reaches_the_spec(name, args, ok):
    assert ok(spec_of(*args, scenario="pd")), name
    assert not ok(spec_of(scenario="pd")), name


def test_disaggregate_builds_a_pd_fleet():
    from llmqueue.hardware import kv_bytes_per_token

    s = build_spec(model="llama-3.1-8b", gpu="h100-sxm", prompt="fixed:100", output="fixed:10", arrival="poisson:1",
                   duration=10, disaggregate="2:3", router="least-outstanding", kv_link_gbps=100,
                   kv_link_latency_ms=0.5)
    f = s.fleet
    assert [(p.name, p.role, p.replicas, p.router) for p in f.pools] == [
        ("prefill", "prefill", 2, "least-outstanding"), ("decode", "decode", 3, "least-outstanding")]
    assert f.pools[0].config is s.engine and f.pools[1].step_time is s.step_time
    assert f.pools[0].kv_bytes_per_token == kv_bytes_per_token("llama-3.1-8b") > 0
    assert (f.disaggregation.prefill, f.disaggregation.decode) == ("prefill", "decode")
    assert (f.disaggregation.kv_link_gbps, f.disaggregation.kv_link_latency_ms) == (100, 0.5)
    free = build_spec(capacity_tokens=1000, step_time=0.01, prompt="fixed:10", output="fixed:10",
                      arrival="poisson:1", duration=10, disaggregate=" 1 : 1 ")
    assert free.fleet.disaggregation.kv_link_gbps == float("inf") and free.fleet.pools[0].kv_bytes_per_token == 0
    assert build_spec(capacity_tokens=1000, step_time=0.01, prompt="fixed:10", output="fixed:10",
                      arrival="poisson:1", duration=10, replicas=2).fleet is None


@pytest.mark.parametrize("name, args, ok", OVERRIDES, ids=[o[0] for o in OVERRIDES])
def test_a_flag_given_with_a_scenario_reaches_the_spec(name, args, ok):
    assert ok(spec_of(*args)), name
    assert not ok(spec_of()), f"{name}: the check must tell the override from the scenario's own value"


def test_every_knob_that_applies_to_a_scenario_is_tested():
    tested = {o[0] for o in OVERRIDES} | {o[0] for o in PD_OVERRIDES} | LIBRARY_ONLY
    assert {k.name for k in KNOBS if k.scenario} <= tested


def test_defaults_never_override_a_scenario():
    """A flag at its default leaves the scenario's value: chat turns prefix caching on (the flag's
    default is off) and its run is 1800 s with a 60 s warm-up (the flags' default warm-up is 0)."""
    s = spec_of()
    assert s.engine.enable_prefix_caching is True and s.duration_s == 1800 and s.warmup_s == 60
    # ... but the same value given explicitly does (seed 0 is given, not a default)
    assert spec_of("--seed", "0").seed == 0 and spec_of("--enable-prefix-caching").engine.enable_prefix_caching


def test_library_only_knobs_and_lengths(tmp_path):
    two = scenario_spec(scenario="chat", replicas=2, duration=120)
    one = scenario_spec(scenario="chat", duration=120)
    # a fleet of two serves the whole stream (it was replica 0's random half)
    assert two.replicas == 2 and len(two.requests) == len(one.requests)
    assert any("2 replicas on one clock" in n for n in two.notes)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt_tokens,output_tokens\n100,10\n300,30\n")
    s = scenario_spec(scenario="chat", lengths=f"joint:{pairs}", duration=120)
    assert set(s.requests.prompt_tokens.tolist()) == {100, 300}
    # a relative path on the command line is relative to the working directory, not the scenario's
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        s = scenario_spec(scenario="chat", lengths="joint:pairs.csv", duration=120)
    finally:
        os.chdir(cwd)
    assert set(s.requests.output_tokens.tolist()) == {10, 30}
    with pytest.raises(InputError, match="^preemption_mode: swap is not modelled"):
        scenario_spec(scenario="chat", preemption_mode="swap")



def test_the_fleet_note_names_the_router_it_routes_by():
    """`simulate --scenario chat --set deployment.replicas=2 --router least-outstanding` said "behind a
    uniform random router" while it routed by least-outstanding: the note names the router used."""
    from _cli import run_cli

    jsq = scenario_spec(scenario="chat", sets=["deployment.replicas=2"], router="least-outstanding", duration=120)
    note = next(n for n in jsq.notes if "2 replicas on one clock" in n)
    assert jsq.router == "least-outstanding" and "behind the least-outstanding router" in note and "random" not in note
    plain = scenario_spec(scenario="chat", sets=["deployment.replicas=2"], duration=120)
    assert plain.router == "random" and any("behind a uniform random router" in n for n in plain.notes)
    d = run_cli("simulate", "--scenario", "chat", "--set", "deployment.replicas=2", "--router", "least-outstanding",
                "--duration", "120", "--json", "--no-progress").json()
    said = [n for n in d["notes"] if "replicas on one clock" in n]
    assert said == ["2 replicas on one clock behind the least-outstanding router (each request routed as it "
                    "arrives; retries routed afresh)"]

def test_arrival_on_a_mix_with_own_processes_rescales_the_total_rate():
    """"mixed" has classes with their own arrival processes: --arrival keeps every shape and scales
    the total rate to the given process's, and says so."""
    from llmqueue.scenario.override import scenario_with

    base = scenario_with("mixed").scenario
    o = scenario_with("mixed", arrival="poisson:12")
    assert o.scenario.mix.rate == pytest.approx(12.0) and base.mix.rate != pytest.approx(12.0)
    assert len(o.notes) == 1 and "scaled to 12 req/s" in o.notes[0]
    # each class keeps its share of the total
    for a, b in zip(base.mix.rates().values(), o.scenario.mix.rates().values()):
        assert b / 12.0 == pytest.approx(a / base.mix.rate)


@pytest.mark.parametrize("scenario, kw, message", [
    ("mixed", {"prompt": "fixed:10"}, "prompt: the scenario has"),
    ("chat", {"trace": "no-such-trace.csv"}, "trace: "),  # a trace replaces the arrivals; a missing one is named
    ("chat", {"chunk": 512, "max_num_batched_tokens": 1024}, "chunk: give --chunk or --max-num-batched-tokens"),
    ("chat", {"duration": 30}, "duration: the run (30 s) is not longer than the warm-up (60 s)"),
    ("chat", {"duration": 60, "num_requests": 5}, "num_requests: give --num-requests or --duration, not both"),
    ("chat", {"max_num_batched_tokens": 128}, "max_num_batched_tokens: 128 is below max_num_seqs 256"),
    ("chat", {"max_model_len": 200_000}, "max_model_len: 200000 exceeds llama-3.1-8b's context length"),
    ("chat", {"policy": "lifo"}, "policy: unknown policy 'lifo'"),
    ("chat", {"max_num_seqs": 0}, "max_num_seqs: must be >= 1 (got 0)"),
    ("chat", {"gpu": "h900"}, "gpu: unknown GPU 'h900'"),
    ("chat", {"arrival": "poison:3"}, "arrival: cannot parse 'poison:3'"),
    ("chat", {"bogus": 1}, "bogus: is not a knob"),
])
def test_overrides_that_cannot_apply_name_the_knob(scenario, kw, message):
    with pytest.raises(InputError) as e:
        scenario_spec(scenario=scenario, **kw)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_scenario_of_the_wrong_type_names_the_field(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("workload: {arrival: poisson:1, prompt: fixed:10, output: fixed:5}\n"
                 "deployment: {capacity_tokens: 50000, step_time: 0.01, max_num_seqs: lots}\nrun: {duration_s: 60}\n")
    with pytest.raises(InputError, match=r"^deployment.max_num_seqs: must be a whole number \(got 'lots'\)"):
        spec_of(scenario=str(f))
    # the flag overrides the bad field... and the file's own value is still validated when not overridden
    assert spec_of("--max-num-seqs", "4", scenario=str(f)).engine.max_num_seqs == 4


# --- the flags alone ------------------------------------------------------------------------------

BASE = dict(step_time="0.01", prompt="fixed:10", output="fixed:5", arrival="poisson:1", num_requests=20)


def test_build_spec_fills_the_tables_defaults():
    s = build_spec(**BASE)
    e = s.engine
    assert (e.max_num_seqs, e.max_num_batched_tokens, e.block_size, e.policy, e.preemption) == \
        (256, 8192, 16, "fcfs", "newest")
    assert e.enable_chunked_prefill and not e.enable_prefix_caching and e.max_model_len == 0 and s.kv_unlimited
    assert build_spec(**BASE, policy="priority").engine.preemption == "lowest-priority"  # vLLM's victim


def test_build_spec_model_gives_m_context_and_roofline():
    s = build_spec(**{**BASE, "step_time": None}, model="llama-3.1-8b", gpu="h100-sxm")
    assert s.engine.capacity_tokens == _M() and s.engine.max_model_len == 131072 and not s.kv_unlimited
    assert not s.step_time.is_constant  # the roofline
    # capacity_tokens overrides M, as in a scenario file; the model still gives the step time
    s = build_spec(**{**BASE, "step_time": None}, model="llama-3.1-8b", gpu="h100-sxm", capacity_tokens=40000)
    assert s.engine.capacity_tokens == 40000
    with pytest.raises(InputError, match="^gpu: is required with --model"):
        build_spec(**BASE, model="llama-3.1-8b")


def test_engine_config_rules():
    assert engine_config(1600, chunk=256).max_num_batched_tokens == 256
    with pytest.raises(InputError, match="^chunk: give --chunk or --max-num-batched-tokens"):
        engine_config(1600, chunk=256, max_num_batched_tokens=512)
    with pytest.raises(InputError, match="^max_queue: is not an engine knob"):
        engine_config(1600, max_queue=3)
