"""Per-request, per-step and time-series records: one schema for simulated and measured runs."""

from llmqueue.records.schema import REQUEST_COLUMNS, STATUSES, STEP_COLUMNS, TIMESERIES_COLUMNS

__all__ = ["REQUEST_COLUMNS", "STATUSES", "STEP_COLUMNS", "TIMESERIES_COLUMNS"]
