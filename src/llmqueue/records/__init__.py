"""Per-request, per-step and time-series records: one schema for simulated and measured runs.

The records are the schema every layer shares: the simulator (``engine``, ``cluster``) and the
benchmark client and importers (``bench``) write them, ``metrics``, ``plan`` and ``report`` read
them. So that any layer may use them, ``schema`` and ``columns`` import nothing of llmqueue but
:mod:`llmqueue.errors` (the engine, compiled, builds its records with ``columns``).

- ``schema``: column names and dtypes (:data:`REQUEST_COLUMNS`, :data:`REQUEST_OPTIONAL_COLUMNS`,
  :data:`STEP_COLUMNS`, :data:`STEP_OPTIONAL_COLUMNS`, :data:`TIMESERIES_COLUMNS`,
  :data:`TIMESERIES_OPTIONAL_COLUMNS`, :data:`POOL_COLUMNS`, :data:`STATUSES`).
- ``columns``: :func:`~llmqueue.records.columns.request_record_columns`, the one builder of
  request record columns (defaults, dtypes, the schema's order), used by every producer.
- ``table``: :class:`RequestRecords`, :class:`StepRecords`, :class:`TimeSeries`,
  :class:`PoolSeries` (validated columnar tables; ``derived()`` latencies; ``to_arrow()`` /
  ``to_pandas()``; :func:`arrow_schema`, their Arrow schemas).
- ``io``: Parquet files (:class:`RecordWriter` appends a row group per batch and survives
  exceptions; :func:`read_records`), the run directory (``requests.parquet``, ``steps.parquet``,
  ``timeseries.parquet``, a fleet's ``pools.parquet``, ``summary.json``: :func:`write_run`, :func:`read_run`,
  :class:`RunWriter`). Any of the files loads with ``pandas.read_parquet(path)``.

Table and I/O names are imported lazily so ``import llmqueue.records`` stays cheap (no pyarrow).
"""

from __future__ import annotations

from llmqueue._lazy import lazy_exports


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

_EXPORTS = {
    "RequestRecords": "table",
    "StepRecords": "table",
    "TimeSeries": "table",
    "PoolSeries": "table",
    "RecordWriter": "io",
    "RunWriter": "io",
    "Run": "io",
    "arrow_schema": "table",
    "read_records": "io",
    "read_steps": "io",
    "read_timeseries": "io",
    "read_pools": "io",
    "read_run": "io",
    "write_records": "io",
    "write_run": "io",
    "dump_summary": "io",
    "is_complete": "io",
    "finish_run": "io",
    "REQUESTS_FILE": "io",
    "STEPS_FILE": "io",
    "TIMESERIES_FILE": "io",
    "POOLS_FILE": "io",
    "SUMMARY_FILE": "io",
}

__all__ = sorted([*_EXPORTS, "POOL_COLUMNS", "REQUEST_COLUMNS", "REQUEST_OPTIONAL_COLUMNS", "STATUSES",
                  "STEP_COLUMNS", "STEP_OPTIONAL_COLUMNS", "TIMESERIES_COLUMNS", "TIMESERIES_OPTIONAL_COLUMNS"])


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, tuple(__all__))
