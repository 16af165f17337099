"""One summary dict per run, with vLLM bench serve's key names, intervals and diagnostics.

:func:`summarize` works the same on simulated and measured records. Its keys, where vLLM's
``vllm bench serve`` has them, mean what they mean there (``vllm/benchmarks/serve.py``:
``calculate_metrics`` and the result dict):

- ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens`` (of requests
  finishing in the window, see below), ``request_throughput`` / ``output_throughput`` / ``total_token_throughput``
  (per second of ``duration``), ``request_goodput`` (vLLM's with per-request SLOs; with aggregate
  targets only, each target's threshold applied per request; None without SLOs);
- ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` (population std, like ``np.std``) and
  ``pP_X_ms`` for ``X`` in ``ttft``, ``tpot``, ``itl``, ``e2el`` (``P`` printed as vLLM does:
  ``p99``, ``p99.9``); percentiles with numpy's linear interpolation. TPOT covers requests with
  more than one output token, TTFT/E2EL all completed ones.

Send time: vLLM measures TTFT and E2EL from the moment a request is actually sent. Records
from a benchmark client also hold that moment (``dispatched_s``), which can lag the intended
``arrival_s`` (a late sender, or a request waiting in the client for a ``--max-concurrency``
slot). Pass it as ``send_s`` and the vLLM-named keys (``mean_ttft_ms``, ``p99_e2el_ms``, ...,
their ``_ci``, ``request_goodput``, and the SLO figures: ``slo``, ``good_share``) count from
the actual send, as vLLM's do; the same TTFT and E2EL statistics from the intended time (the
schedule, which charges the client's waits to the latency) go to ``from_intended``
(``from_intended["p99_ttft_ms"]``, ...; TPOT, ITL and queue are the same either way). Without
``send_s`` (simulated runs: no client, no send lag) every latency counts from ``arrival_s``.

Additions: ``queue`` latencies (``first_scheduled_s - arrival_s``) with the same keys;
``mean_X_ms_ci`` / ``pP_X_ms_ci`` (``[lo, hi]`` or None, see :mod:`llmqueue.metrics.ci`: means on
the log scale of batch means, quantiles from the order statistics, so never below zero);
``duration_s``; ``arrivals``, ``arrival_rate``; ``status_counts``, ``in_flight``; ``utilization``,
``mean_batch_size``, ``mean_kv_tokens``, ``kv_utilization``; ``little`` and ``little_gap``;
``verdict`` and ``stable`` (the whole system over the arrival window: queue trend, failed share,
goodput; :func:`llmqueue.metrics.stability.system_verdict`), ``queue_verdict`` (the queue trend
alone), ``failed_share`` (rejected, timed out, cancelled or failed, of the arrivals),
``good_share`` (with SLOs: good requests of the arrivals), ``queue_growth_per_s`` and
``queue_growth_per_s_ci``, ``stability``;
``slo`` (attainment per class) when SLOs are given; ``lower_bounds`` (:func:`lower_bounds`) when the
queue grows (unstable): the latencies measured so far, as lower bounds, the figures to print
instead of the means over the requests that happened to finish (None otherwise).

Measurement window: ``[warmup_s, horizon_s]`` (horizon: the last event in the records unless
given), ``duration = horizon_s - warmup_s``. Requests *arriving* before ``warmup_s`` are left
out of latency statistics (as are those arriving after the horizon); throughputs count
requests *finishing* inside the window, divided by its length (the departure rate:
``finished_in_window`` ``ok`` requests, whenever they arrived, and their tokens in
``total_input_tokens`` / ``total_output_tokens``). ``completed`` and ``failed`` count the requests
*arriving* in the window, like ``arrivals``: those that finished ``ok`` inside it, and those that
ended there in another status, so ``completed + failed + in_flight <= arrivals`` always (with a
warm-up, requests that arrived before it and finish after it count in the throughput but not in
``completed``). With no warm-up and no horizon this is exactly vLLM's definition (all requests,
over the whole run; ``completed == finished_in_window``). ``status_counts`` counts the requests arriving in the window by status, ``in_flight``
those of them still in the system when the run stopped (``finish_s`` NaN, status
``unfinished``). Pass the run's stop time as ``horizon_s`` (the simulator's
``horizon_s``): the records alone cannot tell it, and the default window ends at the last
observed event. Latency statistics use finished (``ok``) requests only: in an overloaded run
they describe the survivors; the verdict and ``in_flight`` say so.

ITL: vLLM measures the gaps between streamed tokens at the client. From step records we use
one sample per decoded token: the duration of each engine iteration, weighted by its
``decode_seqs`` (and by ``steps`` for a row summarising several identical iterations, whose
``duration_s`` is then split evenly). Steps starting in the window count. This is the token
gap a running sequence sees; it leaves out stalls between iterations and the recompute after
a preemption. Measured per-token gaps can be passed instead as ``itl_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from llmqueue._validate import positive
from llmqueue.errors import InputError
from llmqueue.metrics._common import StepFunction, finite_or_none, window
from llmqueue.metrics.ci import DEFAULT_BATCHES, DEFAULT_LEVEL, OrderedSample, batch_means_ci, weighted_mean_std
from llmqueue.metrics.little import little_check
from llmqueue.metrics.slo import good_mask, goodput_targets, has_per_request, slo_attainment
from llmqueue.metrics.stability import FAILED_STATUSES, stability_verdict, system_verdict
from llmqueue.records.schema import STATUSES

METRICS = ("ttft", "tpot", "itl", "e2el", "queue")
DEFAULT_PERCENTILES = (50, 90, 95, 99, 99.9)


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in key names: 99 -> ``"99"``, 99.9 -> ``"99.9"``."""
    return str(int(p)) if int(p) == p else str(p)


def itl_samples(steps, t0: float = -math.inf, t1: float = math.inf):
    """ITL samples from step records: ``(durations_s, weights)`` in time order.

    One sample per decoded token: each iteration's duration (``duration_s / steps``), weight
    ``decode_seqs * steps``; iterations starting in ``[t0, t1)``; rows without decodes dropped.
    """
    start = steps["start_s"]
    k = steps.step_counts()
    w = steps["decode_seqs"] * k
    m = (start >= t0) & (start < t1) & (w > 0)
    order = np.argsort(start[m], kind="stable")
    return (steps["duration_s"][m] / k[m])[order], w[m][order].astype(np.float64)


def _stats(out: dict, name: str, x: np.ndarray, w, percentiles, level: float, batches: int) -> None:
    """Fill vLLM-style keys for one metric (``x`` in seconds, time-ordered)."""
    n = float(len(x) if w is None else np.sum(w))
    out[f"{name}_samples"] = int(n)
    if len(x) == 0 or n == 0:
        for key in ("mean", "median", "std"):
            out[f"{key}_{name}_ms"] = None
        out[f"mean_{name}_ms_ci"] = None
        for p in percentiles:
            out[f"p{percentile_word(p)}_{name}_ms"] = None
            out[f"p{percentile_word(p)}_{name}_ms_ci"] = None
        return
    mean, std = weighted_mean_std(x, w)
    sample = OrderedSample(x, w)  # sorted once for every percentile and its interval
    vals = sample.percentile(np.asarray(percentiles, dtype=np.float64))
    median = float(sample.percentile(50))
    out[f"mean_{name}_ms"] = 1000 * mean
    out[f"median_{name}_ms"] = 1000 * median
    out[f"std_{name}_ms"] = 1000 * std
    ci = batch_means_ci(x, weights=w, level=level, batches=batches, positive=True)  # latencies: never below 0
    out[f"mean_{name}_ms_ci"] = ci.scaled(1000).as_list() if ci else None
    inner = [p for p in percentiles if 0 < p < 100]
    cis = dict(zip(inner, sample.quantile_cis([p / 100 for p in inner], level=level, batches=batches)))
    for p, v in zip(percentiles, vals):
        word = percentile_word(p)
        out[f"p{word}_{name}_ms"] = 1000 * float(v)
        ci = cis.get(p)
        out[f"p{word}_{name}_ms_ci"] = ci.scaled(1000).as_list() if ci else None


def _busy_fraction(steps, t0: float, t1: float) -> tuple[float, int]:
    s = steps["start_s"]
    e = s + steps["duration_s"]
    overlap = np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0.0, None)
    replicas = np.unique(steps["replica"])
    busy = float(overlap.sum()) / ((t1 - t0) * len(replicas))
    return min(busy, 1.0), len(replicas)  # steps never overlap; clip float round-off


def sent_latencies(requests, send_s):
    """The records with each attempt's first-token and finish times moved back by its send lag
    (``send_s - arrival_s``; 0 where ``send_s`` is NaN): their latencies from ``arrival_s`` are
    the latencies from the actual send, while ``arrival_s`` (the window's selection) stays."""
    from llmqueue.records import RequestRecords

    a = requests["arrival_s"]
    send = np.asarray(send_s, dtype=np.float64)
    if send.shape != a.shape:
        raise InputError("send_s", f"{len(send)} send times for {len(a)} records")
    with np.errstate(invalid="ignore"):
        lag = np.where(np.isfinite(send) & (send > a), send - a, 0.0)
    cols = requests.to_dict()
    for c in ("first_token_s", "finish_s"):
        with np.errstate(invalid="ignore"):
            cols[c] = np.maximum(cols[c] - lag, a)  # NaN stays NaN
    return RequestRecords.from_columns(cols)


def lower_bounds(requests, arrived: np.ndarray, t1: float, percentiles) -> dict:
    """What an unstable run measured of its latencies: lower bounds, not steady-state figures.

    When the queue grows (lam > mu) the number in system and every wait grow with the run, so a
    mean over the requests that finished describes the early, lucky ones and the length of the
    run, not the server. What the records do show: each request arriving in the window that was
    served or is still in the system at ``t1`` waited at least what was observed: its TTFT /
    E2EL / queueing time when it has one, else ``t1 - arrival_s`` (censored at the stop). Means
    and percentiles of these censored values are lower bounds on the same figures over those
    arrivals (ms). ``unfinished``: how many were cut off; failed requests are left out (the
    failed share counts them)."""
    status = requests["status"]
    keep = arrived & ((status == "ok") | (status == "unfinished"))
    a = requests["arrival_s"][keep]
    out: dict = {"requests": int(keep.sum()), "unfinished": int(np.sum(keep & (status == "unfinished"))),
                 "note": "the queue grows: latencies have no steady state; these are lower bounds over the requests "
                         "arriving in the window that were served or still waiting at the stop (their wait so far "
                         "standing for what they have not yet seen)"}
    for name, col in (("ttft", "first_token_s"), ("e2el", "finish_s"), ("queue", "first_scheduled_s")):
        t = requests[col][keep]
        x = np.where(np.isfinite(t), t, t1) - a
        out[f"mean_{name}_ms"] = 1000 * float(np.mean(x)) if len(x) else None
        for q in percentiles:
            out[f"p{percentile_word(q)}_{name}_ms"] = 1000 * float(np.percentile(x, q)) if len(x) else None
    return out


def _goodput(requests, slos, fin_in, T: float):
    """vLLM's ``request_goodput``: good requests (:func:`goodput_targets`) finishing in the window,
    per second; None without SLOs or without a per-request threshold."""
    if not slos:
        return None
    targets = goodput_targets(slos)
    if not has_per_request(targets):
        return None
    return float(np.sum(good_mask(requests, targets) & fin_in)) / T


def summarize(requests, *, timeseries=None, steps=None, warmup_s: float = 0.0,
              horizon_s: float | None = None, slos: dict | None = None,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES, level: float = DEFAULT_LEVEL,
              batches: int = DEFAULT_BATCHES, kv_capacity: float | None = None,
              itl_s=None, send_s=None) -> dict:
    """Summarise a run: vLLM bench serve's metrics plus intervals, Little's law and stability.

    ``requests``: :class:`~llmqueue.records.RequestRecords`; ``steps`` / ``timeseries``:
    optional step records and sampled state. ``warmup_s`` / ``horizon_s``: the measurement
    window. ``slos``: targets in ms (see :mod:`llmqueue.metrics.slo`), e.g. ``{"ttft_ms": 2000,
    "tpot_ms": 100, "p99_ttft_ms": 5000}`` or per class. ``kv_capacity``: KV tokens per
    replica (``M``), for ``kv_utilization``. ``itl_s``: measured inter-token gaps in seconds
    (time-ordered, already restricted to the window), used instead of step records.
    ``send_s``: each record's actual send time (a benchmark's ``dispatched_s``; NaN: not sent,
    taken as ``arrival_s``): TTFT/E2EL (and goodput, SLOs) then count from it, as vLLM's do,
    and ``from_intended`` holds them from ``arrival_s`` (see the module docstring).

    Returns a plain dict (JSON-ready with :func:`llmqueue.records.dump_summary`); see the
    module docstring for the keys and the conventions.
    """
    percentiles = tuple(float(p) if int(p) != p else int(p) for p in percentiles)
    for p in percentiles:
        if not 0 < p <= 100:
            raise InputError("percentiles", f"{p} is not in (0, 100]")
    if kv_capacity is not None:
        kv_capacity = positive("kv_capacity", kv_capacity)
    t0, t1 = window(requests, warmup_s, horizon_s)
    T = t1 - t0
    status = requests["status"]
    a = requests["arrival_s"]
    fin = requests["finish_s"]
    arrived = (a >= t0) & (a < t1)
    with np.errstate(invalid="ignore"):
        fin_in = np.isfinite(fin) & (fin >= t0) & (fin <= t1)
    ok = status == "ok"
    departed = ok & fin_in  # the throughput's requests: ok, finishing in the window
    completed = departed & arrived  # ... of those arriving in it, as ``arrivals`` counts
    failed = fin_in & ~ok & arrived
    lat = requests if send_s is None else sent_latencies(requests, send_s)
    n_in = int(requests["prompt_tokens"][departed].sum())
    n_out = int(requests["output_tokens"][departed].sum())

    out: dict = {
        "duration": T,
        "duration_s": T,
        "warmup_s": t0,
        "horizon_s": t1,
        "completed": int(completed.sum()),
        "failed": int(failed.sum()),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "finished_in_window": int(departed.sum()),
        "request_throughput": departed.sum() / T,
        "request_goodput": _goodput(lat, slos, fin_in, T),
        "output_throughput": n_out / T,
        "total_token_throughput": (n_in + n_out) / T,
        "arrivals": int(arrived.sum()),
        "arrival_rate": arrived.sum() / T,
        "status_counts": {s: int(np.sum(arrived & (status == s))) for s in STATUSES},
        "in_flight": int(np.sum(arrived & np.isnan(fin))),
        "percentiles": list(percentiles),
        "ci_level": level,
        "ci_method": f"batch means over arrival order (up to {batches} batches, Student t on the log of the "
                     "batch means, so never below 0); quantiles by inverting the batched CDF (order statistics); "
                     "null when data are too few",
    }

    # Latencies of ok requests arriving in the window, in arrival order.
    d0 = requests.derived()
    d = d0 if lat is requests else {**lat.derived(), "queue_s": d0["queue_s"]}
    sel = np.flatnonzero(arrived & ok)
    sel = sel[np.argsort(a[sel], kind="stable")]
    for name in ("ttft", "tpot", "e2el", "queue"):
        x = d[f"{name}_s"][sel]
        _stats(out, name, x[np.isfinite(x)], None, percentiles, level, batches)
    if send_s is not None:
        fi: dict = {"note": "TTFT and E2EL from each request's intended send time (the schedule: a client's "
                            "lateness and its wait for a concurrency slot count as latency); the top-level keys "
                            "count from the actual send, as vllm bench serve does"}
        for name in ("ttft", "e2el"):
            x = d0[f"{name}_s"][sel]
            _stats(fi, name, x[np.isfinite(x)], None, percentiles, level, batches)
        fi["request_goodput"] = _goodput(requests, slos, fin_in, T)
        out["from_intended"] = fi
    itl_pair = None
    if itl_s is not None:
        x = np.asarray(itl_s, dtype=np.float64)
        itl_pair = (x[np.isfinite(x)], None)
        out["itl_source"] = "itl_s"
    elif steps is not None and len(steps):
        itl_pair = itl_samples(steps, t0, t1)
        out["itl_source"] = "steps: iteration durations weighted by decode_seqs"
    else:
        out["itl_source"] = None
    x, w = itl_pair if itl_pair is not None else (np.zeros(0), None)
    _stats(out, "itl", x, w, percentiles, level, batches)

    # Engine state.
    out["utilization"] = out["mean_batch_size"] = None
    out["replicas"] = None
    if steps is not None and len(steps):
        out["utilization"], out["replicas"] = _busy_fraction(steps, t0, t1)
        s = steps["start_s"]
        m = (s >= t0) & (s < t1)
        if m.any() and steps["duration_s"][m].sum() > 0:
            out["mean_batch_size"] = float(np.average(steps["num_running"][m],
                                                      weights=steps["duration_s"][m]))
    out["mean_kv_tokens"] = out["kv_utilization"] = None
    out["mean_num_waiting"] = out["mean_num_running"] = None
    kv_src = None
    if timeseries is not None and len(timeseries):
        kv_src = (timeseries["t_s"], timeseries["kv_tokens"], timeseries["replica"])
        for col in ("num_waiting", "num_running"):
            out[f"mean_{col}"] = StepFunction.from_samples(
                timeseries["t_s"], timeseries[col], timeseries["replica"]).mean(t0, t1)
    elif steps is not None and len(steps):
        kv_src = (steps["start_s"] + steps["duration_s"], steps["kv_tokens"], steps["replica"])
    if kv_src is not None:
        n_rep = len(np.unique(kv_src[2]))
        out["mean_kv_tokens"] = StepFunction.from_samples(*kv_src).mean(t0, t1) / n_rep
        if kv_capacity is not None:
            out["kv_utilization"] = out["mean_kv_tokens"] / kv_capacity

    # Little's law and stability.
    lc = little_check(requests, warmup_s=t0, horizon_s=t1, timeseries=timeseries)
    out["little"] = lc.to_dict()
    out["little_gap"] = finite_or_none(lc.gap)
    # the queue's trend over the arrival window only (the drain after the last arrival would
    # show a shrinking backlog whatever the load), then the whole system's verdict
    t_last = float(a[arrived].max()) if arrived.any() else t1
    sv = stability_verdict(requests, timeseries=timeseries, warmup_s=t0,
                           horizon_s=t_last if t_last > t0 else t1, level=level, batches=batches)
    good_share = None
    out["failed_share"] = (float(np.sum(arrived & np.isin(status, FAILED_STATUSES)) / arrived.sum())
                           if arrived.any() else None)
    if slos:
        targets = goodput_targets(slos)
        if has_per_request(targets) and arrived.any():
            good_share = float(np.sum(good_mask(lat, targets) & arrived) / arrived.sum())
    out["good_share"] = good_share
    out["verdict"], out["stable"] = system_verdict(sv, out["status_counts"], good_share, out["request_goodput"],
                                                  level=level)
    out["queue_verdict"] = sv.verdict
    out["lower_bounds"] = lower_bounds(lat, arrived, t1, percentiles) if sv.stable is False else None
    out["queue_growth_per_s"] = sv.growth_per_s
    out["queue_growth_per_s_ci"] = list(sv.growth_ci) if sv.growth_ci else None
    out["stability"] = sv.to_dict()

    if slos:
        itl_arg = None if itl_pair is None else itl_pair
        out["slo"] = slo_attainment(lat, slos, warmup_s=t0, horizon_s=t1, level=level, itl=itl_arg)
    return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in out.items()}


def summary_of(run) -> dict:
    """A run's summary: its ``summary.json``, or, for a run whose writer was killed before writing
    one (a benchmark killed outright: only the journals of its records are left), the summary of
    the records it holds (from the actual send where they record it, as a benchmark's is; the
    run's ``notes`` say so). A run that was never given a summary keeps none (``{}``).
    ``run``: a :class:`llmqueue.records.Run`."""
    if run.summary is not None or not run.journals:
        return dict(run.summary or {})
    recs = run.requests
    send = recs["dispatched_s"] if "dispatched_s" in recs else None
    return summarize(recs, timeseries=run.timeseries, steps=run.steps, send_s=send)
