"""``llmqueue scenario check`` and ``llmqueue scenario list``: summaries, JSON, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from _cli import run_cli

from llmqueue.scenario import example_names, example_path

GOOD = {
    "name": "mine",
    "workload": {"arrival": "poisson:4", "classes": [
        {"name": "chat", "share": 0.75, "prompt": "uniform:10:1600", "output": "uniform:10:600"},
        {"name": "batch", "share": 0.25, "prompt": "fixed:3000", "output": "fixed:500", "priority": 1}]},
    "deployment": {"model": "llama-2-7b", "gpu": "a100-80gb", "max_model_len": 4096, "scheduling_policy": "priority"},
    "slos": {"ttft": {"p99": 2}},
    "run": {"duration_s": 60},
}


def _write(tmp_path, doc, name="s.yaml"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return str(p)


def test_list():
    code, out, _ = run_cli("scenario", "list")
    assert code == 0
    for name in ("chat", "code", "rag", "summarization"):
        assert name in out
    code, out, _ = run_cli("scenario", "list", "--json")
    rows = json.loads(out)["examples"]
    assert [r["name"] for r in rows] == example_names()
    assert all(r["description"] and r["path"].endswith(".yaml") for r in rows)


@pytest.mark.parametrize("name", example_names())
def test_check_every_example_by_name(name):
    code, out, err = run_cli("scenario", "check", name)
    assert code == 0, err
    assert "KV capacity M" in out and "classes" in out and "run" in out
    code, out, err = run_cli("scenario", "check", name, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["name"] == name and d["deployment"]["M"] > 0 and d["classes"]


def test_check_a_file_table_and_json(tmp_path):
    from llmqueue.hardware import kv_capacity

    path = _write(tmp_path, GOOD)
    code, out, err = run_cli("scenario", "check", path)
    assert code == 0, err
    M = kv_capacity("llama-2-7b", "a100-80gb").M
    assert f"{M:,}" in out and "chat" in out and "batch" in out and "p99 ttft <= 2 s" in out
    code, out, _ = run_cli("scenario", "check", path, "--json")
    d = json.loads(out)
    assert d["deployment"]["M"] == M == 119_696  # Llama-2-7B on an A100 80GB at 0.9 (hardware docstring)
    assert d["workload"]["rate"] == 4 and [c["rate"] for c in d["classes"]] == [3, 1]
    assert d["slos"]["batch"] == [{"metric": "ttft", "percentile": 99.0, "max_s": 2.0}]
    assert d["source"] == path


def _bad(mutate):
    import copy

    d = copy.deepcopy(GOOD)
    mutate(d)
    return d


BAD = [
    ("unknown key", _bad(lambda d: d["deployment"].update(max_num_seq=8)), "deployment.max_num_seq: unknown key"),
    ("bad spec", _bad(lambda d: d["workload"]["classes"][1].update(prompt="uniform:10")),
     "workload.classes[1].prompt: cannot parse 'uniform:10'"),
    ("zero max_num_seqs", _bad(lambda d: d["deployment"].update(max_num_seqs=0)), "deployment.max_num_seqs: must be >= 1 (got 0)"),
    ("unknown gpu", _bad(lambda d: d["deployment"].update(gpu="h900")), "deployment.gpu: unknown GPU 'h900'"),
    ("negative duration", _bad(lambda d: d["run"].update(duration_s=-1)), "run.duration_s: must be > 0 (got -1)"),
    ("missing section", _bad(lambda d: d.pop("deployment")), "deployment: missing required section"),
    ("not yaml", "workload: [poisson\n  deployment: {\n", "invalid YAML at line"),
    ("duplicate key", "run: {duration_s: 1}\nrun: {duration_s: 2}\n", "invalid YAML at line 2, column 1: key 'run' is given twice"),
    ("a list", "- 1\n- 2\n", "must hold a mapping"),
]


@pytest.mark.parametrize("what,doc,expected", BAD, ids=[b[0] for b in BAD])
def test_check_errors_are_one_line_with_exit_code_2(tmp_path, what, doc, expected):
    path = _write(tmp_path, doc)
    code, out, err = run_cli("scenario", "check", path)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error: ")
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err


def test_missing_file_and_unknown_example(tmp_path):
    code, _, err = run_cli("scenario", "check", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such scenario file" in err and "chat" in err
    code, _, err = run_cli("scenario", "check", "nope")
    assert code == 2 and err.startswith("llmqueue: error: nope: no such scenario file")


def test_end_to_end_in_a_subprocess(tmp_path):
    """The installed entry point: a malformed file gives one line on stderr and exit code 2."""
    path = _write(tmp_path, _bad(lambda d: d["deployment"].update(max_num_seqs=0)))
    p = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "scenario", "check", path],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "llmqueue: error: deployment.max_num_seqs: must be >= 1 (got 0)\n"
    p = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "scenario", "check", str(example_path("chat"))],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "llama-3.1-8b" in p.stdout
