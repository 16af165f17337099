"""``llmqueue import --metrics FILE``: the server's ``/metrics`` samples that another client took,
brought into the run as a benchmark's sampler records them (:mod:`llmqueue.bench.sampler`):
``metrics.parquet`` (every sampled column), ``timeseries.parquet`` (the queue lengths: waiting
and running requests, the KV tokens in use) and the summary's ``server_counters`` (the counters'
growth over the run: preemptions, tokens, finished requests).

Two forms of the file (gzip-compressed or not):

- **Prometheus text exposition**, the scrapes one after another, each placed in time by a line
  ``# time T`` before it (``T`` on the requests' clock, in their unit: ``--time-unit`` applies to
  it as to the requests' times); without such lines, by the samples' own exposition timestamps
  (milliseconds since the epoch, as Prometheus writes them: epoch time, placed on the requests'
  clock by ``--time-zero`` when theirs count from the run's start), the samples of one timestamp
  making one scrape;
- **CSV** with a time column (:data:`TIME_COLUMNS`, on the requests' clock and unit) and either a
  column per quantity, named as the sampler names it (``num_waiting``, ``preemptions``,
  ``ttft_sum``: :data:`~llmqueue.bench.prom.ALIASES`, :data:`~llmqueue.bench.prom.HISTOGRAMS`) or
  as vLLM does (``vllm:num_requests_waiting``), one scrape a row; or ``name`` and ``value`` columns,
  one sample a row, the rows of one time making one scrape (label sets summed, as a scrape's are).

Every scrape goes through the sampler's own :func:`~llmqueue.bench.prom.snapshot_row`, so an
imported run's columns are a benchmarked run's. The scrapes kept are those of the run: from the
last one at or before its start to the first one at or after its last answer (a file that covers
a longer time, several runs, is cut to this one); a file none of whose scrapes falls in the run is
one line naming ``--time-zero`` (the usual cause: relative times without it).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
import numpy as np

from llmqueue.errors import InputError

#: the CSV's time column, the first of these names it has
TIME_COLUMNS = ("t_s", "time_s", "time", "timestamp")
_TIME_LINE = re.compile(r"^#\s*time\s+(\S+)\s*$", re.IGNORECASE)
_FORMS = ("Prometheus text scrapes, each after a '# time T' line (or with the exposition's own timestamps), "
          f"or a CSV with a time column ({', '.join(TIME_COLUMNS)}) and a column per metric (or name,value)")


def read_metrics(path, *, time_zero: float = 0.0, time_unit: float = 1.0) -> tuple[list[dict], object]:
    """The scrapes of ``path`` as the sampler's rows (``t_s`` on the requests' clock: the file's
    times times ``time_unit``; exposition timestamps, epoch seconds, less ``time_zero``, the epoch
    second the requests' times count from) and
    the server's cache shape (:class:`~llmqueue.bench.prom.CacheConfig`, None without
    ``vllm:cache_config_info``). A file that is neither form, a time that is no time, or a value
    that is no number is one line naming the row."""
    from llmqueue._files import input_file, read_text
    from llmqueue.bench.prom import cache_config, snapshot_row

    p = input_file("metrics", path)
    text = read_text("metrics", p)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not first:
        raise InputError("metrics", f"{str(p)!r} is empty", f"give {_FORMS}")
    csv_form = not first.startswith("#") and "," in first and "{" not in first
    scrapes = (_csv_scrapes(text, repr(str(p)), time_unit) if csv_form
               else _text_scrapes(text, repr(str(p)), time_zero, time_unit))
    if not scrapes:
        raise InputError("metrics", f"{str(p)!r} holds no vLLM samples", f"give {_FORMS}")
    cc = next((cache_config(s) for _, s in scrapes if "vllm:cache_config_info" in s), None)
    rows = [{"t_s": t, "scrape_s": math.nan, **snapshot_row(s)} for t, s in scrapes]
    return rows, cc


def run_rows(rows: list[dict], start: float, end: float, source: str) -> list[dict]:
    """The scrapes of the run ``[start, end]`` (absolute): from the last one at or before ``start``
    to the first one at or after ``end``; none inside is one line naming ``--time-zero``."""
    t = np.array([r["t_s"] for r in rows], dtype=np.float64)
    before, after = t[t <= start], t[t >= end]
    lo = before.max() if len(before) else -math.inf
    hi = after.min() if len(after) else math.inf
    keep = [r for r, x in zip(rows, t.tolist()) if lo <= x <= hi]
    inside = [x for x in t.tolist() if start <= x <= end]
    if not inside and not (len(before) and len(after)):
        raise InputError("metrics", f"{source}: no sample falls in the run (its samples span {t.min():.6g} to "
                         f"{t.max():.6g} s, the run {start:.6g} to {end:.6g} s on the requests' clock)",
                         "give --time-zero EPOCH when the requests' times count from the run's start and the "
                         "samples' are epoch seconds (or the reverse), and --time-unit for both")
    return keep


def _time(x, where: str, time_unit: float) -> float:
    from llmqueue.bench.import_fields import number

    v = number(x, "metrics", where, "time", scale=time_unit)
    if math.isnan(v):
        raise InputError("metrics", f"{where}: no time", f"give every scrape its time ({_FORMS})")
    return v


def _text_scrapes(text: str, source: str, time_zero: float, time_unit: float) -> list[tuple[float, object]]:
    """Exposition text: scrapes split at ``# time T`` lines, or grouped by their own timestamps."""
    from llmqueue.bench.prom import SAMPLED_NAMES, MetricsSnapshot, parse_metrics

    lines = text.splitlines()
    marks = [(i, m.group(1)) for i, ln in enumerate(lines) if (m := _TIME_LINE.match(ln.strip()))]
    out = []
    if marks:
        head = parse_metrics("\n".join(lines[:marks[0][0]]) + "\n", SAMPLED_NAMES)
        if head.samples:
            raise InputError("metrics", f"{source}: samples before the first '# time T' line",
                             "begin every scrape with its '# time T' line")
        for k, (i, t) in enumerate(marks):
            end = marks[k + 1][0] if k + 1 < len(marks) else len(lines)
            snap = parse_metrics("\n".join(lines[i + 1:end]) + "\n", SAMPLED_NAMES)
            out.append((_time(t, f"{source} line {i + 1}", time_unit), snap))
        return out
    snap = parse_metrics(text, SAMPLED_NAMES)
    groups: dict = defaultdict(list)
    for s in snap.samples:
        if s.timestamp is None:
            raise InputError("metrics", f"{source}: sample {s.name} has no time",
                             "begin every scrape with a '# time T' line (T: seconds on the requests' clock), "
                             "or give the samples the exposition's own timestamps (epoch milliseconds)")
        groups[s.timestamp].append(s)
    for t in sorted(groups):
        _time(t, f"{source} sample at {t!r}", 1.0)  # in range
        out.append((float(t) - time_zero, MetricsSnapshot(groups[t], snap.types)))
    return out


def _csv_scrapes(text: str, source: str, time_unit: float) -> list[tuple[float, object]]:
    """A CSV of samples: a column per metric (one scrape a row) or ``name``/``value`` rows."""
    import csv
    import io

    from llmqueue.bench.prom import ALIASES, HISTOGRAMS, SAMPLED_NAMES, MetricsSnapshot, Sample

    reader = csv.DictReader(io.StringIO(text))
    cols = [c.strip() for c in reader.fieldnames or ()]
    tcol = next((c for c in TIME_COLUMNS if c in cols), None)
    if tcol is None:
        raise InputError("metrics", f"{source} has no time column (its columns: {', '.join(cols[:20])})",
                         f"name it one of {', '.join(TIME_COLUMNS)}")
    # a sampler column name -> the vLLM sample name it is read from (the newest vLLM's)
    names = {col: names[0] for col, names in ALIASES.items()}
    names.update({f"{h}_{x}": bases[0] + f"_{x}" for h, bases in HISTOGRAMS.items() for x in ("sum", "count")})
    long_form = "value" in cols and ("name" in cols or "metric" in cols)
    ncol = "name" if "name" in cols else "metric"
    metric_cols = {c: names.get(c, c) for c in cols if c != tcol and (c in names or c in SAMPLED_NAMES)}
    if not long_form and not metric_cols:
        raise InputError("metrics", f"{source} has no metric column (its columns: {', '.join(cols[:20])})",
                         f"name them as the sampler does ({', '.join(list(names)[:6])}, ...) or as vLLM does "
                         "(vllm:num_requests_waiting, ...), or give name,value columns")
    groups: dict = defaultdict(list)
    for i, row in enumerate(reader, 2):
        row = {(k or "").strip(): v for k, v in row.items()}
        where = f"{source} row {i}"
        t = _time(row.get(tcol), where, time_unit)
        pairs = ([((row.get(ncol) or "").strip(), row.get("value"))] if long_form
                 else [(name, row.get(c)) for c, name in metric_cols.items()])
        for name, v in pairs:
            name = names.get(name, name)
            if name not in SAMPLED_NAMES or v is None or not str(v).strip():
                continue
            try:
                x = float(v)
            except ValueError:
                raise InputError("metrics", f"{where}: {name} {v!r} is not a number") from None
            groups[t].append(Sample(name, {}, x))
    return [(t, MetricsSnapshot(groups[t])) for t in sorted(groups)]

