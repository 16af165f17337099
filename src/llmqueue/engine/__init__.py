"""One serving replica simulated at step (iteration) granularity with vLLM v1's semantics.

- :class:`EngineConfig`: the knobs (vLLM's names).
- the nouns, one per module in vLLM v1's names: :mod:`request` (``Request``), :mod:`request_queue`,
  :mod:`policies` (ordering and preemption-victim objects), :mod:`kv_cache_manager`,
  :mod:`scheduler` (``Scheduler.schedule() -> SchedulerOutput``), :mod:`output` (``SchedulerOutput``,
  ``Composition``), :mod:`stream`, :mod:`admission`.
- :mod:`step_time`: the step-time protocol and its models (constant, linear, roofline, fitted;
  noise and drift as wrappers); :mod:`pricing`: a step's duration (``StepPricer``).
- :class:`~llmqueue.engine.reference.ReferenceReplica`: the executable specification, built from
  the nouns; :mod:`llmqueue.engine.fast`: the fast replica, built from their twins in the same
  names (``Replica``, ``Scheduler``, ``DecoderPool``, ``BlockLedger``), tested for equal records.
  Both keep the replica contract (:mod:`api`) on a shared clock.
- :func:`simulate`: run either on a request stream and return the records.

Names are imported lazily (a policy's or a step-time form's name does not load the replica).
"""

from llmqueue._lazy import lazy_exports

_EXPORTS = {"EngineConfig": "config", "SimResult": "run", "simulate": "run", "StepTimeModel": "step_time",
            "parse_step_time": "step_time", "roofline_model": "step_time"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ())
