"""The black-box path (issue 38 item 3): a server that publishes neither an iteration log nor
vLLM's ``cache_config_info`` (the stub) goes profile -> bench -> calibrate -> validate as the
README shows it: ``calibrate --profile`` takes the engine settings the profile was given and the
profile's own level when the run has no step records; without a profile, calibrate takes the
settings as its own flags."""

from __future__ import annotations

import json

import pytest
from _cli import run_cli

pytest.importorskip("aiohttp")

STEPS = "1:0.010,2:0.012,4:0.016,8:0.024"


@pytest.fixture(scope="module")
def server():
    from llmqueue.bench.stub_server import StubServer

    with StubServer(decode_steps=STEPS, first_token_delay_s=0.02, prefill_token_s=5e-5, max_model_len=4096) as s:
        yield s


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory):
    d = tmp_path_factory.mktemp("blackbox")
    r = run_cli("profile", "--url", server.url, "--model", server.model, "--out", str(d / "profile"),
                "--server-max-num-seqs", "8", "--server-max-num-batched-tokens", "2048", "--server-block-size", "16",
                "--server-num-gpu-blocks", "4000", "--contexts", "32", "--output-tokens", "30", "--no-progress")
    assert r.code == 0, r.err
    r = run_cli("bench", "--url", server.url, "--model", server.model, "--prompt-len", "uniform:20:200",
                "--output-len", "uniform:10:60", "--request-rate", "5", "--duration", "20", "--seed", "1",
                "--no-progress", "--out", str(d / "b"))
    assert r.code == 0, r.err
    sj = d / "b" / "server.json"   # the stub publishes no settings: nothing or nothing useful recorded
    server_json = json.loads(sj.read_text()) if sj.exists() else {}
    assert server_json.get("max_num_seqs") is None and server_json.get("num_gpu_blocks") is None
    assert not (d / "b" / "steps.parquet").exists()
    return d


def test_calibrate_takes_the_profiles_settings_and_level_and_validate_runs(runs):
    cal = runs / "cal.yaml"
    r = run_cli("calibrate", str(runs / "b"), "--profile", str(runs / "profile"), "-o", str(cal), "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["capacity_tokens"] == (4000 - 1) * 16   # usable blocks (vLLM keeps one null block) x block size
    assert doc["engine"]["max_num_seqs"] == 8 and doc["engine"]["max_num_batched_tokens"] == 2048
    assert doc["profile_scale"] == 1.0 and doc["step_time"].endswith(":scale=1")
    notes = " ".join(doc["notes"])
    assert "profile's server.json" in notes and "its own level" in notes
    r = run_cli("validate", str(runs / "b"), "--calibration", str(cal), "--step-model", "profile", "--json")
    assert r.code == 0, r.err
    v = json.loads(r.out)
    sim = v["simulated"] if "simulated" in v else v
    assert sim  # a prediction was made
    assert "median_tpot_ms" in json.dumps(v)


def test_without_a_profile_calibrate_takes_the_settings_as_flags(runs):
    r = run_cli("calibrate", str(runs / "b"), "-o", str(runs / "c2.yaml"))
    assert r.code == 2 and "max_num_seqs" in r.err and "--max-num-seqs" in r.err
    r = run_cli("calibrate", str(runs / "b"), "-o", str(runs / "c2.yaml"), "--max-num-seqs", "8",
                "--max-num-batched-tokens", "2048", "--capacity-tokens", "64000", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["capacity_tokens"] == 64000
