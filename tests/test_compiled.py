"""The compiled build (mypyc, llmqueue/compiled.py): the same records as the source, the fall back
to source when a compiled module is stale, and (in CI) that the build really is compiled."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import pyarrow.parquet as pq

from llmqueue import compiled

# single replicas and fleets through the user's command: KV-bound preemption (seed 004's 1:1 at 3x),
# a linear step, prefix caching (rag), P/D, lanes with a fallback pool, an autoscaled spike, routers
CASES = {
    "seed004-3x": ["--capacity-tokens", "131000", "--max-num-batched-tokens", "512", "--step-time", "0.0372",
                   "--arrival", "poisson:9.8", "--prompt", "uniform:10:1600", "--output", "uniform:10:1600",
                   "--duration", "90"],
    "seed004-3x-linear": ["--capacity-tokens", "131000", "--max-num-batched-tokens", "512",
                          "--step-time", "linear:c0=0.02:prefill=1e-6:decode=4e-5", "--arrival", "poisson:9.8",
                          "--prompt", "uniform:10:1600", "--output", "uniform:10:1600", "--duration", "60"],
    "chat-noise-sjf": ["--scenario", "chat", "--step-time", "linear:c0=0.01:decode=1e-4:noise=gamma:cv=0.5",
                       "--policy", "sjf", "--duration", "60"],
    "rag-prefix": ["--scenario", "rag", "--duration", "60"],
    "pd": ["--scenario", "pd", "--duration", "30"],
    "lanes": ["--scenario", "lanes", "--duration", "30"],
    "noon-spike": ["--scenario", "noon-spike", "--duration", "120"],
    "jsq-8": ["--scenario", "chat", "--replicas", "8", "--router", "jsq", "--arrival", "poisson:60", "--duration", "30"],
    "p2c-kv-bound": ["--replicas", "4", "--router", "power-of-two", "--capacity-tokens", "20000",
                     "--max-num-batched-tokens", "512", "--step-time", "0.03", "--arrival", "poisson:12",
                     "--prompt", "uniform:10:1600", "--output", "uniform:10:800", "--duration", "60"],
}


def _digest(out: Path) -> dict:
    """SHA-256 of every records file's columns (floats rounded to 1e-9 s, far below a step)."""
    d = {}
    for f in sorted(out.rglob("*.parquet")):
        t = pq.read_table(f)
        h = hashlib.sha256()
        for name in t.column_names:
            a = t.column(name).to_numpy(zero_copy_only=False)
            if a.dtype.kind == "f":
                a = np.round(a, 9)
            h.update(name.encode())
            h.update(np.asarray(a).astype(str).tobytes() if a.dtype.kind == "O" else np.ascontiguousarray(a).tobytes())
        d[str(f.relative_to(out))] = h.hexdigest()
    return d


def _run(tmp: Path, case: str, pure: bool) -> dict:
    out = tmp / ("pure" if pure else "compiled") / case
    env = dict(os.environ)
    env.pop(compiled.PURE_ENV, None)
    if pure:
        env[compiled.PURE_ENV] = "1"
    cmd = [sys.executable, "-c", "import sys; from llmqueue.cli.main import main; sys.exit(main())", "simulate",
           *CASES[case], "--seed", "3", "--warmup", "5", "--out", str(out), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return _digest(out)


def test_build_status_is_reported():
    s = compiled.status()
    assert s == "compiled" or s.startswith("source: ")
    assert compiled.is_compiled() == (s == "compiled")
    if os.environ.get("LLMQUEUE_REQUIRE_COMPILED"):  # CI: the build must have compiled
        assert s == "compiled", s


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_and_source_give_the_same_records(case, tmp_path):
    if not compiled.is_compiled():
        pytest.skip(f"this install runs from source ({compiled.status()}): nothing compiled to compare")
    a = _run(tmp_path, case, pure=False)
    b = _run(tmp_path, case, pure=True)
    assert a and a.keys() == b.keys()
    assert a == b


def test_pure_python_env_loads_every_compiled_module_from_source():
    code = ("import json, importlib, llmqueue, llmqueue.compiled as c\n"
            "mods = [importlib.import_module(m) for m in c.COMPILED_MODULES]\n"
            "print(json.dumps([c.status(), c.is_compiled(), [m.__file__ for m in mods]]))")
    env = dict(os.environ, **{compiled.PURE_ENV: "1"})
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    status, is_c, files = json.loads(p.stdout)
    assert not is_c and status.startswith("source: ")
    assert all(f.endswith(".py") for f in files), files


def _fake_package(root: Path, hashes_match: bool) -> None:
    for m in compiled.COMPILED_MODULES:
        p = compiled.source_path(m, root)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {m}\n")
        p.with_suffix(".cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    h = compiled.source_hashes(root)
    if not hashes_match:
        h["llmqueue.engine.fast.replica"] = "0" * 64
    (root / compiled.HASH_FILE).write_text(json.dumps(h))


@pytest.mark.parametrize("match", [True, False])
def test_a_stale_build_falls_back_to_source(tmp_path, monkeypatch, match):
    monkeypatch.setattr(compiled, "_ROOT", tmp_path)
    monkeypatch.setattr(compiled.importlib.machinery, "EXTENSION_SUFFIXES", [".cpython-311-x86_64-linux-gnu.so"])
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    _fake_package(tmp_path, hashes_match=match)
    s = compiled._decide()
    assert s == "compiled" if match else s.startswith("source: replica changed since the build"), s
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    assert compiled._decide().startswith("source: ")
    (tmp_path / compiled.HASH_FILE).unlink()
    monkeypatch.delenv(compiled.PURE_ENV)
    assert "missing" in compiled._decide()
