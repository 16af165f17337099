"""Tests of llmqueue.records: validation, derived latencies, Parquet I/O, incremental writes."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from _queue_sim import mm1_times, records_from_times, table

from llmqueue.errors import InputError
from llmqueue.records import (
    REQUEST_COLUMNS,
    STATUSES,
    RecordWriter,
    RequestRecords,
    RunWriter,
    StepRecords,
    TimeSeries,
    is_complete,
    read_records,
    read_run,
    read_steps,
    write_records,
    write_run,
)


def _steps(n=4, with_steps=False):
    cols = {"step": np.arange(n), "replica": np.zeros(n, int), "start_s": np.arange(n) * 0.1,
            "duration_s": np.full(n, 0.05), "prefill_tokens": np.zeros(n, int),
            "decode_seqs": np.full(n, 3), "num_running": np.full(n, 3),
            "num_waiting": np.zeros(n, int), "kv_tokens": np.full(n, 160),
            "preempted": np.zeros(n, int)}
    if with_steps:
        cols["steps"] = np.full(n, 2)
    return StepRecords.from_columns(cols)


# --- validation ---------------------------------------------------------------------------------


def test_from_columns_builds_typed_columns():
    r = table([{"arrival_s": 0, "first_scheduled_s": 0.5, "first_token_s": 1.0, "finish_s": 3.0,
                "output_tokens": 5}])
    assert len(r) == 1
    assert r["arrival_s"].dtype == np.float64 and r["prompt_tokens"].dtype == np.int64
    assert r["status"].dtype.kind == "U" and r["class"][0] == "chat"
    assert list(r.columns) == list(REQUEST_COLUMNS)


@pytest.mark.parametrize("change, field", [
    (lambda c: c.pop("finish_s"), "requests"),                      # missing column
    (lambda c: c.update(bogus=[1]), "requests"),                     # unknown column
    (lambda c: c.update(prompt_tokens=[1, 2]), "requests"),          # length mismatch
    (lambda c: c.update(status=["done"]), "requests.status"),        # unknown status
    (lambda c: c.update(finish_s=[np.nan]), "requests.finish_s"),    # ok without finish
    (lambda c: c.update(status=["unfinished"]), "requests.finish_s"),  # in flight, yet finished
    (lambda c: c.update(status=["done"]), "requests.status"),
    (lambda c: c.update(arrival_s=[np.nan]), "requests.arrival_s"),
    (lambda c: c.update(finish_s=[-1.0]), "requests.finish_s"),      # before arrival
    (lambda c: c.update(output_tokens=[-1]), "requests.output_tokens"),
    (lambda c: c.update(output_tokens=[1.5]), "requests.output_tokens"),
])
def test_from_columns_rejects_bad_input(change, field):
    cols = table([{"arrival_s": 0.0, "finish_s": 1.0}]).to_dict()
    change(cols)
    with pytest.raises(InputError) as e:
        RequestRecords.from_columns(cols)
    assert e.value.field == field


def test_one_status_per_attempt():
    with pytest.raises(InputError, match="appears more than once"):
        RequestRecords.from_columns({**table([{"arrival_s": 0.0, "finish_s": 1.0}] * 2).to_dict(),
                                     "request_id": [7, 7]})
    # a retry is a new attempt of the same request
    r = RequestRecords.from_columns({**table([{"arrival_s": 0.0, "finish_s": 1.0, "status": "timeout"},
                                              {"arrival_s": 1.0, "finish_s": 2.0}]).to_dict(),
                                     "request_id": [7, 7], "attempt": [1, 2]})
    assert list(r["status"]) == ["timeout", "ok"]


def test_in_flight_requests_have_nan_finish():
    """Still in the system when the run stopped: status unfinished, finish NaN."""
    assert STATUSES == ("ok", "rejected", "timeout", "cancelled", "error", "unfinished")
    r = table([{"arrival_s": 0.0, "status": "unfinished", "finish_s": np.nan},
               {"arrival_s": 1.0, "status": "cancelled", "finish_s": 2.0}])
    assert list(r.in_flight()) == [True, False]


def test_derived_matches_vllm_definitions():
    r = table([
        {"arrival_s": 1.0, "first_scheduled_s": 1.5, "first_token_s": 2.0, "finish_s": 6.0,
         "output_tokens": 5},
        {"arrival_s": 2.0, "first_scheduled_s": 2.0, "first_token_s": 2.5, "finish_s": 2.5,
         "output_tokens": 1},
        {"arrival_s": 3.0, "finish_s": 3.0, "status": "rejected", "output_tokens": 0},
    ])
    d = r.derived()
    assert d["queue_s"][0] == 0.5 and d["ttft_s"][0] == 1.0 and d["e2el_s"][0] == 5.0
    assert d["tpot_s"][0] == pytest.approx((5.0 - 1.0) / 4)
    assert math.isnan(d["tpot_s"][1]) and math.isnan(d["tpot_s"][2])  # <= 1 output token
    assert math.isnan(d["ttft_s"][2]) and d["e2el_s"][2] == 0.0


def test_concat_and_select():
    a = table([{"arrival_s": 0.0, "finish_s": 1.0}])
    b = RequestRecords.from_columns({**table([{"arrival_s": 2.0, "finish_s": 3.0}]).to_dict(),
                                     "request_id": [1]})
    c = RequestRecords.concat([a, b])
    assert len(c) == 2 and list(c["arrival_s"]) == [0.0, 2.0]
    assert len(c.select(c["arrival_s"] > 1)) == 1
    assert len(RequestRecords.concat([])) == 0
    s = StepRecords.concat([_steps(2), _steps(2, with_steps=True)])  # optional column filled
    assert list(s.step_counts()) == [1, 1, 2, 2]


def test_step_and_timeseries_tables():
    s = _steps(3, with_steps=True)
    assert "steps" in s and list(s.step_counts()) == [2, 2, 2]
    with pytest.raises(InputError, match="steps.steps"):
        StepRecords.from_columns({**s.to_dict(), "steps": [0, 1, 1]})
    ts = TimeSeries.from_columns(t_s=[0.0, 1.0], replica=[0, 0], num_waiting=[0, 2],
                                 num_running=[1, 1], kv_tokens=[16, 32])
    assert len(ts) == 2
    with pytest.raises(InputError, match="timeseries"):
        TimeSeries.from_columns(t_s=[0.0], replica=[0], num_waiting=[0], num_running=[1])


def test_to_pandas_optional():
    r = table([{"arrival_s": 0.0, "finish_s": 1.0}])
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            r.to_pandas()
    else:
        df = r.to_pandas()
        assert list(df.columns) == list(REQUEST_COLUMNS) and df["status"][0] == "ok"


# --- Parquet --------------------------------------------------------------------------------------


def test_parquet_round_trip(tmp_path):
    a, s, f = mm1_times(0.5, 1.0, 500, seed=3)
    recs = records_from_times(a, s, f, horizon=a[400], classes=("chat", "batch"), late=20)
    assert recs.in_flight().sum() > 20  # in flight at the stop, and 20 late arrivals
    path = write_records(tmp_path / "requests.parquet", recs)
    back = read_records(path)
    for c in REQUEST_COLUMNS:
        np.testing.assert_array_equal(back[c], recs[c])
    # loads in one call without llmqueue (pandas.read_parquet / polars.read_parquet work alike)
    t = pq.read_table(path)
    assert t.num_rows == len(recs) and t.schema.field("class").type == "string"
    assert t.schema.metadata[b"llmqueue.kind"] == b"requests"
    with pytest.raises(InputError, match="holds requests records"):
        read_steps(path)


def test_incremental_writes_survive_exception(tmp_path):
    path = tmp_path / "requests.parquet"
    a, s, f = mm1_times(0.5, 1.0, 300, seed=4)
    recs = records_from_times(a, s, f)
    with pytest.raises(RuntimeError, match="simulator crashed"):
        with RecordWriter(path, "requests") as w:
            w.write(recs.select(slice(0, 100)))
            w.write(recs.select(slice(100, 200)).to_dict())  # a plain column mapping works too
            raise RuntimeError("simulator crashed")
    back = read_records(path)
    assert len(back) == 200
    np.testing.assert_array_equal(back["arrival_s"], recs["arrival_s"][:200])
    assert pq.ParquetFile(path).num_row_groups == 2  # one row group per batch
    assert is_complete(path) is False
    write_records(tmp_path / "ok.parquet", recs)
    assert is_complete(tmp_path / "ok.parquet") is True


def test_writer_rejects_wrong_batches(tmp_path):
    with RecordWriter(tmp_path / "s.parquet", "steps") as w:
        with pytest.raises(InputError, match="optional"):
            w.write(_steps(2, with_steps=True))
        with pytest.raises(InputError):
            w.write({"step": [1]})
        w.write(_steps(2))
    assert len(read_steps(tmp_path / "s.parquet")) == 2
    with RecordWriter(tmp_path / "s2.parquet", "steps", optional=["steps"]) as w:
        w.write(_steps(3, with_steps=True))
    assert list(read_steps(tmp_path / "s2.parquet")["steps"]) == [2, 2, 2]
    with pytest.raises(InputError, match="unknown record kind"):
        RecordWriter(tmp_path / "x.parquet", "nonsense")


def test_arrow_batches_and_from_arrow(tmp_path):
    a, s, f = mm1_times(0.5, 1.0, 50, seed=6)
    recs = records_from_times(a, s, f)
    with RecordWriter(tmp_path / "r.parquet", "requests") as w:
        w.write(recs.to_arrow())
    back = read_records(tmp_path / "r.parquet")
    np.testing.assert_array_equal(back["finish_s"], recs["finish_s"])
    assert len(RequestRecords.from_arrow(recs.to_arrow().to_batches()[0])) == 50


def test_empty_writer_gives_empty_readable_file(tmp_path):
    with RecordWriter(tmp_path / "e.parquet", REQUEST_COLUMNS):
        pass
    assert len(read_records(tmp_path / "e.parquet")) == 0


def test_run_directory(tmp_path):
    a, s, f = mm1_times(0.5, 1.0, 200, seed=5)
    recs = records_from_times(a, s, f)
    ts = TimeSeries.from_columns(t_s=[0.0, 1.0], replica=[0, 0], num_waiting=[0, 2],
                                 num_running=[1, 1], kv_tokens=[16, 32])
    write_run(tmp_path / "run", requests=recs, steps=_steps(), timeseries=ts,
              summary={"completed": 200, "p99_ttft_ms": float("nan")})
    run = read_run(tmp_path / "run")
    assert len(run.requests) == 200 and len(run.steps) == 4 and len(run.timeseries) == 2
    assert run.summary == {"completed": 200, "p99_ttft_ms": None}  # NaN -> null
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed"] == 200
    assert len(read_records(tmp_path / "run")) == 200  # a directory works too

    with pytest.raises(KeyError):
        with RunWriter(tmp_path / "run2", step_optional=["steps"]) as rw:
            rw.write("requests", recs.select(slice(0, 50)))
            rw.write("steps", _steps(2, with_steps=True))
            raise KeyError("boom")
    run2 = read_run(tmp_path / "run2")
    assert len(run2.requests) == 50 and len(run2.steps) == 2 and run2.timeseries is None


def test_unreadable_file(tmp_path):
    p = tmp_path / "broken.parquet"
    p.write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        read_records(p)
