"""How long and how finely one simulation may run: checked before it starts.

A run's memory grows with its request stream (bounded in
:func:`llmqueue.workload.generate.check_stream_size`), its step records and its time series; its
time with the steps it takes. What is bounded here:

- :data:`MAX_SIM_TIME_S`: simulated times (arrivals, the horizon) up to 1e10 s, about 317 years.
  Times are float64 seconds; at 1e10 s one unit in the last place is 2e-6 s, a thousandth of a
  2 ms step. Far beyond it a step's duration is lost in rounding (``t + b == t`` from about 1e17 s
  for a 40 ms step) and the clock stops. A run that long has no realistic use: its arrivals would
  have to be spaced by months for the stream to fit in memory.
- :data:`MAX_TIMESERIES_ROWS`: a run keeps at most 5,000,000 time-series samples (one every
  ``sample_dt`` seconds of simulated time, idle time included): 200 MB as columns, 58 days at
  the default one a second. Estimated before the run from its horizon (or its last arrival), and
  enforced while it runs (a queue left to drain after the last arrival can outlast the estimate).

"""

from __future__ import annotations

import math

from llmqueue.errors import InputError

MAX_SIM_TIME_S = 1e10
MAX_TIMESERIES_ROWS = 5_000_000


def check_run_size(*, last_arrival_s: float, horizon_s: float | None, sample_dt: float) -> None:
    """Refuse, before it starts, a run whose times exceed :data:`MAX_SIM_TIME_S` or whose time
    series would exceed :data:`MAX_TIMESERIES_ROWS` samples (its span: the horizon, else the last
    arrival), naming the estimate and the flag to change."""
    horizon = math.inf if horizon_s is None else float(horizon_s)
    if horizon < math.inf and horizon > MAX_SIM_TIME_S:
        raise InputError("duration", f"{horizon:.3g} s is longer than the {MAX_SIM_TIME_S:.0e} s (about 317 years) "
                         "a simulated clock resolves", f"give --duration {MAX_SIM_TIME_S:.0e} or less")
    if last_arrival_s > MAX_SIM_TIME_S and last_arrival_s <= horizon:
        raise InputError("arrival", f"requests arrive as late as {last_arrival_s:.3g} s, beyond the "
                         f"{MAX_SIM_TIME_S:.0e} s (about 317 years) a simulated clock resolves",
                         "give a higher arrival rate, fewer requests or a shorter trace")
    span = min(horizon, last_arrival_s)
    if sample_dt > 0 and math.isfinite(span):
        check_samples(span / sample_dt, span, sample_dt, before=True)


def check_samples(rows: float, t: float, sample_dt: float, before: bool = False) -> None:
    """Refuse a time series of ``rows`` samples (reached at simulated time ``t``) above
    :data:`MAX_TIMESERIES_ROWS`, with the ``--sample-dt`` that would fit."""
    if rows > MAX_TIMESERIES_ROWS:
        when = "would hold" if before else "reached"
        raise InputError("sample_dt", f"the time series {when} {rows:.3g} samples over {t:.4g} s (one every "
                         f"{sample_dt:g} s), more than the {MAX_TIMESERIES_ROWS:,} a run keeps (40 bytes each)",
                         f"give --sample-dt {1.1 * t / MAX_TIMESERIES_ROWS:.3g} or more")


def sample_index_before(k0: int, dt: float, t_end: float, horizon: float = math.inf) -> int:
    """Sample times are ``k * dt`` (``k = 0, 1, ...``). From the next one ``k0``, the index of the
    first sample at or after ``t_end`` or after ``horizon``: samples ``k0 .. k1 - 1`` fall in the
    interval, found in O(1) however many there are (a long idle gap costs nothing). Raises
    :class:`InputError` when the series would pass :data:`MAX_TIMESERIES_ROWS`."""
    if not dt > 0 or not (k0 * dt < t_end and k0 * dt <= horizon):
        return k0
    stop = min(t_end, math.nextafter(horizon, math.inf))  # k * dt < stop: before t_end, at most horizon
    ratio = stop / dt
    if not ratio < MAX_TIMESERIES_ROWS + 2:
        check_samples(ratio, stop, dt)
    k1 = max(k0, math.ceil(ratio))
    while k1 > k0 and not ((k1 - 1) * dt < t_end and (k1 - 1) * dt <= horizon):
        k1 -= 1  # rounding of the division, either way
    while k1 * dt < t_end and k1 * dt <= horizon:
        k1 += 1
    if k1 > MAX_TIMESERIES_ROWS:
        check_samples(k1, stop, dt)
    return k1
