"""The checks every ``llmqueue import`` format's numbers pass (:mod:`llmqueue.bench.importers`,
:mod:`~llmqueue.bench.guidellm_report`, :mod:`~llmqueue.bench.aiperf_export`).

A request's fields are read one number at a time with :func:`number`: a missing value (JSON
``null``, an empty CSV cell) is NaN and means "not recorded", while a value that is there must
be a finite number of the right kind in its range, else one line names the row and the field.
The ranges (:data:`LIMITS`) are wide enough for any real measurement and keep the arithmetic of
the run's summary (spans, rates, cubes of spans in its trend fits) far from overflow:

- absolute times (sends, first and last tokens, chunk times): ``|t| <= 1e11`` s (epoch seconds
  until the year 5138), after the file's time unit;
- durations (TTFT, latency, the gaps between chunks): ``0 <= d <= 1e7`` s (115 days), less
  :data:`SLACK_S` (rounding);
- token counts (and ids, attempts): whole numbers in ``[0, 1e12]``.

A request whose times cannot have happened (:func:`impossible`: the first token before the
send, the last token before the first, a finish before the send: TTFT longer than the request's
latency) is dropped and counted in the run's notes, by reason.
"""

from __future__ import annotations

import math

import numpy as np

from llmqueue.errors import InputError

#: kind -> (lowest, highest, what a value of the kind is)
LIMITS = {
    "time": (-1e11, 1e11, "an absolute time in seconds"),
    "duration": (-1e-6, 1e7, "a duration in seconds"),  # the clock's slack below 0
    "count": (0.0, 1e12, "a whole number"),
}
#: the clock's slack when times are compared (s): rounding in the tools' own exports
SLACK_S = 1e-6


def number(x, field: str, where: str, kind: str, *, scale: float = 1.0) -> float:
    """``x`` as a float (times ``scale``, the file's time unit in seconds), NaN when missing
    (None or an empty text); a text that is no number, a bool, NaN, inf or a value outside
    :data:`LIMITS[kind]` raises one line naming ``where`` (the row) and ``field``."""
    if x is None or (isinstance(x, str) and not x.strip()):
        return math.nan
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        raise InputError(field, f"{where}: {x!r} is not a number", _fix(kind))
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        raise InputError(field, f"{where}: {x!r} is not a number", _fix(kind)) from None
    lo, hi, what = LIMITS[kind]
    if not math.isfinite(v):
        raise InputError(field, f"{where}: {x!r} is not finite", _fix(kind))
    v *= scale
    if not lo <= v <= hi:
        raise InputError(field, f"{where}: {x!r} is out of range for {what} ({lo:g} to {hi:g})", _fix(kind))
    if kind == "count" and v != round(v):
        raise InputError(field, f"{where}: {x!r} is not a whole number", _fix(kind))
    return v


def numbers(xs, field: str, where, kind: str, *, scale: float = 1.0) -> np.ndarray:
    """:func:`number` of each of ``xs``; ``where(i)`` names row ``i``."""
    return np.array([number(x, field, where(i), kind, scale=scale) for i, x in enumerate(xs)], dtype=np.float64)


def _fix(kind: str) -> str:
    lo, hi, what = LIMITS[kind]
    return f"give {what} between {lo:g} and {hi:g}, or leave it empty (null) when it was not recorded"


def check_origin(origin: float, field: str = "time_origin") -> float:
    """``--time-origin`` (or ``--time-zero``: ``field``): a finite absolute time in :data:`LIMITS`."""
    lo, hi, _ = LIMITS["time"]
    if not (math.isfinite(origin) and lo <= origin <= hi):
        fix = ("e.g. --time-origin 1715000000.0 (subtracted from every time), or first" if field == "time_origin"
               else "e.g. --time-zero 1715000000.0 (the epoch second the file's times count from)")
        raise InputError(field, f"{origin!r} is not an absolute time in seconds ({lo:g} to {hi:g})", fix)
    return origin


def impossible(send, first, finish, ok, chunks=None) -> dict:
    """Rows whose times cannot have happened, by reason -> boolean mask: for a finished request
    (``ok``) the first token before the send or after the last one (a TTFT longer than the
    latency), chunk times out of order; for any request a finish before the send."""
    send, first, finish = (np.asarray(a, dtype=np.float64) for a in (send, first, finish))
    ok = np.asarray(ok, dtype=bool)
    with np.errstate(invalid="ignore"):
        out = {
            "first token before the send": ok & (first < send - SLACK_S),
            "TTFT longer than the request's latency": ok & (first > finish + SLACK_S),
            "finish before the send": np.isfinite(finish) & (finish < send - SLACK_S),
        }
    if chunks is not None:
        out["chunk times out of order"] = ok & np.array(
            [len(c) > 1 and bool((np.diff(c) < -SLACK_S).any()) for c in chunks], dtype=bool)
    return out
