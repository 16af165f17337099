"""The gateway's control before the accelerator: token buckets, admission by queue depth or age,
tier shedding and fallback (:class:`~llmqueue.cluster.spec.Gateway` says the rules).

In queueing terms the gateway turns the fleet into a loss system where it rejects (a token
bucket is a (sigma, rho) regulator: at most ``burst + rate t`` admissions in any window of
length t; a bound on queue depth is a finite waiting room, M/G/c/K) and shifts load between
pools where it falls back.
"""

from __future__ import annotations

from llmqueue.cluster.autoscaler import METRICS


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; an admission takes one."""

    __slots__ = ("rate", "burst", "tokens", "t")

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst, self.tokens, self.t = rate, burst, burst, 0.0

    def take(self, t: float) -> bool:
        tok = min(self.burst, self.tokens + (t - self.t) * self.rate)
        self.t = t
        if tok >= 1.0:
            self.tokens = tok - 1.0
            return True
        self.tokens = tok
        return False


class GatewayRuntime:
    """Applies a :class:`~llmqueue.cluster.spec.Gateway` at each arrival."""

    def __init__(self, spec):
        self.spec = spec
        self.buckets = {k: TokenBucket(rl.rate, rl.burst) for k, rl in spec.rate_limits.items()}
        self.fallback = {fb.pool: fb for fb in spec.fallbacks}
        self.fallbacks_taken = 0

    def decide(self, r, view, views: dict, t: float):
        """``(view, None)`` to serve ``r`` in the pool of ``view``, or ``(view, reason)`` to reject it.
        ``view``: the :class:`~llmqueue.cluster.view.PoolView` of the pool its lane chose; ``views``:
        every pool's, by name (a fallback's target). Reads numbers only: the same rules run in the
        simulator and in front of live engines."""
        s = self.spec
        for key in (r.class_name, "*"):
            b = self.buckets.get(key)
            if b is not None and not b.take(t):
                return view, f"rate limited ({key})"
        fb = self.fallback.get(view.name)
        if fb is not None and view.queue_age(t) > fb.queue_age_s:
            self.fallbacks_taken += 1
            view = views[fb.to]
        if s.max_queue_depth is not None:
            serving = max(view.serving(), 1)
            if view.queue_depth() >= s.max_queue_depth * serving:
                return view, "queue full"
        age = None
        if s.max_queue_age_s is not None:
            age = view.queue_age(t)
            if age > s.max_queue_age_s:
                return view, "queue age"
        for sh in s.shed:
            if r.priority >= sh.min_priority:
                age = view.queue_age(t) if age is None else age
                if age > sh.queue_age_s:
                    return view, f"shed (priority {r.priority})"
        return view, None


def uses_queue_age(spec, autoscalers) -> bool:
    """Whether anything reads the pools' queue age (then the fleet tracks first tokens)."""
    g = spec
    return bool(g is not None and (g.max_queue_age_s is not None or g.shed or g.fallbacks)) or any(
        METRICS[m].first_tokens for a in autoscalers for m in (a.metric, *a.also))
