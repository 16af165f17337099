"""``simulate()``: run a replica simulator over a request stream and collect its records."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from llmqueue.engine.base import STEP_FIELDS, TS_FIELDS, SimOptions
from llmqueue.engine.config import EngineConfig


@dataclass
class SimResult:
    """Columns of the request, step and time-series records (``llmqueue.records.schema``), plus
    run facts: ``horizon_s`` (end of the simulated window), ``wall_s``, ``steps`` (engine steps
    taken), ``stretches`` (decode stretches the fast path jumped), ``reject_reasons``."""

    requests: dict
    steps: dict
    timeseries: dict
    horizon_s: float
    wall_s: float
    num_steps: int
    stretches: int = 0
    epoch_steps: int = 0
    reject_reasons: dict = field(default_factory=dict)
    capacity_tokens: int = 0


def simulate(config: EngineConfig, step_time, requests, *, options: SimOptions | None = None,
             reference: bool = False) -> SimResult:
    """Simulate one replica serving ``requests`` (a ``RequestArrays``-like object with
    ``request_id, arrival_s, prompt_tokens, output_tokens, class_name``).

    ``reference=True`` runs the reference replica built from the engine's nouns
    (:class:`~llmqueue.engine.reference.ReferenceReplica`; slow; for verification).
    """
    if reference:
        return simulate_reference(config, step_time, requests, options=options)
    from llmqueue.engine.replica import Replica

    t0 = time.perf_counter()
    sim = Replica(config, step_time, requests, options)
    sim.run()
    wall = time.perf_counter() - t0
    req = sim.request_columns()
    return SimResult(requests=req, steps=sim.step_columns(), timeseries=sim.timeseries_columns(),
                     horizon_s=_horizon(sim.horizon, req), wall_s=wall, num_steps=sim.steps_taken,
                     stretches=sim.stretches, epoch_steps=sim.epoch_steps, reject_reasons=dict(sim.reject_reason),
                     capacity_tokens=config.capacity_tokens)


def _horizon(horizon: float, req: dict) -> float:
    if horizon != math.inf:
        return horizon
    fin = req["finish_s"]
    return float(np.nanmax(fin)) if np.isfinite(fin).any() else 0.0


def engine_requests(config: EngineConfig, requests, options: SimOptions):
    """The stream as engine :class:`~llmqueue.engine.request.Request` objects, ``seq`` = position."""
    from llmqueue.engine.request import Request

    n = len(requests)
    cls = requests.class_name
    names = [str(c) for c in cls] if not isinstance(cls, str) else [cls] * n
    prio = config.class_priority
    pred = options.predicted_output
    hashes = options.hash_ids if config.enable_prefix_caching else None
    if hashes is not None and len(hashes) != n:
        from llmqueue.errors import InputError

        raise InputError("hash_ids", f"{len(hashes)} hash lists for {n} requests")
    out = []
    for i, (rid, a, s, o) in enumerate(zip(requests.request_id.tolist(), np.asarray(requests.arrival_s).tolist(),
                                           requests.prompt_tokens.tolist(), requests.output_tokens.tolist())):
        h = hashes[i] if hashes is not None else None
        out.append(Request(int(rid), float(a), int(s), int(o), class_name=names[i], priority=int(prio.get(names[i], 0)),
                           hash_ids=tuple(int(x) for x in h) if h is not None and len(h) else None,
                           predicted_output_tokens=float(pred[i]) if pred is not None else None, seq=i))
    return out


def simulate_reference(config: EngineConfig, step_time, requests, *, options: SimOptions | None = None) -> SimResult:
    """The reference replica on a whole stream: every request submitted, run to the horizon."""
    from llmqueue.engine.reference import ReferenceReplica
    from llmqueue.engine.request import Request

    opt = options or SimOptions()
    t0 = time.perf_counter()
    reqs = engine_requests(config, requests, opt)
    n = len(reqs)
    done: list = []
    steps: list = []
    samples: list = []
    retry = opt.retry

    def on_finish(r):
        done.append(r)
        if r.outcome != "ok" and retry is not None:
            t_next = retry(r.request_id, r.attempt, r.outcome, r.finish_time)
            if t_next is not None:
                a = Request(r.request_id, float(t_next), r.num_prompt_tokens, r.max_tokens, class_name=r.class_name,
                            priority=r.priority, attempt=r.attempt + 1, hash_ids=r.hash_ids,
                            predicted_output_tokens=r.predicted_output_tokens, seq=n + len(retries))
                retries.append(a)
                rep.submit(a)

    retries: list = []
    rep = ReferenceReplica(config, step_time, seed=opt.seed, hash_block_tokens=opt.hash_block_tokens,
                           timeout_s=opt.timeout_s, ttft_timeout_s=opt.ttft_timeout_s, on_finish=on_finish,
                           on_step=steps.append, on_sample=samples.append, sample_dt=opt.sample_dt)
    for r in reqs:
        rep.submit(r)
    horizon = opt.horizon_s if opt.horizon_s is not None else math.inf
    rep.run(horizon)
    for r in rep.in_system():
        r.outcome = "unfinished"
    rows = sorted([*done, *rep.in_system()], key=lambda r: r.seq)
    req = request_columns(rows)
    wall = time.perf_counter() - t0
    return SimResult(requests=req, steps=_columns(steps, STEP_FIELDS, ("start_s", "duration_s")),
                     timeseries=_columns(samples, TS_FIELDS, ("t_s",)), horizon_s=_horizon(horizon, req),
                     wall_s=wall, num_steps=rep.steps_taken,
                     reject_reasons={r.seq: r.reason for r in rows if r.reason},
                     capacity_tokens=config.capacity_tokens)


def request_columns(rows, replica: int = 0) -> dict:
    """Request records (``llmqueue.records.schema.REQUEST_COLUMNS``) of engine requests."""
    f = np.asarray
    return {
        "request_id": f([r.request_id for r in rows], dtype=np.int64),
        "class": f([r.class_name for r in rows], dtype=object),
        "arrival_s": f([r.arrival_time for r in rows], dtype=np.float64),
        "dispatched_s": f([r.arrival_time for r in rows], dtype=np.float64),
        "first_scheduled_s": f([r.first_scheduled_time for r in rows], dtype=np.float64),
        "first_token_s": f([r.first_token_time for r in rows], dtype=np.float64),
        "finish_s": f([r.finish_time for r in rows], dtype=np.float64),
        "prompt_tokens": f([r.num_prompt_tokens for r in rows], dtype=np.int64),
        "output_tokens": f([r.num_output_tokens for r in rows], dtype=np.int64),
        "cached_prompt_tokens": f([max(r.num_cached_tokens, 0) for r in rows], dtype=np.int64),
        "status": f([r.outcome for r in rows], dtype=object),
        "preemptions": f([r.num_preemptions for r in rows], dtype=np.int64),
        "replica": np.full(len(rows), replica, dtype=np.int64),
        "attempt": f([r.attempt for r in rows], dtype=np.int64),
    }


def _columns(rows: list, names: tuple, float_names: tuple) -> dict:
    cols = list(zip(*rows)) if rows else [()] * len(names)
    out = {name: np.asarray(col, dtype=np.float64 if name in float_names else np.int64) for name, col in zip(names, cols)}
    out["replica"] = np.zeros(len(rows), dtype=np.int64)
    return out
