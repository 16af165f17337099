"""The scenario file's fleet: ``deployment.pools`` (a pool's keys and its engine knobs),
``lanes``, ``disaggregation``, ``gateway``, ``autoscalers`` and ``faults`` (the models of
:mod:`llmqueue.cluster.spec`), and the :class:`~llmqueue.cluster.spec.FleetSpec` a scenario
describes.

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
        degrade:                 # while the pool's queue is older than queue_age_s: served smaller
          - {pool: chat, classes: [batch], queue_age_s: 1, max_tokens: 256, quality: 0.8}
          - {pool: chat, classes: [chat], queue_age_s: 3, to: small}
      autoscalers:
        - {pool: chat, metric: waiting, target: 4, interval_s: 15, provisioning_delay_s: 120,
           cooldown_s: 300, min_replicas: 2, max_replicas: 16}
      faults:
        - {pool: chat, replica: 0, at_s: 600, repair_s: 300, inflight: retry}

A pool's engine knobs (every key of ``deployment`` but ``replicas`` and the fleet sections) are
the top level's merged with the pool's own, validated as one ``deployment`` (so a pool meets the
same checks: ``max_num_batched_tokens >= max_num_seqs``, the KV cache holding ``max_model_len``
...) and reported at ``deployment.pools[i].KEY``. ``cost_per_replica_hour`` defaults to the GPU
catalog's indicative price times the replica's GPUs, ``tensor_parallel_size x pipeline_parallel_size`` (0
without a GPU).

The sections ``lanes``, ``disaggregation``, ``gateway``, ``autoscalers`` and ``faults`` are read
into the fleet's own models (:mod:`llmqueue.cluster.spec`: one declaration of every field, its
type, default and range); a pool entry is a :class:`~llmqueue.cluster.spec.Pool`'s own keys
(:data:`POOL_KEYS`) and the engine knobs. The references between them (lanes, P/D, fallbacks,
autoscalers, faults and degrade rules name pools; lanes, rate limits and degrade rules name classes of ``workload.classes``)
are checked when the scenario is validated; errors carry the scenario path
(``deployment.lanes[0].pool``).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, ValidationInfo

from llmqueue._schema import _from_validation_error, _Problem, _Section
from llmqueue.cluster.spec import FleetSpec, Pool
from llmqueue.errors import InputError

#: The keys of ``deployment`` that describe a fleet (not one replica's engine).
FLEET_KEYS = ("pools", "lanes", "disaggregation", "gateway", "autoscalers", "faults")

#: A pool's own keys in a file, :class:`~llmqueue.cluster.spec.Pool`'s fields (the rest of a pool
#: entry are the engine knobs it overrides; a pool's ``model``, ``step_time``, ``config`` and
#: ``kv_bytes_per_token`` come from them).
POOL_KEYS = ("name", "replicas", "router", "role", "cost_per_replica_hour", "quality")


def _pool_entry():
    """The model of one ``deployment.pools`` entry: the engine knobs a pool may override (every
    ``deployment`` knob but ``replicas``, each ``None`` = the top level's value until given), then
    the pool's own keys as :class:`~llmqueue.cluster.spec.Pool` declares them."""
    from pydantic import create_model

    from llmqueue.knobs import scenario_fields

    knobs = {k.scenario_field[1]: (Any, Field(None, description=k.help)) for k in scenario_fields("deployment")
             if k.scenario_field[1] != "replicas"}
    own = {k: (Pool.model_fields[k].annotation, Pool.model_fields[k]) for k in POOL_KEYS}
    return create_model("_PoolEntry", __base__=_Section, __module__=__name__, **knobs, **own)


class PoolConfig(_pool_entry()):
    """One entry of ``deployment.pools``: ``replicas`` replicas behind ``router``, in ``role``
    (``mixed``, or ``prefill``/``decode`` of a P/D pair), and the engine knobs that differ from
    the top level's. ``cost_per_replica_hour`` left out: the GPU catalog's price."""

    def overrides(self) -> dict:
        """The engine knobs this pool gives (those it leaves to the top level left out)."""
        return {k: getattr(self, k) for k in self.model_fields_set if k not in POOL_KEYS}


# --- validation inside ``deployment`` ------------------------------------------------------------

def resolve_pools(dep, info: ValidationInfo) -> list:
    """Each pool's deployment (the top level merged with the pool's keys) validated as one
    ``deployment`` section; problems at ``pools[i].KEY``. Called by the deployment's validator."""
    from pydantic import ValidationError

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
            out.append(type(dep).model_validate(merged, context=info.context))
        except ValidationError as err:
            e = _from_validation_error(err)
            where = ("pools", i) if e.field == "scenario" else ("pools", i, e.field)
            raise _Problem(where, e.problem, e.fix) from None
    return out


# --- the FleetSpec of a scenario -----------------------------------------------------------------

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
    if "cost_per_replica_hour" in pc.model_fields_set:
        return pc.cost_per_replica_hour
    return (float(d._gpu.price_per_hour * d.tensor_parallel_size * d.pipeline_parallel_size) if d._gpu is not None
            else 0.0)


def _check_classes(d, names: list[str]) -> None:
    def unknown(path, name):
        import difflib

        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        fix = f"did you mean {near[0]!r}?" if near else f"name one of: {', '.join(names)}"
        raise InputError(path, f"no class named {name!r} in workload.classes", fix)

    for i, ln in enumerate(d.lanes or ()):
        for j, c in enumerate(ln.classes):
            if c not in names:
                unknown(f"deployment.lanes[{i}].classes[{j}]", c)
    g = d.gateway
    for k in g.rate_limits if g is not None else ():
        if k != "*" and k not in names:
            unknown(f"deployment.gateway.rate_limits.{k}", k)
    for i, dg in enumerate(g.degrade if g is not None else ()):
        for j, c in enumerate(dg.classes):
            if c not in names:
                unknown(f"deployment.gateway.degrade[{i}].classes[{j}]", c)


def fleet_spec(scenario):
    """The :class:`~llmqueue.cluster.spec.FleetSpec` a validated scenario describes, or None when
    its deployment has no pools (one engine, ``deployment.replicas`` of it: the single path): its
    pools with their engines resolved, its other parts as the file gave them. Errors name the
    scenario path (``deployment.lanes[0].pool: no pool named ...``)."""
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
    try:
        return FleetSpec.of_checked(pools=pools, lanes=list(d.lanes or ()), disaggregation=d.disaggregation,
                                    gateway=d.gateway, autoscalers=list(d.autoscalers or ()),
                                    faults=list(d.faults or ()))
    except InputError as e:
        raise InputError(f"deployment.{e.field}", e.problem, e.fix) from None


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
        out["disaggregation"] = {**x.model_dump(), "kv_link_gbps": num(x.kv_link_gbps)}
    if fleet.gateway is not None:
        out["gateway"] = fleet.gateway.model_dump()
    out["autoscalers"] = [a.model_dump() for a in fleet.autoscalers]
    out["faults"] = [{**f.model_dump(), "repair_s": num(f.repair_s)} for f in fleet.faults]
    return out

