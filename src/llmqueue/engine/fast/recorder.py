"""``StepRecorder``: a replica's step records and time series as they happen, kept as columns.

Step rows (``STEP_FIELDS``: one per engine step, or one per run of identical decode steps with
``steps`` > 1) are packed as float64 into a byte buffer (no object per step or value) and read
back as numpy columns every 8,192 rows; time-series samples (``TS_FIELDS``, at ``k x sample_dt``)
are buffered as tuples, or written as a block of columns when many fall in one interval of
constant state (an idle gap, a long step). :func:`stack_columns` lays the chunks of several
replicas one after another with their ``replica`` column.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

import numpy as np

from llmqueue.engine.limits import sample_index_before
from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS

_ROW: Final = struct.Struct(f"{len(STEP_FIELDS)}d")  # one step row: STEP_FIELDS as float64, packed
_pack_row: Final = _ROW.pack
STEP_BUFFER_BYTES: Final = 8192 * _ROW.size  # flush the step rows to columns past this many bytes (8,192 rows)
SAMPLE_BUFFER_ROWS: Final = 8192


class StepRecorder:
    """The step rows and time-series samples of one replica (see the module docstring).

    ``sample_dt``: the sampling interval (0: no time series); ``next_sample``: the next sample
    time (``inf`` when none), which the steps compare with their end.
    """

    __slots__ = ("step_buffer", "step_parts", "sample_buffer", "sample_parts", "sample_dt", "next_sample",
                 "next_sample_index")

    def __init__(self, sample_dt: float) -> None:
        self.step_buffer = bytearray()
        self.step_parts: list = []
        self.sample_buffer: list = []
        self.sample_parts: list = []
        self.sample_dt = sample_dt
        self.next_sample = 0.0 if sample_dt > 0 else math.inf  # sample times are k * sample_dt
        self.next_sample_index = 0

    # -- step rows ---------------------------------------------------------------------------------
    def row(self, step: int, start: float, duration: float, prefill: int, decode: int, running: int, waiting: int,
            kv_tokens: int, preempted: int, steps: int) -> None:
        """One step row (``STEP_FIELDS``), packed as float64: every value passed as a float
        (struct converts a float without making an object; an int it converts via a float)."""
        self.step_buffer += _pack_row(float(step), start, duration, float(prefill), float(decode), float(running),
                                      float(waiting), float(kv_tokens), float(preempted), float(steps))

    def add_step_chunk(self, cols: dict) -> None:
        """Append many step rows at once (columns of equal length), after those buffered."""
        self._flush_steps()
        self.step_parts.append(cols)

    # -- samples -----------------------------------------------------------------------------------
    def take_samples(self, t_end: float, horizon: float) -> list:
        """The sample times before ``t_end`` (and not after ``horizon``); the next sample moves
        past them. O(1) in their number apart from the list itself."""
        k0 = self.next_sample_index
        k1 = sample_index_before(k0, self.sample_dt, t_end, horizon)
        if k1 == k0:
            return []
        self.next_sample_index = k1
        dt = self.sample_dt
        self.next_sample = k1 * dt
        return [i * dt for i in range(k0, k1)]

    def sample(self, t: float, waiting: int, running: int, kv_tokens: int) -> None:
        """One time-series row at sample time ``t``."""
        self.sample_buffer.append((t, waiting, running, kv_tokens))

    def sample_until(self, t_end: float, horizon: float, waiting: int, running: int, kv_tokens: int) -> None:
        """Time-series rows for the sample times before ``t_end`` with the given (constant) state:
        a few as rows, many (an idle gap, a long step) as one block of columns."""
        k0 = self.next_sample_index
        dt = self.sample_dt
        k1 = sample_index_before(k0, dt, t_end, horizon)
        if k1 - k0 <= 16:
            buf = self.sample_buffer
            for k in range(k0, k1):
                buf.append((k * dt, waiting, running, kv_tokens))
        else:
            m = k1 - k0
            self.add_sample_chunk(np.arange(k0, k1) * dt, np.full(m, waiting, dtype=np.int64),
                                  np.full(m, running, dtype=np.int64), np.full(m, kv_tokens, dtype=np.int64))
        self.next_sample_index = k1
        self.next_sample = k1 * dt if dt > 0 else math.inf

    def add_sample_chunk(self, t, waiting, running, kv) -> None:
        """Append many samples at once (columns), after those buffered."""
        self._flush_samples()
        self.sample_parts.append({"t_s": np.asarray(t, dtype=np.float64), "num_waiting": waiting,
                                   "num_running": running, "kv_tokens": kv})

    # -- columns -----------------------------------------------------------------------------------
    def flush_large(self) -> None:
        """Turn the buffers into columns once they are large (memory stays with the records)."""
        if len(self.step_buffer) > STEP_BUFFER_BYTES:
            self._flush_steps()
        if len(self.sample_buffer) > SAMPLE_BUFFER_ROWS:
            self._flush_samples()

    def _flush_steps(self) -> None:
        if self.step_buffer:
            rows = np.frombuffer(self.step_buffer, dtype=np.float64).reshape(-1, len(STEP_FIELDS))
            self.step_parts.append(row_columns(rows, STEP_FIELDS, ("start_s", "duration_s")))
            self.step_buffer = bytearray()

    def _flush_samples(self) -> None:
        if self.sample_buffer:
            self.sample_parts.append(row_columns(self.sample_buffer, TS_FIELDS, ("t_s",)))
            self.sample_buffer = []

    def step_chunks(self) -> list:
        """The step records so far, as column chunks (the buffer flushed)."""
        self._flush_steps()
        return self.step_parts

    def timeseries_chunks(self) -> list:
        """The time-series rows so far, as column chunks (the buffer flushed)."""
        self._flush_samples()
        return self.sample_parts


def stack_columns(groups: list, names: tuple, float_names: tuple) -> dict:
    """Step or time-series columns of ``groups`` ((replica id, column chunks) each), one replica
    after another, with the ``replica`` column: each chunk copied once into its place."""
    sizes = [len(c[names[0]]) for _, chunks in groups for c in chunks]
    n = sum(sizes)
    out = {name: np.empty(n, dtype=np.float64 if name in float_names else np.int64) for name in names}
    rep = out["replica"] = np.empty(n, dtype=np.int64)
    a = 0
    for gid, chunks in groups:
        start = a
        for c in chunks:
            b = a + len(c[names[0]])
            for name in names:
                out[name][a:b] = c[name]
            a = b
        rep[start:a] = gid
    return out


def row_columns(rows, names: tuple, float_names: tuple) -> dict:
    """Record rows (tuples, or a 2-d float array of them) as named numpy columns, with the
    replica column."""
    if len(rows):
        a = np.asarray(rows, dtype=np.float64)
        out: Any = {name: (a[:, j] if name in float_names else a[:, j].astype(np.int64))
                    for j, name in enumerate(names)}
    else:
        out = {name: np.empty(0, dtype=np.float64 if name in float_names else np.int64) for name in names}
    out["replica"] = np.zeros(len(rows), dtype=np.int64)
    return out
