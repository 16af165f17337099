"""Ctrl-C on ``simulate`` and ``profile`` (issue 37, item 3).

``simulate``: the run stops between two engine steps; its records (whole up to the simulated time
``t`` it reached: the requests still in the system ``unfinished``) and a summary marked
"interrupted at simulated t = ..." are kept, and the command exits 130. ``profile``: exits 130 and
keeps the raw records of the levels it ran, without writing a step-time model from a partial
ladder. In a subprocess (SIGINT once the progress bar shows), and in-process (the interrupt
already asked: the run stops at its first progress check).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from llmqueue.bench.stub_server import StubServer
from llmqueue.records import read_run

ENGINE = ["--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512"]
LONG = ["--prompt", "uniform:10:1600", "--output", "uniform:10:1600", "--arrival", "poisson:50",
        "--duration", "40000", "--seed", "1"]

SIM_CASES = [
    ("one replica", [*ENGINE, *LONG]),
    ("three replicas", [*ENGINE, *LONG, "--replicas", "3", "--router", "jsq"]),
    ("early stop", [*ENGINE, *LONG, "--early-stop"]),
]


def _until(p: subprocess.Popen, marker: bytes, limit_s: float = 60.0) -> bytes:
    """Read ``p``'s stderr until ``marker`` shows (a progress bar writes no newline)."""
    seen = b""
    deadline = time.monotonic() + limit_s
    fd = p.stderr.fileno()
    while marker not in seen:
        if time.monotonic() > deadline or p.poll() is not None:
            pytest.fail(f"no {marker!r} on stderr: {seen[-500:]!r}")
        seen += os.read(fd, 4096)
    return seen


def _ctrl_c(argv: list, marker: bytes, *, after_s: float, limit_s: float) -> tuple[str, str]:
    """Run ``llmqueue argv`` in a process, send SIGINT ``after_s`` after ``marker`` shows on its
    stderr; check it exits 130 in one line naming what it kept; its stdout and stderr."""
    p = subprocess.Popen([sys.executable, "-m", "llmqueue.cli.main", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        _until(p, marker)
        time.sleep(after_s)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=limit_s)
    finally:
        if p.poll() is None:
            p.kill()
    out, err = out.decode(), err.decode()
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted; kept" in err, err[-2000:]
    return out, err


def _consistent(r, t: float, stream_arrivals=None) -> None:
    """The request records ``r`` of a run stopped at ``t``: each request once, none arriving or
    finishing after the step in progress at ``t``, those not finished ``unfinished`` with no finish time."""
    ids = r["request_id"].tolist()
    assert len(ids) == len(set(ids)) and len(ids) > 0
    assert float(np.max(r["arrival_s"])) <= t
    fin = np.asarray(r["finish_s"], dtype=np.float64)
    assert np.nanmax(fin) <= t + 0.0372 + 1e-9  # a fleet's step in progress at t ends (as at a horizon)
    st = np.asarray(r["status"]).astype(str)
    assert set(st) <= {"ok", "unfinished", "rejected"} and (st == "unfinished").any()
    assert np.isnan(fin[st == "unfinished"]).all() and np.isfinite(fin[st == "ok"]).all()
    if stream_arrivals is not None:  # every request that arrived before t is there
        assert len(ids) == int((np.asarray(stream_arrivals) < t).sum()) or len(ids) == int(
            (np.asarray(stream_arrivals) <= t).sum())


@pytest.mark.parametrize("args", [pytest.param(a, id=i) for i, a in SIM_CASES])
def test_ctrl_c_on_simulate_keeps_what_it_simulated(tmp_path, args):
    out_dir = tmp_path / "sim"
    out, _ = _ctrl_c(["simulate", *args, "--out", str(out_dir), "--progress"], b"sim-s", after_s=0.5, limit_s=120)
    assert "interrupted at simulated t = " in out, out
    summary = json.loads((out_dir / "summary.json").read_text())
    t = summary["interrupted_s"]
    assert 0 < t < 40000
    assert f"interrupted at simulated t = {t:.1f} s" in summary["verdict"]
    assert any(f"interrupted at simulated t = {t:.1f} s" in n for n in summary["notes"])
    _consistent(read_run(out_dir).requests, t)
    assert summary["horizon_s"] == pytest.approx(t)


def _spec(extra):
    from llmqueue.cli.simulate_cmd import simulate
    from llmqueue.spec import spec_from_flags

    ctx = simulate.make_context("simulate", [*ENGINE, *LONG, *extra])
    flags = {k: v for k, v in ctx.params.items()
             if k not in ("scenario", "sets", "out_dir", "progress", "as_json", "margin", "speed_spread")}
    return spec_from_flags(flags, scenario=None, given=set(), sets=())


@pytest.mark.parametrize("extra", [pytest.param(a[len(ENGINE) + len(LONG):], id=i) for i, a in SIM_CASES])
def test_an_interrupted_simulation_closes_its_records_at_t(extra):
    from llmqueue.simulate import CtrlC, run_simulation

    stop = CtrlC()
    stop.asked = True  # as after a SIGINT: the run stops at its first check, between two steps
    out = run_simulation(_spec(extra), interrupt=stop)
    t = out.result.interrupted_s
    assert t is not None and 0 < t < 40000 and out.result.horizon_s == t
    assert out.summary["interrupted_s"] == t and out.summary["horizon_s"] == pytest.approx(t)
    _consistent(out.records, t, out.stream.arrival_s)


def test_ctrl_c_on_profile_exits_130_without_a_model(tmp_path):
    out_dir = tmp_path / "prof"
    with StubServer(token_delay_s=0.02) as s:
        # SIGINT once the prefill probes and the first level are done
        _ctrl_c(["profile", "--url", s.url, "--model", "m", "--out", str(out_dir), "--progress", "--budget", "120",
                 "--output-tokens", "64", "--server-max-num-seqs", "8", "--server-max-num-batched-tokens", "2048",
                 "--server-max-model-len", "4096", "--server-num-gpu-blocks", "1000", "--server-block-size", "16",
                 "--contexts", "64", "--prefill-repeats", "1"], b"context 64, batch 2", after_s=0.3, limit_s=60)
    assert not (out_dir / "profile.json").exists()
    assert (out_dir / "server.json").exists()
    assert len(read_run(out_dir / "runs" / "prefill").requests) > 0
    assert len(read_run(out_dir / "runs" / "ctx64-b1" / "pass1").requests) == 1
