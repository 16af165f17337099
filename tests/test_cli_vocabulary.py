"""One vocabulary across commands: ``--rate`` for a bare arrival rate, ``--prompt-len`` /
``--output-len`` for length specs, ``-o/--out`` for every output path, the same chunk default,
SLOs in milliseconds with the unit in the name; the old names still work but leave ``--help``."""

from __future__ import annotations

import json

import pytest
import yaml
from _cli import run_cli


def help_of(*cmd):
    code, out, _ = run_cli(*cmd, "--help")
    assert code == 0
    return out


@pytest.mark.parametrize("cmd", [("queue", "mm1"), ("queue", "mmc"), ("queue", "little"), ("batch",),
                                 ("cost", "replicas"), ("stability",), ("simulate",), ("sweep",), ("capacity",)])
def test_a_bare_arrival_rate_is_rate_everywhere(cmd):
    text = help_of(*cmd)
    assert "--rate" in text and "--lam " not in text


def test_old_rate_name_still_works():
    new = run_cli("queue", "mm1", "--rate", "0.5", "--mu", "1", "--json")
    old = run_cli("queue", "mm1", "--lam", "0.5", "--mu", "1", "--json")
    assert new[0] == old[0] == 0 and json.loads(new[1]) == json.loads(old[1])
    code, _, err = run_cli("queue", "mm1", "--rate", "-1", "--mu", "1")
    assert code == 2 and err.startswith("llmqueue: error: --rate:")


def test_simulate_takes_a_rate_and_length_flags_that_cannot_be_taken_for_files():
    code, out, err = run_cli("simulate", "--rate", "7", "--prompt-len", "fixed:5", "--output-len", "fixed:5",
                             "--duration", "600", "--step-time", "0.01", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["arrival_rate"] == pytest.approx(7, rel=0.1)
    # --rate rescales a given process, keeping its shape (a gamma stays a gamma)
    code, out, err = run_cli("simulate", "--rate", "7", "--arrival", "gamma:2:cv=3", "--prompt-len", "fixed:5",
                             "--output-len", "fixed:5", "--duration", "4000", "--step-time", "0.01", "--json")
    assert code == 0, err
    assert json.loads(out)["arrival_rate"] == pytest.approx(7, rel=0.15)
    text = help_of("simulate")
    assert "--prompt-len" in text and "--output-len" in text
    assert "--prompt " not in text and "--output " not in text  # the old names are not offered
    # ... but still accepted
    code, _, err = run_cli("simulate", "--rate", "2", "--prompt", "fixed:5", "--output", "fixed:5",
                           "--duration", "50", "--step-time", "0.01")
    assert code == 0, err
    # an error names the flag by its new name
    code, _, err = run_cli("simulate", "--rate", "2", "--prompt-len", "zipf:3", "--output-len", "fixed:5",
                           "--duration", "50", "--step-time", "0.01")
    assert code == 2 and err.startswith("llmqueue: error: --prompt-len:")


@pytest.mark.parametrize("cmd", [("report",), ("calibrate",), ("workload", "fit"), ("workload", "convert"),
                                 ("simulate",), ("sweep",), ("bench",)])
def test_every_output_path_is_out(cmd):
    text = help_of(*cmd)
    assert "--out" in text and "--output " not in text


def test_old_output_flag_still_writes(tmp_path):
    out = tmp_path / "fig.html"
    code, _, err = run_cli("report", "--batch-figure", "--output", out)
    assert code == 0, err
    assert out.is_file()


def test_stability_and_simulate_share_the_chunk_default():
    from llmqueue.knobs import BY_NAME

    text = help_of("stability")
    assert f"[default: {BY_NAME['max_num_batched_tokens'].default}]" in " ".join(text.split())


def test_scenario_slos_are_milliseconds_with_the_unit_in_the_name(tmp_path):
    from llmqueue.scenario import load_scenario

    base = yaml.safe_load(open(_example("chat")))
    assert "ttft_ms" in base["slos"]  # the shipped examples use milliseconds
    ms = tmp_path / "ms.yaml"
    ms.write_text(yaml.safe_dump({**base, "slos": {"ttft_ms": {"p99": 2000}, "tpot_ms": {"p99": 50}}}))
    sec = tmp_path / "s.yaml"
    sec.write_text(yaml.safe_dump({**base, "slos": {"ttft": {"p99": 2.0}, "tpot": {"p99": 0.05}}}))
    a, b = load_scenario(ms), load_scenario(sec)
    sa = [(s.metric, s.percentile, s.max_s) for c in a.mix for s in c.slos]
    sb = [(s.metric, s.percentile, s.max_s) for c in b.mix for s in c.slos]
    assert sa == [(m, p, pytest.approx(v)) for m, p, v in sb]
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump({**base, "slos": {"ttft_ms": {"p99": 2000}, "ttft": {"p99": 2.0}}}))
    from llmqueue.errors import InputError

    with pytest.raises(InputError, match="ttft.*given twice"):
        load_scenario(both)


def _example(name):
    from importlib.resources import files

    return files("llmqueue.scenario") / "examples" / f"{name}.yaml"
