"""Tests of ``llmqueue queue``: the classic-model subcommands, their tables, JSON and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _cli import run_cli

from llmqueue.theory import classic


def run(*args):
    return run_cli("queue", *args)


def run_json(*args):
    code, out, err = run(*args, "--json")
    assert code == 0, err
    assert err == ""
    return json.loads(out)


@pytest.mark.parametrize("args,ref", [
    (["mm1", "--lam", "8", "--mu", "10"], lambda: classic.mm1(lam=8, mu=10)),
    (["md1", "--lam", "8", "--mu", "10"], lambda: classic.md1(lam=8, mu=10)),
    (["mg1", "--lam", "8", "--mu", "10", "--scv-s", "0.5"], lambda: classic.mg1(lam=8, mu=10, scv_s=0.5)),
    (["mmc", "--lam", "2", "--mu", "1", "--c", "3"], lambda: classic.mmc(lam=2, mu=1, c=3)),
    (["mmck", "--lam", "12", "--mu", "10", "--c", "1", "--K", "5"], lambda: classic.mmck(lam=12, mu=10, c=1, K=5)),
    (["gg1", "--lam", "8", "--mu", "10", "--scv-a", "2", "--scv-s", "0.5"],
     lambda: classic.gg1_kingman(lam=8, mu=10, scv_a=2, scv_s=0.5)),
    (["ggc", "--lam", "2", "--mu", "1", "--c", "3", "--scv-a", "1.5", "--scv-s", "0"],
     lambda: classic.ggc_allen_cunneen(lam=2, mu=1, c=3, scv_a=1.5, scv_s=0)),
])
def test_json_matches_library(args, ref):
    d = run_json(*args)
    assert d == pytest.approx(json.loads(json.dumps(ref().to_dict())))
    assert d["stable"] is True


def test_mm1_json_textbook():
    d = run_json("mm1", "--lam", "8", "--mu", "10")
    assert d["rho"] == pytest.approx(0.8)
    assert d["L"] == pytest.approx(4.0)
    assert d["W"] == pytest.approx(0.5)
    assert d["Wq"] == pytest.approx(0.4)


def test_mmc_json_textbook():
    d = run_json("mmc", "--lam", "2", "--mu", "1", "--c", "3")
    assert d["P_wait"] == pytest.approx(4 / 9)
    assert d["Lq"] == pytest.approx(8 / 9)
    assert d["Wq"] == pytest.approx(4 / 9)
    assert d["W_p99"] > d["W_p95"] > d["W_p90"] > d["W_p50"] > 0


def test_mmck_json_overloaded_is_fine():
    d = run_json("mmck", "--lam", "12", "--mu", "10", "--c", "1", "--K", "5")
    assert d["P_block"] == pytest.approx(-0.2 * 1.2**5 / (1 - 1.2**6))  # M/M/1/K closed form
    assert d["lam_eff"] == pytest.approx(12 * (1 - d["P_block"]))


def test_scv_defaults_to_one():
    d = run_json("gg1", "--lam", "8", "--mu", "10")
    assert d["scv_a"] == 1 and d["scv_s"] == 1 and d["exact"] is True
    assert d["Wq"] == pytest.approx(0.4)


@pytest.mark.parametrize("args,expect", [
    (["mm1", "--lam", "8", "--mu", "10"], ["M/M/1", "rho (utilization)", "0.8", "W p99 (s)", "2.303"]),
    (["md1", "--lam", "8", "--mu", "10"], ["M/D/1", "Wq (mean wait, s)", "0.2"]),
    (["mg1", "--lam", "8", "--mu", "10", "--scv-s", "0"], ["Pollaczek-Khinchine", "0.2"]),
    (["mmc", "--lam", "2", "--mu", "1", "--c", "3"], ["M/M/3", "Erlang C", "0.4444", "0.8889"]),
    (["mmck", "--lam", "2", "--mu", "1", "--c", "3", "--K", "3"], ["M/M/3/3", "P_block", "0.2105"]),
    (["gg1", "--lam", "8", "--mu", "10", "--scv-a", "2"], ["Kingman", "0.6", "exact"]),
    (["ggc", "--lam", "2", "--mu", "1", "--c", "3"], ["Allen-Cunneen", "0.4444"]),
    (["little", "--lam", "900", "--W", "0.12"], ["Little", "108"]),
])
def test_tables(args, expect):
    code, out, err = run(*args)
    assert code == 0, err
    assert err == ""
    for s in expect:
        assert s in out, (s, out)


def test_unstable_is_one_line_exit_2():
    code, out, err = run("mm1", "--lam", "12", "--mu", "10")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("llmqueue: error:")
    assert "unstable" in lines[0] and "--rate" in lines[0]


@pytest.mark.parametrize("args", [
    ["md1", "--lam", "10", "--mu", "10"],
    ["mg1", "--lam", "10", "--mu", "5", "--scv-s", "0.2"],
    ["mmc", "--lam", "3", "--mu", "1", "--c", "3"],
    ["gg1", "--lam", "3", "--mu", "1"],
    ["ggc", "--lam", "30", "--mu", "1", "--c", "3", "--json"],
])
def test_unstable_other_models(args):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "unstable" in err


@pytest.mark.parametrize("args,flag", [
    (["mm1", "--lam", "-1", "--mu", "10"], "--rate"),
    (["mm1", "--lam", "0", "--mu", "10"], "--rate"),
    (["mm1", "--lam", "nan", "--mu", "10"], "--rate"),
    (["md1", "--lam", "1", "--mu", "0"], "--mu"),
    (["mg1", "--lam", "1", "--mu", "2", "--scv-s", "-1"], "--scv-s"),
    (["mg1", "--lam", "1", "--mu", "2", "--scv-s", "nan"], "--scv-s"),
    (["gg1", "--lam", "1", "--mu", "2", "--scv-a", "-0.5"], "--scv-a"),
    (["mmc", "--lam", "1", "--mu", "2", "--c", "0"], "--c"),
    (["mmck", "--lam", "1", "--mu", "2", "--c", "3", "--K", "2"], "--K"),
    (["ggc", "--lam", "1", "--mu", "2", "--c", "-2"], "--c"),
])
def test_bad_input_names_the_flag(args, flag):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"llmqueue: error: {flag}:"), lines[0]


@pytest.mark.parametrize("args", [
    ["mm1", "--mu", "10"],  # --lam missing
    ["mmck", "--lam", "1", "--mu", "2", "--c", "3"],  # --K missing
    ["mmc", "--lam", "1", "--mu", "2", "--c", "2.5"],  # not a whole number
])
def test_usage_errors_exit_2(args):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("llmqueue: error:")


def test_subprocess_unstable_no_traceback():
    p = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", "queue", "mm1", "--lam", "12", "--mu", "10"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stdout == ""
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert "unstable" in p.stderr


def test_help_lists_subcommands():
    code, out, _ = run("--help")
    assert code == 0
    for name in ("little", "mm1", "md1", "mg1", "mmc", "mmck", "gg1", "ggc"):
        assert name in out


def test_queue_module_imports_theory_lazily():
    code = ("import sys, llmqueue.cli.queue_cmd; "
            "print('llmqueue.theory.classic' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
