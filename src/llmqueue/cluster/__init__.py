"""A fleet of replicas on one clock: routers (this package's first part; pools, lanes, P/D, the
gateway's admission and autoscaling come next).

- :mod:`llmqueue.cluster.routers`: routing policies as small objects that decide from read-only
  views of the replicas (random, round robin, least outstanding requests, power of two choices)
  and the central queue (the gateway holds requests until a replica has a free slot: M/M/c).
- :mod:`llmqueue.cluster.fleet`: :func:`simulate_fleet`, N replicas of one engine behind a router.
"""

from llmqueue.cluster.fleet import simulate_fleet
from llmqueue.cluster.routers import ROUTERS, router

__all__ = ["ROUTERS", "router", "simulate_fleet"]
