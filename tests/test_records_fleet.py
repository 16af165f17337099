"""A fleet's records: the pools series table and file, and the optional request / time-series columns
surviving writing and reading (write_run, RunWriter with and without a journal, simulate's writer)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from _fleet_fixture import fleet_run, pool_columns, request_columns

from llmqueue.errors import InputError
from llmqueue.records import (
    POOL_COLUMNS,
    REQUEST_OPTIONAL_COLUMNS,
    PoolSeries,
    RequestRecords,
    RunWriter,
    TimeSeries,
    read_pools,
    read_run,
    read_timeseries,
    write_records,
    write_run,
)


def test_pool_series_checks():
    ps = PoolSeries.from_columns(pool_columns(t_end=10.0))
    assert len(ps) == 40 and ps.columns == list(POOL_COLUMNS)
    assert ps.pool_names() == ["main", "fallback"]
    bad = pool_columns(t_end=3.0)
    with pytest.raises(InputError, match="pools.num_waiting"):
        PoolSeries.from_columns({**bad, "num_waiting": -bad["num_waiting"] - 1})
    with pytest.raises(InputError, match="pools.t_s"):
        PoolSeries.from_columns({**bad, "t_s": np.where(bad["t_s"] == 1.0, np.nan, bad["t_s"])})
    with pytest.raises(InputError, match="pools.t_s"):
        PoolSeries.from_columns({**bad, "t_s": np.where(bad["t_s"] == 1.0, np.inf, bad["t_s"])})
    with pytest.raises(InputError, match="missing"):
        PoolSeries.from_columns({k: v for k, v in bad.items() if k != "provisioning"})


@pytest.mark.parametrize("optional", [True, False])
def test_run_directory_round_trip(tmp_path, optional):
    req, ts, pools = fleet_run(optional=optional)
    write_run(tmp_path, requests=req, timeseries=ts, pools=pools if optional else None)
    run = read_run(tmp_path)
    want = [c for c in REQUEST_OPTIONAL_COLUMNS] if optional else []
    assert [c for c in run.requests.columns if c in REQUEST_OPTIONAL_COLUMNS] == want
    for c in run.requests.columns:
        np.testing.assert_array_equal(run.requests[c], req[c])
    assert ("pool" in run.timeseries) == optional
    if optional:
        assert list(run.timeseries["pool"][:2]) == ["main", "main"]
        for c in POOL_COLUMNS:
            np.testing.assert_array_equal(run.pools[c], pools[c])
        assert pq.read_table(tmp_path / "pools.parquet").schema.metadata[b"llmqueue.kind"] == b"pools"
        assert len(read_pools(tmp_path)) == len(pools)
    else:
        assert run.pools is None and not (tmp_path / "pools.parquet").exists()


def test_an_empty_pools_series_writes_no_file(tmp_path):
    req, ts, _ = fleet_run()
    write_run(tmp_path, requests=req, pools=PoolSeries.empty())
    assert not (tmp_path / "pools.parquet").exists() and read_run(tmp_path).pools is None


def test_pools_file_is_not_read_as_another_kind(tmp_path):
    _, _, pools = fleet_run()
    p = write_records(tmp_path / "pools.parquet", pools)
    with pytest.raises(InputError, match="holds pools records"):
        read_timeseries(p)


@pytest.mark.parametrize("journal", [False, True])
def test_run_writer_keeps_the_optional_columns(tmp_path, journal):
    req, ts, pools = fleet_run()
    with RunWriter(tmp_path, journal=journal) as rw:  # the first batch declares its optional columns
        rw.write("requests", req.select(slice(0, 100)))
        rw.write("requests", req.select(slice(100, None)))
        rw.write("timeseries", ts)
        rw.write("pools", pools.to_arrow())
    run = read_run(tmp_path)
    assert run.requests.columns == req.columns and list(run.requests["model"]) == list(req["model"])
    assert "pool" in run.timeseries and len(run.pools) == len(pools)


def test_run_writer_declared_optional_columns(tmp_path):
    req, _, _ = fleet_run(optional=False)
    with RunWriter(tmp_path, optional={"requests": ["pool"]}) as rw:
        with pytest.raises(InputError, match="missing column"):
            rw.write("requests", req)
        rw.write("requests", {**req.to_dict(), "pool": np.full(len(req), "p")})
    assert set(read_run(tmp_path).requests["pool"]) == {"p"}
    with pytest.raises(InputError, match="unknown record kind"):
        RunWriter(tmp_path / "x", optional={"tokens": ["a"]})


def test_concat_where_only_some_tables_have_the_optional_columns():
    with_cols = RequestRecords.from_columns(request_columns())
    without = RequestRecords.from_columns({**request_columns(optional=False),
                                           "request_id": request_columns(optional=False)["request_id"] + 1000})
    c = RequestRecords.concat([with_cols, without])
    n = len(with_cols)
    assert set(REQUEST_OPTIONAL_COLUMNS) <= set(c.columns)
    assert list(c["pool"][n:n + 2]) == ["", ""] and list(c["prefill_replica"][n:n + 2]) == [-1, -1]
    assert np.isnan(c["kv_transfer_s"][n:]).all()
    assert list(c["model"][:2]) == list(with_cols["model"][:2])
    ts1 = TimeSeries.from_columns(t_s=[0.0], replica=[0], num_waiting=[0], num_running=[1], kv_tokens=[1], pool=["a"])
    ts2 = TimeSeries.from_columns(t_s=[1.0], replica=[1], num_waiting=[0], num_running=[1], kv_tokens=[1])
    assert list(TimeSeries.concat([ts1, ts2])["pool"]) == ["a", ""]
    ps = PoolSeries.concat([PoolSeries.from_columns(pool_columns(t_end=2.0))] * 2)
    assert len(ps) == 16


def test_simulate_writer_writes_the_pools_series(tmp_path):
    """write_outcome (llmqueue simulate -o DIR) writes a result's pools series and optional columns."""
    from types import SimpleNamespace

    from _fleet_fixture import timeseries_columns

    from llmqueue.simulate import write_outcome

    req, _, _ = fleet_run()
    steps = {"step": np.arange(2), "replica": np.zeros(2, int), "start_s": [0.0, 1.0], "duration_s": [0.5, 0.5],
             "prefill_tokens": [1, 1], "decode_seqs": [1, 1], "num_running": [1, 1], "num_waiting": [0, 0],
             "kv_tokens": [1, 1], "preempted": [0, 0]}
    res = SimpleNamespace(steps=steps, timeseries=timeseries_columns(), pools=pool_columns(t_end=5.0))
    out = SimpleNamespace(records=req, result=res, summary={"completed": 1}, theory={}, stream=None)
    write_outcome(out, tmp_path / "a")
    run = read_run(tmp_path / "a")
    assert len(run.pools) == 20 and "pool" in run.timeseries and "lane" in run.requests
    res.pools = None
    write_outcome(out, tmp_path / "b")
    assert read_run(tmp_path / "b").pools is None
