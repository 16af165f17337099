"""``simulate()``: run a replica simulator over a request stream and collect its records."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmqueue.engine.options import STEP_FIELDS, TS_FIELDS, SimOptions, StopRun
from llmqueue.engine.config import EngineConfig
from llmqueue.engine.request import Request
from llmqueue.records.columns import request_record_columns


RECORD_BATCH = 65536  # finished requests converted to record columns at a time


@dataclass
class SimResult:
    """Columns of the request, step and time-series records (``llmqueue.records.schema``), plus
    run facts: ``horizon_s`` (end of the simulated window), ``wall_s``, ``steps`` (engine steps
    taken), ``stretches`` (decode stretches the fast path jumped), ``stretch_arrivals`` (arrivals that
    joined the queue inside one, at a step boundary), ``reject_reasons``."""

    requests: dict
    steps: dict
    timeseries: dict
    horizon_s: float
    wall_s: float
    num_steps: int
    stretches: int = 0
    stretch_arrivals: int = 0
    epoch_steps: int = 0
    reject_reasons: dict = field(default_factory=dict)
    explained: list = field(default_factory=list)  # StepExplanation of the steps asked for (SimOptions.explain)
    capacity_tokens: int = 0
    stopped_early_s: float | None = None  # set when an early-stopping run stopped (its horizon then)
    interrupted_s: float | None = None  # set when the run was stopped (StopRun, Ctrl-C) at this simulated time
    pools: dict | None = None  # a fleet's pools series (llmqueue.records.schema.POOL_COLUMNS)
    fleet: dict | None = None  # a fleet's facts: pools' model, cost and quality, scaling events, ...
    kv_tier: dict | None = None  # the host KV tier's account (llmqueue.engine.host_tier), when one is set


def simulate(config: EngineConfig, step_time, requests, *, options: SimOptions | None = None,
             reference: bool = False) -> SimResult:
    """Simulate one replica serving ``requests`` (a ``RequestArrays``-like object with
    ``request_id, arrival_s, prompt_tokens, output_tokens, class_name``).

    ``reference=True`` runs the reference replica built from the engine's nouns
    (:class:`~llmqueue.engine.reference.ReferenceReplica`; slow; for verification); otherwise the
    fast :class:`~llmqueue.engine.fast.Replica`. Both are driven the same way: every request
    submitted, the client's retries submitted as attempts fail, run to the horizon.
    """
    from llmqueue.engine.fast.replica import Replica

    from llmqueue.engine.limits import check_run_size
    from llmqueue.engine.stream import RequestStream

    opt = options or SimOptions()
    t0 = time.perf_counter()
    stream = RequestStream(requests, class_priority=config.class_priority, predicted_output=opt.predicted_output,
                           hash_ids=opt.hash_ids if config.enable_prefix_caching else None)
    n = len(stream)
    check_run_size(last_arrival_s=float(stream.arrival_s[-1]) if n else 0.0, horizon_s=opt.horizon_s,
                   sample_dt=opt.sample_dt)
    out = _Departures(opt.retry, n, tier=bool(config.kv_offload_tokens))
    done = out.done
    chunks = out.chunks  # record columns of finished requests (a batch at a time, and the epochs')

    common: dict[str, Any] = dict(seed=opt.seed, hash_block_tokens=opt.hash_block_tokens, timeout_s=opt.timeout_s,
                  ttft_timeout_s=opt.ttft_timeout_s, patience=opt.patience, on_finish=out, sample_dt=opt.sample_dt, explain=opt.explain)
    rep: Any
    if reference:
        from llmqueue.engine.reference import ReferenceReplica

        steps: list = []
        samples: list = []
        rep = ReferenceReplica(config, step_time, on_step=steps.append, on_sample=samples.append, **common)
    else:
        rep = Replica(config, step_time, progress=opt.progress, **common)
        rep.on_records = chunks.append
    out.rep = rep
    if reference:
        for r in stream.requests():
            rep.submit(r)
    else:
        rep.feed(stream)
    try:
        horizon = opt.horizon_s if opt.horizon_s is not None else math.inf
        stopped = interrupted = None
        try:
            if opt.early_stop and horizon < math.inf and not reference:
                stopped = _run_until_certain(rep, horizon, config.max_num_seqs, out.departed)
                if stopped is not None:
                    horizon = stopped
            else:
                rep.run(horizon)
        except StopRun as e:  # between two steps: the run ends there, as at a horizon
            horizon = interrupted = e.t
            if not reference:
                rep._take_arrivals(e.t)  # those arrived during the last step are in the system too
        left = rep.in_system()
        for r in left:
            r.outcome = "unfinished"
        from operator import attrgetter

        rows = sorted([*done, *left], key=attrgetter("seq"))
        if chunks:
            req = merge_by_seq([with_seq(rows, out.tier), *chunks], fill={"replica": 0})
        else:
            req = request_columns(rows, tier=out.tier)
        if reference:
            from llmqueue.engine.fast.recorder import row_columns

            step_cols = row_columns(steps, STEP_FIELDS, ("start_s", "duration_s"))
            ts_cols = row_columns(samples, TS_FIELDS, ("t_s",))
        else:
            step_cols, ts_cols = rep.step_columns(), rep.timeseries_columns()
        return SimResult(requests=req, steps=step_cols, timeseries=ts_cols, horizon_s=_horizon(horizon, req),
                         wall_s=time.perf_counter() - t0, num_steps=rep.steps_taken,
                         stretches=getattr(rep, "stretches", 0),
                         stretch_arrivals=getattr(rep, "stretch_arrivals", 0), epoch_steps=getattr(rep, "epoch_steps", 0),
                         reject_reasons={r.seq: r.reason for r in rows if r.reason}, explained=rep.explanations,
                         capacity_tokens=config.capacity_tokens, stopped_early_s=stopped, interrupted_s=interrupted,
                         kv_tier=rep.tier_account())
    finally:
        # the replica and its departures hold each other (a retry resubmits to the replica): let
        # go, so that the run's requests are freed now by reference counting (a cycle would hold
        # every request of the run until the next full collection walked them)
        out.rep = None


class _Departures:
    """Requests as they leave a replica (``on_finish``): kept for the records, as columns a batch
    of :data:`RECORD_BATCH` at a time (memory stays with what is in flight), and a failed attempt
    retried when the client's ``retry(request_id, attempt, outcome, t)`` gives a time (the new
    attempt resubmitted to ``rep``; its ``seq`` after the ``n`` of the stream)."""

    def __init__(self, retry, n: int, tier: bool = False) -> None:
        self.done: list[Request] = []
        self.chunks: list = []
        self.tier = tier  # a host KV tier: the records carry kv_loaded_tokens
        self.retry = retry
        self.retries: list[Request] = []
        self.n = n
        self.rep: Any = None

    def __call__(self, r: Request) -> None:
        done = self.done
        done.append(r)
        if len(done) == RECORD_BATCH:
            self.chunks.append(with_seq(done, self.tier))
            done.clear()
        if r.outcome != "ok" and self.retry is not None:
            t_next = self.retry(r.request_id, r.attempt, r.outcome, r.finish_time)
            if t_next is not None:
                a = Request(r.request_id, float(t_next), r.num_prompt_tokens, r.max_tokens, class_name=r.class_name,
                            priority=r.priority, attempt=r.attempt + 1, hash_ids=r.hash_ids,
                            predicted_output_tokens=r.predicted_output_tokens, seq=self.n + len(self.retries))
                self.retries.append(a)
                self.rep.submit(a)

    def departed(self) -> int:
        """Requests that have left so far."""
        return len(self.done) + sum(len(c["seq"]) for c in self.chunks)


SLICES = 50        # an early-stopping run is checked at 50 equal slices of its horizon
GROWING_SLICES = 5  # ... and stops when the number in the system grew in each of the last five


def _run_until_certain(rep, horizon: float, max_num_seqs: int, departed) -> float | None:
    """Run ``rep`` to ``horizon`` in slices; stop at the end of a slice once the run is certainly
    overloaded: at least a fifth of the horizon has passed, and the number in the system (arrived
    minus departed) grew in each of the last ``GROWING_SLICES`` slices, by at least a tenth of their
    arrivals in all, to more than twice ``max_num_seqs`` (a queue absorbing a tenth of the offered
    load, slice after slice, is unstable: ``lam - mu >= lam / 10``). Returns the stop time, or None."""
    dt = horizon / SLICES
    history = []  # (arrived, in system) at each slice's end
    for j in range(1, SLICES + 1):
        rep.run(min(horizon, j * dt))
        arrived = rep.arrived
        history.append((arrived, arrived - departed()))
        if j >= SLICES // 5 and len(history) > GROWING_SLICES:
            last = history[-GROWING_SLICES - 1:]
            grew = all(b[1] > a[1] for a, b in zip(last, last[1:]))
            growth = last[-1][1] - last[0][1]
            arrivals = last[-1][0] - last[0][0]
            if grew and growth >= 0.1 * arrivals and last[-1][1] > 2 * max_num_seqs and j < SLICES:
                return rep.now
    return None


def _horizon(horizon: float, req: dict) -> float:
    if horizon != math.inf:
        return horizon
    fin = req["finish_s"]
    return float(np.nanmax(fin)) if np.isfinite(fin).any() else 0.0


def request_columns(rows: list[Request], replica: int = 0, tier: bool = False) -> dict:
    """Request records (``llmqueue.records.schema.REQUEST_COLUMNS``) of engine requests: one pass
    over the requests per column, reading their fields natively in the compiled build; the
    columns made by :func:`~llmqueue.records.columns.request_record_columns`; with ``tier`` (a host KV
    tier is set) also ``kv_loaded_tokens``."""
    arrival = np.array([r.arrival_time for r in rows], dtype=np.float64)
    dispatch = np.array([r.dispatch_time for r in rows], dtype=np.float64)
    cols = request_record_columns(
        len(rows),
        request_id=[r.request_id for r in rows],
        class_=[r.class_name for r in rows],
        arrival_s=arrival,
        dispatched_s=np.where(np.isnan(dispatch), arrival, dispatch),
        first_scheduled_s=[r.first_scheduled_time for r in rows],
        first_token_s=[r.first_token_time for r in rows],
        finish_s=[r.finish_time for r in rows],
        prompt_tokens=[r.num_prompt_tokens for r in rows],
        output_tokens=[r.num_output_tokens for r in rows],
        cached_prompt_tokens=[max(r.num_cached_tokens, 0) for r in rows],
        status=[r.outcome for r in rows],
        preemptions=[r.num_preemptions for r in rows],
        replica=replica,
        attempt=[r.attempt for r in rows],
    )
    if tier:
        cols["kv_loaded_tokens"] = np.array([r.loaded_tokens for r in rows], dtype=np.int64)
    return cols


def with_seq(rows: list[Request], tier: bool = False) -> dict:
    """Request columns of ``rows`` (:func:`request_columns`) with their ``seq`` (for :func:`merge_by_seq`)."""
    return {**request_columns(rows, tier=tier), "seq": np.array([r.seq for r in rows], dtype=np.int64)}


def merge_by_seq(parts: list, fill: dict | None = None) -> dict:
    """Request columns from several parts (each with a ``seq`` column, taken out), in ``seq``
    order: each part's rows are scattered to their places, ``seq`` itself when the parts hold
    0..n-1 once each (a run's attempts, the common case), else its stable rank. A column named in
    ``fill`` holds its one value in every row (an int: int64; else an object column), whether
    the parts have it or not."""
    seqs = [p.pop("seq") for p in parts]
    n = sum(len(s) for s in seqs)
    at = seqs
    if not _dense(seqs, n):
        order = np.argsort(np.concatenate(seqs), kind="stable")
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        at = np.split(rank, np.cumsum([len(s) for s in seqs])[:-1])
    out = {}
    fill = fill or {}
    for name in parts[0]:
        if name in fill:
            continue
        cols = [np.asarray(p[name]) for p in parts]
        col = np.empty(n, dtype=np.result_type(*cols))
        for c, a in zip(cols, at):
            col[a] = c
        out[name] = col
    for name, v in fill.items():
        out[name] = np.full(n, v, dtype=np.int64 if isinstance(v, int) else object)
    return out


def _dense(seqs: list, n: int) -> bool:
    """Whether the ``seq`` arrays together hold each of 0..n-1 exactly once."""
    seen = np.zeros(n, dtype=bool)
    for s in seqs:
        if len(s) and (s.min() < 0 or s.max() >= n):
            return False
        seen[s] = True
    return bool(seen.all())

