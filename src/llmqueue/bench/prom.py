"""vLLM's server-side state: Prometheus ``/metrics`` and the per-step log.

- :func:`parse_metrics` reads Prometheus text exposition (``prometheus_client``'s parser) into a
  :class:`MetricsSnapshot` (``snap.value("vllm:num_requests_running")`` sums over label sets).
- :func:`cache_config` reads ``vllm:cache_config_info``'s labels: ``num_gpu_blocks``,
  ``block_size`` and the KV capacity ``M = num_gpu_blocks * block_size`` (tokens).
- :class:`MetricsSampler` polls ``/metrics`` every ``interval_s`` in a thread (httpx) into a time
  series: queue lengths, KV usage, preemptions, and the sums and counts of the step and latency
  histograms (``to_columns()``, ``to_timeseries()`` for :class:`llmqueue.records.TimeSeries`).
- :func:`parse_iteration_log` reads the lines that ``--enable-logging-iteration-details``
  writes, one per engine step, into columns (:data:`ITERATION_COLUMNS`);
  :func:`iteration_steps` turns them into step records (:data:`llmqueue.records.STEP_COLUMNS`).

Metric names differ across vLLM versions; the sampler looks each quantity up under the names in
:data:`ALIASES` and records NaN for one the server does not export.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from llmqueue._result import Result
from llmqueue.errors import InputError

__all__ = [
    "ALIASES",
    "HISTOGRAMS",
    "CacheConfig",
    "MetricsSampler",
    "MetricsSnapshot",
    "SAMPLED_NAMES",
    "Sample",
    "ITERATION_COLUMNS",
    "cache_config",
    "iteration_steps",
    "parse_iteration_log",
    "parse_metrics",
    "read_iteration_log",
    "sampled_columns",
    "snapshot_row",
    "timeseries_of",
]


# -- parsing --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One exposition line: ``name{labels} value [timestamp]`` (the timestamp in epoch seconds, None
    when the line has none, as a live scrape's lines)."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None = None


class MetricsSnapshot:
    """The samples of one scrape, indexed by sample name (``..._total``, ``..._sum`` included).

    ``value(name, **labels)`` sums the samples of ``name`` whose labels include ``labels`` (vLLM
    labels by ``model_name`` and ``engine``; the sum covers all engines); NaN if none.
    """

    def __init__(self, samples: Iterable[Sample], types: Mapping[str, str] | None = None):
        self.samples: list[Sample] = list(samples)
        self.types: dict[str, str] = dict(types or {})
        self._by_name: dict[str, list[Sample]] = {}
        for s in self.samples:
            self._by_name.setdefault(s.name, []).append(s)

    def names(self) -> set[str]:
        return set(self._by_name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def get(self, name: str) -> list[Sample]:
        return list(self._by_name.get(name, ()))

    def value(self, name: str, default: float = math.nan, **labels: str) -> float:
        hits = [s.value for s in self._by_name.get(name, ())
                if all(s.labels.get(k) == v for k, v in labels.items())]
        return float(sum(hits)) if hits else default

    def first(self, names: Iterable[str], default: float = math.nan) -> float:
        """The value of the first of ``names`` that is present (version aliases)."""
        for n in names:
            if n in self._by_name:
                return self.value(n)
        return default

    def labels(self, name: str) -> dict[str, str]:
        """The labels of ``name``'s first sample (``{}`` if absent): for ``..._info`` gauges."""
        hits = self._by_name.get(name)
        return dict(hits[0].labels) if hits else {}


def _sample_name(line: str) -> str:
    cut = len(line)
    for ch in "{ \t":
        i = line.find(ch)
        if i != -1 and i < cut:
            cut = i
    return line[:cut]


def parse_metrics(text: str, names: Iterable[str] | None = None) -> MetricsSnapshot:
    """Parse Prometheus text exposition; raise :class:`InputError` on malformed text.

    ``names`` (sample names) keeps only those samples, and is much faster: the lines are
    filtered before parsing (a vLLM scrape is about 50 kB; parsing all of it costs ~0.1 s of CPU).
    """
    from prometheus_client.parser import text_string_to_metric_families

    if names is not None:
        want = set(names)
        text = "\n".join(ln for ln in text.splitlines()
                         if ln and not ln.startswith("#") and _sample_name(ln) in want) + "\n"
    samples: list[Sample] = []
    types: dict[str, str] = {}
    try:
        for fam in text_string_to_metric_families(text):
            types[fam.name] = fam.type
            for s in fam.samples:
                ts = None if s.timestamp is None else float(s.timestamp)
                samples.append(Sample(s.name, dict(s.labels), float(s.value), ts))
    except (ValueError, TypeError, IndexError) as e:
        raise InputError("metrics", f"not Prometheus text exposition ({e})") from None
    return MetricsSnapshot(samples, types)


@dataclass(frozen=True)
class CacheConfig(Result):
    """``vllm:cache_config_info``: ``M = num_gpu_blocks * block_size`` KV tokens.

    ``M_usable = (num_gpu_blocks - 1) * block_size``: vLLM v1's block pool keeps one block
    aside (the "null block"), so requests can hold one block less than the cache has (it
    matters with a small ``--num-gpu-blocks-override``: 16 blocks of 32 serve at most 480 tokens).
    """

    num_gpu_blocks: int | None
    block_size: int | None
    M: int | None
    M_usable: int | None = None
    labels: dict = field(default_factory=dict)


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    v = labels.get(key)
    if v in (None, "", "None"):
        return None
    try:
        return int(float(v))
    except ValueError:
        return None


def cache_config(snap: MetricsSnapshot | str) -> CacheConfig:
    """The KV cache's shape from ``vllm:cache_config_info`` (a snapshot or exposition text).

    ``num_gpu_blocks`` is the engine's count after profiling (on CPU: from
    ``VLLM_CPU_KVCACHE_SPACE``, or ``--num-gpu-blocks-override`` when given).
    """
    if isinstance(snap, str):
        snap = parse_metrics(snap)
    labels = snap.labels("vllm:cache_config_info")
    if not labels:
        raise InputError("metrics", "no vllm:cache_config_info gauge",
                         "is this a vLLM server's /metrics?")
    blocks = _int_label(labels, "num_gpu_blocks_override") or _int_label(labels, "num_gpu_blocks")
    bs = _int_label(labels, "block_size")
    known = blocks is not None and bs is not None
    return CacheConfig(num_gpu_blocks=blocks, block_size=bs, M=blocks * bs if known else None,
                       M_usable=max(blocks - 1, 0) * bs if known else None, labels=labels)


# -- sampling -------------------------------------------------------------------------------

ALIASES: dict[str, tuple[str, ...]] = {
    "num_running": ("vllm:num_requests_running",),
    "num_waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "requests_finished": ("vllm:request_success_total",),  # all finish reasons
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
}
"""Sampler column -> the metric names it is read from, newest vLLM first."""

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "iteration_tokens": ("vllm:iteration_tokens_total",),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2el": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
}
"""Histogram column prefix -> metric base names; the sampler records ``PREFIX_sum`` and ``PREFIX_count``."""


SAMPLED_NAMES: frozenset[str] = frozenset(
    [n for names in ALIASES.values() for n in names]
    + [b + suffix for bases in HISTOGRAMS.values() for b in bases for suffix in ("_sum", "_count")]
    + ["vllm:cache_config_info"])
"""The sample names :class:`MetricsSampler` parses (the rest of a scrape is skipped)."""


def snapshot_row(snap: MetricsSnapshot) -> dict[str, float]:
    """One time-series row (without ``t_s``) from a snapshot: :data:`ALIASES` and :data:`HISTOGRAMS`."""
    row = {col: snap.first(names) for col, names in ALIASES.items()}
    for col, bases in HISTOGRAMS.items():
        row[f"{col}_sum"] = snap.first(b + "_sum" for b in bases)
        row[f"{col}_count"] = snap.first(b + "_count" for b in bases)
    return row


class MetricsSampler:
    """Poll ``URL/metrics`` every ``interval_s`` seconds in a background thread.

    ``t_s`` of a row is the midpoint of its scrape on ``clock`` (default ``time.perf_counter``)
    minus ``t0`` (default: the clock at :meth:`start`); pass the benchmark's own ``t0`` to put
    the samples on its time axis. The first successful scrape also reads
    :attr:`cache_config` (``M``). Failed scrapes are counted in :attr:`errors`, not raised.

        with MetricsSampler(srv.url, interval_s=0.5) as sampler:
            ...run the load...
        cols = sampler.to_columns()          # t_s, num_running, num_waiting, kv_usage, ...
        ts = sampler.to_timeseries()         # llmqueue.records.TimeSeries (kv_tokens from M)
    """

    def __init__(self, url: str, interval_s: float = 0.5, *, t0: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, timeout_s: float = 5.0,
                 keep_text: bool = False):
        if not interval_s > 0:
            raise InputError("interval_s", f"must be > 0 (got {interval_s})")
        self.url = url.rstrip("/")
        self.metrics_url = self.url if self.url.endswith("/metrics") else self.url + "/metrics"
        self.interval_s = float(interval_s)
        self.t0 = t0
        self.clock = clock
        self.timeout_s = float(timeout_s)
        self.keep_text = keep_text
        self.rows: list[dict[str, float]] = []
        self.texts: list[str] = []
        self.cache_config: CacheConfig | None = None
        self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample_once(self, client=None) -> dict[str, float] | None:
        """Scrape once, append a row and return it (None and ``errors += 1`` on failure)."""
        import httpx

        if self.t0 is None:
            self.t0 = self.clock()
        own = client is None
        client = client or httpx.Client(timeout=self.timeout_s, trust_env=False)
        try:
            a = self.clock()
            r = client.get(self.metrics_url)
            b = self.clock()
            r.raise_for_status()
            snap = parse_metrics(r.text, SAMPLED_NAMES)
        except Exception as e:  # noqa: BLE001 - a sampler must outlive a bad scrape
            with self._lock:
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
            return None
        finally:
            if own:
                client.close()
        row = {"t_s": (a + b) / 2 - self.t0, "scrape_s": b - a, **snapshot_row(snap)}
        with self._lock:
            if self.cache_config is None and "vllm:cache_config_info" in snap:
                self.cache_config = cache_config(snap)
            self.rows.append(row)
            if self.keep_text:
                self.texts.append(r.text)
        return row

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=self.timeout_s, trust_env=False) as client:
            next_t = self.clock()
            while not self._stop.is_set():
                self.sample_once(client)
                next_t += self.interval_s
                delay = next_t - self.clock()
                if delay < 0:  # fell behind: skip missed ticks, keep the grid
                    next_t += math.ceil(-delay / self.interval_s) * self.interval_s
                    delay = next_t - self.clock()
                self._stop.wait(max(0.0, delay))

    def start(self, t0: float | None = None) -> "MetricsSampler":
        """Start the polling thread. ``t0`` (on ``clock``) sets the time axis now; rows scraped
        before (a baseline taken with :meth:`sample_once` before the load began) are moved onto
        it, so a baseline reads a small negative ``t_s``."""
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        if t0 is not None:
            with self._lock:
                if self.t0 is not None:
                    for r in self.rows:
                        r["t_s"] += self.t0 - t0
            self.t0 = t0
        if self.t0 is None:
            self.t0 = self.clock()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="llmqueue-metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_sample: bool = True, *, finished_at_least: int = 0, settle_s: float = 2.0) -> None:
        """Stop the thread (and take one last sample, so counters cover the whole run).

        A server may count a request's statistics a moment after streaming its last token:
        with ``finished_at_least = n`` the last sample is repeated (every 50 ms, for at most
        ``settle_s``) until the server's finished-requests counter grew by ``n`` since the first
        row. A server without that counter gets one last sample."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + self.interval_s + 1)
        self._thread = None
        if not final_sample:
            return
        row = self.sample_once()
        deadline = self.clock() + settle_s
        while finished_at_least > 0 and self.clock() < deadline:
            with self._lock:
                first = next((r.get("requests_finished") for r in self.rows
                              if math.isfinite(r.get("requests_finished", math.nan))), None)
            last = (row or {}).get("requests_finished", math.nan)
            if first is None or not math.isfinite(last) or last - first >= finished_at_least:
                break
            time.sleep(0.05)
            row = self.sample_once()

    def __enter__(self) -> "MetricsSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def to_columns(self) -> dict[str, np.ndarray]:
        """The samples as columns of float64 arrays (``t_s`` first), sorted by time."""
        with self._lock:
            return sampled_columns(self.rows)

    def to_timeseries(self, replica: int = 0, M: int | None = None):
        """A :class:`llmqueue.records.TimeSeries`: ``kv_tokens = round(kv_usage * M)``.

        ``M`` defaults to :attr:`cache_config`'s; without it ``kv_tokens`` is 0. Rows whose
        queue gauges are missing (failed parses) are dropped.
        """
        if M is None and self.cache_config is not None:
            M = self.cache_config.M
        return timeseries_of(self.to_columns(), M, replica)


def sampled_columns(rows: Iterable[Mapping[str, float]]) -> dict[str, np.ndarray]:
    """Sampler rows (``t_s`` and :func:`snapshot_row`'s columns) as columns of float64 arrays,
    ``t_s`` first, sorted by time: the columns of ``metrics.parquet``."""
    rows = sorted(rows, key=lambda r: r["t_s"])
    keys = ["t_s", "scrape_s", *ALIASES]
    for col in HISTOGRAMS:
        keys += [f"{col}_sum", f"{col}_count"]
    return {k: np.array([r.get(k, math.nan) for r in rows], dtype=np.float64) for k in keys}


def timeseries_of(cols: Mapping[str, np.ndarray], M: int | float | None, replica: int = 0):
    """The sampled queue lengths as a :class:`llmqueue.records.TimeSeries`: ``kv_tokens =
    round(kv_usage * M)`` (0 without ``M``); rows whose queue gauges are missing are dropped."""
    from llmqueue.records import TimeSeries

    c = cols
    ok = np.isfinite(c["num_running"]) & np.isfinite(c["num_waiting"])
    kv = c["kv_usage"][ok]
    kv_tokens = np.rint(np.nan_to_num(kv) * M).astype(np.int64) if M else np.zeros(int(ok.sum()), np.int64)
    return TimeSeries.from_columns(
        t_s=c["t_s"][ok], replica=np.full(int(ok.sum()), replica, np.int64),
        num_waiting=c["num_waiting"][ok].astype(np.int64),
        num_running=c["num_running"][ok].astype(np.int64), kv_tokens=kv_tokens)


COUNTERS = ("preemptions", "prompt_tokens", "generation_tokens", "requests_finished", "prefix_cache_queries",
            "prefix_cache_hits")
"""Sampler columns that are Prometheus counters (monotone over a server's life)."""


def counter_deltas(cols: dict) -> dict:
    """How much each counter of :data:`COUNTERS` (and each histogram's ``_count``) grew between
    the first and the last sample: ``{"preemptions": 12.0, ...}`` (None where never sampled).
    A server restart (a counter going down) is reported as None, not as a negative count."""
    out = {}
    names = [*COUNTERS, *(f"{h}_count" for h in HISTOGRAMS)]
    for k in names:
        v = np.asarray(cols.get(k, ()), dtype=np.float64)
        v = v[np.isfinite(v)]
        if len(v) < 2 or np.any(np.diff(v) < 0):
            out[k] = None
        else:
            out[k] = float(v[-1] - v[0])
    return out


def write_metrics(path, cols: dict) -> None:
    """Write the sampler's columns (:meth:`MetricsSampler.to_columns`) as one Parquet table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from llmqueue._files import staged

    with staged(path) as tmp:
        pq.write_table(pa.table({k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}), tmp)


# -- the per-step log -----------------------------------------------------------------------

_ITER = re.compile(r"(?:Engine (?P<engine>\d+): )?Iteration\((?P<step>\d+)\):")
_FIELDS = {
    "prefill_reqs": re.compile(r"(\d+) context requests"),
    "prefill_tokens": re.compile(r"(\d+) context tokens"),
    "decode_seqs": re.compile(r"(\d+) generation requests"),
    "decode_tokens": re.compile(r"(\d+) generation tokens"),
}
_ELAPSED = re.compile(r"iteration elapsed time: ([0-9.]+) ms")
_KV = re.compile(r"KV cache usage: ([0-9.]+)%")
_EPOCH = re.compile(r"^\s*(\d{9,11}\.\d+)\s")
_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")

ITERATION_COLUMNS: dict[str, str] = {
    "step": "int64",            # vLLM's iteration index (per engine, from 0)
    "engine": "int64",          # engine (data-parallel rank) index, 0 if not logged
    "t_log": "float64",         # epoch seconds the line was logged (NaN if no time stamp)
    "duration_s": "float64",    # "iteration elapsed time": the model's execution of the step
    "prefill_reqs": "int64",    # "context requests": requests computing prompt tokens
    "prefill_tokens": "int64",  # "context tokens": prompt tokens computed (chunks included)
    "decode_seqs": "int64",     # "generation requests"
    "decode_tokens": "int64",   # "generation tokens" (more than decode_seqs with speculation)
    "kv_usage": "float64",      # KV-cache usage after the step, a fraction (0.1 % resolution)
    "dummy": "bool",            # a data-parallel dummy step
}
"""Columns of :func:`parse_iteration_log` (name -> numpy dtype)."""


def _stamp_epoch(line: str, year: int) -> float:
    """Epoch seconds of a line: the ``%(created)`` prefix, else vLLM's local ``MM-DD HH:MM:SS``."""
    m = _EPOCH.match(line)
    if m:
        return float(m.group(1))
    m = _STAMP.search(line)
    if m:
        mo, d, H, M, S = (int(x) for x in m.groups())
        return datetime(year, mo, d, H, M, S).timestamp()
    return math.nan


def parse_iteration_log(text: str | Iterable[str], *, year: int | None = None) -> dict[str, np.ndarray]:
    """Read the per-step lines of ``--enable-logging-iteration-details`` into columns.

    A line looks like (vLLM 0.32; ``VllmServer`` adds the leading epoch time stamp through
    ``VLLM_LOGGING_PREFIX``)::

        1795673372.594229 (APIServer pid=26987) INFO 11-26 06:09:32 [loggers.py:199] Engine 000:
        Iteration(32): 0 context requests, 0 context tokens, 32 generation requests, 32 generation
        tokens, iteration elapsed time: 226.09 ms, CPU KV cache usage: 7.8%

    (one line). Other lines are skipped. ``t_log`` is the time the API server logged the step,
    about 100 ms after the step ended; without the epoch prefix it falls back to vLLM's own stamp
    (local time, whole seconds, in ``year``, default this year). See :data:`ITERATION_COLUMNS`.
    """
    lines = text.splitlines() if isinstance(text, str) else text
    year = year or datetime.now().year
    rows: list[tuple] = []
    for line in lines:
        if "Iteration(" not in line:
            continue
        m = _ITER.search(line)
        el = _ELAPSED.search(line)
        if m is None or el is None:
            continue
        vals = []
        for rx in _FIELDS.values():
            f = rx.search(line)
            vals.append(int(f.group(1)) if f else 0)
        kv = _KV.search(line)
        rows.append((int(m.group("step")), int(m.group("engine") or 0), _stamp_epoch(line, year),
                     float(el.group(1)) / 1e3, *vals,
                     float(kv.group(1)) / 100 if kv else math.nan, "(dummy)" in line))
    cols = list(ITERATION_COLUMNS)
    return {c: np.array([r[i] for r in rows], dtype=ITERATION_COLUMNS[c]) for i, c in enumerate(cols)}


def read_iteration_log(path, *, year: int | None = None) -> dict[str, np.ndarray]:
    """:func:`parse_iteration_log` of a log file (read as UTF-8, bad bytes replaced)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_iteration_log(f, year=year)


def iteration_steps(cols: Mapping[str, np.ndarray], *, t0_wall: float, M: int | None = None,
                    replica: int = 0, include_dummy: bool = False, speculative: bool = False):
    """Step records (:class:`llmqueue.records.StepRecords`) from :func:`parse_iteration_log`'s columns.

    ``t0_wall`` is the run's time origin in epoch seconds (``time.time()`` at the benchmark's
    ``t = 0``). ``start_s = t_log - duration_s - t0_wall``: the log time is taken as the step's
    end, so starts are late by the logging delay (measured on vLLM 0.32's CPU build: 100 ms
    after the step's token reached a streaming client, +-1 ms, every step alike; durations and
    start-to-start cycles are unaffected). ``kv_tokens =
    round(kv_usage * M)`` (0 without ``M``); ``num_running = prefill_reqs + decode_seqs`` (the
    requests the step computed). The log does not tell ``num_waiting`` or ``preempted``: both are
    0 (sample them from ``/metrics`` instead). Steps without a time stamp are dropped.

    Recompute after preemption: vLLM counts a request as a "context request" only while it has
    no output token, so a preempted request that resumes (recomputing its prompt and the tokens
    it had generated) is logged as one *generation* request with many generation tokens. Without
    speculative decoding a decoding request computes exactly one token, so a step with
    ``g_tok > g_req`` holds a recompute: taken as one resumed request (the log does not say how
    many), it moves ``g_tok - g_req + 1`` tokens to ``prefill_tokens`` and one request out of
    ``decode_seqs``. ``speculative=True`` keeps the log's split as it is (draft tokens also make
    ``g_tok > g_req``).
    """
    from llmqueue.records import StepRecords

    keep = np.isfinite(np.asarray(cols["t_log"], dtype=np.float64))
    if not include_dummy:
        keep &= ~np.asarray(cols["dummy"], dtype=bool)
    c = {k: np.asarray(v)[keep] for k, v in cols.items()}
    n = int(keep.sum())
    kv = np.nan_to_num(c["kv_usage"])
    prefill = c["prefill_tokens"].astype(np.int64)
    decode = c["decode_seqs"].astype(np.int64)
    if not speculative and n:
        extra = c["decode_tokens"].astype(np.int64) - decode
        resumed = extra > 0
        prefill = prefill + np.where(resumed, extra + 1, 0)
        decode = decode - resumed.astype(np.int64)
    return StepRecords.from_columns(
        step=c["step"], replica=np.full(n, replica, np.int64),
        start_s=c["t_log"] - c["duration_s"] - t0_wall, duration_s=c["duration_s"],
        prefill_tokens=prefill, decode_seqs=decode,
        num_running=c["prefill_reqs"] + c["decode_seqs"], num_waiting=np.zeros(n, np.int64),
        kv_tokens=np.rint(kv * M).astype(np.int64) if M else np.zeros(n, np.int64),
        preempted=np.zeros(n, np.int64))
