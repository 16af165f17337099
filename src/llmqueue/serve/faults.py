"""Faults an emulated engine injects, for testing what sits in front of it; deterministic for a seed.

- ``fail_after N``: the engine dies when request N + 1 arrives: every open connection is reset
  and later ones are refused (a crashed server);
- ``slow F@START:END`` (repeatable): steps that start in ``[START, END)`` seconds after the
  engine started take ``F`` times as long (a throttled or shared accelerator); ``F`` alone: always;
- ``reject_fraction p`` with ``reject_status`` 429 or 503: each request is refused with that
  fraction, drawn from the seed in arrival order (an overloaded or rate-limiting server);
- ``restart_after S`` with ``restart_delay D``: at ``S`` seconds the engine drops everything in
  flight (connections reset), refuses connections for ``D`` seconds, then comes back empty
  (fresh queue, KV cache and counters, as a restarted process).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from llmqueue.errors import InputError


def parse_slow(text: str) -> tuple[float, float, float]:
    """``F[@START:END]`` -> ``(F, START, END)`` (seconds since the start; no window: always)."""
    t = str(text).strip()
    f_txt, at, window = t.partition("@")
    try:
        f = float(f_txt)
        start, end = (0.0, math.inf)
        if at:
            a, sep, b = window.partition(":")
            if not sep:
                raise ValueError
            start, end = float(a), (float(b) if b.strip() else math.inf)
    except ValueError:
        raise InputError("slow_factor", f"{t!r} is not F[@START:END]", "e.g. 3 or 3@10:20 (3x slower from 10 s to "
                         "20 s after the start)") from None
    if not (f > 0 and math.isfinite(f)):
        raise InputError("slow_factor", f"{t!r}: the factor must be a positive number")
    if not (0 <= start < end):
        raise InputError("slow_factor", f"{t!r}: the window must have 0 <= START < END")
    return f, start, end


@dataclass
class Faults:
    """The faults of one emulated engine (see the module docstring)."""

    fail_after: int | None = None
    slow: list = field(default_factory=list)  # (factor, start_s, end_s)
    reject_fraction: float = 0.0
    reject_status: int = 503
    restart_after: float | None = None
    restart_delay: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.fail_after is not None and self.fail_after < 0:
            raise InputError("fail_after", f"must be >= 0 (got {self.fail_after})")
        if not 0 <= self.reject_fraction <= 1:
            raise InputError("reject_fraction", f"must be in [0, 1] (got {self.reject_fraction})")
        if self.reject_status not in (429, 503):
            raise InputError("reject_status", f"must be 429 or 503 (got {self.reject_status})")
        if self.restart_after is not None and not self.restart_after > 0:
            raise InputError("restart_after", f"must be > 0 seconds (got {self.restart_after})")
        if not self.restart_delay >= 0:
            raise InputError("restart_delay", f"must be >= 0 seconds (got {self.restart_delay})")
        self.rng = random.Random(self.seed)

    def reject(self) -> bool:
        """Is the next request refused? (one draw per request, in arrival order)"""
        return self.reject_fraction > 0 and self.rng.random() < self.reject_fraction

    def slow_factor(self, t: float) -> float:
        """The product of the slow-down factors whose windows hold ``t``."""
        f = 1.0
        for x, a, b in self.slow:
            if a <= t < b:
                f *= x
        return f


class _SlowDrift:
    """A drift stream (``at(t)``: the speed factor of a step starting at ``t``) times the faults'
    slow-down windows."""

    def __init__(self, inner, faults: Faults):
        self.inner, self.faults = inner, faults

    def at(self, t: float) -> float:
        f = self.faults.slow_factor(t)
        return f * self.inner.at(t) if self.inner is not None else f


class Slowed:
    """A step-time model whose steps are slowed by :class:`Faults` windows: the inner model's
    prices, noise and drift, with each step's duration multiplied by the factor at its start."""

    def __init__(self, inner, faults: Faults):
        self.inner, self.faults = inner, faults
        self.spec = getattr(inner, "spec", "")

    def base(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        return self.inner.base(prefill_tokens, decode_seqs, context_tokens)

    def decode_stretch(self, n: int, ctx0: int, k: int):
        return self.inner.decode_stretch(n, ctx0, k)

    def noise_stream(self, seed):
        f = getattr(self.inner, "noise_stream", None)
        return f(seed) if f is not None else None

    def drift_stream(self, seed):
        f = getattr(self.inner, "drift_stream", None)
        return _SlowDrift(f(seed) if f is not None else None, self.faults)
