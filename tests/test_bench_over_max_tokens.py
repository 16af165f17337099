"""``bench``'s client checks flag a server that streams more tokens than ``max_tokens`` asked
(issue 37, item 9): the summary's client check line names it (``client.verdict``,
``client.max_tokens_ok``, ``client.over_max_tokens``) and the records keep the server's counts.
Before, the line said only whether the client sent on schedule.

Against the stub server (``misbehave="over-max-tokens"``: three times ``max_tokens``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _cli import run_cli

from llmqueue.bench.stub_server import StubServer
from llmqueue.records import read_records

ASKED = 4

# (id, stub options, whether the client check names the server)
CASES = [
    ("honest-server", {}, False),
    ("every-answer-3x", {"misbehave": "over-max-tokens", "misbehave_fraction": 1.0}, True),
    ("some-answers-3x", {"misbehave": "over-max-tokens", "misbehave_fraction": 0.4}, True),
]


@pytest.mark.parametrize("options, flagged", [pytest.param(o, f, id=i) for i, o, f in CASES])
def test_the_client_check_names_a_server_streaming_more_than_max_tokens(tmp_path, options, flagged):
    out_dir = tmp_path / "run"
    with StubServer(token_delay_s=0.001, seed=3, **options) as s:
        code, out, err = run_cli("bench", "--url", s.url, "--model", "m", "--arrival", "poisson:100",
                                 "--prompt", "fixed:8", "--output", f"fixed:{ASKED}", "--num-requests", "20",
                                 "--out", str(out_dir), "--json", "--no-progress")
        bad = s.stats()["misbehaved"]
    assert code == 0, err
    client = json.loads(out)["client"]
    r = read_records(out_dir)
    over = r["output_tokens"] > ASKED
    # the records keep the server's counts
    assert int(over.sum()) == bad and (r["output_tokens"][over] == 3 * ASKED).all()
    assert client["max_tokens_ok"] is (not flagged)
    assert client["over_max_tokens"]["attempts"] == bad
    if flagged:
        assert bad > 0
        assert client["over_max_tokens"]["max_ratio"] == 3.0
        assert client["over_max_tokens"]["worst"]["output_tokens"] == 3 * ASKED
        assert client["over_max_tokens"]["worst"]["max_tokens"] == ASKED
        assert f"more tokens than max_tokens in {bad} of 20 ok attempts" in client["verdict"]
        assert "3x" in client["verdict"]
    else:
        assert "max_tokens" not in client["verdict"]
    # the table's client check line says the same
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["client"]["verdict"] == client["verdict"]
    assert np.isfinite(r["finish_s"][r["status"] == "ok"]).all()


def test_the_table_prints_it_on_the_client_check_line(tmp_path):
    with StubServer(token_delay_s=0.001, seed=3, misbehave="over-max-tokens") as s:
        code, out, err = run_cli("bench", "--url", s.url, "--model", "m", "--arrival", "poisson:100",
                                 "--prompt", "fixed:8", "--output", f"fixed:{ASKED}", "--num-requests", "10",
                                 "--out", str(tmp_path / "run"), "--no-progress")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("client check"))
    assert "more tokens than max_tokens in 10 of 10 ok attempts" in line
