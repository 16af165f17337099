"""Workload generation: columns, reproducibility, common random numbers, joint lengths, classes."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.workload import (JointLengths, Request, RequestArrays, Uniform, Workload,
                               parse_joint)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
SEED004 = dict(prompt="uniform:10:1600", output="uniform:10:1600")


def test_request_record():
    r = Request(3, 1.5, 100, 20)
    assert r.class_name == "default"
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.prompt_tokens = 5
    assert [f.name for f in dataclasses.fields(Request)] == [
        "request_id", "arrival_s", "prompt_tokens", "output_tokens", "class_name"]


def test_generate_n_columns():
    w = Workload("poisson:5", **SEED004)
    r = w.generate(0, n=10_000)
    assert len(r) == 10_000
    assert r.request_id.dtype == np.int64 and np.array_equal(r.request_id, np.arange(10_000))
    assert r.arrival_s.dtype == np.float64 and np.all(np.diff(r.arrival_s) >= 0) and r.arrival_s[0] > 0
    for col in (r.prompt_tokens, r.output_tokens):
        assert col.dtype == np.int64 and col.min() >= 10 and col.max() <= 1600
    assert r.classes == ("default",) and set(r.class_name.tolist()) == {"default"}
    with pytest.raises(ValueError):
        r.arrival_s[0] = 1.0  # read-only


def test_generate_duration():
    w = Workload("gamma:20:cv=2", **SEED004)
    r = w.generate(1, duration=500.0)
    assert np.all(r.arrival_s < 500.0)
    assert abs(len(r) - 20 * 500) < 6 * math.sqrt(4 * 20 * 500)
    # the same requests as the n-mode run up to that count (renewal arrivals, same streams)
    rn = w.generate(1, n=len(r))
    assert rn == r


def test_generated_lengths_match_exact_moments():
    w = Workload("poisson:100", prompt="lognormal:mean=600:sd=400:max=8192", output="normal:mean=300:sd=80")
    r = w.generate(2, n=200_000)
    for col, dist in ((r.prompt_tokens, w.prompt), (r.output_tokens, w.output)):
        assert abs(col.mean() - dist.mean()) < 4.5 * dist.std() / math.sqrt(col.size)
    assert abs(np.corrcoef(r.prompt_tokens, r.output_tokens)[0, 1]) < 0.015  # independent streams
    assert w.mean_prompt() == w.prompt.mean() and w.rate == 100.0


def test_reproducible_and_seed_sensitive():
    w = Workload("onoff:20:on=3:off=9", **SEED004)
    a, b = w.generate(42, n=5000), w.generate(42, n=5000)
    assert a == b
    c = w.generate(43, n=5000)
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    ss = np.random.SeedSequence(42)
    assert w.generate(ss, n=100) == w.generate(ss, n=100) == w.generate(42, n=100)


def test_common_random_numbers():
    base = Workload("poisson:5", prompt="uniform:10:1600", output="uniform:10:1600").generate(7, n=20_000)
    # change the prompt distribution: arrivals and outputs do not move
    r1 = Workload("poisson:5", prompt="uniform:10:2133", output="uniform:10:1600").generate(7, n=20_000)
    assert np.array_equal(r1.arrival_s, base.arrival_s)
    assert np.array_equal(r1.output_tokens, base.output_tokens)
    assert np.all(r1.prompt_tokens >= base.prompt_tokens)  # same quantiles, longer distribution
    # change the arrival process: lengths do not move
    r2 = Workload("gamma:9:cv=3", prompt="uniform:10:1600", output="uniform:10:1600").generate(7, n=20_000)
    assert np.array_equal(r2.prompt_tokens, base.prompt_tokens)
    assert np.array_equal(r2.output_tokens, base.output_tokens)
    assert not np.array_equal(r2.arrival_s, base.arrival_s)


def test_joint_workload_keeps_pairs_and_correlation():
    rng = np.random.default_rng(0)
    s = rng.integers(100, 4000, 5000)
    o = np.maximum(1, (s // 4 + rng.integers(0, 50, 5000)))  # strongly correlated with s
    j = JointLengths(s, o)
    assert j.correlation() > 0.95
    r = Workload("poisson:10", joint=j).generate(3, n=50_000)
    observed = set(zip(s.tolist(), o.tolist()))
    assert all(pair in observed for pair in zip(r.prompt_tokens.tolist(), r.output_tokens.tolist()))
    assert np.corrcoef(r.prompt_tokens, r.output_tokens)[0, 1] == pytest.approx(j.correlation(), abs=0.01)
    assert abs(r.prompt_tokens.mean() - j.mean_prompt()) < 4.5 * s.std() / math.sqrt(len(r))
    # the arrivals are those of the same seed without joint lengths
    r0 = Workload("poisson:10", **SEED004).generate(3, n=50_000)
    assert np.array_equal(r.arrival_s, r0.arrival_s)


def test_joint_lengths_pmf_and_expectation():
    j = JointLengths([10, 10, 20, 10], [1, 1, 5, 2])
    ps, os_, p = j.pmf_pairs()
    assert list(zip(ps.tolist(), os_.tolist(), p.tolist())) == [(10, 1, 0.5), (10, 2, 0.25), (20, 5, 0.25)]
    assert j.mean_prompt() == 12.5 and j.mean_output() == 2.25
    assert j.prompt_dist().mean() == pytest.approx(12.5) and j.output_dist().second_moment() == pytest.approx(31 / 4)

    def g(s, o):  # seed 004's lifetime KV memory demand, no chunking (s_hat = s)
        return (2 * s + 2 * o * s + (1 + o) * o) / 2
    direct = np.mean([g(a, b) for a, b in [(10, 1), (10, 1), (20, 5), (10, 2)]])
    assert j.expect(g) == pytest.approx(direct)
    assert j.expect(g) == pytest.approx(float(np.sum(g(ps, os_) * p)))
    assert math.isnan(JointLengths([5, 5], [1, 2]).correlation())
    for bad in (([1, 2], [1]), ([0, 2], [1, 1]), ([], []), ([1.5], [2])):
        with pytest.raises(InputError):
            JointLengths(*bad)


def test_joint_from_files(tmp_path):
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [1, 2]}\n'
                  '{"timestamp": 5, "input_length": 60, "output_length": 2, "hash_ids": [1]}\n')
    j = parse_joint(f"joint:{jl}")
    assert j.spec.endswith(":prompt=input_length:output=output_length")
    assert (j.mean_prompt(), j.mean_output()) == (50.0, 4.0)
    js = tmp_path / "t.json"
    js.write_text('{"p": [1, 3], "q": [2, 4]}')
    assert parse_joint(f"joint:{js}:prompt=p:output=q").mean_output() == 3.0


@pytest.mark.skipif(not (SHARED / "azure_llm_2023").is_dir(), reason="../shared/traces not present")
def test_azure_conv_trace_joint_matches_readme():
    j = parse_joint(f"joint:{SHARED / 'azure_llm_2023' / 'AzureLLMInferenceTrace_conv.csv'}")
    assert len(j) == 19_366  # README: 19,366 rows, input mean 1155, output mean 211
    assert round(j.mean_prompt()) == 1155 and round(j.mean_output()) == 211


def test_request_arrays_views():
    w = Workload("deterministic:2", prompt="fixed:7", output="uniform:1:3", class_name="chat")
    r = w.generate(0, n=4)
    reqs = r.to_requests()
    assert [q.arrival_s for q in reqs] == [0.5, 1.0, 1.5, 2.0]
    assert all(isinstance(q, Request) and q.class_name == "chat" and q.prompt_tokens == 7 for q in reqs)
    assert r[2] == reqs[2] and list(r) == reqs
    assert isinstance(reqs[0].request_id, int) and isinstance(reqs[0].arrival_s, float)
    cols = r.to_columns()
    assert list(cols) == ["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"]
    assert cols["class"].tolist() == ["chat"] * 4
    assert "4 requests" in repr(r)
    assert w.specs() == {"arrival": "deterministic:2", "prompt": "fixed:7", "output": "uniform:1:3",
                         "class": "chat"}


def test_merge_classes():
    a = Workload("poisson:3", prompt="fixed:100", output="fixed:10", class_name="chat").generate(1, n=300)
    b = Workload("poisson:1", prompt="fixed:2000", output="fixed:500", class_name="batch").generate(2, n=100)
    m = RequestArrays.merge(a, b)
    assert len(m) == 400 and np.array_equal(m.request_id, np.arange(400))
    assert np.all(np.diff(m.arrival_s) >= 0)
    names = m.class_name
    assert set(m.classes) == {"chat", "batch"} and (names == "chat").sum() == 300
    assert np.all(m.prompt_tokens[names == "batch"] == 2000)
    assert np.array_equal(np.sort(m.arrival_s[names == "chat"]), a.arrival_s)


def test_empty_generation():
    r = Workload("poisson:5", **SEED004).generate(0, n=0)
    assert len(r) == 0 and r.to_requests() == [] and "0 requests" in repr(r)


def test_workload_errors_name_the_field():
    cases = [
        (lambda: Workload("poisson:5", prompt="uniform:10", output="fixed:5"), "prompt"),
        (lambda: Workload("poisson:5", prompt="fixed:5", output="normal:mean=5"), "output"),
        (lambda: Workload("poison:5", prompt="fixed:5", output="fixed:5"), "arrival"),
        (lambda: Workload("poisson:5", prompt="fixed:5"), "lengths"),
        (lambda: Workload("poisson:5", prompt="fixed:5", output="fixed:5", joint=JointLengths([1], [1])),
         "lengths"),
        (lambda: Workload("poisson:5", joint="joint:/no/such.csv"), "lengths"),
        (lambda: Workload("poisson:5", prompt="fixed:5", output="fixed:5", class_name=""), "class_name"),
    ]
    for make, field in cases:
        with pytest.raises(InputError) as e:
            make()
        assert e.value.field == field, str(e.value)
    w = Workload("poisson:5", prompt=Uniform(10, 20), output="fixed:5")
    for kwargs, field in (({}, "n/duration"), ({"n": 5, "duration": 1.0}, "n/duration"),
                          ({"n": -1}, "n"), ({"duration": -1.0}, "duration"),
                          ({"duration": math.inf}, "duration")):
        with pytest.raises(InputError) as e:
            w.generate(0, **kwargs)
        assert e.value.field == field
    for seed in (-1, 1.5, "7", None, True):
        with pytest.raises(InputError) as e:
            w.generate(seed, n=3)
        assert e.value.field == "seed"
