"""``StepPricer``: the service time of one engine step, the same for both replicas.

A step's duration is the step-time model's price of its :class:`~llmqueue.engine.output.Composition`
(``b = base(P, D, C)``), times the noise factor of the step's global index (i.i.d. service-time
noise) and the drift factor of the window holding its start (a randomly modulated server). A
linear or roofline model without noise or drift is priced here term for term as its ``base``
(the same floats), without a Python call a step: the compiled build's hot path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmqueue.engine.output import Composition
from llmqueue.engine.step_model import constant_step, drift_stream, linear_decode, noise_stream
from llmqueue.engine.step_time import StepTimeModel, parse_step_time
from llmqueue.errors import InputError


class StepPricer:
    """Prices steps for one replica (``seed`` draws its noise and drift streams).

    ``constant``: the constant step time ``b`` (0 when steps vary); ``linear``: ``(a, per_seq,
    per_ctx)`` when a decode-only step of ``n`` sequences over ``C`` context tokens lasts ``a +
    per_seq n + per_ctx C`` (decode stretches in closed form), else None.
    """

    __slots__ = ("model", "noise", "drift", "constant", "linear", "plain", "inline", "roofline_inline",
                 "c0", "c_prefill", "c_decode", "c_ctx", "overhead", "compute", "memory")

    def __init__(self, step_time, seed: int = 0) -> None:
        self.model: Any = parse_step_time(step_time)
        m = self.model
        self.noise: Any = noise_stream(m, seed)
        self.drift: Any = drift_stream(m, seed)
        self.constant: float = float(constant_step(m) or 0.0)
        lin = linear_decode(m)
        self.linear: tuple[float, float, float] | None = (None if lin is None else
                                                          (float(lin[0]), float(lin[1]), float(lin[2])))
        # no noise, no drift and a positive fixed cost: a step's duration is the model's price of its
        # composition (never zero: the built-in models' coefficients are non-negative)
        self.plain: bool = (self.noise is None and self.drift is None and isinstance(m, StepTimeModel)
                            and (m.c0 > 0 if m.roofline is None else m.roofline[0] > 0))
        self.inline: bool = self.plain and type(m) is StepTimeModel and m.roofline is None
        self.roofline_inline: bool = self.plain and type(m) is StepTimeModel and m.roofline is not None
        self.c0 = self.c_prefill = self.c_decode = self.c_ctx = self.overhead = 0.0
        self.compute: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
        self.memory: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
        if self.inline:
            self.c0, self.c_prefill, self.c_decode, self.c_ctx = (float(m.c0), float(m.c_prefill), float(m.c_decode),
                                                                  float(m.c_ctx))
        if self.roofline_inline:
            roof: Any = m.roofline
            ov, comp, mem = roof
            self.overhead = float(ov)
            self.compute = (float(comp[0]), float(comp[1]), float(comp[2]), float(comp[3]))
            self.memory = (float(mem[0]), float(mem[1]), float(mem[2]), float(mem[3]))

    def price(self, comp: Composition, step_index: int, t: float) -> float:
        """The duration of step ``step_index`` of composition ``comp`` starting at ``t``."""
        if self.inline:
            return (self.c0 + self.c_prefill * comp.prefill_tokens + self.c_decode * comp.decode_seqs
                    + self.c_ctx * comp.context_tokens)
        if self.roofline_inline:
            p, d, c = comp.prefill_tokens, comp.decode_seqs, comp.context_tokens
            x = self.compute
            y = self.memory
            tc = x[0] + x[1] * p + x[2] * d + x[3] * c
            tm = y[0] + y[1] * p + y[2] * d + y[3] * c
            return self.overhead + (tc if tc > tm else tm)
        if self.plain:
            return float(self.model.base(comp.prefill_tokens, comp.decode_seqs, comp.context_tokens))
        dur = self.constant if self.constant else float(self.model.base(comp.prefill_tokens, comp.decode_seqs,
                                                                        comp.context_tokens))
        if self.noise is not None:
            dur *= self.noise.at(step_index)
        if self.drift is not None:
            dur *= self.drift.at(t)
        if not dur > 0:
            raise InputError("step_time", f"the step-time model gave a non-positive step ({dur!r})")
        return dur

    def speed(self, t: float) -> float:
        """The drift factor of the window holding ``t`` (1 without drift)."""
        return float(self.drift.at(t)) if self.drift is not None else 1.0

    def decode_stretch(self, n: int, ctx0: int, k: int, step_index: int, speed: float) -> np.ndarray:
        """The durations of ``k`` decode-only steps of ``n`` sequences whose context starts at
        ``ctx0`` (and grows by ``n`` a step), from step ``step_index`` on, at drift ``speed``."""
        durs = self.model.decode_stretch(n, ctx0, k)
        if self.noise is not None:
            durs = durs * self.noise.slice(step_index, k)
        if speed != 1.0:
            durs = durs * speed
        return durs
