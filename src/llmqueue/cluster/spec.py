"""What a fleet is: pools of replicas, lanes, P/D disaggregation, the gateway, autoscalers, faults.

Plain dataclasses, checked on construction (one-line :class:`~llmqueue.errors.InputError` naming
the field path, e.g. ``lanes[1].pool``). The scenario file (``deployment.pools`` ...) and the
command line (``--replicas``, ``--router``, ``--disaggregate``) build them;
:func:`llmqueue.cluster.simulate_fleet` runs them.

Queueing terms: a pool is c servers (replicas) each a batch server of its own ``mu``; a lane is
a class-based split of the arrival stream (``lam_k`` to pool k); P/D is a tandem (Jackson)
network prefill -> link -> decode; the gateway is admission control before the queue
(token buckets, a bound on queue depth or age); an autoscaler changes c over time with a
provisioning delay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from llmqueue.errors import InputError

ROLES = ("mixed", "prefill", "decode")
INFLIGHT = ("fail", "retry")
METRICS = ("waiting", "kv", "utilization", "queue_age", "p99_ttft")


def _where(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _num(path: str, v, *, lo: float = 0.0, strict: bool = False, inf_ok: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or (math.isinf(v) and not inf_ok):
        raise InputError(path, f"must be a number (got {v!r})")
    if v < lo or (strict and v == lo):
        raise InputError(path, f"must be {'>' if strict else '>='} {lo:g} (got {v!r})")
    return float(v)


def _int(path: str, v, *, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise InputError(path, f"must be a whole number >= {lo} (got {v!r})")
    return v


@dataclass
class Pool:
    """c = ``replicas`` replicas of one engine (``config``, ``step_time``) behind ``router``.

    ``model``: the served model's name (the records' ``model``); ``role``: ``mixed`` (prefill and
    decode), or one side of a P/D pair; ``cost_per_replica_hour`` and ``quality`` (relative,
    1 = the primary model) feed the fallback's cost and quality account. ``kv_bytes_per_token``:
    the KV a token occupies (P/D transfers; from the hardware layer)."""

    name: str
    config: Any
    step_time: Any
    replicas: int = 1
    router: Any = "least-outstanding"
    model: str = ""
    role: str = "mixed"
    cost_per_replica_hour: float = 0.0
    quality: float = 1.0
    kv_bytes_per_token: float = 0.0

    def check(self, path: str) -> None:
        if not self.name or not isinstance(self.name, str):
            raise InputError(_where(path, "name"), f"must be a non-empty name (got {self.name!r})")
        _int(_where(path, "replicas"), self.replicas, lo=0)
        if self.replicas > 4096:
            raise InputError(_where(path, "replicas"), f"at most 4096 replicas (got {self.replicas})")
        if self.role not in ROLES:
            raise InputError(_where(path, "role"), f"unknown role {self.role!r}", f"choose one of: {', '.join(ROLES)}")
        _num(_where(path, "cost_per_replica_hour"), self.cost_per_replica_hour)
        _num(_where(path, "quality"), self.quality)
        _num(_where(path, "kv_bytes_per_token"), self.kv_bytes_per_token)
        if isinstance(self.router, str):
            from llmqueue.cluster.routers import ROUTERS

            if self.router not in ROUTERS:
                raise InputError(_where(path, "router"), f"unknown router {self.router!r}",
                                 f"choose one of: {', '.join(ROUTERS)}")


@dataclass
class Lane:
    """Sends the requests it matches to ``pool``: by class (``classes``; empty = any class) and
    prompt length (``prompt_min <= prompt tokens < prompt_max``). The first lane that matches
    takes a request; one that matches no lane goes to the first pool. ``batch_window_s`` > 0: the
    gateway holds the lane's requests and sends them to the pool together when the window the
    first of them opened closes (static batching: a batch-service queue whose server takes
    whatever gathered), or as soon as ``batch_size`` (> 0) are held (dynamic batching)."""

    name: str
    pool: str
    classes: tuple = ()
    prompt_min: int = 0
    prompt_max: int | None = None
    batch_window_s: float = 0.0
    batch_size: int = 0

    def matches(self, class_name: str, prompt_tokens: int) -> bool:
        if self.classes and class_name not in self.classes:
            return False
        return self.prompt_min <= prompt_tokens and (self.prompt_max is None or prompt_tokens < self.prompt_max)


@dataclass
class KVLink:
    """The link that carries a request's KV from prefill to decode: one FCFS server of rate
    ``gbps`` (a transfer of B bytes holds it B / rate seconds, so transfers contend) plus a
    propagation ``latency_ms`` that does not hold it. ``gbps = inf`` and 0 latency: free."""

    gbps: float = math.inf
    latency_ms: float = 0.0

    def check(self, path: str) -> None:
        _num(_where(path, "gbps"), self.gbps, strict=True, inf_ok=True)
        _num(_where(path, "latency_ms"), self.latency_ms)


@dataclass
class Disaggregation:
    """Prefill/decode disaggregation: ``prefill`` computes the prompt and the first token, the KV
    crosses ``link``, ``decode`` admits the request when its KV has arrived and it has room."""

    prefill: str
    decode: str
    link: KVLink = field(default_factory=KVLink)


@dataclass
class RateLimit:
    """A token bucket: ``rate`` requests per second, at most ``burst`` at once, for one class
    (``"*"``: all traffic). An arrival that finds it empty is rejected (HTTP 429)."""

    rate: float
    burst: float = 1.0


@dataclass
class Shed:
    """Tier shedding: requests whose class priority is >= ``min_priority`` (a lower tier: vLLM's
    larger value) are rejected while the pool's queue age exceeds ``queue_age_s``."""

    min_priority: int
    queue_age_s: float


@dataclass
class Fallback:
    """While ``pool``'s queue age exceeds ``queue_age_s``, its new requests go to ``to`` (another
    model; its quality and cost go into the summary)."""

    pool: str
    to: str
    queue_age_s: float


@dataclass
class Gateway:
    """Control before the accelerator, applied at each arrival in this order: rate limits,
    admission (``max_queue_depth``: waiting requests per serving replica of the pool;
    ``max_queue_age_s``: age of the pool's oldest request without a first token), tier shedding,
    fallback. Queue age is what a gateway can see: time since arrival of the oldest request the
    pool holds that has no first token yet."""

    rate_limits: dict = field(default_factory=dict)   # class (or "*") -> RateLimit
    max_queue_depth: float | None = None
    max_queue_age_s: float | None = None
    shed: list = field(default_factory=list)          # [Shed]
    fallbacks: list = field(default_factory=list)     # [Fallback]


@dataclass
class Autoscaler:
    """Scales ``pool`` between ``min_replicas`` and ``max_replicas``: every ``interval_s`` it reads
    ``metric`` (``waiting``: waiting requests per replica; ``kv``: KV usage 0..1; ``utilization``:
    running / max_num_seqs; ``queue_age``: seconds) and asks for ceil(c x metric / target) replicas
    (Kubernetes' HPA rule; replicas still starting count as idle, see
    :mod:`llmqueue.cluster.autoscaler`), or, for ``p99_ttft`` (target in seconds), the fewest
    replicas whose M/M/c prediction of the p99 time to first token meets the target
    (:mod:`llmqueue.cluster.predict`); ``also``: more ``{metric: target}``, and it asks for the
    largest count any of them gives (HPA with several metrics). New replicas serve after ``provisioning_delay_s`` (cold
    start); it scales down only ``cooldown_s`` after its last change (up or down), by at most
    ``scale_down_step`` replicas at a time (HPA's scale-down policy), and a replica it removes stops
    taking requests and leaves when it has drained."""

    pool: str
    metric: str = "waiting"
    target: float = 1.0
    interval_s: float = 15.0
    provisioning_delay_s: float = 0.0
    cooldown_s: float = 300.0
    min_replicas: int = 1
    max_replicas: int = 64
    also: dict = field(default_factory=dict)  # more metric -> target pairs: the largest count any asks for
    scale_down_step: int = 1                  # replicas removed at most per scale-down


@dataclass
class Fault:
    """Replica ``replica`` of ``pool`` fails at ``at_s``: its requests in flight fail (``fail``)
    or are sent again to the others (``retry``); it serves again, empty, after ``repair_s``."""

    pool: str
    replica: int
    at_s: float
    repair_s: float = math.inf
    inflight: str = "retry"


@dataclass
class FleetSpec:
    """A fleet: pools, lanes, an optional P/D pair, gateway, autoscalers and faults."""

    pools: list
    lanes: list = field(default_factory=list)
    disaggregation: Disaggregation | None = None
    gateway: Gateway | None = None
    autoscalers: list = field(default_factory=list)
    faults: list = field(default_factory=list)

    def __post_init__(self):
        self.check()

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def check(self) -> None:
        """Every reference names a pool that exists; numbers are in range (errors name the path)."""
        if not self.pools:
            raise InputError("pools", "a fleet needs at least one pool")
        names = set()
        for i, p in enumerate(self.pools):
            p.check(f"pools[{i}]")
            if p.name in names:
                raise InputError(f"pools[{i}].name", f"pool {p.name!r} is named twice")
            names.add(p.name)

        def ref(path, name):
            if name not in names:
                raise InputError(path, f"no pool named {name!r}", f"name one of: {', '.join(sorted(names))}")

        for i, ln in enumerate(self.lanes):
            ref(f"lanes[{i}].pool", ln.pool)
            _int(f"lanes[{i}].prompt_min", ln.prompt_min)
            if ln.prompt_max is not None and _int(f"lanes[{i}].prompt_max", ln.prompt_max, lo=1) <= ln.prompt_min:
                raise InputError(f"lanes[{i}].prompt_max", f"must be above prompt_min {ln.prompt_min} (got {ln.prompt_max})")
            _num(f"lanes[{i}].batch_window_s", ln.batch_window_s)
            _int(f"lanes[{i}].batch_size", ln.batch_size)
            if ln.batch_size and not ln.batch_window_s:
                raise InputError(f"lanes[{i}].batch_size", "needs a batch_window_s (the longest a request is held)",
                                 "give batch_window_s, or drop batch_size")
        d = self.disaggregation
        roles = {p.name: p.role for p in self.pools}
        if d is not None:
            ref("disaggregation.prefill", d.prefill)
            ref("disaggregation.decode", d.decode)
            if d.prefill == d.decode:
                raise InputError("disaggregation.decode", "the decode pool must differ from the prefill pool")
            for side, name in (("prefill", d.prefill), ("decode", d.decode)):
                if roles[name] != side:
                    raise InputError(f"disaggregation.{side}", f"pool {name!r} has role {roles[name]}",
                                     f"give pool {name!r} role: {side}")
            for i, p in enumerate(self.pools):
                if p.role != "mixed" and p.name not in (d.prefill, d.decode):
                    raise InputError(f"pools[{i}].role", f"pool {p.name!r} has role {p.role} but is not the "
                                     f"disaggregation's {p.role} pool ({getattr(d, p.role)!r})",
                                     "one P/D pair per fleet: make it role: mixed, or name it in disaggregation")
            for i, ln in enumerate(self.lanes):
                if ln.pool == d.decode:
                    raise InputError(f"lanes[{i}].pool", f"{ln.pool!r} is the decode pool: requests enter a P/D "
                                     "pair at its prefill pool", f"name {d.prefill!r}")
            d.link.check("disaggregation.link")
        elif any(r != "mixed" for r in roles.values()):
            has = {r for r in roles.values() if r != "mixed"}
            if has == {"prefill", "decode"}:
                raise InputError("disaggregation", "is missing: the fleet has prefill and decode pools",
                                 "add a disaggregation section naming them (prefill: P, decode: D)")
            missing = "decode" if "decode" not in has else "prefill"
            raise InputError("pools", f"a P/D fleet without a {missing} pool",
                             f"add a pool with role: {missing} and a disaggregation section")
        g = self.gateway
        if g is not None:
            for k, rl in g.rate_limits.items():
                _num(f"gateway.rate_limits.{k}.rate", rl.rate, strict=True)
                _num(f"gateway.rate_limits.{k}.burst", rl.burst, lo=1.0)
            if g.max_queue_depth is not None:
                _num("gateway.max_queue_depth", g.max_queue_depth, strict=True)
            if g.max_queue_age_s is not None:
                _num("gateway.max_queue_age_s", g.max_queue_age_s, strict=True)
            for i, s in enumerate(g.shed):
                _int(f"gateway.shed[{i}].min_priority", s.min_priority, lo=-(2**31))
                _num(f"gateway.shed[{i}].queue_age_s", s.queue_age_s)
            for i, fb in enumerate(g.fallbacks):
                ref(f"gateway.fallbacks[{i}].pool", fb.pool)
                ref(f"gateway.fallbacks[{i}].to", fb.to)
                if fb.to == fb.pool:
                    raise InputError(f"gateway.fallbacks[{i}].to", f"falls back to its own pool {fb.pool!r}",
                                     "name another pool")
                _num(f"gateway.fallbacks[{i}].queue_age_s", fb.queue_age_s)
        scaled: dict = {}
        for i, a in enumerate(self.autoscalers):
            w = f"autoscalers[{i}]"
            ref(f"{w}.pool", a.pool)
            if a.pool in scaled:
                raise InputError(f"{w}.pool", f"pool {a.pool!r} already has an autoscaler ({scaled[a.pool]})",
                                 "one autoscaler per pool")
            scaled[a.pool] = w
            if a.metric not in METRICS:
                raise InputError(f"{w}.metric", f"unknown metric {a.metric!r}", f"choose one of: {', '.join(METRICS)}")
            _num(f"{w}.target", a.target, strict=True)
            for m, tg in a.also.items():
                if m not in METRICS:
                    raise InputError(f"{w}.also.{m}", f"unknown metric {m!r}", f"choose from: {', '.join(METRICS)}")
                _num(f"{w}.also.{m}", tg, strict=True)
            _num(f"{w}.interval_s", a.interval_s, strict=True)
            _num(f"{w}.provisioning_delay_s", a.provisioning_delay_s)
            _num(f"{w}.cooldown_s", a.cooldown_s)
            _int(f"{w}.scale_down_step", a.scale_down_step, lo=1)
            _int(f"{w}.min_replicas", a.min_replicas, lo=0)
            if _int(f"{w}.max_replicas", a.max_replicas, lo=1) < a.min_replicas or a.max_replicas > 4096:
                raise InputError(f"{w}.max_replicas", f"must be between min_replicas and 4096 (got {a.max_replicas})")
        for i, f in enumerate(self.faults):
            w = f"faults[{i}]"
            ref(f"{w}.pool", f.pool)
            n = self.pool(f.pool).replicas
            top = max([n] + [a.max_replicas for a in self.autoscalers if a.pool == f.pool])
            if _int(f"{w}.replica", f.replica) >= top:
                has = f"replicas 0..{top - 1}" if top else "no replicas"
                scaled_too = " (its autoscaler's max_replicas included)" if top > n else ""
                raise InputError(f"{w}.replica", f"pool {f.pool!r} has {has}{scaled_too} (got {f.replica})")
            _num(f"{w}.at_s", f.at_s)
            _num(f"{w}.repair_s", f.repair_s, strict=True, inf_ok=True)
            if f.inflight not in INFLIGHT:
                raise InputError(f"{w}.inflight", f"unknown {f.inflight!r}", f"choose one of: {', '.join(INFLIGHT)}")

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
