"""``llmqueue report`` without ``-o``: the page goes into the directory it draws (one run, sweep or
plan), or the common parent of several runs, never into the working directory by surprise."""

from __future__ import annotations

from _cli import run_cli

SIM = ("simulate", "--arrival", "poisson:2", "--prompt-len", "fixed:8", "--output-len", "fixed:4",
       "--num-requests", "60", "--step-time", "0.01", "--capacity-tokens", "10000")


def test_report_goes_into_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        assert run_cli(*SIM, "--out", f"runs/{name}").code == 0
    r = run_cli("report", "runs/a", "--json")
    assert r.json()["html"] == "runs/a/report.html"
    assert (tmp_path / "runs" / "a" / "report.html").is_file() and (tmp_path / "runs" / "a" / "report_png").is_dir()
    r = run_cli("report", "runs/a", "runs/b", "--json")
    assert r.json()["html"] == str(tmp_path / "runs" / "report.html")
    assert not (tmp_path / "report.html").exists()
    r = run_cli("report", "runs/a", "-o", "elsewhere/x.html", "--json")
    assert r.json()["html"] == "elsewhere/x.html" and (tmp_path / "elsewhere" / "x.html").is_file()
