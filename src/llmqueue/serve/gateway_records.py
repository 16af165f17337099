"""A gateway run's files: each request's record in the project's one schema, and its decisions.

``requests.parquet`` is written through a journal (:mod:`llmqueue.records.journal`) a batch every
64 requests or second, so a gateway killed outright loses at most the last second; ``close()``
turns it into the Parquet file that ``llmqueue report``, ``calibrate`` and ``validate`` read as
they read a bench run. Times are seconds from the gateway's start (``run.json`` holds its epoch). Each record
carries ``pool``, ``replica`` (fleet-wide index), ``lane``, ``model``, ``class``, ``tenant``,
``attempt`` (1 + the retries on other replicas) and, for a refusal or failure, ``reason``; with
degrade rules also ``degraded`` (how it was served smaller, as the simulator's records say).
``workload.parquet`` holds the arrivals as asked (with their ``max_tokens``), for ``llmqueue
simulate --trace``, journaled with the records (nothing of a long run is held in memory) and put
in arrival order at the end; ``summary.json`` the run summarised as a bench run is.
``decisions.jsonl`` holds every routing and admission decision with the numbers it read
(:mod:`llmqueue.cluster.decisions`), one JSON object a line, flushed with the records.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmqueue.records.columns import request_record_columns
from llmqueue.records.journal import ParquetJournal

_EXTRA = ("pool", "lane", "model", "tenant", "reason")
#: ``workload.parquet``: the arrivals as asked, for ``llmqueue simulate --trace``
WORKLOAD_SCHEMA = pa.schema([("request_id", pa.int64()), ("class", pa.string()), ("arrival_s", pa.float64()),
                             ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64())])


class GatewayRecords:
    """The run folder ``out_dir`` (see the module docstring)."""

    def __init__(self, out_dir, t0_epoch: float, *, degraded: bool = False):
        from llmqueue._files import write_atomic
        from llmqueue.errors import InputError
        from llmqueue.records import RunWriter

        self.dir = Path(out_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.dir / "run.json", json.dumps({"kind": "gateway", "t0_epoch": t0_epoch}) + "\n")
            self.extra = _EXTRA + (("degraded",) if degraded else ())  # with degrade rules: how it was served smaller
            self.writer = RunWriter(self.dir, journal=True, optional={"requests": list(self.extra)})
            self.writer.writer("requests")
            self.decisions = open(self.dir / "decisions.jsonl", "w", encoding="utf-8")
            self.workload = ParquetJournal(self.dir / "workload.parquet", WORKLOAD_SCHEMA)
        except OSError as e:
            raise InputError("out", f"cannot write to {self.dir} ({e.strerror or e})",
                             "choose another --out") from None
        self.rows: list = []
        self.pending: list = []   # decisions since the last flush
        self.offered: list = []   # the arrivals as asked (max_tokens, not what was produced) since the last flush
        self.count = 0

    def add(self, q, replica: int, model: str) -> None:
        r = q.r
        self.offered.append((r.request_id, q.cls, q.t_arrival, r.num_prompt_tokens, q.asked))
        self.rows.append((r.request_id, q.cls, q.t_arrival, q.t_dispatch, q.first, q.finish, r.num_prompt_tokens,
                          q.out_tokens, q.status, replica, q.attempt, q.pool, q.lane, model, q.tenant, q.reason,
                          q.degraded))

    def decision(self, rec: dict) -> None:
        self.pending.append(rec)   # written as text at the next flush: off the request's path

    def flush(self) -> None:
        """Write the records gathered since the last flush (a batch of the journal)."""
        from llmqueue.cluster.decisions import encode

        if self.pending:
            recs, self.pending = self.pending, []
            self.decisions.write("".join(json.dumps(r, separators=(",", ":"), default=encode) + "\n" for r in recs))
        self.decisions.flush()
        if self.offered:  # through a journal too: a long run keeps none of it in memory
            offered, self.offered = self.offered, []
            cols = list(zip(*offered))
            self.workload.write_table(pa.table({
                "request_id": pa.array(cols[0], pa.int64()), "class": pa.array([str(c) for c in cols[1]], pa.string()),
                "arrival_s": pa.array(cols[2], pa.float64()), "prompt_tokens": pa.array(cols[3], pa.int64()),
                "output_tokens": pa.array(cols[4], pa.int64())}, schema=WORKLOAD_SCHEMA))
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        cols = list(zip(*rows))
        n = len(rows)
        arrival = np.asarray(cols[2], dtype=np.float64)
        disp = np.asarray(cols[3], dtype=np.float64)
        self.writer.write("requests", request_record_columns(
            n, request_id=cols[0], class_=cols[1], arrival_s=arrival,
            dispatched_s=np.where(np.isnan(disp), arrival, disp),  # refused at the gateway: never sent on
            first_token_s=cols[4], finish_s=cols[5], prompt_tokens=cols[6], output_tokens=cols[7], status=cols[8],
            replica=cols[9], attempt=cols[10], **dict(zip(self.extra, cols[11:]))))
        self.count += n

    def close(self) -> None:
        """Finish the files: ``requests.parquet`` from its journal, ``workload.parquet`` (every
        arrival with its prompt and the ``max_tokens`` it asked for: what ``llmqueue simulate
        --trace`` replays) and ``summary.json`` (the run summarised as a bench run is)."""
        import pyarrow.parquet as pq

        from llmqueue._files import staged

        self.flush()
        self.decisions.close()
        self.writer.close(complete=True)
        self.workload.close()
        wl = pq.read_table(self.dir / "workload.parquet")
        t = wl.column("arrival_s").to_numpy()
        if len(t) > 1 and bool(np.any(np.diff(t) < 0)):  # written as requests ended: by arrival for the trace
            order = np.argsort(t, kind="stable")
            with staged(self.dir / "workload.parquet") as tmp:
                pq.write_table(wl.take(pa.array(order)), tmp)
        if self.count:
            from llmqueue.metrics import summarize
            from llmqueue.records import read_records
            from llmqueue.records.io import dump_summary

            dump_summary(self.dir / "summary.json", summarize(read_records(self.dir)))
