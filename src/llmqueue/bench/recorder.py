"""The records of a benchmark run: one row per attempt, written as the run goes.

Finished attempts are kept as columns (arrays, 8 bytes a value) and appended to the run
directory every ``flush_interval_s`` by one writer thread, so that writing never blocks sending.
Files (``out_dir``): ``requests.parquet`` (records, in completion order, appended to its journal,
``requests.parquet.journal``, which becomes the Parquet file at the end: a client killed outright,
even by SIGKILL, leaves every batch it wrote readable, see :mod:`llmqueue.records.journal`),
``tokens.parquet`` (``request_id, attempt, index, t_s``: one row per streamed chunk with
``choices``, journaled the same way), and ``workload.parquet`` (the intended stream: ids,
classes, arrival times, requested lengths, and the prompts' prefix-block ``hash_ids`` when they
were built from a trace's).

A write that fails (a full disk, ``ENOSPC``) stops every later write (a failed write may leave a
cut batch at the journal's end, which its reader skips, so nothing may follow it): the batches
written before stay readable, :attr:`Recorder.written` counts them, and ``write_error`` says why
(the run then stops). A journal that cannot become its Parquet file stays in place, readable.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from array import array
from pathlib import Path

import numpy as np

from llmqueue._files import staged
from llmqueue.errors import InputError
from llmqueue.records.columns import request_record_columns

TOKENS_FILE = "tokens.parquet"
WORKLOAD_FILE = "workload.parquet"


def token_schema():
    """The Arrow schema of ``tokens.parquet``."""
    import pyarrow as pa

    return pa.schema([pa.field("request_id", pa.int64()), pa.field("attempt", pa.int64()),
                      pa.field("index", pa.int64()), pa.field("t_s", pa.float64())],
                     metadata={b"llmqueue.kind": b"tokens"})


def load_requests_parquet(path):
    """Read a ``workload.parquet`` written by a run back into a RequestArrays."""
    import pyarrow.parquet as pq

    from llmqueue.workload.generate import RequestArrays

    t = pq.read_table(path).to_pydict()
    return RequestArrays(np.asarray(t["request_id"]), np.asarray(t["arrival_s"]), np.asarray(t["prompt_tokens"]),
                         np.asarray(t["output_tokens"]), np.asarray(t["class"], dtype=str))


class Recorder:
    """The attempts of a run as record columns, and their files in ``out_dir`` (None: kept in
    memory only). ``classes``: the class names, by class index."""

    def __init__(self, classes, out_dir=None):
        self.names = np.asarray(classes)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.c_rid = array("q")
        self.c_cls = array("q")
        self.c_arr = array("d")
        self.c_disp = array("d")
        self.c_first = array("d")
        self.c_fin = array("d")
        self.c_pt = array("q")
        self.c_ot = array("q")
        self.c_cached = array("q")
        self.c_status: list[str] = []
        self.c_att = array("q")
        self.c_sched = array("d")          # when the send path started (before any concurrency wait)
        self.c_ntok = array("q")           # chunks with choices, per attempt
        self.tok_t = array("d")            # their arrival times, attempt after attempt
        self.flushed = 0
        self.tok_flushed = 0
        self.written = 0                    # attempt records whose write succeeded (the writer thread counts)
        self.write_error: str | None = None  # why writing stopped (set by the writer thread)
        self.writer = None
        self.tok_writer = None
        self.flush_lock = asyncio.Lock()
        self._wexec = None  # the one writer thread (created on the first flush)

    def record(self, rid: int, k: int, attempt: int, arrival: float, sched: float, status: str, fin: float, ot: int,
               ex) -> None:
        """Attempt ``attempt`` of request ``rid`` (class index ``k``), intended at ``arrival`` and
        begun at ``sched``, ended with ``status`` at ``fin`` with ``ot`` output tokens; the rest
        from the :class:`~llmqueue.bench.attempt.Attempt` ``ex`` (its send, first token, counts
        and chunk times)."""
        toks = ex.toks
        self.c_rid.append(rid)
        self.c_cls.append(k)
        self.c_arr.append(arrival)
        self.c_sched.append(sched)
        self.c_disp.append(ex.disp)
        self.c_first.append(ex.first)
        self.c_fin.append(fin)
        self.c_pt.append(ex.pt)
        self.c_ot.append(ot)
        self.c_cached.append(ex.cached)
        self.c_status.append(status)
        self.c_att.append(attempt)
        self.c_ntok.append(len(toks))
        self.tok_t.extend(toks)

    def __len__(self) -> int:
        return len(self.c_status)

    def columns(self, a: int = 0, b: int | None = None) -> dict:
        """The records of attempts [a, b) as schema columns (slices are copies: safe in a thread).
        A client cannot observe when the engine first scheduled a request (NaN) nor whether it
        was preempted (0); ``replica`` is 0."""
        b = len(self.c_status) if b is None else b
        n = b - a

        def f(col):
            return np.frombuffer(col[a:b], dtype=np.float64) if n else np.zeros(0)

        def i(col):
            return np.frombuffer(col[a:b], dtype=np.int64) if n else np.zeros(0, dtype=np.int64)

        return request_record_columns(
            n, request_id=i(self.c_rid), class_=self.names[i(self.c_cls)] if n else [], arrival_s=f(self.c_arr),
            dispatched_s=f(self.c_disp), first_token_s=f(self.c_first), finish_s=f(self.c_fin),
            prompt_tokens=i(self.c_pt), output_tokens=i(self.c_ot), cached_prompt_tokens=i(self.c_cached),
            status=self.c_status[a:b], attempt=i(self.c_att))

    def token_columns(self, a: int = 0, b: int | None = None, t=None) -> dict:
        """``tokens.parquet`` rows of attempts [a, b); ``t``: their chunk times (default: all)."""
        b = len(self.c_status) if b is None else b
        counts = np.frombuffer(self.c_ntok[a:b], dtype=np.int64) if b > a else np.zeros(0, dtype=np.int64)
        total = int(counts.sum())
        t = np.frombuffer(self.tok_t, dtype=np.float64).copy() if t is None else np.frombuffer(t, dtype=np.float64)
        if len(t) != total:
            raise AssertionError("token times out of step with the records")
        rid = np.repeat(np.frombuffer(self.c_rid[a:b], dtype=np.int64) if b > a else counts, counts)
        att = np.repeat(np.frombuffer(self.c_att[a:b], dtype=np.int64) if b > a else counts, counts)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        index = np.arange(total, dtype=np.int64) - starts
        return {"request_id": rid, "attempt": att, "index": index, "t_s": t}

    # -- files -----------------------------------------------------------------------------------
    def open(self, requests, prompts) -> None:
        """Create the run directory: ``workload.parquet`` (the intended stream, with the prompts'
        prefix hashes) and the journals of the records."""
        if self.out_dir is None:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        from llmqueue.records import RunWriter
        from llmqueue.records.journal import ParquetJournal

        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".llmqueue-write-test-", dir=self.out_dir)  # never through a link
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise InputError("out_dir", f"cannot write to {self.out_dir} ({e.strerror or e})") from None
        r = requests
        wl = pa.table({"request_id": pa.array(r.request_id, pa.int64()),
                       "class": pa.array(r.class_name.astype(str), pa.string()),
                       "arrival_s": pa.array(r.arrival_s, pa.float64()),
                       "prompt_tokens": pa.array(r.prompt_tokens, pa.int64()),
                       "output_tokens": pa.array(r.output_tokens, pa.int64())})
        if prompts.hash_ids is not None:   # the prompts' prefix-block hashes, for validate's simulation
            wl = wl.append_column("hash_ids", pa.array(prompts.hash_ids, pa.list_(pa.int64())))
            wl = wl.replace_schema_metadata({b"llmqueue.hash_block_tokens": str(prompts.H).encode()})
        try:
            with staged(self.out_dir / WORKLOAD_FILE) as tmp:
                pq.write_table(wl, tmp)
            self.writer = RunWriter(self.out_dir, journal=True)  # a client killed outright loses no written batch
            self.writer.writer("requests")
            self.tok_writer = ParquetJournal(self.out_dir / TOKENS_FILE, token_schema())
        except OSError as e:
            raise InputError("out_dir", f"cannot write to {self.out_dir} ({e.strerror or e})",
                             "free some space or choose another --out") from None
        self._prewarm()

    def _prewarm(self) -> None:
        """Run the write path (the journals' Arrow IPC writes) once on a throwaway buffer, so that
        the first flush of the run does not pay for lazy imports and set-up (tens of ms holding
        the GIL). The Parquet files are written at the end, off the sending path."""
        import pyarrow as pa

        from llmqueue.records import RequestRecords, arrow_schema

        row = request_record_columns(1, request_id=0, class_="x", arrival_s=0.0, first_token_s=0.0, finish_s=0.0,
                                     prompt_tokens=1, output_tokens=1, status="ok")
        tok = pa.table({"request_id": [0], "attempt": [1], "index": [0], "t_s": [0.0]}, schema=token_schema())
        for schema, table in ((arrow_schema("requests"), RequestRecords.from_columns(row).to_arrow()),
                              (token_schema(), tok)):
            w = pa.ipc.new_stream(pa.BufferOutputStream(), schema)
            w.write_table(table)
            w.close()

    async def flush(self) -> None:
        """Write the attempts finished since the last flush (in a thread: the loop keeps sending).

        Writes go to one dedicated writer thread, in order, and the slice is marked flushed as
        soon as it is handed over: a flush cancelled while its write runs (the run ending, an
        interrupt) neither writes its rows twice nor lets a second write touch the Parquet
        writer at the same time (pyarrow's writers are not thread-safe: that crashed the process).
        """
        if self.writer is None:
            return
        async with self.flush_lock:
            a, b = self.flushed, len(self.c_status)
            if b > a:
                ta, tb = self.tok_flushed, len(self.tok_t)
                t = self.tok_t[ta:tb]  # a copy taken on the loop's thread (the array keeps growing)
                self.flushed, self.tok_flushed = b, tb
                fut = self._write_pool().submit(self._write_guarded, a, b, t)
                # shielded: cancelling this wait must not cancel a write still queued
                await asyncio.shield(asyncio.wrap_future(fut))

    def _write_guarded(self, a: int, b: int, t) -> None:
        """:meth:`_write_batch` in the writer thread; the first failure is kept in ``write_error``
        and stops every later write."""
        if self.write_error is not None:
            return
        try:
            self._write_batch(a, b, t)
        except Exception as e:  # noqa: BLE001 - reported by the loop as the run's error
            what = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
            self.write_error = f"cannot write records to {self.out_dir} ({what})"
            return
        self.written += b - a

    def _write_batch(self, a: int, b: int, t) -> None:
        """Append attempts [a, b) to the Parquet files (runs in a worker thread): their token times
        first, so that a client killed between the two writes never leaves a record without them."""
        tc = self.token_columns(a, b, t)
        if len(tc["t_s"]):
            import pyarrow as pa

            self.tok_writer.write_table(pa.table(tc, schema=token_schema()))
        self.writer.write("requests", self.columns(a, b))

    def _write_pool(self):
        if self._wexec is None:
            from concurrent.futures import ThreadPoolExecutor

            self._wexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmqueue-writer")
        return self._wexec

    def close(self, complete: bool) -> list[str]:
        """Wait for the writes handed over, then close the journals (each becomes its Parquet
        file). A close that fails (a full disk) leaves that journal in place, readable: returns
        why, one line per failure, never raises."""
        if self._wexec is not None:
            self._wexec.shutdown(wait=True)
            self._wexec = None
        complete = complete and self.write_error is None
        failed = []
        for w in (self.writer, self.tok_writer):
            if w is None:
                continue
            try:
                if w is self.writer:
                    w.close(complete=complete)
                else:
                    w.close()
            except OSError as e:
                failed.append(f"cannot write to {self.out_dir} ({e.strerror or e}); "
                              "the journals stay in place, readable")
        return failed
