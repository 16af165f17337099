"""NVIDIA AIPerf's per-request export (``profile_export.jsonl``) as per-request fields for
:func:`llmqueue.bench.importers.build_run`.

The format was read from AIPerf's own models (ai-dynamo/aiperf, main of October 2025:
``aiperf/common/models/record_models.py``'s ``MetricRecordInfo`` and ``MetricRecordMetadata``,
``aiperf/post_processors/record_export_results_processor.py``, the metric definitions under
``aiperf/metrics/types/`` and ``docs/tutorials/working-with-profile-exports.md``). One JSON
object a line::

    {"metadata": {"request_start_ns": ..., "request_end_ns": ..., "benchmark_phase": "profiling",
                  "was_cancelled": false, "cancellation_time_ns": null, "session_num": 45, ...},
     "metrics": {"time_to_first_token": {"value": 255.9, "unit": "ms"},
                 "request_latency": {"value": 297.5, "unit": "ms"},
                 "inter_chunk_latency": {"value": [4.9, 5.3, ...], "unit": "ms"},
                 "input_sequence_length": {"value": 550, "unit": "tokens"},
                 "output_sequence_length": {"value": 9, "unit": "tokens"}, ...},
     "error": null | {"code": 499, "type": "RequestCancellationError", "message": "..."}}

``request_start_ns`` is the send (``time.time_ns()``); TTFT and the request latency are from
it to the first and the last streamed response; ``inter_chunk_latency`` holds the gaps between
consecutive responses, so the chunk times are the send + TTFT + their running sum. Each metric
carries its unit (``ns``, ``us``, ``ms``, ``sec``). ``output_sequence_length`` counts the
reasoning tokens too (every token the engine decoded). A failed record has no timing metrics
(``error_isl`` holds its prompt length); ``was_cancelled`` (AIPerf's
``--request-cancellation-rate``, or a request still open at the benchmark's end) is the
record schema's ``cancelled``. Records of the ``warmup`` phase are left out.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from llmqueue.bench.import_fields import number, numbers
from llmqueue.errors import InputError

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}


def _count(m: dict, name: str, fallback: str, where: str) -> float:
    """A token count: metric ``name``, else ``fallback`` (AIPerf's name in other record kinds)."""
    v, field = _metric(m, name, where=where), name
    if v is None:
        v, field = _metric(m, fallback, where=where), fallback
    if v is None:
        raise InputError("file", f"{where} has no metrics.{name} (nor {fallback})",
                         "give the records AIPerf exported, unedited")
    return number(v, f"metrics.{field}", where, "count")


def _metric(metrics: dict, name: str, *, where: str, seconds: bool = False):
    """A metric's value (seconds for a time, a list for a list metric) or None."""
    m = metrics.get(name)
    if not isinstance(m, dict) or "value" not in m:
        return None
    v = m["value"]
    if not seconds:
        return v
    unit = str(m.get("unit", ""))
    if unit not in _UNIT_S:
        raise InputError("file", f"{where}: metrics.{name} has unit {unit!r}",
                         f"units understood: {', '.join(_UNIT_S)}")
    k = _UNIT_S[unit]
    if isinstance(v, list):
        return numbers(v, f"metrics.{name}", lambda _: where, "duration", scale=k)
    return number(v, f"metrics.{name}", where, "duration", scale=k)


def columns(path) -> tuple[dict, list[str]]:
    """The raw per-request fields of an AIPerf ``profile_export.jsonl`` and notes."""
    from llmqueue._files import input_file, jsonl_objects, reading

    p = input_file("file", Path(path))
    rows = []
    warm = 0
    with reading("file", p):
        for i, d in jsonl_objects("file", p, "give AIPerf's profile_export.jsonl (one record a line)"):
            if not isinstance(d.get("metadata"), dict):
                raise InputError("file", f"{str(p)!r} line {i} is not an AIPerf record (no metadata object)",
                                 "give AIPerf's profile_export.jsonl (--export-level records), not its "
                                 "profile_export_aiperf.json summary")
            if d["metadata"].get("benchmark_phase") == "warmup":
                warm += 1
                continue
            rows.append((i, d))
    if not rows:
        raise InputError("file", f"{str(p)!r} holds no profiling records")
    n = len(rows)
    send = np.full(n, np.nan)
    end = np.full(n, np.nan)
    ttft = np.full(n, np.nan)
    e2el = np.full(n, np.nan)
    prompt = np.full(n, np.nan)
    out = np.full(n, np.nan)
    status, error, itls = [], [], []
    for j, (i, d) in enumerate(rows):
        md, m = d["metadata"], d.get("metrics") or {}
        where = f"{str(p)!r} line {i}"
        if md.get("request_start_ns") is None:
            raise InputError("file", f"{where} has no metadata.request_start_ns (the send time)",
                             "give the records AIPerf exported, unedited")
        ns = lambda k: number(md.get(k), f"metadata.{k}", where, "time", scale=1e-9)  # noqa: E731
        send[j] = ns("request_start_ns")
        end[j] = ns("request_end_ns")
        err = d.get("error")
        cancelled = bool(md.get("was_cancelled"))
        if cancelled and md.get("cancellation_time_ns") is not None:
            end[j] = ns("cancellation_time_ns")
        prompt[j] = _count(m, "input_sequence_length", "error_isl", where)
        if cancelled:
            status.append("cancelled")
        elif err:
            status.append("error")
        else:
            status.append("ok")
        error.append("" if not err else str(err.get("message") or err.get("type") or err)
                     if isinstance(err, dict) else str(err))
        itl = None
        if status[-1] == "ok":
            t = _metric(m, "time_to_first_token", where=where, seconds=True)
            lat = _metric(m, "request_latency", where=where, seconds=True)
            if t is None or lat is None:
                name = "time_to_first_token" if t is None else "request_latency"
                raise InputError("file", f"{where} (a successful request) has no metrics.{name}",
                                 "profile with --streaming: AIPerf measures TTFT only on streamed responses")
            ttft[j], e2el[j] = t, lat
            out[j] = _count(m, "output_sequence_length", "output_token_count", where)
            itl = _metric(m, "inter_chunk_latency", where=where, seconds=True)
        itls.append(itl)
    cols = {"n": n, "send_s": send, "ttft_s": ttft, "e2el_s": e2el, "prompt_tokens": prompt,
            "output_tokens": np.nan_to_num(out), "status": status, "error": error}
    # a failed request's end: when the client gave up or the error came
    cols["finish_s"] = np.where(np.isfinite(e2el), send + e2el, end)
    del cols["e2el_s"]
    ok = np.array([s == "ok" for s in status])
    notes = []
    if warm:
        notes.append(f"{warm} warmup record(s) left out")
    have = ok & np.array([x is not None for x in itls])
    if have.any() and have.sum() == ok.sum():
        cols["itls"] = [x if x is not None else np.zeros(0) for x in itls]
        # the chunks end at the last response: a check that the gaps are the ones of this record
        last = np.array([ttft[j] + (x.sum() if x is not None else 0.0) for j, x in enumerate(itls)])
        off = np.abs(last - e2el)[ok]
        if off.size and np.nanmax(off) > 1e-3:
            notes.append(f"the chunk gaps of some records do not add up to their request latency (up to "
                         f"{1e3 * float(np.nanmax(off)):.1f} ms)")
    elif ok.any():
        notes.append("no inter_chunk_latency in the records (a non-streaming run, or one chunk each): no "
                     "per-chunk times (tokens.parquet)")
    if not np.isfinite(prompt).all() or math.isnan(float(np.nanmax(send))):
        raise InputError("file", f"{str(p)!r} has records without a send time or a prompt length")
    cols["meta"] = {"records": n, "warmup_left_out": warm}
    return cols, notes
