"""Record files written through a journal survive their writer being killed outright (SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _queue_sim import mm1_times, records_from_times

from llmqueue.errors import InputError
from llmqueue.records import RecordWriter, RunWriter, finish_run, is_complete, read_records, read_run
from llmqueue.records.journal import ParquetJournal, journal_path, read_journal, read_table


def _recs(n=300, seed=4):
    a, s, f = mm1_times(0.5, 1.0, n, seed=seed)
    return records_from_times(a, s, f)


def test_closed_journal_becomes_the_parquet_file(tmp_path):
    path = tmp_path / "requests.parquet"
    recs = _recs()
    with RecordWriter(path, "requests", journal=True) as w:
        w.write(recs.select(slice(0, 100)))
        assert journal_path(path).exists() and not path.exists()
        assert len(read_records(path)) == 100  # a live view of the run while it goes on
        w.write(recs.select(slice(100, 300)))
    assert path.exists() and not journal_path(path).exists()
    assert is_complete(path) is True
    back = pq.read_table(path)  # a plain Parquet file: no llmqueue needed to read it
    assert back.num_rows == 300
    np.testing.assert_array_equal(read_records(path)["finish_s"], recs["finish_s"])


def test_exception_marks_the_journaled_file_incomplete(tmp_path):
    path = tmp_path / "requests.parquet"
    with pytest.raises(RuntimeError):
        with RecordWriter(path, "requests", journal=True) as w:
            w.write(_recs().select(slice(0, 50)))
            raise RuntimeError("client crashed")
    assert len(read_records(path)) == 50 and is_complete(path) is False


def test_sigkill_loses_no_written_batch(tmp_path):
    """A process killed outright after three writes: the journal holds all three batches; a plain
    writer, written under a temporary name until closed, leaves no file (never an unreadable one)."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        from _queue_sim import mm1_times, records_from_times
        from llmqueue.records import RecordWriter
        a, s, f = mm1_times(0.5, 1.0, 300, seed=4)
        recs = records_from_times(a, s, f)
        j = RecordWriter({str(tmp_path / "requests.parquet")!r}, "requests", journal=True)
        p = RecordWriter({str(tmp_path / "plain.parquet")!r}, "requests")
        for k in range(3):
            j.write(recs.select(slice(100 * k, 100 * k + 100)))
            p.write(recs.select(slice(100 * k, 100 * k + 100)))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (tmp_path / "plain.parquet").exists()
    with pytest.raises(InputError, match="does not exist"):
        read_records(tmp_path / "plain.parquet")
    path = tmp_path / "requests.parquet"
    assert not path.exists()
    back = read_records(path)
    assert len(back) == 300
    np.testing.assert_array_equal(back["arrival_s"], _recs()["arrival_s"])
    assert is_complete(path) is False
    assert len(read_run(tmp_path).requests) == 300
    assert finish_run(tmp_path) == [path]
    assert not journal_path(path).exists() and pq.read_table(path).num_rows == 300
    assert is_complete(path) is False
    assert finish_run(tmp_path) == []


def test_a_batch_cut_short_is_dropped(tmp_path):
    path = tmp_path / "t.parquet"
    schema = pa.schema([("x", pa.int64())])
    w = ParquetJournal(path, schema)
    for k in range(3):
        w.write_table(pa.table({"x": np.arange(10 * k, 10 * k + 10)}, schema=schema))
    w._sink.close()  # the process dies here: no end-of-stream marker, no Parquet file
    jp = journal_path(path)
    full = read_journal(path)
    assert full.num_rows == 30
    data = jp.read_bytes()
    jp.write_bytes(data[:-20])  # the kill cut the last batch short
    cut = read_table(path)
    assert cut.column("x").to_pylist() == list(range(20))


def test_empty_journal_and_missing_file(tmp_path):
    path = tmp_path / "t.parquet"
    journal_path(path).write_bytes(b"")
    with pytest.raises(InputError, match="holds no schema"):
        read_journal(path)
    with pytest.raises(InputError, match="does not exist"):
        read_table(tmp_path / "none.parquet")


def test_opening_a_journal_removes_an_older_file(tmp_path):
    """A new run in an old run's directory: the old Parquet file must not pass for the new run's."""
    path = tmp_path / "requests.parquet"
    with RunWriter(tmp_path) as run:
        run.write("requests", _recs().select(slice(0, 200)))
    assert len(read_records(path)) == 200
    w = RunWriter(tmp_path, journal=True)
    w.write("requests", _recs().select(slice(0, 10)))
    assert not path.exists() and len(read_records(tmp_path)) == 10
    w.close()
    assert len(read_records(path)) == 10 and not journal_path(path).exists()


def test_empty_journaled_writer_gives_an_empty_file(tmp_path):
    path = tmp_path / "requests.parquet"
    RecordWriter(path, "requests", journal=True).close()
    assert len(read_records(path)) == 0 and is_complete(path) is True
