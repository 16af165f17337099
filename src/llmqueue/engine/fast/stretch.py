"""``DecodeStretch``: a run of decode-only steps taken in one jump, its step times and its records.

While no request prefills and none can be admitted, every step schedules the same ``n`` decoders
one token each; the state changes only at the next completion, the step where the free blocks run
out, or an external event (an arrival, a deadline, the horizon). The replica takes those steps at
once (:meth:`~llmqueue.engine.fast.replica.Replica.stretch`); this class knows their durations:

- mode 0, a constant step ``b``: the first ``j`` steps last ``b j``;
- mode 1, a decode step linear in its composition (``a + per_seq n + per_ctx C``, the context
  ``C`` growing by ``n`` a step): step ``j`` lasts ``A + G j``, the first ``j`` steps
  ``A j + G j (j - 1) / 2``, and the step that reaches a time is a quadratic's root;
- mode 2, any other model (or noise): the model's ``decode_stretch`` durations, summed.

and writes the stretch's step rows (one per run of steps with the same queue length) and its
time-series samples (KV growing as the decoders open blocks, the queue by the arrivals seen).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from llmqueue.engine.fast.decoders import DecoderPool
from llmqueue.engine.fast.recorder import StepRecorder
from llmqueue.engine.pricing import StepPricer


class DecodeStretch:
    """The current stretch's step times (see the module docstring), for one replica's
    ``decoders``, ``recorder`` and ``pricer``."""

    __slots__ = ("decoders", "recorder", "pricer", "mode", "first", "growth", "start", "ends")

    def __init__(self, decoders: DecoderPool, recorder: StepRecorder, pricer: StepPricer) -> None:
        self.decoders = decoders
        self.recorder = recorder
        self.pricer = pricer
        self.mode = 0        # 0 equal steps of ``first``, 1 linear (``first`` + ``growth`` j), 2 the end times ``ends``
        self.first = 0.0
        self.growth = 0.0
        self.start = 0.0     # the stretch starts at this time
        self.ends: Any = None

    def begin(self, t: float, k_max: int, speed: float, step_index: int) -> int:
        """A stretch of at most ``k_max`` steps from ``t`` (step ``step_index``, drift ``speed``):
        its step times set up; returns how many steps it may take (0: take an ordinary step)."""
        pricer = self.pricer
        dec = self.decoders
        n = dec.count
        self.start = t
        lin = pricer.linear
        if pricer.constant and pricer.noise is None:
            self.mode = 0
            self.first = pricer.constant * speed
        elif lin is not None and pricer.noise is None:
            # linear: step j of the stretch lasts A + G j (the context grows by n a step), so the
            # first k steps last A k + G k (k - 1) / 2: the stopping step is a quadratic's root
            a, per_seq, per_ctx = lin
            first = speed * (a + per_seq * n + per_ctx * dec.context_tokens())
            if first <= 0:
                return 0
            self.mode = 1
            self.first = first
            self.growth = speed * per_ctx * n
        else:
            durs = pricer.decode_stretch(n, dec.context_tokens(), k_max, step_index, speed)
            if (durs <= 0).any():
                k_pos = int(np.argmax(durs <= 0))
                if k_pos == 0:
                    return 0
                k_max = k_pos  # the non-positive step is taken alone (and refused there)
            self.mode = 2
            self.ends = t + np.cumsum(durs)
        return k_max

    def duration(self, j: int) -> float:
        """The stretch's first ``j`` steps: their duration."""
        m = self.mode
        if m == 0:
            return j * self.first
        if m == 1:
            return self.first * j + self.growth * j * (j - 1) / 2
        return float(self.ends[j - 1] - self.start) if j else 0.0

    def reach(self, x: float) -> int:
        """The fewest steps (>= 1) of the stretch that end at or after ``x``."""
        m = self.mode
        t = self.start
        if m == 0:
            b = self.first
            j = max(1, math.ceil((x - t) / b - 1e-9))
            while j > 1 and t + (j - 1) * b >= x:
                j -= 1
            while t + j * b < x:
                j += 1
            return j
        if m == 1:
            first = self.first
            growth = self.growth
            span = x - t
            if growth > 0:
                h = first - growth / 2
                j = math.ceil((-h + math.sqrt(h * h + 2 * growth * span)) / growth - 1e-9)
            else:
                j = math.ceil(span / first - 1e-9)
            j = max(1, j)
            while j > 1 and first * (j - 1) + growth * (j - 1) * (j - 2) / 2 >= span:
                j -= 1
            while first * j + growth * j * (j - 1) / 2 < span:
                j += 1
            return j
        return int(np.searchsorted(self.ends, x, side="left")) + 1

    def record_rows(self, step0: int, t: float, k: int, n: int, waiting0: int, marks: list, used0: int) -> None:
        """Step rows of a stretch of ``k`` steps from step ``step0`` that arrivals passed through
        (``marks``: for each that joined the queue, the step at whose start it is seen): one row
        per run of steps with the same queue length; ``used0``: blocks in use at its start."""
        dec = self.decoders
        bs = dec.block_size
        rec = self.recorder
        s = 0
        w = waiting0
        i = 0
        m = len(marks)
        while s < k:
            while i < m and marks[i] <= s:
                i += 1
                w += 1
            e = marks[i] if i < m else k
            c0 = self.duration(s)
            rec.row(step0 + s, t + c0, self.duration(e) - c0, 0, n, n, w, (used0 + dec.blocks_needed(e)) * bs, 0, e - s)
            s = e

    def record_samples(self, t: float, k: int, n: int, waiting0: int, marks: list | None, used0: int, step0: int,
                       horizon: float) -> None:
        """Time-series rows for the sample times inside a stretch of ``k`` steps from ``t`` (step
        ``step0``): KV grows as blocks are allocated; the queue by the arrivals seen at ``marks``."""
        pricer = self.pricer
        rec = self.recorder
        dec = self.decoders
        bs = dec.block_size
        speed = pricer.speed(t)
        if pricer.constant and pricer.noise is None:
            # equal steps: step i ends at t + b (i + 1), the same float as numpy's t + b * arange(1, k + 1)
            b = pricer.constant * speed
            for ts in rec.take_samples(t + b * k, horizon):
                j = min(max(int((ts - t) / b), 0), k)  # then exactly: the steps ended by ts
                while j < k and t + b * (j + 1) <= ts:
                    j += 1
                while j > 0 and t + b * j > ts:
                    j -= 1
                nw = waiting0 + bisect.bisect_right(marks, j) if marks else waiting0
                rec.sample(ts, nw, n, (used0 + dec.blocks_needed(j + 1)) * bs)
            return
        ends = t + np.cumsum(pricer.decode_stretch(n, dec.context_tokens(), k, step0, speed))
        for ts in rec.take_samples(float(ends[-1]), horizon):
            j = int(np.searchsorted(ends, ts, side="right"))  # step j contains the sample
            nw = waiting0 + bisect.bisect_right(marks, j) if marks else waiting0
            rec.sample(ts, nw, n, (used0 + dec.blocks_needed(j + 1)) * bs)
