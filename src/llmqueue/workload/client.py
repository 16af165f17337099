"""Client behaviour: timeouts, cancellations and retries, decided the same way everywhere.

The Queueing System essay names the feedback loop: "timeouts and cancellations feed back into the system as new
arrivals, which raises load during degradation", and lists "retry amplification" among the
metrics that matter. This module holds the client side of that loop as plain data
(:class:`ClientBehavior`, :class:`RetryPolicy`) and one pure decision function, so that the
simulator and the real-server benchmark retry identically.

Protocol (who calls what, when)
-------------------------------
A *request* is one unit of user demand: one ``request_id`` (from the workload, e.g.
:meth:`ClassMix.generate <llmqueue.workload.classes.ClassMix.generate>`), one class, one prompt
and output length. An *attempt* is one try at serving it; attempts are numbered from 1. Every
attempt gives one row of the request record (:mod:`llmqueue.records.schema`): retries share the
``request_id`` and have ``attempt`` = 2, 3, ...; each row's ``arrival_s`` is that attempt's own
send time, so its latencies (``ttft_s``, ``e2el_s``) are per attempt. The latency a user saw
across retries is ``finish_s`` of the last attempt minus ``arrival_s`` of attempt 1.

The *runner* (the simulator's event loop, or the benchmark's open-loop sender) does this:

1. Send attempt 1 of request ``r`` at its workload arrival time.
2. Enforce the client's deadlines on every attempt sent at ``t_send`` (its ``arrival_s``): if no
   first token by :meth:`ClientBehavior.ttft_deadline` ``(t_send)``, or not finished by
   :meth:`ClientBehavior.deadline` ``(t_send)``, the client cancels it (the simulator frees its
   KV blocks; the benchmark closes the stream). Its status is ``timeout`` and ``finish_s`` is the
   deadline.
3. When an attempt ends, with any status (``ok``, ``rejected`` by the server, ``timeout``,
   ``cancelled``, ``error``, ``unfinished``), write its record and call
   ``decide(request_id, attempt, status, t_end)`` with ``t_end`` = its ``finish_s``.
4. If ``decide`` returns a time ``t``, send attempt ``attempt + 1`` of the same request (same
   id, class, prompt and output lengths) at ``t``: back to step 2. If it returns ``None``, the
   request is over; its last record's status is its outcome.

``decide`` never retries ``ok``, ``cancelled`` (the user gave up; a client timeout is
``timeout``) or ``unfinished`` (still in flight when the run stopped). It retries ``rejected``,
``timeout`` and ``error`` when they are listed in ``retry_on`` and fewer than ``max_attempts``
attempts were made. The next attempt is sent at ``t_end + delay`` with exponential backoff::

    delay_k = min(cap_s, backoff_s * multiplier ** (k - 1)) * (1 - jitter * u)

for the k-th retry (sent after attempt ``k`` failed), where ``u`` in [0, 1) is
:func:`jitter_uniform` ``(seed, request_id, k)``. ``jitter = 0`` is no jitter, ``0.5`` AWS's
"equal jitter", ``1`` "full jitter" (uniform on ``[0, delay]``); the OpenAI Python SDK uses 0.25.

Determinism: ``decide`` is a pure function of ``(seed, request_id, attempt, status, t_end)``. The
jitter comes from a SplitMix64 hash of ``(seed, request_id, attempt)``, not from shared random
state, so the simulator and the benchmark, on any backend and in any event order, make the same
decisions, and a what-if run that changes the server leaves the client's draws unchanged.
``seed`` is the run's seed (request ids are unique within a run). ``ClientBehavior`` holds no
seed: ``behavior.decide(..., seed=s)`` or ``behavior.bind(s).decide(...)``; per class,
:meth:`ClassMix.clients(seed) <llmqueue.workload.classes.ClassMix.clients>`, or one callable
for a whole run, ``ClassMix.retry_function(seed, requests)`` (what the engine's
``SimOptions(retry=..., timeout_s=mix.timeouts())`` takes).

Retry amplification: if each attempt fails (retryably) with probability ``p`` independently and
at most ``n`` attempts are made, a request makes ``(1 - p^n) / (1 - p)`` attempts on average
(:func:`retry_amplification`), so the server sees ``lam * (1 - p^n) / (1 - p)`` req/s; ``p``
itself grows with load, which is the feedback loop of the Queueing System essay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmqueue._result import Result
from llmqueue._validate import finite, nonnegative, positive, positive_int, probability
from llmqueue.errors import InputError
from llmqueue.workload.hashed import as_int as _int
from llmqueue.workload.hashed import hashed_uniform

#: Outcomes of an attempt, as in the request record (``llmqueue.records.schema.STATUSES``).
STATUSES = ("ok", "rejected", "timeout", "cancelled", "error", "unfinished")
#: Statuses a client may retry.
RETRYABLE = ("rejected", "timeout", "error")

_SALT = 0x6C6C6D7175657565  # "llmqueue": separates retry jitter from any other use of the seed


def jitter_uniform(seed: int, request_id: int, attempt: int) -> float:
    """A uniform number in [0, 1) determined by ``(seed, request_id, attempt)`` alone.

    ``h = mix(mix(mix(SALT ^ seed) ^ request_id) ^ attempt)`` with SplitMix64's ``mix`` (all
    64-bit, two's complement for negative ids); the top 53 bits of ``h`` over ``2^53``. Any
    backend can recompute it bit for bit.
    """
    return hashed_uniform(_SALT, seed, request_id, attempt)


def _retry_on(value) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else tuple(value)
    out = []
    for s in items:
        if not isinstance(s, str) or s not in RETRYABLE:
            why = "is never retried" if s in STATUSES else "is not a status"
            raise InputError("retry_on", f"{s!r} {why}", f"choose from {', '.join(RETRYABLE)}")
        if s not in out:
            out.append(s)
    return tuple(sorted(out, key=RETRYABLE.index))


@dataclass(frozen=True)
class RetryPolicy(Result):
    """When and how soon a client retries a failed attempt: capped exponential backoff with jitter.

    ``max_attempts`` counts the first try (1 = never retry). ``retry_on`` lists the statuses
    retried (a subset of ``rejected``, ``timeout``, ``error``). The k-th retry waits
    ``min(cap_s, backoff_s * multiplier**(k-1)) * (1 - jitter * u)`` seconds after attempt k
    ended (see the module docstring for ``u``).

    The backoff defaults are the OpenAI Python SDK's (``openai/_constants.py`` and
    ``_base_client.py``: ``INITIAL_RETRY_DELAY = 0.5``, doubling, ``MAX_RETRY_DELAY = 8.0``,
    ``jitter = 1 - 0.25 * random()``; it retries HTTP 408, 409, 429 and 5xx, i.e. our
    ``timeout``, ``rejected`` and ``error``). Its ``DEFAULT_MAX_RETRIES = 2`` would be
    ``max_attempts = 3``; the default here is 1 so that retries are always asked for explicitly.
    """

    max_attempts: int = 1
    retry_on: tuple[str, ...] = RETRYABLE
    backoff_s: float = 0.5
    multiplier: float = 2.0
    cap_s: float = 8.0
    jitter: float = 0.25

    def __post_init__(self):
        object.__setattr__(self, "max_attempts", positive_int("max_attempts", self.max_attempts))
        object.__setattr__(self, "retry_on", _retry_on(self.retry_on))
        object.__setattr__(self, "backoff_s", nonnegative("backoff_s", self.backoff_s))
        m = finite("multiplier", self.multiplier)
        if m < 1:
            raise InputError("multiplier", f"must be >= 1 (got {m:g})", "1 gives a constant backoff")
        object.__setattr__(self, "multiplier", m)
        object.__setattr__(self, "cap_s", positive("cap_s", self.cap_s, allow_inf=True))
        object.__setattr__(self, "jitter", probability("jitter", self.jitter, open_low=False, open_high=False))

    def base_delay(self, k: int) -> float:
        """The k-th retry's delay before jitter: ``min(cap_s, backoff_s * multiplier**(k-1))``."""
        k = positive_int("k", k)
        if self.backoff_s == 0:
            return 0.0
        if self.multiplier > 1:
            # compare in logs so that huge k cannot overflow
            if math.log(self.backoff_s) + (k - 1) * math.log(self.multiplier) >= math.log(self.cap_s):
                return self.cap_s
        return min(self.cap_s, self.backoff_s * self.multiplier ** (k - 1))

    def delay(self, k: int, u: float = 0.0) -> float:
        """The k-th retry's delay for a jitter draw ``u`` in [0, 1)."""
        return self.base_delay(k) * (1.0 - self.jitter * u)


@dataclass(frozen=True)
class ClientBehavior(Result):
    """How a client treats its requests: deadlines and retries (no seed; see :meth:`bind`).

    ``timeout_s``: the client cancels an attempt not finished ``timeout_s`` after it was sent
    (``None``: never). ``ttft_timeout_s``: it cancels one with no first token by then. Both
    give status ``timeout``. ``retry``: a :class:`RetryPolicy` (or a dict of its fields).
    ``patience``: a :class:`~llmqueue.workload.patience.Patience` law (or its spec, ``exp:30``):
    each request's own wait for service before its client gives up (status ``cancelled``).
    """

    timeout_s: float | None = None
    ttft_timeout_s: float | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    patience: object = None

    def __post_init__(self):
        for name in ("timeout_s", "ttft_timeout_s"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, positive(name, v))
        if self.patience is not None:
            from llmqueue.workload.patience import Patience

            object.__setattr__(self, "patience", Patience.parse(self.patience))
        r = self.retry
        if isinstance(r, dict):
            r = RetryPolicy(**r)
        elif not isinstance(r, RetryPolicy):
            raise InputError("retry", f"expected a RetryPolicy or a dict of its fields, got {r!r}")
        object.__setattr__(self, "retry", r)

    def deadline(self, sent_s: float) -> float:
        """Absolute time at which the client cancels an attempt sent at ``sent_s`` (inf: never)."""
        return sent_s + self.timeout_s if self.timeout_s is not None else math.inf

    def ttft_deadline(self, sent_s: float) -> float:
        """Absolute time by which the attempt sent at ``sent_s`` must show a first token (inf: none)."""
        return sent_s + self.ttft_timeout_s if self.ttft_timeout_s is not None else math.inf

    def decide(self, request_id: int, attempt: int, status: str, t_end: float, *, seed: int) -> float | None:
        """The absolute send time of the next attempt of ``request_id``, or ``None`` for no retry.

        ``attempt`` is the attempt that just ended (1 for the first try), ``status`` its
        outcome (one of :data:`STATUSES`), ``t_end`` the time it ended (its ``finish_s``).
        Pure: the same arguments always give the same answer (see the module docstring).
        """
        if status not in STATUSES:
            raise InputError("status", f"unknown status {status!r}", f"expected one of {', '.join(STATUSES)}")
        attempt = positive_int("attempt", attempt)
        t_end = finite("t_end", t_end)
        rid = _int("request_id", request_id)
        r = self.retry
        if status not in r.retry_on or attempt >= r.max_attempts:
            return None
        u = jitter_uniform(seed, rid, attempt) if r.jitter > 0 else 0.0
        return t_end + r.delay(attempt, u)

    def bind(self, seed: int) -> "BoundClient":
        """This behaviour with a seed: an object whose ``decide`` takes the four protocol arguments."""
        return BoundClient(self, _int("seed", seed))


@dataclass(frozen=True)
class BoundClient:
    """A :class:`ClientBehavior` with its jitter seed; what a runner holds per class."""

    behavior: ClientBehavior
    seed: int

    def decide(self, request_id: int, attempt: int, status: str, t_end: float) -> float | None:
        """See :meth:`ClientBehavior.decide`."""
        return self.behavior.decide(request_id, attempt, status, t_end, seed=self.seed)

    def deadline(self, sent_s: float) -> float:
        return self.behavior.deadline(sent_s)

    def ttft_deadline(self, sent_s: float) -> float:
        return self.behavior.ttft_deadline(sent_s)


def retry_amplification(p: float, max_attempts: int) -> float:
    """Mean attempts per request, the offered-load multiplier of retries: ``(1 - p^n) / (1 - p)``.

    Each attempt fails (with a retried status) independently with probability ``p``; at most
    ``n = max_attempts`` attempts. Attempts ``N`` are geometric truncated at ``n``:
    ``E[N] = sum_{k<n} p^k``, which is ``n`` at ``p = 1``. The server sees ``lam * E[N]`` req/s.
    """
    p = probability("p", p, open_low=False, open_high=False)
    n = positive_int("max_attempts", max_attempts)
    if p == 1.0:
        return float(n)
    return (1.0 - p ** n) / (1.0 - p)


def retry_success_probability(p: float, max_attempts: int) -> float:
    """Probability that a request eventually succeeds: ``1 - p^n`` (same assumptions as
    :func:`retry_amplification`)."""
    p = probability("p", p, open_low=False, open_high=False)
    n = positive_int("max_attempts", max_attempts)
    return 1.0 - p ** n
