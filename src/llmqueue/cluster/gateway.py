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

    def decide(self, r, pool, pools: dict, t: float):
        """``(pool runtime, None)`` to serve ``r`` there, or ``(pool runtime, reason)`` to reject it."""
        s = self.spec
        for key in (r.class_name, "*"):
            b = self.buckets.get(key)
            if b is not None and not b.take(t):
                return pool, f"rate limited ({key})"
        fb = self.fallback.get(pool.name)
        if fb is not None and pool.queue_age(t) > fb.queue_age_s:
            self.fallbacks_taken += 1
            pool = pools[fb.to]
        if s.max_queue_depth is not None:
            serving = max(pool.serving(), 1)
            if pool.num_waiting() >= s.max_queue_depth * serving:
                return pool, "queue full"
        age = None
        if s.max_queue_age_s is not None:
            age = pool.queue_age(t)
            if age > s.max_queue_age_s:
                return pool, "queue age"
        for sh in s.shed:
            if r.priority >= sh.min_priority:
                age = pool.queue_age(t) if age is None else age
                if age > sh.queue_age_s:
                    return pool, f"shed (priority {r.priority})"
        return pool, None


def uses_queue_age(spec, autoscalers) -> bool:
    """Whether anything reads the pools' queue age (then the fleet tracks first tokens)."""
    g = spec
    return bool(g is not None and (g.max_queue_age_s is not None or g.shed or g.fallbacks)) or any(
        METRICS[a.metric].first_tokens for a in autoscalers)
