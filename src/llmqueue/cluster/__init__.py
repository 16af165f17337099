"""A fleet of replicas on one clock: pools behind routers, lanes, P/D, the gateway, autoscalers,
faults.

- :mod:`llmqueue.cluster.spec`: what a fleet is (:class:`~llmqueue.cluster.spec.FleetSpec`: pools,
  lanes, disaggregation, gateway, autoscalers, faults), checked with field paths.
- :mod:`llmqueue.cluster.fleet`: :func:`simulate_fleet`, the event loop; its parts:
  :mod:`~llmqueue.cluster.pool` (a pool's replica slots and counts), :mod:`~llmqueue.cluster.view`
  (what a router reads), :mod:`~llmqueue.cluster.gateway` (token buckets, admission, shedding,
  fallback), :mod:`~llmqueue.cluster.autoscaler` (the HPA rule), :mod:`~llmqueue.cluster.link`
  (the P/D KV link as a FCFS queue), :mod:`~llmqueue.cluster.collect` (records), and
  :mod:`~llmqueue.cluster.events` (event kinds).
- :mod:`llmqueue.cluster.routers` and :mod:`~llmqueue.cluster.affinity`: routing policies as small
  objects deciding from a :class:`~llmqueue.cluster.view.PoolView` (random, round robin, JSQ,
  least prefill backlog, power of two choices, central M/M/c queue, least KV, prefix affinity,
  sessions).

Names are imported lazily (reading a fleet's description does not load the event loop).
"""

from llmqueue._lazy import lazy_exports

_EXPORTS = {"simulate_fleet": "fleet", "ROUTERS": "routers", "router": "routers", "FleetSpec": "spec"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ())
