"""Trace files: load recorded request streams, check and repair them, save them, replay them.

A trace is a recorded request stream: one row per request with its arrival time and its
prompt and output lengths (tokens). Every loader returns a :class:`~llmqueue.workload.trace.Trace`
with times in seconds from the first request, sorted.

Formats (``format=``; detected from the extension and the header when not given):

- ``azure``: Azure LLM inference trace 2023 (Splitwise) CSV: ``TIMESTAMP`` (wall clock, 100 ns
  digits, parsed exactly to int64 nanoseconds by pyarrow), ``ContextTokens``, ``GeneratedTokens``.
- ``mooncake``: Mooncake/Kimi FAST'25 JSONL: ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (512-token prefix-block hashes, kept).
- ``burstgpt``: BurstGPT CSV: ``Timestamp`` (s), ``Model`` (kept as the class), ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type``. Written from the published schema; no
  sample was available to check it against.
- ``vllm``: the result JSON of ``vllm bench serve --save-result --save-detailed`` (or the older
  ``benchmark_serving.py``): ``input_lens``, ``output_lens`` and ``start_times``
  (``time.perf_counter()`` seconds). Files from versions without ``start_times`` hold no arrival
  times: they are reconstructed, evenly spaced, from ``request_rate`` (the file's, or the
  ``request_rate=`` argument), and the trace says so in ``repairs``.
- ``csv`` / ``jsonl`` / ``json`` / ``parquet``: any table with a column ``mapping`` such as
  ``"time=t,prompt=in,output=out,class=tenant,time_unit=ms"``; roles not mapped are found by
  the known column names (:data:`KNOWN_TIME`, and those of :mod:`llmqueue.workload.tables` for
  the lengths).
- ``canonical``: the Parquet file :func:`write_trace` writes (columns ``arrival_s``,
  ``prompt_tokens``, ``output_tokens``, optional ``class`` and ``hash_ids``; key-value metadata
  ``llmqueue.source``, ``llmqueue.repairs``, ``llmqueue.version``).

Checks and repairs are never silent. A problem raises :class:`~llmqueue.errors.InputError` (one
line: field, problem, fix); a repair is appended to ``Trace.repairs``:

- missing column: error naming it and listing the columns found;
- missing, non-numeric, negative or non-integer lengths, missing timestamps: error with the row
  and value, or with ``drop_bad=True`` the rows are dropped ("dropped 3 rows with negative
  lengths ...");
- unsorted timestamps: stable sort ("sorted 12 out-of-order rows ...");
- tied timestamps: kept and counted; ``spread_ties=True`` spreads each group of ties evenly over
  its tick (the Mooncake conversation trace is quantized to ~3 s ticks);
- an empty file: error;
- a time unit that gives an absurd span or rate (e.g. milliseconds read as seconds): an error
  naming the unit that looks right when the unit was assumed, a ``warning:`` note when it was
  given.

Replay transforms are pure functions returning a new Trace: :func:`time_scale`,
:func:`rescale_rate`, :func:`window`, :func:`loop`; :func:`trace_to_requests` gives the
:class:`~llmqueue.workload.generate.RequestArrays` that drive the simulator.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmqueue._files import reading, staged
from llmqueue._validate import positive, positive_int
from llmqueue.errors import InputError
from llmqueue.workload.trace import Trace

__all__ = [
    "FORMATS", "TIME_UNITS", "KNOWN_TIME", "load_trace", "detect_format", "parse_mapping",
    "write_trace", "read_trace", "time_scale", "rescale_rate", "window", "loop",
    "trace_to_requests", "trace_from_requests",
]

FORMATS = ("azure", "mooncake", "burstgpt", "vllm", "csv", "jsonl", "json", "parquet", "canonical")
#: Ticks per second of each time unit.
TIME_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
#: Version of the canonical Parquet layout (``llmqueue.version`` in its metadata).
CANONICAL_VERSION = "1"
#: Column names taken as the arrival time when no mapping names one (case-insensitive).
KNOWN_TIME = ("arrival_s", "arrival_time", "arrival", "timestamp", "time", "time_s", "t",
              "start_time", "timestamp_s", "timestamp_ms", "arrival_ms", "time_ms", "timestamp_us",
              "timestamp_ns")
KNOWN_CLASS = ("class", "class_name")
MAPPING_KEYS = ("time", "prompt", "output", "class", "hash_ids", "time_unit")

_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_YEAR_S = 365.25 * 86400
# Longest span a trace may have (first to last arrival). Real serving traces span hours to weeks;
# beyond this the times are in the wrong unit or corrupt, and the per-second bins and windows
# that stats, fit and the simulator build over the span would exhaust memory or never finish.
MAX_SPAN_S = 10 * _YEAR_S
_MIN_RATE, _MAX_RATE, _RATE_MIN_N = 0.01, 1e5, 50


@dataclass(frozen=True)
class _Layout:
    """Default columns of a known format (``None``: the format has no such column)."""

    time: str
    prompt: str
    output: str
    klass: str | None = None
    hash_ids: str | None = None
    unit: str | None = None  # None: a wall-clock timestamp column


_LAYOUTS = {
    "azure": _Layout("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": _Layout("timestamp", "input_length", "output_length", hash_ids="hash_ids", unit="ms"),
    "burstgpt": _Layout("Timestamp", "Request tokens", "Response tokens", klass="Model", unit="s"),
    "canonical": _Layout("arrival_s", "prompt_tokens", "output_tokens", klass="class",
                         hash_ids="hash_ids", unit="s"),
}


# --- public entry --------------------------------------------------------------------------------

def load_trace(path, *, format: str | None = None, mapping=None, time_unit: str | None = None,
               drop_bad: bool = False, spread_ties: bool = False,
               request_rate: float | None = None) -> Trace:
    """Read a trace file into a :class:`Trace` (sorted, seconds from the first request).

    ``format``: one of :data:`FORMATS`, detected when ``None``. ``mapping``: ``{"time": COL,
    "prompt": COL, "output": COL, "class": COL, "hash_ids": COL, "time_unit": UNIT}`` or the same
    as ``"time=COL,prompt=COL,..."``; it overrides the format's default columns. ``time_unit``:
    ``s``, ``ms``, ``us`` or ``ns`` for a numeric time column. ``drop_bad``: drop rows with
    missing/negative/non-integer lengths or missing times (reported) instead of raising.
    ``spread_ties``: spread requests that share a timestamp evenly over their tick (reported).
    ``request_rate``: for vLLM results without ``start_times``, the rate to space arrivals at.
    A file that cannot be read or decoded (bad UTF-8, a truncated gzip stream, nesting too deep)
    raises :class:`InputError` on ``file``.
    """
    with reading("file", path):
        return _load_trace(path, format=format, mapping=mapping, time_unit=time_unit, drop_bad=drop_bad,
                           spread_ties=spread_ties, request_rate=request_rate)


def _load_trace(path, *, format, mapping, time_unit, drop_bad, spread_ties, request_rate) -> Trace:  # noqa: A002
    p = _check_file(path)
    maps = parse_mapping(mapping)
    if time_unit is not None:
        time_unit = _check_unit(time_unit, "time_unit")
        if "time_unit" in maps and maps["time_unit"] != time_unit:
            raise InputError("time_unit", f"{time_unit!r} contradicts the mapping's "
                             f"time_unit={maps['time_unit']}", "give the unit once")
        maps["time_unit"] = time_unit
    fmt = detect_format(p) if format is None else _check_format(format)
    opts = dict(drop_bad=bool(drop_bad), spread_ties=bool(spread_ties))
    if fmt == "vllm":
        if set(maps) - {"time_unit"}:
            raise InputError("map", "a vLLM result file has fixed keys (input_lens, output_lens, "
                             "start_times); a column mapping does not apply")
        return _load_vllm(p, request_rate=request_rate, **opts)
    if request_rate is not None:
        raise InputError("request_rate", "applies only to vLLM result files without start_times")
    table, kind = _read_table(p, fmt)
    layout = _LAYOUTS.get(fmt)
    if fmt == "canonical":
        trace = _from_table(table, p, kind, layout, maps, **opts, explicit_unit=True)
        meta = _metadata(p)
        stored = meta.get("repairs", [])
        # Notes the checks find again (e.g. ties) are already among the stored ones.
        trace.repairs = stored + [r for r in trace.repairs if r not in stored]
        if meta.get("source"):
            trace.source = meta["source"]
        return trace
    return _from_table(table, p, kind, layout, maps, **opts,
                       explicit_unit=layout is not None and layout.unit is not None)


def detect_format(path) -> str:
    """The format of ``path`` from its extension and header (see the module docstring)."""
    with reading("file", path):
        return _detect_format(path)


def _detect_format(path) -> str:
    p = _check_file(path)
    name = p.name.lower()
    base = name[:-3] if name.endswith(".gz") else name
    if base.endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(p)
        except Exception as e:  # noqa: BLE001 - any pyarrow failure is a bad file
            raise InputError("file", f"{str(path)!r} is not a readable Parquet file: {_one_line(e)}") from None
        meta = schema.metadata or {}
        if b"llmqueue.version" in meta or {"arrival_s", "prompt_tokens", "output_tokens"} <= set(schema.names):
            return "canonical"
        return "parquet"
    head = _first_line(p)
    if base.endswith((".jsonl", ".ndjson")):
        try:
            keys = set(json.loads(head)) if head.strip().startswith("{") else set()
        except json.JSONDecodeError:
            keys = set()
        return "mooncake" if {"timestamp", "input_length", "output_length"} <= keys else "jsonl"
    if base.endswith(".json"):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(p, "rt", encoding="utf-8-sig") as fh:
            start = fh.read(1 << 20)
        keys = ('"input_lens"', '"request_throughput"', '"mean_ttft_ms"', '"total_input_tokens"',
                '"num_prompts"')
        return "vllm" if any(k in start for k in keys) else "json"
    sep = "\t" if base.endswith(".tsv") or ("\t" in head and "," not in head) else ","
    cols = {c.strip().strip('"').strip() for c in head.split(sep)}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= cols:
        return "burstgpt"
    return "csv"


def parse_mapping(mapping) -> dict:
    """``"time=COL,prompt=COL,output=COL,class=COL,time_unit=ms"`` (or a dict) as a checked dict."""
    if mapping is None:
        return {}
    if isinstance(mapping, str):
        out = {}
        for part in (s for s in mapping.split(",") if s.strip()):
            key, eq, val = part.partition("=")
            key, val = key.strip(), val.strip()
            if not eq or not val:
                raise InputError("map", f"{part.strip()!r} is not KEY=COLUMN",
                                 "e.g. time=ts,prompt=input_tokens,output=output_tokens,time_unit=ms")
            if key in out:
                raise InputError("map", f"{key} is given twice")
            out[key] = val
        mapping = out
    if not isinstance(mapping, dict):
        raise InputError("map", f"expected a dict or 'key=COL,...' text, got {type(mapping).__name__}")
    bad = [k for k in mapping if k not in MAPPING_KEYS]
    if bad:
        raise InputError("map", f"unknown key {bad[0]!r}", f"keys are {', '.join(MAPPING_KEYS)}")
    out = {k: str(v) for k, v in mapping.items()}
    if "time_unit" in out:
        out["time_unit"] = _check_unit(out["time_unit"], "map")
    return out


# --- canonical Parquet ---------------------------------------------------------------------------

def write_trace(trace: Trace, path) -> Path:
    """Write ``trace`` as one canonical Parquet file; returns the path.

    Columns ``arrival_s`` (float64), ``prompt_tokens``, ``output_tokens`` (int64), ``class``
    (string, when the trace has classes) and ``hash_ids`` (list<int64>, when it has them);
    metadata ``llmqueue.version``, ``llmqueue.package``, ``llmqueue.source`` and
    ``llmqueue.repairs`` (a JSON list). :func:`read_trace` reads it back exactly.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from llmqueue import __version__

    _check_trace(trace)
    cols = {"arrival_s": pa.array(np.asarray(trace.arrival_s, dtype=np.float64)),
            "prompt_tokens": pa.array(np.asarray(trace.prompt_tokens, dtype=np.int64)),
            "output_tokens": pa.array(np.asarray(trace.output_tokens, dtype=np.int64))}
    if trace.class_name is not None:
        cols["class"] = pa.array(np.asarray(trace.class_name, dtype=str).tolist(), type=pa.string())
    if trace.hash_ids is not None:
        lens = np.fromiter((len(h) for h in trace.hash_ids), dtype=np.int64, count=len(trace))
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32 if lens.sum() < 2**31 else np.int64)
        values = (np.concatenate([np.asarray(h, dtype=np.int64) for h in trace.hash_ids])
                  if len(trace) else np.zeros(0, np.int64))
        cls = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
        cols["hash_ids"] = cls.from_arrays(pa.array(offsets), pa.array(values, type=pa.int64()))
    meta = {"llmqueue.version": CANONICAL_VERSION, "llmqueue.package": __version__,
            "llmqueue.source": str(trace.source), "llmqueue.repairs": json.dumps(list(trace.repairs))}
    table = pa.table(cols).replace_schema_metadata(meta)
    out = Path(path)
    with staged(out, field="output") as tmp:
        pq.write_table(table, tmp)
    return out


def read_trace(path, **kwargs) -> Trace:
    """Read a canonical Parquet trace written by :func:`write_trace` (same checks as
    :func:`load_trace`; the stored source and repairs come back with it)."""
    return load_trace(path, format="canonical", **kwargs)


# --- replay transforms ---------------------------------------------------------------------------

def time_scale(trace: Trace, k: float) -> Trace:
    """Multiply every arrival time by ``k``: ``k < 1`` compresses (rate x 1/k), ``k > 1`` stretches.

    Lengths and order are unchanged; the mean rate becomes ``mean_rate / k``.
    """
    k = positive("scale", k)
    return _derive(trace, arrival_s=trace.arrival_s * k, field="scale",
                   note=f"scaled times by {k:g} (rate x{1 / k:.6g})")


def rescale_rate(trace: Trace, target_rate: float) -> Trace:
    """Scale time so that the mean rate ``(n-1)/span`` becomes ``target_rate`` req/s."""
    target = positive("rate", target_rate)
    if len(trace) < 2 or trace.span_s <= 0:
        raise InputError("rate", "the trace has no time span (fewer than 2 distinct arrival times), "
                         "so its rate cannot be rescaled")
    k = trace.mean_rate / target
    return _derive(trace, arrival_s=trace.arrival_s * k, field="rate",
                   note=f"rescaled the mean rate from {trace.mean_rate:.6g} to {target:g} req/s "
                        f"(times x{k:.6g})")


def window(trace: Trace, start_s: float = 0.0, end_s: float | None = None) -> Trace:
    """The requests arriving in ``[start_s, end_s)``, times rebased so the first of them is at 0."""
    start = float(start_s)
    end = math.inf if end_s is None else float(end_s)
    if not (math.isfinite(start) and start >= 0):
        raise InputError("window", f"start must be a finite time >= 0 (got {start_s!r})")
    if not end > start:
        raise InputError("window", f"end must be after start (got {start:g}..{end:g})")
    t = trace.arrival_s
    lo, hi = np.searchsorted(t, start, "left"), np.searchsorted(t, end, "left")
    if hi <= lo:
        raise InputError("window", f"[{start:g}, {end:g}) s holds no requests (the trace spans "
                         f"0..{trace.span_s:.6g} s)")
    sel = slice(int(lo), int(hi))
    first = float(t[lo])
    end_txt = "end" if end_s is None else f"{end:g}"
    return _derive(trace, sel=sel, arrival_s=t[sel] - first,
                   note=f"window [{start:g}, {end_txt}) s: kept {hi - lo} of {len(trace)} requests, "
                        f"times rebased to the first of them (at {first:.6g} s)")


MAX_LOOP_ROWS = 30_000_000
"""The most requests a looped trace may hold: each takes some 40 bytes in its columns (1.2 GB at
the limit), ten times the 3,000,000 one simulation takes."""


def loop(trace: Trace, times: int | None = None, *, until_s: float | None = None,
         period_s: float | None = None) -> Trace:
    """Repeat the trace back to back: ``times`` copies in all, or as many as fit before ``until_s``.

    Copy ``i`` is shifted by ``i * period_s``; the default period is the span plus one mean gap
    (``n / mean_rate``), so the looped trace keeps the mean rate. Prefix ``hash_ids`` repeat
    with their requests.
    """
    if (times is None) == (until_s is None):
        raise InputError("loop", "give exactly one of times and until_s")
    n = len(trace)
    if period_s is None:
        if n < 2 or trace.span_s <= 0:
            raise InputError("loop", "the trace has no time span, so the loop period is undefined",
                             "give period_s")
        period = trace.span_s * n / (n - 1)
    else:
        period = positive("period_s", period_s)
        if period <= trace.span_s:
            raise InputError("period_s", f"must exceed the trace's span {trace.span_s:.6g} s "
                             "(copies would overlap)")
    if times is not None:
        copies = positive_int("loop", times)
    else:
        until = positive("until_s", until_s)
        copies = max(1, math.ceil(until / period))
    if copies * n > MAX_LOOP_ROWS:
        raise InputError("loop", f"{copies:,} copies of {n:,} requests make {copies * n:.3g} requests, more than "
                         f"the {MAX_LOOP_ROWS:,} a looped trace holds in memory",
                         f"give --loop {max(1, MAX_LOOP_ROWS // n):,} or fewer")
    _check_span(np.array([0.0, (copies - 1) * period + trace.span_s]), "loop", "the looped trace")
    shift = np.repeat(np.arange(copies, dtype=np.float64) * period, n)
    t = np.tile(trace.arrival_s, copies) + shift
    keep = slice(None) if until_s is None else slice(0, int(np.searchsorted(t, float(until_s), "left")))
    t = t[keep]
    if t.size == 0:
        raise InputError("until_s", f"{until_s:g} s is before the first request")
    m = t.size
    cls = None if trace.class_name is None else np.tile(trace.class_name, copies)[:m]
    hashes = None if trace.hash_ids is None else (list(trace.hash_ids) * copies)[:m]
    how = f"{copies} times" if until_s is None else f"until {float(until_s):g} s ({m} requests)"
    return dataclasses.replace(
        trace, arrival_s=t, prompt_tokens=np.tile(trace.prompt_tokens, copies)[:m],
        output_tokens=np.tile(trace.output_tokens, copies)[:m], class_name=cls, hash_ids=hashes,
        repairs=[*trace.repairs, f"looped {how} with period {period:.6g} s"])


def trace_to_requests(trace: Trace):
    """The trace as :class:`~llmqueue.workload.generate.RequestArrays` (ids 0..n-1), to drive
    the simulator."""
    from llmqueue.workload.generate import RequestArrays

    return RequestArrays(np.arange(len(trace), dtype=np.int64), trace.arrival_s, trace.prompt_tokens,
                         trace.output_tokens,
                         "default" if trace.class_name is None else trace.class_name)


def trace_from_requests(reqs, source: str = "") -> Trace:
    """A :class:`Trace` of a generated :class:`~llmqueue.workload.generate.RequestArrays`
    (times rebased to the first request)."""
    t = np.asarray(reqs.arrival_s, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order]
    cls = None
    if len(reqs.classes) > 1:
        cls = reqs.class_name[order]
    return Trace(t - t[0] if t.size else t, np.asarray(reqs.prompt_tokens, np.int64)[order],
                 np.asarray(reqs.output_tokens, np.int64)[order], class_name=cls, source=source)


# --- reading -------------------------------------------------------------------------------------

def _check_file(path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError("file", f"{str(path)!r} does not exist or is not a file")
    if p.stat().st_size == 0:
        raise InputError("file", f"{str(path)!r} is empty (0 bytes)", "give a trace with requests")
    return p


def _check_format(fmt: str) -> str:
    f = str(fmt).lower()
    f = {"llmqueue": "canonical", "ndjson": "jsonl", "splitwise": "azure", "tsv": "csv"}.get(f, f)
    if f not in FORMATS:
        raise InputError("format", f"unknown trace format {fmt!r}", f"one of {', '.join(FORMATS)}")
    return f


def _check_unit(unit: str, field: str) -> str:
    u = str(unit).strip().lower()
    u = {"sec": "s", "seconds": "s", "msec": "ms", "milliseconds": "ms", "usec": "us",
         "microseconds": "us", "nsec": "ns", "nanoseconds": "ns"}.get(u, u)
    if u not in TIME_UNITS:
        raise InputError(field, f"unknown time unit {unit!r}", "one of s, ms, us, ns")
    return u


def _first_line(p: Path) -> str:
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8-sig", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    return line.rstrip("\r\n")
    except OSError as e:
        raise InputError("file", f"cannot read {str(p)!r}: {_one_line(e)}") from None
    raise InputError("file", f"{str(p)!r} is empty (only blank lines)", "give a trace with requests")


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:300]


def _read_table(p: Path, fmt: str):
    """The file as a pyarrow Table, and the kind of row it holds ("data row", "record", "row")."""
    import pyarrow as pa

    if fmt in ("parquet", "canonical"):
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p), "row"
        except Exception as e:  # noqa: BLE001
            raise InputError("file", f"{str(p)!r} is not a readable Parquet file: {_one_line(e)}") from None
    if fmt in ("mooncake", "jsonl"):
        return _read_jsonl(p), "record"
    if fmt == "json":
        data = _load_json(p)
        try:
            if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
                return pa.table({k: _to_arrow(v) for k, v in data.items()}), "row"
            if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
                return _records_table(data), "row"
        except (pa.ArrowInvalid, ValueError) as e:
            raise InputError("file", f"{str(p)!r}: {_one_line(e)}") from None
        raise InputError("file", f"{str(p)!r} holds no table (expected a list of objects or an object "
                         "of equal-length lists)")
    return _read_csv(p), "data row"


def _read_csv(p: Path):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    head = _first_line(p)
    sep = "\t" if p.name.lower().removesuffix(".gz").endswith(".tsv") or ("\t" in head and "," not in head) else ","
    parse = pcsv.ParseOptions(delimiter=sep)
    try:
        return pcsv.read_csv(p, parse_options=parse)
    except pa.ArrowInvalid as e:
        msg = _one_line(e)
        if "Empty CSV file" in msg:
            raise InputError("file", f"{str(p)!r} is empty", "give a trace with requests") from None
        if "CSV conversion error" not in msg and "In CSV column" not in msg:
            raise InputError("file", f"{str(p)!r} is not a readable CSV file: {msg}") from None
    # A value that did not fit its column's inferred type: read every column as text and
    # convert each with the tolerant converters, which name the bad row.
    names = [c.strip().strip('"') for c in head.split(sep)]
    try:
        return pcsv.read_csv(p, parse_options=parse, convert_options=pcsv.ConvertOptions(
            column_types={n: pa.string() for n in names}))
    except pa.ArrowInvalid as e:
        raise InputError("file", f"{str(p)!r} is not a readable CSV file: {_one_line(e)}") from None


def _read_jsonl(p: Path):
    import pyarrow as pa
    import pyarrow.json as pj

    try:
        return pj.read_json(p)
    except pa.ArrowInvalid:
        pass  # mixed types in a column, or a bad line: parse in Python to say where
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    rows = []
    with opener(p, "rt", encoding="utf-8-sig") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError("file", f"{str(p)!r} line {i} is not valid JSON: {e.msg}") from None
            if not isinstance(r, dict):
                raise InputError("file", f"{str(p)!r} line {i} is not a JSON object")
            rows.append(r)
    if not rows:
        raise InputError("file", f"{str(p)!r} holds no records", "give a trace with requests")
    return _records_table(rows)


def _records_table(rows: list[dict]):
    import pyarrow as pa

    names = list(dict.fromkeys(k for r in rows[:1000] for k in r))
    for r in rows:
        for k in r:
            if k not in names:
                names.append(k)
    return pa.table({k: _to_arrow([r.get(k) for r in rows]) for k in names})


def _to_arrow(values: list):
    """Python values as an arrow array; mixed types become text (converted and checked later)."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        if any(isinstance(v, list) for v in values):
            try:
                return pa.array([v if isinstance(v, list) else None for v in values])
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                pass  # lists of mixed types: kept as text, refused where a list column is needed
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())


def _load_json(p: Path):
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8-sig") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("file", f"cannot read {str(p)!r}: {_one_line(e)}") from None
    if not text.strip():
        raise InputError("file", f"{str(p)!r} is empty", "give a trace with requests")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1 and all(ln.lstrip().startswith("{") for ln in lines[:2]):
            raise InputError("file", f"{str(p)!r} holds {len(lines)} JSON results, one per line "
                             "(vllm bench serve --append-result)",
                             "split it and load one result per file") from None
        raise InputError("file", f"{str(p)!r} is not valid JSON: {e.msg} (line {e.lineno})") from None


def _metadata(p: Path) -> dict:
    import pyarrow.parquet as pq

    meta = pq.read_schema(p).metadata or {}
    out = {}
    if b"llmqueue.source" in meta:
        out["source"] = meta[b"llmqueue.source"].decode()
    if b"llmqueue.repairs" in meta:
        try:
            out["repairs"] = [str(x) for x in json.loads(meta[b"llmqueue.repairs"].decode())]
        except (ValueError, TypeError):
            out["repairs"] = []
    if b"llmqueue.version" in meta and meta[b"llmqueue.version"].decode() != CANONICAL_VERSION:
        raise InputError("file", f"{str(p)!r} is canonical trace version "
                         f"{meta[b'llmqueue.version'].decode()}, this llmqueue reads version "
                         f"{CANONICAL_VERSION}", "convert the original trace again")
    return out


# --- columns -------------------------------------------------------------------------------------

def _resolve(names: list[str], role: str, maps: dict, layout: _Layout | None, path: Path,
             known: tuple[str, ...] | None, required: bool = True) -> str | None:
    found = ", ".join(names)
    if role in maps:
        col = maps[role]
        if col in names:
            return col
        raise InputError("map", f"{role}={col!r}: {str(path)!r} has no column {col!r} "
                         f"(columns found: {found})", f"name one of the columns found: {role}=COLUMN")
    if layout is not None:
        col = {"time": layout.time, "prompt": layout.prompt, "output": layout.output,
               "class": layout.klass, "hash_ids": layout.hash_ids}[role]
        if col is None or col in names:
            return col
        if not required:
            return None
        raise InputError("column", f"{str(path)!r} has no {role} column {col!r} (columns found: {found})",
                         f"fix the file, or name the {role} column with the mapping {role}=COLUMN (--map)")
    if known is None:
        return None
    hits = [c for c in known if c in names]
    if not hits:
        lower = {c.lower(): c for c in names}
        hits = list(dict.fromkeys(lower[k.lower()] for k in known if k.lower() in lower))
    if len(hits) == 1:
        return hits[0]
    if not required and not hits:
        return None
    if hits:
        raise InputError("map", f"{str(path)!r} has several possible {role} columns ({', '.join(hits)})",
                         f"name one with the mapping {role}=COLUMN (--map)")
    raise InputError("map", f"{str(path)!r} has no {role} column (looked for {', '.join(known[:6])}, ...; "
                     f"columns found: {found})", f"name it with the mapping {role}=COLUMN (--map {role}=COLUMN)")


def _unit_from_name(col: str) -> str | None:
    low = col.lower()
    for u in ("ms", "us", "ns", "s"):
        if low.endswith("_" + u) or low.endswith("(" + u + ")") or low.endswith("[" + u + "]"):
            return u
    return None


def _numeric(col, name: str):
    """An arrow column as float64 with NaN where missing or not a number (and the raw cells)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = col.type
    if pa.types.is_integer(t) and col.null_count == 0:
        return col.to_numpy(), col
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64), col
    if pa.types.is_boolean(t):
        raise InputError(name, "holds true/false values, not numbers")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        try:
            return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64), col
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            cells = col.to_pylist()
            return np.array([_to_float(c) for c in cells], dtype=np.float64), col
    raise InputError(name, f"has type {t}, not numbers")


def _to_float(c) -> float:
    if c is None:
        return math.nan
    try:
        return float(c)
    except (TypeError, ValueError):
        return math.nan


def _time_seconds(col, name: str, unit: str | None):
    """(seconds from the earliest valid time, NaN where missing; kind) of a time column.

    Wall-clock timestamps (arrow timestamps, or text that parses as ISO 8601) are exact to the
    nanosecond: differences are taken in int64 ns before converting to float. Numbers are taken
    in ``unit`` (seconds when ``None``); integer columns are rebased in int64 before dividing.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        ns = pc.cast(pc.cast(col, pa.timestamp("ns")), pa.int64())
        return _rebase_int(ns, 1_000_000_000), "timestamp"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        try:
            pc.cast(col, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            cells = [c for c in col.to_pylist() if c is not None]
            numbers = sum(1 for c in cells if not math.isnan(_to_float(c)))
            if numbers * 2 < len(cells):  # mostly text: wall-clock timestamps
                ns = _parse_datetimes(col, name)
                if ns is not None:
                    return _rebase_int(ns, 1_000_000_000), "timestamp"
    per = TIME_UNITS[unit or "s"]
    if pa.types.is_integer(t):
        return _rebase_int(pc.cast(col, pa.int64()), per), "number"
    x, _ = _numeric(col, name)
    if np.isnan(x).all():
        return x, "number"
    x = x - np.nanmin(x)
    return (x / per if per != 1 else x), "number"


def _rebase_int(arr, per: int) -> np.ndarray:
    """int64 arrow array (nulls allowed) -> float64 (v - min) / per, NaN at nulls."""
    import pyarrow.compute as pc

    if arr.null_count == len(arr):
        return np.full(len(arr), np.nan)
    v0 = pc.min(arr).as_py()
    valid = None
    if arr.null_count:
        valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
        arr = pc.fill_null(arr, v0)
    v = arr.to_numpy() - np.int64(v0)
    out = v / per if per != 1 else v.astype(np.float64)
    if valid is not None:
        out[~valid] = np.nan
    return out


def _parse_datetimes(col, name: str):
    """Text timestamps as int64 ns (arrow array), or None when they are not timestamps."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        return pc.cast(pc.cast(col, pa.timestamp("ns")), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    cells = col.to_pylist()
    try:
        vals = np.array(cells, dtype="datetime64[ns]")
    except ValueError:
        # Some cells are neither numbers nor timestamps: NaT for those (rows reported later),
        # unless none of the cells is a timestamp.
        out, good = [], 0
        for c in cells:
            try:
                out.append(np.datetime64(c, "ns"))
                good += 1
            except (ValueError, TypeError):
                out.append(np.datetime64("NaT"))
        if good == 0:
            return None
        vals = np.array(out, dtype="datetime64[ns]")
    ints = vals.astype(np.int64)
    return pa.array(ints, mask=np.isnat(vals))


def _cell(col, i: int) -> str:
    v = col[i].as_py() if hasattr(col[i], "as_py") else col[i]
    return "an empty cell" if v is None else repr(v)


# --- from a table to a Trace ---------------------------------------------------------------------

def _from_table(table, p: Path, kind: str, layout: _Layout | None, maps: dict, *, drop_bad: bool,
                spread_ties: bool, explicit_unit: bool) -> Trace:
    from llmqueue.workload.tables import KNOWN

    names = list(table.column_names)
    if table.num_rows == 0:
        raise InputError("file", f"{str(p)!r} has no requests (a header but no data rows; "
                         f"columns found: {', '.join(names)})", "give a trace with requests")
    tcol = _resolve(names, "time", maps, layout, p, KNOWN_TIME)
    pcol = _resolve(names, "prompt", maps, layout, p, KNOWN["prompt"])
    ocol = _resolve(names, "output", maps, layout, p, KNOWN["output"])
    if len({tcol, pcol, ocol}) < 3:
        raise InputError("map", f"time, prompt and output must be three different columns (got "
                         f"{tcol!r}, {pcol!r}, {ocol!r})")
    ccol = _resolve(names, "class", maps, layout, p, KNOWN_CLASS, required=False)
    hcol = _resolve(names, "hash_ids", maps, layout, p, ("hash_ids",), required=False)
    unit = maps.get("time_unit")
    explicit = unit is not None or explicit_unit
    if unit is None:
        unit = _unit_from_name(tcol)
        explicit = explicit or unit is not None
        if unit is None and layout is not None:
            unit = layout.unit
    t, tkind = _time_seconds(table.column(tcol), tcol, unit)
    prompt, praw = _numeric(table.column(pcol), pcol)
    output, oraw = _numeric(table.column(ocol), ocol)
    cls = None
    if ccol is not None:
        import pyarrow as pa
        import pyarrow.compute as pc

        c = table.column(ccol)
        c = pc.fill_null(pc.cast(c, pa.string()), "default") if c.null_count else pc.cast(c, pa.string())
        cls = np.asarray(c.to_numpy(zero_copy_only=False), dtype=str)
    hashes = None
    if hcol is not None:
        hashes = _flat_lists(table.column(hcol), hcol, p)
    cols = {"time": (tcol, t, table.column(tcol)), "prompt": (pcol, prompt, praw),
            "output": (ocol, output, oraw)}
    unit_check = None if tkind == "timestamp" else (tcol, unit or "s", explicit)
    return _finish(cols, cls, hashes, source=str(p), repairs=[], kind=kind, drop_bad=drop_bad,
                   spread_ties=spread_ties, unit_check=unit_check)


def _flat_lists(col, name: str, p: Path):
    """A list<int> column as (offsets int64 [n+1], values int64); null lists are empty."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise InputError(name, f"of {str(p)!r} should hold lists of block hashes, has type {col.type}",
                         "give each request a list of integers, e.g. [12, 13, 14], or drop the column")
    if col.null_count:
        col = pa.array([v if v is not None else [] for v in col.to_pylist()], type=col.type)
    lens = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(col)
    if len(flat) and not pa.types.is_integer(flat.type):
        try:
            flat = pc.cast(flat, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InputError(name, f"of {str(p)!r} holds non-integer block hashes") from None
    values = flat.to_numpy(zero_copy_only=False).astype(np.int64) if len(flat) else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return offsets, values


def _take_lists(lists, idx: np.ndarray):
    """Rows ``idx`` of flat lists (offsets, values)."""
    offsets, values = lists
    lens = np.diff(offsets)[idx]
    new_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    starts = offsets[:-1][idx]
    gather = np.repeat(starts - new_off[:-1], lens) + np.arange(new_off[-1], dtype=np.int64)
    return new_off, values[gather]


_PROBLEMS = ("missing, non-numeric or infinite timestamps", "missing or non-numeric lengths", "negative lengths",
             "non-integer lengths")


def _finish(cols: dict, cls, hashes, *, source: str, repairs: list, kind: str, drop_bad: bool,
            spread_ties: bool, unit_check) -> Trace:
    """Check, repair (reporting each repair) and assemble a Trace from raw columns.

    ``cols``: role -> (column name, float64 or int64 values (NaN = missing), raw cells).
    """
    tname, t, traw = cols["time"]
    n = t.size
    if n == 0:
        raise InputError("file", f"{source!r} has no requests", "give a trace with requests")
    # Bad rows: (problem index, mask, column, raw) in the order of _PROBLEMS.
    checks = [(0, ~np.isfinite(t), tname, traw)]
    for role in ("prompt", "output"):
        name, v, raw = cols[role]
        if v.dtype.kind == "f":
            nan = np.isnan(v)
            checks += [(1, nan, name, raw), (2, v < 0, name, raw),
                       (3, ~nan & (v != np.floor(v)), name, raw)]
        else:
            checks.append((2, v < 0, name, raw))
    bad_any = np.zeros(n, dtype=bool)
    for _, m, _, _ in checks:
        bad_any |= m
    if bad_any.any():
        if not drop_bad:
            first = int(np.argmax(bad_any))
            for prob, m, name, raw in checks:
                if m[first]:
                    break
            count = int(bad_any.sum())
            what = _PROBLEMS[prob].replace("lengths", "length").replace("timestamps", "timestamp")
            raise InputError(name, f"{kind} {first + 1} of {source!r} has a {what}: {_cell(raw, first)}"
                             + (f" ({count} bad rows in all)" if count > 1 else ""),
                             "fix the file, or drop such rows with drop_bad=True (--drop-bad)")
        counted = np.zeros(n, dtype=bool)
        for prob in range(len(_PROBLEMS)):
            m = np.zeros(n, dtype=bool)
            where = None
            for pr, mm, name, raw in checks:
                if pr == prob:
                    new = mm & ~counted & ~m
                    if new.any() and where is None:
                        i = int(np.argmax(new))
                        where = f"first: {kind} {i + 1}, {name} = {_cell(raw, i)}"
                    m |= new
            if m.any():
                counted |= m
                repairs.append(f"dropped {int(m.sum())} rows with {_PROBLEMS[prob]} ({where})")
        keep = ~bad_any
        if not keep.any():
            raise InputError("file", f"{source!r}: every row is bad, none is left")
        idx = np.flatnonzero(keep)
        t = t[idx]
        cols = {r: (nm, v[idx], raw) for r, (nm, v, raw) in cols.items()}
        cls = None if cls is None else cls[idx]
        hashes = None if hashes is None else _take_lists(hashes, idx)
    prompt = cols["prompt"][1].astype(np.int64, copy=False)
    output = cols["output"][1].astype(np.int64, copy=False)
    n = t.size
    # Order: a stable sort by time, reported.
    if n > 1 and np.any(t[1:] < t[:-1]):
        late = int(np.count_nonzero(t[1:] < np.maximum.accumulate(t)[:-1]))
        order = np.argsort(t, kind="stable")
        t, prompt, output = t[order], prompt[order], output[order]
        cls = None if cls is None else cls[order]
        hashes = None if hashes is None else _take_lists(hashes, order)
        repairs.append(f"sorted {late} out-of-order rows (each earlier than a row above it; "
                       "stable sort by time)")
    if t[0] != 0:
        t = t - t[0]
    if unit_check is not None:
        _check_time_unit(t, *unit_check, repairs)
    _check_span(t, tname)
    # Ties: kept and counted; optionally spread over their tick.
    if n > 1:
        gaps = np.diff(t)
        ties = int(np.count_nonzero(gaps == 0))
        if ties:
            frac = ties / gaps.size
            nz = gaps[gaps > 0]
            tick = float(np.median(nz)) if nz.size else 0.0
            note = f"{ties} rows share the timestamp of the row before ({frac:.1%} of gaps are 0)"
            if frac >= 0.5 and tick > 0:
                note += (f"; times look quantized to ticks of ~{tick:.4g} s, so the inter-arrival "
                         "CV and dispersion at shorter bins are artefacts")
            if spread_ties and tick > 0:
                t = _spread(t, tick)
                note += (f"; spread each group of ties evenly over its tick (width min({tick:.4g} s, "
                         "gap to the next distinct time)), keeping their order")
            elif spread_ties:
                note += "; cannot spread them: every request has the same time"
            else:
                note += "; kept as ties (spread_ties=True / --spread-ties spreads them)"
            repairs.append(note)
        elif spread_ties:
            repairs.append("no tied timestamps to spread")
    if not np.any(prompt + output > 0):
        raise InputError("file", f"every request of {source!r} has 0 prompt and 0 output tokens "
                         "(nothing to serve)", "check the length columns (--map prompt=COL,output=COL)")
    for role, v in (("prompt", prompt), ("output", output)):
        zeros = int(np.count_nonzero(v == 0))
        if zeros:
            repairs.append(f"note: {zeros} rows have {role} length 0 (kept)")
    hash_list = None
    if hashes is not None:
        off, vals = hashes
        hash_list = np.split(vals, off[1:-1]) if n > 1 else [vals]
    return Trace(t, prompt, output, class_name=cls, hash_ids=hash_list, source=source, repairs=repairs)


def _spread(t: np.ndarray, tick: float) -> np.ndarray:
    """Requests sharing a time T spread evenly over [T, T + w): the j-th of k at T + w j / k,
    with w = min(tick, next distinct time - T)."""
    uniq, start, counts = np.unique(t, return_index=True, return_counts=True)
    width = np.full(uniq.size, tick)
    if uniq.size > 1:
        width[:-1] = np.minimum(tick, np.diff(uniq))
    grp = np.repeat(np.arange(uniq.size), counts)
    j = np.arange(t.size) - start[grp]
    return uniq[grp] + width[grp] * j / counts[grp]


def _fmt_span(s: float) -> str:
    if s >= 2 * 86400:
        return f"{s / 86400:,.4g} days"
    if s >= 2 * 3600:
        return f"{s / 3600:,.4g} h"
    return f"{s:,.6g} s"


def _plausible(span: float, n: int) -> bool:
    if span > _YEAR_S:
        return False
    if n >= _RATE_MIN_N and span > 0:
        rate = (n - 1) / span
        return _MIN_RATE <= rate <= _MAX_RATE
    return True


def _check_time_unit(t: np.ndarray, col: str, unit: str, explicit: bool, repairs: list) -> None:
    """Raise (unit assumed) or warn (unit given) when the span or rate is implausible for a
    serving trace: a span over a year, or (with 50+ requests) a mean rate below 0.01 or above
    1e5 req/s. Names the unit that gives a plausible span and rate."""
    n, span = t.size, float(t[-1] - t[0]) if t.size else 0.0
    if _plausible(span, n):
        return
    per = TIME_UNITS[unit]
    better = None
    for u, per_u in TIME_UNITS.items():
        if u != unit and _plausible(span * per / per_u, n):
            better = u
            break
    rate = (n - 1) / span if span > 0 else math.inf
    what = (f"time column {col!r} read as {_UNIT_NAMES[unit]} spans {_fmt_span(span)} at {rate:.3g} req/s")
    if better is not None:
        span_b = span * per / TIME_UNITS[better]
        what += (f"; that looks like {_UNIT_NAMES[better]} ({_fmt_span(span_b)} at "
                 f"{(n - 1) / span_b:.3g} req/s)")
        fix = f"set time_unit={better} (--time-unit {better} or --map ...,time_unit={better})"
    else:
        what += ", which is implausible for a serving trace in any unit"
        fix = "check the time column and its unit"
    if explicit:
        repairs.append(f"warning: {what}; {fix} if so")
        return
    raise InputError("time_unit", what, fix + f", or time_unit={unit} if {_UNIT_NAMES[unit]} are right")


# --- vLLM bench serve results --------------------------------------------------------------------

def _load_vllm(p: Path, *, request_rate, drop_bad: bool, spread_ties: bool) -> Trace:
    data = _load_json(p)
    if not isinstance(data, dict):
        raise InputError("file", f"{str(p)!r} is not a vLLM bench serve result (expected one JSON object)")
    missing = [k for k in ("input_lens", "output_lens") if not isinstance(data.get(k), list)]
    if missing:
        raise InputError("file", f"{str(p)!r} has no per-request {' or '.join(missing)} (keys found: "
                         f"{', '.join(list(data)[:20])})",
                         "rerun vllm bench serve with --save-result --save-detailed")
    inl, outl = data["input_lens"], data["output_lens"]
    n = len(inl)
    if n == 0:
        raise InputError("file", f"{str(p)!r} records no requests", "give a result with requests")
    if len(outl) != n:
        raise InputError("file", f"{str(p)!r}: {n} input_lens but {len(outl)} output_lens")
    repairs: list[str] = []
    starts = data.get("start_times")
    if isinstance(starts, list) and len(starts) > 0:
        if len(starts) != n:
            raise InputError("file", f"{str(p)!r}: {n} input_lens but {len(starts)} start_times")
        t = np.array([_to_float(x) for x in starts], dtype=np.float64)
        if not np.isnan(t).all():
            t = t - np.nanmin(t)
        traw = starts
    else:
        rate = request_rate if request_rate is not None else data.get("request_rate")
        try:
            rate_f = float(rate) if rate is not None else math.nan
        except (TypeError, ValueError):
            rate_f = math.nan
        if not (math.isfinite(rate_f) and rate_f > 0):
            got = "absent" if rate is None else f"{rate!r}"
            raise InputError("request_rate", f"{str(p)!r} has no start_times (a vLLM version before "
                             f"they were saved) and its request_rate is {got}, so its arrival times "
                             "cannot be reconstructed",
                             "give the rate the benchmark used: request_rate=R (--request-rate R)")
        t = np.arange(n, dtype=np.float64) / rate_f
        traw = t.tolist()
        burst = data.get("burstiness")
        repairs.append(f"arrival times reconstructed: the file has no start_times, so requests are "
                       f"spaced evenly at request_rate {rate_f:g} req/s; the benchmark drew random "
                       f"gaps (Poisson{'' if burst in (None, 1, 1.0) else f'/gamma, burstiness {burst}'}),"
                       " so this is not the measured arrival process")
    errors = data.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        failed = sum(1 for e in errors if e)
        if failed:
            repairs.append(f"note: {failed} requests failed in the benchmark (non-empty errors); "
                           "kept, with the output length the file records for them")
    cols = {"time": ("start_times", t, traw),
            "prompt": ("input_lens", np.array([_to_float(x) for x in inl]), inl),
            "output": ("output_lens", np.array([_to_float(x) for x in outl]), outl)}
    return _finish(cols, None, None, source=str(p), repairs=repairs, kind="request",
                   drop_bad=drop_bad, spread_ties=spread_ties, unit_check=None)


# --- helpers for transforms ----------------------------------------------------------------------

def _check_span(t: np.ndarray, field: str, what: str = "the trace") -> None:
    """Refuse arrival times spanning more than :data:`MAX_SPAN_S` (checked on load and after
    every replay transform)."""
    span = float(t[-1] - t[0]) if t.size else 0.0
    if span > MAX_SPAN_S:
        raise InputError(field, f"{what} spans {span:.4g} s ({span / _YEAR_S:.3g} years) from the first "
                         f"arrival to the last, over the limit of {MAX_SPAN_S / _YEAR_S:g} years (no serving "
                         "trace is that long: a wrong time unit or corrupt times)",
                         "check the time column and its unit (--time-unit), or the scale factor")


def _check_trace(trace: Trace) -> None:
    n = len(trace)
    cols = (trace.arrival_s, trace.prompt_tokens, trace.output_tokens)
    if any(np.ndim(c) != 1 or np.size(c) != n for c in cols):
        raise InputError("trace", "arrival_s, prompt_tokens and output_tokens must be 1-d and the same length")
    if n and (not np.all(np.isfinite(trace.arrival_s)) or np.any(np.diff(trace.arrival_s) < 0)):
        raise InputError("trace", "arrival_s must be finite and sorted")
    _check_span(np.asarray(trace.arrival_s, dtype=np.float64), "trace")
    for name, c in (("prompt_tokens", trace.prompt_tokens), ("output_tokens", trace.output_tokens)):
        if n and np.min(c) < 0:
            raise InputError("trace", f"{name} must be >= 0")
    if trace.class_name is not None and np.size(trace.class_name) != n:
        raise InputError("trace", "class_name needs one entry per request")
    if trace.hash_ids is not None and len(trace.hash_ids) != n:
        raise InputError("trace", "hash_ids needs one list per request")


def _derive(trace: Trace, *, note: str, arrival_s: np.ndarray, sel=slice(None), field: str = "trace") -> Trace:
    _check_span(np.asarray(arrival_s, dtype=np.float64), field, "the transformed trace")
    return dataclasses.replace(
        trace, arrival_s=np.asarray(arrival_s, dtype=np.float64),
        prompt_tokens=trace.prompt_tokens[sel].copy(), output_tokens=trace.output_tokens[sel].copy(),
        class_name=None if trace.class_name is None else trace.class_name[sel].copy(),
        hash_ids=None if trace.hash_ids is None else list(trace.hash_ids[sel]),
        repairs=[*trace.repairs, note])
