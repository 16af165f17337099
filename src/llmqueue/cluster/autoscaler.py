"""``AutoscalerRuntime``: a pool's replica count as a control loop (Kubernetes' HPA rule).

Every ``interval_s`` it reads the metric over the serving replicas and asks for
``c' = ceil(c x metric / target)`` replicas, c counting those serving and those starting; it
does nothing while the ratio is within 10 % of 1 (HPA's tolerance). New replicas serve after
the provisioning delay (a cold start: the queue keeps growing meanwhile, and carries what it
gathered after they arrive); scale-down happens at most once per cooldown.
"""

from __future__ import annotations

import math

TOLERANCE = 0.1


def metric_value(a, pool, t: float) -> float:
    """The pool's ``a.metric`` now (see :class:`~llmqueue.cluster.spec.Autoscaler`)."""
    v = pool.view
    up = pool.routable
    if a.metric == "queue_age":
        return pool.queue_age(t)
    if not up:
        return math.inf if (pool.held or a.metric == "waiting" and pool.num_waiting()) else 0.0
    if a.metric == "waiting":
        return pool.num_waiting() / len(up)
    if a.metric == "kv":
        return sum(v.kv_usage(i) for i in up) / len(up)
    return sum(v.num_running(i) for i in up) / (len(up) * v.max_num_seqs)  # utilization


def desired_replicas(a, current: int, value: float) -> int:
    """HPA's rule, clamped to ``[min_replicas, max_replicas]``; ``current`` when within tolerance."""
    if current == 0:
        want = a.min_replicas if value == 0 else max(1, a.min_replicas)
    else:
        ratio = value / a.target
        want = current if abs(ratio - 1.0) <= TOLERANCE else (
            a.max_replicas if math.isinf(ratio) else math.ceil(current * ratio))
    return max(a.min_replicas, min(a.max_replicas, want))
