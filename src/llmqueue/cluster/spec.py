"""What a fleet is: pools of replicas, lanes, P/D disaggregation, the gateway, autoscalers, faults.

The one description of a fleet: pydantic models, each field declared once with its type, default
and range. A scenario file's ``deployment.lanes``, ``disaggregation``, ``gateway``,
``autoscalers`` and ``faults`` are read into these models (a file's pool is a :class:`Pool`'s keys
with the engine knobs it overrides, :mod:`llmqueue.scenario.fleet`), the command line
(``--replicas``, ``--router``, ``--disaggregate``) builds them, and
:func:`llmqueue.cluster.simulate_fleet` runs them.

Built in Python, a part (``Pool("chat", config, step_time, 4)``, ``Lane("x", "chat")``, positional
arguments in field order as for a dataclass) is kept as given and checked when a
:class:`FleetSpec` takes it; read from a file it is checked on the way in. Either way a problem is
one :class:`~llmqueue.errors.InputError` naming the field's path (``lanes[1].pool``, or
``deployment.lanes[1].pool`` in a scenario), and the references between the parts (a lane's pool,
the P/D pair, fallbacks, autoscalers, faults) are checked once, by :meth:`FleetSpec.check`.

Queueing terms: a pool is c servers (replicas) each a batch server of its own ``mu``; a lane is
a class-based split of the arrival stream (``lam_k`` to pool k); P/D is a tandem (Jackson)
network prefill -> link -> decode; the gateway is admission control before the queue
(token buckets, a bound on queue depth or age); an autoscaler changes c over time with a
provisioning delay.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from llmqueue._schema import Float, Int, _clean_name, _fmt_loc, _from_validation_error, _no_bool, _Problem, _Section
from llmqueue.cluster.autoscaler import METRICS, WAITING
from llmqueue.cluster.routers import ROUTERS, LeastOutstanding
from llmqueue.errors import InputError

#: A pool's roles: serves both phases, or one side of a P/D pair
ROLES = MIXED, PREFILL, DECODE = ("mixed", "prefill", "decode")
#: What a failed replica's requests in flight do: fail, or are sent again to the others
INFLIGHT = FAIL, RETRY = ("fail", "retry")


# --- field types: the ranges, with the problem said as the fleet says it ---------------------------

def _at_least(lo: float, *, strict: bool = False):
    def check(v):
        if v != v:
            raise _Problem((), f"must be a number (got {v!r})")
        if v < lo or (strict and v == lo):
            raise _Problem((), f"must be {'>' if strict else '>='} {lo:g} (got {v!r})")
        return v
    return AfterValidator(check)


def _whole_at_least(lo: int):
    def check(v):
        if v < lo:
            raise _Problem((), f"must be a whole number >= {lo} (got {v!r})")
        return v
    return AfterValidator(check)


def _one_of(names, what: str):
    """A name that must be one of ``names`` (read when checked: a registry may grow)."""
    def check(v):
        if v not in names:
            raise _Problem((), f"unknown {what} {v!r}", f"choose one of: {', '.join(names)}")
        return v
    return AfterValidator(check)


def _none_is(make):
    """``null`` means ``make()`` (as leaving the key out does)."""
    return BeforeValidator(lambda v: make() if v is None else v)


NonNegative = Annotated[Float, _at_least(0.0)]
Positive = Annotated[Float, _at_least(0.0, strict=True)]
#: seconds or Gbit/s where ``null`` (or left out) is infinite: never, or a free link
PositiveOrInf = Annotated[float, Field(allow_inf_nan=True), BeforeValidator(_no_bool("a number")),
                          _none_is(lambda: math.inf), _at_least(0.0, strict=True)]
Whole = Annotated[Int, _whole_at_least(0)]
Name = Annotated[str, AfterValidator(_clean_name)]


class _PartMeta(type(BaseModel)):  # type: ignore[misc]
    """Calling a part from Python keeps what it is given (positional arguments in field order,
    like a dataclass) unchecked: the :class:`FleetSpec` that takes it checks it at its path."""

    def __call__(cls, *args, **kw):
        names = list(cls.model_fields)
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__}() takes {len(names)} arguments ({len(args)} given)")
        for name, v in zip(names, args):
            if name in kw:
                raise TypeError(f"{cls.__name__}() got multiple values for {name!r}")
            kw[name] = v
        unknown = set(kw) - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        return cls.model_construct(**kw)


class _Part(_Section, metaclass=_PartMeta):
    """A part of a fleet: checked when a fleet (or a file) holds it, again whenever it is given
    to another fleet (it may have been changed since)."""

    model_config = ConfigDict(revalidate_instances="always")

    if TYPE_CHECKING:  # what _PartMeta accepts
        def __init__(self, *args: Any, **kw: Any) -> None: ...


def _at_most_4096(v: int) -> int:
    if v > 4096:
        raise _Problem((), f"at most 4096 replicas (got {v})")
    return v


def _known_router(v):
    """A router's name (:data:`~llmqueue.cluster.routers.ROUTERS`), or a router object."""
    if isinstance(v, str) and v not in ROUTERS:
        raise _Problem((), f"unknown router {v!r}", f"choose one of: {', '.join(ROUTERS)}")
    return v


class Pool(_Part):
    """c = ``replicas`` replicas of one engine (``config``, ``step_time``) behind ``router``.

    ``config``: the engine (:class:`~llmqueue.engine.config.EngineConfig`); ``step_time``: its
    step-time model or spec (a scenario's pool: resolved from its engine knobs). ``model``: the
    served model's name (the records' ``model``); ``role``: ``mixed`` (prefill and decode), or one
    side of a P/D pair; ``cost_per_replica_hour`` and ``quality`` (relative, 1 = the primary model)
    feed the fallback's cost and quality account. ``kv_bytes_per_token``: the KV a token occupies
    (P/D transfers; from the hardware layer)."""

    name: Name
    config: Any = None
    step_time: Any = None
    replicas: Annotated[Whole, AfterValidator(_at_most_4096)] = 1
    router: Annotated[Any, AfterValidator(_known_router)] = LeastOutstanding.name
    model: str = ""
    role: Annotated[str, _one_of(ROLES, "role")] = MIXED
    cost_per_replica_hour: NonNegative = 0.0
    quality: NonNegative = 1.0
    kv_bytes_per_token: NonNegative = 0.0


class Lane(_Part):
    """Sends the requests it matches to ``pool``: by class (``classes``; empty = any class) and
    prompt length (``prompt_min <= prompt tokens < prompt_max``). The first lane that matches
    takes a request; one that matches no lane goes to the first pool. ``name`` defaults to the
    pool's. ``batch_window_s`` > 0: the gateway holds the lane's requests and sends them to the
    pool together when the window the first of them opened closes (static batching: a
    batch-service queue whose server takes whatever gathered), or as soon as ``batch_size``
    (> 0) are held (dynamic batching)."""

    name: str | None = None
    pool: str
    classes: Annotated[tuple[str, ...], _none_is(tuple)] = ()
    prompt_min: Whole = 0
    prompt_max: Annotated[Int, _whole_at_least(1)] | None = None
    batch_window_s: NonNegative = 0.0
    batch_size: Whole = 0

    @model_validator(mode="after")
    def _check(self):
        if self.name is None:
            self.name = self.pool
        if self.prompt_max is not None and self.prompt_max <= self.prompt_min:
            raise _Problem(("prompt_max",), f"must be above prompt_min {self.prompt_min} (got {self.prompt_max})")
        if self.batch_size and not self.batch_window_s:
            raise _Problem(("batch_size",), "needs a batch_window_s (the longest a request is held)",
                           "give batch_window_s, or drop batch_size")
        return self

    def matches(self, class_name: str, prompt_tokens: int) -> bool:
        if self.classes and class_name not in self.classes:
            return False
        return self.prompt_min <= prompt_tokens and (self.prompt_max is None or prompt_tokens < self.prompt_max)


class Disaggregation(_Part):
    """Prefill/decode disaggregation: ``prefill`` computes the prompt and the first token, the KV
    crosses the link, ``decode`` admits the request when its KV has arrived and it has room. The
    link is one FCFS server of rate ``kv_link_gbps`` (Gbit/s; a transfer of B bytes holds it
    B / rate seconds, so transfers contend; left out: free) plus a propagation
    ``kv_link_latency_ms`` that does not hold it."""

    prefill: str
    decode: str
    kv_link_gbps: PositiveOrInf = math.inf
    kv_link_latency_ms: NonNegative = 0.0


class RateLimit(_Part):
    """A token bucket: ``rate`` requests per second, at most ``burst`` at once, for one class
    (``"*"``: all traffic). An arrival that finds it empty is rejected (HTTP 429)."""

    rate: Positive
    burst: Annotated[Float, _at_least(1.0)] = 1.0


class Shed(_Part):
    """Tier shedding: requests whose class priority is >= ``min_priority`` (a lower tier: vLLM's
    larger value) are rejected while the pool's queue age exceeds ``queue_age_s``."""

    min_priority: Annotated[Int, _whole_at_least(-(2**31))]
    queue_age_s: NonNegative


class Fallback(_Part):
    """While ``pool``'s queue age exceeds ``queue_age_s``, its new requests go to ``to`` (another
    model; its quality and cost go into the summary)."""

    pool: str
    to: str
    queue_age_s: NonNegative


class Degrade(_Part):
    """Graceful degradation: while ``pool``'s queue age exceeds ``queue_age_s``, its new requests
    of ``classes`` (empty: every class) are served smaller: ``max_tokens`` caps what they may
    generate (the answer is cut at the cap; ``quality``: the relative quality of a capped answer,
    an assumption to state), or ``to`` sends them to another pool (a smaller model; its pool's
    quality counts). Exactly one of the two. In queueing terms: a state-dependent service time
    (the cap shortens E[g] of the admitted work while the queue is old) or a state-dependent
    routing, the fallback's, per class."""

    pool: str
    queue_age_s: NonNegative
    classes: Annotated[tuple[str, ...], _none_is(tuple)] = ()
    max_tokens: Annotated[Int, _whole_at_least(1)] | None = None
    to: str | None = None
    quality: NonNegative = 1.0

    @model_validator(mode="after")
    def _one_action(self):
        if (self.max_tokens is None) == (self.to is None):
            raise _Problem(("max_tokens",), "give exactly one of max_tokens (a cap) and to (another pool)",
                           "e.g. max_tokens: 128, or to: small")
        if self.to is not None and "quality" in self.model_fields_set:
            raise _Problem(("quality",), "is the capped answer's quality; a switch counts its pool's quality",
                           f"set quality on pool {self.to!r}, or drop it here")
        return self

    def applies(self, class_name: str) -> bool:
        return not self.classes or class_name in self.classes

    @property
    def label(self) -> str:
        """What the request's record says of it (the ``degraded`` column)."""
        return f"max_tokens {self.max_tokens}" if self.max_tokens is not None else f"to {self.to}"


class TenantLimit(_Part):
    """One tenant's limits: ``rate`` requests a second (``burst`` at once) and ``tokens_per_s``
    tokens a second (``token_burst`` at once; a request costs its prompt plus its ``max_tokens``);
    either may be absent."""

    rate: Positive | None = None
    burst: Annotated[Float, _at_least(1.0)] = 1.0
    tokens_per_s: Positive | None = None
    token_burst: Annotated[Float, _at_least(1.0)] = 1.0


class Gateway(_Part):
    """Control before the accelerator, applied at each arrival in this order: rate limits (per
    class, ``"*"``: all traffic; then ``tenant_limits``), fallback, degradation, admission
    (``max_queue_depth``: waiting requests per serving replica of the pool; ``max_queue_age_s``:
    age of the pool's oldest request without a first token), tier shedding. Queue age is what a
    gateway can see: time since arrival of the oldest request the pool holds that has no first
    token yet. ``degrade``: graceful degradation (:class:`Degrade`: a cap on ``max_tokens`` or
    another pool for some classes while the queue is old). ``tenant_limits``: tenant
    (``"*"``: each tenant not named) -> its request and token rates (:class:`TenantLimit`, checked
    after the class limits); the simulator's tenants are its classes. ``fair_share``: tenant -> weight; when set, a pool's gateway queue (the central router's, or while no replica
    serves) is served in weighted fair order by tokens (:mod:`llmqueue.cluster.fairness`), tenants
    not named weighing 1, instead of first come first served."""

    rate_limits: Annotated[dict[str, RateLimit], _none_is(dict)] = Field(default_factory=dict)
    tenant_limits: Annotated[dict[str, TenantLimit], _none_is(dict)] = Field(default_factory=dict)
    fair_share: Annotated[dict[str, Positive], _none_is(dict)] = Field(default_factory=dict)
    max_queue_depth: Positive | None = None
    max_queue_age_s: Positive | None = None
    shed: Annotated[list[Shed], _none_is(list)] = Field(default_factory=list)
    fallbacks: Annotated[list[Fallback], _none_is(list)] = Field(default_factory=list)
    degrade: Annotated[list[Degrade], _none_is(list)] = Field(default_factory=list)


#: The shortest autoscaler interval (s): a few engine steps (tens of ms each); a shorter one adds
#: ticks without changing a decision (Kubernetes' HPA reads every 15 s)
MIN_INTERVAL_S = 0.1


class Autoscaler(_Part):
    """Scales ``pool`` between ``min_replicas`` and ``max_replicas``: every ``interval_s`` it reads
    ``metric`` (one of :data:`~llmqueue.cluster.autoscaler.METRICS`) and asks for
    ceil(c x metric / target) replicas (Kubernetes' HPA rule; replicas still starting count as
    idle, see :mod:`llmqueue.cluster.autoscaler`), or, for the model-based ``p99_ttft`` (target in
    seconds), the fewest replicas whose M/M/c prediction of the p99 time to first token meets the
    target (:mod:`llmqueue.cluster.predict`); ``also``: more ``{metric: target}``, and it asks for
    the largest count any of them gives (HPA with several metrics). New replicas serve after
    ``provisioning_delay_s`` (cold start); it scales down only ``cooldown_s`` after its last change
    (up or down), by at most ``scale_down_step`` replicas at a time (HPA's scale-down policy), and
    a replica it removes stops taking requests and leaves when it has drained."""

    pool: str
    metric: Annotated[str, _one_of(METRICS, "metric")] = WAITING
    target: Positive = 1.0
    interval_s: Annotated[Float, _at_least(MIN_INTERVAL_S)] = 15.0
    provisioning_delay_s: NonNegative = 0.0
    cooldown_s: NonNegative = 300.0
    min_replicas: Whole = 1
    max_replicas: Annotated[Int, _whole_at_least(1)] = 64
    also: dict[str, Float] = Field(default_factory=dict)  # more metric -> target pairs: the largest count any asks for
    scale_down_step: Annotated[Int, _whole_at_least(1)] = 1  # replicas removed at most per scale-down

    @field_validator("also")
    @classmethod
    def _also(cls, v):
        for m, target in v.items():
            if m not in METRICS:
                raise _Problem((m,), f"unknown metric {m!r}", f"choose from: {', '.join(METRICS)}")
            if not target > 0:
                raise _Problem((m,), f"must be > 0 (got {target!r})")
        return v

    @model_validator(mode="after")
    def _range(self):
        if self.max_replicas < self.min_replicas or self.max_replicas > 4096:
            raise _Problem(("max_replicas",), f"must be between min_replicas and 4096 (got {self.max_replicas})")
        return self


class Fault(_Part):
    """Replica ``replica`` of ``pool`` fails at ``at_s``: its requests in flight fail (``fail``)
    or are sent again to the others (``retry``); it serves again, empty, after ``repair_s``
    (left out: never)."""

    pool: str
    replica: Whole
    at_s: NonNegative
    repair_s: PositiveOrInf = math.inf
    inflight: Annotated[str, _one_of(INFLIGHT, "in-flight mode")] = RETRY


class FleetSpec(_Section):
    """A fleet: pools, lanes, an optional P/D pair, gateway, autoscalers and faults.

    ``FleetSpec(pools=[...], ...)`` checks every part and the references between them; a problem
    is one :class:`~llmqueue.errors.InputError` at its path (``lanes[1].pool``)."""

    pools: list[Pool]
    lanes: list[Lane] = Field(default_factory=list)
    disaggregation: Disaggregation | None = None
    gateway: Gateway | None = None
    autoscalers: list[Autoscaler] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)

    def __init__(self, **parts: Any) -> None:
        try:
            super().__init__(**parts)
        except ValidationError as err:
            raise _from_validation_error(err, top="fleet") from None

    @classmethod
    def of_checked(cls, **parts: Any) -> "FleetSpec":
        """A fleet of parts already checked (a scenario's, as its file was read): only the
        references between them are checked here."""
        spec = cls.model_construct(**parts)
        try:
            spec.check()
        except _Problem as p:
            raise InputError(_fmt_loc(p.where), p.problem, p.fix) from None
        return spec

    @model_validator(mode="after")
    def _references(self):
        self.check()
        return self

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def check(self) -> None:
        """Every reference names a pool that exists, and the P/D pair, the autoscalers and the
        faults fit the pools (raises :class:`~llmqueue._schema._Problem` at the field's path)."""
        if not self.pools:
            raise _Problem(("pools",), "a fleet needs at least one pool")
        names = set()
        for i, p in enumerate(self.pools):
            if p.name in names:
                raise _Problem(("pools", i, "name"), f"pool {p.name!r} is named twice")
            names.add(p.name)

        def ref(where, name):
            if name not in names:
                raise _Problem(where, f"no pool named {name!r}", f"name one of: {', '.join(sorted(names))}")

        for i, ln in enumerate(self.lanes):
            ref(("lanes", i, "pool"), ln.pool)
        self._check_pd()
        g = self.gateway
        if g is not None:
            for i, fb in enumerate(g.fallbacks):
                ref(("gateway", "fallbacks", i, "pool"), fb.pool)
                ref(("gateway", "fallbacks", i, "to"), fb.to)
                if fb.to == fb.pool:
                    raise _Problem(("gateway", "fallbacks", i, "to"), f"falls back to its own pool {fb.pool!r}",
                                   "name another pool")
            for i, dg in enumerate(g.degrade):
                ref(("gateway", "degrade", i, "pool"), dg.pool)
                if dg.to is not None:
                    ref(("gateway", "degrade", i, "to"), dg.to)
                    if dg.to == dg.pool:
                        raise _Problem(("gateway", "degrade", i, "to"), f"switches to its own pool {dg.pool!r}",
                                       "name another pool (a smaller model's)")
        scaled: dict = {}
        for i, a in enumerate(self.autoscalers):
            ref(("autoscalers", i, "pool"), a.pool)
            if a.pool in scaled:
                raise _Problem(("autoscalers", i, "pool"), f"pool {a.pool!r} already has an autoscaler "
                               f"({scaled[a.pool]})", "one autoscaler per pool")
            scaled[a.pool] = f"autoscalers[{i}]"
        for i, f in enumerate(self.faults):
            ref(("faults", i, "pool"), f.pool)
            n = self.pool(f.pool).replicas
            top = max([n] + [a.max_replicas for a in self.autoscalers if a.pool == f.pool])
            if f.replica >= top:
                has = f"replicas 0..{top - 1}" if top else "no replicas"
                scaled_too = " (its autoscaler's max_replicas included)" if top > n else ""
                raise _Problem(("faults", i, "replica"), f"pool {f.pool!r} has {has}{scaled_too} (got {f.replica})")

    def _check_pd(self) -> None:
        d = self.disaggregation
        roles = {p.name: p.role for p in self.pools}
        sides = (PREFILL, DECODE)
        if d is None:
            has = {r for r in roles.values() if r != MIXED}
            if has == set(sides):
                raise _Problem(("disaggregation",), "is missing: the fleet has prefill and decode pools",
                               "add a disaggregation section naming them (prefill: P, decode: D)")
            if has:
                missing = DECODE if DECODE not in has else PREFILL
                raise _Problem(("pools",), f"a P/D fleet without a {missing} pool",
                               f"add a pool with role: {missing} and a disaggregation section")
            return
        for side in sides:
            name = getattr(d, side)
            if name not in roles:
                raise _Problem(("disaggregation", side), f"no pool named {name!r}",
                               f"name one of: {', '.join(sorted(roles))}")
        if d.prefill == d.decode:
            raise _Problem(("disaggregation", DECODE), "the decode pool must differ from the prefill pool")
        for side in sides:
            name = getattr(d, side)
            if roles[name] != side:
                raise _Problem(("disaggregation", side), f"pool {name!r} has role {roles[name]}",
                               f"give pool {name!r} role: {side}")
        for i, p in enumerate(self.pools):
            if p.role != MIXED and p.name not in (d.prefill, d.decode):
                raise _Problem(("pools", i, "role"), f"pool {p.name!r} has role {p.role} but is not the "
                               f"disaggregation's {p.role} pool ({getattr(d, p.role)!r})",
                               "one P/D pair per fleet: make it role: mixed, or name it in disaggregation")
        for i, ln in enumerate(self.lanes):
            if ln.pool == d.decode:
                raise _Problem(("lanes", i, "pool"), f"{ln.pool!r} is the decode pool: requests enter a P/D "
                               "pair at its prefill pool", f"name {d.prefill!r}")

    def lane_of(self, class_name: str, prompt_tokens: int) -> tuple[str, str]:
        """(lane name, pool name) for a request; unmatched requests go to the first pool."""
        ln = self.lane(class_name, prompt_tokens)
        if ln is not None:
            return ln.name, ln.pool
        entry = self.disaggregation.prefill if self.disaggregation else self.pools[0].name
        return "", entry

    def lane(self, class_name: str, prompt_tokens: int):
        """The first lane matching a request, or None."""
        for ln in self.lanes:
            if ln.matches(class_name, prompt_tokens):
                return ln
        return None
