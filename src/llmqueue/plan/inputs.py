"""Where a plan's step-time model ``b(P, D, C)`` and KV capacity ``M`` come from.

By default every configuration prices its steps with the roofline of the scenario's model on
that GPU and tensor-parallel size (assumed achieved fractions of peak: ``mfu`` 0.6, ``mbu`` 0.8)
and takes ``M`` from vLLM's KV arithmetic, so ``mu = M / (b E[g])`` and the simulation are
only as good as those assumptions. Two inputs replace them with a measurement:

- ``calibration`` (the file ``llmqueue calibrate`` writes): its linear step model
  ``step_time_linear`` (``c0 + c_prefill P + c_decode D + c_ctx C``, fitted on the server's steps;
  valid across batch sizes) or, without one, its constant ``b`` (measured at the calibrated
  server's own batch: other ``max_num_seqs`` values extrapolate), and its ``capacity_tokens``
  ``M`` (the server's KV blocks x block size);
- ``step_time``: any spec :func:`llmqueue.engine.step_time.parse_step_time` accepts
  (``0.0372``, ``linear:...``, ``fitted:FILE``, ...), ``M`` staying the catalog's.

**Rule.** A measured step model belongs to the one server it was measured on: one model on one
GPU type at one tensor-parallel size. A plan with either input therefore searches one model, one
GPU and one ``tp`` (``--models``, ``--gpus`` and ``--tp`` naming at most one model and exactly
one GPU and size, the measured ones); if the calibration file records its GPU (``gpu``), size
(``tensor_parallel_size``, also under ``engine``) or model (``model``), they must match. Anything else is refused in one line: pricing another GPU with this GPU's steps would
be a guess dressed as a measurement.

:func:`step_inputs` returns the scenario overrides (``step_time``, ``capacity_tokens``) that the
theory and every simulation of the plan use, and the sentence ``step_model_source`` that
``plan.json``, the table and the report print.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmqueue.errors import InputError


@dataclass
class StepInputs:
    """The overrides of the scenario's deployment (``step_time``, ``capacity_tokens``) and the
    sentence that says where the step model comes from."""

    overrides: dict = field(default_factory=dict)
    source: str = ""


def _absolute(spec: str) -> str:
    """``HEAD:PATH`` with a relative ``PATH`` that exists here made absolute (a worker process or
    the scenario's own directory would read it elsewhere)."""
    head, sep, rest = spec.partition(":")
    if sep and rest and not Path(rest).is_absolute() and Path(rest).expanduser().exists():
        return f"{head}:{Path(rest).expanduser().resolve()}"
    return spec


def _one_server(flag: str, gpus, tp, recorded_gpu=None, recorded_tp=None, models=(), recorded_model=None) -> None:
    """Refuse a space wider than the one server a measurement describes (see the module docstring)."""
    from llmqueue.hardware import get_gpu, get_model

    models = tuple(m for m in models if m)
    if len(models) > 1:
        raise InputError(flag, f"describes one model, but --models lists {len(models)} ({', '.join(models)})",
                         "give --models with the measured model alone, or drop --calibration/--step-time "
                         "(the roofline prices each model)")
    if recorded_model is not None and models:
        try:  # a served name the catalog does not know (an HF repo id) is not compared
            other = get_model(str(recorded_model)).name != get_model(models[0]).name
        except InputError:
            other = False
        if other:
            raise InputError(flag, f"was measured on model {recorded_model}, not {models[0]}",
                             f"give --models {recorded_model}")

    names = tuple(dict.fromkeys(get_gpu(g).name for g in gpus))
    if len(names) != 1 or len(tuple(tp)) != 1:
        what = f"{len(names)} GPU types" if len(names) != 1 else f"{len(tuple(tp))} tensor-parallel sizes"
        raise InputError(flag, f"is measured on one GPU at one tensor-parallel size, but the space has {what}",
                         "give --gpus with the measured GPU alone and --tp with its size (e.g. --gpus h100-sxm --tp 1)")
    if recorded_gpu is not None and get_gpu(str(recorded_gpu)).name != names[0]:
        raise InputError(flag, f"was measured on {recorded_gpu}, not {names[0]}", f"give --gpus {recorded_gpu}")
    if recorded_tp is not None and int(recorded_tp) != tuple(tp)[0]:
        raise InputError(flag, f"was measured at tensor_parallel_size {recorded_tp}, not {tuple(tp)[0]}",
                         f"give --tp {recorded_tp}")


def scenario_source(scenario: str, models=()) -> str:
    """The default source: the roofline (of each of ``models``, default the scenario's), or the
    scenario's own ``deployment.step_time``."""
    from llmqueue.engine.step_time import is_roofline
    from llmqueue.scenario.override import scenario_with

    d = scenario_with(scenario).scenario.deployment
    st = d.step_time
    names = ", ".join(m for m in models if m) or d.model
    if st is None or is_roofline(st):
        return (f"roofline of {names} on each GPU and tensor-parallel size (assumed mfu 0.6, mbu 0.8; not "
                "measured), KV capacity M from vLLM's arithmetic")
    return f"the scenario's deployment.step_time {st} (the same engine speed on every GPU of the space)"


def step_inputs(scenario: str, *, calibration=None, step_time=None, gpus=(), tp=(), models=()) -> StepInputs:
    """The plan's step model and ``M`` (see the module docstring); ``models``: the space's models."""
    from llmqueue.engine.step_time import is_roofline, parse_step_time

    if calibration is not None and step_time is not None:
        raise InputError("calibration", "give --calibration or --step-time, not both",
                         "the calibration carries its own step model")
    if calibration is not None:
        from llmqueue.bench.calibrate import load_calibration

        d = load_calibration(calibration)
        eng = d.get("engine") if isinstance(d.get("engine"), dict) else {}
        _one_server("calibration", gpus, tp, d.get("gpu") or eng.get("gpu"),
                    d.get("tensor_parallel_size") or eng.get("tensor_parallel_size"), models,
                    d.get("model") if isinstance(d.get("model"), str) else None)
        spec = d.get("step_time_linear") or d.get("step_time")
        which = "linear step model" if d.get("step_time_linear") else (
            "constant step b (no linear model in the file: measured at the calibrated server's batch)")
        parse_step_time(spec, field="calibration")
        out = {"step_time": str(spec)}
        M = d.get("capacity_tokens")
        if M is not None:
            out["capacity_tokens"] = float(M)
        msrc = f"M = {float(M):g} tokens measured" if M is not None else "M from vLLM's arithmetic (none measured)"
        return StepInputs(out, f"calibration {calibration}: {which} {spec}; {msrc}")
    if step_time is not None and not is_roofline(str(step_time)):
        spec = _absolute(str(step_time).strip())
        parse_step_time(spec, field="step_time")
        _one_server("step_time", gpus, tp, models=models)
        return StepInputs({"step_time": spec}, f"step-time {spec} (given); KV capacity M from vLLM's arithmetic")
    return StepInputs({}, scenario_source(scenario, models))
