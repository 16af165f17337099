"""A Parquet file that survives its writer being killed outright (SIGKILL, the OOM killer).

A Parquet file is readable only once its footer is written, at ``close()``: a writer killed
before that leaves a file nothing can read, and every row in it is lost. A measured run cannot
be repeated exactly, so the benchmark client writes through a journal instead:

- :class:`ParquetJournal` appends each batch to an Arrow IPC stream beside the file
  (``requests.parquet.journal``); a batch is in the operating system's hands when ``write_table``
  returns (the file is unbuffered), so killing the process loses no written batch;
- ``close()`` turns the journal into the Parquet file (written under a temporary name, then
  renamed: a reader sees either the whole file or none) and removes the journal;
- :func:`read_journal` reads a journal left behind: every whole batch, without the one the kill
  cut short. :func:`read_table` reads a file, or its journal where the file was never finished;
  :func:`finish_journal` turns a left-behind journal into the Parquet file.

While a run goes on, its journal can be read too (a live view of the finished requests).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmqueue._files import input_file, reading, refuse_link, staged, write_error
from llmqueue.errors import InputError

JOURNAL_SUFFIX = ".journal"
_ROW_GROUP_ROWS = 65_536  # rows per Parquet row group when a journal is converted


def journal_path(path) -> Path:
    """Where the journal of Parquet file ``path`` lies (``<path>.journal``)."""
    p = Path(path)
    return p.with_name(p.name + JOURNAL_SUFFIX)


def exists(path) -> bool:
    """Whether ``path`` or its journal exists (the file can be read with :func:`read_table`)."""
    return Path(path).exists() or journal_path(path).exists()


class ParquetJournal:
    """Write the Parquet file ``path`` through a journal (see the module docstring).

    The interface is :class:`pyarrow.parquet.ParquetWriter`'s, as far as the project uses it:
    ``write_table(table)``, ``add_key_value_metadata(dict)`` (kept for the file's footer) and
    ``close()``. Opening removes an older ``path`` (the file is being rewritten), so a reader never
    takes a previous run's file for this one's.
    """

    def __init__(self, path, schema: pa.Schema, *, compression: str = "zstd"):
        self.path = Path(path)
        self.jpath = journal_path(self.path)
        self.schema = schema
        self.compression = compression
        self._meta: dict = {}
        refuse_link("out", self.path)
        refuse_link("out", self.jpath)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)
            self.jpath.unlink(missing_ok=True)  # a previous run's journal: this run's starts empty
            os.close(os.open(self.jpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # never through a link
            self._sink = pa.OSFile(str(self.jpath), "wb")
        except OSError as e:
            raise write_error("out", self.jpath, e) from None
        self._ipc = pa.ipc.new_stream(self._sink, schema)
        self.closed = False

    def write_table(self, table: pa.Table, row_group_size=None) -> None:  # noqa: ARG002 - ParquetWriter's signature
        self._ipc.write_table(table)

    def add_key_value_metadata(self, metadata: dict) -> None:
        self._meta.update(metadata)

    def abort(self) -> None:
        """End the journal without writing the Parquet file (a full disk): the journal stays,
        readable (:func:`read_journal`, :func:`finish_journal`)."""
        if self.closed:
            return
        self.closed = True
        try:
            with contextlib.suppress(Exception):
                self._ipc.close()
        finally:
            with contextlib.suppress(Exception):
                self._sink.close()

    def close(self) -> None:
        """End the journal and write the Parquet file from it (then remove the journal). If that
        fails (a full disk), the journal stays, readable, and the error propagates."""
        if self.closed:
            return
        self.closed = True
        try:
            self._ipc.close()
        finally:
            self._sink.close()
        _convert(self.jpath, self.path, self.schema, self.compression, self._meta)


def _batches(jpath: Path):
    """The schema and the whole record batches of a journal (a batch cut short ends the list)."""
    try:
        f = pa.OSFile(str(jpath), "rb")
    except OSError as e:
        raise InputError("path", f"{jpath} cannot be read ({e.strerror or e})") from None
    with f:
        try:
            reader = pa.ipc.open_stream(f)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError("path", f"{jpath} holds no schema ({e})",
                             "the writer was killed before writing anything") from None
        out = []
        while True:
            try:
                out.append(reader.read_next_batch())
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError):  # the batch the kill cut short
                break
        return reader.schema, out


def read_journal(path) -> pa.Table:
    """Every whole batch of a journal (``path`` is the journal or the Parquet file it is for)."""
    p = Path(path)
    jpath = p if p.name.endswith(JOURNAL_SUFFIX) else journal_path(p)
    schema, batches = _batches(jpath)
    return pa.Table.from_batches(batches, schema=schema)


def read_table(path) -> pa.Table:
    """The Parquet file ``path``, or, where its writer never finished, its journal."""
    p = Path(path)
    if p.exists():
        with reading("path", input_file("path", p)):
            return pq.read_table(p)
    if journal_path(p).exists():
        return read_journal(p)
    raise InputError("path", f"{p} does not exist")


def _convert(jpath: Path, path: Path, schema: pa.Schema, compression: str, meta: dict) -> None:
    """Write the Parquet file ``path`` from journal ``jpath`` (under a temporary name, renamed when
    whole: :class:`~llmqueue._files.staged`), then remove the journal. A full disk removes the
    temporary file and leaves the journal, readable; the error names ``path``."""
    _, batches = _batches(jpath)
    with staged(path) as tmp:
        w = pq.ParquetWriter(str(tmp), schema, compression=compression)
        try:
            buf, rows = [], 0
            for b in batches:
                buf.append(b)
                rows += b.num_rows
                if rows >= _ROW_GROUP_ROWS:
                    w.write_table(pa.Table.from_batches(buf, schema=schema), row_group_size=rows)
                    buf, rows = [], 0
            if buf or not batches:
                w.write_table(pa.Table.from_batches(buf, schema=schema), row_group_size=max(rows, 1))
            if meta:
                w.add_key_value_metadata(meta)
        finally:
            w.close()
    jpath.unlink()


def finish_journal(path, metadata: dict | None = None, *, compression: str = "zstd") -> Path | None:
    """Turn the journal a killed writer left beside ``path`` into the Parquet file (its whole
    batches; ``metadata`` goes into the footer). Returns ``path``, or ``None`` if there was no
    journal to finish (or the file was already written)."""
    p = Path(path)
    jpath = journal_path(p)
    if not jpath.exists():
        return None
    if p.exists():  # killed after the rename, before removing the journal
        jpath.unlink()
        return None
    schema, _ = _batches(jpath)
    _convert(jpath, p, schema, compression, metadata or {})
    return p
