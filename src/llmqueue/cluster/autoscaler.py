"""A pool's replica count as a control loop: Kubernetes' Horizontal Pod Autoscaler rule.

Every ``interval_s`` the autoscaler reads its metric and asks for
``c' = ceil(c x m / target)`` replicas, ``c`` counting the replicas serving and those starting,
and ``m`` the metric averaged over all ``c`` with the starting ones counted as idle (HPA's rule
for pods not yet ready, so a scale-up in progress is not ordered again): for the per-replica
metrics ``c' = ceil(sum over serving replicas / target)``. It does nothing while ``m / target``
is within 10 % of 1 (HPA's tolerance). New replicas serve after the provisioning delay (a cold
start: the queue keeps growing meanwhile, and what it gathered stays on the replicas it was
routed to); scale-down waits a cooldown after the last change.
"""

from __future__ import annotations

import math

TOLERANCE = 0.1


def metric_total(metric: str, pool, t: float) -> float:
    """The pool's ``metric`` summed over its serving replicas (``waiting``: requests waiting,
    the pool's gateway queue included; ``kv``: KV usage 0..1 each; ``utilization``: running /
    max_num_seqs each), or for ``queue_age`` the age in seconds of the oldest request without a
    first token."""
    v = pool.view
    up = pool.routable
    if metric == "queue_age":
        return pool.queue_age(t)
    if metric == "waiting":
        return float(pool.num_waiting())
    if metric == "kv":
        return float(sum(v.kv_usage(i) for i in up))
    return sum(v.num_running(i) for i in up) / v.max_num_seqs  # utilization


def desired_replicas(a, current: int, totals: dict) -> int:
    """HPA's rule (see the module docstring) for each of the autoscaler's metrics (``a.metric``
    and ``a.also``; ``totals``: metric -> its total from :func:`metric_total`), the largest count
    any asks for, clamped to ``[min_replicas, max_replicas]``; ``current``: replicas serving and
    starting."""
    want = 0
    for metric, target in ((a.metric, a.target), *a.also.items()):
        total = totals[metric]
        base = max(current, 1)
        ratio = total / target if metric == "queue_age" else total / (base * target)  # starting replicas idle
        if current and abs(ratio - 1.0) <= TOLERANCE:
            n = current
        elif current == 0 and total == 0:
            n = 0
        else:
            n = math.ceil(base * ratio)
        want = max(want, n)
    return max(a.min_replicas, min(a.max_replicas, want))
