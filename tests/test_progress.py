"""Progress bars of the long commands: one bar over the whole job, on stderr, only when asked
(``--progress``) or on a terminal. capacity's bar is tested in test_plan_capacity.py."""

from __future__ import annotations

import re

import pytest
from _cli import run_cli

from llmqueue import _progress


def frames(err: str, desc: str) -> list[tuple[float, float, str]]:
    """``(n, total, postfix)`` of each frame a tqdm bar ``desc`` drew."""
    out = []
    for part in re.split(r"[\r\n]", err):
        m = re.search(rf"{desc}:\s+\d+%\|[^|]*\| ([\d.]+)/([\d.]+) [\w-]+(?: \(estimated\))? \[[^\]]*\](?:, (.*))?",
                      part)
        if m:
            out.append((float(m.group(1)), float(m.group(2)), (m.group(3) or "").strip()))
    return out


class Recorder(_progress._Silent):
    """Stands in for a bar and keeps what it was told."""

    made: list = []

    def __init__(self, total, **kw):
        self.total, self.kw, self.seen, self.closed = total, kw, [], False
        Recorder.made.append(self)

    def update(self, n=1):
        super().update(n)
        self.seen.append(self.n)

    def close(self):
        self.closed = True


@pytest.fixture
def recorder(monkeypatch):
    Recorder.made = []
    monkeypatch.setattr(_progress, "bar", lambda total, **kw: Recorder(total, **kw))
    return Recorder.made


def test_wanted_follows_the_flag_else_the_terminal(monkeypatch):
    assert _progress.wanted(True) and not _progress.wanted(False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    assert _progress.wanted(None)


def test_sim_seconds_is_one_bar_over_every_simulation(recorder):
    s = _progress.SimSeconds(3, 100.0, desc="x", enabled=True)
    (b,) = recorder
    assert b.total == 300
    cb = s.callback("one")
    cb(40)
    cb(30)  # never backwards
    cb(250)  # clipped to this simulation's share
    s.done()
    s.callback("two")(10)
    s.done()
    s.done()  # the third stopped early: the bar still ends at the total
    s.close()
    assert b.seen == [40, 100, 110, 200, 300] and b.closed


def test_kv_stability_figure_shows_one_bar_over_the_rates(tmp_path):
    out = tmp_path / "f.html"
    ran = run_cli("report", "--kv-stability-figure", "--duration", "60", "-o", str(out), "--progress")
    assert ran.code == 0
    err = ran.err
    f = frames(err, "kv-stability-figure")
    assert f and {total for _, total, _ in f} == {300}  # 5 rates x 60 s, one total from start to end
    assert [n for n, _, _ in f] == sorted(n for n, _, _ in f)
    named = [post for _, _, post in f if post]
    assert named[0] == "lam = 1 req/s (1 of 5)" and named[-1] == "lam = 50 req/s (5 of 5)"
    ran = run_cli("report", "--kv-stability-figure", "--duration", "60", "-o", str(out))
    assert ran.code == 0
    assert ran.err == ""  # not a terminal, no --progress: no bar


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal")
    run = d / "run"
    assert run_cli("simulate", "--capacity-tokens", "20000", "--step-time", "0.02", "--prompt", "uniform:10:400",
                   "--output", "uniform:10:200", "--arrival", "poisson:5", "--duration", "120", "--out", str(run),
                   "--no-progress", "--json").code == 0
    assert run_cli("calibrate", str(run), "-o", str(d / "cal.yaml"), "--json").code == 0
    return run, d / "cal.yaml"


def test_validate_shows_one_bar_over_its_simulations(calibrated):
    run, cal = calibrated
    ran = run_cli("validate", str(run), "--calibration", str(cal), "--speed-band", "0.05", "--drift", "0",
                  "--progress", "--json")
    assert ran.code == 0
    err = ran.err
    f = frames(err, "validate")
    assert f and len({total for _, total, _ in f}) == 1 and f[0][1] == pytest.approx(3 * 120, rel=0.05)
    named = [post for _, _, post in f if post]
    assert named[0] == "simulation 1 of 3" and named[-1] == "simulation 3 of 3"
    ran = run_cli("validate", str(run), "--calibration", str(cal), "--drift", "0", "--json")
    assert ran.code == 0
    assert ran.err == ""


def test_calibrate_counts_its_stages(calibrated, recorder):
    from llmqueue.bench.calibrate import CALIBRATE_STAGES

    run, cal = calibrated
    assert run_cli("calibrate", str(run), "-o", str(cal.with_name("c2.yaml")), "--progress", "--json").code == 0
    (b,) = recorder
    assert b.kw["enabled"] is True and b.total == len(CALIBRATE_STAGES) == b.n and b.closed
    assert run_cli("calibrate", str(run), "-o", str(cal.with_name("c3.yaml")), "--json").code == 0
    assert recorder[1].kw["enabled"] is False  # not a terminal, no --progress


def test_report_counts_its_figures(tmp_path, recorder):
    """report --progress on a run: one bar over the panels, their PNGs and the page."""
    from llmqueue.report.run_panels import MAKERS

    run = tmp_path / "run"
    assert run_cli("simulate", "--scenario", "chat", "--duration", "180", "--out", str(run), "--no-progress",
                   "--json").code == 0
    assert run_cli("report", str(run), "-o", str(tmp_path / "r.html"), "--progress", "--json").code == 0
    (b,) = recorder
    assert b.kw["desc"] == "report" and b.kw["enabled"] is True and b.closed
    pngs = len(list((tmp_path / "r_png").glob("*.png")))
    assert b.n == b.total == len(MAKERS) + pngs + 1 and b.seen == list(range(1, b.n + 1))
