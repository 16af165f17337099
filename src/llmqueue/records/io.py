"""Parquet files for records, written incrementally, and the run-directory layout.

A run directory holds::

    requests.parquet     one row per request attempt      (RequestRecords)
    steps.parquet        one row per engine iteration     (StepRecords, optional)
    timeseries.parquet   sampled engine state             (TimeSeries, optional)
    pools.parquet        a fleet's pools over time        (PoolSeries, optional: fleets only)
    summary.json         llmqueue.metrics.summarize(...)  (optional)

Each Parquet file loads into a data frame with one call and no llmqueue import:
``pandas.read_parquet("run/requests.parquet")`` or ``polars.read_parquet(...)``; here,
:func:`read_records` returns a validated :class:`~llmqueue.records.table.RequestRecords`.

Incremental writing: :class:`RecordWriter` appends one Parquet row group per ``write()`` and
writes the footer on ``close()``; used as a context manager it closes on any exception
(including ``KeyboardInterrupt``), so every batch written before the failure stays readable,
and the file's metadata says ``llmqueue.complete = false``. A process killed outright
(SIGKILL, the OOM killer) never writes the footer, and a Parquet file without one cannot be
read: ``RecordWriter(..., journal=True)`` (the benchmark client's choice; see
:mod:`llmqueue.records.journal`) writes each batch to an Arrow IPC journal beside the file
(``requests.parquet.journal``) and the Parquet file at ``close()``. The readers here read a
journal a killed writer left behind (every whole batch; :func:`is_complete` says ``False``), and
:func:`finish_run` turns a run directory's journals into its Parquet files.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmqueue._files import staged, write_atomic, write_error, write_failed
from llmqueue._result import _plain
from llmqueue.errors import InputError
from llmqueue.records.journal import (
    JOURNAL_SUFFIX,
    ParquetJournal,
    exists,
    finish_journal,
    journal_path,
    read_journal,
)
from llmqueue.records.table import (
    KIND_KEY,
    TABLES,
    PoolSeries,
    RequestRecords,
    StepRecords,
    TimeSeries,
    _Table,
    arrow_schema,
    table_class,
)

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
TIMESERIES_FILE = "timeseries.parquet"
POOLS_FILE = "pools.parquet"
SUMMARY_FILE = "summary.json"

_COMPLETE_KEY = b"llmqueue.complete"


class RecordWriter:
    """Append record batches to one Parquet file, one row group per batch.

    ``schema``: ``"requests"`` / ``"steps"`` / ``"timeseries"``, the matching table class, or
    the schema's column dict (``REQUEST_COLUMNS``...). ``optional`` adds optional columns
    (``["steps"]``). Batches may be record tables, column mappings (validated with
    ``from_columns``) or Arrow tables/record batches with the same columns.

        with RecordWriter("run/requests.parquet", "requests") as w:
            for batch in simulation:          # an exception here keeps earlier batches
                w.write(batch)

    ``rows`` counts rows written. Closing twice is harmless. ``journal=True``: write through an
    Arrow IPC journal (:class:`~llmqueue.records.journal.ParquetJournal`), so that a process
    killed outright loses no written batch; the Parquet file appears at ``close()``.
    """

    def __init__(self, path, schema="requests", *, optional=(), compression: str = "zstd",
                 journal: bool = False):
        self.cls = table_class(schema)
        self.path = Path(path)
        self.schema = arrow_schema(self.cls.KIND, optional)
        self._staged = None
        self.closed = True  # until opened: __del__ has nothing to close
        if journal:
            self._writer = ParquetJournal(self.path, self.schema, compression=compression)
        else:
            self._staged = staged(self.path)
            try:
                self._writer = pq.ParquetWriter(str(self._staged.tmp), self.schema, compression=compression)
            except BaseException as e:
                self._staged.discard()
                if isinstance(e, OSError):
                    raise write_error("out", self.path, e) from None
                raise
        self.rows = 0
        self.closed = False

    def write(self, batch) -> None:
        if self.closed:
            raise InputError("RecordWriter", f"{self.path} is closed")
        if isinstance(batch, (pa.Table, pa.RecordBatch)):
            batch = self.cls.from_arrow(batch)
        elif isinstance(batch, Mapping):
            batch = self.cls.from_columns(batch)
        elif not isinstance(batch, self.cls):
            raise InputError("batch", f"expected {self.cls.__name__}, a column mapping or an "
                             f"Arrow table (got {type(batch).__name__})")
        if len(batch) == 0:
            return
        cols = batch.to_dict()
        names = self.schema.names
        missing = [n for n in names if n not in cols]
        if missing:
            raise InputError("batch", f"missing column(s) {missing} declared for this file")
        extra = [n for n in cols if n not in names]
        if extra:
            raise InputError("batch", f"column(s) {extra} not declared for this file",
                             f"open the writer with optional={extra}")
        table = pa.Table.from_arrays([pa.array(cols[f.name], type=f.type) for f in self.schema],
                                     schema=self.schema)
        try:
            self._writer.write_table(table, row_group_size=max(len(batch), 1))
        except OSError as e:  # a full disk: nothing half-written is left under the file's name
            self.abort()
            raise write_error("out", self.path, e) from None
        self.rows += len(batch)

    def close(self, *, complete: bool = True) -> None:
        """Write the footer and put the file in place (it was written under a temporary name in
        its folder: a reader never sees part of it). ``complete=False`` marks the file as cut
        short (still readable). A full disk removes the temporary file and raises one InputError
        naming the file."""
        if self.closed:
            return
        self.closed = True
        try:
            self._writer.add_key_value_metadata({_COMPLETE_KEY: b"true" if complete else b"false"})
            self._writer.close()
        except BaseException as e:
            if self._staged is not None:
                self._staged.discard()
            if isinstance(e, OSError):
                raise write_error("out", self.path, e) from None
            raise
        if self._staged is not None:
            self._staged.commit()

    def abort(self) -> None:
        """Close without putting the file in place: the temporary file is removed and a previous
        file at ``path`` stays as it was (a journal stays, readable: see ParquetJournal)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            (getattr(self._writer, "abort", None) or self._writer.close)()
        if self._staged is not None:
            self._staged.discard()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not write_failed(exc):
            self.close(complete=exc_type is None)
        elif self._staged is not None:
            self.abort()  # the disk failed: keep no part of the file, the previous one stays
        else:
            with contextlib.suppress(Exception):  # a journal: its Parquet file if the disk allows
                self.close(complete=False)
        return False

    def __del__(self):  # best effort if the caller forgot close()
        try:
            if not self.closed:
                self.close(complete=False)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _read(path, cls: type[_Table]):
    path = Path(path)
    if path.exists() or path.is_symlink():
        from llmqueue._files import input_file

        input_file("path", path)  # a FIFO would block the reader, a symlink loop would raise
        try:
            pf = pq.ParquetFile(str(path))
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError("path", f"{path} is not a readable Parquet file ({e})",
                             "a writer killed before close() leaves no footer") from None
        schema, read = pf.schema_arrow, pf.read
    elif journal_path(path).exists():  # a writer killed outright: its whole batches
        table = read_journal(path)
        schema, read = table.schema, lambda: table
    else:
        raise InputError("path", f"{path} does not exist")
    kind = (schema.metadata or {}).get(KIND_KEY)
    if kind is not None and kind.decode() != cls.KIND:
        raise InputError("path", f"{path} holds {kind.decode()} records, not {cls.KIND}")
    return cls.from_arrow(read())


def read_records(path) -> RequestRecords:
    """Read and validate ``requests.parquet`` (or a run directory holding it)."""
    path = Path(path)
    return _read(path / REQUESTS_FILE if path.is_dir() else path, RequestRecords)


def read_steps(path) -> StepRecords:
    """Read and validate ``steps.parquet`` (or a run directory holding it)."""
    path = Path(path)
    return _read(path / STEPS_FILE if path.is_dir() else path, StepRecords)


def read_timeseries(path) -> TimeSeries:
    """Read and validate ``timeseries.parquet`` (or a run directory holding it)."""
    path = Path(path)
    return _read(path / TIMESERIES_FILE if path.is_dir() else path, TimeSeries)


def read_pools(path) -> PoolSeries:
    """Read and validate ``pools.parquet`` (or a run directory holding it)."""
    path = Path(path)
    return _read(path / POOLS_FILE if path.is_dir() else path, PoolSeries)


def is_complete(path) -> bool | None:
    """Whether a file's writer closed normally (``None`` if the file does not say; ``False`` for a
    journal a killed writer left behind)."""
    if not Path(path).exists() and journal_path(path).exists():
        return False
    meta = pq.ParquetFile(str(path)).metadata.metadata or {}
    flag = meta.get(_COMPLETE_KEY)
    return None if flag is None else flag == b"true"


def write_records(path, records: _Table, *, compression: str = "zstd") -> Path:
    """Write one table to a Parquet file in one go."""
    optional = [c for c in records.OPTIONAL if c in records]
    with RecordWriter(path, type(records), optional=optional, compression=compression) as w:
        w.write(records)
    return Path(path)


def dump_summary(path, summary: Mapping) -> Path:
    """Write a summary dict as JSON (NaN and inf become null, numpy scalars plain numbers)."""
    return write_atomic(path, json.dumps(_plain(dict(summary)), indent=2, allow_nan=False) + "\n")


@dataclass(frozen=True)
class Run:
    """The contents of a run directory; absent files are ``None``."""

    requests: RequestRecords
    steps: StepRecords | None = None
    timeseries: TimeSeries | None = None
    summary: dict | None = None
    pools: PoolSeries | None = None
    #: the files read from the journal a writer killed outright left (``requests.parquet``, ...)
    journals: tuple[str, ...] = ()

    @property
    def notes(self) -> list[str]:
        """What a reader of this run must be told: that it was read from the journals of a writer
        killed outright (every whole batch it wrote, none after the kill), and without its summary."""
        if not self.journals:
            return []
        note = (f"read from the journal{'s' if len(self.journals) > 1 else ''} of a run killed before its end "
                f"({', '.join(n + JOURNAL_SUFFIX for n in self.journals)}): every request it had recorded, "
                "none after the kill")
        if self.summary is None:
            note += " (no summary.json: a summary, where needed, is computed from the records)"
        return [note]


def write_run(directory, *, requests: RequestRecords, steps: StepRecords | None = None,
              timeseries: TimeSeries | None = None, summary: Mapping | None = None,
              pools: PoolSeries | None = None) -> Path:
    """Write a run directory (see the module docstring for the layout).

    Optional columns a table carries (a fleet's ``pool``, ``lane``, ``model``... on requests,
    ``pool`` on the time series) are written with it. ``pools`` (a fleet's pools series) is
    written as ``pools.parquet`` when given with rows."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    write_records(d / REQUESTS_FILE, requests)
    if steps is not None:
        write_records(d / STEPS_FILE, steps)
    if timeseries is not None:
        write_records(d / TIMESERIES_FILE, timeseries)
    if pools is not None and len(pools):
        write_records(d / POOLS_FILE, pools)
    if summary is not None:
        dump_summary(d / SUMMARY_FILE, summary)
    return d


def _checked_summary(path: Path, summary):
    """A run's summary as :func:`dump_summary` writes it: a JSON object without NaN or infinity
    (it writes them as null); anything else is one line naming the key."""
    if not isinstance(summary, dict):
        raise InputError("directory", f"{path} holds a JSON {type(summary).__name__}, not a run summary (an object)",
                         "rewrite it with the command that made the run, or remove it")

    def walk(x, key):
        if isinstance(x, float) and not math.isfinite(x):
            raise InputError("directory", f"{path} holds {json.dumps(x)} at {key} (not JSON: a run summary writes null)",
                             "rewrite it with the command that made the run, or remove it")
        for k, v in (x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()):
            walk(v, f"{key}.{k}" if isinstance(k, str) else f"{key}[{k}]")

    for k, v in summary.items():
        walk(v, str(k))
    return summary


def read_run(directory) -> Run:
    """Read a run directory written by :func:`write_run` or :class:`RunWriter`, or the journals of
    one whose writer was killed outright (``Run.journals`` names them; ``Run.notes`` says so)."""
    d = Path(directory)
    if not exists(d / REQUESTS_FILE):
        raise InputError("directory", f"{d} has no {REQUESTS_FILE}")
    summary = None
    if (d / SUMMARY_FILE).exists() or (d / SUMMARY_FILE).is_symlink():
        from llmqueue._files import input_file, load_json

        summary = _checked_summary(d / SUMMARY_FILE, load_json("directory", input_file("directory", d / SUMMARY_FILE)))
    return Run(
        requests=read_records(d / REQUESTS_FILE),
        steps=read_steps(d / STEPS_FILE) if exists(d / STEPS_FILE) else None,
        timeseries=read_timeseries(d / TIMESERIES_FILE) if exists(d / TIMESERIES_FILE) else None,
        summary=summary,
        pools=read_pools(d / POOLS_FILE) if exists(d / POOLS_FILE) else None,
        journals=left_journals(d),
    )


def left_journals(directory) -> tuple[str, ...]:
    """The files of a run directory that only their journal holds (a writer killed outright:
    ``requests.parquet``, ``tokens.parquet``, ...), in name order."""
    d = Path(directory)
    names = (j.name[: -len(JOURNAL_SUFFIX)] for j in d.glob(f"*.parquet{JOURNAL_SUFFIX}"))
    return tuple(sorted(n for n in names if not (d / n).exists()))


class RunWriter:
    """Incremental writers for a whole run directory, opened on first use.

        with RunWriter("runs/r1") as run:
            run.write("requests", finished_batch)
            run.write("steps", step_batch)
            ...
            run.write_summary(summarize(...))

    On an exception every opened file is closed (finished batches stay readable).
    ``journal=True``: each file is written through a journal (see :class:`RecordWriter`).
    ``step_optional`` lists optional step columns (``["steps"]``) the simulator emits;
    ``optional`` maps any kind to its optional columns (``{"requests": ["pool", "lane",
    "model", "prefill_replica", "kv_transfer_s", "decode_scheduled_s"], "timeseries": ["pool"]}`` for a fleet).
    ``run.write("pools", batch)`` writes a fleet's pools series (``pools.parquet``).
    """

    FILES = {"requests": REQUESTS_FILE, "steps": STEPS_FILE, "timeseries": TIMESERIES_FILE, "pools": POOLS_FILE}

    def __init__(self, directory, *, step_optional=(), optional: Mapping | None = None, compression: str = "zstd",
                 journal: bool = False):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._optional = {"steps": tuple(step_optional)}
        for kind, cols in (optional or {}).items():
            if kind not in self.FILES:
                raise InputError("optional", f"unknown record kind {kind!r}", f"use one of {list(self.FILES)}")
            self._optional[kind] = tuple(dict.fromkeys([*self._optional.get(kind, ()), *cols]))
        self._compression = compression
        self._journal = journal
        self.writers: dict[str, RecordWriter] = {}

    def writer(self, kind: str) -> RecordWriter:
        if kind not in self.FILES:
            raise InputError("kind", f"unknown record kind {kind!r}", f"use one of {list(self.FILES)}")
        if kind not in self.writers:
            self.writers[kind] = RecordWriter(self.directory / self.FILES[kind], kind,
                                              optional=self._optional.get(kind, ()),
                                              compression=self._compression, journal=self._journal)
        return self.writers[kind]

    def write(self, kind: str, batch) -> None:
        """Append ``batch`` to ``kind``'s file; the file's optional columns are those declared
        (``optional``) plus, when this batch opens the file, the optional columns it carries."""
        if kind in self.FILES and kind not in self.writers:
            cls = TABLES[kind]
            names = batch.schema.names if isinstance(batch, (pa.Table, pa.RecordBatch)) else list(batch.to_dict()
                                                                                                 if isinstance(batch, _Table) else batch)
            carried = [c for c in cls.OPTIONAL if c in names]
            self._optional[kind] = tuple(dict.fromkeys([*self._optional.get(kind, ()), *carried]))
        self.writer(kind).write(batch)

    def write_summary(self, summary: Mapping) -> Path:
        return dump_summary(self.directory / SUMMARY_FILE, summary)

    def close(self, *, complete: bool = True) -> None:
        """Close every file (each is put in place whole); a file the disk cannot take ends the
        others without putting them in place (see :meth:`RecordWriter.abort`) and raises."""
        try:
            if "requests" not in self.writers:  # a run directory always has requests.parquet
                self.writer("requests")
            for w in self.writers.values():
                w.close(complete=complete)
        except BaseException as e:
            for w in self.writers.values():
                w.__exit__(type(e), e, None)
            raise

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if write_failed(exc):
            for w in self.writers.values():
                w.__exit__(exc_type, exc, tb)
        else:
            self.close(complete=exc_type is None)
        return False


def finish_run(directory) -> list[Path]:
    """Turn the journals a killed writer left in a run directory (``*.parquet.journal``) into
    their Parquet files, marked ``llmqueue.complete = false``; the files written. Afterwards
    ``pandas.read_parquet`` reads them like any run's."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError("directory", f"{d} is not a directory")
    done = []
    for j in sorted(d.glob(f"*.parquet{JOURNAL_SUFFIX}")):
        p = finish_journal(j.with_name(j.name[: -len(JOURNAL_SUFFIX)]), {_COMPLETE_KEY: b"false"})
        if p is not None:
            done.append(p)
    return done
