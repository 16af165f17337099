"""The scenario file's schema: pydantic v2 models, one per YAML section.

A scenario is one YAML file with four sections (``workload``, ``deployment`` and ``run`` are
required, ``slos`` optional; ``name`` and ``description`` are free text)::

    workload:            # what arrives
      arrival: poisson:5               # total arrival process (spec), or
      trace: {path: t.csv, ...}        # a recorded trace to replay instead
      prompt: lognormal:mean=1000:sd=600:max=8192   # lengths (defaults for every class)
      output: uniform:10:600           # or lengths: joint:FILE (prompt/output pairs)
      client: {timeout_s: 60, ttft_timeout_s: 10, patience: exp:30, retry: {max_attempts: 3, ...}}
      classes:                         # optional; without it one class "default" takes it all
        - {name: chat, share: 0.8, priority: 0}
        - {name: batch, arrival: poisson:0.5, prompt: fixed:3000, output: fixed:500, priority: 1}
    deployment:          # how it is served (vLLM's knob names)
      model: llama-3.1-8b   gpu: h100-sxm   tensor_parallel_size: 1   replicas: 1
      max_num_seqs: 256   max_num_batched_tokens: 8192   block_size: 16
      gpu_memory_utilization: 0.9   enable_chunked_prefill: true   ...
      step_time: roofline   capacity_tokens: 131000   # simulator knobs
    slos:                # latency targets (milliseconds), for every class or per class
      ttft_ms: {p99: 2000}
      tpot_ms: {p99: 50}
      per_class: {batch: {e2el_ms: {p99: 600000}}}
    run:
      duration_s: 600     # or num_requests: 10000
      seed: 0
      warmup_s: 60

Validation is strict: unknown keys are errors (with a did-you-mean), every spec is parsed by
the workload layer, model and GPU names are looked up in the hardware catalog, and the KV
capacity ``M`` is computed. Errors are raised inside the models as ``_Problem`` (a location
relative to the model plus problem and fix); :mod:`llmqueue.scenario.load` turns pydantic's
error list into one :class:`~llmqueue.errors.InputError` naming the full field path, e.g.
``deployment.max_num_seqs: must be >= 1 (got 0)``.

Relative paths (``empirical:FILE``, ``joint:FILE``, ``trace.path``, a ``config.json`` model, a
``fitted:FILE`` step time) resolve against the scenario file's directory, passed as the
validation context ``{"base_dir": ...}``.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from llmqueue._schema import Float, Int, _clean_name, _Problem, _Section
from llmqueue.cluster.spec import Autoscaler, Disaggregation, Fault, Gateway, Lane
from llmqueue.errors import InputError, LlmqueueError
from llmqueue.scenario.fleet import PoolConfig


def _base(info: ValidationInfo) -> Path | None:
    """The folder relative paths in the file resolve against (the validation context's ``base_dir``)."""
    ctx = info.context or {}
    b = ctx.get("base_dir")
    return Path(b) if b is not None else None


# --- spec fields ---------------------------------------------------------------------------------

def _with_base(spec, base: Path | None, field: str, kind: str):
    """Rewrite a relative file path inside an ``empirical:``/``joint:`` spec against ``base``."""
    if base is None or not isinstance(spec, str):
        return spec
    name = spec.strip().partition(":")[0].strip().lower()
    from llmqueue.workload.parse import JOINT_FORMS, LENGTH_FORMS
    from llmqueue.workload.spec import split_spec

    if kind == "length" and name == "empirical":
        form, v = split_spec(spec, field, LENGTH_FORMS, "length distribution")
    elif kind == "joint" and name == "joint":
        form, v = split_spec(spec, field, JOINT_FORMS, "joint length source")
    else:
        return spec
    p = Path(v["path"]).expanduser()
    if p.is_absolute():
        return spec
    return ":".join([form.name, str(base / p)] + [f"{k}={x}" for k, x in v.items() if k != "path"])


def _length(cls, value, info: ValidationInfo):
    if value is None:
        return None
    from llmqueue.workload.parse import parse_length

    try:
        return parse_length(_with_base(value, _base(info), info.field_name, "length"), info.field_name)
    except LlmqueueError as e:
        raise _Problem.of(e) from None


def _joint(cls, value, info: ValidationInfo):
    if value is None:
        return None
    from llmqueue.workload.parse import parse_joint

    try:
        return parse_joint(_with_base(value, _base(info), "lengths", "joint"), "lengths")
    except LlmqueueError as e:
        raise _Problem.of(e) from None


def _arrival(cls, value, info: ValidationInfo):
    if value is None:
        return None
    from llmqueue.workload.parse import parse_arrival

    try:
        return parse_arrival(value, info.field_name)
    except LlmqueueError as e:
        raise _Problem.of(e) from None


# --- client behaviour ----------------------------------------------------------------------------

class RetryConfig(_Section):
    """``retry:`` of a client (see :class:`llmqueue.workload.client.RetryPolicy`, whose defaults
    apply to the keys left out)."""

    max_attempts: Int | None = None
    retry_on: Any = None
    backoff_s: Float | None = None
    multiplier: Float | None = None
    cap_s: Float | None = None
    jitter: Float | None = None
    _policy: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _build(self):
        from llmqueue.workload.client import RetryPolicy

        given = {k: getattr(self, k) for k in type(self).model_fields if getattr(self, k) is not None}
        try:
            self._policy = RetryPolicy(**given)
        except InputError as e:
            raise _Problem.of(e, (e.field,) if e.field in type(self).model_fields else ()) from None
        return self

    @property
    def policy(self):
        return self._policy


class ClientConfig(_Section):
    """``client:`` (see :class:`llmqueue.workload.client.ClientBehavior`)."""

    timeout_s: Float | None = None
    ttft_timeout_s: Float | None = None
    patience: str | Float | None = None
    retry: RetryConfig | None = None
    _behavior: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _build(self):
        from llmqueue.workload.client import ClientBehavior, RetryPolicy

        try:
            self._behavior = ClientBehavior(self.timeout_s, self.ttft_timeout_s,
                                            self.retry.policy if self.retry is not None else RetryPolicy(),
                                            patience=self.patience)
        except InputError as e:
            raise _Problem.of(e, (e.field,) if e.field in type(self).model_fields else ()) from None
        return self

    @property
    def behavior(self):
        return self._behavior


# --- workload ------------------------------------------------------------------------------------

class TraceConfig(_Section):
    """``workload.trace:`` replay a recorded trace (loaded by :mod:`llmqueue.workload.traces`).

    ``path`` (relative to the scenario file), ``format`` (detected when absent), ``mapping``
    (column roles for plain tables), ``time_unit``, ``spread_ties``, ``drop_bad`` as
    :func:`~llmqueue.workload.traces.load_trace` takes them; then the replay transforms:
    ``start_s``/``end_s`` (a window of the trace, rebased to 0), ``time_scale`` (multiply the
    times: 0.5 doubles the rate) or ``rate`` (rescale to this mean rate, req/s), and ``loop``
    (repeat the trace to fill ``run.duration_s``). The trace's own lengths are used unless the
    workload or a class gives prompt/output lengths.
    """

    path: str
    format: str | None = None
    mapping: Any = None
    time_unit: str | None = None
    spread_ties: bool = False
    drop_bad: bool = False
    start_s: Float = Field(0.0, ge=0)
    end_s: Float | None = Field(None, gt=0)
    time_scale: Float | None = Field(None, gt=0)
    rate: Float | None = Field(None, gt=0)
    loop: bool = False

    @field_validator("path")
    @classmethod
    def _path(cls, v: str, info: ValidationInfo):
        p = Path(v).expanduser()
        base = _base(info)
        if not p.is_absolute() and base is not None:
            p = base / p
        if not p.is_file():
            raise _Problem((), f"no such trace file {str(p)!r}",
                           "paths are relative to the scenario file's directory")
        return str(p)

    @field_validator("format")
    @classmethod
    def _format(cls, v):
        from llmqueue.workload.traces import FORMATS

        if v is not None and v not in FORMATS:
            raise _Problem((), f"unknown trace format {v!r}", f"choose one of: {', '.join(FORMATS)}")
        return v

    @field_validator("mapping")
    @classmethod
    def _mapping(cls, v):
        from llmqueue.workload.traces import parse_mapping

        if v is not None:
            try:
                parse_mapping(v)
            except LlmqueueError as e:
                raise _Problem.of(e) from None
        return v

    @field_validator("time_unit")
    @classmethod
    def _unit(cls, v):
        from llmqueue.workload.traces import TIME_UNITS

        if v is not None and v not in TIME_UNITS:
            raise _Problem((), f"unknown time unit {v!r}", f"choose one of: {', '.join(TIME_UNITS)}")
        return v

    @model_validator(mode="after")
    def _check(self):
        if self.time_scale is not None and self.rate is not None:
            raise _Problem(("rate",), "give time_scale or rate, not both")
        if self.end_s is not None and self.end_s <= self.start_s:
            raise _Problem(("end_s",), f"must be after start_s (got {self.start_s:g}..{self.end_s:g})")
        return self


class ClassConfig(_Section):
    """One entry of ``workload.classes`` (see :class:`llmqueue.workload.classes.RequestClass`)."""

    name: str
    share: Float | None = None
    arrival: Any = None
    prompt: Any = None
    output: Any = None
    lengths: Any = None
    priority: Int = 0
    client: ClientConfig | None = None
    max_waiting: Int | None = Field(None, ge=1)       # admission control: reject beyond this many waiting
    max_queue_time_s: Float | None = Field(None, gt=0)  # shed requests that waited longer before starting

    check_arrival = field_validator("arrival")(_arrival)
    check_lengths = field_validator("prompt", "output")(_length)
    check_joint = field_validator("lengths")(_joint)

    check_name = field_validator("name")(_clean_name)


class WorkloadConfig(_Section):
    """``workload:`` arrivals (``arrival`` or ``trace``), default lengths and client, classes."""

    arrival: Any = None
    trace: TraceConfig | None = None
    prompt: Any = None
    output: Any = None
    lengths: Any = None
    client: ClientConfig | None = None
    classes: list[ClassConfig] | None = None

    check_arrival = field_validator("arrival")(_arrival)
    check_lengths = field_validator("prompt", "output")(_length)
    check_joint = field_validator("lengths")(_joint)

    @model_validator(mode="after")
    def _check(self):
        if self.arrival is not None and self.trace is not None:
            raise _Problem(("trace",), "give arrival (a process) or trace (a file to replay), not both")
        if self.lengths is not None and (self.prompt is not None or self.output is not None):
            raise _Problem(("lengths",), "give prompt and output, or lengths (joint pairs), not both")
        if (self.prompt is None) != (self.output is None):
            missing = "prompt" if self.prompt is None else "output"
            raise _Problem((missing,), "is missing: give both prompt and output, or lengths (joint pairs)")
        classes = self.classes or []
        if self.classes is not None and not classes:
            raise _Problem(("classes",), "is empty", "list at least one class, or remove the key")
        seen: dict[str, int] = {}
        for i, c in enumerate(classes):
            if c.name in seen:
                raise _Problem(("classes", i, "name"), f"{c.name!r} is also the name of classes[{seen[c.name]}]",
                               "class names must be unique")
            seen[c.name] = i
        has_total = self.arrival is not None or self.trace is not None
        if not classes:
            if not has_total:
                raise _Problem(("arrival",), "is required (or a trace to replay)", "e.g. arrival: poisson:5")
            if self.trace is None and self.prompt is None and self.lengths is None:
                raise _Problem(("prompt",), "lengths are required: give prompt and output, or lengths (joint pairs)",
                               "e.g. prompt: uniform:10:1600 and output: uniform:10:1600")
            return self
        sharers = [i for i, c in enumerate(classes) if c.share is not None]
        if sharers and not has_total:
            i = sharers[0]
            raise _Problem(("arrival",), f"is required: classes[{i}] ({classes[i].name!r}) takes a share of it",
                           "give arrival (e.g. poisson:5) or a trace, or give each class its own arrival")
        if has_total and not sharers:
            which = "trace" if self.trace is not None else "arrival"
            raise _Problem((which,), "no class takes a share of it",
                           "give some classes a share, or remove it and keep the classes' own arrivals")
        if sharers:
            total = math.fsum(classes[i].share for i in sharers)
            if abs(total - 1.0) > 1e-6:
                listed = ", ".join(f"{classes[i].name}={classes[i].share:g}" for i in sharers)
                raise _Problem(("classes",), f"shares sum to {total:.6g}, not 1 ({listed})",
                               "make the shares of the total arrival process add up to 1")
        return self


# --- deployment ----------------------------------------------------------------------------------

def _knob_fields(section: str) -> dict:
    """The pydantic fields of a section, from the knob table (:mod:`llmqueue.knobs`): each
    knob's type, default, bounds and help, under the name the file uses."""
    from typing import Optional

    from pydantic import create_model

    from llmqueue.knobs import scenario_fields

    types = {int: Int, float: Float, bool: bool, str: str, object: Any}
    fields = {}
    for k in scenario_fields(section):
        ann = types[k.type]
        if k.default is None and k.type is not object:
            ann = Optional[ann]
        desc = k.help + (f" ({k.unit})" if k.unit else "")
        fields[k.scenario_field[1]] = (ann, Field(k.default, ge=k.ge, gt=k.gt, le=k.le, description=desc))
    return create_model(f"_{section.title()}Knobs", __base__=_Section, __module__=__name__, **fields)


class DeploymentConfig(_knob_fields("deployment")):
    """``deployment:`` the model, GPUs, vLLM engine knobs and simulator knobs.

    The fields, their defaults and bounds are the knob table's (:data:`llmqueue.knobs.KNOBS`):
    vLLM's names and, where vLLM v1 has one for the OpenAI server, its defaults; ``None`` means
    "derived" (``max_model_len``: the model's context length; 0: no limit). ``scheduling_policy``:
    one of :data:`~llmqueue.engine.policies.ORDERINGS`. ``preemption_mode``: only ``recompute``
    (vLLM v1's only mode); the victim is vLLM's for the policy
    (:func:`~llmqueue.engine.policies.default_victim`). Simulator knobs: ``step_time`` (a spec of
    one of :data:`~llmqueue.engine.step_time.FORMS`, the roofline of the model and GPU by default),
    ``capacity_tokens`` (overrides the KV capacity ``M``), ``max_waiting`` and
    ``max_queue_time_s`` (admission control: 0 = off). ``kv_cache_dtype`` and ``dtype``
    (weights) enter ``M``.

    A fleet (:mod:`llmqueue.scenario.fleet`): ``pools`` (each with the engine knobs that differ
    from these), ``lanes``, ``disaggregation``, ``gateway``, ``autoscalers``, ``faults``.
    """

    pools: list[PoolConfig] | None = None
    lanes: list[Lane] | None = None
    disaggregation: Disaggregation | None = None
    gateway: Gateway | None = None
    autoscalers: list[Autoscaler] | None = None
    faults: list[Fault] | None = None

    _model: Any = PrivateAttr(default=None)
    _gpu: Any = PrivateAttr(default=None)
    _capacity: Any = PrivateAttr(default=None)
    _step_time: Any = PrivateAttr(default=None)
    _max_model_len: int | None = PrivateAttr(default=None)
    _notes: list = PrivateAttr(default_factory=list)
    _pool_deployments: list = PrivateAttr(default_factory=list)

    @field_validator("model")
    @classmethod
    def _model_name(cls, v, info: ValidationInfo):
        if v is None:
            return v
        from llmqueue.hardware import get_model

        s = v.strip()
        base = _base(info)
        p = Path(s).expanduser()
        if base is not None and not p.is_absolute() and (s.lower().endswith(".json") or (base / p).exists()):
            s = str(base / p)
        try:
            get_model(s)
        except LlmqueueError as e:
            raise _Problem.of(e) from None
        return s

    @field_validator("gpu")
    @classmethod
    def _gpu_name(cls, v):
        if v is None:
            return v
        from llmqueue.hardware import get_gpu

        try:
            return get_gpu(v).name
        except LlmqueueError as e:
            raise _Problem.of(e) from None

    @field_validator("scheduling_policy")
    @classmethod
    def _policy(cls, v):
        from llmqueue.engine.policies import ORDERINGS

        if v not in ORDERINGS:
            raise _Problem((), f"unknown scheduling policy {v!r}", f"choose one of: {', '.join(ORDERINGS)}")
        return v

    @field_validator("preemption_mode")
    @classmethod
    def _preemption(cls, v):
        if v != "recompute":
            why = "swap is not modelled (vLLM v1 removed it)" if v == "swap" else f"unknown preemption mode {v!r}"
            raise _Problem((), why, "use recompute")
        return v

    @field_validator("kv_cache_dtype", "dtype")
    @classmethod
    def _dtype(cls, v, info: ValidationInfo):
        from llmqueue.hardware import resolve_dtype

        try:
            resolve_dtype(v, None, field=info.field_name, kv=info.field_name == "kv_cache_dtype")
        except LlmqueueError as e:
            raise _Problem.of(e) from None
        return v

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo):
        from llmqueue.hardware import get_model, kv_capacity

        notes = self._notes
        if self.model is None and self.capacity_tokens is None:
            raise _Problem((), "needs model and gpu (the KV capacity M is computed) or capacity_tokens "
                           "(M given directly)", "e.g. model: llama-3.1-8b and gpu: h100-sxm")
        if self.model is not None:
            self._model = get_model(self.model)
            if self.gpu is None and self.capacity_tokens is None:
                raise _Problem(("gpu",), "is required with model, to compute the KV capacity M",
                               "e.g. gpu: h100-sxm (llmqueue kv --list shows the catalog), or give capacity_tokens")
        if self.gpu is not None:
            from llmqueue.hardware import get_gpu

            self._gpu = get_gpu(self.gpu)
        if self.model is not None and self.gpu is not None:
            names = {"kv_dtype": "kv_cache_dtype", "weight_dtype": "dtype"}
            try:
                self._capacity = kv_capacity(self._model, self._gpu, tensor_parallel_size=self.tensor_parallel_size,
                                             pipeline_parallel_size=self.pipeline_parallel_size,
                                             gpu_memory_utilization=self.gpu_memory_utilization,
                                             block_size=self.block_size, kv_dtype=self.kv_cache_dtype,
                                             weight_dtype=self.dtype)
            except InputError as e:
                f = names.get(e.field, e.field)
                raise _Problem.of(e, (f,) if f in type(self).model_fields else ()) from None
        elif self.gpu is not None:
            notes.append("deployment.gpu is unused without a model (capacity_tokens gives M)")
        M = self.M

        # max_model_len, as vLLM checks it at start-up
        mml = self.max_model_len
        if self._model is not None and mml is not None and mml > self._model.max_model_len:
            raise _Problem(("max_model_len",), f"{mml} exceeds {self._model.name}'s context length "
                           f"{self._model.max_model_len} (max_position_embeddings)",
                           f"use max_model_len <= {self._model.max_model_len}")
        if mml == 0:  # no limit
            eff = None
        else:
            eff = mml if mml is not None else (self._model.max_model_len if self._model is not None else None)
        self._max_model_len = eff
        if eff is not None and M < eff:
            msg = (f"the KV cache holds {M:,} tokens, fewer than max_model_len {eff:,}; vLLM refuses to "
                   "start (one request of max_model_len tokens must fit)")
            if mml:
                raise _Problem(("max_model_len",), msg, f"use max_model_len <= {M}, or more KV memory")
            notes.append(f"deployment: {msg}; set max_model_len")
        if not self.enable_chunked_prefill and eff is not None and self.max_num_batched_tokens < eff:
            raise _Problem(("max_num_batched_tokens",),
                           f"{self.max_num_batched_tokens} is below max_model_len {eff} with chunked prefill "
                           "off: a long prompt could never be scheduled (vLLM refuses to start)",
                           "raise it, lower max_model_len, or enable_chunked_prefill: true")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise _Problem(("max_num_batched_tokens",),
                           f"{self.max_num_batched_tokens} is below max_num_seqs {self.max_num_seqs} "
                           "(vLLM refuses to start)", f"use max_num_batched_tokens >= {self.max_num_seqs}")

        # step time
        st = self.step_time
        if st is None:
            if self._model is not None and self._gpu is not None:
                from llmqueue.engine.step_time import ROOFLINE

                st = ROOFLINE
                notes.append("deployment.step_time not given: using the roofline model of the model and GPU "
                             "(an estimate; calibrate for numbers you rely on)")
            else:
                raise _Problem(("step_time",), "is required without a model and GPU to estimate it from",
                               "e.g. step_time: 0.0372 (seconds per step) or linear:c0=0.01:decode=1e-4")
        self._step_time = self._parse_step_time(st, _base(info))
        return self

    @model_validator(mode="after")
    def _pools(self, info: ValidationInfo):
        from llmqueue.scenario.fleet import resolve_pools

        self._pool_deployments = resolve_pools(self, info)
        return self

    def _parse_step_time(self, st, base: Path | None):
        from llmqueue.engine.step_time import ROOFLINE, is_roofline, parse_step_time, roofline_model, with_base

        if is_roofline(st):
            if self._model is None or self._gpu is None:
                raise _Problem(("step_time",), f"{ROOFLINE} needs model and gpu", "give both, or a step-time spec")
            try:
                return roofline_model(self._model, self._gpu, tensor_parallel_size=self.tensor_parallel_size,
                                      pipeline_parallel_size=self.pipeline_parallel_size)
            except LlmqueueError as e:
                raise _Problem.of(e, ("step_time",)) from None
        if base is not None:
            st = with_base(st, base)
        try:
            return parse_step_time(st, field="step_time")
        except LlmqueueError as e:
            raise _Problem.of(e, ("step_time",)) from None

    @property
    def M(self) -> int:
        """KV capacity of one replica in tokens: ``capacity_tokens`` if given, else from the hardware."""
        if self.capacity_tokens is not None:
            return int(self.capacity_tokens)
        return int(self._capacity.M)

    @property
    def capacity(self):
        """The hardware module's :class:`~llmqueue.hardware.KvCapacity` (None without model and gpu)."""
        return self._capacity

    @property
    def effective_max_model_len(self) -> int | None:
        return self._max_model_len

    @property
    def step_time_model(self):
        return self._step_time

    @property
    def pool_deployments(self) -> list:
        """Each pool's deployment (this one's knobs with the pool's own), in ``pools`` order."""
        return list(self._pool_deployments)


# --- SLOs ----------------------------------------------------------------------------------------

_PCT = re.compile(r"p(\d+(?:\.\d+)?)\Z")


class SloTargets(_Section):
    """Targets per metric as ``{pNN: milliseconds}`` under the metric's name with its unit, e.g.
    ``ttft_ms: {p99: 2000}`` (p99 TTFT <= 2 s), as the command line's ``--slo-ttft-ms``. The bare
    metric name (``ttft: {p99: 2.0}``) takes seconds: the older spelling, still read."""

    ttft_ms: dict[str, Float] | None = None
    tpot_ms: dict[str, Float] | None = None
    itl_ms: dict[str, Float] | None = None
    e2el_ms: dict[str, Float] | None = None
    ttft: dict[str, Float] | None = None
    tpot: dict[str, Float] | None = None
    itl: dict[str, Float] | None = None
    e2el: dict[str, Float] | None = None

    def slos(self) -> dict[str, tuple]:
        """``{metric: (SLO, ...)}`` for the metrics given."""
        from llmqueue.workload.classes import SLO

        out = {}
        for metric in ("ttft", "tpot", "itl", "e2el"):
            ms, sec = getattr(self, f"{metric}_ms"), getattr(self, metric)
            if ms is not None and sec is not None:
                raise _Problem((metric,), f"is given twice ({metric}_ms in milliseconds and {metric} in seconds)",
                               f"keep {metric}_ms")
            targets, field, scale = (ms, f"{metric}_ms", 1e-3) if ms is not None else (sec, metric, 1.0)
            if targets is None:
                continue
            items = []
            for key, v in targets.items():
                m = _PCT.match(str(key))
                if not m:
                    raise _Problem((field, key), "is not a percentile key", "write p50, p90, p99 or p99.9")
                try:
                    items.append(SLO(metric, float(m.group(1)), v * scale))
                except InputError as e:
                    raise _Problem.of(e, (field, key)) from None
            out[metric] = tuple(items)
        return out

    @model_validator(mode="after")
    def _check(self):
        self.slos()
        return self


class SlosConfig(SloTargets):
    """``slos:`` targets for every class, and ``per_class`` overrides (a class's targets for a
    metric replace the global ones for that metric)."""

    per_class: dict[str, SloTargets] | None = None


# --- run -----------------------------------------------------------------------------------------

class RunConfig(_knob_fields("run")):
    """``run:`` how long (``duration_s`` or ``num_requests``), ``seed``, ``warmup_s`` (excluded
    from the summary statistics); fields from the knob table (:data:`llmqueue.knobs.KNOBS`)."""

    @model_validator(mode="after")
    def _check(self):
        if (self.duration_s is None) == (self.num_requests is None):
            raise _Problem(("duration_s",), "give exactly one of duration_s and num_requests",
                           "e.g. duration_s: 600")
        if self.duration_s is not None and self.warmup_s >= self.duration_s:
            raise _Problem(("warmup_s",), f"must be shorter than duration_s (got {self.warmup_s:g} >= "
                           f"{self.duration_s:g})")
        return self


# --- the whole file ------------------------------------------------------------------------------

class Scenario(_Section):
    """One scenario file, validated and resolved (see the module docstring for the schema).

    Beyond the sections: ``mix`` (:class:`~llmqueue.workload.classes.ClassMix`, every class with
    its SLOs and client), ``M`` (KV capacity per replica), ``notes`` (warnings that are not
    errors), ``source`` (the file), and the helpers in :mod:`llmqueue.scenario.load`.
    """

    name: str | None = None
    description: str | None = None
    workload: WorkloadConfig
    deployment: DeploymentConfig
    slos: SlosConfig | None = None
    run: RunConfig

    _mix: Any = PrivateAttr(default=None)
    _notes: list = PrivateAttr(default_factory=list)
    _source: Any = PrivateAttr(default=None)
    _fleet: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo):
        from llmqueue.workload.classes import ClassMix, RequestClass
        from llmqueue.workload.client import ClientBehavior

        self._source = (info.context or {}).get("source")
        w = self.workload
        default_client = w.client.behavior if w.client is not None else ClientBehavior()
        specs = w.classes or [ClassConfig(name="default", share=1.0)]
        names = [c.name for c in specs]
        slos = self._class_slos(names)
        classes = []
        field_of = {"joint": "lengths", "class_name": "name"}
        for i, c in enumerate(specs):
            lengths = dict(prompt=c.prompt, output=c.output, joint=c.lengths)
            if c.prompt is None and c.lengths is None:
                lengths = dict(prompt=w.prompt, output=w.output, joint=w.lengths)
            where = ("workload", "classes", i) if w.classes else ("workload",)
            try:
                classes.append(RequestClass(
                    c.name, share=c.share, arrival=c.arrival, priority=c.priority, slos=slos[c.name],
                    client=c.client.behavior if c.client is not None else default_client, **lengths))
            except InputError as e:
                f = field_of.get(e.field, e.field)
                raise _Problem.of(e, (*where, f)) from None
        if w.trace is None:
            for i, c in enumerate(classes):
                if not c.has_lengths:
                    where = ("workload", "classes", i, "prompt") if w.classes else ("workload", "prompt")
                    raise _Problem(where, f"class {c.name!r} has no lengths: give prompt and output, or lengths "
                                   "(joint pairs), here or in workload", "e.g. prompt: uniform:10:1600")
        try:
            self._mix = ClassMix(classes, arrival=w.arrival)
        except InputError as e:
            raise _Problem.of(e, ("workload", "classes" if e.field == "classes" else "arrival")) from None

        notes = self._notes
        notes.extend(self.deployment._notes)
        from llmqueue.engine.policies import FCFS, Priority

        prios = {c.priority for c in classes}
        policy = self.deployment.scheduling_policy
        if len(prios) > 1 and policy != Priority.name:
            notes.append(f"classes have different priorities but deployment.scheduling_policy is {policy}: "
                         f"priorities only matter under scheduling_policy: {Priority.name}")
        if policy == Priority.name and len(prios) == 1:
            notes.append(f"scheduling_policy is {Priority.name} but every class has the same priority (then it is "
                         f"{FCFS.name})")
        mml = self.deployment.effective_max_model_len
        if mml is not None:
            for c in classes:
                hi = _max_total(c)
                if hi is not None and hi > mml:
                    notes.append(f"class {c.name!r}: prompt + output can reach {hi:,} tokens, above max_model_len "
                                 f"{mml:,}; such requests are rejected (vLLM answers 400)")
        if self.deployment.enable_prefix_caching:
            notes.append("enable_prefix_caching: the simulator models prefix reuse only for requests that carry "
                         "prefix hash ids (`llmqueue simulate --trace MOONCAKE.jsonl --enable-prefix-caching`); "
                         "scenario workloads carry none yet, so they see no hits (a real vLLM server would)")
        from llmqueue.scenario.fleet import fleet_spec

        try:
            self._fleet = fleet_spec(self)
        except InputError as e:
            raise _Problem((e.field,), e.problem, e.fix) from None
        return self

    def _class_slos(self, names: list[str]) -> dict[str, tuple]:
        if self.slos is None:
            return {n: () for n in names}
        glob = self.slos.slos()
        per = self.slos.per_class or {}
        for k in per:
            if k not in names:
                near = difflib.get_close_matches(k, names, n=1, cutoff=0.6)
                fix = f"did you mean {near[0]!r}?" if near else f"classes: {', '.join(names)}"
                raise _Problem(("slos", "per_class", k), "is not a class of workload.classes", fix)
        out = {}
        for n in names:
            merged = dict(glob)
            if n in per:
                merged.update(per[n].slos())
            out[n] = tuple(s for metric in ("ttft", "tpot", "itl", "e2el") for s in merged.get(metric, ()))
        return out

    @property
    def mix(self):
        """The request classes as a :class:`~llmqueue.workload.classes.ClassMix`."""
        return self._mix

    @property
    def M(self) -> int:
        """KV capacity ``M`` of one replica in tokens."""
        return self.deployment.M

    @property
    def fleet(self):
        """The :class:`~llmqueue.cluster.spec.FleetSpec` of ``deployment.pools`` (and lanes, P/D,
        gateway, autoscalers, faults), or None for one engine with ``deployment.replicas``."""
        return self._fleet

    @property
    def notes(self) -> list[str]:
        return list(self._notes)

    @property
    def source(self) -> str | None:
        return self._source

    # -- what the simulator and the benchmark take from a scenario ------------------------------
    def load_trace(self):
        """The replayed trace after the window, time-scale/rate and loop transforms (trace mode)."""
        from llmqueue.workload import traces as T

        tc = self.workload.trace
        if tc is None:
            raise InputError("workload.trace", "this scenario has no trace (it uses workload.arrival)")
        names = {"file": "path", "map": "mapping", "window": "start_s", "scale": "time_scale",
                 "until_s": "loop", "period_s": "loop"}
        try:
            tr = T.load_trace(tc.path, format=tc.format, mapping=tc.mapping, time_unit=tc.time_unit,
                              drop_bad=tc.drop_bad, spread_ties=tc.spread_ties)
            if tc.start_s > 0 or tc.end_s is not None:
                tr = T.window(tr, tc.start_s, tc.end_s)
            if tc.time_scale is not None:
                tr = T.time_scale(tr, tc.time_scale)
            if tc.rate is not None:
                tr = T.rescale_rate(tr, tc.rate)
            if tc.loop:
                if self.run.duration_s is not None:
                    tr = T.loop(tr, until_s=self.run.duration_s)
                else:
                    tr = T.loop(tr, max(1, math.ceil(self.run.num_requests / len(tr))))
        except InputError as e:
            f = names.get(e.field, e.field)
            raise InputError(f"workload.trace.{f}" if f in TraceConfig.model_fields else "workload.trace",
                             e.problem, e.fix) from None
        return tr

    def requests(self, seed: int | None = None):
        """The run's request stream (a :class:`~llmqueue.workload.generate.RequestArrays`):
        ``run.num_requests`` requests or those arriving within ``run.duration_s``, seeded with
        ``run.seed`` unless ``seed`` is given."""
        from llmqueue.workload.classes import _head

        seed = self.run.seed if seed is None else seed
        n, dur = self.run.num_requests, self.run.duration_s
        if self.workload.trace is None:
            return self.mix.generate(seed, n=n, duration=dur)
        tr = self.load_trace()
        if self._trace_is_the_workload(tr):
            import numpy as np

            from llmqueue.workload.generate import RequestArrays

            keep = tr.arrival_s < dur if dur is not None else slice(None)
            t = tr.arrival_s[keep]
            reqs = RequestArrays(np.arange(t.size), t, tr.prompt_tokens[keep], tr.output_tokens[keep],
                                 np.asarray(tr.class_name)[keep] if t.size else "default")
        else:
            reqs = self.mix.replay(seed, tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                                   output_tokens=tr.output_tokens, duration=dur)
        return _head(reqs, n) if n is not None else reqs

    def _trace_is_the_workload(self, tr) -> bool:
        """A trace whose every request names one of the scenario's classes (a gateway or bench run's
        arrivals) is replayed as recorded: each request keeps its class and its lengths, and no class
        draws arrivals of its own. Otherwise the classes split the trace's arrivals by share."""
        import numpy as np

        if tr.class_name is None or not len(tr):
            return False
        names = {c.name for c in self.mix.classes}
        return set(np.unique(np.asarray(tr.class_name, dtype=str)).tolist()) <= names

    def engine(self, d=None):
        """``(EngineConfig, StepTimeModel)`` of one replica of deployment ``d`` (default: the
        top level; a pool's: ``deployment.pool_deployments[i]``)."""
        from llmqueue.engine.step_time import parse_step_time

        d = self.deployment if d is None else d
        return self.engine_config(d), parse_step_time(d.step_time_model)

    def engine_config(self, d=None):
        """One replica's :class:`~llmqueue.engine.config.EngineConfig` (vLLM semantics) of
        deployment ``d`` (default: the top level)."""
        from llmqueue.engine.config import EngineConfig
        from llmqueue.engine.policies import default_victim

        from llmqueue.engine.host_tier import with_host_tier

        d = self.deployment if d is None else d
        policy = d.scheduling_policy
        return with_host_tier(EngineConfig.from_capacity(
            d.M, block_size=d.block_size, max_num_batched_tokens=d.max_num_batched_tokens,
            max_num_seqs=d.max_num_seqs, enable_chunked_prefill=d.enable_chunked_prefill,
            long_prefill_token_threshold=d.long_prefill_token_threshold,
            max_model_len=d.effective_max_model_len or 0, policy=policy, preemption=default_victim(policy),
            max_waiting=d.max_waiting, max_queue_time_s=d.max_queue_time_s,
            enable_prefix_caching=d.enable_prefix_caching, class_priority=self.mix.priorities,
            class_max_waiting={c.name: c.max_waiting for c in self.workload.classes or () if c.max_waiting},
            class_max_queue_time_s={c.name: c.max_queue_time_s for c in self.workload.classes or ()
                                    if c.max_queue_time_s}),
            d.kv_offloading_size, d.kv_offloading_gbps, d.kv_bytes_per_token, d._model,
            d.tensor_parallel_size * d.pipeline_parallel_size, d.kv_cache_dtype)

    def summary(self, *, trace: bool = True) -> dict:
        """A resolved, JSON-ready summary (what ``llmqueue scenario check --json`` prints).

        ``trace=True`` loads a replayed trace to report its size and rate.
        """
        mix, w, d = self.mix, self.workload, self.deployment
        rates = mix.rates()
        out: dict = {"name": self.name, "description": self.description, "source": self.source}
        wl: dict = {"mode": "trace" if w.trace is not None else "arrival"}
        total_rate = mix.rate
        if w.trace is not None:
            tc = w.trace
            wl["trace"] = tc.model_dump()
            if trace:
                tr = self.load_trace()
                t_rate = tr.mean_rate
                wl["trace"].update(requests=len(tr), span_s=tr.span_s, mean_rate=t_rate, repairs=list(tr.repairs))
                total_rate = math.fsum(t_rate * c.share if c.share is not None else c.arrival.rate for c in mix)
                rates = {c.name: (t_rate * c.share if c.share is not None else c.arrival.rate) for c in mix}
        if mix.arrival is not None:
            a = mix.arrival
            wl["arrival"] = {"spec": a.spec, "rate": a.rate, "scv": _try(lambda: a.scv), "idc": _try(lambda: a.idc)}
        wl["rate"] = total_rate
        tot = math.fsum(r for r in rates.values() if math.isfinite(r))
        if tot > 0:
            ep = math.fsum(rates[c.name] * c.mean_prompt() for c in mix) / tot
            eo = math.fsum(rates[c.name] * c.mean_output() for c in mix) / tot
        else:
            ep = eo = math.nan
        wl.update(mean_prompt=ep, mean_output=eo, prompt_tokens_per_s=tot * ep, output_tokens_per_s=tot * eo)
        out["workload"] = wl
        classes = []
        for c in mix:
            row = c.specs()
            row["rate"] = rates[c.name]
            if c.arrival is not None:
                row["arrival_rate"] = c.arrival.rate
            row["mean_prompt"], row["mean_output"] = c.mean_prompt(), c.mean_output()
            row["slos"] = [str(s) for s in c.slos]
            classes.append(row)
        out["classes"] = classes
        from llmqueue.scenario.fleet import FLEET_KEYS, fleet_summary

        dep = d.model_dump(exclude={"step_time", *FLEET_KEYS})
        dep["model"] = d._model.name if d._model is not None else None
        dep["step_time"] = d.step_time_model.spec if d.step_time_model is not None else None
        dep["max_model_len"] = d.effective_max_model_len
        dep["M"] = d.M
        dep["M_source"] = "capacity_tokens" if d.capacity_tokens is not None else "hardware"
        if d.capacity is not None:
            cap = d.capacity
            dep["kv_capacity"] = {"M": cap.M, "num_blocks": cap.num_blocks, "block_size": cap.block_size,
                                  "kv_bytes_per_token": cap.kv_bytes_per_token,
                                  "weight_bytes_per_gpu": cap.weight_bytes_per_gpu,
                                  "kv_bytes_per_gpu": cap.kv_bytes_per_gpu,
                                  "kv_dtype": cap.kv_dtype, "weight_dtype": cap.weight_dtype}
        dep["total_gpus"] = d.tensor_parallel_size * d.pipeline_parallel_size * d.replicas
        if self.fleet is not None:
            dep["fleet"] = fleet_summary(self.fleet, d.pool_deployments)
            dep["total_gpus"] = sum(p.replicas * pd.tensor_parallel_size * pd.pipeline_parallel_size
                                    for p, pd in zip(self.fleet.pools, d.pool_deployments))
        out["deployment"] = dep
        out["slos"] = {c.name: [s.to_dict() for s in c.slos] for c in mix}
        out["run"] = self.run.model_dump()
        out["notes"] = self.notes
        return out


def _try(f):
    try:
        return float(f())
    except (NotImplementedError, AttributeError, ArithmeticError, ValueError):  # no closed form
        return None


def _max_total(c) -> int | None:
    """Largest prompt + output a class can draw (None when a length is unbounded or unknown)."""
    if c.joint is not None:
        return int((c.joint.prompts + c.joint.outputs).max())
    if c.prompt is None:
        return None
    hs, ho = c.prompt.support()[1], c.output.support()[1]
    if hs is None or ho is None:
        return None
    return int(hs + ho)
