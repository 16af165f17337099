"""The scenario file's fleet: ``deployment.pools``, ``lanes``, ``disaggregation``, ``gateway``,
``autoscalers`` and ``faults`` (pydantic models), and the :class:`~llmqueue.cluster.spec.FleetSpec`
a scenario describes.

::

    deployment:
      model: llama-3.1-8b        # the top-level keys are every pool's defaults:
      gpu: h100-sxm              # a pool states only what differs
      max_num_seqs: 256
      pools:
        - {name: chat, replicas: 4, router: least-outstanding, max_num_seqs: 64}
        - {name: batch, replicas: 2, model: llama-3.1-70b, tensor_parallel_size: 4, quality: 1.2}
      lanes:                     # class (and prompt length) -> pool; the first that matches
        - {name: interactive, pool: chat, classes: [chat]}
        - {pool: batch, classes: [batch], prompt_min: 0, prompt_max: 32768}
      disaggregation:            # P/D: pools with role prefill and decode
        {prefill: P, decode: D, kv_link_gbps: 100, kv_link_latency_ms: 0.5}
      gateway:
        rate_limits: {chat: {rate: 20, burst: 40}, "*": {rate: 100}}
        max_queue_depth: 32      # waiting requests per serving replica of the pool
        max_queue_age_s: 30
        shed: [{min_priority: 1, queue_age_s: 5}]
        fallbacks: [{pool: chat, to: small, queue_age_s: 2}]
      autoscalers:
        - {pool: chat, metric: waiting, target: 4, interval_s: 15, provisioning_delay_s: 120,
           cooldown_s: 300, min_replicas: 2, max_replicas: 16}
      faults:
        - {pool: chat, replica: 0, at_s: 600, repair_s: 300, inflight: retry}

A pool's engine knobs (every key of ``deployment`` but ``replicas`` and the fleet sections) are
the top level's merged with the pool's own, validated as one ``deployment`` (so a pool meets the
same checks: ``max_num_batched_tokens >= max_num_seqs``, the KV cache holding ``max_model_len``
...) and reported at ``deployment.pools[i].KEY``. ``cost_per_replica_hour`` defaults to the GPU
catalog's indicative price times ``tensor_parallel_size`` (0 without a GPU).

The cross-references (lanes, P/D, fallbacks, autoscalers and faults name pools; lanes and rate
limits name classes of ``workload.classes``) and the ranges are checked by
:meth:`FleetSpec.check <llmqueue.cluster.spec.FleetSpec.check>` when the scenario is validated;
its errors carry the scenario path (``deployment.lanes[0].pool``).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from llmqueue.errors import InputError
from llmqueue.scenario._base import Float, Int, _clean_name, _Problem, _Section

#: The keys of ``deployment`` that describe a fleet (not one replica's engine).
FLEET_KEYS = ("pools", "lanes", "disaggregation", "gateway", "autoscalers", "faults")

#: A pool's own keys (the rest are the engine knobs it may override).
POOL_KEYS = ("name", "replicas", "router", "role", "cost_per_replica_hour", "quality")


def _engine_knob_fields() -> dict:
    """The engine knobs a pool may override: every ``deployment`` knob but ``replicas``, each
    ``None`` (= the top level's value) until given."""
    from llmqueue.knobs import scenario_fields

    return {k.scenario_field[1]: (Any, Field(None, description=k.help)) for k in scenario_fields("deployment")
            if k.scenario_field[1] != "replicas"}


def _pool_base():
    from pydantic import create_model

    return create_model("_PoolKnobs", __base__=_Section, __module__=__name__, **_engine_knob_fields())


class PoolConfig(_pool_base()):
    """One entry of ``deployment.pools``: ``replicas`` replicas behind ``router``, in ``role``
    (``mixed``, or ``prefill``/``decode`` of a P/D pair), and the engine knobs that differ from
    the top level's."""

    name: str
    replicas: Int = 1
    router: str = "least-outstanding"
    role: str = "mixed"
    cost_per_replica_hour: Float | None = None
    quality: Float = 1.0

    check_name = field_validator("name")(_clean_name)

    def overrides(self) -> dict:
        """The engine knobs this pool gives (those it leaves to the top level left out)."""
        return {k: getattr(self, k) for k in self.model_fields_set if k not in POOL_KEYS}


class LaneConfig(_Section):
    """One entry of ``deployment.lanes``: requests of ``classes`` (any class when left out) with
    ``prompt_min <= prompt tokens < prompt_max`` go to ``pool``. ``name`` defaults to the pool's.
    ``batch_window_s`` (> 0): the gateway holds the lane's requests and sends them together when
    the window that the first opened closes (static batching), or as soon as ``batch_size`` are
    held (dynamic batching)."""

    name: str | None = None
    pool: str
    classes: list[str] | None = None
    prompt_min: Int = 0
    prompt_max: Int | None = None
    batch_window_s: Float = 0.0
    batch_size: Int = 0


class DisaggregationConfig(_Section):
    """``deployment.disaggregation``: prefill on pool ``prefill``, decode on pool ``decode``, the KV
    crossing a link of ``kv_link_gbps`` (Gbit/s; left out: free) and ``kv_link_latency_ms``."""

    prefill: str
    decode: str
    kv_link_gbps: Float | None = None
    kv_link_latency_ms: Float = 0.0


class RateLimitConfig(_Section):
    """A token bucket: ``rate`` requests per second, at most ``burst`` at once."""

    rate: Float
    burst: Float = 1.0


class ShedConfig(_Section):
    min_priority: Int
    queue_age_s: Float


class FallbackConfig(_Section):
    pool: str
    to: str
    queue_age_s: Float


class GatewayConfig(_Section):
    """``deployment.gateway``: rate limits per class (``"*"``: all traffic), admission bounds,
    tier shedding, fallbacks (see :class:`llmqueue.cluster.spec.Gateway`)."""

    rate_limits: dict[str, RateLimitConfig] | None = None
    max_queue_depth: Float | None = None
    max_queue_age_s: Float | None = None
    shed: list[ShedConfig] | None = None
    fallbacks: list[FallbackConfig] | None = None


class AutoscalerConfig(_Section):
    """One entry of ``deployment.autoscalers`` (see :class:`llmqueue.cluster.spec.Autoscaler`)."""

    pool: str
    metric: str = "waiting"
    target: Float = 1.0
    interval_s: Float = 15.0
    provisioning_delay_s: Float = 0.0
    cooldown_s: Float = 300.0
    min_replicas: Int = 1
    max_replicas: Int = 64
    also: dict[str, Float] = {}
    scale_down_step: Int = 1


class FaultConfig(_Section):
    """One entry of ``deployment.faults``: replica ``replica`` of ``pool`` fails at ``at_s`` and
    serves again after ``repair_s`` (left out: never)."""

    pool: str
    replica: Int
    at_s: Float
    repair_s: Float | None = None
    inflight: str = "retry"


# --- validation inside ``deployment`` ------------------------------------------------------------

def resolve_pools(dep, info: ValidationInfo) -> list:
    """Each pool's deployment (the top level merged with the pool's keys) validated as one
    ``deployment`` section; problems at ``pools[i].KEY``. Called by the deployment's validator."""
    from pydantic import ValidationError

    from llmqueue.scenario.load import _from_validation_error
    from llmqueue.scenario.model import DeploymentConfig

    present = [k for k in FLEET_KEYS if dep.__dict__.get(k)]  # given and not empty
    if dep.pools is None:
        if present:
            raise _Problem((present[0],), "needs deployment.pools (the pools it names)",
                           "list the pools under deployment.pools, each with a name")
        return []
    if not dep.pools:
        raise _Problem(("pools",), "is empty", "list at least one pool, or remove the key")
    if "replicas" in dep.model_fields_set and dep.replicas != 1:
        raise _Problem(("replicas",), f"is {dep.replicas} but the deployment has pools: each pool gives its replicas",
                       "move it into the pools, or remove it")
    top = dep.model_dump(exclude_unset=True, exclude={*FLEET_KEYS, "replicas"})
    out = []
    for i, p in enumerate(dep.pools):
        merged = {**top, **p.overrides()}
        try:
            out.append(DeploymentConfig.model_validate(merged, context=info.context))
        except ValidationError as err:
            e = _from_validation_error(err)
            where = ("pools", i) if e.field == "scenario" else ("pools", i, e.field)
            raise _Problem(where, e.problem, e.fix) from None
    return out


# --- the FleetSpec of a scenario -----------------------------------------------------------------

# FleetSpec's field paths that are spelled otherwise in the file
_PATHS = {"disaggregation.link.gbps": "disaggregation.kv_link_gbps",
          "disaggregation.link.latency_ms": "disaggregation.kv_link_latency_ms",
          "disaggregation.link": "disaggregation"}


def scenario_path(field: str) -> str:
    """The scenario path (``deployment.lanes[0].pool``) of a :class:`FleetSpec` field path."""
    return "deployment." + _PATHS.get(field, field)


def _kv_bytes_per_token(d) -> float:
    """The KV bytes one token occupies (all tensor-parallel shards: what a P/D transfer moves);
    0 when the model is unknown."""
    if d.capacity is not None:
        return float(d.capacity.kv_bytes_per_token)
    if d._model is None:
        return 0.0
    from llmqueue.hardware import kv_bytes_per_token, resolve_dtype

    try:
        return float(kv_bytes_per_token(d._model, resolve_dtype(d.kv_cache_dtype, d._model, kv=True)))
    except Exception:  # noqa: BLE001 - an estimate for the link; unknown is 0
        return 0.0


def _cost(pc: PoolConfig, d) -> float:
    if pc.cost_per_replica_hour is not None:
        return pc.cost_per_replica_hour
    return float(d._gpu.price_per_hour * d.tensor_parallel_size) if d._gpu is not None else 0.0


def _check_classes(d, names: list[str]) -> None:
    def unknown(path, name):
        import difflib

        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        fix = f"did you mean {near[0]!r}?" if near else f"name one of: {', '.join(names)}"
        raise InputError(path, f"no class named {name!r} in workload.classes", fix)

    for i, ln in enumerate(d.lanes or ()):
        for j, c in enumerate(ln.classes or ()):
            if c not in names:
                unknown(f"deployment.lanes[{i}].classes[{j}]", c)
    g = d.gateway
    for k in (g.rate_limits or {}) if g is not None else ():
        if k != "*" and k not in names:
            unknown(f"deployment.gateway.rate_limits.{k}", k)


def fleet_spec(scenario):
    """The :class:`~llmqueue.cluster.spec.FleetSpec` a validated scenario describes, or None when
    its deployment has no pools (one engine, ``deployment.replicas`` of it: the single path).
    Errors name the scenario path (``deployment.lanes[0].pool: no pool named ...``)."""
    from llmqueue.cluster.spec import (Autoscaler, Disaggregation, Fallback, Fault, FleetSpec, Gateway, KVLink, Lane,
                                       Pool, RateLimit, Shed)

    d = scenario.deployment
    if not d.pools:
        return None
    _check_classes(d, list(scenario.mix.names))
    pools = []
    for pc, pd in zip(d.pools, d.pool_deployments):
        cfg, st = scenario.engine(pd)
        pools.append(Pool(pc.name, cfg, st, replicas=pc.replicas, router=pc.router,
                          model=pd._model.name if pd._model is not None else "", role=pc.role,
                          cost_per_replica_hour=_cost(pc, pd), quality=pc.quality,
                          kv_bytes_per_token=_kv_bytes_per_token(pd)))
    lanes = [Lane(ln.name or ln.pool, ln.pool, tuple(ln.classes or ()), ln.prompt_min, ln.prompt_max,
                  ln.batch_window_s, ln.batch_size)
             for ln in d.lanes or ()]
    dis = None
    if d.disaggregation is not None:
        x = d.disaggregation
        dis = Disaggregation(x.prefill, x.decode, KVLink(math.inf if x.kv_link_gbps is None else x.kv_link_gbps,
                                                         x.kv_link_latency_ms))
    gw = None
    if d.gateway is not None:
        g = d.gateway
        gw = Gateway(rate_limits={k: RateLimit(v.rate, v.burst) for k, v in (g.rate_limits or {}).items()},
                     max_queue_depth=g.max_queue_depth, max_queue_age_s=g.max_queue_age_s,
                     shed=[Shed(s.min_priority, s.queue_age_s) for s in g.shed or ()],
                     fallbacks=[Fallback(f.pool, f.to, f.queue_age_s) for f in g.fallbacks or ()])
    scalers = [Autoscaler(**a.model_dump()) for a in d.autoscalers or ()]
    faults = [Fault(f.pool, f.replica, f.at_s, math.inf if f.repair_s is None else f.repair_s, f.inflight)
              for f in d.faults or ()]
    try:
        return FleetSpec(pools=pools, lanes=lanes, disaggregation=dis, gateway=gw, autoscalers=scalers,
                         faults=faults)
    except InputError as e:
        raise InputError(scenario_path(e.field), e.problem, e.fix) from None


def fleet_summary(fleet, deployments) -> dict:
    """A JSON-ready description of a FleetSpec and its pools' deployments (``llmqueue scenario check``)."""
    def num(x):
        return x if x is None or math.isfinite(x) else None

    out: dict = {"pools": [{"name": p.name, "role": p.role, "replicas": p.replicas,
                            "router": p.router if isinstance(p.router, str) else type(p.router).__name__,
                            "model": p.model, "gpu": pd.gpu, "tensor_parallel_size": pd.tensor_parallel_size,
                            "M": int(p.config.capacity_tokens),
                            "max_num_seqs": p.config.max_num_seqs, "step_time": getattr(p.step_time, "spec", None),
                            "cost_per_replica_hour": p.cost_per_replica_hour, "quality": p.quality,
                            "kv_bytes_per_token": p.kv_bytes_per_token}
                           for p, pd in zip(fleet.pools, deployments)],
                   "lanes": [{"name": ln.name, "pool": ln.pool, "classes": list(ln.classes),
                              "prompt_min": ln.prompt_min, "prompt_max": ln.prompt_max} for ln in fleet.lanes]}
    if fleet.disaggregation is not None:
        x = fleet.disaggregation
        out["disaggregation"] = {"prefill": x.prefill, "decode": x.decode, "kv_link_gbps": num(x.link.gbps),
                                 "kv_link_latency_ms": x.link.latency_ms}
    if fleet.gateway is not None:
        g = fleet.gateway
        out["gateway"] = {"rate_limits": {k: {"rate": v.rate, "burst": v.burst} for k, v in g.rate_limits.items()},
                          "max_queue_depth": g.max_queue_depth, "max_queue_age_s": g.max_queue_age_s,
                          "shed": [vars(s) for s in g.shed], "fallbacks": [vars(f) for f in g.fallbacks]}
    out["autoscalers"] = [vars(a) for a in fleet.autoscalers]
    out["faults"] = [{**vars(f), "repair_s": num(f.repair_s)} for f in fleet.faults]
    return out

