"""``llmqueue import``: measurements taken by another client, as a run directory.

A run directory (``requests.parquet`` in the record schema, ``workload.parquet`` with the
request ids, ``tokens.parquet`` when the file has per-chunk times, ``summary.json``,
``server.json`` with the engine settings given) is what ``validate``, ``calibrate`` and
``report`` read; :func:`import_run` writes one from

- ``vllm-bench``: ``vllm bench serve --save-result --save-detailed``'s JSON object, per request
  ``input_lens``, ``output_lens``, ``ttfts`` and ``latencies`` (seconds from the send), ``itls``
  (gaps between streamed chunks), ``start_times`` (the sends; without them the sends are spaced
  evenly at ``request_rate``, said in a note), ``errors`` ("" for a success) and, if present,
  ``queue_times`` (the wait for a concurrency slot: the intended send is ``start - queue``);
- ``guidellm``: guidellm's benchmark report (``benchmarks.json``/``.yaml``, v0.2 to v0.7), one
  benchmark of it (:mod:`llmqueue.bench.guidellm_report`);
- ``aiperf``: NVIDIA AIPerf's per-request ``profile_export.jsonl`` (:mod:`llmqueue.bench.aiperf_export`);
- ``jsonl`` / ``csv``: one request per line/row. Columns named like the record schema's fields
  are taken as they are; ``--map FIELD=COLUMN,...`` names the others. Fields
  (:data:`FIELDS`): ``request_id``, ``class``, ``arrival_s`` (intended send; default the
  send), ``send_s`` (the actual send, ``dispatched_s``), ``first_token_s`` or ``ttft_s``
  (relative to the send), ``finish_s`` or ``e2el_s`` (relative to the send), ``prompt_tokens``,
  ``output_tokens``, ``cached_prompt_tokens``, ``status`` (one of the record schema's
  :data:`~llmqueue.records.schema.STATUSES`), ``error`` (a non-empty text marks a failed
  request when there is no status), ``attempt``, ``chunk_times`` (a list of absolute chunk
  times) or ``itl_s`` (a list of gaps between chunks). A list in a CSV cell is JSON
  (``[0.1, 0.2]``) or ``;``-separated.

Absolute times are in seconds (``time_unit`` scales them) and ``time_origin`` is subtracted
(default: the earliest send, so the run starts at 0). ``time_zero`` is the epoch second a file's
times count from when they count from the run's start (the run's 0 is then the file's 0): it places
them on the server log's clock and the /metrics samples' timestamps. A missing column is one line
naming it. Files are shipped as they are: gzip-compressed or not (read by their magic bytes);
``status_map`` maps a client's own status words onto the schema's (a word neither knows is one
line naming it, its row and ``--status-map``); a null token count is allowed on a request that
did not finish (refused on an ok one); ``metrics`` brings the server's /metrics samples in as
bench's sampler records them (:mod:`llmqueue.bench.import_metrics`); the statistics leave out the
first ``warmup_s`` seconds (:data:`~llmqueue.bench.options.RUN_WARMUP_S` by default, as the
project's measured bench runs), as a bench run's window (:mod:`llmqueue.bench.run_window`).
Every number of every format passes :mod:`llmqueue.bench.import_fields` (finite, in range, whole
counts: else one line naming the row and the field); a request whose times cannot have happened
(TTFT longer than its latency, a finish before its send) is dropped, counted in the notes and in
the summary's ``imported.dropped``.

Each format is a reader registered in :data:`IMPORTERS` (``@importer(NAME, help, options=...)``):
``llmqueue import``'s FORMAT choices and help read it, so a new format is its reader (here, or a
module of its own that the registered function calls).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from llmqueue._files import staged
from llmqueue.bench.import_fields import check_origin, impossible, numbers
from llmqueue.bench.options import RUN_WARMUP_S
from llmqueue.errors import InputError
from llmqueue.records.columns import request_record_columns


@dataclass(frozen=True)
class Importer:
    """A format ``llmqueue import`` reads: ``read(path, **options)`` -> (the raw per-request fields,
    notes) that :func:`build_run` takes; ``help`` (what ``--help`` says of it); ``options``: the
    format's own options, among :data:`OPTIONS` (another format refuses them)."""

    name: str
    help: str
    read: Callable
    options: tuple = ()


#: Every format by name (``llmqueue import FORMAT``)
IMPORTERS: dict[str, Importer] = {}

#: The options only some formats take: keyword -> the command line's field
OPTIONS = {"mapping": "map", "time_unit": "time_unit", "request_rate": "request_rate", "benchmark": "benchmark"}


def importer(name: str, help: str, *, options: tuple = ()):
    """Registers the decorated ``read(path, **options)`` as format ``name`` in :data:`IMPORTERS`."""
    def register(read: Callable) -> Callable:
        IMPORTERS[name] = Importer(name, help, read, options)
        return read
    return register

#: field -> what it holds (the ``--map`` names)
FIELDS = {
    "request_id": "request id (integer)",
    "class": "request class",
    "arrival_s": "intended send time (absolute)",
    "send_s": "actual send time (absolute)",
    "dispatched_s": "actual send time (absolute)",
    "first_token_s": "first token time (absolute)",
    "ttft_s": "first token, seconds after the send",
    "finish_s": "last token time (absolute)",
    "e2el_s": "last token, seconds after the send",
    "prompt_tokens": "prompt tokens",
    "output_tokens": "output tokens",
    "cached_prompt_tokens": "prompt tokens served from the prefix cache",
    "status": "ok, rejected, timeout, cancelled, error or unfinished",
    "error": "error text (non-empty: failed)",
    "attempt": "attempt number (1 first)",
    "chunk_times": "list of absolute chunk times",
    "itl_s": "list of gaps between chunks (s)",
}
_ABS = ("arrival_s", "send_s", "first_token_s", "finish_s")
_REL = ("ttft_s", "e2el_s")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _pairs(text: str | None, flag: str, form: str, example: str):
    """The ``A=B`` items of a comma-separated option value (stripped, empty items skipped); an
    item that is not one is one line naming ``flag``."""
    for part in ("" if text is None else str(text)).split(","):
        if not part.strip():
            continue
        a, sep, b = part.partition("=")
        a, b = a.strip(), b.strip()
        if not sep or not a or not b:
            raise InputError(flag, f"{part.strip()!r} is not {form}", f"e.g. {example}")
        yield a, b


def parse_map(text: str | None) -> dict:
    """``"send_s=t0,first_token_s=ttft_abs"`` -> ``{"send_s": "t0", ...}`` (checked)."""
    out: dict = {}
    for field, col in _pairs(text, "map", "FIELD=COLUMN", "--map send_s=t0,ttft_s=ttft,prompt_tokens=n_in"):
        if field == "dispatched_s":
            field = "send_s"
        if field not in FIELDS:
            raise InputError("map", f"unknown field {field!r}", f"fields: {', '.join(FIELDS)}")
        if field in out:
            raise InputError("map", f"{field} mapped twice")
        out[field] = col
    return out


def parse_status_map(text: str | None) -> dict:
    """``--status-map "aborted_drain_cap=cancelled,fail=error"`` -> ``{"aborted_drain_cap":
    "cancelled", ...}``: a client's own status words onto the record schema's
    :data:`~llmqueue.records.schema.STATUSES` (compared as :func:`build_run` reads statuses:
    stripped, lower case); checked."""
    from llmqueue.records.schema import STATUSES

    out: dict = {}
    for word, status in _pairs(text, "status_map", "FROM=TO", "--status-map aborted_drain_cap=cancelled,failed=error"):
        word, status = word.lower(), status.lower()
        if status not in STATUSES:
            raise InputError("status_map", f"{word}={status}: {status!r} is not a status",
                             f"map onto one of {', '.join(STATUSES)}")
        if word in out:
            raise InputError("status_map", f"{word} mapped twice")
        out[word] = status
    return out


def _rate(x) -> float:
    """The file's ``request_rate`` (a number, ``"inf"``, or absent: NaN)."""
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _as_list(x) -> list:
    if x is None or x == "":
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    s = str(x).strip()
    if s.startswith("["):
        try:
            v = json.loads(s)
            return v if isinstance(v, list) else []
        except ValueError:
            pass
    return [p for p in s.replace(";", " ").split() if p]


def _read_rows(path: Path, fmt: str) -> list[dict]:
    from llmqueue._files import input_file, jsonl_objects, open_text, reading

    p = input_file("file", path)
    rows: list[dict] = []
    with reading("file", p):
        if fmt == "jsonl":
            rows += [d for _, d in jsonl_objects("file", p, "give one JSON object a line (JSONL)")]
        else:
            import csv

            with open_text(p, newline="") as f:
                rows = [dict(r) for r in csv.DictReader(f)]
    if not rows:
        raise InputError("file", f"{str(p)!r} holds no requests")
    return rows


def _table_columns(rows: list[dict], mapping: dict, source: str, time_unit: float) -> dict:
    """Raw per-request fields (lists) from the rows, by field name."""
    names = set().union(*(r.keys() for r in rows[:1000]))
    col = {}
    for field in FIELDS:
        c = mapping.get(field)
        if c is None:
            c = field if field in names else ("dispatched_s" if field == "send_s" and "dispatched_s" in names
                                              else None)
        elif c not in names:
            raise InputError("map", f"{field}={c}: {source} has no column {c!r}",
                             f"its columns: {', '.join(sorted(names)[:30])}")
        if c is not None:
            col[field] = [r.get(c) for r in rows]
    have = set(col)
    need = [("a send time", ("send_s", "arrival_s")), ("prompt_tokens", ("prompt_tokens",)),
            ("output_tokens", ("output_tokens", "chunk_times", "itl_s"))]
    for what, alts in need:
        if not have & set(alts):
            raise InputError("map", f"{source} has no column for {what} ({' or '.join(alts)})",
                             f"name it with --map {alts[0]}=COLUMN (its columns: {', '.join(sorted(names)[:30])})")
    if not have & {"first_token_s", "ttft_s", "chunk_times"}:
        raise InputError("map", f"{source} has no column for the first token (first_token_s or ttft_s)",
                         f"name it with --map ttft_s=COLUMN (its columns: {', '.join(sorted(names)[:30])})")
    if not have & {"finish_s", "e2el_s", "chunk_times", "itl_s"}:
        raise InputError("map", f"{source} has no column for the last token (finish_s or e2el_s)",
                         f"name it with --map e2el_s=COLUMN (its columns: {', '.join(sorted(names)[:30])})")
    out: dict = {}
    n = len(rows)
    row = lambda i: f"{source} row {i + 1}"  # noqa: E731
    for f in ("send_s", "arrival_s", "first_token_s", "finish_s", "ttft_s", "e2el_s"):
        if f in col:
            out[f] = numbers(col[f], f, row, "time" if f in _ABS else "duration", scale=time_unit)
    for f in ("request_id", "prompt_tokens", "output_tokens", "cached_prompt_tokens", "attempt"):
        if f in col:  # a null token count: allowed on a request that did not finish (build_run)
            out[f] = numbers(col[f], f, row, "count")
    if "class" in col:
        out["class"] = np.array(["default" if x in (None, "") else str(x) for x in col["class"]], dtype=object)
    if "status" in col:
        out["status"] = [None if x in (None, "") else str(x).strip().lower() for x in col["status"]]
    if "error" in col:
        out["error"] = ["" if x is None else str(x) for x in col["error"]]
    if "chunk_times" in col:
        out["chunks"] = [numbers(_as_list(x), "chunk_times", lambda _, i=i: row(i), "time", scale=time_unit)
                         for i, x in enumerate(col["chunk_times"])]
    elif "itl_s" in col:
        out["itls"] = [numbers(_as_list(x), "itl_s", lambda _, i=i: row(i), "duration", scale=time_unit)
                       for i, x in enumerate(col["itl_s"])]
    out["n"] = n
    return out


@importer("vllm-bench", "vllm bench serve --save-result --save-detailed's JSON", options=("request_rate",))
def _vllm_columns(path: Path, request_rate: float | None = None) -> tuple[dict, list[str]]:
    from llmqueue._files import input_file, load_json

    p = input_file("file", path)
    data = load_json("file", p)
    if not isinstance(data, dict):
        raise InputError("file", f"{str(p)!r} is not a vLLM bench serve result (expected one JSON object)")
    need = ("input_lens", "output_lens", "ttfts")
    missing = [k for k in need if not isinstance(data.get(k), list)]
    if missing:
        raise InputError("file", f"{str(p)!r} has no per-request {', '.join(missing)} "
                         f"(keys: {', '.join(list(data)[:20])})",
                         "save it with vllm bench serve --save-result --save-detailed")
    n = len(data["input_lens"])
    if n == 0:
        raise InputError("file", f"{str(p)!r} records no requests")
    for k in ("output_lens", "ttfts", "itls", "latencies", "start_times", "errors", "queue_times"):
        v = data.get(k)
        if isinstance(v, list) and v and len(v) != n:
            raise InputError("file", f"{str(p)!r}: {n} input_lens but {len(v)} {k}")
    notes: list[str] = []
    row = lambda i: f"{str(p)!r} request {i + 1}"  # noqa: E731
    starts = data.get("start_times")
    if isinstance(starts, list) and starts:
        send = numbers(starts, "start_times", row, "time")
    else:
        rate = request_rate if request_rate is not None else _rate(data.get("request_rate"))
        if not (rate is not None and math.isfinite(rate) and rate > 0):
            raise InputError("request_rate", f"{str(p)!r} has no start_times and its request_rate is "
                             f"{data.get('request_rate')!r}, so the sends cannot be placed in time",
                             "give --request-rate R (the rate the benchmark used)")
        send = np.arange(n, dtype=np.float64) / rate
        notes.append(f"the file has no start_times: sends spaced evenly at {rate:g} req/s (the benchmark drew "
                     "random gaps, so this is not the measured arrival process)")
    errors = data.get("errors") if isinstance(data.get("errors"), list) and data.get("errors") else [""] * n
    ok = np.array([not e for e in errors])
    ttft = numbers(data["ttfts"], "ttfts", row, "duration")
    lat = numbers(data["latencies"], "latencies", row, "duration") if isinstance(data.get("latencies"), list) \
        and data.get("latencies") else None
    itls = data.get("itls") if isinstance(data.get("itls"), list) and data.get("itls") else None
    out: dict = {"n": n, "send_s": send, "prompt_tokens": numbers(data["input_lens"], "input_lens", row, "count"),
                 "output_tokens": numbers(data["output_lens"], "output_lens", row, "count"),
                 "ttft_s": np.where(ok, ttft, np.nan), "error": ["" if not e else str(e) for e in errors]}
    if lat is not None:
        out["e2el_s"] = np.where(ok, lat, np.nan)
    if itls is not None:
        out["itls"] = [numbers(g if isinstance(g, list) else [g] if g else [], "itls", lambda _, i=i: row(i),
                               "duration") for i, g in enumerate(itls)]
    if lat is None and itls is None:
        raise InputError("file", f"{str(p)!r} has neither latencies nor itls: the last token's time is unknown",
                         "save it with vllm bench serve --save-result --save-detailed")
    q = data.get("queue_times")
    if isinstance(q, list) and q:
        qq = np.nan_to_num(numbers(q, "queue_times", row, "duration"), nan=0.0)
        out["arrival_s"] = send - qq
    meta = {k: data.get(k) for k in ("date", "backend", "model_id", "tokenizer_id", "request_rate", "burstiness",
                                     "max_concurrency", "num_prompts", "label") if k in data}
    out["meta"] = meta
    return out, notes


@importer("guidellm", "guidellm benchmark's benchmarks.json or .yaml, report versions of guidellm v0.2-v0.3 and "
          "v0.4-v0.7; one benchmark of it, --benchmark K", options=("benchmark",))
def _guidellm(path: Path, benchmark: int | None = None) -> tuple[dict, list[str]]:
    from llmqueue.bench.guidellm_report import columns

    return columns(path, benchmark)


@importer("aiperf", "AIPerf's profile_export.jsonl, the per-request records of aiperf profile --streaming")
def _aiperf(path: Path) -> tuple[dict, list[str]]:
    from llmqueue.bench.aiperf_export import columns

    return columns(path)


@importer("jsonl", "one request a line; --map names the columns", options=("mapping", "time_unit"))
def _jsonl(path: Path, mapping: str | None = None, time_unit: str = "s") -> tuple[dict, list[str]]:
    return _table_columns(_read_rows(path, "jsonl"), parse_map(mapping), repr(str(path)), _UNITS[time_unit]), []


@importer("csv", "one request a row; --map names the columns", options=("mapping", "time_unit"))
def _csv(path: Path, mapping: str | None = None, time_unit: str = "s") -> tuple[dict, list[str]]:
    return _table_columns(_read_rows(path, "csv"), parse_map(mapping), repr(str(path)), _UNITS[time_unit]), []


def build_run(cols: dict, *, time_origin: float | None = None,
              status_map: dict | None = None) -> tuple[dict, dict | None, dict, list[str]]:
    """Records (request schema columns), token chunk columns (or None) and the workload's
    columns from the raw fields; and notes. ``status_map``: the file's own status words -> the
    schema's (:func:`parse_status_map`); a word neither knows is one line naming it. A null token
    count is allowed on a request that did not finish (its output: 0 in the records; its prompt:
    the median's, said in a note) and refused on an ok one. A request whose times cannot have
    happened (:func:`~llmqueue.bench.import_fields.impossible`) is dropped, counted in a note by
    reason; a file where every request is is one line."""
    from llmqueue.records.schema import STATUSES

    n = cols["n"]
    notes: list[str] = []
    send = cols.get("send_s", cols.get("arrival_s"))
    arrival = cols.get("arrival_s", send)
    if np.isnan(send).any():
        i = int(np.flatnonzero(np.isnan(send))[0])
        raise InputError("send_s", f"row {i + 1} has no send time", "every request needs its send time")
    chunks = cols.get("chunks")
    first = cols.get("first_token_s")
    if first is None and "ttft_s" in cols:
        first = send + cols["ttft_s"]
    if chunks is None and "itls" in cols:
        if first is None:
            raise InputError("map", "itl_s needs the first token's time (first_token_s or ttft_s)")
        chunks = [np.concatenate([[f], f + np.cumsum(g)]) if np.isfinite(f) else np.zeros(0)
                  for f, g in zip(first.tolist(), cols["itls"])]
    if first is None:
        first = np.array([c[0] if len(c) else np.nan for c in chunks])
    fin = cols.get("finish_s")
    if fin is None and "e2el_s" in cols:
        fin = send + cols["e2el_s"]
    if fin is None:
        fin = np.array([c[-1] if len(c) else np.nan for c in chunks])
    out_tok = cols.get("output_tokens")
    if out_tok is None:
        out_tok = np.array([len(c) for c in chunks], dtype=np.float64)
        notes.append("output_tokens counted as the streamed chunks")
    # statuses
    st = cols.get("status")
    err = cols.get("error")
    status = []
    status_map = status_map or {}
    for i in range(n):
        s = st[i] if st is not None else None
        if s is None:
            if err is not None and err[i]:
                s = "error"
            else:
                s = "ok" if np.isfinite(fin[i]) and np.isfinite(first[i]) else "unfinished"
        s = status_map.get(s, s)
        if s not in STATUSES:
            raise InputError("status", f"row {i + 1}: {s!r} is not a status",
                             f"map it with --status-map {s}=STATUS (statuses: {', '.join(STATUSES)})")
        status.append(s)
    status = np.array(status, dtype=object)
    ok = status == "ok"
    prompt = np.asarray(cols["prompt_tokens"], dtype=np.float64)
    for f, v in (("prompt_tokens", prompt), ("output_tokens", np.asarray(out_tok, dtype=np.float64))):
        null = ok & np.isnan(v)
        if null.any():
            i = int(np.flatnonzero(null)[0])
            raise InputError(f, f"row {i + 1} is ok but its {f} is null",
                             "give the token counts of every finished request (a null count is allowed only on "
                             "a request that did not finish; map its status with --status-map)")
    if np.isnan(prompt).any():  # requests that did not finish, their prompt not counted
        known = prompt[np.isfinite(prompt)]
        fill = int(round(float(np.median(known)))) if len(known) else 1
        notes.append(f"{int(np.isnan(prompt).sum())} request(s) that did not finish without a prompt length: "
                     f"{fill} prompt tokens given them (the median)")
        cols = {**cols, "prompt_tokens": np.where(np.isnan(prompt), fill, prompt)}
    bad = ok & ~(np.isfinite(first) & np.isfinite(fin))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError("status", f"row {i + 1} is ok but has no first or last token time",
                         "map first_token_s/ttft_s and finish_s/e2el_s")
    # a failed request's finish time: its send where none was recorded (a status other than unfinished has one)
    fin = np.where(~np.isfinite(fin) & (status != "unfinished"), send, fin)
    why = impossible(send, first, fin, ok, chunks)
    drop = np.logical_or.reduce(list(why.values()))
    if drop.all():
        reasons = ", ".join(f"{k}: {int(m.sum())}" for k, m in why.items() if m.any())
        raise InputError("file", f"every one of its {n} requests has impossible times ({reasons})",
                         "check the time columns (--map) and --time-unit")
    if drop.any():
        keep = ~drop
        notes.append(f"{int(drop.sum())} request(s) with impossible times dropped ("
                     + ", ".join(f"{k}: {int(m.sum())}" for k, m in why.items() if m.any()) + ")")
        cols = {k: (np.asarray(v)[keep] if isinstance(v, np.ndarray) else v) for k, v in cols.items()}
        send, arrival, first, fin, status, ok = send[keep], arrival[keep], first[keep], fin[keep], status[keep], ok[keep]
        out_tok = np.asarray(out_tok)[keep]
        if chunks is not None:
            chunks = [c for c, k in zip(chunks, keep.tolist()) if k]
        n = int(keep.sum())
    if time_origin is None:
        time_origin = float(np.nanmin(np.concatenate([send, arrival])))
    shift = float(time_origin)
    send, arrival, first, fin = send - shift, arrival - shift, first - shift, fin - shift
    if chunks is not None:
        chunks = [c - shift for c in chunks]
    rid = cols.get("request_id")
    rid = np.arange(n, dtype=np.int64) if rid is None or np.isnan(rid).any() else rid.astype(np.int64)
    att = cols.get("attempt")
    att = np.ones(n, dtype=np.int64) if att is None or np.isnan(att).any() else att.astype(np.int64)
    key = list(zip(rid.tolist(), att.tolist()))
    if len(set(key)) != n:
        dup = next(k for k in key if key.count(k) > 1)
        raise InputError("request_id", f"request {dup[0]} attempt {dup[1]} appears twice",
                         "map attempt=COLUMN for retries, or give unique ids")
    cls = cols.get("class")
    cls = np.array(["default"] * n, dtype=object) if cls is None else cls
    cached = cols.get("cached_prompt_tokens")
    records = request_record_columns(
        n, request_id=rid, class_=cls, arrival_s=arrival, dispatched_s=send, first_token_s=np.where(ok, first, np.nan),
        finish_s=fin, prompt_tokens=cols["prompt_tokens"].astype(np.int64),
        output_tokens=np.where(ok, np.nan_to_num(out_tok), 0).astype(np.int64),
        cached_prompt_tokens=0 if cached is None else np.nan_to_num(cached).astype(np.int64), status=status,
        attempt=att)
    tokens = None
    if chunks is not None:
        # a bench run's: what streamed, finished or not (an unfinished request's chunks in order)
        keep = [i for i in range(n) if len(chunks[i]) and (ok[i] or not (np.diff(chunks[i]) < 0).any())]
        cnt = np.array([len(chunks[i]) for i in keep], dtype=np.int64)
        tokens = {"request_id": np.repeat(rid[keep], cnt) if keep else np.zeros(0, np.int64),
                  "attempt": np.repeat(att[keep], cnt) if keep else np.zeros(0, np.int64),
                  "index": (np.concatenate([np.arange(c) for c in cnt]) if keep else np.zeros(0)).astype(np.int64),
                  "t_s": np.concatenate([chunks[i] for i in keep]) if keep else np.zeros(0)}
    # the request stream (first attempts): a failed request's wanted output is not known
    first_att = att == 1
    wanted = np.nan_to_num(out_tok).astype(np.int64)
    unknown = first_att & (wanted < 1)
    if unknown.any():
        fill = int(np.median(wanted[first_att & ~unknown])) if (first_att & ~unknown).any() else 1
        wanted = np.where(unknown, max(fill, 1), wanted)
        notes.append(f"{int(unknown.sum())} request(s) without an output length (failed): the workload asks "
                     f"{max(fill, 1)} output tokens of them (the median)")
    o = np.argsort(arrival[first_att], kind="stable")
    workload = {"request_id": rid[first_att][o], "class": cls[first_att][o], "arrival_s": arrival[first_att][o],
                "prompt_tokens": records["prompt_tokens"][first_att][o], "output_tokens": wanted[first_att][o]}
    return records, tokens, workload, notes


def import_run(fmt: str, path, out_dir, *, mapping: str | None = None, time_origin: float | None = None,
               time_zero: float | None = None, time_unit: str = "s", request_rate: float | None = None,
               settings: dict | None = None, server_log=None, benchmark: int | None = None,
               status_map: str | None = None, metrics=None, warmup_s: float = RUN_WARMUP_S) -> dict:
    """Write the run directory ``out_dir`` from ``path`` in format ``fmt`` (:data:`IMPORTERS`);
    ``time_zero``: the epoch second the file's times count from (for a file whose times count
    from the run's start: it places them on the server log's clock and the /metrics samples'
    timestamps; the run's 0 is then the file's 0 unless ``time_origin``, on the file's own clock,
    says otherwise; the times themselves are kept as the file has them, not rounded through an
    epoch); ``status_map``: the file's own
    status words onto the schema's (:func:`parse_status_map`); ``settings``: engine settings
    (``max_num_seqs``...) the user gives, recorded in ``server.json`` with their source;
    ``server_log``: the server's log, read for them too, and for its per-step lines
    (``--enable-logging-iteration-details``) in the run's time window, written as
    ``steps.parquet`` when the file's times are epoch seconds (the log's clock); ``metrics``:
    the server's ``/metrics`` samples (:mod:`llmqueue.bench.import_metrics`), brought in as a
    benchmark's sampler records them; ``warmup_s``: the seconds left out of the statistics (a
    bench run's window: :data:`~llmqueue.bench.options.RUN_WARMUP_S` by default; one not
    shorter than the run is ignored, said in a note); ``benchmark``: which benchmark of a
    guidellm report (1 = the first). Returns the summary written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from llmqueue.bench.run_window import run_window
    from llmqueue.bench.server_info import record
    from llmqueue.metrics import summarize
    from llmqueue.records import RequestRecords, dump_summary, write_records

    imp = IMPORTERS.get(fmt)
    if imp is None:
        raise InputError("FORMAT", f"unknown format {fmt!r}", f"formats: {', '.join(IMPORTERS)}")
    if time_unit not in _UNITS:
        raise InputError("time_unit", f"unknown unit {time_unit!r}", "s, ms, us or ns")
    path = Path(path)
    given = {"mapping": mapping or None, "request_rate": request_rate, "benchmark": benchmark}
    for opt, v in given.items():
        if v is not None and opt not in imp.options:
            takers = [i.name for i in IMPORTERS.values() if opt in i.options]
            raise InputError(OPTIONS[opt], f"applies to {' and '.join(takers)} files only, not {fmt}")
    opts = {k: v for k, v in {**given, "time_unit": time_unit}.items() if k in imp.options and v is not None}
    smap = parse_status_map(status_map)
    if not (isinstance(warmup_s, (int, float)) and warmup_s >= 0):  # inf: everything left out (the run: a note)
        raise InputError("warmup", f"must be a number of seconds >= 0 (got {warmup_s!r})", "e.g. --warmup 15, or 0")
    if time_origin is not None:
        check_origin(time_origin)
    zero = 0.0 if time_zero is None else check_origin(time_zero, field="time_zero")
    cols, notes = imp.read(path, **opts)
    meta = cols.pop("meta", None)
    if time_origin is None and time_zero is not None:  # the run starts where the file's clock does
        time_origin = 0.0
    elif time_origin is None:  # the earliest send (build_run's default), kept to place the server log's steps
        t = np.concatenate([cols[k] for k in ("send_s", "arrival_s") if k in cols])
        time_origin = float(np.nanmin(t)) if np.isfinite(t).any() else None
    records, tokens, workload, more = build_run(cols, time_origin=time_origin, status_map=smap)
    notes += more
    sampled = cc = None  # the /metrics scrapes, read whole before anything is written
    if metrics is not None:
        sampled, cc = _metrics(metrics, records, time_origin, zero, _UNITS[time_unit])
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError("out", f"cannot create {out} ({e.strerror or e})") from None
    recs = RequestRecords.from_columns(records)
    write_records(out / "requests.parquet", recs)
    with staged(out / "workload.parquet") as tmp:
        pq.write_table(pa.table({"request_id": pa.array(workload["request_id"], pa.int64()),
                                 "class": pa.array(workload["class"].astype(str), pa.string()),
                                 "arrival_s": pa.array(workload["arrival_s"], pa.float64()),
                                 "prompt_tokens": pa.array(workload["prompt_tokens"], pa.int64()),
                                 "output_tokens": pa.array(workload["output_tokens"], pa.int64())}), tmp)
    itl = None  # without chunk times: summarize's from TPOT
    if tokens is not None:
        from llmqueue.bench.recorder import token_schema

        with staged(out / "tokens.parquet") as tmp:
            pq.write_table(pa.table(tokens, schema=token_schema()), tmp)
    else:
        (out / "tokens.parquet").unlink(missing_ok=True)
    (out / "server.json").unlink(missing_ok=True)
    if cc is not None:  # the scrapes' vllm:cache_config_info, as bench's sampler records it
        from llmqueue._files import write_atomic
        from llmqueue.bench.sampler import cache_server

        write_atomic(out / "server.json", json.dumps(cache_server(cc), indent=2, default=str) + "\n")
    server = record(out, flags=settings, log=server_log, flag_source="import") if (settings or server_log) \
        else json.loads((out / "server.json").read_text()) if (out / "server.json").exists() else {}
    kv = server.get("M_usable") or server.get("M") or None
    (out / "steps.parquet").unlink(missing_ok=True)
    t0_epoch = None if time_origin is None else time_origin + zero  # the run's 0 on the epoch clock (if it is)
    if server_log is not None:
        notes += _log_steps(out, server_log, t0_epoch, records["finish_s"], kv)
    ts = _write_metrics(out, sampled, server.get("M"), notes)
    warm, horizon = run_window(recs, warmup_s, 0.0, notes)
    if warm > 0:
        notes.append(f"the first {warm:g} s left out of the statistics (the warm-up of the project's measured bench "
                     "runs; --warmup S to change)")
    if tokens is not None:  # a bench run's ITL: the ok requests arriving in the window
        itl = _window_itl(tokens, recs, (warm, horizon))
    s = summarize(recs, timeseries=ts, warmup_s=warm, horizon_s=horizon, itl_s=itl, send_s=recs["dispatched_s"],
                  kv_capacity=kv)
    if sampled is not None:
        from llmqueue.bench.prom import counter_deltas

        s["server_counters"] = counter_deltas(sampled)
    s["imported"] = {"format": fmt, "source": str(path), "requests": int(len(recs)),
                     "dropped": int(cols["n"]) - int(len(recs)),
                     "chunk_times": tokens is not None, "warmup_s": warm,
                     "time_zero_epoch_s": time_zero, "t0_epoch_s": t0_epoch if (t0_epoch or 0) >= 1e9 else None,
                     "status_map": smap or None, "metrics": None if metrics is None else str(metrics),
                     **({"result": meta} if meta else {})}
    if notes:
        s["notes"] = notes
    dump_summary(out / "summary.json", s)
    return s


def _log_steps(out: Path, server_log, origin: float | None, finish, M) -> list[str]:
    """Write ``out/steps.parquet`` from the server log's step lines that end between the run's
    start (``origin``, epoch seconds) and its last answer (plus the log's lag); notes."""
    from llmqueue.bench.steplog import steps_from_log
    from llmqueue.records import write_records

    if origin is None or origin < 1e9:  # not epoch seconds (e.g. vllm bench's perf_counter start_times)
        return [f"the file's times are not epoch seconds: the steps in {server_log} cannot be placed on them "
                "(no steps.parquet; --time-zero EPOCH gives the epoch second they count from)"]
    fin = np.asarray(finish, dtype=np.float64)
    end = float(np.nanmax(fin)) if np.isfinite(fin).any() else None
    steps, note = steps_from_log(server_log, t0_epoch_s=origin, t_end_s=end, M=M)
    if steps is None:
        return [f"no steps.parquet: {note}"]
    write_records(out / "steps.parquet", steps)
    return [f"{len(steps)} engine steps from {server_log} (steps.parquet)"]


def _window_itl(tokens: dict, recs, window) -> np.ndarray:
    """vLLM's ITL of the imported chunk times (``tokens``: the ok requests', in the records'
    order), as a bench run counts it (:func:`~llmqueue.bench.run_window.window_itl`)."""
    from llmqueue.bench.run_window import window_itl

    key = {k: i for i, k in enumerate(zip(recs["request_id"].tolist(), recs["attempt"].tolist()))}
    counts = np.zeros(len(recs), dtype=np.int64)
    rows = [key[k] for k in zip(tokens["request_id"].tolist(), tokens["attempt"].tolist())]
    np.add.at(counts, rows, 1)
    offs = np.zeros(len(recs), dtype=np.int64)
    if rows:  # each request's chunks are contiguous, in the records' order
        first = np.unique(np.asarray(rows), return_index=True)
        offs[first[0]] = first[1]
    return window_itl(recs, counts, offs, np.asarray(tokens["t_s"], dtype=np.float64), window)


def _metrics(path, records: dict, origin: float | None, zero: float, unit: float):
    """The ``--metrics`` scrapes of the run (the sampler's columns, ``t_s`` from the run's start)
    and the server's cache shape (or None)."""
    from llmqueue.bench.import_metrics import read_metrics, run_rows
    from llmqueue.bench.prom import sampled_columns

    rows, cc = read_metrics(path, time_zero=zero, time_unit=unit)
    origin = 0.0 if origin is None else origin
    for r in rows:
        r["t_s"] -= origin
    fin = np.asarray(records["finish_s"], dtype=np.float64)
    end = float(np.nanmax(fin)) if np.isfinite(fin).any() else float(np.max(records["arrival_s"]))
    start = float(np.min(records["arrival_s"]))
    return sampled_columns(run_rows(rows, start, end, repr(str(path)))), cc


def _write_metrics(out: Path, cols: dict | None, M, notes: list):
    """``metrics.parquet`` and ``timeseries.parquet`` from the imported scrapes, as a bench run
    writes them (each removed when there is none); the time series, or None."""
    from llmqueue.bench.prom import timeseries_of, write_metrics
    from llmqueue.bench.sampler import METRICS_FILE
    from llmqueue.records import write_records

    ts = None
    if cols is not None:
        write_metrics(out / METRICS_FILE, cols)
        ts = timeseries_of(cols, M)
        if len(ts):
            notes.append(f"{len(cols['t_s'])} /metrics samples (metrics.parquet, timeseries.parquet)")
        else:
            ts = None
            notes.append(f"{len(cols['t_s'])} /metrics samples without the queue lengths (metrics.parquet only)")
    else:
        (out / METRICS_FILE).unlink(missing_ok=True)
    if ts is not None:
        write_records(out / "timeseries.parquet", ts)
    else:
        (out / "timeseries.parquet").unlink(missing_ok=True)
    return ts
