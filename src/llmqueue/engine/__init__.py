"""One serving replica simulated at step (iteration) granularity with vLLM v1's semantics.

- :class:`EngineConfig`: the knobs (vLLM's names).
- :mod:`step_time`: how long a step takes (constant, linear, roofline, fitted; optional noise).
- :class:`Replica`: the fast simulator; :class:`ReferenceReplica`: the plain stepper it is tested against.
- :func:`simulate`: run either on a request stream and return the records.
"""

from llmqueue.engine.config import EngineConfig
from llmqueue.engine.run import SimResult, simulate
from llmqueue.engine.step_time import StepTimeModel, parse_step_time, roofline_model

__all__ = ["EngineConfig", "SimResult", "StepTimeModel", "parse_step_time", "roofline_model", "simulate"]
