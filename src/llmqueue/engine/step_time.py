"""Step-time models: how long one engine iteration takes, given its composition.

A step (iteration) processes ``prefill_tokens`` prompt tokens (all chunks in the batch),
``decode_seqs`` one-token decodes, and attends over ``context_tokens`` KV tokens in all.
Every model answers ``duration(prefill_tokens, decode_seqs, context_tokens, step_index)``.

Models (spec syntax, shared by the CLI and scenario files):

- ``0.0372`` or ``const:0.0372``: a constant ``b`` seconds per step (Nie et al.'s b-bar).
- ``linear:c0=0.01:prefill=2e-5:decode=1e-4:ctx=1e-8``: ``c0 + prefill*P + decode*D + ctx*C``
  (Inference Foundations' ``T_fixed + t_req*B`` is ``c0=T_fixed``, ``decode=t_req``).
- ``roofline``: built by :func:`roofline_model` from a model and a GPU: the larger of compute
  time and memory time, plus a fixed overhead.
- ``fitted:FILE``: a calibration file (YAML with ``step_time:`` holding one of the above).
- ``profile:DIR`` (or ``profile:DIR/profile.json``, optionally ``:scale=X``): the step-time
  surface ``llmqueue profile`` measured, decode steps interpolated over batch size and context
  (:mod:`llmqueue.engine.profile_step`).

Each form is a parser registered in :data:`FORMS` (``@_form(HEAD, usage=..., help=...)``): the
command line's ``--step-time``, its help, and a scenario's ``step_time`` read it, so a new form is
its model and its parser here.

Noise (the Queueing System essay section 5: service-time variance widens the tail): any model may carry
``:noise=exp`` (the step time is the model's value times an Exp(1) factor) or
``:noise=gamma:cv=0.3`` / ``:noise=lognormal:cv=0.3`` (mean-one factor with that CV).
``exp:0.1`` is shorthand for ``const:0.1:noise=exp`` (exponential step times, mean 0.1 s).
The noise factors are drawn from their own seeded stream and indexed by the global step
number, so two steppers that take the same steps see the same step times.

Drift (the engine's speed wandering in time, not step by step): any model may carry
``:drift=0.08`` (and ``:span=10``): simulated time is cut into windows of ``span`` seconds
(default 10) and every step that *starts* in window ``j`` is ``f_j`` times as long, the ``f_j``
i.i.d. lognormal with mean one and coefficient of variation ``drift``. The service rate ``mu``
is then modulated by a random environment (a Markov-modulated server): the mean speed is
unchanged, but near capacity a slow window lets the queue grow by ``(lam - mu / f_j) x span``,
which i.i.d. step noise of the same size averages away within a second. A real engine's speed
measured over 10-s windows (:func:`llmqueue.bench.calibrate.speed_drift`) wanders by 5-10 % on a
shared CPU machine. The factors come from their own seeded stream indexed by window number.
The noise and drift wrapper, its factor streams and the :class:`~llmqueue.engine.step_model.StepTime`
contract every model keeps are in :mod:`llmqueue.engine.step_model`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from llmqueue._validate import finite, nonnegative, positive
from llmqueue.engine.profile_step import load_profile_model, rebase_spec
from llmqueue.engine.step_model import NOISES, DriftStream, NoiseStream, Perturbed, StepTime, with_drift
from llmqueue.errors import InputError

@dataclass(frozen=True)
class StepTimeModel:
    """``c0 + c_prefill * P + c_decode * D + c_ctx * C`` seconds, times a mean-one noise factor.

    The constant model has only ``c0``. ``compute_*``/``memory_*`` coefficients, when set, make
    it a roofline: ``overhead + max(compute, memory)`` with each side linear in the composition.
    """

    c0: float = 0.0
    c_prefill: float = 0.0
    c_decode: float = 0.0
    c_ctx: float = 0.0
    roofline: tuple | None = None  # (overhead, (c0, cP, cD, cC) compute, (c0, cP, cD, cC) memory)
    noise: str = "none"
    noise_cv: float = 0.0
    spec: str = ""
    drift_sd: float = 0.0
    drift_span_s: float = 10.0

    @property
    def is_constant(self) -> bool:
        return self.roofline is None and self.c_prefill == 0 and self.c_decode == 0 and self.c_ctx == 0

    @property
    def constant_step(self) -> float | None:
        """``b`` when every step lasts the same (noise aside), else None."""
        return self.c0 if self.is_constant else None

    @property
    def linear_decode(self) -> tuple | None:
        """``(a, per_seq, per_ctx)`` of a decode-only step, for a linear (or constant) model."""
        return (self.c0, self.c_decode, self.c_ctx) if self.roofline is None else None

    @property
    def noisy(self) -> bool:
        return self.noise != "none"

    def base(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Noise-free duration of one step of this composition (seconds)."""
        if self.roofline is not None:
            ov, comp, mem = self.roofline
            tc = comp[0] + comp[1] * prefill_tokens + comp[2] * decode_seqs + comp[3] * context_tokens
            tm = mem[0] + mem[1] * prefill_tokens + mem[2] * decode_seqs + mem[3] * context_tokens
            return ov + (tc if tc > tm else tm)
        return self.c0 + self.c_prefill * prefill_tokens + self.c_decode * decode_seqs + self.c_ctx * context_tokens

    def decode_stretch(self, n: int, ctx0: int, k: int) -> np.ndarray:
        """Noise-free durations of ``k`` consecutive decode-only steps of ``n`` sequences whose
        total context is ``ctx0`` tokens at the first step and grows by ``n`` per step."""
        ctx = ctx0 + n * np.arange(k, dtype=np.float64)
        if self.roofline is not None:
            ov, comp, mem = self.roofline
            tc = comp[0] + comp[2] * n + comp[3] * ctx
            tm = mem[0] + mem[2] * n + mem[3] * ctx
            return ov + np.maximum(tc, tm)
        return self.c0 + self.c_decode * n + self.c_ctx * ctx

    def mean_factor(self) -> float:
        return 1.0

    def scaled(self, f: float) -> "StepTimeModel":
        """This model with every step ``f`` times as long (an engine running at ``1/f`` of the
        calibrated speed): all coefficients, the roofline's sides and overhead scaled."""
        import dataclasses

        f = positive("scale", f)
        roof = None
        if self.roofline is not None:
            ov, comp, mem = self.roofline
            roof = (ov * f, tuple(c * f for c in comp), tuple(c * f for c in mem))
        return dataclasses.replace(self, c0=self.c0 * f, c_prefill=self.c_prefill * f, c_decode=self.c_decode * f,
                                   c_ctx=self.c_ctx * f, roofline=roof, spec=f"{self.spec} (x{f:g})")

    def noise_stream(self, seed) -> "NoiseStream | None":
        return NoiseStream(self.noise, self.noise_cv, seed) if self.noisy else None

    def drift_stream(self, seed) -> "DriftStream | None":
        return DriftStream(self.drift_sd, self.drift_span_s, seed) if self.drift_sd > 0 else None

    def with_drift(self, sd: float, span_s: float = 10.0) -> "StepTimeModel":
        """This model with the engine's speed drifting by ``sd`` (CV) over windows of ``span_s``
        seconds (``sd = 0``: no drift)."""
        import dataclasses

        sd = nonnegative("drift", sd)
        span_s = positive("span", span_s)
        base = re.sub(r":drift=[^:]*(:span=[^:]*)?", "", self.spec)  # keeps a noise= group after it
        return dataclasses.replace(self, drift_sd=sd, drift_span_s=span_s,
                                   spec=f"{base}:drift={sd:g}:span={span_s:g}" if sd > 0 else base)


def _kv_args(parts: list[str], field: str, spec: str) -> dict:
    kv = {}
    for p in parts:
        if "=" not in p:
            raise InputError(field, f"cannot parse {spec!r}: expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        kv[k.strip().lower()] = v.strip()
    return kv


def _num(field: str, spec: str, key: str, v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise InputError(field, f"cannot parse {spec!r}: {key}={v!r} is not a number") from None
    return finite(field, x)


def _split_suffixes(parts: list[str], field: str, s: str):
    """Split ``parts`` into the model's own and its ``noise=KIND[:cv=X]`` / ``drift=SD[:span=S]``
    groups (either order, each at most once); returns (model parts, noise, cv, drift, span)."""
    groups: dict[str, dict] = {}
    own: list[str] = []
    cur = None
    for p in parts:
        key = p.split("=", 1)[0].strip().lower() if "=" in p else ""
        if key in ("noise", "drift"):
            if key in groups:
                raise InputError(field, f"cannot parse {s!r}: {key}= given twice")
            cur = groups[key] = {key: p.split("=", 1)[1].strip().lower()}
        elif cur is not None:
            cur.update(_kv_args([p], field, s))
        else:
            own.append(p)
    noise, cv = "none", 0.0
    if "noise" in groups:
        rest = groups["noise"]
        noise = rest.pop("noise")
        if noise not in NOISES:
            raise InputError(field, f"cannot parse {s!r}: unknown noise {noise!r}", f"choose one of: {', '.join(NOISES)}")
        if noise in ("gamma", "lognormal"):
            if "cv" not in rest:
                raise InputError(field, f"cannot parse {s!r}: noise={noise} needs cv=X")
            cv = positive(field, _num(field, s, "cv", rest.pop("cv")))
        if rest:
            raise InputError(field, f"cannot parse {s!r}: unknown key(s) {sorted(rest)}")
    drift, span = 0.0, 10.0
    if "drift" in groups:
        rest = groups["drift"]
        drift = nonnegative(field, _num(field, s, "drift", rest.pop("drift")))
        if "span" in rest:
            span = positive(field, _num(field, s, "span", rest.pop("span")))
        if rest:
            raise InputError(field, f"cannot parse {s!r}: unknown key(s) {sorted(rest)}", "drift takes span=SECONDS")
    return own, noise, cv, drift, span


def parse_step_time(spec, field: str = "step_time") -> StepTimeModel:
    """Parse a step-time spec (see the module docstring); a bare number is a constant."""
    if isinstance(spec, (StepTimeModel, Perturbed)) or (not isinstance(spec, (str, int, float)) and isinstance(spec, StepTime)):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        b = positive(field, spec)
        return StepTimeModel(c0=b, spec=f"const:{b:g}")
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(field, f"expected a step-time spec, got {spec!r}", "e.g. 0.0372, exp:0.1, linear:c0=0.01:decode=1e-4")
    s = spec.strip()
    parts, noise, cv, drift, span = _split_suffixes(s.split(":"), field, s)
    if not parts:
        raise InputError(field, f"cannot parse {s!r}: no step-time model before the noise/drift suffix")
    m = _model_of(parts, noise, cv, field, s)
    if drift > 0:
        if not isinstance(m, StepTimeModel):
            return with_drift(m, drift, span)
        import dataclasses

        m = dataclasses.replace(m, drift_sd=drift, drift_span_s=span, spec=s)
    return m


def _model_of(parts: list[str], noise: str, cv: float, field: str, s: str) -> StepTimeModel:
    head = parts[0].lower()
    try:
        b = float(head)
    except ValueError:
        b = None
    if b is not None:
        if len(parts) > 1:
            raise InputError(field, f"cannot parse {s!r}", "a constant is a bare number, e.g. 0.0372")
        return StepTimeModel(c0=positive(field, b), noise=noise, noise_cv=cv, spec=s)
    form = FORMS.get(head)
    if form is None:
        raise InputError(field, f"cannot parse {s!r}: unknown step-time model {head!r}",
                         f"use {', '.join(f.usage for f in dict.fromkeys(FORMS.values()))}")
    return form.parse(parts, noise, cv, field, s)


# --- the forms of a step-time spec ---------------------------------------------------------------

@dataclass(frozen=True)
class Form:
    """One form of step-time spec: ``usage`` and ``help`` (what ``--step-time``'s help lists), and
    ``parse(parts, noise, cv, field, spec)``: the model of a spec's ``:``-separated ``parts``
    (its head first, the ``noise=``/``drift=`` suffixes taken off: ``noise``, ``cv``)."""

    usage: str
    help: str
    parse: Callable


#: Every form by its head (``linear`` of ``linear:c0=..``); a bare number is a constant.
FORMS: dict[str, Form] = {}


def _form(*heads: str, usage: str, help: str):
    """Registers the decorated parser as the form of the specs starting ``HEAD:`` in :data:`FORMS`."""
    def register(parse: Callable) -> Callable:
        form = Form(usage, help, parse)
        for h in heads:
            FORMS[h] = form
        return parse
    return register


@_form("const", "constant", "exp", usage="B | const:B | exp:B",
       help="a constant step of B seconds; exp: exponential steps of mean B")
def _constant(parts: list[str], noise: str, cv: float, field: str, s: str) -> StepTimeModel:
    head = parts[0].lower()
    if len(parts) != 2:
        raise InputError(field, f"cannot parse {s!r}: {head} needs one value, e.g. {head}:0.0372")
    b = positive(field, _num(field, s, "b", parts[1]))
    if head == "exp":
        if noise != "none":
            raise InputError(field, f"cannot parse {s!r}: exp: already means exponential noise")
        noise = "exp"
    return StepTimeModel(c0=b, noise=noise, noise_cv=cv, spec=s)


@_form("linear", usage="linear:c0=..:prefill=..:decode=..:ctx=..",
       help="c0 + prefill x P + decode x D + ctx x C seconds")
def _linear(parts: list[str], noise: str, cv: float, field: str, s: str) -> StepTimeModel:
    kv = _kv_args(parts[1:], field, s)
    names = {"c0": "c0", "prefill": "c_prefill", "decode": "c_decode", "ctx": "c_ctx"}
    unknown = set(kv) - set(names)
    if unknown:
        raise InputError(field, f"cannot parse {s!r}: unknown key(s) {sorted(unknown)}",
                         "keys: c0, prefill, decode, ctx")
    args = {names[k]: nonnegative(field, _num(field, s, k, v)) for k, v in kv.items()}
    m = StepTimeModel(noise=noise, noise_cv=cv, spec=s, **args)
    if m.c0 <= 0 and m.c_prefill <= 0 and m.c_decode <= 0:
        raise InputError(field, f"cannot parse {s!r}: the model gives zero-length steps", "set c0 > 0")
    return m


@_form("fitted", usage="fitted:FILE", help="the step_time of a calibration file")
def _fitted(parts: list[str], noise: str, cv: float, field: str, s: str) -> StepTimeModel:
    if len(parts) < 2:
        raise InputError(field, f"cannot parse {s!r}: fitted needs a FILE")
    return load_fitted(":".join(parts[1:]), field=field)


@_form("profile", usage="profile:DIR[:scale=X]", help="the step-time surface `llmqueue profile` measured")
def _profile_of(parts: list[str], noise: str, cv: float, field: str, s: str):
    """``profile:DIR[:scale=X]`` (:mod:`llmqueue.engine.profile_step`), with its noise suffix."""
    path = ":".join(p for p in parts[1:] if "=" not in p)
    kv = _kv_args([p for p in parts[1:] if "=" in p], field, s)
    unknown = set(kv) - {"scale"}
    if unknown:
        raise InputError(field, f"cannot parse {s!r}: unknown key(s) {sorted(unknown)}", "profile takes scale=X")
    if not path.strip():
        raise InputError(field, f"cannot parse {s!r}: profile needs a DIR", "e.g. profile:runs/profile")
    scale = positive(field, _num(field, s, "scale", kv["scale"])) if "scale" in kv else 1.0
    m = load_profile_model(path.strip(), scale=scale, field=field)
    return Perturbed(m, noise=noise, noise_cv=cv) if noise != "none" else m


ROOFLINE = "roofline"


@_form(ROOFLINE, usage=ROOFLINE, help="from the model and GPU, the default with both")
def _roofline(parts: list[str], noise: str, cv: float, field: str, s: str):
    raise InputError(field, f"{ROOFLINE} needs a model and a GPU", "give both, or another step-time model")


def is_roofline(spec) -> bool:
    """Does ``spec`` ask for the roofline of the model and GPU (built by :func:`roofline_model`)?"""
    return isinstance(spec, str) and spec.strip().lower() == ROOFLINE


def with_base(spec, base):
    """``spec`` with the relative FILE of ``fitted:FILE`` resolved against folder ``base`` (where
    the file that names it lies); any other spec as it is."""
    head, sep, rest = spec.strip().partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or head.lower() != "fitted":
        return spec
    from pathlib import Path

    p = Path(rest).expanduser()
    return spec if p.is_absolute() else f"fitted:{Path(base) / p}"


def load_fitted(path: str, field: str = "step_time") -> StepTimeModel:
    """Read ``step_time:`` (a spec string) from a calibration YAML file."""
    import os

    from llmqueue._files import load_yaml

    if not os.path.exists(path):
        raise InputError(field, f"calibration file not found: {path}")
    doc = load_yaml(field, path, what="calibration file") or {}
    st = doc.get("step_time") if isinstance(doc, dict) else None
    if st is None:
        raise InputError(field, f"{path} has no 'step_time' key", "write step_time: <spec> in the calibration file")
    if isinstance(st, str) and st.startswith("fitted:"):
        raise InputError(field, f"{path}: step_time may not refer to another fitted file")
    return parse_step_time(rebase_spec(st, os.path.dirname(os.path.abspath(path)), relative=False), field=field)


def roofline_model(model, gpu, *, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                   overhead_s: float = 0.002, kv_dtype: str = "auto", weight_dtype: str = "auto", mfu: float = 0.6,
                   mbu: float = 0.8, link_efficiency: float | None = None) -> StepTimeModel:
    """A roofline step-time model for ``model`` on ``gpu``: one replica of ``tp x pp`` GPUs
    (``tp = tensor_parallel_size`` GPUs in each of ``pp = pipeline_parallel_size`` stages).

    compute: ``2 * active_params * (P + D) / (tp * flops * mfu)`` plus attention
    ``4 * n_layers * hidden * C / (tp * flops * mfu)``; memory: ``weights / (tp * bw * mbu)`` plus the
    KV read ``kv_bytes_per_token * C / (tp * bw * mbu)``; communication (tp > 1 or pp > 1): ``comm =
    c0 + c_tok (P + D)``, the ``2 n_layers`` ring all-reduces of tensor parallelism and the ``pp - 1``
    stage-boundary sends priced by the GPU's interconnect (alpha-beta model,
    :mod:`llmqueue.hardware.interconnect`); step = overhead + comm + max(compute, memory).
    ``mfu``/``mbu`` (and ``link_efficiency``, 0.8 by default) are achieved fractions of the peaks
    (assumptions, not measurements: calibrate against a real engine for numbers you rely on).

    Pipeline parallelism, as vLLM runs one batch through the stages per step (no micro-batches in
    flight): a step's batch crosses the ``pp`` stages one after the other, each holding ``1/pp`` of
    the layers on its ``tp`` GPUs, so the step lasts the *sum* of the stages' times,
    ``b_pp = overhead + comm + max(compute, memory)`` with compute and memory those of the whole
    model on ``tp`` GPUs: the same as without the pipeline, plus the sends. Each GPU idles
    ``(pp - 1) / pp`` of the step (the bubble). In queueing terms the replica stays one batch
    server whose step rate ``1 / b`` is the tensor-parallel one's less the sends: ``mu`` does not
    grow with ``pp``; what grows is the KV capacity ``M`` (weights and KV split over ``tp x pp``
    GPUs: :func:`llmqueue.hardware.kv_capacity`), hence the batch ``n`` a step can hold. (vLLM's
    batch queue can keep up to ``pp`` batches in flight, which would approach ``pp / b`` steps a
    second when the stages balance; not modelled: the simulated replica runs one batch a step.)

    The communication is linear in the step's tokens like the compute side, and ``max(a + x, b + x)
    = max(a, b) + x``: it is stored on both sides of the roofline (``(c0, c_tok, c_tok, 0)`` added
    to compute and memory), so the engine prices it with no term of its own. With ``tp = pp = 1``
    there is none and every coefficient is as before.
    """
    from llmqueue.hardware import active_param_count, get_gpu, get_model, kv_bytes_per_token, weight_bytes

    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    tp = tensor_parallel_size
    pp = pipeline_parallel_size
    flops = g.bf16_dense_flops * tp * mfu
    bw = g.hbm_bytes_per_s * tp * mbu
    p_act = active_param_count(m)
    per_tok = 2.0 * p_act / flops
    attn = 4.0 * m.n_layers * m.n_heads * m.head_dim / flops
    kvb = kv_bytes_per_token(m, kv_dtype) if kv_dtype != "auto" else kv_bytes_per_token(m)
    wb = weight_bytes(m, weight_dtype) if weight_dtype != "auto" else weight_bytes(m)
    comp = (0.0, per_tok, per_tok, attn)
    mem = (wb / bw, 0.0, 0.0, kvb / bw)
    spec = f"roofline:{m.name}:{g.name}:tp={tp}"
    if tp > 1 or pp > 1:
        from llmqueue.hardware.interconnect import LINK_EFFICIENCY, parallel_comm

        c = parallel_comm(m, g, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                          efficiency=LINK_EFFICIENCY if link_efficiency is None else link_efficiency)
        comp = (comp[0] + c.c0, comp[1] + c.c_tok, comp[2] + c.c_tok, comp[3])
        mem = (mem[0] + c.c0, mem[1] + c.c_tok, mem[2] + c.c_tok, mem[3])
        if pp > 1:
            spec += f":pp={pp}"
    return StepTimeModel(roofline=(overhead_s, comp, mem), spec=spec)
