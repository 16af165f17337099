"""``llmqueue report``: a self-contained interactive HTML report of a run or a sweep, its PNGs, and a
real browser.

The runs are small simulations of seed 004's 1:1 setting (capacity mu = 3.26 req/s; 120 s, the
first 30 s, while the cache fills, left out): 2 req/s is stable ("bounded"), 6 req/s is not
("growing"). The browser tests render the reports in headless Chromium (Debian package
``chromium``) and fail on any console message, script error, network or file load, or plot
that does not draw or does not answer a mouse move with its hover label; they are skipped only
when no Chromium is installed.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from _cli import run_cli

SETTING = ["--capacity-tokens", "131000", "--step-time", "0.0372", "--chunk", "512",
           "--prompt", "uniform:10:1600", "--output", "uniform:10:1600", "--seed", "1"]
RUN_FIGURES = ["queue", "kv", "cdf", "decomposition"]  # the PNGs of a run
RUN_PLOTS = ["queue", "kv", "latency_time", "tokens_time", "cdf", "ccdf", "decomposition"]  # one class


def simulate(out: Path, rate: float, step_time: str = "0.0372") -> Path:
    args = ["simulate", *SETTING, "--arrival", f"poisson:{rate}", "--duration", "120", "--warmup", "30",
            "--out", str(out)]
    args[args.index("--step-time") + 1] = step_time
    assert run_cli(*args).code == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    return {"stable": simulate(d / "stable", 2), "unstable": simulate(d / "unstable", 6),
            "twin": simulate(d / "twin", 6, step_time="0.04")}


def build(args) -> None:
    assert run_cli("report", *args).code == 0


@pytest.fixture(scope="module")
def compare_report(runs, tmp_path_factory):
    """The unstable run's report with its twin overlaid (built once, used twice)."""
    out = tmp_path_factory.mktemp("cmp") / "cmp.html"
    build([runs["unstable"], "--compare", runs["twin"], "-o", out])
    return out


def images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def plots(html: str) -> list[str]:
    """The names of the page's interactive figures, in order."""
    return re.findall(r'<div id="fig-(\w+)" class="plotly-graph-div"', html)


def captions(html: str) -> dict:
    """Each figure's caption by name."""
    return dict(re.findall(r'<div id="fig-(\w+)" class="plotly-graph-div".*?<figcaption>(.*?)</figcaption>', html,
                           flags=re.S))


def assert_self_contained(html: str) -> None:
    """No script or stylesheet from outside (plotly.js inline), no network address outside the scripts."""
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, flags=re.I), "a script loaded from outside"
    assert not re.search(r"<link[^>]*href\s*=\s*[\"']?https?:", html, flags=re.I), "a link to the network"
    assert "Plotly.newPlot" in html and html.count("<script") == len(plots(html)) + 1  # plotly.js once, one per plot
    outside_scripts = re.sub(r"<script\b[^>]*>.*?</script>", "", html, flags=re.S | re.I)
    refs = re.findall(r'(?:src|href)\s*=\s*["\']?([^"\' >]+)', outside_scripts, flags=re.I)
    assert refs, "no src/href at all?"
    outside = [r for r in refs if not r.startswith(("data:", "#"))]
    assert outside == [], f"the report refers outside itself: {outside[:3]}"
    assert not re.search(r"https?://", outside_scripts), "a network address in the page"
    assert "@import" not in outside_scripts and "url(" not in outside_scripts


# -- a run --------------------------------------------------------------------------------------------

def test_run_report_is_self_contained_with_png_copies(runs, tmp_path):
    out = tmp_path / "rep" / "report.html"
    assert run_cli("report", str(runs["unstable"]), "-o", str(out)).code == 0
    html = out.read_text()
    assert_self_contained(html)
    assert plots(html) == RUN_PLOTS and images(html) == []
    # the one class of the records: the per-class panel is left out, and the note says so
    assert "Not drawn, for want of data: latency by class: the finished requests in the window are all of one class" \
        in html
    png_dir = tmp_path / "rep" / "report_png"  # default: <report stem>_png next to the HTML
    assert sorted(p.stem for p in png_dir.glob("*.png")) == sorted(RUN_FIGURES)
    for name in RUN_FIGURES:
        data = (png_dir / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    summary = json.loads((runs["unstable"] / "summary.json").read_text())
    # the summary table carries the run's numbers (4 significant digits), the verdict and the theory
    assert f"{summary['request_throughput']:.4g}" in html
    assert summary["verdict"] in html
    assert f"{summary['theory']['mu_kv']:.4g}" in html
    assert "growing" in html and "KV cache in use against capacity" in html
    assert "failed share (of arrivals)" in html
    cap = captions(html)
    assert "Shaded: warm-up" in cap["queue"] and "from the time series" in cap["queue"]
    assert "against the capacity M" in cap["kv"] and "Dashed" not in cap["kv"]
    assert "stop at the last arrivals that finished" in cap["latency_time"]  # the run is overloaded


def test_an_overloaded_run_is_named_so_in_the_report(tmp_path):
    # the chat scenario with one sequence at a time: timeouts keep its queue flat
    run = tmp_path / "run"
    assert run_cli("simulate", "--scenario", "chat", "--max-num-seqs", "1", "--duration", "120",
                   "--out", str(run)).code == 0
    out = tmp_path / "r.html"
    assert run_cli("report", str(run), "-o", str(out)).code == 0
    html = out.read_text()
    assert 'class="badge bad">overloaded<' in html and "bounded" not in html


def test_queue_note_follows_the_verdict(runs, tmp_path):
    for kind, word, other in (("stable", "bounded", "growing"), ("unstable", "growing", "bounded")):
        out = tmp_path / f"{kind}.html"
        res = run_cli("report", str(runs[kind]), "-o", str(out), "--json").json()
        assert res["kind"] == "run" and len(res["png"]) == 4
        html = out.read_text()
        assert f'class="badge {"ok" if word == "bounded" else "bad"}">{word}<' in html
        assert f"Queue length over time ({other}" not in html


def test_png_dir_option(runs, tmp_path):
    out, pngs = tmp_path / "r.html", tmp_path / "figs"
    assert run_cli("report", str(runs["stable"]), "-o", str(out), "--png-dir", str(pngs)).code == 0
    assert sorted(p.stem for p in pngs.glob("*.png")) == sorted(RUN_FIGURES)
    assert not (tmp_path / "r_png").exists()


def test_compare_overlays_a_twin(runs, compare_report):
    html = compare_report.read_text()
    assert_self_contained(html)
    # both runs are simulated: the columns and legends are named by directory
    assert "<th>unstable</th><th>twin</th>" in html
    twin = json.loads((runs["twin"] / "summary.json").read_text())
    assert f"{twin['request_throughput']:.4g}" in html
    # every panel with a time series or a distribution draws the twin dashed, and says so
    assert [n for n, c in captions(html).items() if "Dashed: twin" in c] == RUN_PLOTS[:-1]
    assert "twin (hatched)" in captions(html)["decomposition"]


def test_validate_json_table_and_named_twin(runs, tmp_path):
    d = tmp_path / "measured"
    shutil.copytree(runs["unstable"], d)
    val = {"run": str(d), "lam": 6.0, "saturated": True,
           "capacity": {"quantity": "capacity mu (req/s)", "theory": 3.262, "simulated": 3.1, "measured": 3.0,
                        "rel_err_theory": 0.087, "rel_err_sim": 0.0333},
           "rows": [{"quantity": "p99_ttft_ms", "measured": 1000.0, "simulated": 1100.0, "rel_err_sim": 0.1}],
           "verdicts": {"measured": "unstable: x", "simulated": "unstable: y", "theory": "unstable"},
           "sim_dir": str(runs["twin"])}
    (d / "validate.json").write_text(json.dumps(val))
    out = tmp_path / "v.html"
    assert run_cli("report", str(d), "-o", str(out)).code == 0
    html = out.read_text()
    assert "Predicted versus measured (validate.json)" in html
    assert "+10.0%" in html and "+3.3%" in html
    assert "overlaid the simulated twin" in html and "Dashed:" in html


def test_run_without_time_series_uses_steps(runs, tmp_path):
    d = tmp_path / "nots"
    shutil.copytree(runs["stable"], d)
    (d / "timeseries.parquet").unlink()
    out = tmp_path / "n.html"
    assert run_cli("report", str(d), "-o", str(out)).code == 0
    html = out.read_text()
    assert plots(html) == RUN_PLOTS
    assert "from the step records" in captions(html)["queue"] and "from the step records" in captions(html)["kv"]


def test_run_without_kv_data_has_no_kv_panel(runs, tmp_path):
    """No time series and no steps (a client's run without server metrics): the queue comes from the
    request records, the KV panel is left out and named in the note, no panel is empty."""
    d = tmp_path / "nokv"
    shutil.copytree(runs["stable"], d)
    (d / "timeseries.parquet").unlink()
    (d / "steps.parquet").unlink()
    out = tmp_path / "k.html"
    build([d, "-o", out])
    html = out.read_text()
    assert plots(html) == [p for p in RUN_PLOTS if p != "kv"]
    assert "KV cache over time: the run records no KV usage" in html
    assert "from the request records" in captions(html)["queue"]
    assert not (tmp_path / "k_png" / "kv.png").exists()


def test_bare_run_no_summary_steps_or_finished_requests(runs, tmp_path):
    from llmqueue.records import read_run, write_run

    r = read_run(runs["unstable"])
    d = write_run(tmp_path / "bare", requests=r.requests.select(r.requests["status"] == "unfinished"))
    out = tmp_path / "bare.html"
    build([d, "-o", out])
    html = out.read_text()
    assert plots(html) == ["queue"]  # from the request records; nothing else has data, and nothing is empty
    assert "no summary.json" in html and "undecided" in html
    note = re.search(r"Not drawn, for want of data: (.*?)</p>", html).group(1)
    for name in ("KV cache over time", "latency over time", "tokens per second over time", "latency CDFs",
                 "tail CCDFs", "latency by class: no finished request", "latency decomposition"):
        assert name in note


def test_classes_get_their_own_cdfs(runs, tmp_path):
    import numpy as np

    from llmqueue.records import RequestRecords, read_run, write_run

    r = read_run(runs["stable"])
    cols = r.requests.to_dict()
    cols["class"] = np.where(np.arange(len(r.requests)) % 3 == 0, "batch", "chat")
    d = write_run(tmp_path / "two", requests=RequestRecords.from_columns(cols), steps=r.steps,
                  timeseries=r.timeseries, summary=r.summary)
    out = tmp_path / "c.html"
    build([d, "-o", out])
    html = out.read_text()
    assert plots(html) == RUN_PLOTS[:-1] + ["classes", "decomposition"]
    assert "per request class (2 classes: batch, chat)" in captions(html)["classes"]
    assert "Not drawn" not in html


def test_decomposition_parts(runs):
    """Queue + prefill + decode add up to E2EL; without scheduling times (a client's view) the split
    is TTFT + decode."""
    import numpy as np

    from llmqueue.records import RequestRecords
    from llmqueue.report.series import decomposition
    from llmqueue.report.sources import load_run

    run = load_run(runs["unstable"])
    d = decomposition(run)
    assert d["parts"] == ["queue", "prefill", "decode"]
    s = run.summary
    assert sum(d["mean"].values()) * 1000 == pytest.approx(s["mean_e2el_ms"], rel=1e-9)
    assert d["mean"]["queue"] * 1000 == pytest.approx(s["mean_queue_ms"], rel=1e-9)
    assert d["n"] == s["e2el_samples"] and sum(d["bin_n"]) == d["n"]
    cols = run.requests.to_dict()
    cols["first_scheduled_s"] = np.full(len(run.requests), np.nan)
    run.requests = RequestRecords.from_columns(cols)
    d = decomposition(run)
    assert d["parts"] == ["ttft", "decode"]
    assert d["mean"]["ttft"] * 1000 == pytest.approx(s["mean_ttft_ms"], rel=1e-9)


# -- a sweep ------------------------------------------------------------------------------------------

def fake_point(seqs, rate, thr, ttft, tpot, e2el, verdict, mu=3.262):
    return {"params": {"max_num_seqs": seqs, "rate": rate}, "rate": rate, "request_throughput": thr,
            "p99_ttft_ms": ttft, "p99_ttft_ms_ci": [0.9 * ttft, 1.1 * ttft],
            "p99_tpot_ms": tpot, "p99_tpot_ms_ci": None, "p99_e2el_ms": e2el, "p99_e2el_ms_ci": [0.95 * e2el, 1.05 * e2el],
            "verdict": verdict, "theory_mu": mu}


def fake_sweep(d: Path) -> Path:
    """Two curves (max_num_seqs 32 and 256) shaped like the simulated 1:1 setting."""
    d.mkdir(parents=True, exist_ok=True)
    pts = [fake_point(256, r, t, tt, 37.2, e, v) for r, t, tt, e, v in [
        (0.5, 0.48, 183.0, 59164.0, "stable"), (1, 0.996, 194.0, 58940.0, "stable"),
        (2, 1.98, 231.0, 58940.0, "stable"), (2.5, 2.50, 317.0, 58941.0, "stable"),
        (3, 2.99, 7846.0, 61405.0, "stable"), (3.5, 3.16, 55240.0, 99339.0, "unstable: queue grows 0.34 req/s"),
        (4, 3.17, 115772.0, 154549.0, "unstable: queue grows 0.85 req/s"),
        (6, 3.17, 266451.0, 294723.0, "unstable: queue grows 2.78 req/s")]]
    pts += [fake_point(32, r, t, tt, 37.2, e, v, mu=1.066) for r, t, tt, e, v in [
        (0.5, 0.48, 183.0, 59164.0, "stable"), (1, 0.996, 12798.0, 65638.0, "stable"),
        (2, 1.085, 245732.0, 283679.0, "unstable: queue grows 0.87 req/s"),
        (4, 1.089, 409405.0, 436587.0, "unstable: queue grows 2.9 req/s")]]
    (d / "sweep.json").write_text(json.dumps({"swept": ["max_num_seqs", "rate"],
                                              "slo": {"p99_ttft_ms": 5000, "p99_tpot_ms": 60}, "points": pts}))
    return d


def test_sweep_report(tmp_path):
    d = fake_sweep(tmp_path / "sweep")
    out = tmp_path / "s.html"
    res = run_cli("report", str(d), "-o", str(out), "--json").json()
    assert res["kind"] == "sweep"
    assert sorted(Path(p).stem for p in res["png"]) == ["sweep_latency", "sweep_throughput"]
    html = out.read_text()
    assert_self_contained(html)
    # sweep.json gives p99s only and no queue trend, and the sweep kept no runs: three plots, one note
    assert plots(html) == ["sweep_latency", "sweep_throughput", "sweep_percentiles"]
    assert "queue and utilization against offered load: the points give no queue trend" in html
    assert "queue length over time per point: the sweep kept no run directories (run llmqueue sweep with " \
           "--keep-runs)" in html
    cap = captions(html)
    # CIs on TTFT and E2EL, SLOs on TTFT and TPOT, mu, knee, best point and unstable points: each drawn, each named
    for words in ("bars: the 95% confidence interval", "hollow markers: the queue grew",
                  "dashed horizontal line: the SLO target (TTFT and TPOT)", "dash-dot vertical line: the theory",
                  "star: the knee", "open diamond"):
        assert words in cap["sweep_latency"]
    assert cap["sweep_percentiles"].startswith("p99 of TTFT, TPOT and E2EL against offered load")
    # one table row per point; the knee (Kneedle on p99 TTFT against rate) and the best point within SLO
    assert html.count("<tr><td") >= 12
    assert "knee (max_num_seqs=256)</td><td class=\"text\">rate 3 req/s" in html
    assert "knee (max_num_seqs=32)</td><td class=\"text\">rate 1 req/s" in html
    assert "best within SLO (max_num_seqs=256)</td><td class=\"text\">rate 2.5 req/s" in html
    assert "best within SLO (max_num_seqs=32)</td><td class=\"text\">rate 0.5 req/s" in html
    assert "p99_ttft_ms = 5000" in html


def test_sweep_interface_accepts_other_spellings(tmp_path):
    from llmqueue.report.sources import load_sweep

    d = tmp_path / "s2"
    d.mkdir()
    (d / "sweep.json").write_text(json.dumps([  # a bare list; lam, nested summary and theory
        {"lam": 1.0, "summary": {"throughput": 0.99, "p99_ttft_ms": 100.0, "verdict": "stable"},
         "theory": {"mu": 3.2}, "slos": {"p99_ttft_ms": 500}},
        {"params": {"arrival": "poisson:2"}, "request_throughput": 1.5, "verdict": "unstable: grows",
         "mu": 3.2, "p99_ttft_ms": None}]))
    s = load_sweep(d)
    a, b = s.points
    assert (a.rate, a.throughput, a.mu, a.stable, a.p99["ttft"][0], a.slo) == (1.0, 0.99, 3.2, True, 100.0,
                                                                               {"p99_ttft_ms": 500.0})
    assert (b.rate, b.throughput, b.stable, b.p99["ttft"]) == (2.0, 1.5, False, (None, None))


def test_sweep_written_by_llmqueue_sweep(tmp_path):
    """The shape ``llmqueue sweep`` writes: flat coordinates named by ``grid``, flattened intervals,
    its own SLO judgement per point, and curves with the knee and the SLO-bounded rate."""
    d = tmp_path / "sw"
    d.mkdir()
    rows = []
    for seqs, mu, data in ((32, 1.066, [(0.5, 0.57, 176.0, True, True), (1, 1.08, 9157.0, True, False),
                                        (2, 1.02, 139154.0, False, False)]),
                           (256, 3.262, [(0.5, 0.54, 180.0, True, True), (2, 2.05, 225.0, True, True),
                                         (3, 2.99, 3754.0, True, True), (4, 3.49, 42320.0, False, False)])):
        for rate, thr, ttft, stable, met in data:
            rows.append({"max_num_seqs": seqs, "rate": rate, "offered_rate": rate, "request_throughput": thr,
                         "p99_ttft_ms": ttft, "p99_ttft_ms_ci_lo": 0.9 * ttft, "p99_ttft_ms_ci_hi": 1.1 * ttft,
                         "p99_tpot_ms": 40.0, "p99_tpot_ms_ci_lo": None, "p99_tpot_ms_ci_hi": None,
                         "p99_e2el_ms": 60000.0, "stable": stable, "slo_met": met, "theory_mu": mu,
                         "verdict": "stable" if stable else "unstable: queue grows 1 req/s"})
    curves = [{"group": {"max_num_seqs": 256}, "metric": "p99_ttft_ms",
               "knee": {"rate": 2.09, "throughput": 2.12, "latency": 360.0, "bracket": [2.0, 3.0]},
               "max_rate_meeting_slo": 3.0},
              {"group": {"max_num_seqs": 32}, "metric": "p99_ttft_ms", "knee": None, "max_rate_meeting_slo": 0.5}]
    (d / "sweep.json").write_text(json.dumps({
        "grid": {"max_num_seqs": [32, 256], "rate": [0.5, 1, 2, 3, 4]}, "slos": {"p99_ttft_ms": 5000.0},
        "knee_rule": "knee: the offered rate at which p99_ttft_ms first reaches 2 x its low-load value",
        "slo_rule": "a run meets the SLOs when ...", "curves": curves, "points": rows}))
    from llmqueue.report.figures import sweep_best_within_slo, sweep_knees
    from llmqueue.report.sources import load_sweep

    sw = load_sweep(d)
    assert sw.points[0].params == {"max_num_seqs": 32, "rate": 0.5}
    assert sw.points[0].p99["ttft"] == (176.0, [pytest.approx(158.4), pytest.approx(193.6)])
    knees = sweep_knees(sw)
    assert set(knees) == {"max_num_seqs=256"}  # the sweep found no knee for 32: none is invented
    assert (knees["max_num_seqs=256"].rate, knees["max_num_seqs=256"].metric) == (2.09, "ttft")
    best = sweep_best_within_slo(sw)
    assert best["max_num_seqs=256"].rate == 3 and best["max_num_seqs=32"].rate == 0.5
    out = tmp_path / "sw.html"
    build([d, "-o", out])
    html = out.read_text()
    assert_self_contained(html)
    assert "rate 2.09 req/s (between 2 and 3)" in html and "first reaches 2 x its low-load value" in html
    assert plots(html) == ["sweep_latency", "sweep_throughput", "sweep_percentiles"]


def real_sweep(d: Path, *extra) -> Path:
    """The README's sweep, shortened: 1:1 setting, rates 1, 2.5 and 5, two max_num_seqs."""
    assert run_cli("sweep", *SETTING, "--arrival", "poisson:1", "--rates", "1,2.5,5", "--param",
                   "max_num_seqs=64,256", "--duration", "120", "--warmup", "30", "--slo-ttft-ms", "5000",
                   "--workers", "1", "--out", str(d), *extra).code == 0
    return d


@pytest.fixture(scope="module")
def kept_sweep(tmp_path_factory):
    """A real sweep that kept its points' run directories (--keep-runs)."""
    return real_sweep(tmp_path_factory.mktemp("kept") / "sweep", "--keep-runs")


SWEEP_PLOTS = ["sweep_latency", "sweep_throughput", "sweep_percentiles", "sweep_queue"]


def test_report_of_a_real_sweep(tmp_path):
    d = real_sweep(tmp_path / "sweep")
    out = tmp_path / "s.html"
    build([d, "-o", out])
    html = out.read_text()
    assert_self_contained(html)
    assert plots(html) == SWEEP_PLOTS  # at least four plots from sweep.json alone
    assert html.count("<tr><td") >= 6 + 4  # six points, and the sweep's facts
    cap = captions(html)
    assert "bars" not in cap["sweep_latency"]  # simulated p99s: the sweep gives no interval of a p99
    assert "dashed horizontal line: the SLO target (TTFT)" in cap["sweep_latency"]
    assert "p50, p90 and p99 of TTFT, TPOT and E2EL" in cap["sweep_percentiles"]
    assert "busy fraction (solid) and the mean KV cache utilization (dashed)" in cap["sweep_queue"]
    assert "--keep-runs" in html


def test_report_of_a_sweep_that_kept_its_runs(kept_sweep, tmp_path):
    out = tmp_path / "k.html"
    build([kept_sweep, "-o", out, "--png-dir", tmp_path / "png"])
    html = out.read_text()
    assert_self_contained(html)
    assert plots(html) == SWEEP_PLOTS + ["sweep_queue_time", "sweep_cdf"]
    assert "Not drawn" not in html
    cap = captions(html)
    assert "one line per point (6 of 6 points)" in cap["sweep_queue_time"]
    assert "one line per point (6 of 6 points)" in cap["sweep_cdf"]
    assert sorted(p.stem for p in (tmp_path / "png").glob("*.png")) == ["sweep_latency", "sweep_throughput"]
    # a point's run directory is found from any working directory (sweep.json names it as given to --out)
    from llmqueue.report.sources import load_sweep, point_run_dir

    sw = load_sweep(kept_sweep)
    assert all(point_run_dir(sw, p) == kept_sweep / "runs" / p.key for p in sw.points)


def test_knee_definitions():
    from llmqueue.report.series import elasticity_knee, knee_index

    # Kneedle: scaled gaps below the chord are .239, .478, .694 at x = 2, 3, 4 -> the knee is x = 4
    assert knee_index([1, 2, 3, 4, 5], [1, 1.1, 1.2, 1.5, 10]) == 3
    assert knee_index([1, 2, 3, 4], [1, 2, 3, 4]) is None  # a straight line has no knee
    assert knee_index([1, 2], [1, 5]) is None
    # elasticity: ln(y2/y1)/ln(x2/x1) = 0.5, 0.5, then ln 4 / ln 1.5 > 1 -> the point before, index 2
    assert elasticity_knee([1, 4, 9, 13.5], [1, 2, 3, 12]) == 2
    assert elasticity_knee([1, 2, 4], [1, 1.2, 1.4]) is None


# -- captions say what is drawn ---------------------------------------------------------------------

def marks(fig) -> set:
    """The kinds of mark a figure draws, as its caption would name them."""
    out = set()
    for t in fig.data:
        ey = getattr(t, "error_y", None)
        if ey is not None and ey.array is not None and any(v > 0 for v in [*ey.array, *(ey.arrayminus or [])]):
            out.add("bars")
        m = getattr(t, "marker", None)
        if m is not None and getattr(m, "symbol", None) in ("star", "diamond-open"):
            out.add(m.symbol)
        if m is not None and isinstance(m.color, (list, tuple)) and "white" in m.color:
            out.add("hollow")
        line = getattr(t, "line", None)
        if line is not None and line.dash == "dash" and "(twin)" in (t.name or ""):
            out.add("twin")
        if (t.name or "").startswith("p99 ") and line is not None and line.dash == "dot":
            out.add("p99 line")
    for sh in fig.layout.shapes:
        if sh.type == "rect":
            out.add("shaded")
        elif sh.line.dash == "dashdot":
            out.add("dash-dot")
        elif sh.line.dash == "dash" and sh.y0 == sh.y1:
            out.add("dashed hline")
    return out


CLAIMS = {"bars": "bars:", "hollow": "hollow markers", "star": "star:", "diamond-open": "open diamond",
          "dash-dot": "dash-dot", "shaded": "Shaded: warm-up", "twin": "Dashed: twin", "p99 line": "dotted vertical line",
          "dashed hline": ("dashed horizontal line: the SLO", "red dashed line: the SLO", "dashed: the SLO")}


def assert_captions_match(panels) -> None:
    for p in panels:
        drawn = marks(p.plot)
        for mark, words in CLAIMS.items():
            said = any(w in p.caption for w in ((words,) if isinstance(words, str) else words))
            assert said == (mark in drawn), f"{p.name}: {mark} drawn={mark in drawn}, captioned={said}: {p.caption}"


def test_captions_name_only_what_is_drawn(runs, kept_sweep, tmp_path):
    from llmqueue.report.run_panels import run_panels
    from llmqueue.report.sources import load_run, load_sweep
    from llmqueue.report.sweep_panels import sweep_panels

    twin = load_run(runs["twin"], label="twin")
    for run, tw in ((load_run(runs["unstable"]), twin), (load_run(runs["stable"]), None)):
        assert_captions_match(run_panels(run, tw)[0])
    fake = load_sweep(fake_sweep(tmp_path / "fake"))
    assert {"bars", "hollow", "star", "diamond-open", "dash-dot", "dashed hline"} <= marks(sweep_panels(fake)[0][0].plot)
    assert_captions_match(sweep_panels(fake)[0])
    # the same sweep without intervals, SLOs or theory: no bars, no SLO line, no mu, no best point
    doc = json.loads((tmp_path / "fake" / "sweep.json").read_text())
    doc.pop("slo")
    for pt in doc["points"]:
        for k in ("p99_ttft_ms_ci", "p99_e2el_ms_ci", "theory_mu"):
            pt.pop(k)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "sweep.json").write_text(json.dumps(doc))
    panels = sweep_panels(load_sweep(bare))[0]
    assert not {"bars", "dash-dot", "dashed hline", "diamond-open"} & marks(panels[0].plot)
    assert_captions_match(panels)
    assert_captions_match(sweep_panels(load_sweep(kept_sweep))[0])


# -- the series behind the plots ------------------------------------------------------------------

def test_output_rate_keeps_every_token(runs):
    import numpy as np

    from llmqueue.report.series import output_rate
    from llmqueue.report.sources import load_run

    run = load_run(runs["stable"])
    r = output_rate(run)
    ok = run.requests["status"] == "ok"
    assert np.sum(r["tokens_per_s"]) * r["width"] == pytest.approx(float(np.sum(run.requests["output_tokens"][ok])),
                                                                    rel=1e-9)
    # in the steady part the rate is the summary's output throughput (the window's tokens / its length)
    mid = (r["t"] > 40) & (r["t"] < 90)
    assert np.mean(r["tokens_per_s"][mid]) == pytest.approx(run.summary["output_throughput"], rel=0.15)


def test_latency_over_time_bins(runs):
    import numpy as np

    from llmqueue.report.series import latency_over_time
    from llmqueue.report.sources import load_run

    run = load_run(runs["stable"])
    one = latency_over_time(run, per_bin=10**9)  # one bin: the percentiles of every finished request
    ok = run.requests["status"] == "ok"
    ttft = run.requests.derived()["ttft_s"][ok]
    assert len(one["t"]) == 1 and one["ttft"]["n"][0] == ok.sum()
    assert one["ttft"]["p50"][0] == pytest.approx(np.percentile(ttft, 50))
    assert one["ttft"]["p99"][0] == pytest.approx(np.percentile(ttft, 99))
    lt = latency_over_time(run)
    assert 5 <= len(lt["t"]) <= 60 and lt["ttft"]["n"].sum() == ok.sum()
    assert np.all(lt["e2el"]["p99"][np.isfinite(lt["e2el"]["p99"])] >= lt["e2el"]["p50"][np.isfinite(lt["e2el"]["p50"])])


def test_ecdf_points_keep_the_tail():
    import numpy as np

    from llmqueue.report.series import ecdf_points

    x = np.random.default_rng(0).pareto(1.5, 100_000)
    v, p = ecdf_points(x, n=600)
    assert len(v) <= 602 and v[0] == x.min() and v[-1] == x.max() and p[-1] == 1.0
    assert np.all(np.diff(v) >= 0) and np.all(np.diff(p) > 0)
    tail = 1 - p + 1 / len(x)  # P(X >= v): down to 1/N, with points in every decade of the tail
    for decade in (1e-1, 1e-2, 1e-3, 1e-4):
        assert np.any((tail <= decade) & (tail > decade / 10))
    v, p = ecdf_points([3.0, 1.0, 2.0])
    assert list(v) == [1, 2, 3] and list(p) == pytest.approx([1 / 3, 2 / 3, 1])


def test_queue_from_request_records():
    import numpy as np

    from llmqueue.records import RequestRecords
    from llmqueue.report.series import queue_series
    from llmqueue.report.sources import RunData

    nan = np.nan
    # a: arrives 0, scheduled 1, done 3; b: arrives 0.5, no scheduling time, first token 2, done 4;
    # c: arrives 2, still waiting at the end (5)
    rq = RequestRecords.from_columns(
        request_id=[0, 1, 2], **{"class": np.array(["x"] * 3)}, arrival_s=[0.0, 0.5, 2.0], dispatched_s=[0.0, 0.5, 2.0],
        first_scheduled_s=[1.0, nan, nan], first_token_s=[1.5, 2.0, nan], finish_s=[3.0, 4.0, nan],
        prompt_tokens=[1, 1, 1], output_tokens=[2, 2, 0], cached_prompt_tokens=[0, 0, 0],
        status=np.array(["ok", "ok", "unfinished"]), preemptions=[0, 0, 0], replica=[0, 0, 0], attempt=[1, 1, 1])
    t, w, r, src = queue_series(RunData(path=Path("."), requests=rq, summary={"horizon_s": 5.0}))
    assert src == "request records"
    at = lambda x: (w[np.searchsorted(t, x, side="right") - 1], r[np.searchsorted(t, x, side="right") - 1])  # noqa: E731
    assert [at(x) for x in (0.2, 0.7, 1.2, 2.5, 3.5, 4.5)] == [(1, 0), (2, 0), (1, 1), (1, 2), (1, 1), (1, 0)]


def test_kv_left_out_when_all_zero_without_capacity(runs):
    import numpy as np

    from llmqueue.records import TimeSeries
    from llmqueue.report.series import kv_series
    from llmqueue.report.sources import load_run

    run = load_run(runs["stable"])
    cols = run.timeseries.to_dict()
    cols["kv_tokens"] = np.zeros(len(run.timeseries), dtype=np.int64)
    run.timeseries = TimeSeries.from_columns(cols)
    assert kv_series(run) is not None  # zeros against a known capacity: an idle cache, drawn
    run.summary = {}
    assert kv_series(run) is None      # zeros and no capacity: the server reported nothing


# -- the seeds' figures -------------------------------------------------------------------------------

def test_seed002_figure2(tmp_path):
    out = tmp_path / "fig2.html"
    assert run_cli("report", "--batch-figure", "-o", str(out)).code == 0
    html = out.read_text()
    assert_self_contained(html)
    assert plots(html) == ["batch_figure"]
    assert (tmp_path / "fig2_png" / "batch_figure.png").stat().st_size > 5000
    cap = captions(html)["batch_figure"]
    assert "dashed: the SLO (300 ms, P99)" in cap and "star: the knee (B = 32)" in cap and "(B = 16)" in cap
    # B_min = 50 ms * 100 / (1 - 0.05) = 5.26 -> 6; the largest B with P99 <= 300 ms is 16 (seed 002's
    # model, as `llmqueue batch --slo-ms 300` finds); E[T]'s elasticity against mu_eff first exceeds 1
    # from B = 32 to 48: the knee is 32
    assert "5.26 -&gt; 6" in html
    assert re.search(r"largest B with P99 &lt;= 300 ms</td><td>16<", html)
    assert re.search(r"knee at B[^<]*</td><td>32<", html)


def test_seed004_figure2_short(tmp_path):
    out = tmp_path / "fig2.html"
    assert run_cli("report", "--kv-stability-figure", "--duration", "240", "-o", str(out)).code == 0
    html = out.read_text()
    assert_self_contained(html)
    assert plots(html) == ["kv_stability_figure"]
    assert (tmp_path / "fig2_png" / "kv_stability_figure.png").stat().st_size > 5000
    rows = re.findall(r"<tr><td>(\d+)</td><td>[^<]*</td><td class=\"text\">(\w+)</td>", html)
    assert dict(rows) == {"1": "bounded", "3": "bounded", "5": "growing", "20": "growing", "50": "growing"}
    assert "seed 00" not in html.lower()


def test_old_figure_flag_names_still_work(tmp_path):
    out = tmp_path / "fig2.html"
    ran = run_cli("report", "--seed002-figure2", "-o", str(out))
    assert ran.code == 0
    assert (tmp_path / "fig2_png" / "batch_figure.png").is_file()
    assert "--seed002-figure2" not in ran.out
    ran = run_cli("report", "--help")
    assert ran.code == 0
    help_text = ran.out
    assert "--batch-figure" in help_text and "seed00" not in help_text


@pytest.mark.slow
def test_seed004_figure2_full(tmp_path):
    """The figure as the paper draws it: 3600 s per rate (about 30 s of simulation)."""
    out = tmp_path / "fig2.html"
    assert run_cli("report", "--seed004-figure2", "-o", str(out)).code == 0
    rows = re.findall(r"<tr><td>(\d+)</td><td>[^<]*</td><td class=\"text\">(\w+)</td>", out.read_text())
    assert dict(rows) == {"1": "bounded", "3": "bounded", "5": "growing", "20": "growing", "50": "growing"}


# -- errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("setup,args,needle", [
    (None, ["{tmp}/nope"], "does not exist"),
    ("empty", ["{tmp}/d"], "is empty"),
    ("other", ["{tmp}/d"], "neither a run directory"),
    (None, [], "missing directory"),
    ("run", ["{tmp}/d", "-o", "{tmp}/r.txt"], "--out"),
    ("sweep", ["{tmp}/d", "--compare", "{tmp}/d"], "--compare"),
    ("run", ["{tmp}/d", "--compare", "{tmp}/nope"], "--compare"),
    (None, ["--kv-stability-figure", "--batch-figure"], "give one of"),
    ("run", ["{tmp}/d", "--batch-figure"], "takes no directory"),
    ("badsweep", ["{tmp}/d"], "no list of points"),
    (None, ["--seed004-figure2", "--duration", "-5"], "--duration"),
])
def test_errors_are_one_line_exit_2(runs, tmp_path, setup, args, needle):
    d = tmp_path / "d"
    if setup == "empty":
        d.mkdir()
    elif setup == "other":
        d.mkdir()
        (d / "notes.txt").write_text("x")
    elif setup == "run":
        shutil.copytree(runs["stable"], d)
    elif setup == "sweep":
        fake_sweep(d)
    elif setup == "badsweep":
        d.mkdir()
        (d / "sweep.json").write_text('{"rows": []}')
    code, out, err = run_cli("report", *[a.format(tmp=tmp_path) for a in args])
    assert code == 2
    assert err.startswith("llmqueue: error:") and err.count("\n") == 1, err
    assert needle in err


# -- a real browser -----------------------------------------------------------------------------------

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                                         "google-chrome-stable")) if p), None)
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
# Injected into a test copy: records script errors and loads, checks each plot drew, moves the
# mouse onto a drawn point of each plot (a real mousemove at that pixel) and records whether
# plotly answered with a hover event and a hover label, then clicks the first plot's other axis button.
CHECK = """<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  window.__errors.push(String(e.message || ("failed to load " + ((e.target && (e.target.src || e.target.href)) || "?"))).slice(0, 120));
}, true);
function llmqTarget(gd) {
  for (var t = 0; t < gd.calcdata.length; t++) {
    var cd = gd.calcdata[t], tr = cd[0] && cd[0].trace;
    if (!tr || tr.type !== "scatter" || tr.visible !== true) continue;
    var xa = gd._fullLayout[tr.xaxis.replace("x", "xaxis")], ya = gd._fullLayout[tr.yaxis.replace("y", "yaxis")];
    var box = gd.getBoundingClientRect();
    for (var k = Math.floor(cd.length / 2); k < cd.length; k++) {
      var px = xa.c2p(cd[k].x), py = ya.c2p(cd[k].y);
      if (isFinite(px) && isFinite(py)) return [box.left + xa._offset + px, box.top + ya._offset + py];
    }
  }
  return null;
}
window.addEventListener("load", function () {
  var plots = Array.prototype.slice.call(document.querySelectorAll(".js-plotly-plot"));
  var res = {plots: plots.length, drawn: 0, hover: [], images: document.images.length,
             loads: performance.getEntriesByType("resource").map(function (e) { return e.name.slice(0, 80); })};
  plots.forEach(function (gd) { if (gd.querySelector(".main-svg .scatterlayer .trace")) res.drawn++; });
  var i = 0;
  function done() {
    var gd = plots[0], before = gd._fullLayout.yaxis.type + "/" + gd._fullLayout.xaxis.type;
    var buttons = gd.querySelectorAll(".updatemenu-button");
    var other = 1 - gd._fullLayout.updatemenus[0].active;  // the button not pressed: log <-> linear
    if (buttons.length) buttons[other].dispatchEvent(new MouseEvent("click", {bubbles: true, view: window}));
    setTimeout(function () {
      res.axes = [before, gd._fullLayout.yaxis.type + "/" + gd._fullLayout.xaxis.type];
      res.errors = window.__errors;
      var d = document.createElement("pre");
      d.id = "llmq-check";
      d.textContent = JSON.stringify(res);
      document.body.appendChild(d);
    }, 300);
  }
  function next() {
    if (i >= plots.length) return done();
    var gd = plots[i++], got = 0;
    gd.scrollIntoView();
    gd.on("plotly_hover", function () { got++; });
    var xy = llmqTarget(gd);
    var el = xy && document.elementFromPoint(xy[0], xy[1]);
    if (el) el.dispatchEvent(new MouseEvent("mousemove", {clientX: xy[0], clientY: xy[1], bubbles: true, view: window}));
    setTimeout(function () {
      var layer = gd.querySelector(".hoverlayer");
      res.hover.push([gd.id, got, layer ? layer.childNodes.length : 0]);
      if (el) el.dispatchEvent(new MouseEvent("mouseout", {bubbles: true, view: window}));
      next();
    }, 300);
  }
  window.scrollTo(0, 0);
  next();
});
</script>"""


def chromium(*args, profile: Path, timeout: float = 90):
    return subprocess.run([CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout)



def render_check(html: str, tmp_path) -> tuple[dict, str]:
    """Load ``html`` in headless Chromium with the CHECK probe; returns what it found (plots,
    drawn, images, loads, errors, hover, axes) and Chromium's stderr; asserts the page loaded."""
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</head>", CHECK + "</head>", 1))
    r = chromium("--virtual-time-budget=20000", "--window-size=1280,1000", "--dump-dom", probe.as_uri(),
                 profile=tmp_path / "profile")
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="llmq-check">(.*?)</pre>', r.stdout, flags=re.S)
    assert m, f"the page did not finish loading: {r.stdout[:300]!r} {r.stderr[-1000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&")), r.stderr


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install -y chromium)")
@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_report_renders_in_headless_chromium(compare_report, kept_sweep, tmp_path, kind):
    """Every plot draws and answers a mouse move with its hover label, the log button switches the
    axis, nothing is loaded from the network or the disk, and the console stays silent."""
    if kind == "run":
        out = compare_report
    else:
        out = tmp_path / "report.html"
        build([kept_sweep, "-o", out])
    html = out.read_text()
    assert_self_contained(html)
    names = plots(html)
    assert len(names) == (len(RUN_PLOTS) if kind == "run" else 6)
    check, stderr = render_check(html, tmp_path)
    assert check["plots"] == check["drawn"] == len(names), check
    assert check["images"] == 0 and check["loads"] == [] and check["errors"] == [], check
    assert [h[0] for h in check["hover"]] == [f"fig-{n}" for n in names]
    assert all(events >= 1 and labels >= 1 for _, events, labels in check["hover"]), check["hover"]
    assert check["axes"][0] != check["axes"][1], check["axes"]  # linear <-> log
    console = [ln for ln in stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    assert console == [], console
    shot = tmp_path / "shot.png"
    r = chromium("--window-size=1280,1600", f"--screenshot={shot}", out.as_uri(), profile=tmp_path / "profile")
    assert r.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20000
    assert [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln] == []
