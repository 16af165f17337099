"""A benchmark killed outright (SIGKILL) leaves only the journals of its records (no
``requests.parquet``, no ``summary.json``): ``report``, ``calibrate`` and ``validate`` read it through
the one run reader (:func:`llmqueue.records.read_run`) and say so in a note (issue 37, item 2)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import pytest
from _cli import run_cli

from llmqueue.bench.stub_server import StubServer

ENGINE = ("--max-num-seqs", "8", "--max-num-batched-tokens", "512", "--capacity-tokens", "20000")
NOTE = "read from the journals of a run killed before its end"


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A bench run killed by SIGKILL once records reached its journal, and a calibration of it."""
    base = tmp_path_factory.mktemp("killed")
    out_dir = base / "run"
    with StubServer(token_delay_s=0.01) as s:
        p = subprocess.Popen([sys.executable, "-m", "llmqueue.cli.main", "bench", "--url", s.url, "--model", "m",
                              "--arrival", "poisson:20", "--prompt", "fixed:8", "--output", "fixed:8",
                              "--duration", "30", "--seed", "2", "--out", str(out_dir), "--no-progress"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        journal = out_dir / "requests.parquet.journal"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not journal.exists() or journal.stat().st_size < 6000):
            time.sleep(0.1)
        p.kill()
        _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL, err
    assert not (out_dir / "requests.parquet").exists() and not (out_dir / "summary.json").exists()
    cal = base / "cal.yaml"
    code, _, err = run_cli("calibrate", str(out_dir), "-o", str(cal), *ENGINE)
    assert code == 0, err
    return out_dir, cal


CASES = [
    ("report", lambda run, cal, tmp: ("report", run, "-o", f"{tmp}/r.html", "--no-progress")),
    ("calibrate", lambda run, cal, tmp: ("calibrate", run, "-o", f"{tmp}/c.yaml", *ENGINE)),
    ("validate", lambda run, cal, tmp: ("validate", run, "--calibration", cal, "--no-progress")),
]


@pytest.mark.parametrize("name,argv", [pytest.param(n, a, id=n) for n, a in CASES])
def test_a_killed_bench_run_is_read_from_its_journals(killed, tmp_path, name, argv):
    run = tmp_path / "run"
    shutil.copytree(killed[0], run)
    code, out, err = run_cli(*(str(x) for x in argv(run, killed[1], tmp_path)))
    assert code == 0, err
    assert NOTE in out + err and "requests.parquet.journal" in out + err
    assert "no summary.json" in out + err
    assert not (run / "requests.parquet").exists()  # read, not rewritten
