"""``simulate()``: run a replica simulator over a request stream and collect its records."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llmqueue.engine.base import SimOptions
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

    ``reference=True`` uses the plain per-request stepper (slow; for verification).
    """
    from llmqueue.engine.reference import ReferenceReplica
    from llmqueue.engine.replica import Replica

    cls = ReferenceReplica if reference else Replica
    t0 = time.perf_counter()
    sim = cls(config, step_time, requests, options)
    sim.run()
    wall = time.perf_counter() - t0
    req = sim.request_columns()
    horizon = sim.horizon
    if horizon == float("inf"):
        import numpy as np

        fin = req["finish_s"]
        horizon = float(np.nanmax(fin)) if np.isfinite(fin).any() else 0.0
    return SimResult(requests=req, steps=sim.step_columns(), timeseries=sim.timeseries_columns(),
                     horizon_s=horizon, wall_s=wall, num_steps=sim.steps_taken,
                     stretches=getattr(sim, "stretches", 0), epoch_steps=getattr(sim, "epoch_steps", 0), reject_reasons=dict(sim.reject_reason),
                     capacity_tokens=config.capacity_tokens)
