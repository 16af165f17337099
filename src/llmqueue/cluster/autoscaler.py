"""A pool's replica count as a control loop: Kubernetes' Horizontal Pod Autoscaler rule.

Every ``interval_s`` the autoscaler reads its metric and asks for
``c' = ceil(c x m / target)`` replicas, ``c`` counting the replicas serving and those starting,
and ``m`` the metric averaged over all ``c`` with the starting ones counted as idle (HPA's rule
for pods not yet ready, so a scale-up in progress is not ordered again): for the per-replica
metrics ``c' = ceil(sum over serving replicas / target)``. It does nothing while ``m / target``
is within 10 % of 1 (HPA's tolerance). New replicas serve after the provisioning delay (a cold
start: the queue keeps growing meanwhile, and what it gathered stays on the replicas it was
routed to); scale-down waits a cooldown after the last change.

``p99_ttft`` (target in seconds, like ``queue_age``) is model-based instead
(:mod:`llmqueue.cluster.predict`): latency is not linear in ``c``, so rather than scale ``c`` by
a ratio it asks for the smallest count whose M/M/c prediction of the p99 time to first token
(from the pool's ``lam``, one replica's ``mu`` and the backlog ``Q``) meets the target. It keeps
the rest of the rule: ``c`` counts the replicas starting (a scale-up in progress is not ordered
again), nothing changes while the prediction at ``c`` is within 10 % of the target, and the
scale-down cooldown and step apply as for the other metrics.

The metrics are registered in :data:`METRICS` (a reader decorated with ``@_metric``): a scenario's
``autoscalers[i].metric`` and ``also`` name them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from llmqueue.cluster.predict import P99, P99Load, predicted_p99, replicas_for_p99

TOLERANCE = 0.1


@dataclass(frozen=True)
class Metric:
    """What an autoscaler may read: ``read(view, t, watch)``, its total over the serving replicas of
    the pool's :class:`~llmqueue.cluster.view.PoolView`
    (HPA's rule divides it by the replicas), or with ``seconds`` a time of the pool's (compared
    with the target as it is); ``first_tokens``: it reads the requests without a first token (the
    fleet then tracks them)."""

    name: str
    help: str
    read: Callable
    seconds: bool = False
    first_tokens: bool = False


#: Every metric by name: ``Autoscaler.metric`` and the keys of ``Autoscaler.also`` name one.
METRICS: dict[str, Metric] = {}


def _metric(name: str, help: str, *, seconds: bool = False, first_tokens: bool = False):
    """Registers the decorated ``read(view, t, watch)`` as metric ``name`` in :data:`METRICS`."""
    def register(read: Callable) -> Callable:
        METRICS[name] = Metric(name, help, read, seconds, first_tokens)
        return read
    return register


WAITING = "waiting"


@_metric(WAITING, "waiting requests per replica, the pool's gateway queue included")
def _waiting(view, t: float, watch) -> float:
    return float(view.queue_depth())


@_metric("kv", "KV usage 0..1 per replica")
def _kv(view, t: float, watch) -> float:
    return float(sum(view.kv_usage(i) for i in view.routable))


@_metric("utilization", "running / max_num_seqs per replica")
def _utilization(view, t: float, watch) -> float:
    return sum(view.num_running(i) for i in view.routable) / view.max_num_seqs


@_metric("queue_age", "the age of the pool's oldest request without a first token", seconds=True,
         first_tokens=True)
def _queue_age(view, t: float, watch) -> float:
    return view.queue_age(t)


@_metric(P99, "the M/M/c prediction of the pool's p99 time to first token (model-based)", seconds=True)
def _p99(view, t: float, watch) -> P99Load:
    return watch.read(t, view.queue_depth())


def metric_total(metric: str, view, t: float, watch=None) -> float | P99Load:
    """The pool's ``metric`` (:data:`METRICS`) at ``t``, read from its
    :class:`~llmqueue.cluster.view.PoolView`: summed over its serving replicas for a per-replica
    metric (``waiting``: requests waiting, the pool's gateway queue included; ``kv``: KV usage 0..1
    each; ``utilization``: running / max_num_seqs each), or for ``queue_age`` the age in seconds of
    the oldest request without a first token; for ``p99_ttft`` the
    :class:`~llmqueue.cluster.predict.P99Load` its prediction reads (``watch``: the pool's
    :class:`~llmqueue.cluster.predict.ArrivalWatch`, arrivals since the last evaluation and the
    lengths seen, with the waiting requests as ``Q``)."""
    return METRICS[metric].read(view, t, watch)


def desired_replicas(a, current: int, totals: dict) -> int:
    """HPA's rule (see the module docstring) for each of the autoscaler's metrics (``a.metric``
    and ``a.also``; ``totals``: metric -> its total from :func:`metric_total`), the largest count
    any asks for, clamped to ``[min_replicas, max_replicas]``; ``current``: replicas serving and
    starting."""
    want = 0
    for metric, target in ((a.metric, a.target), *a.also.items()):
        total = totals[metric]
        if metric == P99:
            want = max(want, _p99_count(total, target, current, a.min_replicas, a.max_replicas))
            continue
        base = max(current, 1)
        ratio = total / target if METRICS[metric].seconds else total / (base * target)  # starting replicas idle
        if current and abs(ratio - 1.0) <= TOLERANCE:
            n = current
        elif current == 0 and total == 0:
            n = 0
        else:
            n = math.ceil(base * ratio)
        want = max(want, n)
    return max(a.min_replicas, min(a.max_replicas, want))


def _p99_count(load, target: float, current: int, lo: int, hi: int) -> int:
    """The ``p99_ttft`` rule: ``current`` while its prediction is within the tolerance of
    ``target``, else the smallest count in ``[lo, hi]`` that meets it."""
    if current:
        p = predicted_p99(load.lam, load.mu, current, load.backlog, offset=load.offset)
        if abs(p / target - 1.0) <= TOLERANCE:
            return current
    return replicas_for_p99(load, target, lo, hi)
