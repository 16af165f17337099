"""guidellm's benchmark report (``benchmarks.json`` / ``.yaml``) as per-request fields for
:func:`llmqueue.bench.importers.build_run`.

The format was read from guidellm's own models (vllm-project/guidellm, formerly
neuralmagic/guidellm); two generations are understood:

- **v0.4 and later** (checked against v0.4.0-v0.7.3 and main of 2026:
  ``src/guidellm/benchmark/schemas/report.py``, ``schemas/request_stats.py``, ``schemas/info.py``):
  ``{"metadata": {"version": 2, ...}, "benchmarks": [{"config": {"strategy": ...},
  "metrics": {"request_totals": ...}, "requests": {"successful": [...], "errored": [...],
  "incomplete": [...]}}]}``, each request a ``GenerativeRequestStats``: ``info.timings``
  (``targeted_start``, ``request_start``, ``first_token_iteration``, ``last_token_iteration``,
  ``request_end``, ``token_iterations``; Unix seconds), ``info.status`` and ``info.error``, and
  the serialized ``prompt_tokens``/``output_tokens`` (``input_metrics.cached_tokens`` when the
  server reported a prefix-cache hit);
- **v0.2-v0.3** (``src/guidellm/benchmark/benchmark.py``: ``GenerativeTextResponseStats``):
  per request ``start_time``, ``first_token_time``, ``last_token_time``, ``end_time``,
  ``prompt_tokens``, ``output_tokens``, ``scheduler_info.targeted_start_time`` and, for a
  failure, ``error``; the strategy under ``args.strategy`` and the totals in ``request_totals``.

guidellm keeps no per-chunk times (only the first and last token's and the number of chunks),
so an imported guidellm run has no ``tokens.parquet``. Its statuses: ``successful`` is ``ok``,
``errored`` is ``error``, and ``incomplete`` (still in flight when guidellm stopped the
benchmark at its duration or request cap) is ``cancelled``: a departure the client forced,
not one the server made.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from llmqueue.bench.import_fields import number
from llmqueue.errors import InputError

_GROUPS = {"successful": "ok", "errored": "error", "incomplete": "cancelled"}
_INFO_STATUS = {"completed": "ok", "errored": "error", "cancelled": "cancelled"}


def _load(path: Path):
    from llmqueue._files import input_file, load_json, read_text, reading

    p = input_file("file", path)
    if p.name.lower().removesuffix(".gz").endswith((".yaml", ".yml")):
        import yaml

        text = read_text("file", p)
        with reading("file", p):
            try:
                return p, yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise InputError("file", f"{str(p)!r} is not YAML ({str(e).splitlines()[0]})") from None
    return p, load_json("file", p)


def _label(b: dict) -> str:
    """``constant@4 req/s``: a benchmark's scheduling strategy, as guidellm names it."""
    s = (b.get("config") or {}).get("strategy") or (b.get("args") or {}).get("strategy") or {}
    if not isinstance(s, dict):
        return "?"
    kind = str(s.get("type_") or s.get("type") or "?")
    if s.get("rate") is not None:
        return f"{kind}@{float(s['rate']):g} req/s"
    if kind == "synchronous":
        return kind
    for k in ("streams", "max_concurrency"):
        if s.get(k) is not None:
            return f"{kind}@{s[k]} {k.replace('_', ' ')}"
    return kind


def benchmarks(path) -> list[str]:
    """The report's benchmarks, one label each (``constant@2 req/s``), in file order."""
    p, data = _load(Path(path))
    return [_label(b) for b in _benchmark_list(p, data)]


def _benchmark_list(p: Path, data) -> list[dict]:
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        keys = ", ".join(list(data)[:12]) if isinstance(data, dict) else type(data).__name__
        raise InputError("file", f"{str(p)!r} is not a guidellm benchmark report (no benchmarks list; has {keys})",
                         "give the benchmarks.json (or .yaml) that guidellm benchmark --output-path wrote")
    bs = [b for b in data["benchmarks"] if isinstance(b, dict)]
    if not bs:
        raise InputError("file", f"{str(p)!r} holds no benchmarks")
    return bs


def _f(x, field: str, where: str) -> float:
    """A time (Unix seconds): NaN when missing or guidellm's -1 (never set); a value that is no
    finite time is one line (:func:`~llmqueue.bench.import_fields.number`)."""
    v = number(x, field, where, "time")
    return v if v >= 0 else math.nan


def _row_new(r: dict, group: str, where: str) -> dict:
    """One v0.4+ GenerativeRequestStats."""
    info = r.get("info") or {}
    t = info.get("timings") or {}
    tf = lambda k: _f(t.get(k), f"info.timings.{k}", where)  # noqa: E731
    send = tf("request_start")
    if not math.isfinite(send):
        send = tf("resolve_start")
    last = tf("last_token_iteration")
    if not math.isfinite(last):
        last = tf("request_end")
    out_tok, out_field = r.get("output_tokens"), "output_tokens"
    if out_tok is None:
        out_tok, out_field = (r.get("output_metrics") or {}).get("text_tokens"), "output_metrics.text_tokens"
    if out_tok is None and t.get("token_iterations"):
        out_tok, out_field = t.get("token_iterations"), "info.timings.token_iterations"
    prompt, prompt_field = r.get("prompt_tokens"), "prompt_tokens"
    if prompt is None:
        prompt, prompt_field = (r.get("input_metrics") or {}).get("text_tokens"), "input_metrics.text_tokens"
    cached = (r.get("input_metrics") or {}).get("cached_tokens")
    status = _INFO_STATUS.get(str(info.get("status")), _GROUPS[group])
    return {"send": send, "target": tf("targeted_start"), "first": tf("first_token_iteration"),
            "last": last, "end": tf("request_end"), "prompt": _count(prompt, prompt_field, where),
            "output": _count(out_tok, out_field, where),
            "cached": _count(cached, "input_metrics.cached_tokens", where), "status": status,
            "error": info.get("error") or ""}


def _count(x, field: str, where: str) -> float | None:
    """A token count, None when missing."""
    v = number(x, field, where, "count")
    return None if math.isnan(v) else v


def _row_old(r: dict, group: str, where: str) -> dict:
    """One v0.2-v0.3 GenerativeTextResponseStats / GenerativeTextErrorStats."""
    si = r.get("scheduler_info") or {}
    f = lambda d, k, pre="": _f(d.get(k), pre + k, where)  # noqa: E731
    return {"send": f(r, "start_time"), "target": f(si, "targeted_start_time", "scheduler_info."),
            "first": f(r, "first_token_time"), "last": f(r, "last_token_time"),
            "end": f(r, "end_time"), "prompt": _count(r.get("prompt_tokens"), "prompt_tokens", where),
            "output": _count(r.get("output_tokens"), "output_tokens", where),
            "cached": None, "status": "cancelled" if si.get("canceled") and group != "successful"
            else _GROUPS[group], "error": r.get("error") or ""}


def columns(path, benchmark: int | None = None) -> tuple[dict, list[str]]:
    """The raw per-request fields (see :func:`llmqueue.bench.importers.build_run`) of one
    benchmark of a guidellm report and notes. ``benchmark``: its number (1 = the first, in file
    order); needed when the report holds several (a sweep): the one-line error lists them."""
    p, data = _load(Path(path))
    bs = _benchmark_list(p, data)
    if benchmark is None:
        if len(bs) > 1:
            listing = "; ".join(f"{i} {_label(b)}" for i, b in enumerate(bs, 1))
            raise InputError("benchmark", f"{str(p)!r} holds {len(bs)} benchmarks ({listing})",
                             "pick one with --benchmark K (a run directory holds one load)")
        benchmark = 1
    if not 1 <= benchmark <= len(bs):
        raise InputError("benchmark", f"{benchmark} is not a benchmark of {str(p)!r} (it holds 1..{len(bs)})")
    b = bs[benchmark - 1]
    groups = b.get("requests")
    if not isinstance(groups, dict) or not any(isinstance(groups.get(g), list) for g in _GROUPS):
        raise InputError("file", f"{str(p)!r} benchmark {benchmark} has no per-request requests.successful "
                         "list", "keep the requests in the report (guidellm's --sample-requests must not be 0)")
    rows = []
    for g in _GROUPS:
        for j, r in enumerate(groups.get(g) or ()):
            if not isinstance(r, dict):
                continue
            where = f"{str(p)!r} benchmark {benchmark} requests.{g}[{j}]"
            rows.append(_row_new(r, g, where) if "info" in r else _row_old(r, g, where))
    if not rows:
        raise InputError("file", f"{str(p)!r} benchmark {benchmark} records no requests",
                         "keep the requests in the report (guidellm's --sample-requests must not be 0)")
    version = "v0.4+" if any("info" in r for g in _GROUPS for r in (groups.get(g) or ()) if isinstance(r, dict)) \
        else "v0.2-v0.3"
    where = "info.timings.request_start" if version == "v0.4+" else "start_time"
    no_send = [i for i, r in enumerate(rows) if not math.isfinite(r["send"])]
    if len(no_send) == len(rows):
        raise InputError("file", f"{str(p)!r} benchmark {benchmark}: no request has a send time ({where})",
                         "give a report guidellm wrote with its per-request timings")
    notes = []
    if no_send:
        notes.append(f"{len(no_send)} request(s) without a send time ({where}) left out")
        rows = [r for i, r in enumerate(rows) if i not in set(no_send)]
    if any(r["prompt"] is None for r in rows):
        i = next(i for i, r in enumerate(rows) if r["prompt"] is None)
        raise InputError("file", f"{str(p)!r} benchmark {benchmark}: request {i + 1} has no prompt_tokens",
                         "guidellm records them from the server's usage; use a report with token counts")
    ok_bad = [i for i, r in enumerate(rows) if r["status"] == "ok"
              and not (math.isfinite(r["first"]) and math.isfinite(r["last"]))]
    if ok_bad:
        f = "info.timings.first_token_iteration" if version == "v0.4+" else "first_token_time"
        raise InputError("file", f"{str(p)!r} benchmark {benchmark}: {len(ok_bad)} successful request(s) have no "
                         f"{f} or last token time", "benchmark with streaming (guidellm's default)")
    rows.sort(key=lambda r: r["send"])
    n = len(rows)
    arr = lambda k: np.array([r[k] for r in rows], dtype=np.float64)  # noqa: E731
    send = arr("send")
    target = arr("target")
    # a failed request's end: when guidellm gave up on it
    fin = np.where(np.isfinite(arr("last")), arr("last"), arr("end"))
    out_tok = np.array([np.nan if r["output"] is None else float(r["output"]) for r in rows])
    cols = {"n": n, "send_s": send, "first_token_s": arr("first"), "finish_s": fin,
            "prompt_tokens": np.array([float(r["prompt"]) for r in rows]),
            "output_tokens": np.nan_to_num(out_tok),
            "status": [r["status"] for r in rows], "error": [str(r["error"]) for r in rows]}
    if any(r["cached"] is not None for r in rows):
        cols["cached_prompt_tokens"] = np.array([float(r["cached"] or 0) for r in rows])
    # the schedule's intended send (a rate-driven strategy); a concurrency strategy has none
    if np.isfinite(target).all() and (target <= send + 1e-6).all():
        cols["arrival_s"] = target
    totals = ((b.get("metrics") or {}).get("request_totals") or b.get("request_totals") or {})
    total = totals.get("total") if isinstance(totals, dict) else None
    if isinstance(total, (int, float)) and total > n + len(no_send):
        notes.append(f"the report keeps {n + len(no_send)} of the benchmark's {int(total)} requests (guidellm's "
                     "--sample-requests): the imported stream is a thinned sample, so its rates and queueing are "
                     "not the benchmark's; rerun guidellm without sampling to validate against this run")
    md = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    cols["meta"] = {"benchmark": benchmark, "of": len(bs), "strategy": _label(b), "schema": version,
                    **({"guidellm_version": md["guidellm_version"]} if md.get("guidellm_version") else {})}
    return cols, notes
