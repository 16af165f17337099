"""Columnar record tables: :class:`RequestRecords`, :class:`StepRecords`, :class:`TimeSeries`,
:class:`PoolSeries` (a fleet's pools over time).

Each table is a dict of equal-length numpy arrays whose names and dtypes follow
:mod:`llmqueue.records.schema` (string columns such as ``class`` and ``status`` are numpy
unicode arrays, so ``recs["status"] == "ok"`` is vectorised). Build them with
``from_columns`` (validates), combine with ``concat``, index columns with ``recs["arrival_s"]``,
convert with ``to_arrow()`` / ``to_pandas()`` (pandas is optional and imported only there).

    recs = RequestRecords.from_columns({"request_id": ids, "class": cls, ...})
    d = recs.derived()            # queue_s, ttft_s, tpot_s, e2el_s (vLLM definitions)
    df = recs.to_pandas()
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from llmqueue.errors import InputError
from llmqueue.records.schema import (
    POOL_COLUMNS,
    REQUEST_COLUMNS,
    REQUEST_OPTIONAL_COLUMNS,
    STATUSES,
    STEP_COLUMNS,
    STEP_OPTIONAL_COLUMNS,
    TIMESERIES_COLUMNS,
    TIMESERIES_OPTIONAL_COLUMNS,
)


def _coerce(kind: str, name: str, values, dtype: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InputError(f"{kind}.{name}", f"must be one-dimensional (got shape {arr.shape})")
    if dtype == "str":
        if arr.size and arr.dtype.kind not in "UOS":
            raise InputError(f"{kind}.{name}", f"must hold strings (got dtype {arr.dtype})")
        return arr.astype(str) if arr.size else np.zeros(0, dtype="<U1")
    if dtype == "float64":
        if arr.dtype.kind not in "fiub" and arr.size:
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError):
                raise InputError(f"{kind}.{name}", f"must be numeric (got dtype {arr.dtype})") from None
        out = arr.astype(np.float64)
        if np.isinf(out).any():
            raise InputError(f"{kind}.{name}", "holds an infinite time", "use NaN for 'never happened'")
        return out
    # int64
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise InputError(f"{kind}.{name}", "holds NaN or inf in an integer column")
        if (arr != np.round(arr)).any():
            raise InputError(f"{kind}.{name}", "holds non-integer values in an integer column")
    elif arr.dtype.kind not in "iub" and arr.size:
        try:
            arr = arr.astype(np.int64)
        except (TypeError, ValueError):
            raise InputError(f"{kind}.{name}", f"must be integers (got dtype {arr.dtype})") from None
    return arr.astype(np.int64)


class _Table:
    """Common machinery: ``COLUMNS`` required, ``OPTIONAL`` allowed, validation hook."""

    KIND = "table"
    COLUMNS: dict[str, str] = {}
    OPTIONAL: dict[str, str] = {}

    __slots__ = ("_cols",)

    def __init__(self, cols: dict[str, np.ndarray]):
        # Use from_columns(); this constructor trusts its input.
        self._cols = cols

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_columns(cls, mapping: Mapping | None = None, /, **cols):
        """Validate and build from a mapping and/or keyword columns (``class`` needs the mapping).

        Raises :class:`~llmqueue.errors.InputError` on missing or unknown columns, unequal
        lengths, wrong dtypes, and (per table) invalid values.
        """
        given = dict(mapping or {})
        dup = set(given) & set(cols)
        if dup:
            raise InputError(f"{cls.KIND}", f"column(s) {sorted(dup)} given twice")
        given.update(cols)
        missing = [c for c in cls.COLUMNS if c not in given]
        if missing:
            raise InputError(f"{cls.KIND}", f"missing column(s) {missing}",
                             f"give all of {list(cls.COLUMNS)}")
        allowed = {**cls.COLUMNS, **cls.OPTIONAL}
        extra = [c for c in given if c not in allowed]
        if extra:
            raise InputError(f"{cls.KIND}", f"unknown column(s) {extra}",
                             f"allowed: {list(allowed)}")
        out = {name: _coerce(cls.KIND, name, given[name], allowed[name])
               for name in allowed if name in given}
        lengths = {name: len(a) for name, a in out.items()}
        if len(set(lengths.values())) > 1:
            raise InputError(f"{cls.KIND}", f"columns differ in length: {lengths}")
        cls._check(out)
        return cls(out)

    @classmethod
    def from_arrow(cls, table):
        """Validate and build from a ``pyarrow.Table`` / ``RecordBatch`` (nulls in float columns
        become NaN). A pandas DataFrame can be passed to ``from_columns`` directly."""
        cols = {n: table.column(n).to_numpy(zero_copy_only=False) for n in table.schema.names}
        for name, dtype in {**cls.COLUMNS, **cls.OPTIONAL}.items():
            if name in cols and dtype == "float64":
                cols[name] = np.asarray(cols[name], dtype=np.float64)
        return cls.from_columns(cols)

    @classmethod
    def empty(cls):
        """A valid table with no rows."""
        return cls.from_columns({c: np.zeros(0, dtype=(str if t == "str" else t))
                                 for c, t in cls.COLUMNS.items()})

    @classmethod
    def _check(cls, cols: dict[str, np.ndarray]) -> None:
        """Per-table value checks (override)."""

    @classmethod
    def concat(cls, tables):
        """Rows of several tables of this kind, in order (optional columns kept if all have them)."""
        tables = list(tables)
        if not tables:
            return cls.empty()
        for t in tables:
            if not isinstance(t, cls):
                raise InputError(f"{cls.KIND}", f"cannot concat a {type(t).__name__} into {cls.__name__}")
        names = [c for c in {**cls.COLUMNS, **cls.OPTIONAL} if all(c in t._cols for t in tables)]
        partial = [c for c in cls.OPTIONAL if c not in names and any(c in t._cols for t in tables)]
        cols = {c: np.concatenate([t._cols[c] for t in tables]) for c in names}
        for c in partial:  # optional column present in some tables only: fill its default
            cols[c] = np.concatenate([t._cols[c] if c in t._cols else cls._default(c, len(t))
                                      for t in tables])
        return cls.from_columns(cols)

    @classmethod
    def _default(cls, name: str, n: int) -> np.ndarray:
        """An optional column's value on rows that lack it: ``steps`` 1, other counts -1, times
        NaN, names ``""``."""
        dtype = cls.OPTIONAL[name]
        if dtype == "str":
            return np.full(n, "", dtype="<U1")
        if dtype == "float64":
            return np.full(n, np.nan)
        return np.full(n, 1 if name == "steps" else -1, dtype=np.int64)

    # -- access ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(next(iter(self._cols.values()))) if self._cols else 0

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self._cols[name]
        except KeyError:
            raise KeyError(f"{self.KIND} has no column {name!r}; columns: {list(self._cols)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def to_dict(self) -> dict[str, np.ndarray]:
        """The columns (a shallow copy of the dict; arrays are shared)."""
        return dict(self._cols)

    def select(self, mask_or_index) -> _Table:
        """Rows picked by a boolean mask or an index array, as a new table of this kind."""
        return type(self)({c: a[mask_or_index] for c, a in self._cols.items()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} rows, columns={self.columns})"

    # -- conversion ------------------------------------------------------------------------
    def arrow_schema(self):
        return arrow_schema(self.KIND, optional=[c for c in self.OPTIONAL if c in self._cols])

    def to_arrow(self):
        """A ``pyarrow.Table`` with the schema's column types and ``llmqueue.kind`` metadata."""
        import pyarrow as pa

        schema = self.arrow_schema()
        return pa.Table.from_arrays([pa.array(self._cols[f.name], type=f.type) for f in schema],
                                    schema=schema)

    def to_pandas(self):
        """A ``pandas.DataFrame`` (pandas is optional: ``pip install pandas``)."""
        try:
            import pandas  # noqa: F401
        except ImportError:
            raise ImportError(
                "to_pandas() needs pandas, which is not installed: pip install pandas "
                "(or use to_arrow(), or polars.from_arrow(records.to_arrow()))") from None
        return self.to_arrow().to_pandas()


class RequestRecords(_Table):
    """One row per request attempt (:data:`~llmqueue.records.schema.REQUEST_COLUMNS`).

    Checks: every ``status`` is in :data:`~llmqueue.records.schema.STATUSES`; ``arrival_s`` is
    finite; ``finish_s`` is NaN for ``unfinished`` requests (still in the system when the run
    stopped) and finite for ``ok`` ones, and none finishes before it arrives; token counts are non-negative; each
    ``(request_id, attempt)`` appears once, so each attempt has exactly one status.
    """

    KIND = "requests"
    COLUMNS = REQUEST_COLUMNS
    OPTIONAL = REQUEST_OPTIONAL_COLUMNS

    @classmethod
    def _check(cls, cols):
        status = cols["status"]
        bad = ~np.isin(status, np.array(STATUSES))
        if bad.any():
            raise InputError("requests.status", f"unknown status {sorted(set(status[bad].tolist()))[:5]}",
                             f"use one of {list(STATUSES)}")
        arr = cols["arrival_s"]
        if np.isnan(arr).any():
            raise InputError("requests.arrival_s", f"{int(np.isnan(arr).sum())} row(s) have NaN arrival")
        fin = cols["finish_s"]
        nan_fin = np.isnan(fin)
        bad = nan_fin & (status == "ok")
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError("requests.finish_s",
                             f"NaN for request {int(cols['request_id'][i])} with status 'ok'",
                             "an ok request has a finish time; give requests still in flight "
                             "when the run stopped status 'unfinished' and finish_s NaN")
        if (~nan_fin & (status == "unfinished")).any():
            raise InputError("requests.finish_s", "an 'unfinished' request has a finish time",
                             "use NaN for requests still in flight when the run stopped")
        ok_fin = ~nan_fin
        if (fin[ok_fin] < arr[ok_fin] - 1e-9).any():
            raise InputError("requests.finish_s", "a request finishes before it arrives")
        for c in ("prompt_tokens", "output_tokens", "cached_prompt_tokens", "preemptions"):
            if (cols[c] < 0).any():
                raise InputError(f"requests.{c}", "must be >= 0")
        if len(arr) > 1:
            key = np.stack([cols["request_id"], cols["attempt"]], axis=1)
            if len(np.unique(key, axis=0)) != len(arr):
                raise InputError("requests.request_id",
                                 "a (request_id, attempt) pair appears more than once",
                                 "one row per attempt; number retries with 'attempt'")

    def in_flight(self) -> np.ndarray:
        """True for requests still in the system when the run stopped (``finish_s`` NaN)."""
        return np.isnan(self._cols["finish_s"])

    def derived(self) -> dict[str, np.ndarray]:
        """Per-request latencies in seconds, as vLLM bench serve defines them.

        ``queue_s = first_scheduled_s - arrival_s``, ``ttft_s = first_token_s - arrival_s``,
        ``e2el_s = finish_s - arrival_s``, ``tpot_s = (e2el_s - ttft_s) / (output_tokens - 1)``
        for ``output_tokens > 1`` (NaN otherwise). NaN wherever an input time is NaN; use the
        ``status`` column to select finished (``ok``) requests.
        """
        a = self._cols["arrival_s"]
        ttft = self._cols["first_token_s"] - a
        e2el = self._cols["finish_s"] - a
        out_tok = self._cols["output_tokens"]
        tpot = np.full(len(a), np.nan)
        m = out_tok > 1
        tpot[m] = (e2el[m] - ttft[m]) / (out_tok[m] - 1)
        return {
            "queue_s": self._cols["first_scheduled_s"] - a,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2el_s": e2el,
        }


class StepRecords(_Table):
    """One row per engine iteration (:data:`~llmqueue.records.schema.STEP_COLUMNS`).

    Optional ``steps`` column: the row summarises that many identical iterations
    (``duration_s`` is their total). Checks: ``duration_s >= 0`` finite, counts ``>= 0``,
    ``steps >= 1``.
    """

    KIND = "steps"
    COLUMNS = STEP_COLUMNS
    OPTIONAL = STEP_OPTIONAL_COLUMNS

    @classmethod
    def _check(cls, cols):
        for c in ("start_s", "duration_s"):
            if np.isnan(cols[c]).any():
                raise InputError(f"steps.{c}", "holds NaN")
        if (cols["duration_s"] < 0).any():
            raise InputError("steps.duration_s", "must be >= 0")
        for c in ("prefill_tokens", "decode_seqs", "num_running", "num_waiting", "kv_tokens",
                  "preempted"):
            if (cols[c] < 0).any():
                raise InputError(f"steps.{c}", "must be >= 0")
        if "steps" in cols and (cols["steps"] < 1).any():
            raise InputError("steps.steps", "must be >= 1")

    def step_counts(self) -> np.ndarray:
        """Iterations each row stands for (the ``steps`` column, or ones)."""
        return self._cols["steps"] if "steps" in self._cols else np.ones(len(self), dtype=np.int64)


class TimeSeries(_Table):
    """Sampled engine state (:data:`~llmqueue.records.schema.TIMESERIES_COLUMNS`).

    Each sample holds until the next sample of the same replica (sample-and-hold). Checks:
    finite ``t_s``, counts ``>= 0``.
    """

    KIND = "timeseries"
    COLUMNS = TIMESERIES_COLUMNS
    OPTIONAL = TIMESERIES_OPTIONAL_COLUMNS

    @classmethod
    def _check(cls, cols):
        if np.isnan(cols["t_s"]).any():
            raise InputError("timeseries.t_s", "holds NaN")
        for c in ("num_waiting", "num_running", "kv_tokens"):
            if (cols[c] < 0).any():
                raise InputError(f"timeseries.{c}", "must be >= 0")


class PoolSeries(_Table):
    """A fleet's pools over time (:data:`~llmqueue.records.schema.POOL_COLUMNS`): one row per
    (sample time, pool, class); ``replicas`` and ``provisioning`` repeat on a pool's class rows.

    Each sample holds until the pool's next sample (sample-and-hold), like :class:`TimeSeries`.
    Checks: finite ``t_s``, counts ``>= 0``.
    """

    KIND = "pools"
    COLUMNS = POOL_COLUMNS

    @classmethod
    def _check(cls, cols):
        t = cols["t_s"]
        if not np.isfinite(t).all():
            raise InputError("pools.t_s", "holds NaN")
        for c in ("replicas", "provisioning", "num_waiting", "num_running"):
            if (cols[c] < 0).any():
                raise InputError(f"pools.{c}", "must be >= 0")

    def pool_names(self) -> list[str]:
        """The pools, in order of first appearance."""
        p = self._cols["pool"]
        _, first = np.unique(p, return_index=True)
        return [str(p[i]) for i in sorted(first)]


TABLES: dict[str, type[_Table]] = {
    "requests": RequestRecords,
    "steps": StepRecords,
    "timeseries": TimeSeries,
    "pools": PoolSeries,
}


KIND_KEY = b"llmqueue.kind"  # the Arrow schema's metadata key naming the record kind


def table_class(kind) -> type[_Table]:
    """The table class of a record kind: its name (``"requests"``...), the class itself, or the
    schema's column dict (``REQUEST_COLUMNS``...)."""
    if isinstance(kind, type) and issubclass(kind, _Table):
        return kind
    if isinstance(kind, Mapping):  # one of the schema's column dicts
        for cls in TABLES.values():
            if dict(kind) == cls.COLUMNS:
                return cls
        raise InputError("schema", "column dict is not one of REQUEST_COLUMNS, STEP_COLUMNS, "
                         "TIMESERIES_COLUMNS, POOL_COLUMNS")
    try:
        return TABLES[kind]
    except (KeyError, TypeError):
        raise InputError("schema", f"unknown record kind {kind!r}",
                         f"use one of {list(TABLES)}") from None


def arrow_schema(kind, optional=()):
    """The Arrow schema (a ``pyarrow.Schema``) of a record kind (``requests``, ``steps``,
    ``timeseries``, ``pools``; see :func:`table_class`).

    ``optional`` names optional columns to include (e.g. ``["steps"]`` for step records,
    ``["pool", "lane", "model"]`` for a fleet's request records).
    """
    import pyarrow as pa

    cls = table_class(kind)
    optional = list(optional)
    unknown = [c for c in optional if c not in cls.OPTIONAL]
    if unknown:
        raise InputError("optional", f"{unknown} are not optional {kind} columns",
                         f"choose from {list(cls.OPTIONAL)}")
    types = {"int64": pa.int64(), "float64": pa.float64(), "str": pa.string()}
    fields = [pa.field(n, types[t]) for n, t in cls.COLUMNS.items()]
    fields += [pa.field(n, types[cls.OPTIONAL[n]]) for n in cls.OPTIONAL if n in optional]
    return pa.schema(fields, metadata={KIND_KEY: cls.KIND.encode()})
