"""Scenario files: the shipped examples, the schema's checks and their one-line errors, paths, traces."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.scenario import example_names, example_path, load_scenario, validate_scenario
from llmqueue.scenario.load import read_yaml

BASE = {
    "name": "t",
    "workload": {
        "arrival": "poisson:5",
        "prompt": "uniform:10:1600",
        "output": "uniform:10:600",
        "classes": [
            {"name": "chat", "share": 0.8, "priority": 0},
            {"name": "batch", "share": 0.2, "prompt": "fixed:3000", "output": "fixed:500", "priority": 1,
             "client": {"timeout_s": 600, "retry": {"max_attempts": 3}}},
        ],
    },
    "deployment": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_model_len": 8192, "scheduling_policy": "priority"},
    "slos": {"ttft": {"p99": 2.0}, "tpot": {"p90": 0.05, "p99": 0.1},
             "per_class": {"batch": {"ttft": {"p50": 30}}}},
    "run": {"duration_s": 120, "seed": 3, "warmup_s": 10},
}


def _with(mutate):
    d = copy.deepcopy(BASE)
    mutate(d)
    return d


def _error(data, **kw) -> str:
    with pytest.raises(InputError) as e:
        validate_scenario(data, **kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# -- the shipped examples ----------------------------------------------------------------------

def test_the_four_required_examples_are_shipped():
    assert {"chat", "code", "rag", "summarization"} <= set(example_names())
    assert example_path("chat").name == "chat.yaml" and example_path("chat.yaml") == example_path("chat")


@pytest.mark.parametrize("name", example_names())
def test_every_shipped_example_validates(name):
    sc = load_scenario(name)
    assert sc.name == name and sc.source.endswith(f"{name}.yaml")
    s = sc.summary()
    json.dumps(s, allow_nan=False)  # JSON-ready, no NaN
    assert s["deployment"]["M"] == sc.M > 0 and s["deployment"]["M_source"] == "hardware"
    assert sc.M >= sc.deployment.effective_max_model_len  # vLLM would start
    cfg = sc.engine_config()
    assert cfg.capacity_tokens <= sc.M and cfg.max_num_seqs == sc.deployment.max_num_seqs
    assert cfg.class_priority == sc.mix.priorities
    for c in sc.mix:
        assert c.slos, f"{name}: class {c.name} has no SLO"
    # the request stream has the scenario's rate (variance from each class's asymptotic IDC)
    reqs = sc.requests()
    T = sc.run.duration_s
    mean = sc.mix.rate * T
    var = sum(c.arrival.rate * T * c.arrival.idc if c.arrival is not None
              else sc.mix.arrival.rate * c.share * T * (1 + c.share * (sc.mix.arrival.idc - 1))
              for c in sc.mix)
    if hasattr(sc.mix.arrival, "cumulative"):  # a time-varying rate (noon-spike): the expected count in [0, T)
        mean = float(sc.mix.arrival.cumulative(T))
        var *= mean / (sc.mix.rate * T)
    assert abs(len(reqs) - mean) < 6 * math.sqrt(var), (len(reqs), mean)
    assert set(reqs.classes) == set(sc.mix.names)


def test_examples_cite_their_sources():
    for name in example_names():
        text = example_path(name).read_text()
        assert "Assumption" in text or "assumption" in text
        assert any(src in text for src in ("Azure", "Mooncake", "arxiv", "seed 00")), name


# -- a valid scenario, resolved ----------------------------------------------------------------

def test_resolved_scenario():
    sc = validate_scenario(copy.deepcopy(BASE))
    mix = sc.mix
    assert mix.names == ("chat", "batch") and mix.rates() == pytest.approx({"chat": 4.0, "batch": 1.0})
    assert mix["chat"].prompt.spec == "uniform:10:1600"  # the workload's default lengths
    assert mix["batch"].prompt.spec == "fixed:3000"
    assert mix["batch"].client.retry.max_attempts == 3 and mix["chat"].client.retry.max_attempts == 1
    # global SLOs for every class; a class's own targets for a metric replace the global ones
    assert [str(s) for s in mix["chat"].slos] == ["p99 ttft <= 2 s", "p90 tpot <= 0.05 s", "p99 tpot <= 0.1 s"]
    assert [str(s) for s in mix["batch"].slos] == ["p50 ttft <= 30 s", "p90 tpot <= 0.05 s", "p99 tpot <= 0.1 s"]
    from llmqueue.hardware import kv_capacity

    assert sc.M == kv_capacity("llama-3.1-8b", "h100-sxm").M
    assert sc.engine_config().preemption == "lowest-priority"
    r = sc.requests()
    assert r == sc.requests() and r != sc.requests(seed=4)
    assert np.all(r.arrival_s < 120)


def test_no_classes_means_one_default_class_and_capacity_tokens_overrides_M():
    d = {"workload": {"arrival": "gamma:3:cv=2", "lengths": None, "prompt": "fixed:100", "output": "fixed:10"},
         "deployment": {"capacity_tokens": 131000, "step_time": 0.0372, "block_size": 16},
         "run": {"num_requests": 50}}
    sc = validate_scenario(d)
    assert sc.mix.names == ("default",) and sc.M == 131000 and sc.deployment.capacity is None
    assert len(sc.requests()) == 50
    assert sc.engine_config().num_kv_blocks == 131000 // 16
    assert sc.deployment.step_time_model.c0 == pytest.approx(0.0372)


def test_notes_flag_inert_or_risky_settings():
    sc = validate_scenario(_with(lambda d: d["deployment"].update(scheduling_policy="fcfs")))
    assert any("priorities only matter" in n for n in sc.notes)
    sc = validate_scenario(_with(lambda d: d["deployment"].update(max_model_len=2048)))
    assert any("above max_model_len" in n for n in sc.notes)  # 3000 + 500 > 2048: vLLM rejects those


# -- malformed scenarios: one line naming the field path ---------------------------------------

BAD = [
    ("unknown key", lambda d: d["deployment"].update(max_num_seq=8), "deployment.max_num_seq: unknown key; did you mean 'max_num_seqs'?"),
    ("unknown top key", lambda d: d.update(deploy={}), "deploy: unknown key"),
    ("unknown class key", lambda d: d["workload"]["classes"][0].update(shares=0.8), "workload.classes[0].shares: unknown key; did you mean 'share'?"),
    ("bad class spec", lambda d: d["workload"]["classes"][1].update(prompt="uniform:10"), "workload.classes[1].prompt: cannot parse 'uniform:10'"),
    ("bad arrival", lambda d: d["workload"].update(arrival="poison:5"), "workload.arrival: cannot parse 'poison:5': unknown arrival process"),
    ("zero max_num_seqs", lambda d: d["deployment"].update(max_num_seqs=0), "deployment.max_num_seqs: must be >= 1 (got 0)"),
    ("unknown gpu", lambda d: d["deployment"].update(gpu="h900"), "deployment.gpu: unknown GPU 'h900'; choose one of"),
    ("unknown model", lambda d: d["deployment"].update(model="llama-9"), "deployment.model: unknown model 'llama-9'"),
    ("negative duration", lambda d: d["run"].update(duration_s=-5), "run.duration_s: must be > 0 (got -5)"),
    ("missing deployment", lambda d: d.pop("deployment"), "deployment: missing required section"),
    ("missing workload", lambda d: d.pop("workload"), "workload: missing required section"),
    ("missing run", lambda d: d.pop("run"), "run: missing required section"),
    ("empty section", lambda d: d.update(run=None), "run: is empty"),
    ("section not a mapping", lambda d: d.update(workload=["poisson:5"]), "workload: must be a mapping of keys (got a list)"),
    ("both run lengths", lambda d: d["run"].update(num_requests=10), "run.duration_s: give exactly one of duration_s and num_requests"),
    ("warmup too long", lambda d: d["run"].update(warmup_s=500), "run.warmup_s: must be shorter than duration_s"),
    ("nan", lambda d: d["run"].update(duration_s=float("nan")), "run.duration_s: must be a finite number"),
    ("bool as int", lambda d: d["deployment"].update(replicas=True), "deployment.replicas: must be a whole number (got true)"),
    ("text as int", lambda d: d["deployment"].update(max_num_seqs="many"), "deployment.max_num_seqs: must be a whole number (got 'many')"),
    ("utilization", lambda d: d["deployment"].update(gpu_memory_utilization=1.2), "deployment.gpu_memory_utilization: must be <= 1 (got 1.2)"),
    ("shares", lambda d: d["workload"]["classes"][0].update(share=0.7), "workload.classes: shares sum to 0.9, not 1"),
    ("share and arrival", lambda d: d["workload"]["classes"][0].update(arrival="poisson:1"), "workload.classes[0].arrival: give either share"),
    ("duplicate class", lambda d: d["workload"]["classes"][1].update(name="chat"), "workload.classes[1].name: 'chat' is also the name of classes[0]"),
    ("no total arrival", lambda d: d["workload"].pop("arrival"), "workload.arrival: is required: classes[0] ('chat') takes a share of it"),
    ("weights do not fit", lambda d: d["deployment"].update(model="llama-3.1-70b"), "deployment.tensor_parallel_size: the weights do not fit"),
    ("context too long", lambda d: d["deployment"].update(max_model_len=200_000), "deployment.max_model_len: 200000 exceeds llama-3.1-8b's context length 131072"),
    ("budget below seqs", lambda d: d["deployment"].update(max_num_batched_tokens=128), "deployment.max_num_batched_tokens: 128 is below max_num_seqs 256"),
    ("no chunking, small budget", lambda d: d["deployment"].update(enable_chunked_prefill=False, max_num_batched_tokens=4096),
     "deployment.max_num_batched_tokens: 4096 is below max_model_len 8192 with chunked prefill off"),
    ("policy", lambda d: d["deployment"].update(scheduling_policy="lifo"), "deployment.scheduling_policy: unknown scheduling policy 'lifo'"),
    ("swap", lambda d: d["deployment"].update(preemption_mode="swap"), "deployment.preemption_mode: swap is not modelled"),
    ("kv dtype", lambda d: d["deployment"].update(kv_cache_dtype="int4"), "deployment.kv_cache_dtype: int4 is a weight-only format"),
    ("step time", lambda d: d["deployment"].update(step_time="linear:c0=x"), "deployment.step_time: cannot parse 'linear:c0=x'"),
    ("no M", lambda d: d["deployment"].pop("model"), "deployment: needs model and gpu"),
    ("model without gpu", lambda d: d["deployment"].pop("gpu"), "deployment.gpu: is required with model"),
    ("no step time", lambda d: d.update(deployment={"capacity_tokens": 100000}), "deployment.step_time: is required"),
    ("retry attempts", lambda d: d["workload"]["classes"][1]["client"]["retry"].update(max_attempts=0),
     "workload.classes[1].client.retry.max_attempts: must be >= 1 (got 0)"),
    ("retry on ok", lambda d: d["workload"].update(client={"retry": {"retry_on": ["ok"]}}),
     "workload.client.retry.retry_on: 'ok' is never retried"),
    ("timeout", lambda d: d["workload"].update(client={"timeout_s": 0}), "workload.client.timeout_s: must be > 0 (got 0)"),
    ("slo value", lambda d: d["slos"].update(ttft={"p99": -1}), "slos.ttft.p99: must be > 0 (got -1)"),
    ("slo key", lambda d: d["slos"].update(ttft={"99th": 1}), "slos.ttft.99th: is not a percentile key"),
    ("slo metric", lambda d: d["slos"].update(ttfb={"p99": 1}), "slos.ttfb: unknown key; did you mean 'ttft'?"),
    ("slo class", lambda d: d["slos"]["per_class"].update(bacth={"e2el": {"p99": 9}}), "slos.per_class.bacth: is not a class of workload.classes; did you mean 'batch'?"),
    ("missing trace", lambda d: d["workload"].update(arrival=None, trace={"path": "nope.csv"}), "workload.trace.path: no such trace file"),
    ("arrival and trace", lambda d: d["workload"].update(trace={"path": __file__}), "workload.trace: give arrival (a process) or trace"),
    ("lengths missing", lambda d: (d["workload"].pop("prompt"), d["workload"].pop("output")), "workload.classes[0].prompt: class 'chat' has no lengths"),
]


@pytest.mark.parametrize("what,mutate,expected", BAD, ids=[b[0] for b in BAD])
def test_malformed_scenarios_give_one_line_naming_the_field(what, mutate, expected):
    msg = _error(_with(mutate))
    assert msg.startswith(expected), msg


def test_several_errors_are_counted_on_the_one_line():
    msg = _error(_with(lambda d: d["deployment"].update(max_num_seqs=0, replicas=0)))
    assert msg.startswith("deployment.replicas: must be >= 1 (got 0)") and msg.endswith("(1 more error)")


def test_the_file_must_hold_a_mapping():
    assert "must hold a mapping" in _error(None) and "must hold a mapping" in _error([1, 2])


# -- YAML reading --------------------------------------------------------------------------------

def test_yaml_12_booleans_and_floats_and_duplicate_keys():
    d = read_yaml("a: on\nb: no\nc: true\nd: 1e6\ne: 2.5e-3\nf: 7\n")
    assert d == {"a": "on", "b": "no", "c": True, "d": 1e6, "e": 0.0025, "f": 7}
    with pytest.raises(InputError, match=r"x.yaml: invalid YAML at line 2, column 1: .*'a' is given twice"):
        read_yaml("a: 1\na: 2\n", "x.yaml")
    with pytest.raises(InputError, match=r"invalid YAML at line 2"):
        read_yaml("a: [1, 2\nb: 3\n")


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(InputError, match="no shipped example"):
        load_scenario(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="examples: .*chat"):
        load_scenario("nope")
    p = tmp_path / "empty.yaml"
    p.write_text("")
    with pytest.raises(InputError, match="empty.yaml: must hold a mapping .*got an empty file"):
        load_scenario(p)


# -- relative paths ------------------------------------------------------------------------------

LLAMA31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B config.json (the keys that matter)
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}


def test_relative_paths_resolve_against_the_scenario_file(tmp_path, monkeypatch):
    import yaml

    d = tmp_path / "sc"
    (d / "data").mkdir(parents=True)
    (d / "data" / "prompts.csv").write_text("tokens\n100\n200\n300\n")
    (d / "data" / "pairs.csv").write_text("prompt_tokens,output_tokens\n100,10\n2000,50\n")
    (d / "models").mkdir()
    (d / "models" / "config.json").write_text(json.dumps(LLAMA31_8B_CONFIG))
    (d / "calib.yaml").write_text("step_time: linear:c0=0.01:decode=1e-4\n")
    doc = {
        "workload": {"arrival": "poisson:2", "classes": [
            {"name": "a", "share": 0.5, "prompt": "empirical:data/prompts.csv", "output": "fixed:5"},
            {"name": "b", "share": 0.5, "lengths": "joint:data/pairs.csv"}]},
        "deployment": {"model": "models/config.json", "gpu": "a100-80gb", "max_model_len": 4096,
                       "step_time": "fitted:calib.yaml"},
        "run": {"duration_s": 100},
    }
    f = d / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)  # not the scenario's directory
    sc = load_scenario(f)
    assert sc.mix["a"].prompt.mean() == pytest.approx(200) and sc.mix["b"].joint.mean_output() == pytest.approx(30)
    assert sc.deployment.model == str(d / "models" / "config.json")
    assert sc.deployment.step_time_model.c_decode == pytest.approx(1e-4)
    from llmqueue.hardware import kv_capacity

    assert sc.M == kv_capacity("llama-3.1-8b", "a100-80gb").M  # the same shapes as the catalog's
    # a bad path names the field and the resolved file
    doc["workload"]["classes"][0]["prompt"] = "empirical:data/missing.csv"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"^workload.classes\[0\].prompt: cannot parse .*missing.csv"):
        load_scenario(f)


# -- trace replay --------------------------------------------------------------------------------

def _trace(tmp_path, n=400, rate=4.0):
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1 / rate, n))
    rows = ["t,in,out"] + [f"{x:.6f},{i + 1},{2 * (i + 1)}" for i, x in enumerate(t)]
    p = tmp_path / "trace.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_trace_replay(tmp_path):
    _trace(tmp_path)
    doc = {
        "workload": {"trace": {"path": "trace.csv", "format": "csv", "mapping": "time=t,prompt=in,output=out",
                               "time_unit": "s"},
                     "classes": [{"name": "a", "share": 0.75}, {"name": "b", "share": 0.25, "prompt": "fixed:9",
                                                                             "output": "fixed:9"}]},
        "deployment": {"capacity_tokens": 50000, "step_time": 0.02},
        "run": {"num_requests": 300},
    }
    sc = validate_scenario(doc, base_dir=tmp_path)
    r = sc.requests()
    assert len(r) == 300
    a = r.class_name == "a"
    assert np.array_equal(r.output_tokens[a], 2 * r.prompt_tokens[a])  # the trace's own lengths
    assert np.all(r.prompt_tokens[~a] == 9)
    s = sc.summary()
    assert s["workload"]["mode"] == "trace" and s["workload"]["trace"]["requests"] == 400
    assert s["classes"][0]["rate"] == pytest.approx(0.75 * s["workload"]["trace"]["mean_rate"])
    # replay transforms: doubling the rate halves the times; a loop fills the run's duration
    doc["workload"]["trace"]["time_scale"] = 0.5
    fast = validate_scenario(copy.deepcopy(doc), base_dir=tmp_path).load_trace()
    assert fast.mean_rate == pytest.approx(2 * s["workload"]["trace"]["mean_rate"])
    doc["workload"]["trace"].update(loop=True, time_scale=None)
    doc["run"] = {"duration_s": 250}
    looped = validate_scenario(copy.deepcopy(doc), base_dir=tmp_path).requests()
    assert looped.arrival_s[-1] > 200 and np.all(looped.arrival_s < 250)
    doc["workload"]["trace"]["mapping"] = "time=t,prompt=nope,output=out"
    with pytest.raises(InputError, match=r"^workload.trace"):
        validate_scenario(copy.deepcopy(doc), base_dir=tmp_path).requests()
    doc["workload"]["trace"].update(mapping="time=t,prompt=in,output=out", time_scale=2, rate=3)
    assert _error(copy.deepcopy(doc), base_dir=tmp_path).startswith("workload.trace.rate: give time_scale or rate")


def test_a_trace_on_the_command_line_replaces_the_scenarios_arrivals(tmp_path, monkeypatch):
    """`--trace` with `--scenario`: a trace whose classes are the scenario's (a gateway run's
    workload.parquet) is the workload request by request (class, arrival, lengths as recorded; the
    classes' own length distributions unused), the run is the whole trace, and a warm-up as long
    as the trace is dropped with a note. A trace without classes is split by the classes' shares."""
    import numpy as np

    from llmqueue.scenario.override import scenario_with
    from llmqueue.workload.trace import Trace
    from llmqueue.workload.traces import write_trace

    rng = np.random.default_rng(0)
    n = 200
    t = np.sort(rng.uniform(0, 30, n))
    t -= t[0]
    cls = np.where(rng.random(n) < 0.3, "batch", "interactive")
    s, o = rng.integers(1, 9000, n), rng.integers(1, 3000, n)
    monkeypatch.chdir(tmp_path)
    write_trace(Trace(t, s, o, class_name=cls), "gw.parquet")
    run = scenario_with("lanes", trace="gw.parquet")
    reqs = run.scenario.requests()
    assert len(reqs) == n and list(reqs.class_name) == list(cls)
    np.testing.assert_array_equal(reqs.prompt_tokens, s)
    np.testing.assert_array_equal(reqs.output_tokens, o)
    np.testing.assert_allclose(reqs.arrival_s, t)
    assert run.scenario.run.warmup_s == 0 and any("warm-up 60 s" in x for x in run.notes)
    write_trace(Trace(t, s, o), "plain.parquet")
    split = scenario_with("lanes", trace="plain.parquet").scenario.requests()
    assert len(split) == n and set(split.class_name) == {"batch", "interactive"}
    np.testing.assert_allclose(split.arrival_s, t)
    assert not np.array_equal(split.class_name, cls)
