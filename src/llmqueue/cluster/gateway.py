"""The gateway's control before the accelerator: token buckets, admission by queue depth or age,
tier shedding, fallback and graceful degradation (:class:`~llmqueue.cluster.spec.Gateway` says
the rules).

In queueing terms the gateway turns the fleet into a loss system where it rejects (a token
bucket is a (sigma, rho) regulator: at most ``burst + rate t`` admissions in any window of
length t; a bound on queue depth is a finite waiting room, M/G/c/K) and shifts load between
pools where it falls back; degradation makes the service time depend on the queue's state (a
cap on the output tokens while the queue is old: a queue whose server speeds up when loaded).
"""

from __future__ import annotations

from llmqueue.cluster.autoscaler import METRICS


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; an admission takes ``cost`` (1 a request,
    or its tokens for a token limit). A (sigma, rho) regulator: at most ``burst + rate t`` admitted
    in any window of length t."""

    __slots__ = ("rate", "burst", "tokens", "t")

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst, self.tokens, self.t = rate, burst, burst, 0.0

    def take(self, t: float, cost: float = 1.0) -> bool:
        tok = min(self.burst, self.tokens + (t - self.t) * self.rate)
        self.t = t
        if tok >= cost:
            self.tokens = tok - cost
            return True
        self.tokens = tok
        return False

    def wait(self, cost: float = 1.0) -> float:
        """Seconds until ``cost`` would be admitted, from the last :meth:`take`: what a refused
        client is told to wait (``Retry-After``). A cost above the burst never fits: the time to
        refill the whole burst."""
        return max(min(cost, self.burst) - self.tokens, 0.0) / self.rate

    def full(self, t: float) -> bool:
        """Whether the bucket holds ``burst`` at ``t`` (from then on it admits as a new one does)."""
        return self.tokens + (t - self.t) * self.rate >= self.burst


def request_cost(r) -> float:
    """The tokens a request may cost: its prompt and the most it may generate (a token limit
    charges it at admission, before the answer says what it used)."""
    return float(r.num_prompt_tokens + r.max_tokens)


#: tenants with per-tenant buckets kept before the full ones are forgotten (then twice those left)
TENANT_SWEEP = 4096


class GatewayRuntime:
    """Applies a :class:`~llmqueue.cluster.spec.Gateway` at each arrival. ``tenant_of(request)``:
    the tenant a per-tenant limit counts it against (its class by default: the simulator's
    workloads name tenants by class; the live gateway reads the client's key or ``X-Tenant``).
    ``retry_after_s``: after a rate limit's refusal, how long until its bucket would admit the
    request (the live gateway's ``Retry-After``)."""

    def __init__(self, spec, tenant_of=None):
        self.spec = spec
        self.buckets = {k: TokenBucket(rl.rate, rl.burst) for k, rl in spec.rate_limits.items()}
        self.tenant_of = tenant_of or (lambda r: r.class_name)
        self.tenant_buckets: dict = {}  # tenant -> (request bucket or None, token bucket or None)
        self._sweep_at = TENANT_SWEEP
        self.fallback = {fb.pool: fb for fb in spec.fallbacks}
        self.fallbacks_taken = 0
        self.retry_after_s = 0.0
        self.degraded = None  # the Degrade rule the last decision applied (None: served as asked)

    def _tenant(self, tenant, t: float):
        b = self.tenant_buckets.get(tenant)
        if b is None:
            if len(self.tenant_buckets) >= self._sweep_at:
                self._forget_full(t)
            lim = self.spec.tenant_limits.get(tenant) or self.spec.tenant_limits.get("*")
            b = (None, None) if lim is None else (
                TokenBucket(lim.rate, lim.burst) if lim.rate is not None else None,
                TokenBucket(lim.tokens_per_s, lim.token_burst) if lim.tokens_per_s is not None else None)
            self.tenant_buckets[tenant] = b
        return b

    def _forget_full(self, t: float) -> None:
        """Forget the tenants whose buckets are full at ``t``: a full bucket admits as a new one
        does, so the decisions are the same, and a client that names a new tenant each request
        (its key or ``X-Tenant``) holds at most the tenants active within a refill, not every one
        it named."""
        self.tenant_buckets = {k: b for k, b in self.tenant_buckets.items()
                               if not all(x is None or x.full(t) for x in b)}
        self._sweep_at = max(TENANT_SWEEP, 2 * len(self.tenant_buckets))

    def decide(self, r, view, views: dict, t: float):
        """``(view, None)`` to serve ``r`` in the pool of ``view``, or ``(view, reason)`` to reject it.
        ``view``: the :class:`~llmqueue.cluster.view.PoolView` of the pool its lane chose; ``views``:
        every pool's, by name (a fallback's target). Reads numbers only: the same rules run in the
        simulator and in front of live engines. ``degraded`` is then the
        :class:`~llmqueue.cluster.spec.Degrade` rule that applied (its cap is the caller's to apply
        to the request: :func:`capped`), or None."""
        s = self.spec
        self.degraded = None
        for key in (r.class_name, "*"):
            b = self.buckets.get(key)
            if b is not None and not b.take(t):
                self.retry_after_s = b.wait()
                return view, f"rate limited ({key})"
        if s.tenant_limits:
            tenant = self.tenant_of(r)
            reqs, toks = self._tenant(tenant, t)
            if reqs is not None and not reqs.take(t):
                self.retry_after_s = reqs.wait()
                return view, f"rate limited (tenant {tenant})"
            cost = request_cost(r)
            if toks is not None and not toks.take(t, cost):
                if reqs is not None:
                    reqs.tokens += 1.0  # the request was not admitted: its request token back
                self.retry_after_s = toks.wait(cost)
                return view, f"token limited (tenant {tenant})"
        fb = self.fallback.get(view.name)
        if fb is not None and view.queue_age(t) > fb.queue_age_s:
            self.fallbacks_taken += 1
            view = views[fb.to]
        for dg in s.degrade:
            if dg.pool == view.name and dg.applies(r.class_name) and view.queue_age(t) > dg.queue_age_s:
                if dg.to is not None:
                    view = views[dg.to]
                elif r.max_tokens <= dg.max_tokens:
                    break  # it asks no more than the cap: served as asked
                self.degraded = dg
                break
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


def capped(max_tokens: int, rule) -> int:
    """The ``max_tokens`` a request asking ``max_tokens`` is served with under ``rule`` (the
    :class:`~llmqueue.cluster.spec.Degrade` its decision applied, or None)."""
    if rule is None or rule.max_tokens is None:
        return max_tokens
    return min(max_tokens, rule.max_tokens)


def uses_queue_age(spec, autoscalers) -> bool:
    """Whether anything reads the pools' queue age (then the fleet tracks first tokens)."""
    g = spec
    return bool(g is not None and (g.max_queue_age_s is not None or g.shed or g.fallbacks or g.degrade)) or any(
        METRICS[m].first_tokens for a in autoscalers for m in (a.metric, *a.also))
