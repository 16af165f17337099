"""Tier shedding and graceful degradation (issue 39 items 3 and 5): on the shipped ``tiers``
scenario with and without each rule on the same seed, against the birth-death chain of an M/M/1
queue whose lower class is admitted only while the queue is empty, and in the live gateway
(a cap rewrites the body it forwards)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from llmqueue.cluster import simulate_fleet
from llmqueue.cluster.spec import FleetSpec, Gateway, Pool, Shed
from llmqueue.engine import EngineConfig
from llmqueue.engine.options import SimOptions
from llmqueue.metrics.ci import batch_means_ci
from llmqueue.workload import Workload
from llmqueue.workload.generate import RequestArrays

NO_DEGRADE = "deployment.gateway.degrade=[]"
NO_SHED = "deployment.gateway.shed=[]"


def _tiers(*sets):
    from llmqueue.simulate import run_simulation
    from llmqueue.spec import scenario_spec

    return run_simulation(scenario_spec(scenario="tiers", sets=list(sets), duration=300))


def test_shedding_the_lower_tier_changes_the_shipped_scenario():
    """Fails if shedding by tier changes nothing: the same seed with and without the rule, only the
    lower tier (summarize, priority 1) is shed, counted by class and reason, and chat waits less."""
    off = _tiers(NO_DEGRADE, NO_SHED)
    on = _tiers(NO_DEGRADE)
    refused = on.summary["fleet"]["refused"]
    assert set(refused) == {"summarize"} and refused["summarize"]["shed (priority 1)"] > 50
    assert "refused" not in off.summary["fleet"] and (off.records["status"] != "rejected").all()
    c_off, c_on = off.summary["fleet"]["classes"]["chat"], on.summary["fleet"]["classes"]["chat"]
    assert c_on["failed"] == 0 and c_on["p99_ttft_ms"] < 0.5 * c_off["p99_ttft_ms"]
    assert c_on["p99_ttft_ms"] < 2000 < c_off["p99_ttft_ms"]
    assert c_on["good_share"] > c_off["good_share"] + 0.5
    assert on.summary["fleet"]["queue_depth"]["shared"]["max_waiting"] < off.summary["fleet"]["queue_depth"]["shared"]["max_waiting"]


def test_shedding_by_queue_age_is_the_birth_death_chain():
    """M/M/1 (mu = 10: one request at a time, exponential steps), two Poisson classes: hi (5/s,
    priority 0) and lo (4/s, priority 1) shed whenever the queue age is above 0, i.e. admitted only
    into an empty system. Birth rates lam_h + lam_l in state 0, lam_h above, death mu:
    pi_1 = pi_0 (lam_h + lam_l) / mu, pi_n = pi_1 rho_h^(n-1); lo's shed share is 1 - pi_0 =
    0.643, hi's mean sojourn (E[N] + 1) / mu = 0.229 s by PASTA (against 1 / (mu - lam) = 1 s
    without the rule), lo's 1 / mu = 0.1 s."""
    lh, ll, mu = 5.0, 4.0, 10.0
    cfg = EngineConfig.from_capacity(1 << 30, max_num_seqs=1, class_priority={"hi": 0, "lo": 1})
    reqs = RequestArrays.merge(Workload(f"poisson:{lh}", prompt="fixed:1", output="fixed:1", class_name="hi")
                               .generate(seed=3, n=50_000),
                               Workload(f"poisson:{ll}", prompt="fixed:1", output="fixed:1", class_name="lo")
                               .generate(seed=4, n=40_000))
    spec = FleetSpec(pools=[Pool("p", cfg, "exp:0.1", 1)], gateway=Gateway(shed=[Shed(1, 0.0)]))
    q = simulate_fleet(spec, reqs, options=SimOptions(seed=2, sample_dt=0)).requests
    pi0 = 1.0 / (1.0 + (lh + ll) / mu / (1.0 - lh / mu))
    pi1 = pi0 * (lh + ll) / mu
    mean_n = pi1 / (1.0 - lh / mu) ** 2
    keep = (q["arrival_s"] > 200) & (q["arrival_s"] < 9000)
    hi, lo = keep & (q["class"] == "hi"), keep & (q["class"] == "lo")
    assert (q["status"][hi] == "ok").all()
    ci = batch_means_ci((q["status"][lo] == "rejected").astype(float))
    assert ci.lo <= 1.0 - pi0 <= ci.hi, (ci.estimate, 1.0 - pi0)
    ci = batch_means_ci(q["finish_s"][hi] - q["arrival_s"][hi])
    assert ci.lo <= (mean_n + 1.0) / mu <= ci.hi, (ci.estimate, (mean_n + 1.0) / mu)
    served = lo & (q["status"] == "ok")
    lo_w = float(np.mean(q["finish_s"][served] - q["arrival_s"][served]))
    assert abs(lo_w - 1.0 / mu) < 0.03 / mu, lo_w  # within 3 % (about 2 standard errors)


def test_degradation_shortens_the_queue_and_costs_the_stated_quality():
    """Under overload (no shedding), capping summaries at 256 tokens past 0.5 s of queue age lowers
    chat's TTFT tail and the queue; the capped answers are cut at the cap, marked in the records,
    and the quality-weighted share drops below 1 by (1 - 0.8) x the completed capped share."""
    off = _tiers(NO_DEGRADE, NO_SHED)
    on = _tiers(NO_SHED)
    r = on.records
    capped = r["degraded"] == "max_tokens 256"
    assert capped.sum() > 50 and set(r["class"][capped]) == {"summarize"}
    assert (r["output_tokens"][capped & (r["status"] == "ok")] <= 256).all()
    assert "degraded" not in off.records.columns
    f_on, f_off = on.summary["fleet"], off.summary["fleet"]
    assert f_on["classes"]["chat"]["p99_ttft_ms"] < 0.8 * f_off["classes"]["chat"]["p99_ttft_ms"]
    assert f_on["queue_depth"]["shared"]["mean_waiting"] < 0.5 * f_off["queue_depth"]["shared"]["mean_waiting"]
    done = f_on["pools"]["shared"]["completed"]
    n_capped = f_on["degraded"]["summarize"]["max_tokens 256"]
    share = f_on["quality"]["quality_weighted_share"]
    assert share < 1.0 and abs(share - (1.0 - 0.2 * n_capped / done)) < 1e-12
    assert f_off["quality"]["quality_weighted_share"] == 1.0


def test_the_live_gateway_caps_the_body_it_forwards(tmp_path):
    """The same rule in front of emulated engines: while the pool's queue is not empty (queue age
    above 0), a chat request's max_tokens is rewritten to the cap; the engine answers that many
    tokens, the record says ``degraded``, and workload.parquet keeps what the client asked."""
    import pyarrow.parquet as pq
    import yaml

    from llmqueue.records import read_records
    from llmqueue.serve.launch import EmulatorProcess, GatewayProcess

    doc = {"name": "gw-degrade",
           "workload": {"arrival": "poisson:5", "prompt": "fixed:10", "output": "fixed:5",
                        "classes": [{"name": "chat", "share": 1.0}]},
           "deployment": {"capacity_tokens": 65536, "step_time": "0.02", "max_num_seqs": 1,
                          "pools": [{"name": "p", "replicas": 1, "router": "central"}],
                          "gateway": {"degrade": [{"pool": "p", "queue_age_s": 0, "max_tokens": 3,
                                                   "quality": 0.5}]}},
           "run": {"duration_s": 10}}
    sc = tmp_path / "gw.yaml"
    sc.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"

    async def burst(url):
        async with httpx.AsyncClient(timeout=30) as c:
            return await asyncio.gather(*(c.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 20})
                                          for _ in range(6)))

    with EmulatorProcess("--step-time", "0.02", "--capacity-tokens", "65536", "--max-num-seqs", "1") as emu:
        with GatewayProcess("--scenario", str(sc), "--backend", f"p={emu.url}", "--out", str(out)) as gw:
            answers = asyncio.run(burst(gw.url))
    got = sorted(a.json()["usage"]["completion_tokens"] for a in answers)
    assert all(a.status_code == 200 for a in answers)
    assert got[0] == 3 and got[-1] == 20, got
    rec = read_records(out).to_dict()
    cut = rec["degraded"] == "max_tokens 3"
    assert cut.any() and (rec["output_tokens"][cut] == 3).all() and (rec["output_tokens"][~cut] == 20).all()
    assert (pq.read_table(out / "workload.parquet").column("output_tokens").to_numpy() == 20).all()
