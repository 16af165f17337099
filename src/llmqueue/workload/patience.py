"""Client patience: how long a client waits for its request to start before it gives up.

A fixed timeout is a deterministic patience; real users differ. ``patience`` draws each
request's own from a law (``exp:MEAN``, ``fixed:S``, ``uniform:LO:HI``, seconds): a request
not yet started (never scheduled) when its patience runs out is withdrawn from the queue,
status ``cancelled`` with reason ``patience`` (the user gave up: not retried). This is the
reneging of the classic queues: with exponential patience of mean ``1/theta``, Poisson arrivals
and ``c`` exponential servers it is M/M/c+M, Erlang A (:mod:`llmqueue.theory.abandonment`).
A request already in service stays (Erlang A's convention); its first token follows within a
step of its scheduling on vLLM, so for short prompts the patience is also its TTFT's.

Each request's patience is a pure function of ``(seed, request_id)`` (a SplitMix64 hash, as the
retry jitter), so every backend and every rerun draws the same; all attempts of a request share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmqueue._result import Result
from llmqueue.errors import InputError

KINDS = ("exp", "fixed", "uniform")
_SALT = 0x70617469656E6365  # "patience": a stream apart from the retry jitter's


@dataclass(frozen=True)
class Patience(Result):
    """A patience law: ``kind`` exp (``a`` the mean), fixed (``a``), uniform (``a`` to ``b``)."""

    kind: str
    a: float
    b: float | None = None

    @classmethod
    def parse(cls, spec, field: str = "patience") -> "Patience":
        """``exp:MEAN`` | ``fixed:S`` | ``uniform:LO:HI`` (seconds); a bare number is ``fixed``."""
        if isinstance(spec, Patience):
            return spec
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = f"fixed:{spec}"
        if not isinstance(spec, str):
            raise InputError(field, f"expected a patience law such as exp:30 (got {spec!r})",
                             "exp:MEAN, fixed:S or uniform:LO:HI (seconds)")
        parts = [p.strip() for p in spec.strip().split(":")]
        kind, nums = parts[0].lower(), parts[1:]
        want = {"exp": 1, "fixed": 1, "uniform": 2}.get(kind)
        if want is None or len(nums) != want:
            raise InputError(field, f"cannot parse {spec!r}", "exp:MEAN, fixed:S or uniform:LO:HI (seconds), e.g. exp:30")
        try:
            vals = [float(x) for x in nums]
        except ValueError:
            raise InputError(field, f"cannot parse {spec!r}: not a number", "e.g. exp:30") from None
        if not all(math.isfinite(v) and v > 0 for v in vals) or (kind == "uniform" and vals[1] < vals[0]):
            raise InputError(field, f"{spec!r}: seconds must be positive and finite (uniform: LO <= HI)", "e.g. exp:30")
        return cls(kind, vals[0], vals[1] if kind == "uniform" else None)

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.a:g}" + (f":{self.b:g}" if self.b is not None else "")

    def mean(self) -> float:
        """Mean patience (s); ``theta = 1 / mean`` for the exponential law."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def quantile(self, u: float) -> float:
        """The patience at uniform ``u`` in [0, 1)."""
        if self.kind == "exp":
            return -self.a * math.log1p(-u)
        if self.kind == "uniform":
            return self.a + (self.b - self.a) * u
        return self.a

    def draw(self, seed: int, request_id: int) -> float:
        """Request ``request_id``'s patience under ``seed`` (the same on every backend)."""
        from llmqueue.workload.hashed import hashed_uniform

        return self.quantile(hashed_uniform(_SALT, seed, request_id, 0))

    def bind(self, seed: int) -> "BoundPatience":
        return BoundPatience(self, int(seed))


class BoundPatience:
    """A patience law with its seed: ``bound(request_id)`` is that request's patience (s)."""

    __slots__ = ("law", "seed")

    def __init__(self, law: Patience, seed: int):
        self.law, self.seed = law, seed

    def __call__(self, request_id: int) -> float:
        return self.law.draw(self.seed, request_id)
