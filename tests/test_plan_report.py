"""The plan's page (:mod:`llmqueue.report.plan_page`): ``llmqueue plan --report`` and
``llmqueue report PLAN_DIR``.

One plan of the planner tests' cheap scenario (48 configurations, sensitivity on), its page
checked for the frontier's points (every simulated configuration, the recommendation marked,
the pruned ones at their bounds), the sensitivity rows and the margin; then rendered in headless
Chromium (every plot draws and answers hover; skipped without Chromium).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _cli import run_cli

from test_plan_planner import write_tiny


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    sc = Path(write_tiny(tmp_path_factory, "plan_report"))
    d = sc.parent
    out = d / "out"
    assert run_cli("plan", "--scenario", str(sc), "--gpus", "l4,a100-40gb,h100-sxm", "--tp", "1,2", "--replicas",
                   "1..4", "--max-num-seqs", "2,16", "--max-num-batched-tokens", "512", "--duration", "120",
                   "--seed", "3", "--report", "--out", str(out)).code == 0
    return out


def figure_data(html: str, name: str) -> list[dict]:
    """The traces of figure ``name`` (plotly's JSON in its ``newPlot`` call)."""
    m = re.search(rf'Plotly\.newPlot\(\s*"fig-{name}",\s*(\[.*?\]),\s*\{{', html, flags=re.S)
    assert m, f"no figure {name}"
    return json.loads(m.group(1))


def test_plan_page(plan_dir):
    from test_report import assert_self_contained, plots

    d = json.loads((plan_dir / "plan.json").read_text())
    html = (plan_dir / "report.html").read_text()
    assert_self_contained(html)
    assert plots(html) == ["plan_frontier"]
    traces = figure_data(html, "plan_frontier")
    by_name: dict = {}
    for t in traces:
        by_name.setdefault(t["name"], []).append(t)
    sims = [c for c in d["candidates"] if c["status"] == "simulated"]
    met = [c for c in sims if c["simulation"]["meets"]]
    failed = [c for c in sims if not c["simulation"]["meets"]]
    assert met and failed
    for key, col in (("p99_ttft_ms", 0), ("p99_tpot_ms", 1)):
        # one trace per kind and metric; every simulated configuration at its cost and simulated p99
        for name, group in (("simulated, met the SLOs", met), ("simulated, failed the SLOs", failed)):
            t = by_name[name][col]
            got = sorted(zip(t["x"], t["y"]))
            want = sorted((c["cost_per_hour"], c["simulation"][key]) for c in group)
            assert [v for p in got for v in p] == pytest.approx([v for p in want for v in p])
        star = by_name["recommended"][col]
        assert star["x"] == pytest.approx([d["recommended"]["cost_per_hour"]])
        assert star["y"] == pytest.approx([d["recommended"]["simulation"][key]])
        front = by_name["Pareto frontier (cost, p99)"][col]
        assert front["y"] == pytest.approx([p[key] for p in d[f"pareto_cost_vs_{key[:-3]}"]])
    pruned = by_name["pruned by theory (at its single-request bound)"][0]
    bounded = [c for c in d["candidates"] if c["status"] == "pruned" and c["ttft_bound_ms"] is not None]
    assert len(pruned["x"]) == len(bounded) > 0
    # the tables: the recommendation, each sensitivity row, the margin, each frontier point
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<script\b.*?</script>", "", html, flags=re.S))
    text = re.sub(r"\s+", " ", text)
    assert "step model roofline of llama-3.1-8b" in text
    for r in d["sensitivity"]["rows"]:
        assert r["case"] in text
    assert "margin meets the SLOs up to" in text
    rows = re.findall(r'<tr><td class="text">cost vs p99 (TTFT|TPOT)</td>', html)
    assert len(rows) == len(d["pareto_cost_vs_p99_ttft"]) + len(d["pareto_cost_vs_p99_tpot"])
    assert (plan_dir / "report_png" / "plan_frontier.png").read_bytes()[:4] == b"\x89PNG"


def test_report_command_on_a_plan_dir(plan_dir, tmp_path):
    out = tmp_path / "page.html"
    res = run_cli("report", str(plan_dir), "-o", str(out), "--json").json()
    assert res["kind"] == "plan" and out.exists()
    ran = run_cli("report", str(plan_dir), "-o", str(out), "--compare", str(plan_dir))
    assert ran.code == 2
    err = ran.err
    assert err.count("\n") == 1 and "--compare" in err


@pytest.mark.browser
def test_plan_page_renders_in_headless_chromium(plan_dir, tmp_path):
    from test_report import CHROMIUM, render_check

    if CHROMIUM is None:
        pytest.skip("no Chromium installed (Debian: apt-get install -y chromium)")
    check, _ = render_check((plan_dir / "report.html").read_text(), tmp_path)
    assert check["plots"] == check["drawn"] == 1, check
    assert check["images"] == 0 and check["loads"] == [] and check["errors"] == [], check
    assert all(events >= 1 and labels >= 1 for _, events, labels in check["hover"]), check["hover"]
    assert check["axes"][0] != check["axes"][1]
