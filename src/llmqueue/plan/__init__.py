"""Plan: load sweeps and SLO-bounded capacity search over simulated deployments.

- :func:`sweep` (:mod:`llmqueue.plan.sweep_run`): a grid of arrival rates x engine knobs, each point
  one simulation with its own seed, cached on disk; per-point summaries, latency-versus-load
  curves with their knee, the theory's capacity ``mu``, the simulated stability bracket and the
  SLO line.
- :func:`capacity_search` (:mod:`llmqueue.plan.capacity`): the highest arrival rate whose
  simulated percentiles meet SLO targets, confirmed at the answer and at +10%.
- :func:`judge` (:mod:`llmqueue.plan.slo_judge`): whether a run's summary meets SLO targets.
- Backends (:mod:`llmqueue.plan.backends`): ``serial``, ``local`` (process pool), ``ray``.
- Points (:mod:`llmqueue.plan.points`): the spec factories of :mod:`llmqueue.spec`
  (:func:`scenario_spec`, a scenario with knob overrides; ``build_spec``, the knobs alone), rate
  rescaling, keys and seeds.

Names are imported lazily.
"""

from __future__ import annotations

from llmqueue._lazy import lazy_exports

_EXPORTS = {
    "sweep": "sweep_run",
    "SweepResult": "sweep_run",
    "PointResult": "sweep_run",
    "run_points": "sweep_run",
    "make_grid": "sweep_run",
    "knee": "sweep_run",
    "capacity_search": "capacity",
    "CapacityResult": "capacity",
    "judge": "slo_judge",
    "slo_targets": "slo_judge",
    "scenario_slos": "slo_judge",
    "get_backend": "backends",
    "Backend": "backends",
    "SerialBackend": "backends",
    "LocalBackend": "backends",
    "RayBackend": "backends",
    "scenario_spec": "points",
    "build_spec": "points",
    "scale_arrival": "points",
    "point_key": "points",
    "derive_seed": "points",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ())
