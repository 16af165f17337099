"""What a replica reads of a step-time model, and the noise and drift around any model.

:class:`StepTime` is the contract (``base``, ``decode_stretch``, ``spec``, and the optional
``constant_step``, ``linear_decode``, ``noise_stream``, ``drift_stream``, read with the accessors
below). The built-in models and the spec parser are in :mod:`llmqueue.engine.step_time`, the
measured surface in :mod:`llmqueue.engine.profile_step`; both wrap a model in :class:`Perturbed`
for step noise (a mean-one factor per step: the service-time variance that widens the tail) and
drift (a mean-one factor per window of simulated time: ``mu`` modulated by a random environment),
drawn from :class:`NoiseStream` and :class:`DriftStream`.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import numpy as np

from llmqueue._validate import nonnegative, positive
from llmqueue.errors import InputError

NOISES = ("none", "exp", "gamma", "lognormal")


@runtime_checkable
class StepTime(Protocol):
    """What a replica asks of a step-time model: the duration of one step from its composition.

    ``base(prefill_tokens, decode_seqs, context_tokens)``: seconds for a step that computes
    ``prefill_tokens`` prompt (or recomputed) tokens and ``decode_seqs`` one-token decodes attending
    over ``context_tokens`` KV tokens in all; ``decode_stretch(n, ctx0, k)``: the durations of ``k``
    consecutive decode-only steps of ``n`` sequences whose context starts at ``ctx0`` and grows by
    ``n`` a step (``[base(0, n, ctx0 + n j) for j in range(k)]``, vectorized); ``spec``: a name.

    Optional, found with :func:`getattr` (a model without them is priced step by step):
    ``constant_step`` (seconds, when every step lasts the same), ``linear_decode`` (``(a, per_seq,
    per_ctx)`` when a decode-only step lasts ``a + per_seq n + per_ctx C``: stretches in closed
    form), ``noise_stream(seed)`` / ``drift_stream(seed)`` (see :func:`with_noise`, :func:`with_drift`).
    A new model is one class with these methods, usable wherever a step-time model is.
    """

    spec: str

    def base(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float: ...

    def decode_stretch(self, n: int, ctx0: int, k: int) -> np.ndarray: ...


def constant_step(model) -> float | None:
    """The model's constant step time ``b`` (seconds), or None when steps vary."""
    return getattr(model, "constant_step", None)


def linear_decode(model) -> tuple | None:
    """``(a, per_seq, per_ctx)`` when a decode-only step lasts ``a + per_seq n + per_ctx C``."""
    return getattr(model, "linear_decode", None)


def noise_stream(model, seed):
    f = getattr(model, "noise_stream", None)
    return f(seed) if f is not None else None


def drift_stream(model, seed):
    f = getattr(model, "drift_stream", None)
    return f(seed) if f is not None else None


class Perturbed:
    """Any step-time model with step noise and/or engine-speed drift around it (a wrapper): the
    same prices, and the replicas draw the noise factors per step and the drift factors per window
    from seeded streams, as for the built-in models' ``:noise=`` and ``:drift=`` suffixes."""

    def __init__(self, inner, *, noise: str = "none", noise_cv: float = 0.0, drift_sd: float = 0.0,
                 drift_span_s: float = 10.0):
        if noise not in NOISES:
            raise InputError("noise", f"unknown noise {noise!r}", f"choose one of: {', '.join(NOISES)}")
        if noise in ("gamma", "lognormal"):
            positive("noise_cv", noise_cv)
        self.inner = inner
        self.noise, self.noise_cv = noise, noise_cv
        self.drift_sd, self.drift_span_s = nonnegative("drift", drift_sd), positive("span", drift_span_s)
        self.spec = inner.spec + (f":noise={noise}" + (f":cv={noise_cv:g}" if noise in ("gamma", "lognormal") else "")
                                  if noise != "none" else "") + (
            f":drift={drift_sd:g}:span={drift_span_s:g}" if drift_sd > 0 else "")
        self.constant_step = constant_step(inner)
        self.linear_decode = linear_decode(inner)

    def base(self, prefill_tokens, decode_seqs, context_tokens):
        return self.inner.base(prefill_tokens, decode_seqs, context_tokens)

    def decode_stretch(self, n, ctx0, k):
        return self.inner.decode_stretch(n, ctx0, k)

    def noise_stream(self, seed):
        return NoiseStream(self.noise, self.noise_cv, seed) if self.noise != "none" else None

    def drift_stream(self, seed):
        return DriftStream(self.drift_sd, self.drift_span_s, seed) if self.drift_sd > 0 else None

    def scaled(self, f: float) -> "Perturbed":
        """The inner model ``f`` times as long (it must have ``scaled``), the same noise and drift."""
        inner = getattr(self.inner, "scaled", None)
        if inner is None:
            raise InputError("step_time", f"{self.inner.spec} cannot be scaled", "give it a scaled(f) method")
        return Perturbed(inner(f), noise=self.noise, noise_cv=self.noise_cv, drift_sd=self.drift_sd,
                         drift_span_s=self.drift_span_s)

    def with_drift(self, sd: float, span_s: float = 10.0) -> "Perturbed":
        return with_drift(self, sd, span_s)


def with_noise(model, kind: str, cv: float = 0.0) -> Perturbed:
    """``model`` with mean-one noise on every step (``exp``, or ``gamma``/``lognormal`` with CV ``cv``)."""
    if isinstance(model, Perturbed):
        return Perturbed(model.inner, noise=kind, noise_cv=cv, drift_sd=model.drift_sd, drift_span_s=model.drift_span_s)
    return Perturbed(model, noise=kind, noise_cv=cv)


def with_drift(model, sd: float, span_s: float = 10.0) -> Perturbed:
    """``model`` with the engine's speed drifting by ``sd`` (CV) over windows of ``span_s`` seconds."""
    if isinstance(model, Perturbed):
        return Perturbed(model.inner, noise=model.noise, noise_cv=model.noise_cv, drift_sd=sd, drift_span_s=span_s)
    return Perturbed(model, drift_sd=sd, drift_span_s=span_s)


class DriftStream:
    """Mean-one speed factors per window of ``span_s`` seconds of simulated time (seeded): a step
    that starts at ``t`` lasts ``f[floor(t / span_s)]`` times its model time. Lognormal with CV
    ``sd``; indexed by window number, so every stepper sees the same engine speed at time ``t``."""

    CHUNK = 4096

    def __init__(self, sd: float, span_s: float, seed):
        self.sd, self.span = float(sd), float(span_s)
        ss = np.random.SeedSequence(seed)
        self._entropy, self._key = ss.entropy, ss.spawn_key
        self._chunks: dict[int, np.ndarray] = {}

    def _chunk(self, c: int) -> np.ndarray:
        arr = self._chunks.get(c)
        if arr is None:
            rng = np.random.default_rng(np.random.SeedSequence(self._entropy, spawn_key=(*self._key, 11, c)))
            s2 = math.log1p(self.sd * self.sd)
            arr = self._chunks[c] = rng.lognormal(-s2 / 2.0, math.sqrt(s2), self.CHUNK)
        return arr

    def window(self, t: float) -> int:
        return int(t // self.span) if t > 0 else 0

    def at(self, t: float) -> float:
        """The speed factor (step-time multiplier) of the window holding time ``t``."""
        j = self.window(t)
        return float(self._chunk(j // self.CHUNK)[j % self.CHUNK])

    def next_boundary(self, t: float) -> float:
        """The start of the window after the one holding ``t``."""
        return (self.window(t) + 1) * self.span


class NoiseStream:
    """Mean-one multiplicative noise factors indexed by global step number (seeded, chunked)."""

    CHUNK = 1 << 16

    def __init__(self, kind: str, cv: float, seed):
        self.kind, self.cv = kind, cv
        self._ss = np.random.SeedSequence(seed)
        self._chunks: dict[int, np.ndarray] = {}

    def _chunk(self, c: int) -> np.ndarray:
        arr = self._chunks.get(c)
        if arr is None:
            rng = np.random.default_rng(np.random.SeedSequence(self._ss.entropy, spawn_key=(*self._ss.spawn_key, 7, c)))
            n = self.CHUNK
            if self.kind == "exp":
                arr = rng.standard_exponential(n)
            elif self.kind == "gamma":
                shape = 1.0 / (self.cv * self.cv)
                arr = rng.gamma(shape, 1.0 / shape, n)
            else:  # lognormal with mean 1 and the given CV
                s2 = math.log1p(self.cv * self.cv)
                arr = rng.lognormal(-s2 / 2.0, math.sqrt(s2), n)
            if len(self._chunks) > 8:
                self._chunks.pop(next(iter(self._chunks)))
            self._chunks[c] = arr
        return arr

    def at(self, i: int) -> float:
        return float(self._chunk(i // self.CHUNK)[i % self.CHUNK])

    def slice(self, i: int, k: int) -> np.ndarray:
        out = np.empty(k)
        pos = 0
        while pos < k:
            c, off = divmod(i + pos, self.CHUNK)
            take = min(k - pos, self.CHUNK - off)
            out[pos:pos + take] = self._chunk(c)[off:off + take]
            pos += take
        return out
