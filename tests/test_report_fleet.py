"""The fleet's part of the report and of simulate's printed summary, on the hand-built fleet run
(tests/_fleet_fixture.py) written as run directories."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from _cli import run_cli
from _fleet_fixture import HORIZON, SPIKE, fleet_run, pool_columns
from llmqueue.metrics import summarize
from llmqueue.metrics.fleet import fleet_summary
from llmqueue.records import PoolSeries, write_run

FLEET_TITLES = ("Replicas over time", "Queue depth per pool and class", "Spike recovery")


def fleet_dir(d: Path, *, pools=True, spike=SPIKE, delay: float = 0.0) -> Path:
    req, ts, ps = fleet_run(optional=pools)
    if delay:  # another autoscaler: the third replica serves later
        cols = pool_columns()
        late = (cols["pool"] == "main") & (cols["t_s"] >= 230) & (cols["t_s"] < 230 + delay)
        cols["replicas"] = np.where(late, 2, cols["replicas"])
        cols["provisioning"] = np.where(late, 1, cols["provisioning"])
        ps = PoolSeries.from_columns(cols)
    s = summarize(req, timeseries=ts, horizon_s=HORIZON)
    if pools:
        s["fleet"] = fleet_summary(req, ps, horizon_s=HORIZON, spike=spike, pool_costs={"main": 4.0, "fallback": 1.0},
                                   pool_quality={"main": 1.0, "fallback": 0.7})
    write_run(d, requests=req, timeseries=ts, pools=ps if pools else None, summary=s)
    return d


def report(args) -> str:
    code, out, err = run_cli("report", *args)
    assert code == 0, (out, err)
    out = Path(args[args.index("-o") + 1])
    return out.read_text()


def test_fleet_run_report_has_the_fleet_panels(tmp_path):
    d = fleet_dir(tmp_path / "fleet")
    html = report([d, "-o", tmp_path / "r.html"])
    for title in FLEET_TITLES:
        assert title in html
    assert 'id="fig-replicas"' in html and 'id="fig-pool_queues"' in html and 'id="fig-recovery"' in html
    assert "Spike recovery: main 41 s, fallback not recovered by the end" in html  # the times in the title
    assert "not recovered by the end" in html  # the fallback pool's row in the fleet table
    assert "pool main" in html and "attempts per user request" in html
    pngs = {p.name for p in (tmp_path / "r_png").iterdir()}
    assert {"replicas.png", "recovery.png"} <= pngs


def test_a_run_without_pools_series_has_no_fleet_panels(tmp_path):
    d = fleet_dir(tmp_path / "plain", pools=False)
    html = report([d, "-o", tmp_path / "r.html"])
    for title in FLEET_TITLES:
        assert title not in html
    assert 'id="fleet"' not in html and not (tmp_path / "r_png" / "replicas.png").exists()


def test_fleet_run_without_a_spike_has_no_recovery_panel(tmp_path):
    d = fleet_dir(tmp_path / "nospike", spike=None)
    html = report([d, "-o", tmp_path / "r.html"])
    assert "Replicas over time" in html and "Spike recovery" not in html


def test_comparison_overlays_the_runs_by_directory_name(tmp_path):
    dirs = [fleet_dir(tmp_path / f"delay-{m}min", delay=60.0 * m) for m in (0, 2, 5)]
    dirs.append(fleet_dir(tmp_path / "none", pools=False))
    html = report([*dirs, "-o", tmp_path / "cmp.html"])
    for title in FLEET_TITLES:
        assert html.count(f"{title}") >= 1
    for name in ("delay-0min", "delay-2min", "delay-5min", "none"):
        assert name in html
    assert "serving (delay-2min)" in html and "Waiting requests over time" in html
    assert "left out of the fleet figures: none" in html
    assert "delay-5min: main 41 s, fallback not recovered by the end" in html  # each run in the title
    assert html.count('id="fig-replicas"') == 1


def test_comparison_errors(tmp_path):
    a, b = fleet_dir(tmp_path / "a"), fleet_dir(tmp_path / "b")
    ran = run_cli("report", str(a), str(b), "--compare", str(a), "-o", str(tmp_path / "x.html"))
    assert ran.code == 2
    assert "compare" in ran.err


def test_simulate_prints_the_fleet_tables(capsys):
    from llmqueue.cli.simulate_cmd import print_report

    req, ts, ps = fleet_run()
    s = summarize(req, timeseries=ts, horizon_s=HORIZON)
    print_report(s, {}, None)
    plain = capsys.readouterr().out
    assert "Fleet" not in plain and "recovery" not in plain
    s["fleet"] = fleet_summary(req, ps, horizon_s=HORIZON, spike=SPIKE, pool_costs={"main": 4.0})
    print_report(s, {}, None)
    out = capsys.readouterr().out
    assert out.startswith(plain.rstrip("\n").split("\n")[0])
    assert "Fleet: per pool" in out and "Fleet: per class" in out
    assert re.search(r"recovery after the spike \[200, 260\] s: main\s+41 s", out)
    assert "not recovered by the end" in out and "pools without a price left out" in out
