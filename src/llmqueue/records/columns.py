"""The one builder of per-request record columns, used by every producer of request records.

The simulator (``engine/run.py``, the vectorized epochs of ``engine/epoch.py``, the batch-service
baselines), the benchmark client (``bench``) and the importers of other clients' measurements
(``bench/importers.py``) all hand their rows to :func:`request_record_columns`, which fills what a
producer does not know, casts each column to the schema's dtype and orders the columns as
:data:`~llmqueue.records.schema.REQUEST_COLUMNS` does (then the optional ones). It builds; it
does not validate values: :meth:`~llmqueue.records.table.RequestRecords.from_columns` does that
when the records are made a table.

This module imports only numpy, :mod:`llmqueue.errors` and :mod:`llmqueue.records.schema`, so
every layer may use it (the compiled engine included).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from llmqueue.errors import InputError
from llmqueue.records.schema import REQUEST_COLUMNS, REQUEST_OPTIONAL_COLUMNS

_DTYPES = {"int64": np.int64, "float64": np.float64, "str": object}

#: what a column holds when its producer does not give it: a client cannot see when the engine
#: scheduled a request (NaN), a simulator without a dispatcher admits on arrival
#: (``dispatched_s = arrival_s``), one replica is replica 0, a request without retries is attempt 1
REQUEST_DEFAULTS: dict[str, object] = {
    "dispatched_s": "arrival_s",
    "first_scheduled_s": np.nan,
    "first_token_s": np.nan,
    "finish_s": np.nan,
    "cached_prompt_tokens": 0,
    "preemptions": 0,
    "replica": 0,
    "attempt": 1,
}


def request_record_columns(n: int, /, *, extra: Mapping | None = None, **cols) -> dict[str, np.ndarray]:
    """Request record columns of ``n`` requests (attempts), in the schema's order and dtypes.

    ``cols``: the columns the producer knows, by their schema names (``class_`` for ``class``,
    a Python keyword); each an array or list of ``n`` values, or one value for every row. The
    columns of :data:`REQUEST_DEFAULTS` may be left out; the optional columns
    (:data:`~llmqueue.records.schema.REQUEST_OPTIONAL_COLUMNS`: a fleet's ``pool``, ``lane``...)
    are kept when given. ``extra``: columns private to the producer (the engine's ``seq``), kept
    unchanged after the schema's. String columns come back as object arrays.
    """
    if "class_" in cols:
        cols["class"] = cols.pop("class_")
    unknown = [c for c in cols if c not in REQUEST_COLUMNS and c not in REQUEST_OPTIONAL_COLUMNS]
    if unknown:
        raise InputError("requests", f"unknown column(s) {unknown}",
                         f"allowed: {[*REQUEST_COLUMNS, *REQUEST_OPTIONAL_COLUMNS]}")
    missing = [c for c in REQUEST_COLUMNS if c not in cols and c not in REQUEST_DEFAULTS]
    if missing:
        raise InputError("requests", f"missing column(s) {missing}")
    out: dict[str, np.ndarray] = {}
    for name, dtype in REQUEST_COLUMNS.items():
        if name in cols:
            out[name] = _column(name, cols[name], _DTYPES[dtype], n)
        else:
            d = REQUEST_DEFAULTS[name]
            out[name] = out[d].copy() if isinstance(d, str) else np.full(n, d, dtype=_DTYPES[dtype])
    for name, dtype in REQUEST_OPTIONAL_COLUMNS.items():
        if name in cols:
            out[name] = _column(name, cols[name], _DTYPES[dtype], n)
    if extra:
        out.update(extra)
    return out


_SCALARS = (str, bytes, int, float, np.generic)


def _column(name: str, values, dtype, n: int) -> np.ndarray:
    if isinstance(values, _SCALARS):  # one value for every row
        return np.full(n, values, dtype=dtype)
    a = np.asarray(values, dtype=dtype)
    if len(a) != n:
        raise InputError(f"requests.{name}", f"has {len(a)} values for {n} requests")
    return a
