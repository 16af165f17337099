"""The gateway's Grafana dashboard and Prometheus rules (``deploy/``) against the ``/metrics`` a
live gateway serves: every metric name their PromQL reads is one the gateway exports (and every
family it exports is drawn), the files have the structure Grafana and Prometheus load, the rules
pass ``promtool`` and their unit tests; and the oldest-request age by class is the age of the
request the gateway's queue holds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llmqueue.serve.launch import EmulatorProcess, GatewayProcess

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "llmqueue-gateway.json"
RULES = REPO / "deploy" / "prometheus" / "llmqueue-gateway-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "llmqueue-gateway-alerts.test.yml"
NEEDS_PROMTOOL = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is not on PATH (Debian: apt-get install prometheus)")

# PromQL's keywords and modifiers (not metric names); a word followed by "(" is a function.
_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
          "inf", "nan"}


def metric_names(expr: str) -> set:
    """The metric names a PromQL expression reads: its identifiers less strings, label matchers,
    ranges, grouping label lists, numbers and durations, Grafana variables, keywords and functions."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^{}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)
    s = re.sub(r"(?<![\w:])\d[\w.+-]*", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        if word.lower() in _WORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def test_metric_names_reads_only_metric_names():
    e = ('histogram_quantile(0.99, sum by (pool, le) (rate(a_seconds_bucket{pool=~"$pool", x="b c"}'
         '[$__rate_interval]))) / on (pool) group_left(class) max(b_total offset 1h) > 2 * c:d:e'
         ' and ignoring(x) f == bool 1e3')
    assert metric_names(e) == {"a_seconds_bucket", "b_total", "c:d:e", "f"}


def exposed(text: str) -> dict:
    """The series names an exposition lets PromQL read, each with its family and type: a counter's
    ``_total``, a histogram's ``_bucket``, ``_sum`` and ``_count``, a gauge's own name (declared
    families count even before their first sample)."""
    names = {}
    fams = list(text_string_to_metric_families(text))
    timed = {f.name + "_created" for f in fams if f.type in ("counter", "histogram")}
    for fam in fams:
        if fam.name in timed:
            continue  # prometheus_client's creation time of a counter or histogram: nothing to draw
        if fam.type == "counter":
            names[fam.name + "_total"] = (fam.name, "counter")
        elif fam.type == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[fam.name + suffix] = (fam.name, "histogram")
        else:
            names[fam.name] = (fam.name, fam.type)
    return names


def dashboard_exprs(doc: dict) -> list:
    """Every PromQL expression of the dashboard: its panels' targets and its query variables."""
    out = []
    for p in doc["panels"]:
        out += [t["expr"] for t in p.get("targets", [])]
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
            out.append(m.group(1) if m else q)
    return out


def rules() -> list:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _scenario(tmp_path, router: str = "least-outstanding", max_num_seqs: int = 8, replicas: int = 2) -> str:
    doc = {"name": "dash-test",
           "workload": {"arrival": "poisson:5", "prompt": "fixed:10", "output": "fixed:5",
                        "classes": [{"name": "chat", "share": 0.7, "priority": 0},
                                    {"name": "batch", "share": 0.3, "priority": 1}]},
           "deployment": {"capacity_tokens": 65536, "step_time": "0.02", "max_num_seqs": max_num_seqs,
                          "pools": [{"name": "p", "replicas": replicas, "router": router}]},
           "run": {"duration_s": 10}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.fixture(scope="module")
def exposition(tmp_path_factory) -> str:
    """A gateway's /metrics after a few requests of both classes, streamed and whole."""
    tmp = tmp_path_factory.mktemp("dash")
    sc = _scenario(tmp)
    with EmulatorProcess("--replicas", "2", "--step-time", "0.01", "--capacity-tokens", "65536") as emu:
        with GatewayProcess("--scenario", sc, "--backend", "p=" + ",".join(emu.urls), "--out", str(tmp / "run")) as gw:
            for k, cls in enumerate(("chat", "batch", "chat")):
                r = httpx.post(gw.url + "/v1/completions", json={"prompt": [1] * 8, "max_tokens": 6, "stream": k == 0},
                               headers={"X-Request-Class": cls}, timeout=30)
                assert r.status_code == 200
            return httpx.get(gw.url + "/metrics", timeout=10).text


def test_every_metric_the_dashboard_and_rules_read_is_exported(exposition):
    names = exposed(exposition)
    doc = json.loads(DASHBOARD.read_text())
    recorded = {r["record"] for r in rules() if "record" in r}
    read = {}
    for where, exprs in (("dashboard", dashboard_exprs(doc)), ("rules", [r["expr"] for r in rules()])):
        for e in exprs:
            for n in metric_names(e):
                read.setdefault(n, set()).add(where)
                if n in recorded:
                    continue
                assert n in names, f"{where}: {n!r} in {e!r} is not in the gateway's /metrics"
                if n.endswith("_bucket"):
                    assert "histogram_quantile" in e
    for e in dashboard_exprs(doc) + [r["expr"] for r in rules()]:
        for m in re.finditer(r"histogram_quantile\(\s*[\d.]+\s*,", e):  # its argument is a histogram's buckets
            inner = metric_names(e[m.end():])
            assert any(names.get(n, ("", ""))[1] == "histogram" and n.endswith("_bucket") for n in inner) or \
                inner & recorded, e
    drawn = {names[n][0] for n in read if n in names and "dashboard" in read[n]}
    families = {f for f, _ in names.values() if f.startswith("llmqueue_gateway_")}
    assert drawn == families, f"exported but not on the dashboard: {sorted(families - drawn)}"
    # the alerts read the leading indicators the source documents name
    alerting = {n for n, w in read.items() if "rules" in w}
    for n in ("llmqueue_gateway_pool_oldest_age_seconds", "llmqueue_gateway_time_per_output_token_seconds_bucket",
              "llmqueue_gateway_requests_total", "llmqueue_gateway_utilization", "llmqueue_gateway_stable",
              "llmqueue_gateway_measured_wait_seconds", "llmqueue_gateway_predicted_wait_seconds"):
        assert n in alerting, n
    # the traffic put samples where the panels look
    fams = {f.name: f for f in text_string_to_metric_families(exposition)}
    for f in ("llmqueue_gateway_time_per_output_token_seconds", "llmqueue_gateway_time_to_first_token_seconds",
              "llmqueue_gateway_admission_wait_seconds", "llmqueue_gateway_requests",
              "llmqueue_gateway_queue_oldest_age_seconds", "llmqueue_gateway_pool_oldest_age_seconds"):
        assert fams[f].samples, f


def test_the_dashboard_is_a_grafana_dashboard_on_a_datasource_variable():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["schemaVersion"] >= 36 and doc["uid"] and doc["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["pool"]["type"] == "query" and variables["pool"]["datasource"]["uid"] == "${datasource}"
    panels = doc["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 14
    for p in graphs:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and p["title"], p
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t.get("datasource", p["datasource"]) == p["datasource"], p["title"]
            assert 'pool=~"$pool"' in t["expr"], (p["title"], t["expr"])
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
    titles = " | ".join(p["title"] for p in graphs).lower()
    for want in ("queue depth by class", "wait before admission", "shed", "cancellations", "retry amplification",
                 "per-replica outstanding", "ttft", "tpot", "predicted vs measured", "rho", "stability"):
        assert want in titles, want


def test_every_alert_has_its_fields_and_the_leading_indicators_are_covered():
    doc = yaml.safe_load(RULES.read_text())
    assert doc["groups"] and all(g["name"] and g["rules"] for g in doc["groups"])
    alerts = [r for r in rules() if "alert" in r]
    for r in rules():
        assert ("alert" in r) != ("record" in r) and r["expr"].strip(), r
        if "record" in r:
            assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", r["record"]), r["record"]  # level:metric:operations
            continue
        assert re.fullmatch(r"\d+[smh]", r["for"]), r
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r
        assert r["annotations"]["summary"].strip() and r["annotations"]["description"].strip(), r
        assert r["expr"].count("(") == r["expr"].count(")"), r["expr"]
    names = {r["alert"] for r in alerts}
    assert len(names) == len(alerts)
    by_name = {r["alert"]: r for r in alerts}
    assert "deriv(llmqueue_gateway_pool_oldest_age_seconds" in by_name["LlmqueueQueueAgeRising"]["expr"]
    assert "offset 1h" in by_name["LlmqueueInterTokenSpreadWidening"]["expr"]
    assert {"LlmqueueShedRateHigh", "LlmqueuePredictedUnstable", "LlmqueueWaitAbovePrediction"} <= names


@NEEDS_PROMTOOL
def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    for what, path in (("rules", RULES), ("config", RULES.parent / "prometheus.yml")):
        check = subprocess.run(["promtool", "check", what, str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


@NEEDS_PROMTOOL
def test_promtool_finds_the_exposition_conventional(exposition):
    lint = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _gauge(text: str, name: str, **labels) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_the_oldest_age_is_the_age_of_the_request_the_gateway_holds(tmp_path):
    """One replica, one sequence slot, the central router: a second request waits in the gateway's
    queue while the first is served (40 steps of 0.15 s). While it waits its class's oldest age is
    above 0, at most the time since the test sent it, and grows between two scrapes by the time
    between them (bounded by the scrapes' start and end on the same monotonic clock); the pool's
    no-first-token age is the same request's. Once it is served, the age is 0."""
    sc = _scenario(tmp_path, router="central", max_num_seqs=1, replicas=1)
    with EmulatorProcess("--step-time", "0.15", "--max-num-seqs", "1") as emu:
        with GatewayProcess("--scenario", sc, "--backend", f"p={emu.url}", "--out", str(tmp_path / "run")) as gw:
            def post(max_tokens, stream):
                return httpx.post(gw.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": max_tokens,
                                                                     "stream": stream},
                                  headers={"X-Request-Class": "chat"}, timeout=60)

            def scrape():
                t0 = time.perf_counter()
                text = httpx.get(gw.url + "/metrics", timeout=10).text
                return t0, text, time.perf_counter()

            with ThreadPoolExecutor(2) as pool:
                first = pool.submit(post, 40, True)  # streamed: its first token comes after one step
                deadline = time.monotonic() + 30
                while True:  # the first is served and has its first token: the pool holds no other
                    text = scrape()[1]
                    if (_gauge(text, "llmqueue_gateway_replica_outstanding", pool="p", replica="0") == 1
                            and _gauge(text, "llmqueue_gateway_pool_oldest_age_seconds", pool="p",
                                       **{"class": "chat"}) == 0.0):
                        break
                    assert time.monotonic() < deadline and not first.done(), text
                    time.sleep(0.02)
                sent = time.perf_counter()
                second = pool.submit(post, 2, False)
                while True:
                    a0, text1, a1 = scrape()
                    if _gauge(text1, "llmqueue_gateway_queue_depth", pool="p", **{"class": "chat"}) == 1:
                        break
                    assert not first.done(), "the second request was never held"
                    time.sleep(0.01)
                time.sleep(0.3)
                b0, text2, b1 = scrape()
                first_done = first.done()
                answers = [first.result(), second.result()]
            after = scrape()[1]
    assert [a.status_code for a in answers] == [200, 200]
    age1 = _gauge(text1, "llmqueue_gateway_queue_oldest_age_seconds", pool="p", **{"class": "chat"})
    assert 0 < age1 <= a1 - sent
    assert _gauge(text1, "llmqueue_gateway_pool_oldest_age_seconds", pool="p", **{"class": "chat"}) == age1
    assert _gauge(text1, "llmqueue_gateway_queue_oldest_age_seconds", pool="p", **{"class": "batch"}) in (None, 0.0)
    assert not first_done and _gauge(text2, "llmqueue_gateway_queue_depth", pool="p", **{"class": "chat"}) == 1
    age2 = _gauge(text2, "llmqueue_gateway_queue_oldest_age_seconds", pool="p", **{"class": "chat"})
    assert b0 - a1 <= age2 - age1 <= b1 - a0
    assert _gauge(after, "llmqueue_gateway_queue_oldest_age_seconds", pool="p", **{"class": "chat"}) == 0.0
    assert _gauge(after, "llmqueue_gateway_pool_oldest_age_seconds", pool="p", **{"class": "chat"}) == 0.0
    assert _gauge(after, "llmqueue_gateway_queue_depth", pool="p", **{"class": "chat"}) == 0.0
