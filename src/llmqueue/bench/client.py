"""Open-loop benchmark client for OpenAI-compatible servers (vLLM's ``/v1/completions`` and
``/v1/chat/completions``), writing the same per-request records as the simulator.

:func:`run_bench` sends a request stream to a server on its open-loop schedule (each request at
its intended arrival time, never waiting for earlier answers: no coordinated omission) and
returns one record per attempt and a summary. Its parts, one module each:

- :mod:`~llmqueue.bench.options`: :class:`~llmqueue.bench.options.BenchOptions`, every option of
  a run, declared once (the ``llmqueue bench`` flags come from the same table);
- :mod:`~llmqueue.bench.prompts`: the request bodies (token-id or text prompts, exact lengths);
- :mod:`~llmqueue.bench.http`: the transport (keep-alive HTTP/1.1 on asyncio protocols);
- :mod:`~llmqueue.bench.attempt`: one attempt, its streamed answer, token times and status;
- :mod:`~llmqueue.bench.sender`: the open-loop sender (absolute clock, concurrency cap, retries,
  stopping when the server is gone);
- :mod:`~llmqueue.bench.recorder`: the records, written as the run goes;
- :mod:`~llmqueue.bench.sampler`: the server's ``/metrics`` during the run;
- :mod:`~llmqueue.bench.checks`: the client's checks of itself.

Latencies
---------
Each attempt's record keeps the intended ``arrival_s`` and the actual ``dispatched_s``. The
summary's vLLM-named latencies (``mean_ttft_ms``, ``p99_e2el_ms``, ...) count from the actual send,
as ``vllm bench serve``'s do (``vllm/benchmarks/serve.py``, ``calculate_metrics``): TTFT = first
chunk - send, E2EL (``latency``) = last chunk - send, TPOT = (E2EL - TTFT) / (output_tokens - 1) for
more than one output token, ITL = gaps between consecutive chunks (``tokens.parquet``).
``summary["from_intended"]`` gives TTFT and E2EL from the intended time, which charges any client
lateness (and any wait for a concurrency slot) to the latency rather than hiding it. With a
concurrency cap the run is closed-loop, and the summary says so. ``first_scheduled_s`` is NaN and
``preemptions`` 0: a client cannot observe when the engine first scheduled a request or whether
it was preempted (the server's ``/metrics`` only give totals). ``replica`` is 0. Each failure's
reason is counted in ``summary["errors"]``. An ok attempt with more output tokens than its
``max_tokens`` stays ``ok`` with the server's count (it was served; its times are real) and is
counted in ``summary["warnings"]`` with a note naming the worst case: a server that ignores
``max_tokens`` skews throughput and TPOT, which the reader must know, but it does not make the
measured latencies false.

Failures of the run itself
--------------------------
A server that cannot be reached at the start raises :class:`BenchConnectError`. If it stops
accepting connections during the run, or the records cannot be written (a full disk), the run
stops early and the result carries ``error`` (the reason); the files are closed on any exit, so a
stopped or interrupted run keeps every finished attempt (``BenchResult.written`` counts them).

One event loop (uvloop when installed) does everything: the sender, the HTTP exchanges and the
stream parsing; each attempt has one deadline timer; finished attempts are written by a worker
thread once a second, so writing never blocks sending.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmqueue.bench.checks import client_checks, peak_concurrency
from llmqueue.bench.http import Pool, base_url, conn_message, endpoint_url
from llmqueue.bench.options import BenchOptions
from llmqueue.bench.prompts import Prompts, token_id_range
from llmqueue.bench.recorder import Recorder
from llmqueue.bench.run_window import run_window, window_itl
from llmqueue.bench.sampler import METRICS_FILE, SERVER_FILE, start_sampler, stop_sampler
from llmqueue.bench.sender import OVER_ASKED, Sender
from llmqueue.errors import InputError, LlmqueueError

_pc = time.perf_counter


class BenchConnectError(LlmqueueError):
    """The server could not be reached before the run started (nothing was sent)."""

    def __init__(self, url: str, problem: str):
        self.field = "url"
        super().__init__(f"url: cannot connect to {url} ({problem}); start the server or fix --url")


@dataclass
class BenchResult:
    """What :func:`run_bench` returns.

    ``records``: :class:`~llmqueue.records.RequestRecords` (one row per attempt); ``summary``:
    :func:`llmqueue.metrics.summarize` plus ``client`` (self-checks), ``from_intended`` and ``bench``;
    ``tokens``: per-chunk arrival times (``request_id, attempt, index, t_s`` arrays);
    ``error``: why the run stopped early (None if it ran to the end); ``out_dir``: where the
    files are (None if not written); ``written``: the attempt records on disk (all of them,
    unless writing failed: a full disk).
    """

    records: object
    summary: dict
    tokens: dict
    error: str | None = None
    interrupted: bool = False
    out_dir: Path | None = None
    notes: list = field(default_factory=list)
    written: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


class _Run:
    """One benchmark run: the sender, the recorder and the sampler on one event loop, and the
    result they make."""

    def __init__(self, url: str, model: str, requests, opts: BenchOptions):
        self.model = model
        self.requests = requests
        self.opts = opts
        self.post_url = endpoint_url(url, opts.endpoint)
        self.headers, self.proxy = opts.route(url)
        self.notes: list[str] = []
        token_range = opts.token_range if opts.token_range is not None else token_id_range(opts.vocab_size)
        self.prompts = Prompts(requests, model=model, endpoint=opts.endpoint, seed=opts.seed, token_range=token_range,
                               exact_output=opts.exact_output, extra_body=opts.extra_body, hash_ids=opts.hash_ids,
                               hash_block_tokens=opts.prefix_block_tokens, texts=opts.prompt_texts)
        self.rec = Recorder(requests.classes, opts.out_dir)
        self.sender = Sender(requests, self.prompts, opts, self.rec.record, self.notes)
        self.error: str | None = None
        self.interrupted = False
        self.drain_cancelled = 0
        self.t0 = 0.0
        self.t0_epoch: float | None = None  # wall-clock time (epoch s) of the run's t = 0

    async def main(self) -> BenchResult:
        opts, snd = self.opts, self.sender
        loop = asyncio.get_running_loop()
        # the request head the pool writes: ours, then the key and the custom headers
        head = [("User-Agent", "llmqueue-bench"), ("Accept", "text/event-stream"),
                ("Content-Type", "application/json"), *self.headers.items()]
        pool = Pool(loop, self.post_url, head, proxy=self.proxy)
        await self.preflight(pool)
        snd.start(pool, 0.0)
        bar = sampler = flusher = None
        frozen = False
        try:
            if opts.warmup_requests:
                await snd.warm_up(opts.warmup_requests)
            self.rec.open(self.requests, self.prompts)
            bar = self.progress_bar()
            if opts.metrics_url:  # import the sampler's modules now, not in its thread during the run
                try:
                    import httpx  # noqa: F401

                    import llmqueue.bench.prom  # noqa: F401
                except ImportError:
                    pass
            # Objects alive now (modules, the request stream) never become garbage during the
            # run: freezing them keeps the collector's full passes short (tens of ms otherwise,
            # each a pause of every send).
            gc.collect()
            gc.freeze()
            frozen = True
            # The writer thread holds the GIL in short stretches; hand it back to the sender
            # within 0.5 ms instead of Python's default 5 ms.
            switch = sys.getswitchinterval()
            sys.setswitchinterval(min(switch, 0.0005))
            # its first scrape (the counters' baseline) comes before any send
            sampler = start_sampler(opts.metrics_url, opts.metrics_interval_s, self.notes)
            self.t0 = _pc()
            self.t0_epoch = time.time()
            snd.t0 = self.t0
            if sampler is not None:
                sampler.start(t0=self.t0)
            flusher = loop.create_task(self.flusher(bar))
            snd.sched_task = loop.create_task(snd.schedule())
            try:
                await asyncio.shield(snd.sched_task)
            except asyncio.CancelledError:
                if not snd.sched_task.cancelled() and not snd.sched_task.done():
                    raise  # we were cancelled (interrupt), not the scheduler
            self.drain_cancelled = await snd.wait_inflight(opts.drain_timeout_s, opts.abort_grace_s)
        except asyncio.CancelledError:
            # SIGINT/SIGTERM: stop sending, end what is in flight as unfinished, keep the records.
            self.interrupted = True
            snd.stopping = True
            if snd.error is None:
                snd.error = "interrupted"
            if snd.sched_task is not None:
                snd.sched_task.cancel()
            await snd.cancel_all()
        finally:
            t_end = _pc() - self.t0 if self.t0 else 0.0
            if flusher is not None:
                flusher.cancel()
                try:
                    await flusher
                except asyncio.CancelledError:
                    pass
            await self.flush()
            if bar is not None:
                bar.update(snd.finished - bar.n)
                bar.close()
            pool.close()
            ts = server = metrics = None
            if sampler is not None:
                ok = int(sum(st == "ok" for st in self.rec.c_status))
                ts, server, metrics = stop_sampler(sampler, opts.metrics_url, ok, self.notes)
            self.close()
            if frozen:
                gc.unfreeze()
                sys.setswitchinterval(switch)
        return self.result(t_end, ts, server, metrics)

    async def preflight(self, pool) -> None:
        try:
            await asyncio.wait_for(pool.resolve(), 10.0)
            await asyncio.wait_for(pool.connect(), 10.0)
        except (OSError, asyncio.TimeoutError) as e:
            raise BenchConnectError(base_url(self.post_url), conn_message(e)) from None

    async def flush(self) -> None:
        """Hand the finished attempts to the writer; a write that failed stops the run."""
        await self.rec.flush()
        if self.rec.write_error is not None and not self.sender.stopping:
            t_s = _pc() - self.t0
            self.sender.abort(f"{self.rec.write_error} at t = {t_s:.3f} s; the run stopped")

    async def flusher(self, bar) -> None:
        done_shown = 0
        while True:
            await asyncio.sleep(self.opts.flush_interval_s)
            await self.flush()
            if bar is not None:
                done = self.sender.finished
                bar.update(done - done_shown)
                done_shown = done
                bar.set_postfix(in_flight=self.sender.n_inflight, refresh=False)

    def progress_bar(self):
        if not self.opts.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=len(self.sender.arrivals), unit="req", mininterval=0.5, leave=False, dynamic_ncols=True,
                    desc="bench")

    def close(self) -> None:
        """Close the record files; a failure (a full disk) is the run's error, or a note."""
        self.error = self.sender.error
        if self.rec.write_error is not None and self.error is None:  # found only now (the last flush was cut short)
            self.error = f"{self.rec.write_error}; the run stopped"
        for reason in self.rec.close(complete=not self.interrupted and self.error is None):
            self.disk_failed(reason)

    def disk_failed(self, reason: str) -> None:
        """A file of the run could not be written after the run: the run's error (the first one
        is kept), one line."""
        if self.error is None:
            self.error = reason
        elif reason not in self.notes:
            self.notes.append(reason)

    # -- the result ----------------------------------------------------------------------------
    def result(self, t_end: float, ts=None, server=None, metrics=None) -> BenchResult:
        from llmqueue.records import RequestRecords, TimeSeries

        rec = self.rec
        cols = rec.columns()
        order = np.lexsort((cols["attempt"], cols["request_id"]))  # the file keeps completion order
        recs = RequestRecords.from_columns({k: v[order] for k, v in cols.items()})
        sched = np.frombuffer(rec.c_sched, dtype=np.float64)[order] if len(order) else np.zeros(0)
        n_tok = np.frombuffer(rec.c_ntok, dtype=np.int64) if len(order) else np.zeros(0, dtype=np.int64)
        window = run_window(recs, self.opts.warmup_s, t_end, self.notes)
        itl = window_itl(recs, n_tok[order], (np.cumsum(n_tok) - n_tok)[order],
                         np.frombuffer(rec.tok_t, dtype=np.float64), window)
        tokens = rec.token_columns()
        if ts is not None and not isinstance(ts, TimeSeries):
            try:
                ts = TimeSeries.from_columns(ts)
            except LlmqueueError as e:
                self.notes.append(f"metrics time series unusable: {e}")
                ts = None
        if ts is not None and len(ts) == 0:
            ts = None
        summary = self.summarize(recs, sched, itl, window, t_end, ts, kv_capacity=(server or {}).get("M"))
        if metrics:
            from llmqueue.bench.prom import counter_deltas, write_metrics

            summary["server_counters"] = counter_deltas(metrics)
        out_dir = rec.out_dir
        if out_dir is not None:
            from llmqueue._files import write_atomic
            from llmqueue.records import dump_summary, write_records

            try:
                if ts is not None:
                    write_records(out_dir / "timeseries.parquet", ts)
                if metrics:
                    write_metrics(out_dir / METRICS_FILE, metrics)
                if server:
                    write_atomic(out_dir / SERVER_FILE, json.dumps(server, indent=2, default=str) + "\n")
                dump_summary(out_dir / "summary.json", summary)
            except OSError as e:
                self.disk_failed(f"cannot write to {out_dir} ({e.strerror or e}); no summary.json (the records "
                                 "written stay readable)")
        return BenchResult(records=recs, summary=summary, tokens=tokens, error=self.error,
                           interrupted=self.interrupted, out_dir=out_dir, notes=list(self.notes),
                           written=rec.written)

    def summarize(self, recs, sched, itl, window, t_end: float, ts, kv_capacity: float | None = None) -> dict:
        """The summary of the records (``sched``: each attempt's send start; ``itl``: the chunk
        gaps; ``window``: the statistics' warm-up and horizon)."""
        from llmqueue.metrics import summarize

        opts, snd = self.opts, self.sender
        status = recs["status"]
        warm, horizon = window
        # kv_capacity: the server's cache_config_info M, for kv_utilization
        # the vLLM-named latencies count from the actual send (dispatched_s), as vLLM's do; the
        # same from the intended time go to s["from_intended"]
        extra = {} if opts.percentiles is None else {"percentiles": tuple(opts.percentiles)}
        s = summarize(recs, timeseries=ts, warmup_s=warm, horizon_s=horizon, slos=opts.slos, itl_s=itl,
                      kv_capacity=kv_capacity, send_s=recs["dispatched_s"], **extra)
        s["itl_source"] = "client: gaps between streamed chunks (vllm bench serve's ITL)"
        s["client"] = client_checks(recs, sched, bool(opts.concurrency),
                                    (snd.warnings[OVER_ASKED], *snd.over_asked))
        load = ("open-loop" if not opts.concurrency else
                f"closed-loop: at most {opts.concurrency} requests in flight (a request waits in the client "
                "for a slot; latencies count from its actual send, as vLLM's do; from_intended includes that wait)")
        a1 = np.asarray(self.requests.arrival_s)
        s["max_concurrency"] = opts.concurrency
        s["request_rate"] = (len(a1) / float(a1[-1]) if len(a1) > 1 and a1[-1] > 0 else None)
        # vLLM's: the peak number of successful requests between their send and their last token
        s["max_concurrent_requests"] = peak_concurrency(recs["dispatched_s"][status == "ok"],
                                                        recs["finish_s"][status == "ok"])
        s["max_in_flight_client"] = snd.max_inflight  # the client's own peak (waiting for a slot included)
        s["not_sent"] = len(snd.arrivals) - snd.sent_first
        s["retries_not_sent"] = snd.retries_dropped
        s["attempts"] = len(recs)
        s["errors"] = dict(snd.errors.most_common(20))
        s["warnings"] = dict(snd.warnings)
        if snd.warnings[OVER_ASKED]:
            r, (rid, got, asked) = snd.over_asked
            note = (f"{snd.warnings[OVER_ASKED]} ok attempt(s) got more output tokens than max_tokens asked for "
                    f"(at most {r:.3g}x: request {rid} got {got} for {asked}); kept as ok, with the server's count")
            if note not in self.notes:
                self.notes.append(note)
        p = self.prompts
        s["bench"] = {
            "url": self.post_url, "model": self.model, "endpoint": opts.endpoint, "load": load,
            "closed_loop": bool(opts.concurrency), "concurrency": opts.concurrency, "requests": len(snd.arrivals),
            "seed": opts.seed,
            "prompt": ("dataset text (usage counts)" if p.texts is not None else
                       "token ids" if opts.endpoint == "completions" else "text (usage counts)"),
            "exact_output": p.exact, "stopped_early": self.error, "interrupted": self.interrupted,
            "metrics_url": opts.metrics_url, "t0_epoch_s": self.t0_epoch, "t_end_s": t_end,
            "drain_timeout_s": opts.drain_timeout_s, "drain_cancelled": self.drain_cancelled,
            # the client's deadlines per class (a replay applies them: validate)
            "timeout_s": {c: v for c, v in zip(snd.classes, snd.timeouts) if math.isfinite(v)},
            "ttft_timeout_s": {c: v for c, v in zip(snd.classes, snd.ttft_timeouts) if math.isfinite(v)},
            "retries": snd.retry is not None,
            "prefix_hashes": (None if p.hash_ids is None else
                              {"block_tokens": p.H, "requests": sum(1 for h in p.hash_ids if h)}),
        }
        if self.notes:
            s["notes"] = list(self.notes)
        return s


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------

def _checked(url: str, model: str, requests, opts: BenchOptions | None, options: dict) -> BenchOptions:
    if opts is None:
        opts = BenchOptions(**options)
    elif options:
        opts = opts.replace(**options)
    endpoint_url(url, opts.endpoint)
    if not isinstance(model, str) or not model:
        raise InputError("model", f"must be a non-empty model name (got {model!r})")
    if len(requests) == 0:
        raise InputError("requests", "the workload has no requests", "give --num-requests or a longer --duration")
    return opts


async def run_bench_async(url: str, model: str, requests, opts: BenchOptions | None = None,
                          **options) -> BenchResult:
    """:func:`run_bench` inside a running event loop."""
    return await _Run(url, model, requests, _checked(url, model, requests, opts, options)).main()


def run_bench(url: str, model: str, requests, opts: BenchOptions | None = None, **options) -> BenchResult:
    """Send ``requests`` (a :class:`~llmqueue.workload.generate.RequestArrays`) to an
    OpenAI-compatible server on their open-loop schedule; return records and summary.

    ``url``: the server (``http://127.0.0.1:8000``; ``.../v1`` or a full endpoint URL also work).
    ``model``: the model name requested. ``opts``: the run's
    :class:`~llmqueue.bench.options.BenchOptions` (the defaults when None); ``options``: fields of
    it given by name (``run_bench(url, model, reqs, concurrency=8)``), replacing those of ``opts``.
    See the module docstring for what the run does and what it writes.
    """
    opts = _checked(url, model, requests, opts, options)
    run = _Run(url, model, requests, opts)

    async def main():
        import signal

        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        try:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        try:
            return await run.main()
        finally:
            try:
                loop.remove_signal_handler(signal.SIGTERM)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    _raise_fd_limit()
    if opts.use_uvloop:
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if uvloop is not None:
            return uvloop.run(main())
    return asyncio.run(main())


def _raise_fd_limit() -> None:
    """Open loop means one connection per request in flight: lift the soft limit on open files
    to the hard one, as load generators do (best effort)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


__all__ = ["BenchConnectError", "BenchOptions", "BenchResult", "run_bench", "run_bench_async"]
