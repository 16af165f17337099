"""Every run is bounded: what cannot finish on the machine is refused up front in one line (exit 2),
and Ctrl-C ends any command in one line (exit 130) keeping what was written.

Each command runs in its own process with a timeout, so a hang fails its row instead of blocking
the suite. The rows are the unbounded runs found in the issue tracker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEED004 = ["--capacity-tokens", "131000", "--step-time", "0.0372", "--prompt", "uniform:10:1600",
           "--output", "uniform:10:1600"]
# a child with Ctrl-C's default behaviour even when the test runner was started with SIGINT ignored
_MAIN = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from llmqueue.cli.main import main; sys.exit(main(sys.argv[1:]))")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(args, timeout=30, cwd=None):
    return subprocess.run([sys.executable, "-c", _MAIN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=cwd)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """A 2,000-request CSV trace spanning about 1,000 s."""
    import numpy as np

    t = np.cumsum(np.random.default_rng(0).exponential(0.5, 2000))
    p = tmp_path_factory.mktemp("bounds") / "trace.csv"
    p.write_text("timestamp,prompt_tokens,output_tokens\n" + "".join(f"{x:.3f},100,50\n" for x in t))
    return p


REFUSED = [
    # (id, args, the flag named, a fragment of the estimate)
    ("simulate-duration-1e12", ["simulate", *SEED004, "--arrival", "poisson:1", "--duration", "1e12"],
     "--duration", "requests would arrive"),
    ("simulate-rate-1e9", ["simulate", *SEED004, "--arrival", "poisson:1e9", "--duration", "10"],
     "--duration", "requests would arrive"),
    ("simulate-num-requests-1e12", ["simulate", *SEED004, "--arrival", "poisson:1", "--num-requests", str(10**12)],
     "--num-requests", "more than the 3,000,000"),
    ("simulate-sample-dt-1e-6", ["simulate", *SEED004, "--arrival", "poisson:1", "--duration", "100",
                                 "--sample-dt", "1e-6"], "--sample-dt", "samples over"),
    ("simulate-rate-1e-300", ["simulate", *SEED004, "--arrival", "poisson:1e-300", "--num-requests", "10"],
     "--arrival", "a simulated clock resolves"),
    ("simulate-rate-1e-300-sparse-samples", ["simulate", *SEED004, "--arrival", "poisson:1e-300", "--num-requests",
                                             "10", "--sample-dt", "1e300"], "--arrival", "a simulated clock resolves"),
    ("simulate-long-idle-series", ["simulate", *SEED004, "--arrival", "poisson:1e-4", "--duration", "1e9"],
     "--sample-dt", "give --sample-dt 220 or more"),
    ("sweep-duration-1e9", ["sweep", *SEED004, "--arrival", "poisson:1", "--rates", "1,2", "--duration", "1e9",
                            "--backend", "serial"], "--duration", "at rate=1.0"),
    ("capacity-duration-1e9", ["capacity", *SEED004, "--arrival", "poisson:1", "--duration", "1e9",
                               "--slo-ttft-ms", "1000", "--backend", "serial"], "--duration", "requests would arrive"),
    ("report-seed004-duration-1e9", ["report", "--seed004-figure2", "--duration", "1e9", "-o", "r.html"],
     "--duration", "(50 req/s x 1e+09 s)"),
    ("report-seed004-duration-1e6", ["report", "--seed004-figure2", "--duration", "1e6", "-o", "r.html"],
     "--duration", "(50 req/s x 1e+06 s)"),  # the largest rate is checked before any is simulated
    ("queue-mmc-c-1e9", ["queue", "mmc", "--lam", "1", "--mu", "2", "--c", "1000000000"], "--c", "1,000,000"),
    ("queue-mmck-K-1e8", ["queue", "mmck", "--lam", "1", "--mu", "2", "--c", "1", "--K", "100000000"], "--K",
     "1,000,000"),
    ("batch-b-max-1e7", ["batch", "--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--b-max", "10000000"],
     "--b-max", "1,666,667 candidate batch sizes"),
    ("workload-stats-bins-1e-9", ["workload", "stats", "{trace}", "--bins", "1e-9"], "--bins", "bins over the"),
    ("workload-fit-window-1e-9", ["workload", "fit", "{trace}", "--window-s", "1e-9", "-o", "fit.yaml"],
     "--window-s", "windows over the"),
    ("workload-convert-loop-1e9", ["workload", "convert", "{trace}", "--loop", "1000000000", "-o", "loop.parquet"],
     "--loop", "give --loop 15,000 or fewer"),
]


@pytest.mark.parametrize("args, flag, fragment", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_an_unbounded_run_is_refused_in_one_line(args, flag, fragment, trace, tmp_path):
    args = [str(trace) if a == "{trace}" else a for a in args]
    t0 = time.perf_counter()
    r = _run(args, cwd=tmp_path)
    assert time.perf_counter() - t0 < 30  # a refusal, not a run (under 1 s alone; a guard beside busy processes)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"llmqueue: error: {flag}"), r.stderr[-2000:]
    assert fragment in lines[0]
    assert "Traceback" not in r.stderr


LIMITS_KEPT = [
    # the largest accepted values still run (the limits are not below realistic use)
    ("queue-mmc-c-1e6", ["queue", "mmc", "--lam", "1", "--mu", "2", "--c", "1000000"]),
    ("queue-mmck-K-1e6", ["queue", "mmck", "--lam", "1", "--mu", "2", "--c", "1", "--K", "1000000"]),
    ("batch-b-max-at-limit", ["batch", "--lam", "100", "--t-fixed-ms", "50", "--t-req-ms", "0.5", "--b-max", "119994"]),
    ("capacity-unreachable-slo", ["capacity", *SEED004, "--arrival", "poisson:1", "--num-requests", "300",
                                  "--slo-ttft-ms", "1", "--backend", "serial"]),
]


@pytest.mark.parametrize("args", [r[1] for r in LIMITS_KEPT], ids=[r[0] for r in LIMITS_KEPT])
def test_the_largest_accepted_runs_finish(args, tmp_path):
    r = _run(args, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


def test_capacity_with_an_unreachable_slo_ends_with_no_rate():
    """Was a hang: the search lowers the rate to a thousandth of the first, and at those rates a
    fixed number of requests spans days of idle time, which the simulator used to pay step by step."""
    r = _run(["capacity", *SEED004, "--arrival", "poisson:1", "--num-requests", "300", "--slo-ttft-ms", "1",
              "--backend", "serial", "--json"], timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    d = json.loads(r.stdout)
    assert d["rate"] is None and min(e["rate"] for e in d["evaluations"]) <= 1e-3


def _interrupt(args, tmp_path, after_s):
    p = subprocess.Popen([sys.executable, "-c", _MAIN, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path, start_new_session=True)
    try:
        time.sleep(after_s)
        assert p.poll() is None, "the command ended before the interrupt: make it longer"
        os.killpg(p.pid, signal.SIGINT)  # as Ctrl-C does: the whole process group (sweep workers too)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p.returncode, err


LONG = ["--step-time", "linear:c0=0.03:decode=1e-5", "--capacity-tokens", "131000", "--prompt", "uniform:10:1600",
        "--output", "uniform:10:1600"]


def test_ctrl_c_on_simulate_is_one_line(tmp_path):
    rc, err = _interrupt(["simulate", *LONG, "--arrival", "poisson:3", "--duration", "900000", "--out", "run"],
                         tmp_path, after_s=3)
    assert rc == 130
    # issue 37: an interrupted simulation writes what it simulated (the run folder's five files)
    assert err.strip().splitlines() == ["llmqueue: interrupted; kept run/ (5 files written)"]


def test_ctrl_c_on_sweep_is_one_line_and_keeps_the_finished_points(tmp_path):
    """Two quick points finish, two long ones are running on the process pool: the line names the
    cached points, they stay, and no worker prints a traceback."""
    rc, err = _interrupt(["sweep", *LONG, "--arrival", "poisson:1", "--rates", "0.01,0.02,3,3.1", "--duration",
                          "900000", "--sample-dt", "100", "--out", "sw", "--workers", "2", "--no-progress"],
                         tmp_path, after_s=8)
    assert rc == 130
    lines = err.strip().splitlines()
    points = list((tmp_path / "sw" / "points").glob("*.json"))
    assert len(points) == 2
    assert lines == ["llmqueue: interrupted; kept sw/ (2 files written)"]
