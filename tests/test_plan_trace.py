"""The planner on a replayed trace (``--trace``) and on a fitted workload (``--workload``).

A Mooncake-style JSONL trace generated here (seeded: about 4 req/s for about 5 minutes, prompts
of 50-300 tokens, outputs of 20-60): the plan's ``lam`` is the trace's ``(n - 1) / span`` (all
of it, or of its first ``--duration`` seconds), its length samples the trace's own; the cache key
changes when the trace's bytes do; the sensitivity rows that would replace the trace's arrival
times are refused with the reason; local processes and Ray give the serial answer. A workload
fitted to the same trace with ``llmqueue workload fit`` plans at the fit's rate.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.plan.planner import plan

from test_plan_planner import SLOS

MODEL = ("llama-3.1-8b",)
SPACE = dict(gpus=["a100-40gb", "h100-sxm"], tp=(1,), replicas=(1, 2, 3), max_num_seqs=(2, 16),
             max_num_batched_tokens=(512,), routers=("least-outstanding",), models=MODEL)


def _write_trace(path, seed=5, n=1200, rate=4.0):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    s = rng.integers(50, 301, n)
    o = rng.integers(20, 61, n)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"timestamp": int(round(t[i] * 1000)), "input_length": int(s[i]),
                                "output_length": int(o[i]), "hash_ids": []}) + "\n")
    ms = np.round(t * 1000).astype(np.int64)
    return (ms - ms[0]) / 1000.0, s, o


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("plan_trace") / "t.jsonl"
    t, s, o = _write_trace(p)
    return {"path": str(p), "t": t, "s": s, "o": o}


@pytest.fixture(scope="module")
def planned(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan_trace_out")
    res = plan(None, trace=trace["path"], slos=SLOS, **SPACE, out_dir=out, sensitivity=True)
    return res, out


def test_bounds_use_the_traces_rate_and_lengths(trace, planned):
    res, out = planned
    t = trace["t"]
    assert res.lam == pytest.approx((len(t) - 1) / (t[-1] - t[0]), rel=1e-9)
    d = res.to_dict()
    assert d["mean_prompt_tokens"] == pytest.approx(float(np.mean(trace["s"])), rel=1e-12)
    assert d["mean_output_tokens"] == pytest.approx(float(np.mean(trace["o"])), rel=1e-12)
    src = d["workload_source"]
    assert src["kind"] == "trace" and src["requests"] == len(t) and "the whole trace" in src["replayed"]
    assert d["duration_s"] == np.floor(t[-1]) + 1.0 and d["seed"] == 0 and d["scenario"] is None
    assert (out / "plan-scenario.yaml").is_file()
    rec = res.recommended
    assert rec is not None and rec.meets and rec.config.model == MODEL[0]
    # the rho of every candidate is the trace's lam over its rate bound
    for c in res.candidates:
        if c.rate_bound:
            assert c.rho == pytest.approx(res.lam / c.rate_bound)


def test_duration_replays_the_first_seconds(trace):
    t = trace["t"]
    first = t[t < 100.0]
    res = plan(None, trace=trace["path"], slos=SLOS, **dict(SPACE, gpus=["h100-sxm"], replicas=(2,),
                                                          max_num_seqs=(16,)), duration=100.0)
    assert res.lam == pytest.approx((len(first) - 1) / (first[-1] - first[0]), rel=1e-9)
    assert res.meta["workload_source"]["requests"] == len(first)
    assert "first 100 s" in res.meta["workload_source"]["replayed"]
    assert res.recommended.result["completed"] <= len(first)


def test_sensitivity_on_a_trace(planned):
    res, _ = planned
    rows = {r["case"]: r for r in res.meta["sensitivity"]["rows"]}
    from llmqueue.plan.sensitivity import SPEC_ROWS

    assert tuple(rows) == SPEC_ROWS
    for name in ("burstier arrivals (gamma cv=2)", "spike x2 for 15 min"):
        assert rows[name]["refused"].startswith("a replayed trace keeps its recorded arrival times")
        assert rows[name]["meets"] is None and rows[name]["p99_ttft_ms"] is None
    base, more = rows["base"], rows["+20% traffic"]
    assert "1/1.2" in more["how"]
    assert more["p99_tpot_ms"] >= base["p99_tpot_ms"] * 0.95  # more load: not faster beyond the noise
    m = res.meta["sensitivity"]["margin_rate"]
    assert m is None or m > 0


def test_cache_key_follows_the_trace_bytes(trace, planned, tmp_path):
    from llmqueue.plan.points import point_key
    from llmqueue.spec import scenario_spec

    res, out = planned
    sc = res.meta["plan_scenario"]
    params = {"scenario": sc, "duration": res.meta["duration_s"], "seed": 0, "model": MODEL[0]}
    before = point_key(scenario_spec, params)
    # a rerun on the same trace and --out simulates nothing
    again = plan(None, trace=trace["path"], slos=SLOS, **SPACE, out_dir=out)
    assert again.meta["resumed"]["cached"] == again.meta["resumed"]["points"] > 0
    assert again.meta["plan_scenario"] == sc
    # the same times, one output length changed: the scenario text is the same, its key is not
    lines = open(trace["path"]).read().splitlines()
    first = json.loads(lines[0])
    first["output_length"] += 1
    lines[0] = json.dumps(first)
    edited = tmp_path / "t.jsonl"
    edited.write_text("\n".join(lines) + "\n")
    from llmqueue.plan.workload_source import plan_scenario

    other = plan_scenario(None, trace=str(edited), models=MODEL, gpus=["h100-sxm"], tp=(1,))
    assert point_key(scenario_spec, {**params, "scenario": other.scenario}) != before
    # and in place: the same path, new bytes
    import shutil

    copy = tmp_path / "same.jsonl"
    shutil.copy(trace["path"], copy)
    same = plan_scenario(None, trace=str(copy), models=MODEL, gpus=["h100-sxm"], tp=(1,)).scenario
    k1 = point_key(scenario_spec, {**params, "scenario": same})
    shutil.copy(edited, copy)
    assert plan_scenario(None, trace=str(copy), models=MODEL, gpus=["h100-sxm"], tp=(1,)).scenario == same
    assert point_key(scenario_spec, {**params, "scenario": same}) != k1


def test_same_trace_plan_on_local_and_ray(trace, planned):
    from llmqueue.plan.backends import get_backend

    res, _ = planned

    def answer(r):
        return r.recommended.config, {c.config: (c.result["p99_ttft_ms"], c.result["p99_tpot_ms"])
                                      for c in r.candidates if c.result}

    rec, sims = answer(res)
    with get_backend("local", workers=2) as be:
        lrec, lsims = answer(plan(None, trace=trace["path"], slos=SLOS, **SPACE, backend=be))
    assert lrec == rec and all(lsims[k] == v for k, v in sims.items())
    pytest.importorskip("ray", reason="ray is not installed (pip install 'llmqueue[ray]')")
    with get_backend("ray", workers=2) as be:
        rrec, rsims = answer(plan(None, trace=trace["path"], slos=SLOS, **SPACE, backend=be))
    assert rrec == rec and rsims == lsims


def test_plan_a_fitted_workload(trace, tmp_path):
    from llmqueue.workload import load_fitted

    fit = tmp_path / "fit.yaml"
    assert run_cli("workload", "fit", trace["path"], "-o", str(fit)).code == 0
    fw = load_fitted(fit)
    out = tmp_path / "out"
    code, text, err = run_cli("plan", "--workload", str(fit), "--models", MODEL[0], "--gpus", "a100-40gb,h100-sxm", "--tp", "1",
                              "--replicas", "1..3", "--max-num-seqs", "2,16", "--max-num-batched-tokens", "512",
                              "--slo-ttft-p99-ms", "45", "--slo-tpot-p99-ms", "40", "--duration", "300", "--no-sensitivity",
                              "--out", str(out), "--json")
    assert code == 0, err
    d = json.loads(text)
    assert d["lam"] == pytest.approx(fw.rate, rel=1e-9)
    assert d["workload_source"]["kind"] == "fitted workload" and d["workload_source"]["arrival"] == fw.arrival.spec
    assert d["duration_s"] == 300.0 and d["recommended"]["model"] == MODEL[0]
    # the fitted pairs are the trace's: the mean prompt of the generated stream is close to the trace's
    assert d["mean_prompt_tokens"] == pytest.approx(float(np.mean(trace["s"])), rel=0.05)
    assert any("i.i.d." in n for n in d["workload_notes"])
    import yaml

    sc = yaml.safe_load((out / "plan-scenario.yaml").read_text())
    assert sc["workload"]["arrival"] == fw.arrival.spec and sc["workload"]["lengths"].startswith("joint:/")


@pytest.mark.parametrize("args, words", [
    (["--models", "llama-3.1-8b,llama-3.1-70b", "--step-time", "0.02", "--gpus", "h100-sxm", "--tp", "1"],
     ["--step-time", "describes one model", "--models lists 2"]),
    (["--models", "llama-9b"], ["--models", "unknown model 'llama-9b'"]),
    (["--workload", "@FIT"], ["--trace", "not both"]),
    (["--models", ""], ["--models", "names no model"]),
])
def test_bad_trace_plans(trace, tmp_path, args, words):
    fit = tmp_path / "f.yaml"
    fit.write_text("format: x\n")
    args = [str(fit) if a == "@FIT" else a for a in args]
    if "--models" not in args:
        args += ["--models", MODEL[0]]
    code, out, err = run_cli("plan", "--trace", trace["path"], "--slo-ttft-p99-ms", "100", "--out", str(tmp_path / "o"),
                             *args)
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error: "), err
    for w in words:
        assert w in lines[0]
    assert not (tmp_path / "o").exists()
