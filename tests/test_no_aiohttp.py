"""aiohttp is a test dependency (``llmqueue[test]``): only the stub server uses it. The package
imports and every command runs without it; the stub says in one line how to get it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from _cli import run_cli

from llmqueue.bench.stub_server import StubServer
from llmqueue.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "import sys; sys.modules['aiohttp'] = None\n"  # `import aiohttp` then raises ImportError


def _py(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_aiohttp_is_a_test_extra_only():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("aiohttp") for d in meta["dependencies"])
    assert any(d.startswith("aiohttp") for d in meta["optional-dependencies"]["test"])


def test_every_module_imports_without_aiohttp():
    r = _py("import importlib, pkgutil, llmqueue\n"
            "names = [m.name for m in pkgutil.walk_packages(llmqueue.__path__, 'llmqueue.')]\n"
            "for n in names: importlib.import_module(n)\n"
            "print(len(names))")
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 50


def test_the_stub_says_how_to_install_aiohttp(monkeypatch):
    r = _py("from llmqueue.bench.stub_server import main; sys.exit(main(['--port', '0']))")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install llmqueue[test]" in lines[0] and "Traceback" not in r.stderr
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    with pytest.raises(InputError, match=r"pip install llmqueue\[test\]"):
        StubServer().start()


@pytest.fixture(scope="module")
def stub():
    with StubServer(token_delay_s=0.0005) as s:
        yield s


def test_commands_run_without_aiohttp(stub, tmp_path):
    """bench (with vLLM's flags and result file), capacity --url and simulate, in a process where
    aiohttp cannot be imported (the stub runs in its own process)."""
    code = ("from llmqueue.cli.main import main\n"
            "rc = [main(a) for a in json.loads(sys.argv[1])]\n"
            "sys.exit(max(rc))")
    wl = ["--prompt", "fixed:4", "--output", "fixed:2"]
    cmds = [
        ["bench", "--url", stub.url, "--request-rate", "200", "--num-prompts", "10", *wl, "--save-result",
         "--out", str(tmp_path / "b"), "--json", "--no-progress"],
        ["capacity", "--url", stub.url, "--slo-ttft-ms", "1000", "--arrival", "poisson:100", "--num-requests", "10",
         *wl, "--max-evals", "1", "--hi", "200", "--json", "--no-progress"],
        ["simulate", "--arrival", "poisson:2", *wl, "--num-requests", "50", "--step-time", "0.01",
         "--capacity-tokens", "10000", "--json"],
    ]
    r = _py("import json\n" + code, json.dumps(cmds))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "b" / "summary.json").exists() and list((tmp_path / "b").glob("openai-*.json"))


def test_help_of_every_command_without_aiohttp():
    r = _py("from llmqueue.cli.main import cli\n"
            "from click.testing import CliRunner\n"
            "bad = [n for n in cli.commands if CliRunner().invoke(cli, [n, '--help']).exit_code != 0]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_main_in_process_without_aiohttp(stub, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    assert run_cli("bench", "--url", stub.url, "--arrival", "poisson:200", "--num-requests", "5", "--prompt", "fixed:3",
                   "--output", "fixed:1", "--out", str(tmp_path / "r"), "--no-progress").code == 0
