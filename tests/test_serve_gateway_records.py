"""A gateway run's files as it goes (serve/gateway_records.py): the arrivals reach the disk with
the records, through a journal (a long run keeps none of them in memory; a killed one leaves them
readable), and ``workload.parquet`` comes out by arrival whatever order the requests ended in."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq

from llmqueue.records.journal import read_journal
from llmqueue.serve.gateway_records import GatewayRecords


def _q(k: int, t: float):
    r = SimpleNamespace(request_id=k, num_prompt_tokens=10 + k % 7)
    return SimpleNamespace(r=r, cls="chat", t_arrival=t, asked=32, t_dispatch=t + 0.001, first=t + 0.01,
                           finish=t + 0.1, out_tokens=32, status="ok", attempt=1, pool="p", lane="chat",
                           tenant="t", reason="", degraded=None)


def test_arrivals_are_journaled_with_the_records_and_come_out_by_arrival(tmp_path):
    rng = random.Random(2)
    arrivals = sorted(rng.uniform(0, 100) for _ in range(500))
    ended = list(range(500))
    rng.shuffle(ended)  # requests end in another order than they came
    rec = GatewayRecords(tmp_path / "run", 0.0)
    for j, k in enumerate(ended):
        rec.add(_q(k, arrivals[k]), 0, "m")
        if j % 64 == 63:
            rec.flush()
            assert rec.offered == []   # nothing kept past a flush
    rec.flush()
    journaled = read_journal(tmp_path / "run" / "workload.parquet")   # what a kill would leave
    assert journaled.num_rows == 500
    rec.close()
    wl = pq.read_table(tmp_path / "run" / "workload.parquet").to_pydict()
    assert wl["request_id"] == list(range(500)) and wl["arrival_s"] == arrivals
    assert wl["output_tokens"] == [32] * 500 and wl["prompt_tokens"] == [10 + k % 7 for k in range(500)]
    assert not (tmp_path / "run" / "workload.parquet.journal").exists()
    assert np.all(np.diff(wl["arrival_s"]) >= 0)


def test_a_run_that_served_nothing_has_an_empty_workload(tmp_path):
    rec = GatewayRecords(tmp_path / "run", 0.0)
    rec.close()
    wl = pq.read_table(tmp_path / "run" / "workload.parquet")
    assert wl.num_rows == 0 and wl.column_names == ["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"]
